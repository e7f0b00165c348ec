/* Integer dot products of quantised weight rows with 8-bit activation rows; the
 * layouts and the fixed floating-point order are described in quant_dot.h. Three kernel sets:
 * portable C (any CPU; the reference the others must equal bit for bit), AVX2 (maddubs +
 * madd, as ggml-cpu's x86 kernels) and AVX-512 VNNI on 256-bit vectors (vpdpbusd in place of
 * maddubs + madd for the 32-element types), chosen at run time from CPUID. */
#include "quant/quant_dot.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant_kernels.h"
#include "util/f16.h"

#ifdef __clang__
#pragma clang fp contract(off)
#endif

#ifdef KV_QK_X86
#define KV_QD_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define KV_QD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KV_QD_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#endif

#define QA 32   /* elements per activation block, layout A */
#define QKB 256 /* elements per activation block, layout K */

static inline float h2f(const uint8_t *p) {
    return kv_f16_to_f32(kv_load_u16le(p));
}

/* ---- ISA ---- */

#ifdef KV_QD_X86
/* F16C. GCC's __builtin_cpu_supports reads the features libgcc found at start-up (no CPUID
 * per call: in a virtual machine a CPUID traps to the hypervisor, ~20 us measured here, and
 * kv_dequantize_row asked once per row); clang's does not know "f16c", so clang builds ask
 * CPUID (leaf 1, ECX bit 29). */
static int have_f16c(void) {
#ifdef __clang__
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
#else
    return __builtin_cpu_supports("f16c");
#endif
}
#endif

int kv_isa_available(kv_isa isa) {
    switch (isa) {
    case KV_ISA_PORTABLE:
        return 1;
#ifdef KV_QD_X86
    case KV_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && have_f16c();
    case KV_ISA_AVX512_VNNI:
        return kv_isa_available(KV_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
#else
    case KV_ISA_AVX2:
    case KV_ISA_AVX512_VNNI:
        return 0;
#endif
    }
    return 0;
}

kv_isa kv_isa_best(void) {
    if (kv_isa_available(KV_ISA_AVX512_VNNI)) return KV_ISA_AVX512_VNNI;
    if (kv_isa_available(KV_ISA_AVX2)) return KV_ISA_AVX2;
    return KV_ISA_PORTABLE;
}

const char *kv_isa_name(kv_isa isa) {
    switch (isa) {
    case KV_ISA_PORTABLE:
        return "portable";
    case KV_ISA_AVX2:
        return "avx2";
    case KV_ISA_AVX512_VNNI:
        return "avx512-vnni";
    }
    return "unknown";
}

/* ---- activation rows ---- */

int kv_qdot_act_kind(kv_dtype t) {
    return kv_qblock_get(t).act;
}

static size_t up64(size_t v) {
    return (v + 63) / 64 * 64;
}

/* Offsets of d and s in an activation row of n elements. */
static size_t act_d_off(int n) {
    return up64((size_t)n);
}
static size_t act_s_off(int kind, int n) {
    return act_d_off(n) + (size_t)(n / (kind == 'A' ? QA : QKB)) * sizeof(float);
}

size_t kv_qdot_act_bytes(kv_dtype t, int n) {
    int kind = kv_qdot_act_kind(t);
    if (!kind || n <= 0) return 0;
    size_t s = kind == 'A' ? (size_t)(n / QA) * sizeof(int32_t) : (size_t)(n / 16) * 2;
    return up64(act_s_off(kind, n) + s);
}

/* q = round-to-nearest-even(x * id) in [-127, 127] (NaN and overflow clamp; finite inputs
 * never reach the clamp except by rounding at +-127.5). */
static inline int q8(float x, float id) {
    float v = nearbyintf(x * id);
    return v >= 127.0f ? 127 : v <= -127.0f ? -127 : (int)v;
}

/* One block of m elements: d = max|x| / 127, q into q[], returns sum q. (NaN x: ignored by the
 * maximum, q 0 from the clamp's conversion on x86; as fmaxf / the cast did.) */
static int quant_block(const float *x, int m, int8_t *q, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < m; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
    int s = 0;
    for (int j = 0; j < m; j++) {
        q[j] = (int8_t)q8(x[j], id);
        s += q[j];
    }
    *d = dd;
    return s;
}

static void quantize_act_c(kv_dtype t, const float *x, int n, void *act) {
    int kind = kv_qdot_act_kind(t);
    uint8_t *base = act;
    int8_t *q = act;
    if (kind == 'A') {
        for (int b = 0; b < n / QA; b++) {
            float d;
            int32_t s = quant_block(x + (size_t)b * QA, QA, q + (size_t)b * QA, &d);
            memcpy(base + act_d_off(n) + 4 * (size_t)b, &d, 4);
            memcpy(base + act_s_off(kind, n) + 4 * (size_t)b, &s, 4);
        }
    } else if (kind == 'K') {
        for (int b = 0; b < n / QKB; b++) {
            float d;
            quant_block(x + (size_t)b * QKB, QKB, q + (size_t)b * QKB, &d);
            memcpy(base + act_d_off(n) + 4 * (size_t)b, &d, 4);
            for (int g = 0; g < 16; g++) {
                int16_t s = 0;
                for (int j = 0; j < 16; j++) s = (int16_t)(s + q[(size_t)b * QKB + 16 * g + j]);
                memcpy(base + act_s_off(kind, n) + 2 * ((size_t)b * 16 + (size_t)g), &s, 2);
            }
        }
    }
}

/* Views of an activation row (the buffer is 64-byte aligned when the caller's is). */
typedef struct act_view {
    const int8_t *q;
    const float *d;
    const int32_t *s;   /* layout A */
    const int16_t *s16; /* layout K */
} act_view;

static act_view act_of(int kind, const void *act, int n) {
    const uint8_t *b = act;
    act_view v = {(const int8_t *)act, (const float *)(const void *)(b + act_d_off(n)), NULL, NULL};
    if (kind == 'A')
        v.s = (const int32_t *)(const void *)(b + act_s_off(kind, n));
    else
        v.s16 = (const int16_t *)(const void *)(b + act_s_off(kind, n));
    return v;
}

static inline float fin8(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* ---- the 32-element types: weight block layout per type ---- */

/* Block bytes, offset of qs, of qh (5-bit types), whether a min m follows d, the constant
 * subtracted from q (8, 16 or 0): the type's row of quant_types.h in one value for the kernels. */
typedef struct t32 {
    int bytes, qs, qh, has_m, off, sgn;
} t32;

static inline t32 t32_of(kv_dtype t) {
    kv_qblock b = kv_qblock_get(t);
    return (t32){b.bytes, b.qs, b.qh, b.has_min, b.zero, b.sgn};
}

static inline uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The float contribution of one block (quant_dot.h). */
static inline float f32blk(const uint8_t *b, int has_m, float dx, int32_t isum, int32_t s) {
    float f = (h2f(b) * dx) * (float)isum;
    if (has_m) f = f + h2f(b + 2) * (dx * (float)s);
    return f;
}

/* Exact integer dot of block b of type t with 32 activation values. */
static inline int32_t i32blk_c(kv_dtype t, const uint8_t *b, const int8_t *x, int32_t s) {
    t32 L = t32_of(t);
    int32_t isum = 0;
    if (L.sgn) { /* Q8_0: signed codes */
        const int8_t *w = (const int8_t *)(b + L.qs);
        for (int j = 0; j < QA; j++) isum += (int32_t)w[j] * x[j];
        return isum;
    }
    const uint8_t *qs = b + L.qs;
    uint32_t qh = L.qh ? ld32(b + L.qh) : 0;
    for (int j = 0; j < QA / 2; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        isum += lo * x[j] + hi * x[j + 16];
    }
    return isum - L.off * s;
}

static inline __attribute__((always_inline)) float dot32_c(kv_dtype t, const uint8_t *w,
                                                           const void *act, int n) {
    t32 L = t32_of(t);
    act_view a = act_of('A', act, n);
    float acc[8] = {0};
    for (int b = 0; b < n / QA; b++) {
        const uint8_t *blk = w + (size_t)b * L.bytes;
        int32_t isum = i32blk_c(t, blk, a.q + (size_t)b * QA, a.s[b]);
        acc[b & 7] = acc[b & 7] + f32blk(blk, L.has_m, a.d[b], isum, a.s[b]);
    }
    return fin8(acc);
}

/* ---- the K-quants ---- */

static inline void k_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* Im = sum_sub m[s] * (sum of the sub-block's activation q), from the per-16 sums. */
static inline int32_t k_mins(const uint8_t *sc, const int16_t *s16, int *scl) {
    int32_t Im = 0;
    for (int s = 0; s < 8; s++) {
        int m;
        k_scale_min(sc, s, &scl[s], &m);
        Im += m * ((int32_t)s16[2 * s] + s16[2 * s + 1]);
    }
    return Im;
}

static inline float k_finish(float dx, float d, float dmin, int32_t Isc, int32_t Im) {
    return (dx * d) * (float)Isc - (dx * dmin) * (float)Im;
}

/* Q4_K (bits 4, block 144 bytes) and Q5_K (bits 5, 176 bytes). */
static inline __attribute__((always_inline)) float dotk45_c(int bits, const uint8_t *w,
                                                            const void *act, int n) {
    act_view a = act_of('K', act, n);
    int bb = bits == 4 ? 144 : 176;
    float acc[8] = {0};
    for (int b = 0; b < n / QKB; b++) {
        const uint8_t *blk = w + (size_t)b * bb, *qh = blk + 16;
        const uint8_t *qs = blk + (bits == 4 ? 16 : 48);
        const int8_t *x = a.q + (size_t)b * QKB;
        int sc[8];
        int32_t Im = k_mins(blk + 4, a.s16 + (size_t)b * 16, sc), Isc = 0;
        for (int c = 0; c < 4; c++) {
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                if (bits == 5) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                s0 += lo * x[64 * c + l];
                s1 += hi * x[64 * c + 32 + l];
            }
            Isc += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
        }
        acc[b & 7] = acc[b & 7] + k_finish(a.d[b], h2f(blk), h2f(blk + 2), Isc, Im);
    }
    return fin8(acc);
}

/* Q6_K's integer sum for one super-block. */
static inline int32_t i6k_c(const uint8_t *blk, const int8_t *x, const int16_t *s16) {
    const int8_t *sc = (const int8_t *)(blk + 192);
    int32_t isum = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        int32_t g[8] = {0}; /* sums per group of 16 in this half */
        for (int l = 0; l < 32; l++) {
            int q0 = (ql[l] & 15) | (qh[l] & 3) << 4;
            int q1 = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4;
            int q2 = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            int q3 = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
            const int8_t *xx = x + 128 * h + l;
            g[l / 16] += q0 * xx[0];
            g[2 + l / 16] += q1 * xx[32];
            g[4 + l / 16] += q2 * xx[64];
            g[6 + l / 16] += q3 * xx[96];
        }
        for (int k = 0; k < 8; k++) isum += sc[8 * h + k] * (g[k] - 32 * s16[8 * h + k]);
    }
    return isum;
}

float kv_qk_qdot_c_Q6_K(const uint8_t *w, const void *act, int n) {
    act_view a = act_of('K', act, n);
    float acc[8] = {0};
    for (int b = 0; b < n / QKB; b++) {
        const uint8_t *blk = w + (size_t)b * 210;
        int32_t isum = i6k_c(blk, a.q + (size_t)b * QKB, a.s16 + (size_t)b * 16);
        acc[b & 7] = acc[b & 7] + (a.d[b] * h2f(blk + 208)) * (float)isum;
    }
    return fin8(acc);
}

float kv_qk_qdot_c_Q8_0(const uint8_t *w, const void *a, int n) {
    return dot32_c(KV_DT_Q8_0, w, a, n);
}
float kv_qk_qdot_c_Q4_0(const uint8_t *w, const void *a, int n) {
    return dot32_c(KV_DT_Q4_0, w, a, n);
}
float kv_qk_qdot_c_Q4_1(const uint8_t *w, const void *a, int n) {
    return dot32_c(KV_DT_Q4_1, w, a, n);
}
float kv_qk_qdot_c_Q5_0(const uint8_t *w, const void *a, int n) {
    return dot32_c(KV_DT_Q5_0, w, a, n);
}
float kv_qk_qdot_c_Q5_1(const uint8_t *w, const void *a, int n) {
    return dot32_c(KV_DT_Q5_1, w, a, n);
}
float kv_qk_qdot_c_Q4_K(const uint8_t *w, const void *a, int n) {
    return dotk45_c(4, w, a, n);
}
float kv_qk_qdot_c_Q5_K(const uint8_t *w, const void *a, int n) {
    return dotk45_c(5, w, a, n);
}

/* ---- AVX2 and AVX-512 VNNI ---- */
#ifdef KV_QD_X86

/* The 32 weights of block b (type t) in element order as bytes: signed for Q8_0, unsigned
 * (0..31) for the others. */
#define W32_BODY                                                                                   \
    t32 L = t32_of(t);                                                                             \
    if (L.sgn) return _mm256_loadu_si256((const __m256i *)(const void *)(b + L.qs));               \
    __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(b + L.qs));                       \
    __m256i v =                                                                                    \
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(15));       \
    if (L.qh) { /* byte j takes bit j of qh as its bit 4 */                                        \
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2,   \
                                              2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);        \
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);                  \
        __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32((int)ld32(b + L.qh)), pick);           \
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);                          \
        v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));                       \
    }                                                                                              \
    return v;

/* 8 int32 lanes whose sum is the exact integer dot of the block (before the offset term). */
#define BLK_AVX2                                                                                   \
    __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)xq);                             \
    __m256i w = w32(t, b);                                                                         \
    if (t32_of(t).sgn) { /* signed codes: |w| times x with w's sign */                             \
        x = _mm256_sign_epi8(x, w);                                                                \
        w = _mm256_abs_epi8(w);                                                                    \
    }

KV_QD_AVX2 static inline __attribute__((always_inline)) __m256i w32(kv_dtype t,
                                                                    const uint8_t *b){W32_BODY}

KV_QD_AVX2 static inline __attribute__((always_inline)) __m256i
    blk_avx2(kv_dtype t, const uint8_t *b, const int8_t *xq) {
    BLK_AVX2
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

KV_QD_VNNI static inline __attribute__((always_inline)) __m256i
blk_vnni(kv_dtype t, const uint8_t *b, const int8_t *xq) {
    BLK_AVX2
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
}

/* Lane k of the result: the sum of the 8 lanes of v[k]. */
KV_QD_AVX2 static inline __attribute__((always_inline)) __m256i sum8x8(const __m256i *v) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), c = _mm256_hadd_epi32(h45, h67);
    __m128i lo = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i hi = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    return _mm256_set_m128i(hi, lo);
}

KV_QD_AVX2 static inline __attribute__((always_inline)) int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* The f16 at p, p + stride, ..., p + 7 stride as one vector (inserts, not 8 stores and a
 * wider load, which stalls store-to-load forwarding). */
KV_QD_AVX2 static inline __attribute__((always_inline)) __m128i half8(const uint8_t *p, int st) {
    return _mm_setr_epi16((short)kv_load_u16le(p), (short)kv_load_u16le(p + st),
                          (short)kv_load_u16le(p + 2 * st), (short)kv_load_u16le(p + 3 * st),
                          (short)kv_load_u16le(p + 4 * st), (short)kv_load_u16le(p + 5 * st),
                          (short)kv_load_u16le(p + 6 * st), (short)kv_load_u16le(p + 7 * st));
}

/* Software prefetch of the weight stream: the `bytes` bytes at p + KV_QD_PREFETCH. The
 * decode GEMV reads each weight once, row after row; the hardware prefetchers alone left the
 * 4-bit kernels ~25% below their in-cache speed on this Zen 4 VM (Q4_0, 92 MB of rows: 11.9
 * GB/s without, 16.1 with 4 KiB ahead, 15.1 with 8 KiB, 13.5 with 16 KiB). Prefetches never
 * fault, so reading past the matrix is harmless, and they change no result. */
#define KV_QD_PREFETCH 4096
KV_QD_AVX2 static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *p,
                                                                            int bytes) {
    for (int o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)(p + KV_QD_PREFETCH + o), _MM_HINT_T0);
}

/* The 32-element types: 8 blocks at a time, lane k of the accumulator taking block 8g + k;
 * the last partial group lane by lane in scalar code (the same operations). */
#define DOT32_BODY(BLK)                                                                            \
    t32 L = t32_of(t);                                                                             \
    act_view a = act_of('A', act, n);                                                              \
    int nb = n / QA, b = 0;                                                                        \
    __m256 acc = _mm256_setzero_ps();                                                              \
    for (; b + 8 <= nb; b += 8) {                                                                  \
        __m256i v[8];                                                                              \
        prefetch_ahead(w + (size_t)b * L.bytes, 8 * L.bytes);                                      \
        for (int k = 0; k < 8; k++)                                                                \
            v[k] = BLK(t, w + (size_t)(b + k) * L.bytes, a.q + (size_t)(b + k) * QA);              \
        __m256i isum = sum8x8(v);                                                                  \
        __m256i S = _mm256_loadu_si256((const __m256i *)(const void *)(a.s + b));                  \
        if (L.off) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(S, L.off == 8 ? 3 : 4));        \
        __m256 dx = _mm256_loadu_ps(a.d + b);                                                      \
        __m256 dw = _mm256_cvtph_ps(half8(w + (size_t)b * L.bytes, L.bytes));                      \
        __m256 f = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));                 \
        if (L.has_m) {                                                                             \
            __m256 m = _mm256_cvtph_ps(half8(w + (size_t)b * L.bytes + 2, L.bytes));               \
            f = _mm256_add_ps(f, _mm256_mul_ps(m, _mm256_mul_ps(dx, _mm256_cvtepi32_ps(S))));      \
        }                                                                                          \
        acc = _mm256_add_ps(acc, f);                                                               \
    }                                                                                              \
    float lane[8];                                                                                 \
    _mm256_storeu_ps(lane, acc);                                                                   \
    for (; b < nb; b++) {                                                                          \
        const uint8_t *blk = w + (size_t)b * L.bytes;                                              \
        int32_t isum = hsum_i32(BLK(t, blk, a.q + (size_t)b * QA)) - L.off * a.s[b];               \
        lane[b & 7] = lane[b & 7] + f32blk(blk, L.has_m, a.d[b], isum, a.s[b]);                    \
    }                                                                                              \
    return fin8(lane);

KV_QD_AVX2 static inline __attribute__((always_inline)) float
dot32_avx2(kv_dtype t, const uint8_t *w, const void *act, int n){DOT32_BODY(blk_avx2)}

KV_QD_VNNI static inline
    __attribute__((always_inline)) float dot32_vnni(kv_dtype t, const uint8_t *w, const void *act,
                                                    int n) {
    DOT32_BODY(blk_vnni)
}

/* The 32-element types' kernels: the bodies above with the type a constant (its facts fold). */
#define DOT32_FN(name, attr, body, T)                                                              \
    attr float name(const uint8_t *w, const void *a, int n) {                                      \
        return body(T, w, a, n);                                                                   \
    }
/* clang-format off */
DOT32_FN(kv_qk_qdot_avx2_Q8_0, KV_QD_AVX2, dot32_avx2, KV_DT_Q8_0)
DOT32_FN(kv_qk_qdot_avx2_Q4_0, KV_QD_AVX2, dot32_avx2, KV_DT_Q4_0)
DOT32_FN(kv_qk_qdot_avx2_Q4_1, KV_QD_AVX2, dot32_avx2, KV_DT_Q4_1)
DOT32_FN(kv_qk_qdot_avx2_Q5_0, KV_QD_AVX2, dot32_avx2, KV_DT_Q5_0)
DOT32_FN(kv_qk_qdot_avx2_Q5_1, KV_QD_AVX2, dot32_avx2, KV_DT_Q5_1)
DOT32_FN(kv_qk_qdot_vnni_Q8_0, KV_QD_VNNI, dot32_vnni, KV_DT_Q8_0)
DOT32_FN(kv_qk_qdot_vnni_Q4_1, KV_QD_VNNI, dot32_vnni, KV_DT_Q4_1)
DOT32_FN(kv_qk_qdot_vnni_Q5_0, KV_QD_VNNI, dot32_vnni, KV_DT_Q5_0)
DOT32_FN(kv_qk_qdot_vnni_Q5_1, KV_QD_VNNI, dot32_vnni, KV_DT_Q5_1)
/* clang-format on */

/* Q4_0 on AVX-512 VNNI, the decode kernel of the most downloaded 4-bit type: the same
 * integers and float operations as dot32_vnni (so the same bits), with fewer shuffles,
 * which bound that loop on AMD Zen 4 (two shuffle/shift pipes):
 * - a block's 16 bytes are broadcast to both halves of a vector and masked with 0x0f
 *   (low half: elements 0-15) and 0xf0 (high half: 16 x elements 16-31) instead of
 *   shifted and inserted; vpdpbusd sums u8 x s8 in int32 without saturation (4 x 240 x 127
 *   per lane), so the high half's sum is exactly 16 times the true one and an arithmetic
 *   shift by 4 after the horizontal sums restores it;
 * - the eight f16 scales of a group of 8 blocks (18 bytes each, so at 16-bit word offsets
 *   0, 9, ..., 63 of the group's first 128 bytes) come out of one vpermt2w. */
KV_QD_VNNI float kv_qk_qdot_vnni_Q4_0(const uint8_t *w, const void *act, int n) {
    const t32 L = t32_of(KV_DT_Q4_0); /* 18-byte blocks, qs at 2, zero point 8 */
    act_view a = act_of('A', act, n);
    int nb = n / QA, b = 0;
    const __m256i mask = _mm256_set_m128i(_mm_set1_epi8((char)0xf0), _mm_set1_epi8(0x0f));
    const __m512i sidx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, 0, 0, 0, 63, 54, 45, 36, 27, 18, 9, 0);
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const uint8_t *g = w + (size_t)b * L.bytes;
        const int8_t *xq = a.q + (size_t)b * QA;
        __m256i v[8];
        prefetch_ahead(g, 8 * L.bytes);
        for (int k = 0; k < 8; k++) {
            __m256i q = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(const void *)(g + L.bytes * k + L.qs)));
            __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(xq + QA * k));
            v[k] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_and_si256(q, mask), x);
        }
        /* per 128-bit half: lane k of A (blocks 0-3) and C (blocks 4-7) sums block k's half */
        __m256i A = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        __m256i C = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        __m256i lo = _mm256_permute2x128_si256(A, C, 0x20),
                hi = _mm256_permute2x128_si256(A, C, 0x31);
        __m256i isum = _mm256_add_epi32(lo, _mm256_srai_epi32(hi, 4));
        __m256i S = _mm256_loadu_si256((const __m256i *)(const void *)(a.s + b));
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(S, L.off == 8 ? 3 : 4)); /* as DOT32_BODY */
        __m512i sc = _mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)g), sidx,
                                               _mm512_loadu_si512((const void *)(g + 64)));
        __m256 dx = _mm256_loadu_ps(a.d + b);
        __m256 dw = _mm256_cvtph_ps(_mm512_castsi512_si128(sc));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum)));
    }
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * L.bytes;
        int32_t isum = hsum_i32(blk_vnni(KV_DT_Q4_0, blk, a.q + (size_t)b * QA)) - L.off * a.s[b];
        lane[b & 7] = lane[b & 7] + f32blk(blk, L.has_m, a.d[b], isum, a.s[b]);
    }
    return fin8(lane);
}

/* Q4_K / Q5_K: per 64 elements (sub-blocks 2c, 2c + 1), maddubs of the nibbles (plus bit 4)
 * with the activations, madd with the 6-bit scales; the mins from the per-16 sums. One
 * super-block's integer sums: Isc in 8 int32 lanes (their sum), Im in *Im. */
KV_QD_AVX2 static inline __attribute__((always_inline)) __m256i
k45_isum(int bits, const uint8_t *blk, const int8_t *x, const int16_t *s16, int32_t *Im) {
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const uint8_t *qs = blk + (bits == 4 ? 16 : 48);
    /* the 8 scales and 8 mins as bytes (k_scale_min on 32-bit words), built in registers (two
     * 32-bit stores read back as one 64-bit load would miss store-to-load forwarding) */
    uint32_t w0 = ld32(blk + 4), w1 = ld32(blk + 8), w2 = ld32(blk + 12);
    uint64_t sc8 = (uint64_t)(w0 & 0x3f3f3f3fu) |
                   (uint64_t)((w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4) << 32;
    uint64_t mn8 = (uint64_t)(w1 & 0x3f3f3f3fu) |
                   (uint64_t)(((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4) << 32;
    /* the 8 scales as int16 in both 128-bit lanes; scale k for all 16 lanes by one byte
     * shuffle (not a scalar broadcast per sub-block) */
    __m256i sc16 =
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
    /* Im: the mins, each twice (its two groups of 16), times the per-16 sums */
    __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
    __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)s16);
    __m128i s1 = _mm_loadu_si128((const __m128i *)(const void *)(s16 + 8));
    __m128i pm = _mm_add_epi32(_mm_madd_epi16(s0, _mm_unpacklo_epi16(mins, mins)),
                               _mm_madd_epi16(s1, _mm_unpackhi_epi16(mins, mins)));
    pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0x4e));
    pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0xb1));
    *Im = _mm_cvtsi128_si32(pm);
    __m256i qh = bits == 5 ? _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16))
                           : _mm256_setzero_si256();
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (bits == 5) {
            __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
            __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 64 * c));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 64 * c + 32));
        __m256i p0 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(lo, x0),
            _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(((4 * c + 1) << 8) | 4 * c))));
        __m256i p1 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, x1),
            _mm256_shuffle_epi8(sc16,
                                _mm256_set1_epi16((short)(((4 * c + 3) << 8) | (4 * c + 2)))));
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(p0, p1));
    }
    return sum;
}

/* Groups of 8 super-blocks, lane k of the accumulator taking super-block 8g + k (the lanes of
 * quant_dot.h's order): their Isc summed by sum8x8, d and dmin as vectors, k_finish's
 * expression lane by lane; the last partial group one super-block at a time (the same
 * operations in scalar form). */
KV_QD_AVX2 static inline __attribute__((always_inline)) float
dotk45_avx2(int bits, const uint8_t *w, const void *act, int n) {
    act_view a = act_of('K', act, n);
    int bb = bits == 4 ? 144 : 176, nsb = n / QKB, b = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nsb; b += 8) {
        const uint8_t *g = w + (size_t)b * bb;
        __m256i v[8];
        int32_t im[8];
        prefetch_ahead(g, 8 * bb);
        for (int k = 0; k < 8; k++)
            v[k] = k45_isum(bits, g + (size_t)k * bb, a.q + (size_t)(b + k) * QKB,
                            a.s16 + (size_t)(b + k) * 16, &im[k]);
        __m256i isc = sum8x8(v);
        __m256 dx = _mm256_loadu_ps(a.d + b);
        __m256 d = _mm256_cvtph_ps(half8(g, bb)), dmin = _mm256_cvtph_ps(half8(g + 2, bb));
        __m256 Im = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(const void *)im));
        acc = _mm256_add_ps(
            acc, _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(isc)),
                               _mm256_mul_ps(_mm256_mul_ps(dx, dmin), Im)));
    }
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (; b < nsb; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        int32_t Im;
        __m256i sum = k45_isum(bits, blk, a.q + (size_t)b * QKB, a.s16 + (size_t)b * 16, &Im);
        __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ld32(blk))); /* d, dmin */
        lane[b & 7] = lane[b & 7] + k_finish(a.d[b], _mm_cvtss_f32(dm),
                                             _mm_cvtss_f32(_mm_movehdup_ps(dm)), hsum_i32(sum), Im);
    }
    return fin8(lane);
}

KV_QD_AVX2 float kv_qk_qdot_avx2_Q4_K(const uint8_t *w, const void *a, int n) {
    return dotk45_avx2(4, w, a, n);
}
KV_QD_AVX2 float kv_qk_qdot_avx2_Q5_K(const uint8_t *w, const void *a, int n) {
    return dotk45_avx2(5, w, a, n);
}

/* Q6_K: the four 32-element quarters of each half as unsigned 6-bit bytes, maddubs with the
 * activations, madd with the int8 scales of their two groups of 16; minus 32 * the scaled
 * per-16 sums. */
KV_QD_AVX2 float kv_qk_qdot_avx2_Q6_K(const uint8_t *w, const void *act, int n) {
    act_view a = act_of('K', act, n);
    float lane[8] = {0};
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int b = 0; b < n / QKB; b++) {
        const uint8_t *blk = w + (size_t)b * 210;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const int16_t *s16 = a.s16 + (size_t)b * 16;
        const int8_t *x = a.q + (size_t)b * QKB;
        /* 32 * sum_g sc[g] s16[g], subtracted from the lanes before the one reduction */
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc));
        __m256i sum = _mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_slli_epi32(
                _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(const void *)s16)),
                5));
        for (int h = 0; h < 2; h++) {
            /* this half's 8 scales as int16 in both 128-bit lanes */
            __m256i sh = _mm256_broadcastsi128_si256(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(sc + 8 * h))));
            const uint8_t *ql = blk + 64 * h;
            __m256i L0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            __m256i L1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(L0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(H, m2), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(L1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m2), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(L0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m2), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                __m256i xv =
                    _mm256_loadu_si256((const __m256i *)(const void *)(x + 128 * h + 32 * k));
                /* int16 scale 2k in the low lane, 2k + 1 in the high lane */
                const char lo = (char)(4 * k), hi = (char)(4 * k + 2);
                __m256i s = _mm256_shuffle_epi8(
                    sh, _mm256_setr_epi8(lo, (char)(lo + 1), lo, (char)(lo + 1), lo, (char)(lo + 1),
                                         lo, (char)(lo + 1), lo, (char)(lo + 1), lo, (char)(lo + 1),
                                         lo, (char)(lo + 1), lo, (char)(lo + 1), hi, (char)(hi + 1),
                                         hi, (char)(hi + 1), hi, (char)(hi + 1), hi, (char)(hi + 1),
                                         hi, (char)(hi + 1), hi, (char)(hi + 1), hi, (char)(hi + 1),
                                         hi, (char)(hi + 1)));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), s));
            }
        }
        int32_t isum = hsum_i32(sum);
        lane[b & 7] = lane[b & 7] + (a.d[b] * h2f(blk + 208)) * (float)isum;
    }
    return fin8(lane);
}

/* The K-quants on AVX-512 VNNI: the AVX2 kernels (maddubs + madd with the scales). */
KV_QD_VNNI float kv_qk_qdot_vnni_Q4_K(const uint8_t *w, const void *a, int n) {
    return kv_qk_qdot_avx2_Q4_K(w, a, n);
}
KV_QD_VNNI float kv_qk_qdot_vnni_Q5_K(const uint8_t *w, const void *a, int n) {
    return kv_qk_qdot_avx2_Q5_K(w, a, n);
}
KV_QD_VNNI float kv_qk_qdot_vnni_Q6_K(const uint8_t *w, const void *a, int n) {
    return kv_qk_qdot_avx2_Q6_K(w, a, n);
}
#endif

#ifdef KV_QD_X86
/* quant_block for m a multiple of 32 with 8-wide vectors, the same bytes: the maximum of |x|
 * (order-free; a NaN lane never wins, as in quant_block), the scalar d and 1 / d, q =
 * round-to-nearest-even(x * id) clamped to [-127, 127] (NaN -> 0, what the scalar cast gives
 * on x86). The sums are exact integers. s16 (not NULL): the sums per 16 elements. */
KV_QD_AVX2 static int quant_block_avx2(const float *x, int m, int8_t *q, float *d, int16_t *s16) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < m; j += 8)
        mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), mx);
    float l[8], amax = 0.0f;
    _mm256_storeu_ps(l, mx);
    for (int k = 0; k < 8; k++) amax = l[k] > amax ? l[k] : amax;
    float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f),
                 lo = _mm256_set1_ps(-127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i tot = _mm256_setzero_si256();
    for (int j = 0; j < m; j += 32) {
        __m256i c[4];
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vid),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
            v = _mm256_andnot_ps(nan, _mm256_min_ps(_mm256_max_ps(v, lo), hi));
            c[k] = _mm256_cvtps_epi32(v);
        }
        __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i *)(void *)(q + j), _mm256_permutevar8x32_epi32(p, perm));
        __m256i s01 = _mm256_add_epi32(c[0], c[1]), s23 = _mm256_add_epi32(c[2], c[3]);
        if (s16) {
            s16[j / 16] = (int16_t)hsum_i32(s01);
            s16[j / 16 + 1] = (int16_t)hsum_i32(s23);
        }
        tot = _mm256_add_epi32(tot, _mm256_add_epi32(s01, s23));
    }
    *d = dd;
    return hsum_i32(tot);
}

KV_QD_AVX2 static void quantize_act_avx2(kv_dtype t, const float *x, int n, void *act) {
    int kind = kv_qdot_act_kind(t);
    uint8_t *base = act;
    int8_t *q = act;
    int m = kind == 'A' ? QA : QKB;
    for (int b = 0; b < n / m; b++) {
        float d;
        if (kind == 'A') {
            int32_t s = quant_block_avx2(x + (size_t)b * QA, QA, q + (size_t)b * QA, &d, NULL);
            memcpy(base + act_s_off(kind, n) + 4 * (size_t)b, &s, 4);
        } else {
            int16_t s16[16];
            quant_block_avx2(x + (size_t)b * QKB, QKB, q + (size_t)b * QKB, &d, s16);
            memcpy(base + act_s_off(kind, n) + 32 * (size_t)b, s16, 32);
        }
        memcpy(base + act_d_off(n) + 4 * (size_t)b, &d, 4);
    }
}
#endif

void kv_qdot_quantize_act_isa(kv_dtype t, const float *x, int n, void *act, kv_isa isa) {
#ifdef KV_QD_X86
    if (isa != KV_ISA_PORTABLE && kv_isa_available(KV_ISA_AVX2) && kv_qdot_act_kind(t)) {
        quantize_act_avx2(t, x, n, act);
        return;
    }
#endif
    (void)isa;
    quantize_act_c(t, x, n, act);
}

void kv_qdot_quantize_act(kv_dtype t, const float *x, int n, void *act) {
    kv_qdot_quantize_act_isa(t, x, n, act, kv_isa_best());
}
