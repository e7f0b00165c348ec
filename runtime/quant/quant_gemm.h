/* Internal to runtime/: the quantised-activation integer GEMM behind kv_qmatmul's prefill path:
 * y[rows, out] = x[rows, in] W^T for weights in Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K or Q6_K, when many rows of x meet each weight row (prompt prefill, chunk
 * scoring, p-blocks above KV_QINT_MAX_ROWS).
 *
 * The scheme is the one of ggml-cpu's repacked GEMMs (ggml/src/ggml-cpu/repack.cpp: weights
 * interleaved 8 rows at a time so that one vector holds 4 bytes of each of 8 weight rows, an
 * activation quantised to 8 bits with a per-32 scale, broadcast 4 bytes at a time); the block
 * records, the per-call packing and the floating-point order below are kvplan's own.
 *
 * Activations: each row of x is quantised to blocks of 32 (for every covered type, K-quants
 * included): d = max|x| / 127, q = round-to-nearest-even(x / d) in [-127, 127] (the arithmetic
 * of quant_dot.c's quantiser), s = sum q, ds = d * (float)s.
 *
 * Weights: each block of 32 weights of a W row is read as w_j = a * (u_j - off) + m with u_j
 * unsigned bytes, a and m fp32, off an integer of the type:
 *   Q8_0: u = q + 128, off 128, a = d, m = 0    Q4_0: u = nibble, off 8, a = d, m = 0
 *   Q5_0: u = 5-bit q, off 16, a = d, m = 0     Q4_1, Q5_1: u = q, off 0, a = d, m = m
 *   Q4_K, Q5_K (sub-block s of 32): u = q, off 0, a = d * (float)sc_s, m = -(dmin * (float)m_s)
 *   Q6_K (scales per 16): u = 6-bit q, off 32, a = d * sc of the first 16, a2 = d * sc of the
 *   second 16 (kept in m's place; Q6_K has no min)
 *
 * Result, the same bits on every kernel (portable C reference, AVX2, AVX-512 VNNI), every thread
 * count and every batch (each output depends only on its x row and W row): with I_b = the exact
 * integer sum_j (u_j - off) q_j of block b,
 *   acc = 0; for b = 0 .. in/32 - 1:  acc = fma(a_b * d_b, (float)I_b, acc);
 *                                     if the type has m: acc = fma(m_b, ds_b, acc)
 * (Q6_K: I_b of the first 16 elements with a_b, then acc = fma(a2_b * d_b, (float)I2_b, acc)
 * with I2_b the second 16's),
 *   y = acc
 * (fma: one rounding, fmaf in C, vfmadd in the kernels; a_b * d_b one fp32 product). */
#ifndef KVPLAN_RUNTIME_QUANT_GEMM_H
#define KVPLAN_RUNTIME_QUANT_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/quant.h"

/* 1 when type t has the integer GEMM (the types listed above), else 0. */
int kv_qgemm_covers(kv_dtype t);

/* Bytes of the quantised activation rows for `rows` rows of `in` elements (in a multiple of
 * 32): the rows padded to a multiple of 2 (the pad rows are zeros), each row a multiple of 64
 * bytes. */
size_t kv_qgemm_act_bytes(int rows, int in);

/* Quantise x [rows, in] fp32 into act (kv_qgemm_act_bytes(rows, in) bytes, caller-owned) for
 * weights of type wt, as described above (per block also -off * s, the start of the integer
 * sum); the same bytes on every isa. */
void kv_qgemm_quantize(kv_dtype wt, const float *x, int rows, int in, void *act);

/* Bytes of one thread's weight panel for a chunk of `cs` W rows of `in` elements. */
size_t kv_qgemm_panel_bytes(int cs, int in);

/* Outputs o0 .. o1 - 1 of every row of y [rows, out] from act (kv_qgemm_quantize of x) and W
 * (out rows of type wt), on isa (kv_isa_available(isa) assumed): the chunk's W rows are packed
 * into panel (kv_qgemm_panel_bytes(o1 - o0, in) bytes, the calling thread's), then multiplied.
 * KV_ISA_PORTABLE runs kv_qgemm_ref's arithmetic. */
void kv_qgemm_range(float *y, const void *act, const void *w, kv_dtype wt, int rows, int in,
                    int out, int o0, int o1, void *panel, kv_isa isa);

/* The portable reference: y [rows, out] straight from the weight blocks, one output at a time,
 * in the order above (the bits every kernel must reproduce). */
void kv_qgemm_ref(float *y, const void *act, const void *w, kv_dtype wt, int rows, int in, int out);

#endif
