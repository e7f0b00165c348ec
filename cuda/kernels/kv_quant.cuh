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
