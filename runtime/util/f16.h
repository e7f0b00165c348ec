/* Internal to runtime/: scalar conversions of IEEE half precision (binary16) and bfloat16 to
 * fp32, used by the GGUF and safetensors loaders when they dequantise on load, and fp32 to
 * binary16 for the F16 / q8 / q4 KV cache rows (runtime/cache/kvtype.h).
 *
 * binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals, infinities and NaN
 * are converted exactly (every binary16 value is representable in fp32).
 * bfloat16: the upper 16 bits of an fp32, so the conversion is a shift.
 * Inputs are the raw little-endian 16-bit patterns. Pure functions, no state. Under nvcc they
 * are host+device (KV_F16_FN), so the CUDA KV kernels (cuda/kernels/kv_kernels.cuh) round and
 * widen exactly as the CPU does.
 */
#ifndef KVPLAN_RUNTIME_F16_H
#define KVPLAN_RUNTIME_F16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KV_F16_FN static __host__ __device__ __forceinline__
#else
#define KV_F16_FN static inline
#endif

KV_F16_FN float kv_f16_to_f32(uint16_t h) {
    /* Branch-light: put exponent and mantissa in place and rescale by 2^(127-15); this is
     * exact for normal and subnormal halves alike. Inf/NaN get an all-ones exponent. */
    uint32_t bits = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    if ((h & 0x7c00u) == 0x7c00u) {
        bits |= 0x7f800000u;
        memcpy(&f, &bits, sizeof f);
    } else {
        memcpy(&f, &bits, sizeof f);
        f *= 0x1p112f;
    }
    memcpy(&bits, &f, sizeof bits);
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

KV_F16_FN float kv_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* fp32 -> binary16, round to nearest even. Finite values beyond the binary16 range (|x| >=
 * 65520 would round to infinity) and infinities saturate to +-65504, so a stored K/V row stays
 * finite; NaN stays NaN. Subnormal halves are produced exactly (rounded). */
KV_F16_FN uint16_t kv_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477fe000u) return (uint16_t)(sign | 0x7bffu); /* >= 65504 */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal half */
        float a;
        memcpy(&a, &ax, sizeof a);
        float r = a * 0x1p24f; /* exact: units of 2^-24, in [0, 1024) */
        uint32_t q = (uint32_t)r;
        float frac = r - (float)q;
        if (frac > 0.5f || (frac == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((((ax >> 23) - 127u + 15u) << 10) | ((ax & 0x7fffffu) >> 13));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry moves into the exponent */
    return (uint16_t)(sign | h);
}

/* Load a little-endian uint16 from an unaligned byte pointer. */
KV_F16_FN uint16_t kv_load_u16le(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

#endif
