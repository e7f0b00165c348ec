/* Weight data types in their own type: the public dequantise / quantise / dot entry points, each
 * a lookup of the type's row in the traits table (quant_traits.h) and a call of its kernel for
 * the ISA in use, and the typed matmul. See include/kvplan/quant.h for the layouts (ggml
 * ggml-common.h / ggml-quants.c, GGUF docs/gguf.md). The kernels: quant_rows.c (fp32),
 * quant_dot.c (integer dots), quant_gemm.c and quant_repack.c (the integer GEMM). */
#include "kvplan/quant.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/workers.h"
#include "quant/quant_dot.h"
#include "quant/quant_gemm.h"
#include "quant/quant_kernels.h"
#include "quant/quant_traits.h"
#include "util/f16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_QUANT_X86 1
#include <immintrin.h>
#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

/* ---- the per-type entry points: one row lookup, one kernel call ---- */

/* The ISA whose kernels a call runs: the best this CPU has (kv_isa_best: no CPUID per call). */
static kv_isa isa_now(void) {
    return kv_isa_best();
}

int kv_dequantize_row(kv_dtype t, const void *src, float *dst, int64_t n, kv_error *err) {
    size_t bytes;
    if (kv_dtype_row_bytes(t, n, "dequantize", &bytes, err)) return KV_EINPUT;
    kv_qtraits_get(t)->dequant[isa_now()](src, dst, n);
    return KV_OK;
}

int kv_quantize_row(kv_dtype t, const float *src, void *dst, int64_t n, kv_error *err) {
    size_t bytes;
    if (kv_dtype_row_bytes(t, n, "quantize", &bytes, err)) return KV_EINPUT;
    kv_qtraits_get(t)->quantize(src, dst, n);
    return KV_OK;
}

float kv_dot_row(kv_dtype t, const void *w, const float *x, int64_t n) {
    kv_qrowdot_fn f = kv_qtraits_get(t)->dot[isa_now()];
    return f ? f(w, x, n) : 0.0f;
}

float kv_dot_row_portable(kv_dtype t, const void *w, const float *x, int64_t n) {
    kv_qrowdot_fn f = kv_qtraits_get(t)->dot[KV_ISA_PORTABLE];
    return f ? f(w, x, n) : 0.0f;
}

/* ---- the integer dots ---- */

int kv_dot_row_q8(kv_dtype t, const void *w, const float *x, int64_t n, kv_isa isa, float *out,
                  kv_error *err) {
    size_t rb;
    if (kv_dtype_row_bytes(t, n, "integer dot", &rb, err)) return KV_EINPUT;
    if (!kv_qdot_act_kind(t))
        return kv_fail(err, KV_EINPUT,
                       "integer dot: weight type %s has no integer kernel (F32, F16 and BF16 "
                       "use fp32 activations: kv_dot_row)",
                       kv_dtype_name((uint32_t)t));
    if (n > (1 << 30))
        return kv_fail(err, KV_EINPUT,
                       "integer dot: a row of %lld elements is too long (at most 2^30)",
                       (long long)n);
    kv_qdot_fn f = kv_qdot_kernel(t, isa);
    if (!f)
        return kv_fail(err, KV_EINPUT, "integer dot: this CPU cannot run the %s kernels",
                       kv_isa_name(isa));
    void *act = kv_malloc(kv_qdot_act_bytes(t, (int)n), "quantised activation row", err);
    if (!act) return KV_EINTERNAL;
    kv_qdot_quantize_act_isa(t, x, (int)n, act, isa);
    *out = f(w, act, (int)n);
    free(act);
    return KV_OK;
}

/* Bytes of quantised activation rows per pass over the weights in kv_qmatmul_int (at most 16
 * rows): the rows of a pass stay in L1 (32 KiB) with the weight row that meets them all;
 * measured: 16 rows of 2048 (40 KiB) took 2x the time per dot of 8. */
#define KV_QINT_TILE_BYTES 16384

void kv_qmatmul_int_range(float *y, const void *act, const void *w, kv_dtype wt, int rows, int in,
                          int out, int o0, int o1) {
    size_t ab = kv_qdot_act_bytes(wt, in);
    size_t rb = (size_t)(in / kv_dtype_block(wt)) * kv_dtype_block_bytes(wt);
    const uint8_t *A = act, *W = w;
    kv_qdot_fn f = kv_qdot_kernel(wt, kv_isa_best());
    int tile = (int)(KV_QINT_TILE_BYTES / ab);
    tile = tile < 1 ? 1 : tile > 16 ? 16 : tile;
    for (int r0 = 0; r0 < rows; r0 += tile) {
        int r1 = r0 + tile < rows ? r0 + tile : rows;
        for (int o = o0; o < o1; o++)
            for (int r = r0; r < r1; r++)
                y[(size_t)r * out + o] = f(W + (size_t)o * rb, A + r * ab, in);
    }
}

void kv_qmatmul_int(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in, int out,
                    void *act) {
    size_t ab = kv_qdot_act_bytes(wt, in);
    uint8_t *A = act;
    for (int r = 0; r < rows; r++) kv_qdot_quantize_act(wt, x + (size_t)r * in, in, A + r * ab);
    kv_qmatmul_int_range(y, act, w, wt, rows, in, out, 0, out);
}

/* ---- the typed matmul's GEMVs ---- */

/* F32 GEMV over W rows o0 .. o1 - 1 (n floats each, contiguous) with one row x [n]: y[o] =
 * W[o] . x in one fixed order, the reference of gemv_f32_avx2 (the same bits): 16 partial sums
 * (lane k takes i = k mod 16, a mul then an add), folded b_k = a_k + a_(k+8), then
 * ((b0 + b4) + (b2 + b6)) + ((b1 + b5) + (b3 + b7)); the last n mod 16 products added in
 * order. Each output depends only on its own W row and x (batched rows = rows alone). */
static void gemv_f32_c(const float *W, const float *x, int64_t n, int o0, int o1, float *y) {
    for (int o = o0; o < o1; o++) {
        const float *r = W + (size_t)o * (size_t)n;
        float a[16] = {0}, b[8];
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int k = 0; k < 16; k++) a[k] = a[k] + r[i + k] * x[i + k];
        for (int k = 0; k < 8; k++) b[k] = a[k] + a[k + 8];
        float s = ((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7]));
        for (; i < n; i++) s = s + r[i] * x[i];
        y[o] = s;
    }
}

#ifdef KV_QUANT_X86

/* gemv_f32_c with 8-wide vectors (mul and add, no FMA: the same bits). Measured on the 2-core
 * EPYC VM (synthetic 768-dim model, F32, 1 thread, load 5): engine decode 22 t/s with OpenBLAS
 * sgemv, 40 t/s with this loop. */
KV_AVX2 static void gemv_f32_avx2(const float *W, const float *x, int64_t n, int o0, int o1,
                                  float *y) {
    for (int o = o0; o < o1; o++) {
        const float *r = W + (size_t)o * (size_t)n;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(x + i)));
            a1 = _mm256_add_ps(
                a1, _mm256_mul_ps(_mm256_loadu_ps(r + i + 8), _mm256_loadu_ps(x + i + 8)));
        }
        float s = kv_qk_hsum8(_mm256_add_ps(a0, a1));
        for (; i < n; i++) s = s + r[i] * x[i];
        y[o] = s;
    }
}

/* gemv_f32_avx2 for 4 rows of x at once (x rows n apart, y rows ys apart): each W row is
 * loaded once for the 4 rows, and each row's sums are formed with gemv_f32_avx2's operations
 * in its order (per row: two 8-wide accumulators of mul then add, hsum8, the scalar tail), so
 * every y element has the bits gemv_f32_avx2 gives it for that row alone. */
KV_AVX2 static void gemv_f32_avx2_x4(const float *W, const float *x, int64_t n, int o0, int o1,
                                     float *y, size_t ys) {
    const float *x0 = x, *x1 = x + n, *x2 = x + 2 * n, *x3 = x + 3 * n;
    for (int o = o0; o < o1; o++) {
        const float *r = W + (size_t)o * (size_t)n;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m256 w0 = _mm256_loadu_ps(r + i), w1 = _mm256_loadu_ps(r + i + 8);
            a00 = _mm256_add_ps(a00, _mm256_mul_ps(w0, _mm256_loadu_ps(x0 + i)));
            a01 = _mm256_add_ps(a01, _mm256_mul_ps(w1, _mm256_loadu_ps(x0 + i + 8)));
            a10 = _mm256_add_ps(a10, _mm256_mul_ps(w0, _mm256_loadu_ps(x1 + i)));
            a11 = _mm256_add_ps(a11, _mm256_mul_ps(w1, _mm256_loadu_ps(x1 + i + 8)));
            a20 = _mm256_add_ps(a20, _mm256_mul_ps(w0, _mm256_loadu_ps(x2 + i)));
            a21 = _mm256_add_ps(a21, _mm256_mul_ps(w1, _mm256_loadu_ps(x2 + i + 8)));
            a30 = _mm256_add_ps(a30, _mm256_mul_ps(w0, _mm256_loadu_ps(x3 + i)));
            a31 = _mm256_add_ps(a31, _mm256_mul_ps(w1, _mm256_loadu_ps(x3 + i + 8)));
        }
        float s0 = kv_qk_hsum8(_mm256_add_ps(a00, a01)), s1 = kv_qk_hsum8(_mm256_add_ps(a10, a11));
        float s2 = kv_qk_hsum8(_mm256_add_ps(a20, a21)), s3 = kv_qk_hsum8(_mm256_add_ps(a30, a31));
        for (int64_t k = i; k < n; k++) s0 = s0 + r[k] * x0[k];
        for (int64_t k = i; k < n; k++) s1 = s1 + r[k] * x1[k];
        for (int64_t k = i; k < n; k++) s2 = s2 + r[k] * x2[k];
        for (int64_t k = i; k < n; k++) s3 = s3 + r[k] * x3[k];
        y[o] = s0;
        y[ys + (size_t)o] = s1;
        y[2 * ys + (size_t)o] = s2;
        y[3 * ys + (size_t)o] = s3;
    }
}

/* F16 GEMV over W rows o0 .. o1 - 1 (rb bytes apart) with one row x [n]: y[o] for each o, one
 * W row after the other, each row's arithmetic dot_f16_avx2's (the bits of kv_dot_row).
 * Measured on the 2-core EPYC VM (W 196 MB, one thread): interleaving 2 or 4 W rows per pass
 * to share the loads of x was 2.5-3x slower (3.3-4.7 GB/s) than one row at a time (10-13
 * GB/s), and 4 accumulators per row no faster than 2. (An F32 form of this loop read 9.8-10.2
 * GB/s where OpenBLAS's sgemv read 5.9-6.6, but it moved the batched-vs-alone rounding past
 * test_sensitivity's 1e-5 pin, so F32 decode stays on sgemv for now.) */
#define GEMV_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define GEMV_BODY(LOAD, ES, SCALAR)                                                                \
    for (int o = o0; o < o1; o++) {                                                                \
        const uint8_t *r0 = W + (size_t)o * rb;                                                    \
        __m256 a00 = _mm256_setzero_ps(), a01 = a00;                                               \
        int64_t i = 0;                                                                             \
        for (; i + 16 <= n; i += 16) {                                                             \
            a00 = _mm256_fmadd_ps(LOAD(r0 + ES * i), _mm256_loadu_ps(x + i), a00);                 \
            a01 = _mm256_fmadd_ps(LOAD(r0 + ES * (i + 8)), _mm256_loadu_ps(x + i + 8), a01);       \
        }                                                                                          \
        float s0 = kv_qk_hsum8(_mm256_add_ps(a00, a01));                                           \
        for (; i < n; i++) s0 += SCALAR(r0, i) * x[i];                                             \
        y[o] = s0;                                                                                 \
    }
#define GEMV_SCALAR_F16(r, i) kv_f16_to_f32(kv_load_u16le((r) + 2 * (i)))

KV_AVX2 static void gemv_f16_avx2(const uint8_t *W, size_t rb, const float *x, int64_t n, int o0,
                                  int o1, float *y) {
    GEMV_BODY(GEMV_LOAD_F16, 2, GEMV_SCALAR_F16)
}
#endif

/* Rows at or below which one dot per (row, output) beats dequantise + sgemm (decode, small
 * batches); the same threshold as the fp32 path's sgemv/sgemm switch (runtime/backend/ops.c). */
#define KV_QDOT_MAX_ROWS 4
/* Chunks (include/kvplan/workers.h). A matmul is cut into chunks of consecutive outputs whose
 * size depends only on the path and the matrix (never on the thread count), and each chunk
 * makes the same calls whichever thread runs it, so the bits do not depend on the threads.
 * GEMV-like paths (few rows): chunks of about KV_CHUNK_BYTES of weights (a multiple of 16
 * rows). Every output there is one W row's dot with one x row, so the chunk size changes no
 * bit. 256 KiB, but at least KV_CHUNK_MIN_COUNT chunks per matrix: long streams for the large
 * matrices (64 KiB chunks cost F16 decode 12% at 2 threads: 126 vs 141 tokens/s, idle, the
 * peer benchmark's model) and balanced threads on decode's small ones (256 KiB alone made a
 * 768 x 768 Q4_0 matrix, 332 KB, chunks of 592 and 176 rows: Q4_0 decode 195 vs 311 tokens/s).
 * GEMM-like paths
 * (F32 sgemm, dequantised tiles): about out / 8 outputs, 64 to 256: each chunk packs x again
 * (sgemm) and converts its own weight rows into its thread's tile. */
#define KV_CHUNK_BYTES ((size_t)256 << 10)
#define KV_CHUNK_MIN_COUNT 8
#define KV_CHUNK_GEMM_MIN 64
#define KV_CHUNK_GEMM_MAX 256

static int gemv_chunk(size_t row_bytes, int out) {
    size_t c = KV_CHUNK_BYTES / (row_bytes ? row_bytes : 1);
    size_t even = ((size_t)out + KV_CHUNK_MIN_COUNT - 1) / KV_CHUNK_MIN_COUNT;
    if (even < c) c = even;
    c = c / 16 * 16;
    if (c < 16) c = 16;
    return c < (size_t)out ? (int)c : out;
}

static int gemm_chunk(int out) {
    int c = (out + 7) / 8;
    c = (c + 15) / 16 * 16;
    c = c < KV_CHUNK_GEMM_MIN ? KV_CHUNK_GEMM_MIN : c > KV_CHUNK_GEMM_MAX ? KV_CHUNK_GEMM_MAX : c;
    return c < out ? c : out;
}

/* Rows at or below which quantised weights take the integer dots (kv_qmatmul_int) rather
 * than the integer GEMM or dequantised F32 tiles + sgemm. Before the integer GEMM: Measured with
 * bench_quant --kernels (W [2048, 2048], one thread, shared 2-core machine), integer / tile time:
 * Q8_0 0.09 (5 rows), 0.16 (8), 0.70 (16), 1.27 (32), 1.6 (512); Q4_0 0.06 (5) .. 0.33 (16), 0.46
 * (32), 1.9 (512); Q4_K 0.92 (5), 0.61 (8), 0.64 (16), 1.3 (32), 2.2 (512); Q6_K 0.25 (5), 0.30
 * (8), 1.15 (16). Up to 16 rows (decode, batched decode, the eviction blocks of p <= 16 tokens) the
 * integer dots; above, the integer GEMM (quant_gemm.h: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K). The integer GEMM against the others (bench_quant --kernels, same W, one
 * thread, best of 5, load 5, VNNI), ms: Q8_0 5 rows 0.64 (dots 0.67, tiles 3.5), 8 rows 0.71 (1.15,
 * 3.6), 16 rows 0.94 (2.27, 4.3), 17 rows 0.98 (2.36, 4.6), 32 rows 1.37 (4.5, 5.7), 512 rows
 * 15.1 (74, 49); Q4_0 0.65 / 0.68 / 0.99 / 1.01 / 1.39 / 23 at 5 / 8 / 16 / 17 / 32 / 512
 * (dots 0.69 / 1.11 / 2.2 / 2.4 / 8.6 / 104, tiles 5.1 / 5.1 / 5.9 / 6.4 / 11 / 70); Q4_K
 * 0.88 / 0.99 / 1.2 / 1.26 / 1.64 / 16.7 (dots 0.78 / 1.26 / 2.5 / 3.3 / 5.2 / 85, tiles
 * 3.9 / 4.0 / 4.7 / 5.0 / 6.1 / 48). The GEMM would win from ~6 rows, but up to 16 rows the
 * integer dots stay: there a row of a batch gets the bits it gets alone (a decode step,
 * quant.h), which a switch at 6 rows would break for batches of 6-16; the GEMM has the same
 * property from 17 rows up (its bits do not depend on the batch either). */
#define KV_QINT_MAX_ROWS 16

typedef enum mm_path {
    MM_F32_GEMV, /* F32, rows <= KV_QDOT_MAX_ROWS: gemv_f32_c / _avx2 per row and chunk */
    MM_F32_GEMM, /* F32 above: cblas_sgemm per chunk of outputs */
    MM_INT,      /* quantised, rows <= KV_QINT_MAX_ROWS: integer dots */
    MM_DOT,      /* F16 / BF16 decode, or no scratch: fp32 typed dots */
    MM_TILE,     /* above: the chunk's W rows dequantised into its thread's tile, sgemm */
    MM_IGEMM,    /* quantised above KV_QINT_MAX_ROWS: the integer GEMM (quant_gemm.h) */
} mm_path;

static mm_path mm_choose(kv_dtype wt, int rows) {
    if (wt == KV_DT_F32) return rows <= KV_QDOT_MAX_ROWS ? MM_F32_GEMV : MM_F32_GEMM;
    if (kv_qdot_act_kind(wt)) {
        if (rows <= KV_QINT_MAX_ROWS) return MM_INT;
        return kv_qgemm_covers(wt) ? MM_IGEMM : MM_TILE;
    }
    return rows <= KV_QDOT_MAX_ROWS ? MM_DOT : MM_TILE;
}

static int mm_chunk(mm_path p, kv_dtype wt, int in, int out) {
    /* small matrices (stories260K's) in one sgemm: splitting them gains nothing, and OpenBLAS
     * picks other kernels for small N, which moved batched results by rounding */
    if (p == MM_IGEMM) return gemm_chunk(out); /* the bits do not depend on the chunks */
    if (p == MM_F32_GEMM || p == MM_TILE)
        return (size_t)out * (size_t)in <= ((size_t)1 << 18) ? out : gemm_chunk(out);
    return gemv_chunk((size_t)(in / kv_dtype_block(wt)) * kv_dtype_block_bytes(wt), out);
}

/* MM_IGEMM's scratch: the quantised rows of x, then one weight panel per thread (64-byte
 * multiples, so every part stays as aligned as the buffer). */
static size_t igemm_act_bytes(int rows, int in) {
    return (kv_qgemm_act_bytes(rows, in) + 63) / 64 * 64;
}
static size_t igemm_panel_bytes(kv_dtype wt, int in, int out) {
    return (kv_qgemm_panel_bytes(mm_chunk(MM_IGEMM, wt, in, out), in) + 63) / 64 * 64;
}
static size_t igemm_bytes(kv_dtype wt, int rows, int in, int out, int n_threads) {
    return igemm_act_bytes(rows, in) + (size_t)n_threads * igemm_panel_bytes(wt, in, out);
}

size_t kv_qmatmul_scratch_threads(kv_dtype wt, int rows, int in, int out, int n_threads) {
    if (wt == KV_DT_F32 || in <= 0 || out <= 0 || rows <= 0) return 0;
    if (n_threads < 1) n_threads = 1;
    mm_path p = mm_choose(wt, rows);
    if (p == MM_INT)
        return ((size_t)rows * kv_qdot_act_bytes(wt, in) + sizeof(float) - 1) / sizeof(float);
    if (p == MM_TILE) return (size_t)n_threads * (size_t)mm_chunk(p, wt, in, out) * (size_t)in;
    if (p == MM_IGEMM) return (igemm_bytes(wt, rows, in, out, n_threads) + 3) / 4;
    return 0;
}

size_t kv_qmatmul_scratch_floats(kv_dtype wt, int rows, int in, int out) {
    return kv_qmatmul_scratch_threads(wt, rows, in, out, 1);
}

typedef struct mm_job {
    mm_path path;
    float *y;
    const float *x;
    const uint8_t *W;
    kv_dtype wt;
    int rows, in, out, cs;
    size_t rb;       /* bytes of a W row */
    const void *act; /* MM_INT: the quantised rows of x */
    float *tiles;    /* MM_TILE: [threads][cs * in] */
    uint8_t *panels; /* MM_IGEMM: [threads][panel bytes] */
    size_t panel_bytes;
    kv_isa isa;
    kv_qrowdot_fn dot; /* MM_DOT */
    int avx2;          /* the AVX2 GEMVs of F32 and F16 */
} mm_job;

static void mm_run_chunk(void *ctx, int chunk, int tid) {
    const mm_job *j = ctx;
    int o0 = chunk * j->cs, o1 = o0 + j->cs < j->out ? o0 + j->cs : j->out, n = o1 - o0;
    switch (j->path) {
    case MM_F32_GEMV: { /* gemv_f32_c's order (OpenBLAS's sgemv read ~9 GB/s here) */
        const float *wf = (const float *)(const void *)j->W;
        int r = 0;
#ifdef KV_QUANT_X86
        if (j->avx2) /* 4 rows per pass over W, each with its own row's bits */
            for (; r + 4 <= j->rows; r += 4)
                gemv_f32_avx2_x4(wf, j->x + (size_t)r * j->in, j->in, o0, o1,
                                 j->y + (size_t)r * j->out, (size_t)j->out);
#endif
        for (; r < j->rows; r++) {
            const float *xr = j->x + (size_t)r * j->in;
            float *yr = j->y + (size_t)r * j->out;
#ifdef KV_QUANT_X86
            if (j->avx2) {
                gemv_f32_avx2(wf, xr, j->in, o0, o1, yr);
                continue;
            }
#endif
            gemv_f32_c(wf, xr, j->in, o0, o1, yr);
        }
        break;
    }
    case MM_F32_GEMM:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->rows, n, j->in, 1.0f, j->x, j->in,
                    (const float *)(const void *)j->W + (size_t)o0 * j->in, j->in, 0.0f, j->y + o0,
                    j->out);
        break;
    case MM_INT:
        kv_qmatmul_int_range(j->y, j->act, j->W, j->wt, j->rows, j->in, j->out, o0, o1);
        break;
    case MM_IGEMM:
        kv_qgemm_range(j->y, j->act, j->W, j->wt, j->rows, j->in, j->out, o0, o1,
                       j->panels + (size_t)tid * j->panel_bytes, j->isa);
        break;
    case MM_DOT:
#ifdef KV_QUANT_X86
        if (j->avx2 && j->wt == KV_DT_F16) {
            for (int r = 0; r < j->rows; r++)
                gemv_f16_avx2(j->W, j->rb, j->x + (size_t)r * j->in, j->in, o0, o1,
                              j->y + (size_t)r * j->out);
            break;
        }
#endif
        for (int o = o0; o < o1; o++)
            for (int r = 0; r < j->rows; r++)
                j->y[(size_t)r * j->out + o] =
                    j->dot(j->W + (size_t)o * j->rb, j->x + (size_t)r * j->in, j->in);
        break;
    case MM_TILE: {
        float *t = j->tiles + (size_t)tid * (size_t)j->cs * (size_t)j->in;
        for (int i = 0; i < n; i++)
            kv_dequantize_row(j->wt, j->W + (size_t)(o0 + i) * j->rb, t + (size_t)i * j->in, j->in,
                              NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->rows, n, j->in, 1.0f, j->x, j->in,
                    t, j->in, 0.0f, j->y + o0, j->out);
        break;
    }
    }
}

void kv_qmatmul_tiles(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in,
                      int out, float *scratch) {
    mm_job j = {.path = MM_TILE,
                .y = y,
                .x = x,
                .W = w,
                .wt = wt,
                .rows = rows,
                .in = in,
                .out = out,
                .cs = mm_chunk(MM_TILE, wt, in, out),
                .tiles = scratch};
    j.rb = (size_t)(in / kv_dtype_block(wt)) * kv_dtype_block_bytes(wt);
    int n_chunks = (out + j.cs - 1) / j.cs;
    for (int c = 0; c < n_chunks; c++) mm_run_chunk(&j, c, 0);
}

/* MM_IGEMM's activation rows quantised on the pool: chunks of KV_QG_ROWS_CHUNK rows (even, so
 * only the last chunk holds the padding row); each row's bytes do not depend on the chunk. */
#define KV_QG_ROWS_CHUNK 32
typedef struct qg_quant_job {
    kv_dtype wt;
    const float *x;
    int rows, in;
    uint8_t *act;
} qg_quant_job;

static void qg_quant_chunk(void *ctx, int chunk, int tid) {
    (void)tid;
    const qg_quant_job *q = ctx;
    int r0 = chunk * KV_QG_ROWS_CHUNK,
        n = q->rows - r0 < KV_QG_ROWS_CHUNK ? q->rows - r0 : KV_QG_ROWS_CHUNK;
    kv_qgemm_quantize(q->wt, q->x + (size_t)r0 * q->in, n, q->in,
                      q->act + kv_qgemm_act_bytes(r0, q->in));
}

/* kv_qmatmul_pool on the path chosen for `path_rows` rows (rows itself, or 1: the per-row
 * paths whatever the rows). */
static void qmatmul_run(float *y, const float *x, const void *w, kv_dtype wt, int rows,
                        int path_rows, int in, int out, float *scratch, size_t scratch_floats,
                        kv_workers *pool) {
    int threads = kv_workers_count(pool);
    mm_job j = {.y = y, .x = x, .W = w, .wt = wt, .rows = rows, .in = in, .out = out};
    j.rb = (size_t)(in / kv_dtype_block(wt)) * kv_dtype_block_bytes(wt);
    j.path = mm_choose(wt, path_rows);
    void *own = NULL;
    if (j.path == MM_TILE &&
        !(scratch && scratch_floats >= kv_qmatmul_scratch_threads(wt, rows, in, out, threads)))
        j.path = kv_qdot_act_kind(wt) ? MM_INT : MM_DOT; /* no tile room: the dot paths */
    if (j.path == MM_IGEMM) {
        size_t need = igemm_bytes(wt, rows, in, out, threads);
        uint8_t *a = scratch && scratch_floats * sizeof(float) >= need ? (uint8_t *)scratch : NULL;
        if (!a) a = own = malloc(need);
        if (a) {
            qg_quant_job q = {wt, x, rows, in, a};
            kv_workers_run(pool, (rows + KV_QG_ROWS_CHUNK - 1) / KV_QG_ROWS_CHUNK, qg_quant_chunk,
                           &q);
            j.act = a;
            j.panels = a + igemm_act_bytes(rows, in);
            j.panel_bytes = igemm_panel_bytes(wt, in, out);
            j.isa = kv_isa_best();
        } else {
            j.path = MM_INT; /* out of memory: the integer dots (their own buffer) */
        }
    }
    if (j.path == MM_INT) {
        size_t ab = kv_qdot_act_bytes(wt, in), act = (size_t)rows * ab;
        void *a = scratch && scratch_floats * sizeof(float) >= act ? (void *)scratch : NULL;
        if (!a) a = own = malloc(act);
        if (a) {
            for (int r = 0; r < rows; r++)
                kv_qdot_quantize_act(wt, x + (size_t)r * in, in, (uint8_t *)a + (size_t)r * ab);
            j.act = a;
        } else {
            j.path = MM_DOT; /* out of memory: the fp32 dots */
        }
    }
    if (j.path == MM_DOT) j.dot = kv_qtraits_get(wt)->dot[isa_now()];
#ifdef KV_QUANT_X86
    j.avx2 = kv_isa_available(KV_ISA_AVX2);
#endif
    j.tiles = scratch;
    j.cs = mm_chunk(j.path, wt, in, out);
    kv_workers_run(pool, (out + j.cs - 1) / j.cs, mm_run_chunk, &j);
    free(own);
}

void kv_qmatmul_pool(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in,
                     int out, float *scratch, size_t scratch_floats, kv_workers *pool) {
    qmatmul_run(y, x, w, wt, rows, rows, in, out, scratch, scratch_floats, pool);
}

void kv_qmatmul_rowwise_pool(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in,
                             int out, float *scratch, size_t scratch_floats, kv_workers *pool) {
    qmatmul_run(y, x, w, wt, rows, 1, in, out, scratch, scratch_floats, pool);
}

void kv_qmatmul(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in, int out,
                float *scratch, size_t scratch_floats) {
    kv_qmatmul_pool(y, x, w, wt, rows, in, out, scratch, scratch_floats, NULL);
}

void kv_weight_row(kv_weight w, int in, int64_t row, float *dst) {
    size_t rb = (size_t)(in / kv_dtype_block(w.type)) * kv_dtype_block_bytes(w.type);
    kv_dequantize_row(w.type, (const uint8_t *)w.data + (size_t)row * rb, dst, in, NULL);
}
