/* Weights in their file's type on the device: element decoders for every
 * weight type kvplan reads (include/kvplan/quant.h gives the ggml block layouts), and the
 * kernels that use them, written once for the device and the host shim (kv_defs.cuh):
 *   - kv_k_gemv: y = x W^T for a few rows of x (decode), reading each weight row once in its
 *     type and decoding it in registers, fp32 activations and accumulation;
 *   - kv_k_dequant_rows: a tile of W rows dequantised to fp32 scratch (prefill: the tile then
 *     goes through an fp32 GEMM, as the CPU's kv_qmatmul does with its tiles);
 *   - kv_k_to_16: fp32 activations rounded to binary16 / bfloat16 for cuBLAS's 16-bit GEMMs;
 *   - kv_k_gather_rows_typed: embedding rows dequantised on lookup.
 * The element decoders compute each value with the float expressions, in the same order, of
 * runtime/quant/quant.c's block decoders (dq_q8_0 ... dq_q6_k), so a decoded weight equals the
 * CPU's kv_dequantize_row (checked on the shim by tests/test_cuda_kernels.cpp). They decode one
 * element at a time (a lane's share of a row); a device build would decode a block's scales
 * once per warp, which changes the speed, not the values. */
#ifndef KVPLAN_CUDA_KV_QUANT_CUH
#define KVPLAN_CUDA_KV_QUANT_CUH

#include "kv_defs.cuh"
#include "kv_tasks.h" /* KV_K_GEMV_ROWS */
#include "kvplan/quant.h"
#include "util/f16.h"

#include <stdint.h>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

/* binary16 bits h as fp32 (exact): the hardware conversion on the device (one cvt), the
 * bit-exact software one of util/f16.h on the shim. */
KV_DEVICE float kv_h2f(unsigned h) {
#if defined(__CUDACC__)
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    return kv_f16_to_f32((uint16_t)h);
#endif
}

/* The f16 at p (2-byte aligned) as fp32: one 16-bit load and kv_h2f. */
KV_DEVICE float kv_q_hw(const unsigned char *p) {
    return kv_h2f(kv_ld_u16(p));
}

KV_DEVICE float kv_q_h(const unsigned char *p) {
    return kv_f16_to_f32(kv_load_u16le(p));
}

/* Scale and min of sub-block s of a K-quant super-block (ggml get_scale_min_k4; quant.c's
 * k_scale_min). */
KV_DEVICE void kv_q_k_scale_min(const unsigned char *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* Element i of a weight row of type t at `row` (its first byte). Unknown types give 0 (the
 * backend only uploads types kv_q_device_type accepts). */
KV_DEVICE float kv_q_elem(int t, const unsigned char *row, int i) {
    switch (t) {
    case KV_DT_F32: {
        float f;
        memcpy(&f, row + 4 * (size_t)i, sizeof f);
        return f;
    }
    case KV_DT_F16:
        return kv_q_h(row + 2 * (size_t)i);
    case KV_DT_BF16:
        return kv_bf16_to_f32(kv_load_u16le(row + 2 * (size_t)i));
    case KV_DT_Q8_0: {
        const unsigned char *b = row + (size_t)(i / 32) * 34;
        return kv_q_h(b) * (float)(signed char)b[2 + i % 32];
    }
    case KV_DT_Q4_0: {
        const unsigned char *b = row + (size_t)(i / 32) * 18;
        int j = i % 32, q = b[2 + j % 16];
        return kv_q_h(b) * (float)((j < 16 ? q & 15 : q >> 4) - 8);
    }
    case KV_DT_Q4_1: {
        const unsigned char *b = row + (size_t)(i / 32) * 20;
        int j = i % 32, q = b[4 + j % 16];
        return kv_q_h(b) * (float)(j < 16 ? q & 15 : q >> 4) + kv_q_h(b + 2);
    }
    case KV_DT_Q5_0:
    case KV_DT_Q5_1: {
        int one = t == KV_DT_Q5_1; /* Q5_1: a min after the scale, qh and qs 2 bytes later */
        const unsigned char *b = row + (size_t)(i / 32) * (one ? 24 : 22);
        const unsigned char *qhp = b + (one ? 4 : 2);
        uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 |
                      (uint32_t)qhp[3] << 24;
        int j = i % 32, q = qhp[4 + j % 16];
        int v = (j < 16 ? q & 15 : q >> 4) | (int)((qh >> j) & 1u) << 4;
        return one ? kv_q_h(b) * (float)v + kv_q_h(b + 2) : kv_q_h(b) * (float)(v - 16);
    }
    case KV_DT_Q4_K:
    case KV_DT_Q5_K: {
        int five = t == KV_DT_Q5_K;
        const unsigned char *b = row + (size_t)(i / 256) * (five ? 176 : 144);
        int j = i % 256, s = j / 32, l = j % 32, c = s / 2, sc, mn;
        kv_q_k_scale_min(b + 4, s, &sc, &mn);
        float d = kv_q_h(b) * (float)sc, n = kv_q_h(b + 2) * (float)mn;
        int q = b[(five ? 48 : 16) + 32 * c + l];
        q = s % 2 ? q >> 4 : q & 15;
        if (five) q |= ((b[16 + l] >> s) & 1) << 4;
        return d * (float)q - n;
    }
    case KV_DT_Q6_K: {
        const unsigned char *b = row + (size_t)(i / 256) * 210;
        int j = i % 256, h = j / 128, r = j % 128, part = r / 32, l = r % 32;
        int lq = b[64 * h + l + (part & 1) * 32];
        int q = (part < 2 ? lq & 15 : lq >> 4) | ((b[128 + 32 * h + l] >> (2 * part)) & 3) << 4;
        float d = kv_q_h(b + 208);
        return d * (float)(signed char)b[192 + 8 * h + l / 16 + 2 * part] * (float)(q - 32);
    }
    }
    return 0.0f;
}

/* y[r * out + o] = sum_i W[o, i] x[r * in + i] for r < rows (<= KV_K_GEMV_ROWS), o < out; W
 * rows of row_bytes bytes in type t. One warp per output row (grid-stride over rows), lanes
 * split i and decode their elements once for all rows of x; a butterfly sum per row. Any grid;
 * blockDim a multiple of 32. */
KV_GLOBAL void kv_k_gemv(const unsigned char *W, int t, size_t row_bytes, const float *x, float *y,
                         int rows, int in, int out) {
    int lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP, n_warps = kv_bdim() / KV_WARP;
    for (int o = kv_bid() * n_warps + warp; o < out; o += kv_gdim() * n_warps) {
        const unsigned char *wr = W + (size_t)o * row_bytes;
        float acc[KV_K_GEMV_ROWS];
        for (int r = 0; r < KV_K_GEMV_ROWS; r++) acc[r] = 0.0f;
        for (int i = lane; i < in; i += KV_WARP) {
            float w = kv_q_elem(t, wr, i);
            for (int r = 0; r < KV_K_GEMV_ROWS; r++)
                if (r < rows) acc[r] += w * x[(size_t)r * (size_t)in + (size_t)i];
        }
        for (int r = 0; r < KV_K_GEMV_ROWS; r++) {
            if (r >= rows) break; /* rows is uniform over the warp: every lane stops here */
            float s = kv_warp_sum(acc[r]);
            if (lane == 0) y[(size_t)r * (size_t)out + (size_t)o] = s;
        }
    }
}

/* ---- decode GEMV per weight type (the type a template parameter, no switch in the loop) ----
 * Shapes of all: y[r * out + o] = sum_i W[o, i] x[r, i] for r < rows <= R (R a template
 * parameter, 1 .. KV_K_GEMV_ROWS: the accumulators stay in registers; the launcher
 * instantiates R = 1 .. 8, 16, 24, 32 and passes the step's rows), o < out. Each weight load
 * serves every row of x (batches 2-32 read each weight byte once per step). Grid:
 * one block of kGemvThreads threads per output row (grid-stride over rows, any grid); each
 * thread takes every kGemvThreads-th chunk of the row, two chunks per iteration (two loads in
 * flight), and the block's partial sums meet in shared memory, warps in order, so a launch
 * gives the same bits every run. */

/* Threads per block of the typed GEMV kernels (4 warps). */
#define KV_K_GEMV_THREADS 128
/* Threads per block of kv_k_gemv_q4k (8 lanes per output row: 8 rows a block). */
#define KV_K_GEMV_Q4K_THREADS 64

/* The block sums of a GEMV row for rows r < rows <= R: thread partials acc[R] summed over the
 * block (warp butterfly, then warp totals in warp order by thread 0..rows-1) into y[r * out +
 * o]. red: R * 32 floats of shared memory; ends with a barrier, so red can be reused at once. */
template <int R>
KV_DEVICE void kv_k_gemv_finish(float *acc, float *red, float *y, int rows, int out, int o) {
    int lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP, nw = kv_bdim() / KV_WARP;
    for (int r = 0; r < R && r < rows; r++) {
        float v = kv_warp_sum(acc[r]);
        if (lane == 0) red[r * KV_WARP + warp] = v;
    }
    kv_syncthreads();
    if (kv_tid() < R && kv_tid() < rows) {
        float t = red[kv_tid() * KV_WARP];
        for (int w = 1; w < nw; w++) t += red[kv_tid() * KV_WARP + w];
        y[(size_t)kv_tid() * (size_t)out + (size_t)o] = t;
    }
    kv_syncthreads();
}

/* F16 weights (rows of `in` halves, in % 8 == 0, rows 16-byte aligned), fp32 x and sums: each
 * chunk is 8 weights (one 16-byte load) against 8 floats of each row of x (two 16-byte
 * loads). The products are fp32 multiply-adds in chunk order per thread (the CPU's F16 GEMV
 * sums in its own order: the values agree to rounding). */
template <int R>
KV_GLOBAL void kv_k_gemv_f16(const unsigned char *W, const float *x, float *y, int rows, int in,
                             int out) {
    KV_SHARED_ARRAY(float, red, R *KV_WARP);
    int step = 8 * kv_bdim();
    for (int o = kv_bid(); o < out; o += kv_gdim()) {
        const unsigned char *wr = W + (size_t)o * (size_t)in * 2;
        float acc[R];
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int i0 = 8 * kv_tid(); i0 < in; i0 += 2 * step) {
            unsigned wv[2][4];
            int two = i0 + step < in; /* both loads issued before either is used */
            kv_load16(wr + 2 * (size_t)i0, wv[0]);
            if (two) kv_load16(wr + 2 * (size_t)(i0 + step), wv[1]);
            KV_UNROLL
            for (int u = 0; u < 2; u++) {
                if (u == 1 && !two) break;
                float w[8];
                for (int k = 0; k < 4; k++) {
                    w[2 * k] = kv_h2f(wv[u][k] & 0xffffu);
                    w[2 * k + 1] = kv_h2f(wv[u][k] >> 16);
                }
                for (int r = 0; r < R && r < rows; r++) {
                    float xv[8];
                    const float *xr = x + (size_t)r * (size_t)in + (size_t)(i0 + u * step);
                    kv_load16(xr, reinterpret_cast<unsigned *>(xv));
                    kv_load16(xr + 4, reinterpret_cast<unsigned *>(xv + 4));
                    for (int k = 0; k < 8; k++) acc[r] += w[k] * xv[k];
                }
            }
        }
        kv_k_gemv_finish<R>(acc, red, y, rows, out, o);
    }
}

/* Activations of a block-type GEMV quantised once per step, as the CPU's integer dots take them
 * (runtime/quant/quant_dot.h, layout "A"): for every 32-element block b of x [rows, in] (in %
 * 32 == 0, blocks numbered row-major), d[b] = max|x| / 127, q[32 b + j] = round-to-nearest-
 * even(x / d) clamped to [-127, 127] (the CPU's q8 and quant_block: the same bytes), s[b] =
 * sum q. One warp per block; any grid. q: rows * in bytes (4-byte aligned), d, s: rows * in /
 * 32 each. */
KV_GLOBAL void kv_k_quantize_q8(const float *x, int rows, int in, signed char *q, float *d,
                                int *s) {
    int lane = kv_tid() % KV_WARP, nw = kv_bdim() / KV_WARP;
    size_t total = (size_t)rows * (size_t)(in / 32);
    for (size_t b = (size_t)kv_bid() * nw + (size_t)(kv_tid() / KV_WARP); b < total;
         b += (size_t)kv_gdim() * nw) {
        float v = x[32 * b + (size_t)lane];
        float amax = kv_warp_max(fabsf(v));
        float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        float t = rintf(v * id);
        int qi = t >= 127.0f ? 127 : t <= -127.0f ? -127 : (int)t;
        q[32 * b + (size_t)lane] = (signed char)qi;
        int sum = kv_warp_sum(qi);
        if (lane == 0) {
            d[b] = dd;
            s[b] = sum;
        }
    }
}

/* N 32-bit words of weight quants from p (2-byte aligned: the blocks are 34 and 18 bytes) by
 * 4-byte aligned loads: N words from p rounded down to 4 bytes and, when p is 2 mod 4, its last
 * 2 bytes by one 16-bit load (never past p + 4 N), the words then shifted by 16 bits. */
template <int N> KV_DEVICE void kv_q_words(const unsigned char *p, int *w) {
    unsigned odd = (unsigned)((uintptr_t)p & 2u), v[N + 1];
    const unsigned char *base = p - odd;
    for (int k = 0; k < N; k++) v[k] = kv_ld_u32(base + 4 * k);
    v[N] = odd ? kv_ld_u16(base + 4 * N) : 0u;
    for (int k = 0; k < N; k++) w[k] = (int)(odd ? v[k] >> 16 | v[k + 1] << 16 : v[k]);
}

/* A weight block for kv_k_gemv_q, as `lanes` lanes share it (h = 0 .. lanes - 1): load gives a
 * lane its `words` words of signed bytes (elements 32 h / lanes onward, in element order) and
 * the block's f16 scale; per row of x the lane dots them with the same elements' activations
 * (words / 4 16-byte loads, `words` dp4a), the lanes' integers summed (a shuffle when lanes =
 * 2) give the CPU's exact per-block integer I, and finish is its float expression. */
/* Q8_0 (34 bytes: f16 d, 32 int8): two lanes per block, half h holding elements 16 h .. 16 h +
 * 15 (two lanes per block: a warp's loads span 16 blocks, ~17 sectors per request); the CPU's
 * f = (dw * dx) * I, I = sum qw qx. */
struct kv_q8_0_dot {
    static const int bytes = 34, lanes = 2, words = 4;
    KV_DEVICE float load(const unsigned char *blk, int h, int *w) {
        kv_q_words<4>(blk + 2 + 16 * h, w);
        return kv_q_hw(blk);
    }
    KV_DEVICE float finish(float dw, float dx, int I, int sx) {
        (void)sx;
        return (dw * dx) * (float)I;
    }
};

/* Q4_0 (18 bytes: f16 d, 16 bytes of nibbles, elements j and j + 16 in byte j): a lane per
 * block (its 16 nibble bytes as 4 words: elements 0 .. 15 the low nibbles, 16 .. 31 the high
 * ones); the CPU's f = (dw * dx) * I, I = sum nib qx - 8 s. */
struct kv_q4_0_dot {
    static const int bytes = 18, lanes = 1, words = 8;
    KV_DEVICE float load(const unsigned char *blk, int h, int *w) {
        (void)h;
        int v[4];
        kv_q_words<4>(blk + 2, v);
        for (int k = 0; k < 4; k++) {
            w[k] = (int)((unsigned)v[k] & 0x0f0f0f0fu);
            w[k + 4] = (int)(((unsigned)v[k] >> 4) & 0x0f0f0f0fu);
        }
        return kv_q_hw(blk);
    }
    KV_DEVICE float finish(float dw, float dx, int I, int sx) {
        return (dw * dx) * (float)(I - 8 * sx);
    }
};

/* Block-type weights (Dot: kv_q8_0_dot, kv_q4_0_dot; blocks of 32) against activations
 * quantised by kv_k_quantize_q8 (q, d, s). A block of KV_K_GEMV_THREADS per output row,
 * Dot::lanes lanes per weight block (a warp's blocks consecutive), two blocks per lane per
 * iteration with both loads issued first; per row of x the block's exact integer (dp4a, a
 * shuffle between two lanes) and the CPU's float expression per block, summed per thread in
 * block order, then over the block (the CPU sums the same per-block terms in 8 interleaved
 * lanes: the values agree to the rounding of the additions only). The loop is uniform over a
 * warp (the lanes' shuffle needs every lane). */
template <typename Dot, int R>
KV_GLOBAL void kv_k_gemv_q(const unsigned char *W, size_t row_bytes, const signed char *aq,
                           const float *ad, const int *as, float *y, int rows, int in, int out) {
    KV_SHARED_ARRAY(float, red, R *KV_WARP);
    const int L = Dot::lanes, NW = Dot::words;
    int nb = in / 32, h = kv_tid() % L, step = kv_bdim() / L, lead = kv_tid() % KV_WARP / L;
    /* the block's term once: lane h = 0 adds it (x 1, exact), the others add 0 (a product, not
     * a branch on h: every lane runs the same instructions) */
    float keep = h ? 0.0f : 1.0f;
    Dot dot;
    for (int o = kv_bid(); o < out; o += kv_gdim()) {
        const unsigned char *wr = W + (size_t)o * row_bytes;
        float acc[R];
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int b0 = kv_tid() / L; b0 - lead < nb; b0 += 2 * step) {
            int w[2][NW] = {{0}};
            float dw[2] = {0.0f, 0.0f};
            KV_UNROLL
            for (int u = 0; u < 2; u++)
                if (b0 + u * step < nb)
                    dw[u] = dot.load(wr + (size_t)(b0 + u * step) * Dot::bytes, h, w[u]);
            KV_UNROLL
            for (int u = 0; u < 2; u++) {
                int b = b0 + u * step, ok = b < nb;
                if (b - lead >= nb) break; /* uniform over the warp */
                for (int r = 0; r < R && r < rows; r++) {
                    size_t ab = (size_t)r * (size_t)nb + (size_t)(ok ? b : 0);
                    int I = 0;
                    if (ok) {
                        unsigned xv[NW];
                        for (int k = 0; k < NW / 4; k++)
                            kv_load16(aq + 32 * ab + 4 * NW * h + 16 * k, xv + 4 * k);
                        for (int k = 0; k < NW; k++) I = kv_dp4a(w[u][k], xv[k], I);
                    }
                    if (L == 2) I += kv_shfl_xor(I, 1);
                    if (ok) acc[r] += keep * dot.finish(dw[u], ad[ab], I, as[ab]);
                }
            }
        }
        kv_k_gemv_finish<R>(acc, red, y, rows, out, o);
    }
}

/* Activations of a K-quant GEMV quantised once per call, as the CPU's integer dots take them
 * (runtime/quant/quant_dot.h layout "K"): for every 256-element block b of x [rows, in] (in %
 * 256 == 0, blocks numbered row-major), d[b] = max|x| / 127, q[256 b + j] = round-to-nearest-
 * even(x / d) clamped to [-127, 127] (the CPU's quant_block: the same bytes), s16[16 b + g] =
 * the sum of q over the block's elements 16 g .. 16 g + 15. One warp per block, 8 consecutive
 * elements per lane; any grid. q: rows * in bytes, d: rows * in / 256 floats, s16: rows * in /
 * 16 int16. */
KV_GLOBAL void kv_k_quantize_q8k(const float *x, int rows, int in, signed char *q, float *d,
                                 short *s16) {
    int lane = kv_tid() % KV_WARP, nw = kv_bdim() / KV_WARP;
    size_t total = (size_t)rows * (size_t)(in / 256);
    for (size_t b = (size_t)kv_bid() * nw + (size_t)(kv_tid() / KV_WARP); b < total;
         b += (size_t)kv_gdim() * nw) {
        const float *xb = x + 256 * b + 8 * (size_t)lane;
        float v[8], amax = 0.0f;
        for (int k = 0; k < 8; k++) {
            v[k] = xb[k];
            float a = fabsf(v[k]);
            amax = a > amax ? a : amax;
        }
        amax = kv_warp_max(amax);
        float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        int sum = 0;
        for (int k = 0; k < 8; k++) {
            float t = rintf(v[k] * id);
            int qi = t >= 127.0f ? 127 : t <= -127.0f ? -127 : (int)t;
            q[256 * b + 8 * (size_t)lane + (size_t)k] = (signed char)qi;
            sum += qi;
        }
        sum += kv_shfl_xor(sum, 1); /* lanes 2g and 2g + 1 hold group g's 16 elements */
        if (lane % 2 == 0) s16[16 * b + (size_t)(lane / 2)] = (short)sum;
        if (lane == 0) d[b] = dd;
    }
}

/* A Q4_K super-block (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes
 * of nibbles; element 64 c + l is the low nibble of byte 32 c + l, element 64 c + 32 + l its
 * high nibble) as one lane of kv_k_gemv_q4k holds it: the 8 scales and 8 mins decoded once
 * (ggml get_scale_min_k4, quant_dot.c k_scale_min, for all 8 sub-blocks at once: sc bytes 0-3
 * and 4-7 in sc[0], sc[1], the mins in mn[0], mn[1]) and the nibble bytes as 32 words. */
struct kv_q4k_blk {
    unsigned q[32], sc[2], mn[2];
    float d, dmin;
};

/* v: the super-block's nine 16-byte words as loaded (kv_k_gemv_q4k). */
KV_DEVICE void kv_q4k_decode(const unsigned (*v)[4], kv_q4k_blk &b) {
    const unsigned m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    unsigned s0 = v[0][1], s1 = v[0][2], s2 = v[0][3];
    b.d = kv_h2f(v[0][0] & 0xffffu);
    b.dmin = kv_h2f(v[0][0] >> 16);
    b.sc[0] = s0 & m6;                                  /* sub-blocks 0-3: bytes 0-3, low 6 bits */
    b.mn[0] = s1 & m6;                                  /* their mins: bytes 4-7 */
    b.sc[1] = (s2 & m4) | ((s0 >> 6) & m2) << 4;        /* 4-7: bytes 8-11 low, 0-3 top bits */
    b.mn[1] = ((s2 >> 4) & m4) | ((s1 >> 6) & m2) << 4; /* 8-11 high, 4-7 top bits */
    for (int k = 0; k < 32; k++) b.q[k] = v[1 + k / 4][k % 4];
}

/* The CPU's fp32 term of super-block b against one row's activation block (xq: 256 int8,
 * s16: its 16 sums, dx its scale): Isc = sum_s sc_s sum q x, Im = sum_s m_s (s16[2s] +
 * s16[2s + 1]) as exact integers (64 dp4a), f = (dx d) Isc - (dx dmin) Im (quant_dot.c
 * dotk45_c, k_finish) without FMA. */
KV_DEVICE float kv_q4k_row(const kv_q4k_blk &b, const signed char *xq, const short *s16, float dx) {
    unsigned sv[8];
    kv_load16(s16, sv);
    kv_load16(s16 + 8, sv + 4);
    int isc = 0, im = 0;
    for (int c = 0; c < 4; c++) {
        unsigned xv[16];
        for (int k = 0; k < 4; k++) kv_load16(xq + 64 * c + 16 * k, xv + 4 * k);
        int lo = 0, hi = 0;
        for (int k = 0; k < 8; k++) {
            lo = kv_dp4a(b.q[8 * c + k] & 0x0f0f0f0fu, xv[k], lo);
            hi = kv_dp4a((b.q[8 * c + k] >> 4) & 0x0f0f0f0fu, xv[8 + k], hi);
        }
        int sh = 16 * (c % 2);
        isc +=
            (int)((b.sc[c / 2] >> sh) & 255u) * lo + (int)((b.sc[c / 2] >> (sh + 8)) & 255u) * hi;
        for (int k = 0; k < 2; k++) {
            unsigned w = sv[2 * c + k];
            int pair = (int)(short)(w & 0xffffu) + (int)(short)(w >> 16);
            im += (int)((b.mn[c / 2] >> (sh + 8 * k)) & 255u) * pair;
        }
    }
    return kv_fsub_rn(kv_fmul_rn(kv_fmul_rn(dx, b.d), (float)isc),
                      kv_fmul_rn(kv_fmul_rn(dx, b.dmin), (float)im));
}

/* Q4_K weights against activations quantised by kv_k_quantize_q8k (aq, ad, as: rows x in / 256
 * blocks), with the bits of the CPU's integer dots (quant_dot.c dotk45_c): lane (row, j) of a
 * block takes output row kv_bid() * (kv_bdim() / 8) + kv_tid() / 8 and its super-blocks j, j + 8,
 * j + 16, ... in order (j = kv_tid() % 8: the CPU's accumulator j), a whole super-block per
 * lane (nine 16-byte loads, two super-blocks per iteration, all 18 loads issued first), its
 * scales decoded once for every row of x; per row f_b = kv_q4k_row added to the lane's
 * accumulator, then y[r * out + o] = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) by three
 * shuffles over the 8 lanes (quant_dot.c fin8). No cross-lane work in the loop, no shared
 * memory. rows <= R (the accumulators in registers), in % 256 == 0, rows of row_bytes bytes
 * 16-byte aligned; blockDim a multiple of 32, any grid. */
template <int R>
KV_GLOBAL void kv_k_gemv_q4k(const unsigned char *W, size_t row_bytes, const signed char *aq,
                             const float *ad, const short *as, float *y, int rows, int in,
                             int out) {
    int nb = in / 256, j = kv_tid() % 8, per = kv_bdim() / 8;
    for (int o0 = kv_bid() * per; o0 < out; o0 += kv_gdim() * per) {
        int o = o0 + kv_tid() / 8, live = o < out;
        const unsigned char *wr = W + (size_t)(live ? o : out - 1) * row_bytes;
        float acc[R];
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int b0 = j; b0 < nb; b0 += 16) {
            unsigned v[2][9][4];
            KV_UNROLL
            for (int u = 0; u < 2; u++)
                if (b0 + 8 * u < nb)
                    for (int k = 0; k < 9; k++)
                        kv_load16(wr + (size_t)(b0 + 8 * u) * 144 + 16 * k, v[u][k]);
            KV_UNROLL
            for (int u = 0; u < 2; u++) {
                int b = b0 + 8 * u;
                if (b >= nb) break;
                kv_q4k_blk blk;
                kv_q4k_decode(v[u], blk);
                for (int r = 0; r < R && r < rows; r++) {
                    size_t ab = (size_t)r * (size_t)nb + (size_t)b;
                    acc[r] =
                        kv_fadd_rn(acc[r], kv_q4k_row(blk, aq + 256 * ab, as + 16 * ab, ad[ab]));
                }
            }
        }
        KV_UNROLL
        for (int r = 0; r < R && r < rows; r++) {
            float a = acc[r];
            for (int m = 4; m > 0; m /= 2) a = kv_fadd_rn(a, kv_shfl_xor(a, m));
            if (j == 0 && live) y[(size_t)r * (size_t)out + (size_t)o] = a;
        }
    }
}

/* A lane's share of a Q6_K super-block for kv_k_gemv_qk: 16 lanes per super-block (lane t =
 * 0 .. 15), each loading its quants and scale once (kv_qk_load), then per row of x one exact
 * integer from 4 dp4a (kv_qk_dot, summed over the group) and the CPU's fp32 expression of the
 * super-block (kv_qk_finish). bytes: the super-block's size.
 * Q6_K (210 bytes: ql [128] low nibbles, qh [64] 2-bit highs, 16 int8 scales, f16 d at 208;
 * for half h and l < 32 the elements 128 h + 32 p + l, p = 0 .. 3, are (ql[64 h + l + 32 (p &
 * 1)] >> 4 (p >> 1)) & 15 | ((qh[32 h + l] >> 2 p) & 3) << 4, minus 32): lane t holds the 16
 * elements of group G = t of 16 (h = t / 8, p = (t / 2) % 4, l from 16 (t % 2)): 16 bytes of ql
 * and of qh as 16-bit loads (the 210-byte blocks allow no wider alignment), its int8 scale;
 * i0 = sc_G * (sum q qx - 32 s16_G) (quant_dot.c i6k_c), f = (dx * d) * I. */
struct kv_q6k_lane {
    static const int bytes = 210;
    int q[4], sc;
    float d;
};

KV_DEVICE void kv_qk_load(kv_q6k_lane &p, const unsigned char *blk, int t) {
    int h = t / 8, part = (t / 2) % 4, l0 = 16 * (t % 2);
    const unsigned char *ql = blk + 64 * h + 32 * (part & 1) + l0, *qh = blk + 128 + 32 * h + l0;
    for (int k = 0; k < 4; k++) {
        unsigned lw = kv_ld_u16(ql + 4 * k) | kv_ld_u16(ql + 4 * k + 2) << 16;
        unsigned hw = kv_ld_u16(qh + 4 * k) | kv_ld_u16(qh + 4 * k + 2) << 16;
        unsigned lo = (part >> 1 ? lw >> 4 : lw) & 0x0f0f0f0fu;
        p.q[k] = (int)(lo | ((hw >> (2 * part)) & 0x03030303u) << 4);
    }
    p.sc = (int)(signed char)blk[192 + t];
    p.d = kv_q_hw(blk + 208);
}

KV_DEVICE void kv_qk_dot(const kv_q6k_lane &p, int t, const signed char *xq, const short *s16,
                         int *i0) {
    unsigned xv[4];
    kv_load16(xq + 16 * t, xv);
    int s = 0;
    for (int k = 0; k < 4; k++) s = kv_dp4a(p.q[k], (int)xv[k], s);
    *i0 = p.sc * (s - 32 * (int)s16[t]);
}

KV_DEVICE float kv_qk_finish(const kv_q6k_lane &p, float dx, int isum) {
    return kv_fmul_rn(kv_fmul_rn(dx, p.d), (float)isum);
}

/* The CPU's final sum of the 8 block-lane accumulators (quant_dot.c fin8). */
KV_DEVICE float kv_fin8(const float *a) {
    return kv_fadd_rn(kv_fadd_rn(kv_fadd_rn(a[0], a[4]), kv_fadd_rn(a[2], a[6])),
                      kv_fadd_rn(kv_fadd_rn(a[1], a[5]), kv_fadd_rn(a[3], a[7])));
}

/* Q6_K weights (K: kv_q6k_lane) against activations quantised by kv_k_quantize_q8k (aq, ad,
 * as: rows x in / 256 blocks), with the bits of the CPU's integer dots (quant_dot.c dot_q6_k_c):
 * per super-block b of W row o and row r of x the exact integers of kv_qk_dot summed over the 16
 * lanes, f_b = kv_qk_finish (fp32, no FMA), added to accumulator b mod 8 in block order, y[r * out
 * + o] = ((a0 + a4) + (a2 + a6))
 * + ((a1 + a5) + (a3 + a7)). rows <= R (R a template parameter: the accumulators stay in
 * registers), in % 256 == 0. Grid: a block of KV_K_GEMV_THREADS (128, required) threads per
 * output row, grid-stride; 8 groups of 16 lanes, group j taking super-blocks j, j + 8, ... (the
 * CPU's accumulator j), two per iteration with both loads issued first, 4 dp4a per row, the
 * group's integer summed by 4 shuffles; lanes past the row's end join the shuffles with
 * zeros (the warp's two groups run the same trip count). */
template <typename K, int R>
KV_GLOBAL void kv_k_gemv_qk(const unsigned char *W, size_t row_bytes, const signed char *aq,
                            const float *ad, const short *as, float *y, int rows, int in, int out) {
    KV_SHARED_ARRAY(float, red, R * 8);
    int nb = in / 256, t = kv_tid() % 16, j = kv_tid() / 16, jw = j & ~1;
    for (int o = kv_bid(); o < out; o += kv_gdim()) {
        const unsigned char *wr = W + (size_t)o * row_bytes;
        float acc[R];
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int b0 = j, bw = jw; bw < nb; b0 += 16, bw += 16) {
            K p[2];
            KV_UNROLL
            for (int u = 0; u < 2; u++)
                if (b0 + 8 * u < nb) kv_qk_load(p[u], wr + (size_t)(b0 + 8 * u) * K::bytes, t);
            KV_UNROLL
            for (int u = 0; u < 2; u++) {
                int b = b0 + 8 * u;
                if (bw + 8 * u >= nb) break; /* uniform over the warp */
                for (int r = 0; r < R && r < rows; r++) {
                    size_t ab = (size_t)r * (size_t)nb + (size_t)b;
                    int i0 = 0;
                    if (b < nb) kv_qk_dot(p[u], t, aq + 256 * ab, as + 16 * ab, &i0);
                    for (int m = 8; m > 0; m /= 2) i0 += kv_shfl_xor(i0, m);
                    if (b < nb) acc[r] = kv_fadd_rn(acc[r], kv_qk_finish(p[u], ad[ab], i0));
                }
            }
        }
        if (t == 0)
            for (int r = 0; r < R && r < rows; r++) red[r * 8 + j] = acc[r];
        kv_syncthreads();
        if (kv_tid() < R && kv_tid() < rows)
            y[(size_t)kv_tid() * (size_t)out + (size_t)o] = kv_fin8(red + kv_tid() * 8);
        kv_syncthreads();
    }
}

/* dst[r * in + i] = W[r0 + r, i] dequantised, r < n_rows: one thread per element; any grid. */
KV_GLOBAL void kv_k_dequant_rows(const unsigned char *W, int t, size_t row_bytes, int in, int r0,
                                 int n_rows, float *dst) {
    size_t total = (size_t)n_rows * (size_t)in;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        size_t r = x / (size_t)in;
        dst[x] = kv_q_elem(t, W + ((size_t)r0 + r) * row_bytes, (int)(x % (size_t)in));
    }
}

/* dst[i] = x[i] rounded to nearest even in binary16 (t = KV_DT_F16, beyond +-65504 saturating
 * as kv_f32_to_f16) or bfloat16 (t = KV_DT_BF16), n values; any grid. */
KV_GLOBAL void kv_k_to_16(const float *x, uint16_t *dst, size_t n, int t) {
    for (size_t i = (size_t)kv_bid() * kv_bdim() + kv_tid(); i < n;
         i += (size_t)kv_gdim() * kv_bdim()) {
        if (t == KV_DT_F16) {
            dst[i] = kv_f32_to_f16(x[i]);
        } else {
            uint32_t b;
            memcpy(&b, &x[i], sizeof b);
            if ((b & 0x7fffffffu) > 0x7f800000u)
                dst[i] = (uint16_t)((b >> 16) | 0x40u); /* NaN stays NaN */
            else
                dst[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
        }
    }
}

/* out[r] = row idx[r] of the embedding W (rows of row_bytes bytes in type t, dim elements),
 * dequantised. Grid: one block per row. */
KV_GLOBAL void kv_k_gather_rows_typed(float *out, const unsigned char *W, int t, size_t row_bytes,
                                      const int *idx, int dim) {
    int r = kv_bid();
    const unsigned char *s = W + (size_t)idx[r] * row_bytes;
    for (int i = kv_tid(); i < dim; i += kv_bdim())
        out[(size_t)r * (size_t)dim + i] = kv_q_elem(t, s, i);
}

#endif
