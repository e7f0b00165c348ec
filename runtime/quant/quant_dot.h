/* Internal to runtime/: integer dot products of quantised weight rows with an activation row
 * quantised to 8 bits, the decode / prefill kernels behind kv_qmatmul
 * (include/kvplan/quant.h). The scheme is ggml's (ggml/src/ggml-cpu: the activation row is
 * converted once to Q8_0 blocks for the 32-element types and to Q8_K blocks for the K-quants,
 * then every weight row is multiplied with it in integer arithmetic); the layouts of the
 * activation blocks and the floating-point order below are kvplan's own.
 *
 * Activation row of n elements (n a multiple of the weight type's block), one byte buffer:
 *   - "A" (for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): q int8 [n] at offset 0, then d float [n / 32]
 *     and s int32 [n / 32] (the sum of the block's q); block b holds x[32b .. 32b + 32) ~=
 *     d[b] * q, d = max|x| / 127, q = round-to-nearest-even(x / d) in [-127, 127].
 *   - "K" (for Q4_K, Q5_K, Q6_K): q int8 [n], d float [n / 256], s int16 [n / 16] (sums of q
 *     over groups of 16); blocks of 256, d = max|x| / 127 per block, q as above.
 * -127..127 (never -128) keeps every AVX2 maddubs pair sum below 2^15 (no saturation).
 *
 * Bit-identical results on every kernel (portable C, AVX2, AVX-512 VNNI): each block's dot is
 * an exact integer I_b; its float contribution f_b is a fixed expression of I_b and the block
 * scales (mul and add only, no FMA; the library is built with -std=c11, which turns contraction
 * off in GCC, and clang is told so below), added to lane b mod 8 of 8 accumulators in block
 * order; the result is ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
 *   Q8_0:  f = (dw * dx) * I,              I = sum qw qx
 *   Q4_0:  f = (dw * dx) * I,              I = sum nib qx - 8 s
 *   Q5_0:  f = (dw * dx) * I,              I = sum q5 qx - 16 s
 *   Q4_1, Q5_1: f = (dw * dx) * I + m * (dx * s),   I = sum q qx
 *   Q4_K, Q5_K: f = (dx * d) * Isc - (dx * dmin) * Im,  Isc = sum_sub sc * sum q qx,
 *          Im = sum_sub m * s_sub
 *   Q6_K:  f = (dx * d) * I,  I = sum_16 sc * (sum q6 qx - 32 s_16)
 * with dw, m, d, dmin the weight block's f16 fields as fp32 and dx the activation block's d.
 */
#ifndef KVPLAN_RUNTIME_QUANT_DOT_H
#define KVPLAN_RUNTIME_QUANT_DOT_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/quant.h"

/* Activation layout a weight type's integer dot wants: 0 none (F32, F16, BF16: fp32
 * activations), 'A' (Q8_0-style blocks of 32) or 'K' (Q8_K-style blocks of 256). */
int kv_qdot_act_kind(kv_dtype t);

/* Bytes of one quantised activation row of n elements for weight type t (0 for kind 0);
 * a multiple of 64, so rows placed one after another stay 64-byte apart. */
size_t kv_qdot_act_bytes(kv_dtype t, int n);

/* Quantise x [n] fp32 into act (kv_qdot_act_bytes(t, n) bytes) in t's layout: the portable C
 * quantiser or its AVX2 form on kv_isa_best() (kv_qdot_quantize_act_isa: the one of `isa`;
 * AVX2 and VNNI share the AVX2 form). Every form writes the same bytes (test_quant compares
 * them through kv_dot_row_q8), so every kernel sees the same activation row. Non-finite x:
 * the caller's problem (as kv_quantize_row). */
void kv_qdot_quantize_act(kv_dtype t, const float *x, int n, void *act);
void kv_qdot_quantize_act_isa(kv_dtype t, const float *x, int n, void *act, kv_isa isa);

/* One weight row w of type t (n elements) times a quantised activation row. */
typedef float (*kv_qdot_fn)(const uint8_t *w, const void *act, int n);

/* The kernel for type t on instruction set isa: the qdot entry of t's traits row
 * (quant_traits.h; defined with the table, quant_traits.c); NULL when t has no integer dot or
 * the CPU lacks the isa (kv_isa_available). */
kv_qdot_fn kv_qdot_kernel(kv_dtype t, kv_isa isa);

/* Paths of kv_qmatmul for quantised types (defined in quant.c), for the benchmark: the integer
 * dots for every row
 * (act: rows * kv_qdot_act_bytes bytes, caller-owned), or the dequantised F32 tile + sgemm
 * (scratch: kv_qmatmul_scratch_floats floats). */
void kv_qmatmul_int(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in, int out,
                    void *act);
/* Outputs o0 .. o1 - 1 of the integer path from rows already quantised into act (rows *
 * kv_qdot_act_bytes(wt, in) bytes): one chunk of a pooled kv_qmatmul. */
void kv_qmatmul_int_range(float *y, const void *act, const void *w, kv_dtype wt, int rows, int in,
                          int out, int o0, int o1);
void kv_qmatmul_tiles(float *y, const float *x, const void *w, kv_dtype wt, int rows, int in,
                      int out, float *scratch);

#endif
