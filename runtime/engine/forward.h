/* kvplan forward pass (the engine room's internal header): the backend-neutral driver of a
 * Llama-family forward step over the paged per-head KV cache (kvplan/backend.h holds the ops it
 * calls).
 *
 * Processes `n` new tokens for each of `n_seqs` sequences at once: all projections run over the
 * n_seqs * n rows (prefill: one sequence, n = prompt block; batched decode: n = 1 for every
 * sequence). Per layer: the backend computes Q, K, V; every head makes room for the new tokens
 * under its budget (Batch-Max Alg. 1: the policy's schedule in plain C, then one gather of the
 * move list in the backend); the new K/V go to their slots; the backend attends per
 * (sequence, KV head) over that head's block table (retained entries plus the new ones,
 * causal) and accumulates the eviction statistics of the head's GQA group when the head
 * tracks them. Deterministic for a given thread count.
 */
#ifndef KVPLAN_ENGINE_FORWARD_H
#define KVPLAN_ENGINE_FORWARD_H

#include "kvplan/backend.h"
#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CPU backend instance, as the low-level API and tests create it: scratch for up to
 * `max_rows` rows per call and attention over up to `max_ctx` entries (kv_backend_cpu_new).
 * Caller owns it (kv_workspace_free). The engine (kvplan/engine.h) creates its own. */
typedef kv_backend kv_workspace;
int kv_workspace_new(const kv_model *m, int max_rows, int max_ctx, kv_workspace **out,
                     kv_error *err);
void kv_workspace_free(kv_workspace *ws);

/* Run the forward pass on backend `b` (whose model must be `m`). tokens: [n_seqs * n]
 * (sequence-major). Each sequence's positions are seqs[s]->n_past .. n_past + n - 1; n_past
 * advances by n. The caches' pool storage must belong to `b` (kv_backend_pool_init; host
 * pools from kv_pool_init serve the CPU backend). logits: NONE (may be NULL), LAST ->
 * [n_seqs, vocab] (the last new token of each sequence), ALL -> [n_seqs * n, vocab], host.
 * The heads' statistics are in their host arrays when it returns (the backend's end_step).
 * Errors: KV_EINPUT for a token id out of range, a position beyond max_ctx, a budget too small
 * for the block; KV_EINTERNAL when the block pool is exhausted. */
int kv_forward(const kv_model *m, kv_backend *b, kv_cache *const *seqs, int n_seqs,
               const int *tokens, int n, kv_logits_mode mode, float *logits, const kv_hooks *hooks,
               kv_error *err);

/* The driver's pieces, for executors that run the same layer step around their own cache
 * handling (the KVPR executor): embed checks ids and positions and loads x; one layer step
 * as described above; logits as in kv_forward. kv_forward = embed, every layer, logits, the
 * backend's end_step, n_past += n. A caller of the pieces gets the statistics of tracked heads
 * into their host arrays only through the logits (a device backend may deliver them there). */
int kv_forward_embed(kv_backend *b, kv_cache *const *seqs, int n_seqs, const int *tokens, int n,
                     kv_error *err);
int kv_forward_layer(kv_backend *b, kv_cache *const *seqs, int n_seqs, int n, int layer,
                     const kv_hooks *hooks, kv_error *err);
int kv_forward_logits(kv_backend *b, int n_seqs, int n, kv_logits_mode mode, float *logits,
                      kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
