/* kvplan KV storage types: the row codecs of the paged cache (include/kvplan/kvcache.h,
 * kv_cache_type; docs/formats.md "KV storage types"), static inline so the CPU attention
 * (runtime/backend/backend_cpu.c) decodes one row at a time into its own registers/stack and
 * never materialises an fp32 copy of the cache.
 *
 * A row is one token's K (or V) of one KV head: d_h values. Its group (the values sharing a
 * scale) is the whole row, which exists for every d_h. Layouts (little-endian halves):
 *   f32 [d_h float32]; f16 [d_h binary16];
 *   q8  [binary16 s][d_h int8 q]              x = s q,      s = max|x| / 127 (rounded up)
 *   q4  [binary16 s][binary16 m][ceil(d_h/2)] x = m + s q,  q in [0, 15], element 2i in the
 *       low nibble of byte i, m = min x (rounded down), s = (max x - m) / 15 (rounded up)
 * Rounding the scale up and the minimum down keeps every q in range, so the error of a value
 * is at most s / 2 (q8: s ~ max|x| / 127; q4: s ~ range / 15). KIVI (Liu et al. 2024) uses the
 * same asymmetric min/scale form for its 2/4-bit caches; llama.cpp's q8_0 the symmetric one.
 * Pure functions; callers own the memory. Host+device under nvcc (KV_F16_FN, util/f16.h): the
 * CUDA backend's cache-write and attention kernels (cuda/kernels/kv_kernels.cuh) encode and
 * decode rows with these same functions, so both backends store the same bytes.
 */
#ifndef KVPLAN_KVTYPE_H
#define KVPLAN_KVTYPE_H

#include "kvplan/kvcache.h"
#include "util/f16.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

KV_F16_FN size_t kvt_row_bytes(kv_cache_type t, int hd) {
    switch (t) {
    case KV_TYPE_F32:
        return 4u * (size_t)hd;
    case KV_TYPE_F16:
        return 2u * (size_t)hd;
    case KV_TYPE_Q8:
        return (size_t)hd + 2u;
    case KV_TYPE_Q4:
        return ((size_t)hd + 1u) / 2u + 4u;
    }
    return 0;
}

/* binary16 at p -> fp32, exact, written with selects instead of branches so the row loops
 * vectorise (the same values as kv_f16_to_f32; the F16 decode of attention runs it d_h times
 * per entry). Normal halves: exponent rebias by integer add; subnormal: the magic-number
 * subtraction; Inf/NaN: the all-ones exponent. */
KV_F16_FN float kvt_h2f(const unsigned char *p) {
    uint32_t h = kv_load_u16le(p);
    uint32_t o = (h & 0x7fffu) << 13, e = o & 0x0f800000u;
    o += (127u - 15u) << 23;
    uint32_t on = o + ((128u - 16u) << 23); /* Inf/NaN */
    uint32_t os = o + (1u << 23);           /* subnormal, before the correction below */
    float fs, f;
    memcpy(&fs, &os, sizeof fs);
    fs -= 0x1p-14f; /* 2^-14: the magic 113 << 23 as a float */
    uint32_t bs;
    memcpy(&bs, &fs, sizeof bs);
    o = e == 0x0f800000u ? on : e == 0 ? bs : o;
    o |= (h & 0x8000u) << 16;
    memcpy(&f, &o, sizeof f);
    return f;
}

KV_F16_FN void kvt_store_h(unsigned char *p, uint16_t h) {
    p[0] = (unsigned char)(h & 0xffu);
    p[1] = (unsigned char)(h >> 8);
}

/* The smallest binary16 >= v (v finite, within range). */
KV_F16_FN uint16_t kvt_f16_up(float v) {
    uint16_t h = kv_f32_to_f16(v);
    if (kv_f16_to_f32(h) < v) {
        if (h == 0x8000u)
            h = 0x0001u; /* -0 -> smallest positive */
        else if (h & 0x8000u)
            h--; /* negative: towards zero */
        else if (h < 0x7bffu)
            h++; /* positive: away from zero */
    }
    return h;
}

/* The largest binary16 <= v. */
KV_F16_FN uint16_t kvt_f16_down(float v) {
    uint16_t h = kv_f32_to_f16(v);
    if (kv_f16_to_f32(h) > v) {
        if (h == 0x0000u)
            h = 0x8001u;
        else if (h & 0x8000u) {
            if (h < 0xfbffu) h++;
        } else
            h--;
    }
    return h;
}

KV_F16_FN void kvt_encode(kv_cache_type t, int hd, const float *x, unsigned char *dst) {
    switch (t) {
    case KV_TYPE_F32:
        memcpy(dst, x, (size_t)hd * sizeof(float));
        return;
    case KV_TYPE_F16:
        for (int d = 0; d < hd; d++) kvt_store_h(dst + 2 * d, kv_f32_to_f16(x[d]));
        return;
    case KV_TYPE_Q8: {
        float amax = 0.0f;
        for (int d = 0; d < hd; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
        uint16_t sh = kvt_f16_up(amax / 127.0f);
        float s = kv_f16_to_f32(sh);
        kvt_store_h(dst, sh);
        signed char *q = (signed char *)(dst + 2);
        for (int d = 0; d < hd; d++) {
            long v = s > 0.0f ? lrintf(x[d] / s) : 0;
            q[d] = (signed char)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        return;
    }
    case KV_TYPE_Q4: {
        float lo = x[0], hi = x[0];
        for (int d = 1; d < hd; d++) {
            lo = x[d] < lo ? x[d] : lo;
            hi = x[d] > hi ? x[d] : hi;
        }
        uint16_t mh = kvt_f16_down(lo);
        float m = kv_f16_to_f32(mh);
        uint16_t sh = kvt_f16_up((hi - m) / 15.0f);
        float s = kv_f16_to_f32(sh);
        kvt_store_h(dst, sh);
        kvt_store_h(dst + 2, mh);
        unsigned char *q = dst + 4;
        memset(q, 0, ((size_t)hd + 1u) / 2u);
        for (int d = 0; d < hd; d++) {
            long v = s > 0.0f ? lrintf((x[d] - m) / s) : 0;
            v = v > 15 ? 15 : v < 0 ? 0 : v;
            q[d / 2] |= (unsigned char)(v << (4 * (d & 1)));
        }
        return;
    }
    }
}

KV_F16_FN void kvt_decode(kv_cache_type t, int hd, const unsigned char *src, float *x) {
    switch (t) {
    case KV_TYPE_F32:
        memcpy(x, src, (size_t)hd * sizeof(float));
        return;
    case KV_TYPE_F16:
        for (int d = 0; d < hd; d++) x[d] = kvt_h2f(src + 2 * d);
        return;
    case KV_TYPE_Q8: {
        float s = kvt_h2f(src);
        const signed char *q = (const signed char *)(src + 2);
        for (int d = 0; d < hd; d++) x[d] = s * (float)q[d];
        return;
    }
    case KV_TYPE_Q4: {
        float s = kvt_h2f(src), m = kvt_h2f(src + 2);
        const unsigned char *q = src + 4;
        for (int d = 0; d < hd; d++) x[d] = m + s * (float)((q[d / 2] >> (4 * (d & 1))) & 15u);
        return;
    }
    }
}

/* Element d of a stored row (the value kvt_decode writes to x[d]): for kernels whose threads
 * each take some of a row's elements (cuda/kernels/kv_kernels.cuh). */
KV_F16_FN float kvt_decode_at(kv_cache_type t, const unsigned char *src, int d) {
    switch (t) {
    case KV_TYPE_F32: {
        float f;
        memcpy(&f, src + 4 * d, sizeof f);
        return f;
    }
    case KV_TYPE_F16:
        return kvt_h2f(src + 2 * d);
    case KV_TYPE_Q8:
        return kvt_h2f(src) * (float)((const signed char *)(src + 2))[d];
    case KV_TYPE_Q4:
        return kvt_h2f(src + 2) + kvt_h2f(src) * (float)((src[4 + d / 2] >> (4 * (d & 1))) & 15u);
    }
    return 0.0f;
}

#endif
