/* Every integer type's weight repack for the integer GEMM (quant_kernels.h, quant_gemm.h): a
 * block of 32 weights read as w_j = a * (u_j - off) + m, one block at a time for the portable
 * reference (kv_qk_repack_T) and 8 W rows at a time into a strip's block records for the AVX2
 * and VNNI kernels (kv_qk_pack_avx2_T). Each type's entry point is one of three bodies (the
 * 32-element types, Q4_K / Q5_K, Q6_K) with the type a constant: its facts (quant_types.h:
 * bytes, offsets, has_min, signed codes, the fifth bits) fold away. */
#include "quant/quant_kernels.h"

#include <string.h>

#include "util/f16.h"

#ifdef KV_QK_X86
#include <immintrin.h>
#define KV_QR_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

#define QB 32   /* elements per block */
#define REC 320 /* bytes of one strip's block record: 256 of u, 32 of a, 32 of m */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float h2f(const uint8_t *p) {
    return kv_f16_to_f32(kv_load_u16le(p));
}

static inline uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The 6-bit scale and min of K-quant sub-block s (ggml get_scale_min_k4; quant_rows.c). */
static inline void k_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* ---- one block: u [32], a, m ---- */

/* The 32-element types: Q8_0's signed codes biased by 128, else nibbles (and fifth bits). */
ALWAYS_INLINE void unpack32(kv_qblock L, const uint8_t *row, int b, uint8_t *u, float *a,
                            float *m) {
    const uint8_t *blk = row + (size_t)b * (size_t)L.bytes, *qs = blk + L.qs;
    if (L.sgn) {
        for (int j = 0; j < QB; j++) u[j] = (uint8_t)(qs[j] ^ 0x80u);
    } else {
        uint32_t h = L.qh ? ld32(blk + L.qh) : 0;
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1u) << 4);
            u[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1u) << 4);
        }
    }
    *a = h2f(blk);
    *m = L.has_min ? h2f(blk + 2) : 0.0f;
}

/* Q4_K / Q5_K (five: the fifth bits): sub-block b % 8 of super-block b / 8. */
ALWAYS_INLINE void unpack_k45(int five, const uint8_t *row, int b, uint8_t *u, float *a, float *m) {
    int sb = b / 8, s = b % 8, c = s / 2, sh = 4 * (s & 1);
    const uint8_t *blk = row + (size_t)sb * (five ? 176u : 144u);
    const uint8_t *qs = blk + (five ? 48 : 16) + 32 * c, *qh = blk + 16;
    int sc, mn;
    k_scale_min(blk + 4, s, &sc, &mn);
    for (int j = 0; j < QB; j++) {
        int v = (qs[j] >> sh) & 15;
        if (five) v |= ((qh[j] >> s) & 1) << 4;
        u[j] = (uint8_t)v;
    }
    *a = h2f(blk) * (float)sc;
    *m = -(h2f(blk + 2) * (float)mn);
}

/* Q6_K: scales per 16, the second half's in m's place. */
static void unpack_q6k(const uint8_t *row, int b, uint8_t *u, float *a, float *m) {
    int sub = b % 8, h = sub / 4, qq = sub % 4;
    const uint8_t *blk = row + (size_t)(b / 8) * 210u;
    const uint8_t *ql = blk + 64 * h + 32 * (qq & 1), *qh = blk + 128 + 32 * h;
    for (int j = 0; j < QB; j++)
        u[j] = (uint8_t)(((ql[j] >> (4 * (qq >> 1))) & 15) | ((qh[j] >> (2 * qq)) & 3) << 4);
    float d = h2f(blk + 208);
    *a = d * (float)(int8_t)blk[192 + 2 * sub];
    *m = d * (float)(int8_t)blk[192 + 2 * sub + 1]; /* the second half's scale */
}

#define REPACK32(T)                                                                                \
    void kv_qk_repack_##T(const uint8_t *row, int b, uint8_t *u, float *a, float *m) {             \
        unpack32(kv_qblock_of[KV_DT_##T], row, b, u, a, m);                                        \
    }
REPACK32(Q8_0)
REPACK32(Q4_0)
REPACK32(Q4_1)
REPACK32(Q5_0)
REPACK32(Q5_1)
void kv_qk_repack_Q4_K(const uint8_t *row, int b, uint8_t *u, float *a, float *m) {
    unpack_k45(0, row, b, u, a, m);
}
void kv_qk_repack_Q5_K(const uint8_t *row, int b, uint8_t *u, float *a, float *m) {
    unpack_k45(1, row, b, u, a, m);
}
void kv_qk_repack_Q6_K(const uint8_t *row, int b, uint8_t *u, float *a, float *m) {
    unpack_q6k(row, b, u, a, m);
}

/* ---- strips of 8 rows (AVX2) ---- */
#ifdef KV_QK_X86

/* Block b of a W row: its 32 u as bytes (the repack's u, in vector form). */
KV_QR_AVX2 ALWAYS_INLINE __m256i u32_avx2(kv_qblock L, const uint8_t *row, int b) {
    const __m256i m4 = _mm256_set1_epi8(15);
    if (L.block == 256) { /* Q4_K, Q5_K (with a min), Q6_K (without) */
        const uint8_t *blk = row + (size_t)(b / 8) * (size_t)L.bytes;
        int sub = b % 8;
        if (!L.has_min) {
            int h = sub / 4, qq = sub % 4;
            __m256i l =
                _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h + 32 * (qq & 1)));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h));
            l = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (qq >> 1))), m4);
            hb = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * qq)),
                                  _mm256_set1_epi8(3));
            return _mm256_or_si256(l, _mm256_slli_epi16(hb, 4));
        }
        int five = L.bytes == 176, c = sub / 2;
        __m256i v =
            _mm256_loadu_si256((const __m256i *)(const void *)(blk + (five ? 48 : 16) + 32 * c));
        v = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (sub & 1))), m4);
        if (five) {
            __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16));
            __m256i hb =
                _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), _mm256_set1_epi8(1));
            v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 4));
        }
        return v;
    }
    const uint8_t *blk = row + (size_t)b * (size_t)L.bytes;
    if (L.sgn)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(blk + L.qs)),
                                _mm256_set1_epi8((char)0x80));
    __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(blk + L.qs));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
    if (!L.qh) return v;
    int32_t h;
    memcpy(&h, blk + L.qh, 4);
    /* byte j takes bit j of qh as its bit 4 */
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32(h), pick);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
    return _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

/* The repack's a and m alone, for the 32-element types and Q6_K (the K-quants with a min take
 * theirs per super-block in pack_strip_avx2). */
ALWAYS_INLINE void scale_blk(kv_qblock L, const uint8_t *row, int b, float *a, float *m) {
    if (L.block == 256) { /* Q6_K */
        const uint8_t *blk = row + (size_t)(b / 8) * (size_t)L.bytes;
        float d = h2f(blk + 208);
        *a = d * (float)(int8_t)blk[192 + 2 * (b % 8)];
        *m = d * (float)(int8_t)blk[192 + 2 * (b % 8) + 1];
        return;
    }
    const uint8_t *blk = row + (size_t)b * (size_t)L.bytes;
    *a = h2f(blk);
    *m = L.has_min ? h2f(blk + 2) : 0.0f;
}

/* pack_strip with the u of 8 rows transposed as 8 x 8 dwords in registers. */
KV_QR_AVX2 ALWAYS_INLINE void pack_strip_avx2(kv_dtype t, const uint8_t *W, size_t rb, int o,
                                              int o1, int nb, uint8_t *P) {
    const kv_qblock L = kv_qblock_of[t];
    int nv = o1 - o < 8 ? o1 - o : 8, kq = L.block == 256 && L.has_min;
    float ka[8][8], km[8][8]; /* K-quants: a and m of the super-block's 8 sub-blocks, per row */
    for (int b = 0; b < nb; b++) {
        uint8_t *rec = P + (size_t)b * REC;
        __m256i r[8];
        float a[8], m[8];
        if (kq && b % 8 == 0)
            for (int i = 0; i < nv; i++) {
                const uint8_t *blk = W + (size_t)(o + i) * rb + (size_t)(b / 8) * (size_t)L.bytes;
                float d = h2f(blk), dmin = h2f(blk + 2);
                for (int sub = 0; sub < 8; sub++) {
                    int sc, mn;
                    k_scale_min(blk + 4, sub, &sc, &mn);
                    ka[i][sub] = d * (float)sc;
                    km[i][sub] = -(dmin * (float)mn);
                }
            }
        for (int i = 0; i < 8; i++) {
            if (i < nv) {
                const uint8_t *row = W + (size_t)(o + i) * rb;
                r[i] = u32_avx2(L, row, b);
                if (kq) {
                    a[i] = ka[i][b % 8];
                    m[i] = km[i][b % 8];
                } else {
                    scale_blk(L, row, b, &a[i], &m[i]);
                }
            } else {
                r[i] = _mm256_setzero_si256();
                a[i] = m[i] = 0.0f;
            }
        }
        __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
        __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
        __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
        __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
        __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
        __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
        __m256i *d = (__m256i *)(void *)rec;
        _mm256_storeu_si256(d + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
        _mm256_storeu_si256(d + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
        _mm256_storeu_si256(d + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
        _mm256_storeu_si256(d + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
        _mm256_storeu_si256(d + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
        _mm256_storeu_si256(d + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
        _mm256_storeu_si256(d + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
        _mm256_storeu_si256(d + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
        memcpy(rec + 256, a, 32);
        memcpy(rec + 288, m, 32);
    }
}

#define PACK(T)                                                                                    \
    KV_QR_AVX2 void kv_qk_pack_avx2_##T(const uint8_t *W, size_t rb, int o, int o1, int nb,        \
                                        uint8_t *P) {                                              \
        pack_strip_avx2(KV_DT_##T, W, rb, o, o1, nb, P);                                           \
    }
PACK(Q8_0)
PACK(Q4_0)
PACK(Q4_1)
PACK(Q5_0)
PACK(Q5_1)
PACK(Q4_K)
PACK(Q5_K)
PACK(Q6_K)
#endif
