/* kvplan backend: the ops table the engine's driver (kv_forward) calls at layer-step
 * granularity, and the devices that implement it (docs/design.md "One engine, one plan, several
 * backends").
 *
 * The driver, the block-table metadata (kvplan/kvcache.h), the policies' choices and the
 * eviction schedule are backend-neutral C. A backend owns the arithmetic and the storage: the
 * activations of one step ([rows, ...] buffers, rows = the step's tokens, sequence-major), the
 * K/V block storage of a pool, and the weights as it needs them. One step of layer l is
 *   qkv (RMSNorm, Q/K/V GEMMs, bias, RoPE at each row's position)
 *   -> gather (eviction: the schedule's move list, one call for all heads)
 *   -> cache_write (the new rows' K/V into their slots)
 *   -> attention (per (sequence, KV head) over its block table, policy statistics in the pass)
 *   -> out_residual (W_o GEMM, hooks, residual) -> ffn (RMSNorm, SwiGLU, residual);
 * embed before the first layer, logits after the last.
 *
 * Backends: cpu (BLAS + C kernels, runtime/backend/backend_cpu.c) and cuda (cuBLAS + kernels,
 * cuda/, when built with a CUDA toolkit and a device is present). A backend instance is not shared
 * between threads. Errors travel as kv_error; no backend calls exit().
 */
#ifndef KVPLAN_BACKEND_H
#define KVPLAN_BACKEND_H

#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef enum { KV_DEVICE_AUTO = 0, KV_DEVICE_CPU = 1, KV_DEVICE_CUDA = 2 } kv_device;

/* "auto", "cpu", "cuda". */
const char *kv_device_name(kv_device d);
/* Parse --device; KV_EINPUT names the bad value. */
int kv_device_parse(const char *s, kv_device *out, kv_error *err);
/* The device `d` resolves to here: auto -> cuda when a CUDA backend is built and a device is
 * present, else cpu. cuda without a built backend or a device -> KV_EINPUT with one line
 * saying which is missing and to use --device cpu. */
int kv_device_resolve(kv_device d, kv_device *out, kv_error *err);

/* Observation points for the profiler (BaKlaVa Alg. 1, SqueezeAttention). All arrays are
 * host memory, row-major over the rows of this step (sequence-major), valid only during the
 * callback. */
typedef struct kv_hooks {
    void *user;
    /* After layer `layer`'s attention:
     *   x_in     [rows, dim]      residual stream entering the layer (x_l)
     *   o_heads  [rows, H * d_h]  softmax(QK^T/sqrt(d_h)) V per query head, before W_o
     *   v_new    [rows, H_kv*d_h] the new tokens' V
     *   attn_out [rows, dim]      W_o o_heads (Attn_l(RMSNorm(x_l))) */
    void (*after_attn)(void *user, int layer, int rows, const float *x_in, const float *o_heads,
                       const float *v_new, const float *attn_out);
    /* After the whole block: x_out [rows, dim] = x_{l+1}. */
    void (*after_block)(void *user, int layer, int rows, const float *x_out);
} kv_hooks;

/* A backend instance: opaque outside the runtime (its ops table and common head are in
 * runtime/backend/backend_impl.h, for backend implementations). */
typedef struct kv_backend kv_backend;

/* A backend for `m` on device `dev` (auto/cpu/cuda, kv_device_resolve) with buffers for
 * `max_rows` rows a step and positions below `max_ctx`. Caller owns *out (kv_backend_free).
 * KV_EINPUT for max_rows or max_ctx < 1 or an unavailable device; KV_EINTERNAL memory. */
int kv_backend_new(const kv_model *m, kv_device dev, int max_rows, int max_ctx, kv_backend **out,
                   kv_error *err);
/* The same with n_threads CPU threads for the CPU backend's matmuls and attention (one
 * persistent pool, kvplan/workers.h; <= 0: the CPUs available, kv_cpus_available). The
 * results are the same bits for every thread count. KV_EINPUT for more than KV_WORKERS_MAX. */
int kv_backend_new_threads(const kv_model *m, kv_device dev, int max_rows, int max_ctx,
                           int n_threads, kv_backend **out, kv_error *err);
void kv_backend_free(kv_backend *b);
/* Attention work the backend's steps have held since it was created: the (query row, KV head,
 * cached entry) triples of every attention task, a task of n new rows over len entries counting
 * n * len - n * (n - 1) / 2 (causal). It measures what a KV budget removes: the plan's tokens
 * attend fewer entries, the rest of a token's work (matmuls, sampling) is the same. Read on
 * the thread that runs the steps (no lock). */
unsigned long long kv_backend_attended(const kv_backend *b);

/* A pool of n_blocks blocks whose storage lives where backend `b` computes (host memory for
 * the CPU backend). Release with kv_backend_pool_destroy. */
int kv_backend_pool_init(kv_backend *b, kv_pool *p, int n_blocks, int block_size, int head_dim,
                         kv_error *err);
/* The same with counts[t] blocks of each KV storage type t (kvplan/kvcache.h). Every backend
 * stores every type in the same layout and bytes (the CUDA backend on its device). Errors as
 * kv_pool_init_meta_typed and the backend's storage allocation (KV_EINTERNAL out of memory). */
int kv_backend_pool_init_typed(kv_backend *b, kv_pool *p, const int *counts, int block_size,
                               int head_dim, kv_error *err);
void kv_backend_pool_destroy(kv_backend *b, kv_pool *p);
/* Head h's positions and statistics into its host arrays h->pos, acc, acc2 [h->len] (the entry
 * order) from wherever backend b keeps them: a pool with device_meta (the CUDA backend) holds
 * them by slot on its device, and this copies them back with one wait; a host pool's arrays
 * already hold them (nothing is done). For tests and inspection, never per step. KV_EINTERNAL
 * when the copy fails or memory runs out. */
int kv_backend_read_head_meta(kv_backend *b, const kv_pool *p, kv_head *h, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
