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
