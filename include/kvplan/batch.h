/* kvplan batch sizing and KV-cache memory arithmetic (planner/batch.c).
 *
 * Memory arithmetic (KV Cache: The Hidden Memory Giant, article 003, "The Formula"):
 *   KV bytes = 2 x L x H_kv x d_h x S x B x bytes_per_element.
 * Batch sizing (Batch-Max, Metel et al., §1 and §3-4; docs/design.md Planning 6): for device
 * memory M, weights W and workspace A(b), the largest batch b with W + b (KV + A) <= M in
 * every phase, for three ways of running:
 *   full            - the whole cache, prefill of the whole prompt at once;
 *   decode-only     - compression after prefill: the prompt's full cache (and the prefill
 *                     workspace) must still fit during prefill, then the budgets apply;
 *   prefill+decode  - Batch-Max Alg. 1: the prompt is processed in blocks of e tokens (the
 *                     eviction block), so no head ever holds more than its budget + e.
 * and the decode throughput each predicts when decode is memory-bandwidth bound:
 *   step time = (weights read per token + b x KV bytes read) / memory bandwidth,
 *   tokens/s  = b x g / sum over the g decode steps of the step time.
 * The workspace estimate is documented at kv_workspace_bytes_per_seq and in
 * docs/batch-sizing.md. Units: bytes, seconds, bytes/s.
 */
#ifndef KVPLAN_BATCH_H
#define KVPLAN_BATCH_H

#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/h5io.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* 2 x L x H_kv x d_h x S x B x p bytes (article 003); computed in double, exact for results
 * below 2^53. Llama-3-70B (L 80, H_kv 8, d_h 128), S 4096, B 64, p 2 -> 85,899,345,920.
 * KV_EINPUT when a count is < 1 or p is not positive. */
int kv_kv_cache_bytes(long n_layers, long n_kv_heads, long head_dim, long seq_len, long batch,
                      double dtype_bytes, double *bytes, kv_error *err);

/* The model shape and the deployment the batch sizing needs. */
typedef struct kv_batch_config {
    long n_layers, n_heads, n_kv_heads, head_dim; /* L, H, H_kv, d_h */
    long hidden, ffn_hidden, vocab;               /* h, FFN intermediate size, vocabulary */
    double n_params;     /* parameters held in device memory (embedding once when tied) */
    double read_params;  /* parameters read per decoded token (kv_model_read_param_count) */
    double weight_bytes; /* bytes per parameter as deployed (2 for fp16 weights) */
    double dtype_bytes;  /* p: bytes per K, V and activation element */
    double device_mem;   /* M, bytes */
    double mem_bw;       /* device memory bandwidth, bytes/s; 0 = unknown (no tokens/s) */
    long prompt_len;     /* s >= 1 */
    long gen_len;        /* g >= 1 decode steps */
    int block_size;      /* b_s tokens per KV block (paged cache) */
    int evict_block;     /* e: Batch-Max p, tokens per prefill block / eviction */
    const int *budget;   /* [L * H_kv] budget B[l][j] in tokens (a plan), or NULL: only the
                            full-cache row is computed. Not owned. */
    const kv_cache_type *kv_type; /* [L * H_kv] KV storage type per head (a plan),
                            or NULL: every K/V element takes dtype_bytes. With types, the
                            cache figures of every row count the stored bytes (scales
                            included, kv_type_token_bytes). Not owned. */
} kv_batch_config;

/* Fill the model part of *c from a loaded model (counts from its config and parameter count)
 * and set weight_bytes = dtype_bytes = p, block_size = evict_block = 16, everything else 0. */
void kv_batch_config_from_model(const kv_model *m, double p, kv_batch_config *c);

typedef enum {
    KV_BATCH_FULL = 0,
    KV_BATCH_DECODE_ONLY = 1,
    KV_BATCH_PREFILL_DECODE = 2,
    KV_BATCH_NMODES = 3
} kv_batch_mode;

/* "full", "decode_only", "prefill_decode". */
const char *kv_batch_mode_name(kv_batch_mode m);

typedef struct kv_batch_row {
    int available;       /* 0 when not computed (compressed rows without budgets) */
    long max_batch;      /* largest b that fits (0: not even one sequence) */
    double kv_prefill;   /* KV bytes per sequence at the end of prefill (peak of it) */
    double kv_decode;    /* KV bytes per sequence at the peak of decode */
    double ws_prefill;   /* workspace bytes per sequence during prefill */
    double ws_decode;    /* workspace bytes per sequence during decode */
    double per_seq;      /* max(kv_prefill + ws_prefill, kv_decode + ws_decode) */
    int prefill_limits;  /* 1 when the prefill phase sets per_seq */
    double kv_read_mean; /* mean KV bytes read per sequence per decode step */
    double step_time;    /* mean seconds per decode step at max_batch (0 if unknown) */
    double tokens_per_s; /* decode tokens/s at max_batch (0 if mem_bw unknown or b 0) */
} kv_batch_row;

typedef struct kv_batch_result {
    double weights;        /* W = n_params x weight_bytes */
    double free_for_batch; /* M - W */
    kv_batch_row row[KV_BATCH_NMODES];
} kv_batch_result;

/* Workspace per sequence for one forward step that processes `tokens` new tokens of each
 * sequence while attending over `ctx` entries per head (the estimate, counted from the buffers
 * of a Llama-family forward pass; one layer's buffers are reused by every layer):
 *   tokens x (3 h + 2 H d_h + 2 h_kv + 2 F) x p     residual x, normed x, block output (3 h);
 *                                                   Q and attention output (2 H d_h); new K, V
 *                                                   (2 h_kv); FFN gate and up (2 F)
 * + H x ctx x 4                                     one fp32 score row per query head (the
 *                                                   attention never forms a T x T matrix)
 * + vocab x 4                                       fp32 logits of the last position.
 * Bytes, per sequence; the batch needs b times this. */
double kv_workspace_bytes_per_seq(const kv_batch_config *c, long tokens, long ctx);

/* The three rows (Batch-Max §3-4). KV bytes are counted in whole blocks of b_s tokens per
 * (layer, KV head), as the paged cache holds them; a compressed head holds at most
 * ceil(min(B + e, len) / b_s) blocks (its budget plus one eviction block, as
 * kv_cache_blocks_needed). KV read per decode step t (1..g) counts entries, not blocks:
 * min(B, s + t - 1) per head (full: s + t - 1).
 * Errors (KV_EINPUT): non-positive sizes, M or p, s < 1, g < 1, b_s < 1, e < 1, a budget < 1,
 * and device memory not above the weights ("M bytes is below the weights W bytes"). */
int kv_batch_size(const kv_batch_config *c, kv_batch_result *out, kv_error *err);

/* Write the planner's /kvpr and /batch groups into a plan being written (called by
 * `kvplan search` when the profile has hardware figures). The tables are for kvplan's own
 * runtime, which keeps weights, K and V in fp32 (p = 4).
 *   /kvpr/batch [NB] int32 (sequences): 1, 4, 16, 64
 *   /kvpr/seq_len [NS] int32 (tokens): C/8, C/4, C/2, C (C = context_length; distinct, >= 1)
 *   /kvpr/split_column, /kvpr/split_row [NB, NS] int32 (tokens): split point l (GLPK)
 *   /kvpr/time_column, /kvpr/time_row [NB, NS] float64 (s): t(l) per layer
 *   /kvpr/time_no_recompute [NB, NS] float64 (s): t(0), the whole K, V transferred
 *   /kvpr attributes: v_com (bytes/s), v_gpu (FLOP/s), dtype_bytes, hidden, kv_width,
 *     hardware (name), source, model ("KVPR Eq. 6-11, GQA").
 *   /batch/max_batch [3] int32 (sequences), /batch/tokens_per_s [3] float64 (tokens/s),
 *   /batch/kv_bytes_per_seq [3] float64 (bytes, the peak phase), /batch/workspace_bytes_per_seq
 *   [3] float64 (bytes, the same phase); rows full, decode_only, prefill_decode (attribute
 *   `rows`). /batch attributes: device_mem_bytes, weight_bytes, mem_bw (bytes/s), prompt_len
 *   (3C/4), gen_len (C/4, at least 1), dtype_bytes, block_size, evict_block (= block_size), and
 *   `note` when the device memory does not exceed the weights (then max_batch is 0).
 * /kvpr needs hw->v_com and hw->v_gpu > 0; /batch needs hw->device_mem > 0, else that group
 * is skipped (not an error). The budget must match the model (L, H_kv). */
int kv_plan_write_kvpr_batch(kv_h5 *plan, const kv_model *m, const kv_hw *hw, const kv_plan *b,
                             kv_error *err);

/* The one call for `kvplan search`: read the hardware figures of the profile at
 * `profile_path` (kv_hw_from_profile) and, when it has them, write /kvpr and /batch with
 * kv_plan_write_kvpr_batch; *written (may be NULL) is 1 then. A profile without usable
 * /hardware figures (made with --no-hw) is not an error: nothing is written, *written = 0.
 * Errors: those of kv_plan_write_kvpr_batch, and an unreadable profile (KV_EINPUT). */
int kv_plan_write_kvpr_batch_from_profile(kv_h5 *plan, const char *profile_path, const kv_model *m,
                                          const kv_plan *b, int *written, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
