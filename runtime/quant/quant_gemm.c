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

static size_t up64(size_t v) {
    return (v + 63) / 64 * 64;
}

int kv_qgemm_covers(kv_dtype t) {
    return kv_qtraits_get(t)->repack != NULL;
}

/* Q6_K: a scale per 16 weights, so per block of 32 two (a in a, the second in m's place) */
static int two_scales(kv_dtype t) {
    return kv_qblock_get(t).group == 16;
}

/* The integer subtracted from a code times the activation block's sum: the type's zero point,
 * and for signed codes (Q8_0) the 128 they are biased by to be unsigned in the packed strips. */
static int off_of(kv_dtype t) {
    kv_qblock b = kv_qblock_get(t);
    return b.sgn ? 128 : b.zero;
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

static size_t wrow_bytes(kv_dtype t, int in) {
    kv_qblock b = kv_qblock_get(t);
    return (size_t)(in / b.block) * (size_t)b.bytes;
}

/* ---- the portable reference ---- */

static float ref_one(kv_dtype t, const uint8_t *wrow, arow x, int in) {
    int off = off_of(t), hm = kv_qblock_get(t).has_min, two = two_scales(t);
    kv_qrepack_fn repack = kv_qtraits_get(t)->repack;
    float acc = 0.0f;
    for (int b = 0; b < in / QB; b++) {
        uint8_t u[QB];
        float a, m;
        repack(wrow, b, u, &a, &m);
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
    int nb = in / QB, hm = kv_qblock_get(wt).has_min, q8 = kv_qblock_get(wt).sgn,
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
        kv_qpack_fn pack = kv_qtraits_get(wt)->pack[isa];
        for (int s = 0; s < strips; s++) pack(W, rb, o0 + 8 * s, o1, nb, P + s * sstride);
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
