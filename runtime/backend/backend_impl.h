/* kvplan backend internals: the ops table a backend implements, the common head every
 * backend instance starts with, and the constructors of the backends the registry
 * (runtime/backend/registry.c) chooses among. For backend implementations (runtime/backend/,
 * cuda/) and the driver (runtime/engine/forward.c); everything else uses the opaque kv_backend
 * of include/kvplan/backend.h. */
#ifndef KVPLAN_BACKEND_IMPL_H
#define KVPLAN_BACKEND_IMPL_H

#include "kvplan/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One (sequence, KV head) of one layer step for the attention op: the n new queries of the
 * group's g query heads are rows row0 .. row0 + n - 1; query i attends entries 0 .. len - n + i
 * of the head (retained + the new ones, causal), in that order. table, pos, acc, acc2 are the
 * head's host metadata (kv_head); acc/acc2 are NULL when the head does not track statistics.
 * mirror: the head's kv_table_mirror, for a backend that keeps block tables on its device
 * (NULL: unknown, the whole table is uploaded). wbase, wrot, n_blocks: the head's window ring
 * (kv_head; entry e is stored at kv_ring_entry(e, wbase, wrot, n_blocks * b_s - wbase),
 * runtime/cache/kvslot.h); wrot = 0 (always on pools without window_ring): entry e at e. */
typedef struct kv_attn_task {
    int row0, n, kv_head;
    int len;
    const int *table;
    const int *pos;
    float *acc, *acc2;
    kv_table_mirror *mirror;
    int wbase, wrot, n_blocks;
} kv_attn_task;

/* The new K/V row of one (row, KV head) goes to `slot` of the pool's storage. */
typedef struct kv_slot_write {
    int row, kv_head, slot;
} kv_slot_write;

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
    /* Optional (NULL: nothing to do). The end of a kv_forward step: ok = 1 after every layer
     * and the logits succeeded (results a backend still holds, e.g. attention statistics on
     * their way back, reach the heads' host arrays before it returns; KV_EINTERNAL when that
     * fails), ok = 0 after a failure (what is on its way back is dropped: the step's tracked
     * sequences are marked failed). */
    int (*end_step)(kv_backend *b, int ok, kv_error *err);
    /* Optional (NULL: the pool never records evictions, e.g. the CPU's host path). Run the
     * evictions kv_head_schedule_room recorded for a pool with device_meta (ev [n], their block
     * tables tab; include/kvplan/kvcache.h kv_evict), before the layer's gather and cache
     * writes: each head keeps kv_policy_select's entries, compacted to the front with their
     * per-slot metadata. No wait. */
    int (*evict)(kv_backend *b, kv_pool *pool, const kv_evict *ev, int n, const int *tab,
                 kv_error *err);
    /* Optional (NULL: the heads' host arrays are the metadata). Copy the per-slot positions and
     * statistics of head h's len entries into h->pos, acc, acc2 (one wait). */
    int (*read_meta)(kv_backend *b, const kv_pool *pool, kv_head *h, kv_error *err);
    /* Optional (NULL: the caller's own memory is as good). A host buffer of n_floats floats,
     * owned by the backend until it is freed, that `logits` fills without a host copy when it
     * is passed as out (the CUDA backend: pinned memory its device-to-host copy lands in). A
     * second call returns the same buffer when it is large enough. NULL with err on failure. */
    float *(*out_buffer)(kv_backend *b, size_t n_floats, kv_error *err);
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
    /* batch-invariant steps: a backend that can compute every row of a step with the bits of
     * that row alone, for any number of rows, sets rowwise_capable; the engine sets rowwise for
     * the steps that want it (kv_engine_decode_invariant) */
    int rowwise_capable, rowwise;
    unsigned long long attended; /* kv_backend_attended: (row, KV head, entry) triples */
};

/* For backend implementations: fill the common head and allocate the driver's scratch.
 * KV_EINPUT for max_rows or max_ctx < 1; KV_EINTERNAL memory. */
int kv_backend_base_init(kv_backend *b, const kv_backend_ops *ops, const kv_model *m, kv_device dev,
                         int max_rows, int max_ctx, kv_error *err);
/* Release the common head's scratch (called by kv_backend_free). */
void kv_backend_base_free(kv_backend *b);

/* The CPU backend (runtime/backend/backend_cpu.c) with a pool of n_threads threads
 * (kvplan/workers.h; <= 0: the CPUs available). */
int kv_backend_cpu_new(const kv_model *m, int max_rows, int max_ctx, int n_threads,
                       kv_backend **out, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
