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

/* One (sequence, KV head) of one layer step for the attention op: the n new queries of the
 * group's g query heads are rows row0 .. row0 + n - 1; query i attends entries 0 .. len - n + i
 * of the head (retained + the new ones, causal). table, pos, acc, acc2 are the head's host
 * metadata (kv_head); acc/acc2 are NULL when the head does not track statistics. */
typedef struct kv_attn_task {
    int row0, n, kv_head;
    int len;
    const int *table;
    const int *pos;
    float *acc, *acc2;
} kv_attn_task;

/* The new K/V row of one (row, KV head) goes to `slot` of the pool's storage. */
typedef struct kv_slot_write {
    int row, kv_head, slot;
} kv_slot_write;

typedef struct kv_backend kv_backend;

typedef struct kv_backend_ops {
    const char *name;
    void (*destroy)(kv_backend *b);
    /* K/V block storage of a pool whose metadata is initialised (kv_pool_init_meta). */
    int (*storage_alloc)(kv_backend *b, kv_pool *pool, kv_error *err);
    void (*storage_free)(kv_backend *b, kv_pool *pool);
    /* x[r] = embedding of tokens[r], r < rows (ids already checked). */
    int (*embed)(kv_backend *b, const int *tokens, int rows, kv_error *err);
    /* q, k, v of layer `layer` for `rows` rows at positions pos[rows]. */
    int (*qkv)(kv_backend *b, int layer, int rows, const int *pos, kv_error *err);
    /* Apply an eviction move list to the pool's storage, in order. */
    int (*gather)(kv_backend *b, kv_pool *pool, const kv_move *moves, int n, kv_error *err);
    /* Store the new rows' K and V (from qkv) into their slots. */
    int (*cache_write)(kv_backend *b, kv_pool *pool, const kv_slot_write *w, int n, kv_error *err);
    /* Paged attention over the tasks' block tables; o [rows, H * d_h]; statistics of tracked
     * heads accumulated (summed over the GQA group) in the same pass. */
    int (*attention)(kv_backend *b, const kv_pool *pool, const kv_attn_task *tasks, int n_tasks,
                     kv_error *err);
    /* x += W_o o (with the hooks' after_attn before the residual when given). */
    int (*out_residual)(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err);
    /* x += W_down (silu(W_gate n) * (W_up n)), n = RMSNorm(x); then hooks' after_block. */
    int (*ffn)(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err);
    /* out [n_sel, vocab] = classifier(RMSNorm(x[rows[i]])) for the selected rows. */
    int (*logits)(kv_backend *b, const int *rows, int n_sel, float *out, kv_error *err);
} kv_backend_ops;

/* The common head of every backend instance; a backend embeds it first in its own struct. */
struct kv_backend {
    const kv_backend_ops *ops;
    const kv_model *model; /* not owned */
    kv_device device;
    int max_rows; /* rows one step may hold */
    int max_ctx;  /* positions 0 .. max_ctx - 1 (RoPE tables, score rows) */
    /* the driver's scratch, sized by kv_backend_base_init and owned by the instance */
    int *row_pos;          /* [max_rows] */
    kv_attn_task *tasks;   /* [max_rows * H_kv] */
    kv_slot_write *writes; /* [max_rows * H_kv] */
    kv_moves moves;        /* grows as eviction needs */
};

/* For backend implementations: fill the common head and allocate the driver's scratch.
 * KV_EINPUT for max_rows or max_ctx < 1; KV_EINTERNAL memory. */
int kv_backend_base_init(kv_backend *b, const kv_backend_ops *ops, const kv_model *m, kv_device dev,
                         int max_rows, int max_ctx, kv_error *err);
/* Release the common head's scratch (called by kv_backend_free). */
void kv_backend_base_free(kv_backend *b);

/* A backend for `m` on device `dev` (auto/cpu/cuda, kv_device_resolve) with buffers for
 * `max_rows` rows a step and positions below `max_ctx`. Caller owns *out (kv_backend_free).
 * KV_EINPUT for max_rows or max_ctx < 1 or an unavailable device; KV_EINTERNAL memory. */
int kv_backend_new(const kv_model *m, kv_device dev, int max_rows, int max_ctx, kv_backend **out,
                   kv_error *err);
void kv_backend_free(kv_backend *b);

/* The CPU backend (runtime/backend/backend_cpu.c). */
int kv_backend_cpu_new(const kv_model *m, int max_rows, int max_ctx, kv_backend **out,
                       kv_error *err);

/* A pool of n_blocks blocks whose storage lives where backend `b` computes (host memory for
 * the CPU backend). Release with kv_backend_pool_destroy. */
int kv_backend_pool_init(kv_backend *b, kv_pool *p, int n_blocks, int block_size, int head_dim,
                         kv_error *err);
/* The same with counts[t] blocks of each KV storage type t (kvplan/kvcache.h). Only the CPU
 * backend stores types other than f32 today; another backend gets KV_EINPUT naming the type
 * and --kv-type f32. */
int kv_backend_pool_init_typed(kv_backend *b, kv_pool *p, const int *counts, int block_size,
                               int head_dim, kv_error *err);
void kv_backend_pool_destroy(kv_backend *b, kv_pool *p);

#ifdef __cplusplus
}
#endif
#endif
