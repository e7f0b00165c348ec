/* Internal to runtime/quant: the weight types' traits table, one row per ggml type id (as
 * ggml's type_traits): the type's name, its block facts (quant_types.h) and its kernels
 * (quant_kernels.h), the ISA-specific ones in a small array indexed by kv_isa. Every per-type
 * decision of the room reads a row: the public type table (kv_dtype_*), dequantisation,
 * quantisation, the fp32 and integer dots and the integer GEMM's repack. The rows are expanded
 * from KV_QTYPES, so adding a type is one line there and its kernels. */
#ifndef KVPLAN_RUNTIME_QUANT_TRAITS_H
#define KVPLAN_RUNTIME_QUANT_TRAITS_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/quant.h"
#include "quant/quant_dot.h"
#include "quant/quant_types.h"

/* kv_isa's values: the length of a row's per-ISA kernel arrays. */
#define KV_ISA_COUNT 3

/* A row of n elements at p dequantised into dst [n] (n a multiple of the block). */
typedef void (*kv_qdequant_fn)(const uint8_t *p, float *dst, int64_t n);
/* src [n] fp32 quantised into one row at dst. */
typedef void (*kv_qquantize_fn)(const float *src, uint8_t *dst, int64_t n);
/* sum w[i] x[i] of a typed row w [n] and fp32 x [n], accumulated in fp32. */
typedef float (*kv_qrowdot_fn)(const uint8_t *w, const float *x, int64_t n);
/* Block b (of 32) of a weight row as the integer GEMM reads it: u [32], a, m (quant_gemm.h). */
typedef void (*kv_qrepack_fn)(const uint8_t *row, int b, uint8_t *u, float *a, float *m);
/* W rows o .. min(o + 8, o1) - 1 (rb bytes apart, nb blocks of 32) into one packed strip at P. */
typedef void (*kv_qpack_fn)(const uint8_t *W, size_t rb, int o, int o1, int nb, uint8_t *P);

typedef struct kv_qtraits {
    const char *name; /* "Q4_K"; ggml's name for a type kvplan does not read */
    kv_qblock b;      /* block facts; all 0 for a type kvplan does not read */
    /* the kernels; NULL where the type or the ISA has none ([KV_ISA_AVX512_VNNI] of the fp32
     * kernels is the AVX2 one; the AVX2 and VNNI entries are NULL off x86-64) */
    kv_qdequant_fn dequant[KV_ISA_COUNT]; /* [PORTABLE] the reference; the others its bits */
    kv_qquantize_fn quantize;             /* the reference quantiser (include/kvplan/quant.h) */
    kv_qrowdot_fn dot[KV_ISA_COUNT];      /* kv_dot_row: fp32 activations */
    kv_qdot_fn qdot[KV_ISA_COUNT];        /* the integer dot (quant_dot.h): 8-bit activations */
    kv_qrepack_fn repack;                 /* the integer GEMM's block unpack (its reference) */
    kv_qpack_fn pack[KV_ISA_COUNT];       /* its strip packer ([PORTABLE] NULL: no strips) */
} kv_qtraits;

/* The row of ggml type id t: a supported type's full row, a name-only row for the other ids of
 * ggml.h, an "unknown" row past them. Static, never NULL. */
const kv_qtraits *kv_qtraits_get(kv_dtype t);

#endif
