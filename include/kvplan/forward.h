/* kvplan forward pass: the CPU Llama-family forward over the paged per-head KV cache.
 *
 * Processes `n` new tokens for each of `n_seqs` sequences at once: all projections are
 * BLAS GEMMs over the n_seqs * n rows (prefill: one sequence, n = prompt block; batched
 * decode: n = 1 for every sequence). Attention runs per (sequence, KV head) over that head's
 * retained entries plus the new ones (causal), parallel over KV heads with OpenMP, one score
 * row at a time (no T x T matrix), and accumulates the eviction statistics of the head's GQA
 * group when the cache tracks them. Before attention each head makes room for the new
 * tokens under its budget (Batch-Max Alg. 1). Deterministic for a given thread count.
 */
#ifndef KVPLAN_FORWARD_H
#define KVPLAN_FORWARD_H

#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Observation points for the profiler (BaKlaVa Alg. 1, SqueezeAttention). All arrays are
 * row-major over the rows of this call (rows = n_seqs * n, sequence-major) and valid only
 * during the callback. */
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

typedef enum { KV_LOGITS_NONE = 0, KV_LOGITS_LAST = 1, KV_LOGITS_ALL = 2 } kv_logits_mode;

typedef struct kv_workspace kv_workspace;

/* Scratch for up to `max_rows` rows per call and attention over up to `max_ctx` entries.
 * Caller owns it (kv_workspace_free). */
int kv_workspace_new(const kv_model *m, int max_rows, int max_ctx, kv_workspace **out,
                     kv_error *err);
void kv_workspace_free(kv_workspace *ws);

/* Run the forward pass. tokens: [n_seqs * n] (sequence-major). Each sequence's positions are
 * seqs[s]->n_past .. n_past + n - 1; n_past advances by n. logits: NONE (may be NULL),
 * LAST -> [n_seqs, vocab] (the last new token of each sequence), ALL -> [n_seqs * n, vocab].
 * Errors: KV_EINPUT for a token id out of range, a position beyond max_ctx, a budget too small
 * for the block; KV_EINTERNAL when the block pool is exhausted. */
int kv_forward(const kv_model *m, kv_workspace *ws, kv_cache *const *seqs, int n_seqs,
               const int *tokens, int n, kv_logits_mode mode, float *logits, const kv_hooks *hooks,
               kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
