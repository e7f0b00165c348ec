/* Internal to runtime/: scalar conversions of IEEE half precision (binary16) and bfloat16 to
 * fp32, used by the GGUF and safetensors loaders when they dequantise on load.
 *
 * binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals, infinities and NaN
 * are converted exactly (every binary16 value is representable in fp32).
 * bfloat16: the upper 16 bits of an fp32, so the conversion is a shift.
 * Inputs are the raw little-endian 16-bit patterns. Pure functions, no state.
 */
#ifndef KVPLAN_RUNTIME_F16_H
#define KVPLAN_RUNTIME_F16_H

#include <stdint.h>
#include <string.h>

static inline float kv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign; /* signed zero */
        } else {         /* subnormal: renormalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            man &= 0x3ffu;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / NaN */
    } else {
        bits = sign | ((exp + (127 - 15)) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float kv_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Load a little-endian uint16 from an unaligned byte pointer. */
static inline uint16_t kv_load_u16le(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

#endif
