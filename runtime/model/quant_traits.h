/* Internal to runtime/: the facts of the quantised block layouts that both integer kernels read,
 * quant_dot.c (decode dots) and quant_gemm.c (the prefill GEMM's packing), so that they are
 * written once. Byte layouts as dtype.c's table (kv_dtype_block_bytes) and ggml's
 * ggml-common.h. Static inline so that the kernels, which take the type as a constant, fold
 * them away. */
#ifndef KVPLAN_RUNTIME_QUANT_TRAITS_H
#define KVPLAN_RUNTIME_QUANT_TRAITS_H

#include "kvplan/quant.h"

/* Whether a block stores a min m beside its scale (value = d * q + m; for the K-quants a min
 * per sub-block scaled by dmin): Q4_1, Q5_1, Q4_K, Q5_K. */
static inline int kv_qtype_has_min(kv_dtype t) {
    return t == KV_DT_Q4_1 || t == KV_DT_Q5_1 || t == KV_DT_Q4_K || t == KV_DT_Q5_K;
}

/* The zero point subtracted from a stored unsigned code (value = d * (q - zero)): Q4_0 8, Q5_0
 * 16, Q6_K 32; 0 for the types with a min and for Q8_0, whose codes are signed. */
static inline int kv_qtype_zero(kv_dtype t) {
    return t == KV_DT_Q4_0 ? 8 : t == KV_DT_Q5_0 ? 16 : t == KV_DT_Q6_K ? 32 : 0;
}

/* One block of a 32-element type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): its bytes, the byte offsets
 * of the codes (qs: 32 bytes for Q8_0, else 16 bytes of nibbles, element j in the low nibble
 * of byte j and element 16 + j in its high nibble) and of the 32 fifth bits (qh, a
 * little-endian uint32, bit j for element j; 0 when the type has none); d is the f16 at 0 and
 * the min, where there is one, the f16 at 2. */
typedef struct kv_qblock32 {
    int bytes, qs, qh;
} kv_qblock32;

static inline kv_qblock32 kv_qblock32_of(kv_dtype t) {
    switch (t) {
    case KV_DT_Q4_0:
        return (kv_qblock32){18, 2, 0};
    case KV_DT_Q4_1:
        return (kv_qblock32){20, 4, 0};
    case KV_DT_Q5_0:
        return (kv_qblock32){22, 6, 2};
    case KV_DT_Q5_1:
        return (kv_qblock32){24, 8, 4};
    default: /* Q8_0 */
        return (kv_qblock32){34, 2, 0};
    }
}

#endif
