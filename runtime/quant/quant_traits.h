/* Internal to runtime/quant: the weight types' traits table, the facts of each block layout
 * written once and read by the type table's functions (dtype.c: kv_dtype_block,
 * kv_dtype_block_bytes) and both integer kernels, quant_dot.c (decode dots) and quant_gemm.c
 * (the prefill GEMM's packing). Byte layouts as ggml's ggml-common.h. */
#ifndef KVPLAN_RUNTIME_QUANT_TRAITS_H
#define KVPLAN_RUNTIME_QUANT_TRAITS_H

#include "kvplan/quant.h"

/* One row per weight type, the type's facts written once: elements per block, bytes per block,
 * whether a block stores a min m beside its scale (value = d * q + m; for the K-quants a min per
 * sub-block scaled by dmin), the zero point subtracted from a stored unsigned code (value =
 * d * (q - zero); 0 for the types with a min and for Q8_0, whose codes are signed), and, for
 * the 32-element types, the byte offsets of the codes (qs: 32 bytes for Q8_0, else 16 bytes of
 * nibbles, element j in the low nibble of byte j and element 16 + j in its high nibble) and of
 * the 32 fifth bits (qh, a little-endian uint32, bit j for element j; 0 when the type has
 * none); d is the f16 at 0 and the min, where there is one, the f16 at 2. Indexed by the ggml
 * type id; a row of zeros is a type kvplan does not read. Static const, so that kernels that
 * take the type as a constant fold the lookups away. */
typedef struct kv_qtraits {
    int block, bytes, has_min, zero, qs, qh;
} kv_qtraits;

#define KV_QTRAITS_IDS 31 /* ggml type ids 0..30 */

static const kv_qtraits kv_qtraits_of[KV_QTRAITS_IDS] = {
    [KV_DT_F32] = {1, 4, 0, 0, 0, 0},
    [KV_DT_F16] = {1, 2, 0, 0, 0, 0},
    [KV_DT_BF16] = {1, 2, 0, 0, 0, 0},
    [KV_DT_Q8_0] = {32, 2 + 32, 0, 0, 2, 0},                 /* d, q[32] */
    [KV_DT_Q4_0] = {32, 2 + 16, 0, 8, 2, 0},                 /* d, qs[16] */
    [KV_DT_Q4_1] = {32, 2 + 2 + 16, 1, 0, 4, 0},             /* d, m, qs[16] */
    [KV_DT_Q5_0] = {32, 2 + 4 + 16, 0, 16, 6, 2},            /* d, qh, qs[16] */
    [KV_DT_Q5_1] = {32, 2 + 2 + 4 + 16, 1, 0, 8, 4},         /* d, m, qh, qs[16] */
    [KV_DT_Q4_K] = {256, 2 + 2 + 12 + 128, 1, 0, 0, 0},      /* d, dmin, scales[12], qs[128] */
    [KV_DT_Q5_K] = {256, 2 + 2 + 12 + 32 + 128, 1, 0, 0, 0}, /* ... qh[32], qs[128] */
    [KV_DT_Q6_K] = {256, 128 + 64 + 16 + 2, 0, 32, 0, 0},    /* ql[128], qh[64], scales[16], d */
};

/* The row of type t (a zero row for an id kvplan does not read). */
static inline kv_qtraits kv_qtraits_get(kv_dtype t) {
    return (unsigned)t < KV_QTRAITS_IDS ? kv_qtraits_of[t] : (kv_qtraits){0, 0, 0, 0, 0, 0};
}

/* Whether a block stores a min: Q4_1, Q5_1, Q4_K, Q5_K. */
static inline int kv_qtype_has_min(kv_dtype t) {
    return kv_qtraits_get(t).has_min;
}

/* The zero point of a stored code: Q4_0 8, Q5_0 16, Q6_K 32, else 0. */
static inline int kv_qtype_zero(kv_dtype t) {
    return kv_qtraits_get(t).zero;
}

/* One block of a 32-element type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): its bytes and the offsets of
 * qs and qh, from the table. */
typedef struct kv_qblock32 {
    int bytes, qs, qh;
} kv_qblock32;

static inline kv_qblock32 kv_qblock32_of(kv_dtype t) {
    kv_qtraits r = kv_qtraits_get(t);
    return (kv_qblock32){r.bytes, r.qs, r.qh};
}

#endif
