/* Internal to runtime/quant: the weight types kvplan reads, one row each (KV_QTYPES), and the
 * facts of each block layout that the kernels read as compile-time constants. The traits table
 * (quant_traits.h: a row per type with these facts, the type's name and its kernels) and the
 * kernels' declarations (quant_kernels.h) are both expanded from the same rows, so a type is
 * described once. Byte layouts as ggml's ggml-common.h (include/kvplan/quant.h). */
#ifndef KVPLAN_RUNTIME_QUANT_TYPES_H
#define KVPLAN_RUNTIME_QUANT_TYPES_H

#include "kvplan/quant.h"

/* X(T, block, bytes, has_min, zero, qs, qh, act, group, sgn, ints), one line per type, T its
 * name as kv_dtype_name spells it (KV_DT_##T its id, kv_qk_*_##T its kernels):
 *   block    elements per block;            bytes   bytes per block;
 *   has_min  1 when a block stores a min m beside its scale (value = d * q + m; for the
 *            K-quants a min per sub-block scaled by dmin);
 *   zero     the zero point subtracted from a stored unsigned code (value = d * (q - zero); 0
 *            for the types with a min and for Q8_0, whose codes are signed);
 *   qs, qh   for the 32-element types the byte offsets of the codes (qs: 32 bytes for Q8_0,
 *            else 16 bytes of nibbles, element j in the low nibble of byte j and 16 + j in its
 *            high nibble) and of the 32 fifth bits (qh, a little-endian uint32, bit j for
 *            element j; 0 when the type has none); d is the f16 at 0 and the min, where there
 *            is one, the f16 at 2;
 *   act      the activation layout of the integer dot (quant_dot.h): 'A' blocks of 32, 'K'
 *            blocks of 256, 0 none (fp32 activations);
 *   group    elements per scale in the integer GEMM's blocks of 32 (quant_gemm.h): 32, or 16
 *            for Q6_K (two scales per block); 0 without integer kernels;
 *   sgn      1 when the codes are signed bytes (Q8_0);
 *   ints     1 when the type has integer kernels (dot, GEMM repack), else 0. */
/* clang-format off */
#define KV_QTYPES(X)                                                 \
    X(F32,  1,   4,                  0, 0,  0, 0, 0,   0,  0, 0)     \
    X(F16,  1,   2,                  0, 0,  0, 0, 0,   0,  0, 0)     \
    X(BF16, 1,   2,                  0, 0,  0, 0, 0,   0,  0, 0)     \
    X(Q8_0, 32,  2 + 32,             0, 0,  2, 0, 'A', 32, 1, 1)     \
    X(Q4_0, 32,  2 + 16,             0, 8,  2, 0, 'A', 32, 0, 1)     \
    X(Q4_1, 32,  2 + 2 + 16,         1, 0,  4, 0, 'A', 32, 0, 1)     \
    X(Q5_0, 32,  2 + 4 + 16,         0, 16, 6, 2, 'A', 32, 0, 1)     \
    X(Q5_1, 32,  2 + 2 + 4 + 16,     1, 0,  8, 4, 'A', 32, 0, 1)     \
    X(Q4_K, 256, 2 + 2 + 12 + 128,   1, 0,  0, 0, 'K', 32, 0, 1)     \
    X(Q5_K, 256, 2 + 2 + 12 + 32 + 128, 1, 0, 0, 0, 'K', 32, 0, 1)   \
    X(Q6_K, 256, 128 + 64 + 16 + 2,  0, 32, 0, 0, 'K', 16, 0, 1)
/* clang-format on */
/* Q4_K: d, dmin, scales[12], qs[128]; Q5_K: ... qh[32], qs[128]; Q6_K: ql[128], qh[64],
 * scales[16], d. */

/* The ggml ids 0..30 (ggml.h enum ggml_type); kvplan reads the types of KV_QTYPES. */
#define KV_QTYPE_IDS 31

/* One type's block facts (the columns above). */
typedef struct kv_qblock {
    int block, bytes, has_min, zero, qs, qh, act, group, sgn;
} kv_qblock;

#define KV_QBLOCK_ROW(T, block, bytes, has_min, zero, qs, qh, act, group, sgn, ints)               \
    [KV_DT_##T] = {block, bytes, has_min, zero, qs, qh, act, group, sgn},

/* Indexed by the ggml type id; a row of zeros is a type kvplan does not read. Static const,
 * so that kernels that take the type as a constant fold the lookups away. */
static const kv_qblock kv_qblock_of[KV_QTYPE_IDS] = {KV_QTYPES(KV_QBLOCK_ROW)};

/* The facts of type t (zeros for an id kvplan does not read). */
static inline kv_qblock kv_qblock_get(kv_dtype t) {
    kv_qblock none = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    return (unsigned)t < KV_QTYPE_IDS ? kv_qblock_of[t] : none;
}

#endif
