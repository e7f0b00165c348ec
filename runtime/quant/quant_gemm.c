/* The quantised-activation integer GEMM; layouts and the floating-point order
 * are described in quant_gemm.h. Three kernels: the portable C reference, AVX2 (maddubs + madd;
 * Q8_0 by the sign trick) and AVX-512 VNNI on 256-bit vectors (vpdpbusd; 32 vector registers,
 * so a tile of 16 W rows x 6 x rows), chosen by the caller's isa.
 *
 * Per call and per chunk of W rows, the chunk is packed into its thread's panel: strips of 8 W
 * rows, for each block of 32 a 320-byte record: [k = 0..7][row 0..7][4 bytes] of u (so one
 * 32-byte load holds elements 4k .. 4k + 3 of the 8 rows), then a [8] and m [8] as fp32. A
 * micro-kernel multiplies 2 strips (VNNI) or 1 (AVX2) with 6, 4 or 2 activation rows: per block,
 * for each k, the 4 bytes of an activation row broadcast to the 8 lanes and one dpbusd (or maddubs
 * + madd) per (strip, row); the lanes are the 8 W rows, so every lane ends the block holding an
 * exact I_b and no horizontal sum is needed. Packing costs ~1 pass over the chunk's weights per
 * call; it is amortised over the rows of x (above KV_QINT_MAX_ROWS in quant.c). */
#include "quant/quant_gemm.h"

#include <math.h>
#include <string.h>

#include "quant/quant_traits.h"
#include "util/f16.h"

#ifdef __clang__
#pragma clang fp contract(off)
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_QG_X86 1
#include <immintrin.h>
#define KV_QG_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KV_QG_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#endif

#define QB 32   /* elements per block */
#define REC 320 /* bytes of one strip's block record: 256 of u, 32 of a, 32 of m */
#define NPAD 2  /* activation rows are padded to a multiple of this (the smallest tile height) */

static inline float h2f(const uint8_t *p) {
    return kv_f16_to_f32(kv_load_u16le(p));
}

static size_t up64(size_t v) {
    return (v + 63) / 64 * 64;
}

int kv_qgemm_covers(kv_dtype t) {
    switch (t) {
    case KV_DT_Q8_0:
    case KV_DT_Q4_0:
    case KV_DT_Q4_1:
    case KV_DT_Q5_0:
    case KV_DT_Q5_1:
    case KV_DT_Q4_K:
    case KV_DT_Q5_K:
    case KV_DT_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* Q6_K: a scale per 16 weights, so per block of 32 two (a in a, the second in m's place) */
static int two_scales(kv_dtype t) {
    return t == KV_DT_Q6_K;
}

/* The integer subtracted from a code times the activation block's sum: the type's zero point,
 * and for Q8_0 the 128 its signed codes are biased by to be unsigned in the packed strips. */
static int off_of(kv_dtype t) {
    return t == KV_DT_Q8_0 ? 128 : kv_qtype_zero(t);
}

/* ---- activation rows: q int8 [in] at 0; at up64(in): d [nb], ds [nb] fp32, s [nb] int32 ---- */

static size_t act_row_bytes(int in) {
    return up64((size_t)in) + up64((size_t)(in / QB) * 16);
}

size_t kv_qgemm_act_bytes(int rows, int in) {
    size_t r = ((size_t)rows + NPAD - 1) / NPAD * NPAD;
    return r * act_row_bytes(in);
}

typedef struct arow {
    const int8_t *q;
    const float *d, *ds;
    const int32_t *c; /* -off * s: the start of a block's integer sum */
} arow;

static arow arow_of(const uint8_t *a, int in) {
    const uint8_t *t = a + up64((size_t)in);
    int nb = in / QB;
    arow r = {(const int8_t *)a, (const float *)(const void *)t,
              (const float *)(const void *)(t + 4 * (size_t)nb),
              (const int32_t *)(const void *)(t + 8 * (size_t)nb)};
    return r;
}

/* One block, portable: the arithmetic of quant_dot.c's quantiser. */
static void quant_block_c(const float *x, int8_t *q, float *d, int32_t *s) { /* s[2]: halves */
    float amax = 0.0f;
    for (int j = 0; j < QB; j++) amax = fmaxf(amax, fabsf(x[j]));
    float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
    int32_t sum[2] = {0, 0};
    for (int j = 0; j < QB; j++) {
        float v = nearbyintf(x[j] * id);
        int qi = v >= 127.0f ? 127 : v <= -127.0f ? -127 : (int)v;
        q[j] = (int8_t)qi;
        sum[j / 16] += qi;
    }
    *d = dd;
    s[0] = sum[0];
    s[1] = sum[1];
}

#ifdef KV_QG_X86
/* The same block with AVX2: max of |x| (exact), the same scalar d and 1/d, the products
 * rounded to nearest even by vroundps (what nearbyintf does in the default mode), clamped. */
KV_QG_AVX2 static void quant_block_avx2(const float *x, int8_t *q, float *d, int32_t *s) {
    const __m256 nz = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(nz, v0), _mm256_andnot_ps(nz, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(nz, v2), _mm256_andnot_ps(nz, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f),
                 lo = _mm256_set1_ps(-127.0f);
#define QG_Q(v)                                                                                    \
    _mm256_cvtps_epi32(_mm256_min_ps(                                                              \
        _mm256_max_ps(                                                                             \
            _mm256_round_ps(_mm256_mul_ps(v, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), \
            lo),                                                                                   \
        hi))
    __m256i i0 = QG_Q(v0), i1 = QG_Q(v1), i2 = QG_Q(v2), i3 = QG_Q(v3);
#undef QG_Q
    /* the sums of the halves: lanes of i0 + i1 and of i2 + i3 */
    __m256i h0 = _mm256_add_epi32(i0, i1), h1 = _mm256_add_epi32(i2, i3);
    __m256i hh = _mm256_hadd_epi32(h0, h1); /* [h0 01 23 | h1 01 23 | h0 45 67 | h1 45 67] */
    hh = _mm256_hadd_epi32(hh, hh);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
    /* int32 -> int8 in element order: packs work per 128-bit lane, a dword permute restores */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)q, p);
    *d = dd;
    s[0] = _mm_cvtsi128_si32(t);
    s[1] = _mm_extract_epi32(t, 1);
}
#endif

void kv_qgemm_quantize(kv_dtype wt, const float *x, int rows, int in, void *act) {
    int off = off_of(wt);
    size_t rb = act_row_bytes(in);
    int nb = in / QB, rp = (rows + NPAD - 1) / NPAD * NPAD;
#ifdef KV_QG_X86
    int avx2 = kv_isa_available(KV_ISA_AVX2);
#endif
    for (int r = 0; r < rp; r++) {
        uint8_t *a = (uint8_t *)act + (size_t)r * rb;
        if (r >= rows) {
            memset(a, 0, rb);
            continue;
        }
        uint8_t *t = a + up64((size_t)in);
        float *d = (float *)(void *)t, *ds = d + nb;
        int32_t *c = (int32_t *)(void *)(t + 8 * (size_t)nb);
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)r * in + (size_t)b * QB;
            int8_t *q = (int8_t *)a + (size_t)b * QB;
            int32_t sum[2];
#ifdef KV_QG_X86
            if (avx2)
                quant_block_avx2(xb, q, &d[b], sum);
            else
#endif
                quant_block_c(xb, q, &d[b], sum);
            ds[b] = d[b] * (float)(sum[0] + sum[1]);
            if (two_scales(wt)) { /* a start per half */
                c[2 * b] = -off * sum[0];
                c[2 * b + 1] = -off * sum[1];
            } else {
                c[2 * b] = -off * (sum[0] + sum[1]);
                c[2 * b + 1] = 0;
            }
        }
    }
}

/* ---- weights ---- */

static void k_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* Block b (of 32) of the W row `row` of type t: u [32], a, m (quant_gemm.h). */
static void unpack_blk(kv_dtype t, const uint8_t *row, int b, uint8_t *u, float *a, float *m) {
    const kv_qblock32 L = kv_qblock32_of(t); /* the 32-element types */
    *m = 0.0f;
    switch (t) {
    case KV_DT_Q8_0: {
        const uint8_t *blk = row + (size_t)b * (size_t)L.bytes;
        for (int j = 0; j < QB; j++) u[j] = (uint8_t)(blk[L.qs + j] ^ 0x80u);
        *a = h2f(blk);
        return;
    }
    case KV_DT_Q4_0:
    case KV_DT_Q4_1: {
        const uint8_t *blk = row + (size_t)b * (size_t)L.bytes;
        for (int j = 0; j < 16; j++) {
            u[j] = blk[L.qs + j] & 15;
            u[j + 16] = blk[L.qs + j] >> 4;
        }
        *a = h2f(blk);
        if (t == KV_DT_Q4_1) *m = h2f(blk + 2);
        return;
    }
    case KV_DT_Q5_0:
    case KV_DT_Q5_1: {
        int qh = L.qh;
        const uint8_t *blk = row + (size_t)b * (size_t)L.bytes, *qs = blk + L.qs;
        uint32_t h = (uint32_t)blk[qh] | (uint32_t)blk[qh + 1] << 8 | (uint32_t)blk[qh + 2] << 16 |
                     (uint32_t)blk[qh + 3] << 24;
        for (int j = 0; j < 16; j++) {
            u[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1u) << 4);
            u[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1u) << 4);
        }
        *a = h2f(blk);
        if (t == KV_DT_Q5_1) *m = h2f(blk + 2);
        return;
    }
    case KV_DT_Q4_K:
    case KV_DT_Q5_K: {
        int five = t == KV_DT_Q5_K, sb = b / 8, s = b % 8, c = s / 2, sh = 4 * (s & 1);
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
        return;
    }
    case KV_DT_Q6_K: {
        int sub = b % 8, h = sub / 4, qq = sub % 4;
        const uint8_t *blk = row + (size_t)(b / 8) * 210u;
        const uint8_t *ql = blk + 64 * h + 32 * (qq & 1), *qh = blk + 128 + 32 * h;
        for (int j = 0; j < QB; j++)
            u[j] = (uint8_t)(((ql[j] >> (4 * (qq >> 1))) & 15) | ((qh[j] >> (2 * qq)) & 3) << 4);
        float d = h2f(blk + 208);
        *a = d * (float)(int8_t)blk[192 + 2 * sub];
        *m = d * (float)(int8_t)blk[192 + 2 * sub + 1]; /* the second half's scale */
        return;
    }
    default:
        memset(u, 0, QB);
        *a = 0.0f;
        return;
    }
}

/* unpack_blk's a and m alone. */
static inline void scale_blk(kv_dtype t, const uint8_t *row, int b, float *a, float *m) {
    *m = 0.0f;
    switch (t) {
    case KV_DT_Q8_0:
        *a = h2f(row + (size_t)b * 34);
        return;
    case KV_DT_Q4_0:
        *a = h2f(row + (size_t)b * 18);
        return;
    case KV_DT_Q5_0:
        *a = h2f(row + (size_t)b * 22);
        return;
    case KV_DT_Q4_1:
    case KV_DT_Q5_1: {
        const uint8_t *blk = row + (size_t)b * (t == KV_DT_Q4_1 ? 20u : 24u);
        *a = h2f(blk);
        *m = h2f(blk + 2);
        return;
    }
    case KV_DT_Q4_K:
    case KV_DT_Q5_K: {
        const uint8_t *blk = row + (size_t)(b / 8) * (t == KV_DT_Q5_K ? 176u : 144u);
        int sc, mn;
        k_scale_min(blk + 4, b % 8, &sc, &mn);
        *a = h2f(blk) * (float)sc;
        *m = -(h2f(blk + 2) * (float)mn);
        return;
    }
    case KV_DT_Q6_K: {
        const uint8_t *blk = row + (size_t)(b / 8) * 210u;
        float d = h2f(blk + 208);
        *a = d * (float)(int8_t)blk[192 + 2 * (b % 8)];
        *m = d * (float)(int8_t)blk[192 + 2 * (b % 8) + 1];
        return;
    }
    default:
        *a = 0.0f;
        return;
    }
}

static size_t wrow_bytes(kv_dtype t, int in) {
    return (size_t)(in / kv_dtype_block(t)) * kv_dtype_block_bytes(t);
}

/* ---- the portable reference ---- */

static float ref_one(kv_dtype t, const uint8_t *wrow, arow x, int in) {
    int off = off_of(t), hm = kv_qtype_has_min(t), two = two_scales(t);
    float acc = 0.0f;
    for (int b = 0; b < in / QB; b++) {
        uint8_t u[QB];
        float a, m;
        unpack_blk(t, wrow, b, u, &a, &m);
        int32_t I = 0, I1 = 0;
        for (int j = 0; j < QB; j++) {
            int32_t p = ((int32_t)u[j] - off) * x.q[(size_t)b * QB + j];
            if (two && j >= 16)
                I1 += p;
            else
                I += p;
        }
        acc = fmaf(a * x.d[b], (float)I, acc);
        if (two) acc = fmaf(m * x.d[b], (float)I1, acc);
        if (hm) acc = fmaf(m, x.ds[b], acc);
    }
    return acc;
}

void kv_qgemm_ref(float *y, const void *act, const void *w, kv_dtype wt, int rows, int in,
                  int out) {
    size_t arb = act_row_bytes(in), rb = wrow_bytes(wt, in);
    for (int r = 0; r < rows; r++) {
        arow x = arow_of((const uint8_t *)act + (size_t)r * arb, in);
        for (int o = 0; o < out; o++)
            y[(size_t)r * out + o] = ref_one(wt, (const uint8_t *)w + (size_t)o * rb, x, in);
    }
}

/* ---- packing ---- */

size_t kv_qgemm_panel_bytes(int cs, int in) {
    size_t strips = ((size_t)cs + 15) / 16 * 2; /* even: the VNNI kernel takes strips in pairs */
    return strips * (size_t)(in / QB) * REC;
}

/* ---- kernels ---- */
#ifdef KV_QG_X86

/* Block b of a W row: its 32 u as bytes (unpack_blk's u, in vector form). */
KV_QG_AVX2 static inline __attribute__((always_inline)) __m256i
u32_avx2(kv_dtype t, const uint8_t *row, int b) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const kv_qblock32 L = kv_qblock32_of(t); /* the 32-element types */
    switch (t) {
    case KV_DT_Q8_0:
        return _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(const void *)(row + (size_t)b * L.bytes + L.qs)),
            _mm256_set1_epi8((char)0x80));
    case KV_DT_Q4_0:
    case KV_DT_Q4_1: {
        const uint8_t *blk = row + (size_t)b * (size_t)L.bytes;
        __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(blk + L.qs));
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
    }
    case KV_DT_Q5_0:
    case KV_DT_Q5_1: {
        int qhoff = L.qh;
        const uint8_t *blk = row + (size_t)b * (size_t)L.bytes;
        __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(blk + L.qs));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
        int32_t h;
        memcpy(&h, blk + qhoff, 4);
        /* byte j takes bit j of qh as its bit 4 */
        const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                              2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32(h), pick);
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
        return _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    case KV_DT_Q4_K:
    case KV_DT_Q5_K: {
        int five = t == KV_DT_Q5_K, sb = b / 8, sub = b % 8, c = sub / 2;
        const uint8_t *blk = row + (size_t)sb * (five ? 176u : 144u);
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
    case KV_DT_Q6_K: {
        int sub = b % 8, h = sub / 4, qq = sub % 4;
        const uint8_t *blk = row + (size_t)(b / 8) * 210u;
        __m256i l =
            _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h + 32 * (qq & 1)));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h));
        l = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (qq >> 1))), m4);
        hb = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * qq)), _mm256_set1_epi8(3));
        return _mm256_or_si256(l, _mm256_slli_epi16(hb, 4));
    }
    default:
        return _mm256_setzero_si256();
    }
}

/* pack_strip with the u of 8 rows transposed as 8 x 8 dwords in registers. */
KV_QG_AVX2 static void pack_strip_avx2(kv_dtype t, const uint8_t *W, size_t rb, int o, int o1,
                                       int nb, uint8_t *P) {
    int nv = o1 - o < 8 ? o1 - o : 8, kq = t == KV_DT_Q4_K || t == KV_DT_Q5_K;
    float ka[8][8], km[8][8]; /* K-quants: a and m of the super-block's 8 sub-blocks, per row */
    for (int b = 0; b < nb; b++) {
        uint8_t *rec = P + (size_t)b * REC;
        __m256i r[8];
        float a[8], m[8];
        if (kq && b % 8 == 0)
            for (int i = 0; i < nv; i++) {
                const uint8_t *blk =
                    W + (size_t)(o + i) * rb + (size_t)(b / 8) * (t == KV_DT_Q5_K ? 176u : 144u);
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
                r[i] = u32_avx2(t, row, b);
                if (kq) {
                    a[i] = ka[i][b % 8];
                    m[i] = km[i][b % 8];
                } else {
                    scale_blk(t, row, b, &a[i], &m[i]);
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

static inline int32_t ld_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* RM strips (P + m * sstride) x RN activation rows (x[0 .. RN)) -> o [RN][8 RM], rows ldo
 * floats apart. */
#define QG_KSTEPS(RM, RN, K0, K1, DOTSTEP)                                                         \
    for (int k = K0; k < K1; k++) {                                                                \
        __m256i w[RM];                                                                             \
        for (int m_ = 0; m_ < RM; m_++)                                                            \
            w[m_] = _mm256_loadu_si256(                                                            \
                (const __m256i *)(const void *)(P + m_ * sstride + (size_t)b * REC + 32 * k));     \
        for (int n = 0; n < RN; n++) {                                                             \
            __m256i xb = _mm256_set1_epi32(ld_i32(x[n].q + (size_t)b * QB + 4 * k));               \
            for (int m_ = 0; m_ < RM; m_++) DOTSTEP;                                               \
        }                                                                                          \
    }
/* acc += (scale at rec + OFF) * d_x * I */
#define QG_SCALE(RM, RN, OFF)                                                                      \
    for (int m_ = 0; m_ < RM; m_++) {                                                              \
        __m256 a = _mm256_loadu_ps(                                                                \
            (const float *)(const void *)(P + m_ * sstride + (size_t)b * REC + OFF));              \
        for (int n = 0; n < RN; n++)                                                               \
            acc[m_][n] = _mm256_fmadd_ps(_mm256_mul_ps(a, _mm256_set1_ps(x[n].d[b])),              \
                                         _mm256_cvtepi32_ps(I[m_][n]), acc[m_][n]);                \
    }
#define QG_INIT(RM, RN, INIT)                                                                      \
    for (int n = 0; n < RN; n++) {                                                                 \
        __m256i c0 = INIT;                                                                         \
        for (int m_ = 0; m_ < RM; m_++) I[m_][n] = c0;                                             \
    }

/* RM strips (P + m * sstride) x RN activation rows (x[0 .. RN)) -> o [RN][8 RM], rows ldo
 * floats apart. HM: the types with a min (m * ds per block); TWO: Q6_K (the block's halves
 * scaled apart, the second by the m slot). */
#define QG_TILE_BODY(RM, RN, IACC_INIT, DOTSTEP, HM, TWO)                                          \
    __m256 acc[RM][RN];                                                                            \
    for (int m_ = 0; m_ < RM; m_++)                                                                \
        for (int n = 0; n < RN; n++) acc[m_][n] = _mm256_setzero_ps();                             \
    for (int b = 0; b < nb; b++) {                                                                 \
        __m256i I[RM][RN];                                                                         \
        QG_INIT(RM, RN, IACC_INIT)                                                                 \
        if (TWO) {                                                                                 \
            QG_KSTEPS(RM, RN, 0, 4, DOTSTEP)                                                       \
            QG_SCALE(RM, RN, 256)                                                                  \
            QG_INIT(RM, RN, _mm256_set1_epi32(x[n].c[2 * b + 1]))                                  \
            QG_KSTEPS(RM, RN, 4, 8, DOTSTEP)                                                       \
            QG_SCALE(RM, RN, 288)                                                                  \
        } else {                                                                                   \
            QG_KSTEPS(RM, RN, 0, 8, DOTSTEP)                                                       \
            QG_SCALE(RM, RN, 256)                                                                  \
        }                                                                                          \
        if (HM)                                                                                    \
            for (int m_ = 0; m_ < RM; m_++) {                                                      \
                __m256 mv = _mm256_loadu_ps(                                                       \
                    (const float *)(const void *)(P + m_ * sstride + (size_t)b * REC + 288));      \
                for (int n = 0; n < RN; n++)                                                       \
                    acc[m_][n] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x[n].ds[b]), acc[m_][n]);      \
            }                                                                                      \
    }                                                                                              \
    for (int n = 0; n < RN; n++)                                                                   \
        for (int m_ = 0; m_ < RM; m_++) _mm256_storeu_ps(o + (size_t)n * ldo + 8 * m_, acc[m_][n]);

/* the integer accumulators start at -off * s (x[n].c: the per-block correction, quant_gemm.h) */
#define QG_INIT_C _mm256_set1_epi32(x[n].c[2 * b])
#define QG_INIT_0 _mm256_setzero_si256()
#define QG_VNNI_STEP I[m_][n] = _mm256_dpbusd_epi32(I[m_][n], w[m_], xb)

/* VNNI: 2 strips (16 W rows) x RN rows; 6 rows: 12 integer chains per k step, 24 + 3 of the 32
 * vector registers. */
#define QG_TILE_VNNI(name, RN)                                                                     \
    KV_QG_VNNI static void name(const uint8_t *P, size_t sstride, const arow *x, int nb, int hm,   \
                                int two, float *o, size_t ldo) {                                   \
        if (hm) {                                                                                  \
            QG_TILE_BODY(2, RN, QG_INIT_0, QG_VNNI_STEP, 1, 0)                                     \
        } else if (two) {                                                                          \
            QG_TILE_BODY(2, RN, QG_INIT_C, QG_VNNI_STEP, 0, 1)                                     \
        } else {                                                                                   \
            QG_TILE_BODY(2, RN, QG_INIT_C, QG_VNNI_STEP, 0, 0)                                     \
        }                                                                                          \
    }
QG_TILE_VNNI(tile_vnni6, 6)
QG_TILE_VNNI(tile_vnni2, 2)

/* AVX2: one strip; u unsigned (<= 31) by maddubs, Q8_0 (off 128) as signed w = u ^ 0x80 by the
 * sign trick (|w| <= 128 and |q| <= 127: no pair sum saturates). */
#define QG_AVX2_STEP                                                                               \
    I[m_][n] = _mm256_add_epi32(                                                                   \
        I[m_][n], _mm256_madd_epi16(_mm256_maddubs_epi16(w[m_], xb), _mm256_set1_epi16(1)))
#define QG_AVX2_STEP8                                                                              \
    I[m_][n] = _mm256_add_epi32(                                                                   \
        I[m_][n], _mm256_madd_epi16(                                                               \
                      _mm256_maddubs_epi16(_mm256_abs_epi8(_mm256_xor_si256(w[m_], flip)),         \
                                           _mm256_sign_epi8(xb, _mm256_xor_si256(w[m_], flip))),   \
                      _mm256_set1_epi16(1)))
#define QG_TILE_AVX2(name, RN)                                                                     \
    KV_QG_AVX2 static void name(const uint8_t *P, size_t sstride, const arow *x, int nb, int hm,   \
                                int q8, int two, float *o, size_t ldo) {                           \
        const __m256i flip = _mm256_set1_epi8((char)0x80);                                         \
        (void)flip;                                                                                \
        if (hm) {                                                                                  \
            QG_TILE_BODY(1, RN, QG_INIT_0, QG_AVX2_STEP, 1, 0)                                     \
        } else if (q8) {                                                                           \
            QG_TILE_BODY(1, RN, QG_INIT_0, QG_AVX2_STEP8, 0, 0)                                    \
        } else if (two) {                                                                          \
            QG_TILE_BODY(1, RN, QG_INIT_C, QG_AVX2_STEP, 0, 1)                                     \
        } else {                                                                                   \
            QG_TILE_BODY(1, RN, QG_INIT_C, QG_AVX2_STEP, 0, 0)                                     \
        }                                                                                          \
    }
QG_TILE_AVX2(tile_avx2_4, 4)
QG_TILE_AVX2(tile_avx2_2, 2)

/* Rows r0 .. r1 - 1 (r1 - r0 even) of x times every strip of P: tiles of 6 (VNNI) or 4 (AVX2)
 * rows, the remainder by 2; outputs past o1 or rows past `rows` (the padding) not stored. */
static void run_tiles(kv_isa isa, const uint8_t *P, size_t sstride, int strips, const uint8_t *A,
                      size_t arb, int r0, int r1, int in, kv_dtype wt, float *y, int out, int rows,
                      int o0, int o1) {
    int nb = in / QB, hm = kv_qtype_has_min(wt), q8 = wt == KV_DT_Q8_0,
        vnni = isa == KV_ISA_AVX512_VNNI;
    int two = two_scales(wt);
    int sm = vnni ? 2 : 1, big = vnni ? 6 : 4;
    for (int s = 0; s < strips; s += sm)
        for (int r = r0; r < r1;) {
            int rn = r1 - r >= big ? big : 2;
            arow x[6];
            for (int n = 0; n < rn; n++) x[n] = arow_of(A + (size_t)(r + n) * arb, in);
            float buf[96];
            /* a whole tile straight into y, a partial one through buf */
            int full = r + rn <= rows && o0 + 8 * (s + sm) <= o1;
            float *o = full ? y + (size_t)r * out + o0 + 8 * s : buf;
            size_t ldo = full ? (size_t)out : 16;
            const uint8_t *Ps = P + (size_t)s * sstride;
            if (vnni) {
                if (rn == 6)
                    tile_vnni6(Ps, sstride, x, nb, hm, two, o, ldo);
                else
                    tile_vnni2(Ps, sstride, x, nb, hm, two, o, ldo);
            } else {
                if (rn == 4)
                    tile_avx2_4(Ps, sstride, x, nb, hm, q8, two, o, ldo);
                else
                    tile_avx2_2(Ps, sstride, x, nb, hm, q8, two, o, ldo);
            }
            for (int n = 0; n < rn && r + n < rows && !full; n++)
                for (int j = 0; j < 8 * sm && o0 + 8 * s + j < o1; j++)
                    y[(size_t)(r + n) * out + o0 + 8 * s + j] = buf[16 * n + j];
            r += rn;
        }
}
#endif

/* Activation rows per pass over the chunk's strips: ~128 KiB of them (L2), a multiple of 4. */
#define QG_XBLOCK_BYTES ((size_t)128 << 10)

void kv_qgemm_range(float *y, const void *act, const void *w, kv_dtype wt, int rows, int in,
                    int out, int o0, int o1, void *panel, kv_isa isa) {
    size_t arb = act_row_bytes(in), rb = wrow_bytes(wt, in);
    const uint8_t *A = act, *W = w;
#ifdef KV_QG_X86
    if (isa != KV_ISA_PORTABLE) {
        int nb = in / QB, strips = (o1 - o0 + 15) / 16 * 2;
        size_t sstride = (size_t)nb * REC;
        uint8_t *P = panel;
        for (int s = 0; s < strips; s++)
            pack_strip_avx2(wt, W, rb, o0 + 8 * s, o1, nb, P + s * sstride);
        int rp = (rows + NPAD - 1) / NPAD * NPAD;
        int xb = (int)(QG_XBLOCK_BYTES / arb) / NPAD * NPAD;
        if (xb < NPAD) xb = NPAD;
        for (int r0 = 0; r0 < rp; r0 += xb) {
            int r1 = r0 + xb < rp ? r0 + xb : rp;
            run_tiles(isa, P, sstride, strips, A, arb, r0, r1, in, wt, y, out, rows, o0, o1);
        }
        return;
    }
#endif
    (void)panel;
    (void)isa;
    for (int r = 0; r < rows; r++) {
        arow x = arow_of(A + (size_t)r * arb, in);
        for (int o = o0; o < o1; o++)
            y[(size_t)r * out + o] = ref_one(wt, W + (size_t)o * rb, x, in);
    }
}
