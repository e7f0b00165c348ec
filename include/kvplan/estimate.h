/* kvplan search --estimate: what a search will cost before it runs (planner/search_estimate.c,
 * docs/search-estimate.md).
 *
 * The token evaluations of every stage of `kvplan search` (the grid, the baselines, the
 * sensitivity curves, their refinement rounds and verification, the eviction-block ladder, the
 * held-out figures, the uniform cache per KV type, the guard, the retrieval stage) are counted
 * by the functions the search itself runs (planner/search_impl.h, planner/sensitivity.h), so
 * the estimate and the search cannot drift apart. A token evaluation is one position of one
 * sequence through the whole model (a chunk of C tokens under one budget set is C of them).
 * Where a count depends on what the search measures (how many refinement rounds improve,
 * whether the guard or the retrieval stage adds candidates), `token_evals` is the least the
 * stage runs and `token_evals_max` the most; `exact` says the count does not depend on data.
 *
 * Time: token evaluations x each stage's cost per token. With a model the costs come from a
 * calibration (kv_estimate_calibrate): real forwards at each stage's shape, timed in CPU
 * seconds; the wall time is the CPU time over the CPU share the process got while calibrating.
 * The profile's /prompts@profile_tokens_per_s (the profiler's full-cache forward) is read for
 * comparison (kv_estimate_rate_profile). For a model given by shape only, one throughput from
 * a per-token roofline on a device preset (kv_estimate_roofline, kv_search_estimate_time).
 */
#ifndef KVPLAN_ESTIMATE_H
#define KVPLAN_ESTIMATE_H

#include "kvplan/common.h"
#include "kvplan/model.h"
#include "kvplan/retrieval.h"
#include "kvplan/search.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef enum kv_est_stage {
    KV_EST_GRID = 0,  /* BaKlaVa grid: distinct budgets x search chunks (or successive halving) */
    KV_EST_BASELINES, /* full, uniform, squeeze on the search chunks (those not in the grid) */
    KV_EST_CURVES,    /* sensitivity curves of the first round, around uniform */
    KV_EST_REFINE,    /* the curves of the refinement rounds (0 .. max_rounds - 1 of them) */
    KV_EST_VERIFY,    /* each round's knapsack solution on the search chunks */
    KV_EST_LADDER,    /* eviction blocks p/2 .. 1: the plan candidate and uniform */
    KV_EST_HELDOUT,   /* winner, baselines and the other allocation on the held-out chunks */
    KV_EST_TYPES,     /* the uniform cache of each --kv-types type, search + held-out chunks */
    KV_EST_GUARD,     /* the guard: per-text curves and every chunk under its candidates */
    KV_EST_RETRIEVAL, /* the retrieval stage (--retrieval): chunks and probe passes */
    KV_EST_STAGES
} kv_est_stage;

/* "grid", "baselines", "curves", "refine", "verify", "ladder", "heldout", "kv_types", "guard",
 * "retrieval"; NULL outside the range. */
const char *kv_est_stage_name(int stage);

typedef struct kv_est_row {
    long token_evals;                    /* the least the stage runs (tokens) */
    long token_evals_max;                /* the most */
    int exact;                           /* 1: token_evals == token_evals_max whatever the data */
    double seconds, seconds_max;         /* wall seconds at the estimate's throughput */
    double cpu_seconds, cpu_seconds_max; /* CPU seconds (calibrated; 0 from a roofline) */
    /* the projection: the most, but what depends on the search's outcome midway: the guard's
     * further source (the sensitivity solution, a candidate only when another plan beat it)
     * and the price of the stages after the eviction-block ladder (its p or the least) */
    long token_evals_proj;
    double seconds_proj, cpu_seconds_proj;
    double tokens_per_s; /* the stage's throughput, tokens per wall second */
} kv_est_row;

typedef struct kv_search_estimate {
    kv_est_row stage[KV_EST_STAGES];
    long token_evals, token_evals_max; /* sums over the stages */
    double seconds, seconds_max;
    int search_chunks, heldout_chunks, context;
    int points;                /* grid points */
    int distinct;              /* distinct rounded budgets among them; -1 unknown (no profile:
                                * then every point counts as distinct, the most) */
    long curve_passes;         /* forward passes of one round of curves */
    int sens_rounds;           /* the refinement allows this many solves at most */
    double tokens_per_s;       /* the throughput of single-sequence passes (tokens/s) */
    double batch_tokens_per_s; /* of batched passes (curves, refinement, guard) */
    double cpu_seconds, cpu_seconds_max;   /* sums over the stages (calibrated; else 0) */
    double seconds_proj, cpu_seconds_proj; /* the projection's sums (kv_est_row) */
    double cpu_share; /* CPU seconds per wall second assumed for the wall projection */
    char rate_source[256];
} kv_search_estimate;

/* Count every stage of `kvplan search` for model m (read for its cfg only: a kv_model with
 * only cfg filled does), profile prof (NULL: the grid's distinct budgets are unknown and
 * counted as all points), options o (as the search gets them: context, block sizes, grids,
 * halving, sensitivity options, kv_types_mask, evict_block_search), n_texts calibration texts
 * laid out as S search and HC held-out chunks, and, when probes is not NULL, the retrieval
 * stage with options ro (have_heads: the profile holds the heads' retrieval costs). Seconds
 * are left 0 (kv_search_estimate_time). Errors: KV_EINPUT for options the search would refuse
 * (a ratio below the policy's floor, a grid needing a profile); those of kv_plan_budgets. */
int kv_search_estimate_count(const kv_model *m, const kv_profile_inputs *prof,
                             const kv_search_opts *o, int n_texts, int S, int HC,
                             const kv_probes *probes, const kv_retrieval_opts *ro, int have_heads,
                             kv_search_estimate *out, kv_error *err);

/* Fill the seconds of every stage and the totals: token evaluations / tokens_per_s (> 0) for
 * the stages of single-sequence passes, / batch_tokens_per_s for those of batched passes
 * (curves, refinement, guard; <= 0: tokens_per_s), and record the rates and their source
 * (copied, cut to fit). */
void kv_search_estimate_time(kv_search_estimate *e, double tokens_per_s, double batch_tokens_per_s,
                             const char *source);

/* The profile's measured forward throughput: /prompts@profile_tokens_per_s of `path`
 * (tokens/s of the profiler's full-cache forward). KV_EINPUT names the file when it has none. */
int kv_estimate_rate_profile(const char *path, double *tokens_per_s, kv_error *err);

/* What the calibration measured: each stage's cost per token evaluation in CPU seconds, and
 * how much CPU the process got per wall second meanwhile. */
typedef struct kv_est_rates {
    /* CPU seconds per token evaluation, kv_est_stage order: at the search's eviction block p,
     * and at the least p the eviction-block ladder may choose for the later stages */
    double cpu_per_token[KV_EST_STAGES], cpu_per_token_max[KV_EST_STAGES];
    double cpu_share;            /* CPU seconds per wall second while calibrating (<= threads) */
    double seconds, cpu_seconds; /* the calibration's own wall and CPU seconds */
    int probes;                  /* shapes measured */
    kv_cache_type mixed_type;    /* the stand-in for the knapsack's mixed-type plans */
} kv_est_rates;

/* The calibration: real forwards of model m over the n_chunks search chunks of ids (each C =
 * o->context tokens) at the shape of each stage of a search with options o, on engines as the
 * search builds them (o->device, o->n_threads, policy), timed in CPU seconds (kv_cpu_now):
 * single sequences under the uniform budgets (the grid), the full cache, a stand-in for the
 * knapsack's mixed-type plans (every head in the middle candidate type at the plan's bytes),
 * each ladder eviction block p/2 .. 1, each --kv-types type's uniform cache, the guard's
 * uniform cache (b_s = p = 1) and its batch of blends, and with sensitivity planning a batch of
 * --sens-batch curve points around uniform (round 0) and around the mixed stand-in
 * (refinement), scored for KL. Each shape: its own engine, passes for 0.03 CPU seconds (a
 * batch: one pass after an untimed single sequence). Each stage's cost per token is the mix of
 * shapes its passes run (docs/search-estimate.md). Errors: KV_EINPUT without a chunk; those of the
 * engine. */
int kv_estimate_calibrate(const kv_model *m, const kv_search_opts *o, const int *ids, int n_chunks,
                          kv_est_rates *out, kv_error *err);

/* Fill every stage's CPU seconds (token evaluations x r->cpu_per_token, the most x
 * r->cpu_per_token_max, the projection x their mean) and wall seconds (CPU / r->cpu_share),
 * their sums, the stages' throughputs (at the most) and the source (copied, cut to fit). */
void kv_search_estimate_time_calibrated(kv_search_estimate *e, const kv_est_rates *r,
                                        const char *source);

/* The cost of one token of a C-token chunk by the simple roofline: FLOPs (2 per weight of the
 * layers and the classifier, 4 * H * d_h * C / 2 for attention over half a chunk on average),
 * weight bytes (F16 weights read once per pass of `seq_per_pass` sequences of C tokens) and KV
 * bytes (F16 K and V of the token written, and of half a chunk read once per query tile of 128
 * rows, as a fused attention kernel does). */
typedef struct kv_roofline {
    double flops;            /* per token */
    double weight_bytes;     /* per token: all F16 weights / (C * seq_per_pass) */
    double kv_bytes;         /* per token */
    double peak_flops;       /* the preset's, FLOP/s */
    double mem_bw;           /* the preset's, bytes/s */
    double flop_eff, bw_eff; /* the fractions of peak assumed reached */
    double tokens_per_s;     /* 1 / max(flops / (peak * flop_eff), bytes / (bw * bw_eff)) */
    int compute_bound;       /* 1 when the FLOPs term is the larger */
    char source[256];        /* the preset's figures and where they come from */
} kv_roofline;

/* The roofline throughput of model shape cfg (L, H, H_kv, d_h, FFN, vocab; dim = H * d_h when
 * cfg->dim is 0) at context C on device preset `preset`: "h100" (hwpresets.c's h100-sxm row),
 * "a100" (a100-40g-pcie4) or "cpu" (this project's 2-core AMD EPYC Zen 4 machine, the figures
 * its hardware probes measured). The constants and their sources are in
 * planner/search_estimate.c. KV_EINPUT names the preset and the known ones when unknown. */
int kv_estimate_roofline(const kv_config *cfg, int context, int seq_per_pass, const char *preset,
                         kv_roofline *out, kv_error *err);

/* Parse --shape "L,H,KVH,DH,FFN,VOCAB" (six positive integers, H a multiple of KVH) into cfg
 * (dim = H * DH, seq_len = context, llama defaults otherwise). KV_EINPUT says which field is
 * wrong and the expected form. */
int kv_estimate_parse_shape(const char *s, int context, kv_config *cfg, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
