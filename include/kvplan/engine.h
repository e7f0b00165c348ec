/* kvplan engine: what running a plan needs, in one object (docs/design.md "One engine, one plan,
 * several backends"). It owns the backend (kvplan/backend.h), the block pool and the
 * sequences' caches; it prefills in blocks of the plan's eviction block p (Batch-Max Alg. 1),
 * decodes batches, scores chunks (budgeted perplexity) and forks sequences. `kvplan run`,
 * `eval`, `search`, `profile` and the benchmarks drive it; none sets up a pool or a cache.
 *
 * Sequences are small integer handles 0..max_seqs-1. Each sequence has the plan's budgets and
 * policies unless it was opened with its own budgets (sensitivity perturbations, several plans
 * in one batch). Memory: the pool holds max_seqs times the blocks one sequence needs at most
 * (kv_cache_blocks_needed: per head ceil(min(B + p, ctx) / b_s)), so no admissible run exhausts
 * it; bytes in use are the blocks really held (compression is physical). An engine is not
 * shared between threads.
 */
#ifndef KVPLAN_ENGINE_H
#define KVPLAN_ENGINE_H

#include "kvplan/backend.h"
#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Which logits a forward step returns: none, the last new token's of each sequence, or every
 * new token's. */
typedef enum { KV_LOGITS_NONE = 0, KV_LOGITS_LAST = 1, KV_LOGITS_ALL = 2 } kv_logits_mode;

typedef struct kv_engine_opts {
    kv_device device; /* auto (default), cpu or cuda */
    int max_seqs;     /* sequences alive at once (default 1) */
    int max_ctx;      /* positions per sequence (default: the plan's context C) */
    int max_step;     /* most rows of one forward step (default: max_ctx on the CPU, so a
                       * prompt or a chunk that no head can evict from runs in one step; on
                       * CUDA at most 512: longer prompts are prefilled in 512-token chunks,
                       * which bounds the device's activations) */
    long seq_blocks;  /* blocks reserved per sequence (default: what the plan's budgets need,
                       * kv_cache_blocks_needed; pass more when sequences get larger budgets) */
    int n_threads;    /* CPU threads of the backend's pool (default 0: the CPUs available,
                       * kv_cpus_available); the results are the same bits for every count */
    int type_mask;    /* bit t: also reserve blocks of KV type t (kv_cache_type) for every
                       * sequence, as many as the plan's type needs (or seq_blocks), so that
                       * sequences opened with their own types (kv_engine_seq_open_typed) can
                       * store heads in t; 0 (default): only the plan's types */
} kv_engine_opts;

typedef struct kv_engine kv_engine;

/* An engine running plan `plan` on model `m` (both must outlive it; the plan is copied).
 * The plan is validated and checked against the model (kv_plan_check_model). opts may be
 * NULL (defaults). Caller owns *out (kv_engine_free). Errors: KV_EINPUT for a plan that does
 * not fit the model, an unavailable device, max_ctx beyond the RoPE range the caller asked
 * for; KV_EINTERNAL memory. */
int kv_engine_new(const kv_model *m, const kv_plan *plan, const kv_engine_opts *opts,
                  kv_engine **out, kv_error *err);
void kv_engine_free(kv_engine *e);

const kv_plan *kv_engine_plan(const kv_engine *e);
kv_backend *kv_engine_backend(kv_engine *e);
/* Sequences the engine can hold open at once (opts.max_seqs). */
int kv_engine_max_seqs(const kv_engine *e);
/* A host buffer for [rows, vocab] logits, owned by the engine (valid until kv_engine_free or a
 * call with more rows), to pass as kv_engine_decode / prefill's `logits`: the backend writes it
 * without a host copy (the CUDA backend: pinned memory its device-to-host copy lands in, which
 * saves copying the batch's logits, 4 MiB a step at batch 32 and a 32000-token vocabulary; the
 * CPU backend: plain memory). Any other buffer works as before. NULL with err: KV_EINPUT for
 * rows < 1, KV_EINTERNAL out of memory. */
float *kv_engine_logits_buffer(kv_engine *e, int rows, kv_error *err);
/* The device that runs (cpu or cuda, after auto was resolved). */
kv_device kv_engine_device(const kv_engine *e);

/* Open an empty sequence with the plan's budgets and policies, or its own budget [L * H_kv]
 * tokens (copied) and policies [L * H_kv] (NULL: the plan's). *seq receives its handle.
 * KV_EINPUT for a budget < 1; KV_EINTERNAL when max_seqs sequences are open. */
int kv_engine_seq_open(kv_engine *e, const int *budget, const kv_policy *policy, int *seq,
                       kv_error *err);
/* kv_engine_seq_open with the sequence's own KV storage types [L * H_kv] (copied; NULL: the
 * plan's). Every type must have blocks in the pool (the plan's types or opts.type_mask);
 * KV_EINPUT names a head whose type has none. */
int kv_engine_seq_open_typed(kv_engine *e, const int *budget, const kv_policy *policy,
                             const kv_cache_type *types, int *seq, kv_error *err);
/* Close a sequence: its blocks go back to the pool. */
void kv_engine_seq_close(kv_engine *e, int seq);
/* A copy of sequence `src` (entries, statistics, positions, budgets) as a new sequence
 * (*seq): its blocks are copied with one backend gather. */
int kv_engine_seq_fork(kv_engine *e, int src, int *seq, kv_error *err);
/* The sequence's cache (block tables and metadata; storage is the backend's). */
kv_cache *kv_engine_cache(kv_engine *e, int seq);

/* Prefill: n tokens of sequence `seq`, in steps of p tokens when some head of it can be over
 * budget (Batch-Max Alg. 1; the block's queries never see more than B entries), else in steps
 * of max_step. logits: NONE, LAST -> [vocab] (the last token's), ALL -> [n, vocab]. hooks
 * (may be NULL) see every step. Errors as kv_forward. */
int kv_engine_prefill(kv_engine *e, int seq, const int *tokens, int n, kv_logits_mode mode,
                      float *logits, const kv_hooks *hooks, kv_error *err);
/* One decode step for n_seqs sequences at once: token tokens[i] for sequence seqs[i];
 * logits [n_seqs, vocab]. */
int kv_engine_decode(kv_engine *e, const int *seqs, int n_seqs, const int *tokens, float *logits,
                     kv_error *err);

/* Rows up to which kv_engine_decode is batch-invariant on every backend and weight type (the
 * matmuls' per-row paths, kvplan/quant.h); above, the GEMMs' rounding depends on the batch. */
#define KV_ENGINE_INVARIANT_ROWS 4
/* 1 when the engine's backend has kv_engine_decode_invariant (the CPU backend), else 0. */
int kv_engine_decode_invariant_ok(const kv_engine *e);
/* kv_engine_decode in which every sequence's logits are the bits a decode of that sequence
 * alone gives, for any n_seqs: the matmuls take their per-row paths (kv_qmatmul_rowwise_pool:
 * F32 weights four rows per pass over W, register-blocked, each row in its single-row order),
 * so one call decodes a whole continuous batch (kvplan/sched.h) without neighbour-dependent
 * rounding. Shapes, logits and errors as kv_engine_decode; KV_EINPUT when the backend has no
 * such path (kv_engine_decode_invariant_ok is 0: decode at most KV_ENGINE_INVARIANT_ROWS
 * sequences per call instead). */
int kv_engine_decode_invariant(kv_engine *e, const int *seqs, int n_seqs, const int *tokens,
                               float *logits, kv_error *err);

/* Budgeted perplexity of one chunk for several budget sets at once (docs/design.md Runtime,
 * "Budgeted perplexity"): n_sets fresh sequences (set s: budgets[s] [L * H_kv] tokens, or NULL
 * for the plan's; policies[s] or NULL) run the same n tokens in lockstep steps of p (one
 * batched forward per step), and nll_sum[s] gets the sum of the n - 1 next-token negative
 * log-likelihoods (nats). *peak_bytes (may be NULL) gets the most K/V bytes in use at once.
 * n_sets <= max_seqs. Errors as kv_forward; KV_EINTERNAL for a non-finite loss. */
int kv_engine_chunk_nll(kv_engine *e, const int *tokens, int n, int n_sets,
                        const int *const *budgets, const kv_policy *const *policies,
                        double *nll_sum, size_t *peak_bytes, kv_error *err);

/* kv_engine_chunk_nll, and also the divergence from a reference distribution (sensitivity
 * curves, docs/design.md "Sensitivity planning"): ref_logprobs [n, vocab] are log-probabilities of
 * the next token at each position (e.g. the full cache's log-softmax); kl_sum[s] gets
 * sum over the n - 1 scored positions of KL(ref || set s) in nats. ref_logprobs and kl_sum may
 * be NULL (then this is kv_engine_chunk_nll). Errors as kv_engine_chunk_nll. */
int kv_engine_chunk_score(kv_engine *e, const int *tokens, int n, int n_sets,
                          const int *const *budgets, const kv_policy *const *policies,
                          const float *ref_logprobs, double *nll_sum, double *kl_sum,
                          size_t *peak_bytes, kv_error *err);

/* kv_engine_chunk_score with each set's own KV storage types: types[s] [L * H_kv] or NULL (the
 * plan's); types itself may be NULL. Sets of different types run in one batched forward (the
 * attention decodes each head's rows in its own type); bytes in use are the stored bytes of
 * every set's blocks. Errors as kv_engine_chunk_score and kv_engine_seq_open_typed. */
int kv_engine_chunk_score_typed(kv_engine *e, const int *tokens, int n, int n_sets,
                                const int *const *budgets, const kv_policy *const *policies,
                                const kv_cache_type *const *types, const float *ref_logprobs,
                                double *nll_sum, double *kl_sum, size_t *peak_bytes, kv_error *err);

/* Bytes of K/V blocks held now / at most since kv_engine_reset_peak (engine creation). */
size_t kv_engine_bytes_in_use(const kv_engine *e);
size_t kv_engine_bytes_peak(const kv_engine *e);
void kv_engine_reset_peak(kv_engine *e);
/* Bytes one sequence's full cache of `tokens` tokens takes in F16 blocks (the ratio
 * reference): L * H_kv * ceil(tokens / b_s) * 2 * b_s * 2 d_h. */
size_t kv_engine_bytes_full(const kv_engine *e, int tokens);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
