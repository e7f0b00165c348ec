/* Every weight type's fp32 kernels (quant_kernels.h): block decoders and row dequantisers, the
 * reference quantisers, and the typed dot products with fp32 activations. See
 * include/kvplan/quant.h for the layouts (ggml ggml-common.h / ggml-quants.c, GGUF docs/gguf.md).
 *
 * One block decoder per type (generic C, written so the compiler can vectorise it); the dot
 * product expands one block at a time into a stack buffer and multiplies it with x, so a row is
 * never written out in fp32. The _avx2 kernels are compiled for AVX2, FMA and F16C (the traits
 * table picks them on such CPUs); F16, BF16 and Q8_0 convert straight into registers. The block
 * sizes and bytes come from the rows of quant_types.h (QB(T)). */
#include "quant/quant_kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "util/f16.h"

#ifdef KV_QK_X86
#include <immintrin.h>
#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

#define QK 32                         /* elements per block of the 32-element types */
#define QKK 256                       /* elements per super-block of the K-quants */
#define QB(T) kv_qblock_of[KV_DT_##T] /* the facts of type T */

/* ---- scalar conversions ---- */

static inline float h2f(const uint8_t *p) {
    return kv_f16_to_f32(kv_load_u16le(p));
}

/* fp32 -> binary16, round to nearest even; overflow to infinity, NaN stays NaN. */
static uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 0x1p24f)); /* exact scaling, RNE */
    }
    uint32_t h = ((ax >> 23) - 127 + 15) << 10 | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry moves the exponent */
    return (uint16_t)(sign | h);
}

/* fp32 -> bfloat16, round to nearest even; NaN stays NaN. */
static uint16_t f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* Store v as f16 at p and return the value it stores (what the decoder will read). */
static inline float put_h(uint8_t *p, float v) {
    uint16_t h = f2h(v);
    put_u16(p, h);
    return kv_f16_to_f32(h);
}

static inline int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- block decoders: one block of type t at b into y[block] ---- */

static inline void dq_q8_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = d * (float)q[j];
}

static inline void dq_q4_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((int)(qs[j] & 15) - 8);
        y[j + QK / 2] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

static inline void dq_q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)(qs[j] & 15) + m;
        y[j + QK / 2] = d * (float)(qs[j] >> 4) + m;
    }
}

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void dq_q5_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    uint32_t qh = load_u32le(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = d * (float)(lo - 16);
        y[j + QK / 2] = d * (float)(hi - 16);
    }
}

static inline void dq_q5_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = load_u32le(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = d * (float)lo + m;
        y[j + QK / 2] = d * (float)hi + m;
    }
}

/* The 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes (ggml
 * get_scale_min_k4): bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes
 * 8-11 hold the low 4 bits of scale (low nibble) and min (high nibble) of sub-blocks 4-7,
 * whose top 2 bits sit in the top 2 bits of bytes 0-3 (scales) and 4-7 (mins). */
static inline void k_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* The inverse: pack 8 scales and 8 mins (each 0..63) into 12 bytes. */
static void k_pack_scale_min(uint8_t *sc, const int *scale, const int *min) {
    for (int s = 0; s < 4; s++) {
        sc[s] = (uint8_t)((scale[s] & 63) | (scale[s + 4] >> 4) << 6);
        sc[s + 4] = (uint8_t)((min[s] & 63) | (min[s + 4] >> 4) << 6);
        sc[s + 8] = (uint8_t)((scale[s + 4] & 15) | (min[s + 4] & 15) << 4);
    }
}

/* Q4_K and Q5_K (five: the fifth bits in qh[32] before qs). */
static inline __attribute__((always_inline)) void dq_qk45(const uint8_t *b, float *y, int five) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++) { /* 64 elements: sub-blocks 2c (low nibbles), 2c+1 (high) */
        int s0, m0, s1, m1;
        k_scale_min(sc, 2 * c, &s0, &m0);
        k_scale_min(sc, 2 * c + 1, &s1, &m1);
        float d0 = d * (float)s0, n0 = dmin * (float)m0;
        float d1 = d * (float)s1, n1 = dmin * (float)m1;
        const uint8_t *q = qs + 32 * c;
        for (int l = 0; l < 32; l++) {
            int lo = q[l] & 15, hi = q[l] >> 4;
            if (five) {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            y[64 * c + l] = d0 * (float)lo - n0;
            y[64 * c + 32 + l] = d1 * (float)hi - n1;
        }
    }
}

static inline void dq_q4_k(const uint8_t *b, float *y) {
    dq_qk45(b, y, 0);
}

static inline void dq_q5_k(const uint8_t *b, float *y) {
    dq_qk45(b, y, 1);
}

static inline void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *l4 = ql + 64 * h, *h2 = qh + 32 * h;
        float *o = y + 128 * h;
        const int8_t *s = sc + 8 * h;
        for (int l = 0; l < 32; l++) {
            int q0 = ((l4[l] & 15) | (h2[l] & 3) << 4) - 32;
            int q1 = ((l4[l + 32] & 15) | ((h2[l] >> 2) & 3) << 4) - 32;
            int q2 = ((l4[l] >> 4) | ((h2[l] >> 4) & 3) << 4) - 32;
            int q3 = ((l4[l + 32] >> 4) | ((h2[l] >> 6) & 3) << 4) - 32;
            int is = l / 16;
            o[l] = d * (float)s[is] * (float)q0;
            o[l + 32] = d * (float)s[is + 2] * (float)q1;
            o[l + 64] = d * (float)s[is + 4] * (float)q2;
            o[l + 96] = d * (float)s[is + 6] * (float)q3;
        }
    }
}

/* ---- row dequantisers: the block decoder over the row, compiled twice (portable, AVX2) ---- */

#define DQ_ROW(name, attr, T, dq)                                                                  \
    attr void name(const uint8_t *p, float *y, int64_t n) {                                        \
        for (int64_t i = 0; i < n / QB(T).block; i++)                                              \
            dq(p + (size_t)i * QB(T).bytes, y + (size_t)i * QB(T).block);                          \
    }
#ifdef KV_QK_X86
#define DQ_ROWS(T, dq)                                                                             \
    DQ_ROW(kv_qk_dequant_##T, , T, dq) DQ_ROW(kv_qk_dequant_avx2_##T, KV_AVX2, T, dq)
#else
#define DQ_ROWS(T, dq) DQ_ROW(kv_qk_dequant_##T, , T, dq)
#endif
DQ_ROWS(Q8_0, dq_q8_0)
DQ_ROWS(Q4_0, dq_q4_0)
DQ_ROWS(Q4_1, dq_q4_1)
DQ_ROWS(Q5_0, dq_q5_0)
DQ_ROWS(Q5_1, dq_q5_1)
DQ_ROWS(Q4_K, dq_q4_k)
DQ_ROWS(Q5_K, dq_q5_k)
DQ_ROWS(Q6_K, dq_q6_k)

void kv_qk_dequant_F32(const uint8_t *p, float *y, int64_t n) {
    memcpy(y, p, (size_t)n * 4);
}
void kv_qk_dequant_F16(const uint8_t *p, float *y, int64_t n) {
    for (size_t i = 0; i < (size_t)n; i++) y[i] = kv_f16_to_f32(kv_load_u16le(p + 2 * i));
}
void kv_qk_dequant_BF16(const uint8_t *p, float *y, int64_t n) {
    for (size_t i = 0; i < (size_t)n; i++) y[i] = kv_bf16_to_f32(kv_load_u16le(p + 2 * i));
}

#ifdef KV_QK_X86
KV_AVX2 void kv_qk_dequant_avx2_F32(const uint8_t *p, float *y, int64_t n) {
    memcpy(y, p, (size_t)n * 4);
}
/* F16 by the F16C instruction, 8 at a time */
KV_AVX2 void kv_qk_dequant_avx2_F16(const uint8_t *p, float *y, int64_t n) {
    size_t i = 0;
    for (; i + 8 <= (size_t)n; i += 8)
        _mm256_storeu_ps(
            y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i))));
    for (; i < (size_t)n; i++) y[i] = kv_f16_to_f32(kv_load_u16le(p + 2 * i));
}
KV_AVX2 void kv_qk_dequant_avx2_BF16(const uint8_t *p, float *y, int64_t n) {
    for (size_t i = 0; i < (size_t)n; i++) y[i] = kv_bf16_to_f32(kv_load_u16le(p + 2 * i));
}
#endif

/* ---- reference quantisers: one block of src into b ---- */

static void qz_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = put_h(b, amax / 127.0f), id = d > 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; j++)
        b[2 + j] = (uint8_t)(int8_t)clampi((int)lrintf(x[j] * id), -128, 127);
}

/* The element of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n) {
    float best = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > fabsf(best)) best = x[j];
    return best;
}

/* The 32 codes q (0..31) of a block of a 32-element type L at b: low nibbles in qs (element j
 * in the low nibble of byte j, 16 + j in its high nibble), fifth bits in qh when L has them. */
static void put_codes(const int *q, uint8_t *b, kv_qblock L) {
    uint8_t *qs = b + L.qs;
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + QK / 2] & 15) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + QK / 2] >> 4) << (j + 16);
    }
    if (L.qh)
        for (int k = 0; k < 4; k++) b[L.qh + k] = (uint8_t)(qh >> (8 * k));
}

/* Type-0 with 2^(bits-1) negative levels: the largest-magnitude element maps to level 0 (value
 * -2^(bits-1) * d), so d = -max / 2^(bits-1) (the same choice as ggml's reference). */
static void qz_type0(const float *x, uint8_t *b, int bits, kv_qblock L) {
    int half = 1 << (bits - 1), top = (1 << bits) - 1;
    float d = put_h(b, signed_absmax(x, QK) / (float)-half), id = d != 0 ? 1.0f / d : 0.0f;
    int q[QK];
    for (int j = 0; j < QK; j++) q[j] = clampi((int)lrintf(x[j] * id) + half, 0, top);
    put_codes(q, b, L);
}

/* Type-1: x = d * q + m with m the block minimum and d = (max - min) / (2^bits - 1). */
static void qz_type1(const float *x, uint8_t *b, int bits, kv_qblock L) {
    int top = (1 << bits) - 1;
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
    float d = put_h(b, (mx - mn) / (float)top), m = put_h(b + 2, mn);
    float id = d > 0 ? 1.0f / d : 0.0f;
    int q[QK];
    for (int j = 0; j < QK; j++) q[j] = clampi((int)lrintf((x[j] - m) * id), 0, top);
    put_codes(q, b, L);
}

/* Q4_K / Q5_K: per sub-block of 32 the range [min(0, lo), hi] is split in 2^bits - 1 steps;
 * the 8 sub-block scales and mins are quantised to 6 bits against the super-block d and dmin
 * (the largest of each over 63), then every element is re-quantised with its decoded scale. */
static void qz_qk_type1(const float *x, uint8_t *b, int bits) {
    int top = (1 << bits) - 1;
    float scale[8], min[8], smax = 0, mmax = 0;
    for (int s = 0; s < 8; s++) {
        float lo = 0, hi = x[32 * s];
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[32 * s + l]), hi = fmaxf(hi, x[32 * s + l]);
        scale[s] = (hi - lo) / (float)top;
        min[s] = -lo;
        smax = fmaxf(smax, scale[s]);
        mmax = fmaxf(mmax, min[s]);
    }
    float d = put_h(b, smax / 63.0f), dmin = put_h(b + 2, mmax / 63.0f);
    int sc[8], mq[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = d > 0 ? clampi((int)lrintf(scale[s] / d), 0, 63) : 0;
        mq[s] = dmin > 0 ? clampi((int)lrintf(min[s] / dmin), 0, 63) : 0;
    }
    k_pack_scale_min(b + 4, sc, mq);
    uint8_t *qh = b + 16, *qs = b + (bits == 4 ? 16 : 48);
    if (bits == 5) memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int half = 0; half < 2; half++) {
            int s = 2 * c + half;
            float ds = d * (float)sc[s], ms = dmin * (float)mq[s];
            float ids = ds > 0 ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 32; l++) {
                int q = clampi((int)lrintf((x[32 * s + l] + ms) * ids), 0, top);
                uint8_t *o = qs + 32 * c + l;
                *o = (uint8_t)(half ? (*o & 15) | (q & 15) << 4 : (q & 15));
                if (bits == 5) qh[l] |= (uint8_t)((q >> 4) << s);
            }
        }
}

/* Q6_K: per sub-block of 16 a signed scale (largest-magnitude element / -32), quantised to int8
 * against d = max |scale| / 127; elements re-quantised with the decoded scale to [-32, 31]. */
static void qz_q6_k(const float *x, uint8_t *b) {
    float scale[16], amax = 0;
    for (int s = 0; s < 16; s++) {
        scale[s] = signed_absmax(x + 16 * s, 16) / -32.0f;
        amax = fmaxf(amax, fabsf(scale[s]));
    }
    float d = put_h(b + 208, amax / 127.0f);
    int8_t *sc = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++)
        sc[s] = (int8_t)(d > 0 ? clampi((int)lrintf(scale[s] / d), -127, 127) : 0);
    int q[QKK];
    for (int i = 0; i < QKK; i++) {
        float ds = d * (float)sc[i / 16];
        q[i] = ds != 0 ? clampi((int)lrintf(x[i] / ds), -32, 31) + 32 : 32;
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int *qq = q + 128 * h;
            ql[64 * h + l] = (uint8_t)((qq[l] & 15) | (qq[l + 64] & 15) << 4);
            ql[64 * h + l + 32] = (uint8_t)((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
            qh[32 * h + l] = (uint8_t)((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 |
                                       (qq[l + 64] >> 4) << 4 | (qq[l + 96] >> 4) << 6);
        }
}

/* ---- row quantisers: the block quantiser over the row ---- */

#define QZ_ROW(T, call)                                                                            \
    void kv_qk_quantize_##T(const float *src, uint8_t *dst, int64_t n) {                           \
        for (int64_t i = 0; i < n / QB(T).block; i++) {                                            \
            const float *x = src + (size_t)i * QB(T).block;                                        \
            uint8_t *b = dst + (size_t)i * QB(T).bytes;                                            \
            call;                                                                                  \
        }                                                                                          \
    }
QZ_ROW(F32, memcpy(b, x, 4))
QZ_ROW(F16, put_u16(b, f2h(*x)))
QZ_ROW(BF16, put_u16(b, f2bf(*x)))
QZ_ROW(Q8_0, qz_q8_0(x, b))
QZ_ROW(Q4_0, qz_type0(x, b, 4, QB(Q4_0)))
QZ_ROW(Q5_0, qz_type0(x, b, 5, QB(Q5_0)))
QZ_ROW(Q4_1, qz_type1(x, b, 4, QB(Q4_1)))
QZ_ROW(Q5_1, qz_type1(x, b, 5, QB(Q5_1)))
QZ_ROW(Q4_K, qz_qk_type1(x, b, 4))
QZ_ROW(Q5_K, qz_qk_type1(x, b, 5))
QZ_ROW(Q6_K, qz_q6_k(x, b))

/* ---- dot products, generic C ---- */

/* sum a[i] * b[i] for n a multiple of 8, in eight partial sums (vectorisable without
 * reassociation flags). */
static inline float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Half-precision rows: convert 256 elements at a time into a stack buffer. */
static float dot_half_generic(const uint8_t *w, const float *x, int64_t n, int bf16) {
    float buf[256], s = 0;
    for (int64_t i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        for (int64_t k = 0; k < m; k++) {
            uint16_t h = kv_load_u16le(w + 2 * (i + k));
            buf[k] = bf16 ? kv_bf16_to_f32(h) : kv_f16_to_f32(h);
        }
        int m8 = (int)(m / 8 * 8);
        s += dot_f32(buf, x + i, m8);
        for (int k = m8; k < (int)m; k++) s += buf[k] * x[i + k];
    }
    return s;
}

/* The block types: each block decoded into a stack buffer of qk elements (QK or QKK, the row's
 * block), then dot_f32 with x. */
#define BLOCK_DOT_GENERIC(T, dq, qk)                                                               \
    float kv_qk_dot_##T(const uint8_t *w, const float *x, int64_t n) {                             \
        float buf[qk], s = 0;                                                                      \
        for (int64_t i = 0; i < n / (qk); i++) {                                                   \
            dq(w + (size_t)i * QB(T).bytes, buf);                                                  \
            s += dot_f32(buf, x + i * (qk), qk);                                                   \
        }                                                                                          \
        return s;                                                                                  \
    }
BLOCK_DOT_GENERIC(Q8_0, dq_q8_0, QK)
BLOCK_DOT_GENERIC(Q4_0, dq_q4_0, QK)
BLOCK_DOT_GENERIC(Q4_1, dq_q4_1, QK)
BLOCK_DOT_GENERIC(Q5_0, dq_q5_0, QK)
BLOCK_DOT_GENERIC(Q5_1, dq_q5_1, QK)
BLOCK_DOT_GENERIC(Q4_K, dq_q4_k, QKK)
BLOCK_DOT_GENERIC(Q5_K, dq_q5_k, QKK)
BLOCK_DOT_GENERIC(Q6_K, dq_q6_k, QKK)

float kv_qk_dot_F32(const uint8_t *w, const float *x, int64_t n) {
    return cblas_sdot((int)n, (const float *)(const void *)w, 1, x, 1);
}
float kv_qk_dot_F16(const uint8_t *w, const float *x, int64_t n) {
    return dot_half_generic(w, x, n, 0);
}
float kv_qk_dot_BF16(const uint8_t *w, const float *x, int64_t n) {
    return dot_half_generic(w, x, n, 1);
}

#ifdef KV_QK_X86
/* F32 on AVX2 CPUs: BLAS's own dot as on any CPU */
float kv_qk_dot_avx2_F32(const uint8_t *w, const float *x, int64_t n) {
    return kv_qk_dot_F32(w, x, n);
}
#endif

/* ---- dot products, AVX2 + FMA + F16C ---- */
#ifdef KV_QK_X86

KV_AVX2 float kv_qk_dot_avx2_F16(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * i)));
        __m256 w1 =
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * i + 16)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = kv_qk_hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += kv_f16_to_f32(kv_load_u16le(w + 2 * i)) * x[i];
    return s;
}

KV_AVX2 static inline __m256 bf16x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

KV_AVX2 float kv_qk_dot_avx2_BF16(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(bf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = kv_qk_hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += kv_bf16_to_f32(kv_load_u16le(w + 2 * i)) * x[i];
    return s;
}

/* 8 int8 at p as floats */
KV_AVX2 static inline __m256 i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

KV_AVX2 float kv_qk_dot_avx2_Q8_0(const uint8_t *w, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++) {
        const uint8_t *b = w + (size_t)i * 34;
        const float *xb = x + i * QK;
        __m256 p = _mm256_mul_ps(i8x8(b + 2), _mm256_loadu_ps(xb));
        p = _mm256_fmadd_ps(i8x8(b + 10), _mm256_loadu_ps(xb + 8), p);
        p = _mm256_fmadd_ps(i8x8(b + 18), _mm256_loadu_ps(xb + 16), p);
        p = _mm256_fmadd_ps(i8x8(b + 26), _mm256_loadu_ps(xb + 24), p);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b)), p, acc);
    }
    return kv_qk_hsum8(acc);
}

/* 16 unsigned nibbles (low or high halves of 8 bytes) as floats, twice: bytes p[0..8) */
KV_AVX2 static inline __m256 u8x8(__m128i bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/* Q4_0: x = d * (nib - 8); sum = d * (sum nib * x - 8 * sum x). */
KV_AVX2 float kv_qk_dot_avx2_Q4_0(const uint8_t *w, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256 eight = _mm256_set1_ps(8.0f);
    for (int64_t i = 0; i < n / QK; i++) {
        const uint8_t *b = w + (size_t)i * 18;
        const float *xb = x + i * QK;
        __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
        __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        __m256 p = _mm256_mul_ps(_mm256_sub_ps(u8x8(lo), eight), _mm256_loadu_ps(xb));
        p = _mm256_fmadd_ps(_mm256_sub_ps(u8x8(_mm_srli_si128(lo, 8)), eight),
                            _mm256_loadu_ps(xb + 8), p);
        p = _mm256_fmadd_ps(_mm256_sub_ps(u8x8(hi), eight), _mm256_loadu_ps(xb + 16), p);
        p = _mm256_fmadd_ps(_mm256_sub_ps(u8x8(_mm_srli_si128(hi, 8)), eight),
                            _mm256_loadu_ps(xb + 24), p);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b)), p, acc);
    }
    return kv_qk_hsum8(acc);
}

/* Q4_K: per sub-block s, sum = d*sc[s] * sum(nib * x) - dmin*m[s] * sum(x). */
KV_AVX2 float kv_qk_dot_avx2_Q4_K(const uint8_t *w, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t i = 0; i < n / QKK; i++) {
        const uint8_t *b = w + (size_t)i * 144;
        const float *xb = x + i * QKK;
        float d = h2f(b), dmin = h2f(b + 2);
        for (int c = 0; c < 4; c++) {
            int s0, m0, s1, m1;
            k_scale_min(b + 4, 2 * c, &s0, &m0);
            k_scale_min(b + 4, 2 * c + 1, &s1, &m1);
            const uint8_t *q = b + 16 + 32 * c;
            const float *x0 = xb + 64 * c, *x1 = x0 + 32;
            __m256 p0 = _mm256_setzero_ps(), p1 = _mm256_setzero_ps();
            __m256 sx0 = _mm256_setzero_ps(), sx1 = _mm256_setzero_ps();
            for (int h = 0; h < 2; h++) {
                __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + 16 * h));
                __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                __m256 xa = _mm256_loadu_ps(x0 + 16 * h), xb2 = _mm256_loadu_ps(x0 + 16 * h + 8);
                __m256 ya = _mm256_loadu_ps(x1 + 16 * h), yb = _mm256_loadu_ps(x1 + 16 * h + 8);
                p0 = _mm256_fmadd_ps(u8x8(lo), xa, p0);
                p0 = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), xb2, p0);
                p1 = _mm256_fmadd_ps(u8x8(hi), ya, p1);
                p1 = _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), yb, p1);
                sx0 = _mm256_add_ps(sx0, _mm256_add_ps(xa, xb2));
                sx1 = _mm256_add_ps(sx1, _mm256_add_ps(ya, yb));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)s0), p0, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)s1), p1, acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * (float)m0), sx0, acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * (float)m1), sx1, acc);
        }
    }
    return kv_qk_hsum8(acc);
}

/* The other block types: the generic decoder (compiled here for AVX2) into a stack buffer,
 * then FMA with x. */
#define BLOCK_DOT_AVX2(T, dq, qk)                                                                  \
    KV_AVX2 float kv_qk_dot_avx2_##T(const uint8_t *w, const float *x, int64_t n) {                \
        float buf[qk];                                                                             \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                 \
        for (int64_t i = 0; i < n / (qk); i++) {                                                   \
            dq(w + (size_t)i * QB(T).bytes, buf);                                                  \
            const float *xb = x + i * (qk);                                                        \
            for (int j = 0; j < (qk); j += 16) {                                                   \
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j), _mm256_loadu_ps(xb + j), a0);       \
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j + 8), _mm256_loadu_ps(xb + j + 8),    \
                                     a1);                                                          \
            }                                                                                      \
        }                                                                                          \
        return kv_qk_hsum8(_mm256_add_ps(a0, a1));                                                 \
    }
BLOCK_DOT_AVX2(Q4_1, dq_q4_1, QK)
BLOCK_DOT_AVX2(Q5_0, dq_q5_0, QK)
BLOCK_DOT_AVX2(Q5_1, dq_q5_1, QK)
BLOCK_DOT_AVX2(Q5_K, dq_q5_k, QKK)
BLOCK_DOT_AVX2(Q6_K, dq_q6_k, QKK)
#endif
