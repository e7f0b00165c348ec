/* Weight data types in their own type: block layouts, dequantisation, reference quantisers,
 * typed dot products and the typed matmul. See include/kvplan/quant.h for the layouts (ggml
 * ggml-common.h / ggml-quants.c, GGUF docs/gguf.md).
 *
 * Structure: one block decoder per type (generic C, written so the compiler can vectorise it);
 * the dot product expands one block at a time into a stack buffer and multiplies it with x, so
 * a row is never written out in fp32. On x86-64 CPUs with AVX2, FMA and F16C the dot products
 * run in kernels compiled for those extensions (chosen per call by __builtin_cpu_supports, no
 * stored state); F16, BF16 and Q8_0 convert straight into registers.
 */
#include "kvplan/quant.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvplan/workers.h"
#include "quant/quant_dot.h"
#include "quant/quant_gemm.h"
#include "util/f16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_QUANT_X86 1
#include <immintrin.h>
#endif

#define QK 32   /* elements per block of the 32-element types */
#define QKK 256 /* elements per super-block of the K-quants */

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

static inline void dq_q4_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) { /* 64 elements: sub-blocks 2c (low nibbles), 2c+1 (high) */
        int s0, m0, s1, m1;
        k_scale_min(sc, 2 * c, &s0, &m0);
        k_scale_min(sc, 2 * c + 1, &s1, &m1);
        float d0 = d * (float)s0, n0 = dmin * (float)m0;
        float d1 = d * (float)s1, n1 = dmin * (float)m1;
        const uint8_t *q = qs + 32 * c;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d0 * (float)(q[l] & 15) - n0;
            y[64 * c + 32 + l] = d1 * (float)(q[l] >> 4) - n1;
        }
    }
}

static inline void dq_q5_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        int s0, m0, s1, m1;
        k_scale_min(sc, 2 * c, &s0, &m0);
        k_scale_min(sc, 2 * c + 1, &s1, &m1);
        float d0 = d * (float)s0, n0 = dmin * (float)m0;
        float d1 = d * (float)s1, n1 = dmin * (float)m1;
        const uint8_t *q = qs + 32 * c;
        for (int l = 0; l < 32; l++) {
            int lo = (q[l] & 15) | ((qh[l] >> (2 * c)) & 1) << 4;
            int hi = (q[l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
            y[64 * c + l] = d0 * (float)lo - n0;
            y[64 * c + 32 + l] = d1 * (float)hi - n1;
        }
    }
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

/* The body of a row dequantiser over nb blocks; compiled twice (portable, AVX2). */
#define DEQUANT_BODY                                                                               \
    switch (t) {                                                                                   \
    case KV_DT_F32:                                                                                \
        memcpy(dst, p, (size_t)n * 4);                                                             \
        break;                                                                                     \
    case KV_DT_F16:                                                                                \
        DEQUANT_F16;                                                                               \
        break;                                                                                     \
    case KV_DT_BF16:                                                                               \
        for (size_t i = 0; i < (size_t)n; i++) dst[i] = kv_bf16_to_f32(kv_load_u16le(p + 2 * i));  \
        break;                                                                                     \
    case KV_DT_Q8_0:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q8_0(p + i * 34, dst + i * QK);                         \
        break;                                                                                     \
    case KV_DT_Q4_0:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q4_0(p + i * 18, dst + i * QK);                         \
        break;                                                                                     \
    case KV_DT_Q4_1:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q4_1(p + i * 20, dst + i * QK);                         \
        break;                                                                                     \
    case KV_DT_Q5_0:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q5_0(p + i * 22, dst + i * QK);                         \
        break;                                                                                     \
    case KV_DT_Q5_1:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q5_1(p + i * 24, dst + i * QK);                         \
        break;                                                                                     \
    case KV_DT_Q4_K:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q4_k(p + i * 144, dst + i * QKK);                       \
        break;                                                                                     \
    case KV_DT_Q5_K:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q5_k(p + i * 176, dst + i * QKK);                       \
        break;                                                                                     \
    case KV_DT_Q6_K:                                                                               \
        for (size_t i = 0; i < nb; i++) dq_q6_k(p + i * 210, dst + i * QKK);                       \
        break;                                                                                     \
    }

#define DEQUANT_F16                                                                                \
    for (size_t i = 0; i < (size_t)n; i++) dst[i] = kv_f16_to_f32(kv_load_u16le(p + 2 * i))
static void dequant_portable(kv_dtype t, const uint8_t *p, float *dst, int64_t n, size_t nb) {
    DEQUANT_BODY
}
#undef DEQUANT_F16

#ifdef KV_QUANT_X86
#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))
/* F16 by the F16C instruction, 8 at a time */
#define DEQUANT_F16                                                                                \
    do {                                                                                           \
        size_t i = 0;                                                                              \
        for (; i + 8 <= (size_t)n; i += 8)                                                         \
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(                             \
                                          (const __m128i *)(const void *)(p + 2 * i))));           \
        for (; i < (size_t)n; i++) dst[i] = kv_f16_to_f32(kv_load_u16le(p + 2 * i));               \
    } while (0)
KV_AVX2 static void dequant_avx2(kv_dtype t, const uint8_t *p, float *dst, int64_t n, size_t nb) {
    DEQUANT_BODY
}
#undef DEQUANT_F16

/* AVX2, FMA and F16C (kv_isa_available, runtime/quant/quant_dot.c: no CPUID per call). */
static int have_avx2(void) {
    return kv_isa_available(KV_ISA_AVX2);
}
#endif

int kv_dequantize_row(kv_dtype t, const void *src, float *dst, int64_t n, kv_error *err) {
    size_t bytes;
    if (kv_dtype_row_bytes(t, n, "dequantize", &bytes, err)) return KV_EINPUT;
    size_t nb = (size_t)(n / kv_dtype_block(t));
#ifdef KV_QUANT_X86
    if (have_avx2()) {
        dequant_avx2(t, src, dst, n, nb);
        return KV_OK;
    }
#endif
    dequant_portable(t, src, dst, n, nb);
    return KV_OK;
}

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

/* Type-0 with 2^(bits-1) negative levels: the largest-magnitude element maps to level 0 (value
 * -2^(bits-1) * d), so d = -max / 2^(bits-1) (the same choice as ggml's reference). */
static void qz_type0(const float *x, uint8_t *b, int bits) {
    int half = 1 << (bits - 1), top = (1 << bits) - 1;
    float d = put_h(b, signed_absmax(x, QK) / (float)-half), id = d != 0 ? 1.0f / d : 0.0f;
    int q[QK];
    for (int j = 0; j < QK; j++) q[j] = clampi((int)lrintf(x[j] * id) + half, 0, top);
    uint8_t *qs = b + (bits == 4 ? 2 : 6);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + QK / 2] & 15) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + QK / 2] >> 4) << (j + 16);
    }
    if (bits == 5)
        for (int k = 0; k < 4; k++) b[2 + k] = (uint8_t)(qh >> (8 * k));
}

/* Type-1: x = d * q + m with m the block minimum and d = (max - min) / (2^bits - 1). */
static void qz_type1(const float *x, uint8_t *b, int bits) {
    int top = (1 << bits) - 1;
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
    float d = put_h(b, (mx - mn) / (float)top), m = put_h(b + 2, mn);
    float id = d > 0 ? 1.0f / d : 0.0f;
    int q[QK];
    for (int j = 0; j < QK; j++) q[j] = clampi((int)lrintf((x[j] - m) * id), 0, top);
    uint8_t *qs = b + (bits == 4 ? 4 : 8);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + QK / 2] & 15) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + QK / 2] >> 4) << (j + 16);
    }
    if (bits == 5)
        for (int k = 0; k < 4; k++) b[4 + k] = (uint8_t)(qh >> (8 * k));
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

int kv_quantize_row(kv_dtype t, const float *src, void *dst, int64_t n, kv_error *err) {
    size_t bytes;
    if (kv_dtype_row_bytes(t, n, "quantize", &bytes, err)) return KV_EINPUT;
    uint8_t *p = dst;
    size_t nb = (size_t)(n / kv_dtype_block(t)), bb = kv_dtype_block_bytes(t);
    int qk = kv_dtype_block(t);
    for (size_t i = 0; i < nb; i++) {
        const float *x = src + i * (size_t)qk;
        uint8_t *b = p + i * bb;
        switch (t) {
        case KV_DT_F32:
            memcpy(b, x, 4);
            break;
        case KV_DT_F16:
            put_u16(b, f2h(*x));
            break;
        case KV_DT_BF16:
            put_u16(b, f2bf(*x));
            break;
        case KV_DT_Q8_0:
            qz_q8_0(x, b);
            break;
        case KV_DT_Q4_0:
            qz_type0(x, b, 4);
            break;
        case KV_DT_Q5_0:
            qz_type0(x, b, 5);
            break;
        case KV_DT_Q4_1:
            qz_type1(x, b, 4);
            break;
        case KV_DT_Q5_1:
            qz_type1(x, b, 5);
            break;
        case KV_DT_Q4_K:
            qz_qk_type1(x, b, 4);
            break;
        case KV_DT_Q5_K:
            qz_qk_type1(x, b, 5);
            break;
        case KV_DT_Q6_K:
            qz_q6_k(x, b);
            break;
        }
    }
    return KV_OK;
}

/* ---- dot products, generic C ---- */

/* sum a[i] * b[i] for n a multiple of 8, in eight partial sums (vectorisable without
 * reassociation flags). */
static inline float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

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

#define BLOCK_DOT_GENERIC(name, dq, qk, bb)                                                        \
    static float name(const uint8_t *w, const float *x, int64_t n) {                               \
        float buf[qk], s = 0;                                                                      \
        for (int64_t i = 0; i < n / (qk); i++) {                                                   \
            dq(w + (size_t)i * (bb), buf);                                                         \
            s += dot_f32(buf, x + i * (qk), qk);                                                   \
        }                                                                                          \
        return s;                                                                                  \
    }
BLOCK_DOT_GENERIC(dot_q8_0_g, dq_q8_0, QK, 34)
BLOCK_DOT_GENERIC(dot_q4_0_g, dq_q4_0, QK, 18)
BLOCK_DOT_GENERIC(dot_q4_1_g, dq_q4_1, QK, 20)
BLOCK_DOT_GENERIC(dot_q5_0_g, dq_q5_0, QK, 22)
BLOCK_DOT_GENERIC(dot_q5_1_g, dq_q5_1, QK, 24)
BLOCK_DOT_GENERIC(dot_q4_k_g, dq_q4_k, QKK, 144)
BLOCK_DOT_GENERIC(dot_q5_k_g, dq_q5_k, QKK, 176)
BLOCK_DOT_GENERIC(dot_q6_k_g, dq_q6_k, QKK, 210)

static float dot_f32_g(const uint8_t *w, const float *x, int64_t n) {
    return cblas_sdot((int)n, (const float *)(const void *)w, 1, x, 1);
}
static float dot_f16_g(const uint8_t *w, const float *x, int64_t n) {
    return dot_half_generic(w, x, n, 0);
}
static float dot_bf16_g(const uint8_t *w, const float *x, int64_t n) {
    return dot_half_generic(w, x, n, 1);
}

typedef float (*dot_fn)(const uint8_t *w, const float *x, int64_t n);

static dot_fn generic_dot(kv_dtype t) {
    switch (t) {
    case KV_DT_F32:
        return dot_f32_g;
    case KV_DT_F16:
        return dot_f16_g;
    case KV_DT_BF16:
        return dot_bf16_g;
    case KV_DT_Q8_0:
        return dot_q8_0_g;
    case KV_DT_Q4_0:
        return dot_q4_0_g;
    case KV_DT_Q4_1:
        return dot_q4_1_g;
    case KV_DT_Q5_0:
        return dot_q5_0_g;
    case KV_DT_Q5_1:
        return dot_q5_1_g;
    case KV_DT_Q4_K:
        return dot_q4_k_g;
    case KV_DT_Q5_K:
        return dot_q5_k_g;
    case KV_DT_Q6_K:
        return dot_q6_k_g;
    }
    return NULL;
}

/* ---- dot products, AVX2 + FMA + F16C ---- */
#ifdef KV_QUANT_X86
KV_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KV_AVX2 static float dot_f16_avx2(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * i)));
        __m256 w1 =
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * i + 16)));
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += kv_f16_to_f32(kv_load_u16le(w + 2 * i)) * x[i];
    return s;
}

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
        float s = hsum8(_mm256_add_ps(a0, a1));
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
        float s0 = hsum8(_mm256_add_ps(a00, a01)), s1 = hsum8(_mm256_add_ps(a10, a11));
        float s2 = hsum8(_mm256_add_ps(a20, a21)), s3 = hsum8(_mm256_add_ps(a30, a31));
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
        float s0 = hsum8(_mm256_add_ps(a00, a01));                                                 \
        for (; i < n; i++) s0 += SCALAR(r0, i) * x[i];                                             \
        y[o] = s0;                                                                                 \
    }
#define GEMV_SCALAR_F16(r, i) kv_f16_to_f32(kv_load_u16le((r) + 2 * (i)))

KV_AVX2 static void gemv_f16_avx2(const uint8_t *W, size_t rb, const float *x, int64_t n, int o0,
                                  int o1, float *y){GEMV_BODY(GEMV_LOAD_F16, 2, GEMV_SCALAR_F16)}

KV_AVX2 static inline __m256 bf16x8(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

KV_AVX2 static float dot_bf16_avx2(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(bf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += kv_bf16_to_f32(kv_load_u16le(w + 2 * i)) * x[i];
    return s;
}

/* 8 int8 at p as floats */
KV_AVX2 static inline __m256 i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

KV_AVX2 static float dot_q8_0_avx2(const uint8_t *w, const float *x, int64_t n) {
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
    return hsum8(acc);
}

/* 16 unsigned nibbles (low or high halves of 8 bytes) as floats, twice: bytes p[0..8) */
KV_AVX2 static inline __m256 u8x8(__m128i bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/* Q4_0: x = d * (nib - 8); sum = d * (sum nib * x - 8 * sum x). */
KV_AVX2 static float dot_q4_0_avx2(const uint8_t *w, const float *x, int64_t n) {
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
    return hsum8(acc);
}

/* Q4_K: per sub-block s, sum = d*sc[s] * sum(nib * x) - dmin*m[s] * sum(x). */
KV_AVX2 static float dot_q4_k_avx2(const uint8_t *w, const float *x, int64_t n) {
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
    return hsum8(acc);
}

/* The other block types: the generic decoder (compiled here for AVX2) into a stack buffer,
 * then FMA with x. */
#define BLOCK_DOT_AVX2(name, dq, qk, bb)                                                           \
    KV_AVX2 static float name(const uint8_t *w, const float *x, int64_t n) {                       \
        float buf[qk];                                                                             \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                 \
        for (int64_t i = 0; i < n / (qk); i++) {                                                   \
            dq(w + (size_t)i * (bb), buf);                                                         \
            const float *xb = x + i * (qk);                                                        \
            for (int j = 0; j < (qk); j += 16) {                                                   \
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j), _mm256_loadu_ps(xb + j), a0);       \
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(buf + j + 8), _mm256_loadu_ps(xb + j + 8),    \
                                     a1);                                                          \
            }                                                                                      \
        }                                                                                          \
        return hsum8(_mm256_add_ps(a0, a1));                                                       \
    }
BLOCK_DOT_AVX2(dot_q4_1_avx2, dq_q4_1, QK, 20)
BLOCK_DOT_AVX2(dot_q5_0_avx2, dq_q5_0, QK, 22)
BLOCK_DOT_AVX2(dot_q5_1_avx2, dq_q5_1, QK, 24)
BLOCK_DOT_AVX2(dot_q5_k_avx2, dq_q5_k, QKK, 176)
BLOCK_DOT_AVX2(dot_q6_k_avx2, dq_q6_k, QKK, 210)

static dot_fn avx2_dot(kv_dtype t) {
    switch (t) {
    case KV_DT_F16:
        return dot_f16_avx2;
    case KV_DT_BF16:
        return dot_bf16_avx2;
    case KV_DT_Q8_0:
        return dot_q8_0_avx2;
    case KV_DT_Q4_0:
        return dot_q4_0_avx2;
    case KV_DT_Q4_1:
        return dot_q4_1_avx2;
    case KV_DT_Q5_0:
        return dot_q5_0_avx2;
    case KV_DT_Q5_1:
        return dot_q5_1_avx2;
    case KV_DT_Q4_K:
        return dot_q4_k_avx2;
    case KV_DT_Q5_K:
        return dot_q5_k_avx2;
    case KV_DT_Q6_K:
        return dot_q6_k_avx2;
    case KV_DT_F32:
        break;
    }
    return generic_dot(t);
}
#endif

static dot_fn pick_dot(kv_dtype t) {
#ifdef KV_QUANT_X86
    if (have_avx2()) return avx2_dot(t);
#endif
    return generic_dot(t);
}

float kv_dot_row(kv_dtype t, const void *w, const float *x, int64_t n) {
    dot_fn f = pick_dot(t);
    return f ? f(w, x, n) : 0.0f;
}

float kv_dot_row_portable(kv_dtype t, const void *w, const float *x, int64_t n) {
    dot_fn f = generic_dot(t);
    return f ? f(w, x, n) : 0.0f;
}

/* ---- typed matmul ---- */

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
    dot_fn dot; /* MM_DOT */
    int avx2;   /* the AVX2 GEMVs of F32 and F16 */
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
    if (j.path == MM_DOT) j.dot = pick_dot(wt);
#ifdef KV_QUANT_X86
    j.avx2 = have_avx2();
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
