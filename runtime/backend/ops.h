/* Internal to runtime/: the dense kernels of the Llama layer shared by the forward pass
 * (forward.c) and the KVPR executor (kvpr_exec.c), so both compute the same arithmetic.
 * Shapes are row-major; weights are [out, in] (include/kvplan/model.h). */
#ifndef KVPLAN_RUNTIME_OPS_H
#define KVPLAN_RUNTIME_OPS_H

#include "kvplan/model.h"

/* RoPE tables for positions 0..n_pos-1: cos/sin [n_pos, d_h/2], angle = pos * base^(-2i/d_h),
 * computed in double (Su et al. 2021). */
void kv_op_rope_tables(const kv_config *c, int n_pos, float *cos_out, float *sin_out);

/* Rotate the n_heads heads [n_heads * hd] of one row by one position's cos/sin [hd/2], in the
 * model's layout: pairs (2i, 2i+1) or (i, i + hd/2). */
void kv_op_rope_row(float *v, int n_heads, int hd, const float *cs, const float *sn,
                    kv_rope_layout layout);

/* out[r] = x[r] / rms(x[r]) * w for rows x dim (sum of squares in double). */
void kv_op_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps);

/* A caller-owned scratch buffer for the typed matmuls (kv_qmatmul's dequantised tiles and
 * quantised activation rows), sized by kv_model_matmul_scratch_threads for the most rows a call
 * will have and the pool's threads, and the pool that runs them (NULL: the calling thread). */
typedef struct kv_op_scratch {
    float *p;
    size_t n; /* floats */
    kv_workers *pool;
    int rowwise; /* 1: every matmul on its per-row path (kv_qmatmul_rowwise_pool) */
} kv_op_scratch;

/* y[rows, out] = x[rows, in] W^T, W [out, in] in its own type (kv_qmatmul, runtime/quant/quant.c):
 * F32 weights take one sgemv per row for up to 4 rows (sgemm's packing of W costs more than the
 * work for a handful of rows) and sgemm above; quantised types the integer dots with 8-bit
 * activations up to 16 rows, F16 / BF16 a typed fp32 dot per (row, output) up to 4
 * rows; above those, dequantised tiles of W in `s` and sgemm. With s->rowwise the per-row paths
 * for any rows (each row's bits those of a call with that row alone). */
void kv_op_matmul(float *y, const float *x, kv_weight w, int rows, int in, int out,
                  const kv_op_scratch *s);

/* y[r] += b for rows x n; nothing when b is NULL. */
void kv_op_add_bias(float *y, const float *b, int rows, int n);

/* The SwiGLU feed-forward sub-block with its residual, for rows x dim:
 * x += W_down (silu(W_gate n) * (W_up n)), n = RMSNorm(x) * ffn_norm. Scratch: xb [rows, dim],
 * hb and hb2 [rows, hidden]. */
void kv_op_ffn_residual(const kv_layer_weights *w, const kv_config *c, float *x, float *xb,
                        float *hb, float *hb2, int rows, const kv_op_scratch *s);

#endif
