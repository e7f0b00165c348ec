/* Internal to runtime/quant: every weight type's kernels, declared from the rows of
 * quant_types.h (KV_QTYPES) and named kv_qk_<kernel>_<T> (T as kv_dtype_name spells the type).
 * The traits table (quant_traits.c) points at them; nothing else calls them by name, so adding
 * a type means a row in KV_QTYPES and these kernels for it.
 *
 *   kv_qk_dequant_T, kv_qk_dequant_avx2_T   (quant_rows.c) a row of n elements (n a multiple of
 *       the block) at p to dst [n] fp32; portable C, and the same code compiled for AVX2 + FMA +
 *       F16C (the same bits: exact per-element arithmetic).
 *   kv_qk_quantize_T   (quant_rows.c) src [n] fp32 to one row at dst, the reference quantisers
 *       of include/kvplan/quant.h.
 *   kv_qk_dot_T, kv_qk_dot_avx2_T   (quant_rows.c) sum w[i] x[i] in fp32, a block at a time
 *       (include/kvplan/quant.h kv_dot_row, kv_dot_row_portable).
 *   kv_qk_qdot_c_T, kv_qk_qdot_avx2_T, kv_qk_qdot_vnni_T   (quant_dot.c; types with integer
 *       kernels only) the integer dot of a weight row with a quantised activation row
 *       (quant_dot.h), the same bits on every isa.
 *   kv_qk_repack_T   (quant_repack.c; integer types) block b (of 32) of a weight row as the
 *       integer GEMM reads it: u [32] unsigned codes, scale a and m (quant_gemm.h).
 *   kv_qk_pack_avx2_T   (quant_repack.c; integer types, x86) W rows o .. min(o + 8, o1) - 1
 *       (rb bytes apart) packed into one strip of nb 320-byte block records at P.
 * The AVX2 and VNNI kernels exist on x86-64 builds only (KV_QK_X86). */
#ifndef KVPLAN_RUNTIME_QUANT_KERNELS_H
#define KVPLAN_RUNTIME_QUANT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/quant_types.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_QK_X86 1
#include <immintrin.h>

/* The sum of the 8 lanes of v, ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) (the
 * horizontal sum of the AVX2 fp32 dots and GEMVs). */
__attribute__((target("avx2,fma,f16c"))) static inline float kv_qk_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#define KV_QK_DECLARE(T, ...)                                                                      \
    void kv_qk_dequant_##T(const uint8_t *p, float *dst, int64_t n);                               \
    void kv_qk_dequant_avx2_##T(const uint8_t *p, float *dst, int64_t n);                          \
    void kv_qk_quantize_##T(const float *src, uint8_t *dst, int64_t n);                            \
    float kv_qk_dot_##T(const uint8_t *w, const float *x, int64_t n);                              \
    float kv_qk_dot_avx2_##T(const uint8_t *w, const float *x, int64_t n);                         \
    float kv_qk_qdot_c_##T(const uint8_t *w, const void *act, int n);                              \
    float kv_qk_qdot_avx2_##T(const uint8_t *w, const void *act, int n);                           \
    float kv_qk_qdot_vnni_##T(const uint8_t *w, const void *act, int n);                           \
    void kv_qk_repack_##T(const uint8_t *row, int b, uint8_t *u, float *a, float *m);              \
    void kv_qk_pack_avx2_##T(const uint8_t *W, size_t rb, int o, int o1, int nb, uint8_t *P);
KV_QTYPES(KV_QK_DECLARE)
#undef KV_QK_DECLARE

#endif
