/* kvplan quant: weight data types of GGUF files, kept in their own type (docs/design.md).
 *
 * A weight row of n elements is stored as n / B blocks of a fixed byte size; each type has its
 * own block layout, defined by ggml (ggml/src/ggml-common.h, block_* structs; dequantisation
 * in ggml/src/ggml-quants.c) and identified in GGUF by its ggml type id (ggml.h, enum
 * ggml_type; GGUF spec docs/gguf.md, "Tensor info"). All multi-byte fields are little-endian;
 * "f16" fields are IEEE binary16. The layouts, with x the dequantised value:
 *
 *   F32   (id 0)  4 bytes/element.
 *   F16   (id 1)  2 bytes/element, IEEE binary16.
 *   BF16  (id 30) 2 bytes/element, the upper half of an fp32.
 *   Q8_0  (id 8)  32 elements in 34 bytes: f16 d, int8 q[32];            x = d * q
 *   Q4_0  (id 2)  32 elements in 18 bytes: f16 d, uint8 qs[16];          x = d * (nib - 8)
 *   Q4_1  (id 3)  32 elements in 20 bytes: f16 d, f16 m, uint8 qs[16];   x = d * nib + m
 *   Q5_0  (id 6)  32 elements in 22 bytes: f16 d, uint32 qh, qs[16];    x = d * (q5 - 16)
 *   Q5_1  (id 7)  32 elements in 24 bytes: f16 d, f16 m, uint32 qh, qs[16]; x = d * q5 + m
 *       In the 32-element types the low nibble of qs[j] is element j and the high nibble is
 *       element j + 16; for Q5, bit j of qh is the fifth bit of element j (so bit j + 16 that of
 *       element j + 16): q5 = nib | (bit << 4).
 *   Q4_K  (id 12) 256 elements in 144 bytes: f16 d, f16 dmin, uint8 scales[12], uint8 qs[128].
 *       8 sub-blocks of 32 with 6-bit scale sc[s] and 6-bit min m[s] packed in scales[12]:
 *       s < 4: sc = scales[s] & 63, m = scales[s + 4] & 63; s >= 4: sc = (scales[s + 4] & 15) |
 *       (scales[s - 4] >> 6) << 4, m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4 (ggml's
 *       get_scale_min_k4). Sub-blocks 2c and 2c + 1 share qs[32c .. 32c + 32): low nibbles are
 *       sub-block 2c, high nibbles 2c + 1. x = d * sc * nib - dmin * m.
 *   Q5_K  (id 13) 256 elements in 176 bytes: f16 d, f16 dmin, scales[12], uint8 qh[32],
 *       uint8 qs[128]. As Q4_K with a fifth bit: element l of sub-block s takes bit s of qh[l].
 *       x = d * sc * q5 - dmin * m.
 *   Q6_K  (id 14) 256 elements in 210 bytes: uint8 ql[128], uint8 qh[64], int8 scales[16],
 *       f16 d. Two halves of 128; in half h, for l < 32: elements l, l + 32, l + 64, l + 96 take
 *       the low nibble of ql[64h + l], of ql[64h + l + 32], the high nibble of ql[64h + l], of
 *       ql[64h + l + 32], and bits (0-1, 2-3, 4-5, 6-7) of qh[32h + l] as their two high bits;
 *       x = d * scales[i / 16] * (q6 - 32) for element i of the block.
 *
 * The quantisers here are straightforward round-to-nearest ones (min/max per block, then the
 * super-block scales of the K-quants quantised to 6 or 8 bits); they do not reproduce
 * llama.cpp's search-based K-quant quantisers bit for bit, but they write exactly the ggml
 * layout, so files written here load in llama.cpp and llama.cpp's files load here.
 *
 * Pure functions of their arguments: no global state, no allocation.
 */
#ifndef KVPLAN_QUANT_H
#define KVPLAN_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/common.h"
#include "kvplan/workers.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* The ggml type ids (ggml.h enum ggml_type) of the types kvplan reads. */
typedef enum kv_dtype {
    KV_DT_F32 = 0,
    KV_DT_F16 = 1,
    KV_DT_Q4_0 = 2,
    KV_DT_Q4_1 = 3,
    KV_DT_Q5_0 = 6,
    KV_DT_Q5_1 = 7,
    KV_DT_Q8_0 = 8,
    KV_DT_Q4_K = 12,
    KV_DT_Q5_K = 13,
    KV_DT_Q6_K = 14,
    KV_DT_BF16 = 30,
} kv_dtype;

/* Every supported type, in the order above; KV_DT_COUNT entries. */
#define KV_DT_COUNT 11
extern const kv_dtype kv_dtype_all[KV_DT_COUNT];

/* 1 when the ggml type id is one kvplan reads, else 0. */
int kv_dtype_supported(uint32_t ggml_type);

/* "F32", "F16", "BF16", "Q8_0", "Q4_K", ...; any ggml id (unsupported ones by their ggml name,
 * "unknown" past the table). Static string. */
const char *kv_dtype_name(uint32_t ggml_type);

/* The type named `name` (case-insensitive, as kv_dtype_name spells it). KV_EINPUT naming the
 * supported types when it is not one. */
int kv_dtype_parse(const char *name, kv_dtype *out, kv_error *err);

/* Elements per block (1 for F32/F16/BF16, 32, or 256 for the K-quants); 0 if unsupported. */
int kv_dtype_block(kv_dtype t);
/* Bytes per block (4, 2, 34, 18, 20, 22, 24, 144, 176, 210); 0 if unsupported. */
size_t kv_dtype_block_bytes(kv_dtype t);

/* Bytes of a row of n elements of type t into *bytes. KV_EINPUT when t is not supported or n is
 * not a positive multiple of the type's block size (the message names both; `what` names the
 * tensor or file). */
int kv_dtype_row_bytes(kv_dtype t, int64_t n, const char *what, size_t *bytes, kv_error *err);

/* Dequantise one row of n elements (n a multiple of the block size) from `src`
 * (kv_dtype_row_bytes(t, n) bytes, any alignment) into dst [n] fp32. KV_EINPUT as for
 * kv_dtype_row_bytes. */
int kv_dequantize_row(kv_dtype t, const void *src, float *dst, int64_t n, kv_error *err);

/* Quantise src [n] fp32 into one row of type t at dst (kv_dtype_row_bytes(t, n) bytes): F16 and
 * BF16 round to nearest even; block types by the reference quantisers described above.
 * Non-finite inputs are the caller's problem (they produce non-finite scales). KV_EINPUT as for
 * kv_dtype_row_bytes. */
int kv_quantize_row(kv_dtype t, const float *src, void *dst, int64_t n, kv_error *err);

/* sum_i w[i] * x[i] for a typed row w of n elements (n a multiple of the block size; not
 * checked here, the hot path) and x [n] fp32, accumulated in fp32 without writing the
 * dequantised row to memory (each block is expanded in registers / on the stack). Uses
 * AVX2/FMA/F16C kernels when the CPU has them. */
float kv_dot_row(kv_dtype t, const void *w, const float *x, int64_t n);

/* The same with the portable C kernels only (what CPUs without AVX2 run); for tests. */
float kv_dot_row_portable(kv_dtype t, const void *w, const float *x, int64_t n);

/* Instruction sets of the integer dot kernels, detected at run time from CPUID. */
typedef enum kv_isa {
    KV_ISA_PORTABLE = 0,    /* C, any CPU: the reference */
    KV_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C: maddubs / madd */
    KV_ISA_AVX512_VNNI = 2, /* AVX-512 F/VL/BW + VNNI on 256-bit vectors: vpdpbusd */
} kv_isa;

/* 1 when this CPU (and build) can run isa's kernels. */
int kv_isa_available(kv_isa isa);
/* The best available: what kv_qmatmul uses. */
kv_isa kv_isa_best(void);
/* "portable", "avx2", "avx512-vnni". Static string. */
const char *kv_isa_name(kv_isa isa);

/* The integer dot of kv_qmatmul for quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K): x [n] is quantised to 8 bits per element (blocks of 32 with an fp32 scale for
 * the 32-element types, blocks of 256 for the K-quants; max |x| / 127 per block, as ggml's Q8_0 /
 * Q8_K activation blocks), each block's integer dot is exact, and the block results are scaled
 * and summed in one fixed order (runtime/quant/quant_dot.h), so every isa gives the same bits.
 * The difference from the fp32 dot sum w x is the activation rounding: per element at most
 * |w_i| d_b / 2 (d_b = max |x| / 127 of its block), plus fp32 summation error.
 * Result in *out. KV_EINPUT when n is not a positive multiple of the type's block, t has no
 * integer kernel (F32, F16, BF16) or the CPU lacks isa; KV_EINTERNAL out of memory (a buffer of
 * ~1.2 n bytes, freed before return). */
int kv_dot_row_q8(kv_dtype t, const void *w, const float *x, int64_t n, kv_isa isa, float *out,
                  kv_error *err);

/* A weight matrix [out, in] kept in its file's type: `out` rows of kv_dtype_row_bytes(type, in)
 * bytes each, row-major, at `data` (the model's loaded file or another buffer the model owns; not
 * owned by this handle). */
typedef struct kv_weight {
    const void *data;
    kv_dtype type;
} kv_weight;

/* An fp32 matrix as a kv_weight. */
static inline kv_weight kv_weight_f32(const float *p) {
    kv_weight w = {p, KV_DT_F32};
    return w;
}

/* Row `row` of w (rows of `in` elements, a multiple of the type's block) dequantised into
 * dst [in] (an embedding lookup). No checks: the loaders validated the shape. */
void kv_weight_row(kv_weight w, int in, int64_t row, float *dst);

/* Typed matmul y[rows, out] = x[rows, in] W^T with W [out, in] row-major in type wt (each of
 * the `out` rows is kv_dtype_row_bytes(wt, in) bytes; `in` a multiple of the block size).
 *   - F32 weights: the BLAS path (cblas_sgemv per row for rows <= 4, sgemm above).
 *   - Quantised weights (Q8_0 ... Q6_K), rows <= 16 (decode, batched decode, eviction blocks):
 *     each row of x is quantised once to 8-bit blocks (kv_dot_row_q8) in `scratch` and every
 *     W row is multiplied with it by the integer kernels of kv_isa_best(), a W row meeting
 *     the rows of x from L1. Each result depends only on its own row of x and W row: the same
 *     bits for any batch of up to 16 rows, thread count and isa. Scratch smaller than
 *     kv_qmatmul_scratch_floats or NULL: a buffer is allocated for the call (out of memory:
 *     the fp32 dots of kv_dot_row instead).
 *   - F16 / BF16, rows <= 4 (decode): one fp32 typed dot (kv_dot_row) per (row, output).
 *   - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K above 16 rows (prefill, chunk scoring, large
 *     p-blocks): the integer GEMM (runtime/quant/quant_gemm.h): the rows of x
 *     quantised once to 8-bit blocks of 32, each chunk of W rows packed into 8-row interleaved
 *     strips, AVX-512 VNNI / AVX2 / portable kernels with the same bits; each result depends
 *     only on its own row of x and W row (the same bits for any batch above 16 rows). Scratch:
 *     the quantised rows and one panel per thread (kv_qmatmul_scratch_floats); smaller or
 *     NULL: a buffer is allocated for the call (out of memory: the integer dots).
 *   - F16 / BF16 above 4 rows (prefill): tiles of W rows are dequantised into
 *     `scratch` (at least kv_qmatmul_scratch_floats(wt, rows, in, out) floats) and multiplied
 *     by cblas_sgemm (fp32 activations); with a smaller or NULL scratch the dot path (fp32
 *     dots for F16 / BF16, the integer dots for quantised types).
 * The outputs are computed in chunks of consecutive W rows whose size depends only on the
 * path and the matrix (runtime/quant/quant.c), so kv_qmatmul_pool gives these same bits on any
 * number of threads.
 * Preconditions (not checked, the hot path): rows, in, out > 0, in a multiple of
 * kv_dtype_block(wt), y not aliasing x. No global state. */
void kv_qmatmul(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in, int out,
                float *scratch, size_t scratch_floats);

/* kv_qmatmul with its chunks run on the threads of `pool` (NULL: the caller alone).
 * The dequantised tiles are per thread: the tile path wants
 * kv_qmatmul_scratch_threads(wt, rows, in, out, kv_workers_count(pool)) floats of scratch.
 * The BLAS calls of the F32 and tile paths run inside the chunks, so the process's OpenBLAS
 * should be on one thread (kvplan/workers.h). Same bits as kv_qmatmul. */
void kv_qmatmul_pool(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in,
                     int out, float *scratch, size_t scratch_floats, kv_workers *pool);

/* kv_qmatmul_pool where every row of y gets the bits a call with that row alone gives it, for
 * any number of rows (batch-invariant decode: a sequence's logits do not depend on the other
 * sequences of its step). The per-row paths whatever `rows`: F32 weights gemv_f32's order (four
 * rows of x per pass over W, register-blocked, each row's sums in its own single-row order),
 * quantised types the integer dots, F16 / BF16 the fp32 dots. Scratch as kv_qmatmul_pool
 * (smaller or NULL: a buffer is allocated for the call when the path needs one). Slower than
 * kv_qmatmul_pool's GEMMs where a batch's weight reads dominate (large models, many rows). */
void kv_qmatmul_rowwise_pool(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in,
                             int out, float *scratch, size_t scratch_floats, kv_workers *pool);

/* Floats of scratch kv_qmatmul wants for these sizes: the quantised rows of x for quantised
 * types (~0.3 rows * in floats; above 16 rows plus the integer GEMM's weight panel, ~0.3
 * chunk * in floats), a dequantised tile for F16 / BF16 prefill, 0 for F32 and
 * F16 / BF16 decode. */
size_t kv_qmatmul_scratch_floats(kv_dtype wt, int rows, int in, int out);
/* The same for kv_qmatmul_pool on n_threads threads (one tile or weight panel per thread). */
size_t kv_qmatmul_scratch_threads(kv_dtype wt, int rows, int in, int out, int n_threads);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
