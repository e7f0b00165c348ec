/* kvplan search: perplexity-driven choice of the allocation parameters (planner/search.c).
 *
 * BaKlaVa Alg. 3 (docs/design.md Planning 4): for every grid point (t, r[, p]) build the budgets
 * (kv_plan_budgets, include/kvplan/alloc.h), run budgeted perplexity on the first
 * `eval_tokens` tokens of the evaluation text (chunks of C tokens, a fresh cache per chunk,
 * kv_engine_chunk_nll), keep the minimum. The baselines `full`, `uniform` and `squeeze` are
 * evaluated at the same ratio, and the winner and the baselines once more on held-out tokens
 * that follow the search tokens. Optionally successive halving (kv_successive_halving) replaces
 * the exhaustive grid.
 *
 * Evaluation is cached per distinct budget matrix and chunk: grid points whose rounded budgets
 * are identical (e.g. every t above the largest head similarity) share one evaluation, and a
 * config evaluated on n chunks and later on n' > n chunks only runs the n' - n new chunks.
 * Token-evaluation counts are what actually ran (chunks evaluated x C). After successive
 * halving the winner is evaluated on every search chunk (when the last round used fewer), so
 * its perplexity compares with the baselines'; those chunks count as search work.
 */
#ifndef KVPLAN_SEARCH_H
#define KVPLAN_SEARCH_H

#include "kvplan/alloc.h"
#include "kvplan/backend.h"
#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/tasks.h"
#include "kvplan/h5io.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/retrieval.h"
#include "kvplan/robust.h"
#include "kvplan/sensitivity.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

struct kv_retrieval_result;

/* The profile inputs of the planner (profile.h5, docs/design.md Files). */
typedef struct kv_profile_inputs {
    int n_layers, n_kv_heads; /* L, H_kv */
    double *head_sim;         /* [L * H_kv] /heads/similarity, owned */
    double *head_imp;         /* [L * H_kv] /heads/importance (or 1 - similarity), owned */
    double *layer_sim;        /* [L] /layers/similarity, owned */
    char model_sha256[65];    /* root attribute of the profile */
} kv_profile_inputs;

/* Read /heads/similarity [L,H_kv], /heads/importance [L,H_kv] (optional: 1 - similarity) and
 * /layers/similarity [L] from `path`, and check that the profile belongs to `m`: its root
 * model_sha256 must equal m->sha256 and the shapes must be [m.L, m.H_kv] / [m.L].
 * Errors (KV_EINPUT) name the file and the mismatch. Free with kv_profile_inputs_free. */
int kv_profile_inputs_read(const char *path, const kv_model *m, kv_profile_inputs *out,
                           kv_error *err);
/* The checks of kv_profile_inputs_read without a model (kvplan inspect): the shapes agree
 * with /heads/similarity's [L, H_kv] and the values lie in their ranges. KV_EINPUT names the
 * file and the dataset or value. */
int kv_profile_inputs_check(const char *path, kv_error *err);
void kv_profile_inputs_free(kv_profile_inputs *p);

/* A grid "a:b:step" (inclusive of b within step/1000) or a single value "a", or a comma list
 * "a,b,c". Values must lie in [lo, hi]. *vals is owned by the caller (free()).
 * KV_EINPUT names the option and what is wrong. */
int kv_grid_parse(const char *s, const char *opt, double lo, double hi, double **vals, int *n,
                  kv_error *err);

typedef struct kv_search_opts {
    kv_alloc_kind allocation; /* baklava (grid t x r [x p]), squeeze (grid p) or uniform */
    double ratio;             /* R in (0, 1]: the token fraction (kv_type_token_ratio) */
    kv_cache_type kv_type;    /* KV type of every head of the evaluated caches (default f16) */
    int kv_types_mask;        /* bit t: KV type t is a candidate of the sensitivity knapsack
                               * (kv_sens_opts.types_mask), and uniform budgets stored in t at the
                               * same bytes (R of the full F16 cache) are evaluated on the search
                               * and held-out tokens (baselines per type); 0 = none
                               * (tokens only; the CLI default is f16,q8,q4) */
    int context;              /* C tokens per chunk (<= model seq_len) */
    int block_size;           /* b_s */
    int evict_block;          /* Batch-Max p */
    kv_policy policy;
    const double *t_values;
    int n_t; /* baklava thresholds (>= 1 value) */
    const double *r_values;
    int n_r; /* baklava reductions in [0, 1] */
    const double *p_values;
    int n_p;                /* SqueezeAttention p (>= 1 value) */
    long eval_tokens;       /* search tokens from the start of the text (default 8192) */
    long heldout_tokens;    /* held-out tokens after them (default 4096; 0 = none) */
    int halving_eta;        /* 0 = exhaustive grid, else successive halving with this eta */
    int halving_min_chunks; /* first-round chunks of successive halving (default 1) */
    kv_progress *progress;  /* NULL = silent; prints progress with an ETA */
    kv_device device;       /* the engine's device (auto, cpu, cuda) */
    int n_threads;          /* its CPU threads (kv_engine_opts.n_threads; 0: the CPUs available) */
    /* Sensitivity planning (planner/sensitivity.h) after the grid: 0 off (default),
     * 1 on. With it, the sensitivity allocation's solution becomes the plan when its search
     * perplexity beats the grid's winner and the baselines. For `--allocation sensitivity`
     * alone, pass allocation uniform (the grid is then the uniform plan, one evaluation). */
    int sensitivity;
    kv_sens_opts sens; /* its options; ratio, C, b_s, p, policy and progress are the search's */
    /* 1: after the winner is known, measure it and the uniform budgets with the eviction
     * blocks p/2, p/4, ..., 1 on the search tokens and keep the (budgets, p) pair with the
     * lowest perplexity (Batch-Max's p trades eviction work for context kept: with budget B a
     * head holds between B - p and B tokens; the memory, B, does not change). The held-out
     * figures are then all taken at that p. 0 (default): p stays evict_block. The CLI sets it
     * when --evict-block is not given. */
    int evict_block_search;
    kv_tasks *tasks; /* NULL: one process; else the chunk evaluations run as tasks
                      * (kvplan/tasks.h), over MPI ranks when there are several; the
                      * result is identical either way */
} kv_search_opts;

/* Defaults: baklava, R = 0.5, C = model seq_len, b_s = 16, p = 16, sink, t and r grids NULL
 * (the caller supplies them; the CLI default is t 0.50:0.95:0.05, r 0.05:0.95:0.05), p = 0.5,
 * eval 8192, held-out 4096, exhaustive. */
void kv_search_opts_default(kv_search_opts *o, const kv_model *m);
/* The token fraction that R of the full F16 cache in bytes buys in KV type t: R * bytes(f16) /
 * bytes(t) per token (kv_type_token_ratio), capped at 1 (a whole cache). Every allocator and the
 * search work in this fraction; kv_search_ratio_bytes is its inverse, which the plan file
 * records. KV_EINPUT when R is more than the full cache in t (the message says the most). */
int kv_search_ratio_tokens(double ratio, kv_cache_type t, int head_dim, double *tokens,
                           kv_error *err);
/* The byte ratio over the full F16 cache that the token fraction `tokens` keeps in type t. */
double kv_search_ratio_bytes(double tokens, kv_cache_type t, int head_dim);

/* The default block size b_s and eviction block p for the token fraction `ratio` of C tokens
 * (docs/design.md "Sensitivity planning"): the largest of 16, 8, 4, 2, 1 with at least 8
 * blocks per head on average (R * C / b_s >= 8) and the policy's floor (fixed part + p) at most
 * half of R * C, so budget can move between heads. block_size, evict_block: the values the
 * user gave (0: not given; a given one is kept). When both are given nothing is written;
 * else *bs_out, *p_out and *min_tokens (fixed part + p). KV_EINPUT when even b_s = p = 1
 * leaves no room (the message says what to pass). */
int kv_search_default_blocks(double ratio, int context, kv_policy policy, int block_size,
                             int evict_block, int *bs_out, int *p_out, int *min_tokens,
                             kv_error *err);

/* Names of the baselines, in the order of kv_search_result.base_ppl. */
#define KV_SEARCH_N_BASE 3
extern const char *const kv_search_base_names[KV_SEARCH_N_BASE]; /* full, uniform, squeeze */

#define KV_SEARCH_MAX_LADDER 32 /* eviction blocks tried: p, p/2, ..., 1 for p < 2^31 */

/* The stages whose wall and CPU seconds a search records (kv_search_result.stage_wall and
 * stage_cpu, the plan's /search/timing), in the order they run. */
typedef enum kv_search_stage {
    KV_SEARCH_ST_INPUTS = 0, /* model, profile and texts read and tokenised (the caller's) */
    KV_SEARCH_ST_SETUP,      /* the grid's and the baselines' budgets, the search's engine */
    KV_SEARCH_ST_GRID,       /* the grid (exhaustive or by successive halving) */
    KV_SEARCH_ST_BASELINES,  /* full, uniform, squeeze on the search chunks */
    KV_SEARCH_ST_CURVES,     /* sensitivity: round 0's curves */
    KV_SEARCH_ST_REFINE,     /* sensitivity: knapsacks, verification, refinement rounds */
    KV_SEARCH_ST_LADDER,     /* the eviction-block ladder */
    KV_SEARCH_ST_HELDOUT,    /* the held-out figures */
    KV_SEARCH_ST_TYPES,      /* the uniform cache of each --kv-types type */
    KV_SEARCH_ST_GUARD,      /* the guard over the texts (kv_search_plan) */
    KV_SEARCH_ST_RETRIEVAL,  /* the retrieval stage (kv_search_plan, with probes) */
    KV_SEARCH_STAGES
} kv_search_stage;

/* "inputs", "setup", "grid", "baselines", "curves", "refine", "ladder", "heldout", "kv_types",
 * "guard", "retrieval"; NULL outside the range. */
const char *kv_search_stage_name(int stage);

typedef struct kv_search_result {
    int n_p, n_t, n_r;         /* grid shape (squeeze: n_t = n_r = 1; uniform: all 1) */
    double *perplexity;        /* [n_p * n_t * n_r] last perplexity of each point, NaN if never
                                  evaluated; owned */
    int *chunks;               /* [n_p * n_t * n_r] chunks that perplexity used (0 = none); owned */
    int best;                  /* index of the grid's best point */
    kv_alloc_kind winner_kind; /* allocation of the plan's budgets: the grid's allocation, or
                                  uniform / squeeze when that baseline beat the grid's best on
                                  all search chunks (then best_t/best_r are NaN) */
    double best_t, best_r, best_p; /* its parameters (NaN when not used by the allocation) */
    double best_ppl;               /* on best_chunks search chunks */
    int best_chunks;
    double base_ppl[KV_SEARCH_N_BASE];        /* on all search chunks */
    double heldout_ppl[1 + KV_SEARCH_N_BASE]; /* winner, full, uniform, squeeze; NaN if none */
    int search_chunks, heldout_chunks;
    int distinct_budgets; /* distinct rounded budget matrices among the grid points */
    long token_evals;     /* tokens actually evaluated for the grid (not baselines/held-out) */
    long token_evals_exhaustive; /* what the exhaustive grid costs: distinct x chunks x C */
    int halving_rounds;
    double seconds;
    int *tokens, *blocks;    /* [L * H_kv] winner budgets (grid best or better baseline), owned */
    kv_policy *policy;       /* [L * H_kv] winner's per-head policies, owned */
    kv_cache_type *kv_types; /* [L * H_kv] winner's per-head KV types (the knapsack's when the
                              * sensitivity solution won, else kv_type), owned */
    int winner_sens;         /* 1 when the sensitivity allocation's solution is the plan */
    int have_sens;           /* 1 when sens holds a sensitivity run */
    kv_sens_result sens;     /* the sensitivity run (curves, rounds, solution), owned */
    /* the grid's winner (after the baselines' check) and the sensitivity solution: search
     * perplexity (all search chunks) and held-out perplexity; NaN when not run */
    double grid_ppl, grid_heldout, sens_ppl, sens_heldout;
    long grid_token_evals_all; /* grid + baselines on the search tokens (token evaluations) */
    double grid_seconds;       /* seconds until the grid's winner and baselines were known */
    int identical_to_uniform;  /* 1 when the plan's budgets and policies are the uniform's */
    /* uniform baselines per KV type at the plan's bytes (kv_types_mask): search and held-out
     * perplexity (NaN when not run or below the policy's floor) and tokens per head (mean) */
    double type_ppl[KV_CACHE_TYPES], type_heldout[KV_CACHE_TYPES], type_tokens[KV_CACHE_TYPES];
    /* the type whose uniform cache became the plan (it beat the winner on all search chunks;
     * only with sensitivity planning over types), -1 = none */
    int winner_type_uniform;
    /* the eviction block p of the plan (evict_block unless evict_block_search chose another),
     * and the measured ladder: ladder_p[i] (p, p/2, ..., 1), the plan candidate's and the
     * uniform budgets' perplexity on all search chunks at that p (entry 0: the grid's p) */
    int evict_block;
    int n_ladder;
    int ladder_p[KV_SEARCH_MAX_LADDER];
    double ladder_plan_ppl[KV_SEARCH_MAX_LADDER], ladder_uniform_ppl[KV_SEARCH_MAX_LADDER];
    long ladder_token_evals;
    /* token evaluations of the held-out figures (plan, baselines, the other allocation) and of
     * the per-type uniform caches (search and held-out chunks); total_token_evals: every token
     * the search evaluated (grid and baselines, sensitivity curves and verification, the
     * eviction-block ladder, held-out, per-type uniforms; the guard's are its own,
     * kv_robust_result.token_evals) */
    long heldout_token_evals, type_token_evals, total_token_evals;
    /* per-text figures and the guard's decision (include/kvplan/robust.h), written as
     * /search/texts by kv_search_write when not NULL; not owned (the caller's) */
    const kv_robust_result *robust;
    /* the retrieval stage's record (include/kvplan/retrieval.h), written as /search/retrieval by
     * kv_search_write when not NULL; not owned (the caller's) */
    const struct kv_retrieval_result *retrieval;
    /* wall seconds (kv_now) and CPU seconds (user + system, kv_cpu_now) of each stage,
     * kv_search_stage order; 0 for a stage that did not run. kv_search_run fills setup ..
     * kv_types, kv_search_plan guard and retrieval; inputs is the caller's to fill. */
    double stage_wall[KV_SEARCH_STAGES], stage_cpu[KV_SEARCH_STAGES];
} kv_search_result;

/* Run the search on ids[0..n_ids) (tokenized text, BOS first). Needs at least one chunk of
 * search tokens (min(eval_tokens, n_ids) >= C) and, when heldout_tokens > 0, at least one
 * held-out chunk after them. prof must come from kv_profile_inputs_read for m (may be NULL for
 * allocation uniform; then the squeeze baseline is NaN).
 * Errors: KV_EINPUT for bad options, too little text, a ratio too small for the policy;
 * KV_EINTERNAL from the engine or GLPK. Free the result with kv_search_result_free. */
int kv_search_run(const kv_model *m, const kv_profile_inputs *prof, const int *ids, long n_ids,
                  const kv_search_opts *o, kv_search_result *res, kv_error *err);
void kv_search_result_free(kv_search_result *r);

/* The search as `kvplan search` runs it, after its inputs are read: kv_search_run on ids,
 * then the guard over the texts of layout lay with objective obj (kv_robust_guard: per-text
 * figures, a fall back towards uniform where the plan loses), then, when probes is not NULL,
 * the retrieval stage (kv_retrieval_search with ro on the lay->S search chunks; its b_s is the
 * guard's uniform cache's when the guard fell back to it, else o->block_size). On success
 * res->robust = rob and (with probes) res->retrieval = rr, and ap (on input the parameters the
 * search ran with: ratio, context, block size, floor, KV type) holds the winning plan's
 * allocation, t, r, p and, when the guard's uniform cache won, its block size and floor: what
 * kv_plan_file_write takes. res, rob and rr are the caller's to free (kv_search_result_free,
 * kv_robust_result_free, kv_retrieval_result_free), also after an error. Errors: those of the
 * three stages. */
int kv_search_plan(const kv_model *m, const kv_profile_inputs *prof, const int *ids, long n_ids,
                   const kv_robust_layout *lay, kv_robust_objective obj, const kv_search_opts *o,
                   const kv_probes *probes, const kv_retrieval_opts *ro, kv_search_result *res,
                   kv_robust_result *rob, kv_retrieval_result *rr, kv_alloc_params *ap,
                   kv_error *err);

/* Write the search part of plan.h5: /search/t_values [n_t], /search/r_values [n_r],
 * /search/p_values [n_p], /search/perplexity ([n_t, n_r] for a baklava grid with one p,
 * [n_p, n_t, n_r] with several, [n_p] for squeeze; NaN where not evaluated),
 * /search/chunks (same shape, int32), /search/baselines [3] (full, uniform, squeeze on the
 * search tokens), /search/heldout [4] (winner, full, uniform, squeeze on the held-out tokens),
 * with attributes naming the entries, and /search attributes method, eta, eval_tokens,
 * heldout_tokens, token_evals, token_evals_exhaustive, best_perplexity, seconds;
 * grid_evict_block (the p the grid, the baselines and the sensitivity curves ran with),
 * evict_block (the plan's), and, when the eviction block was searched, /search/evict_block/p,
 * /search/evict_block/plan and /search/evict_block/uniform [n_ladder] (search perplexity of
 * the plan candidate and of uniform at each p); and /search/texts (kv_robust_write) when
 * r->robust is set, and /search/retrieval (kv_retrieval_write) when r->retrieval is set. */
int kv_search_write(kv_h5 *f, const kv_search_opts *o, const kv_search_result *r, kv_error *err);

/* Write a whole plan.h5 atomically (kv_h5_create ... kv_h5_commit): provenance (`command`,
 * model m), the plan (kv_plan_from_budgets, validated, then kv_plan_write: ratio,
 * context_length, block_size, evict_block, policy, allocation, t, r, p — NaN where the
 * allocation does not use them — min_tokens, /budget/tokens, /budget/blocks and /budget/policy
 * [L, H_kv]), and, when `so` and
 * `sr` are not NULL, the search part (kv_search_write), and, when `profile_path` is not NULL
 * and that profile has /hardware figures, the KVPR split and Batch-Max tables
 * (kv_plan_write_kvpr_batch_from_profile, include/kvplan/batch.h). tokens: [L * H_kv].
 * On any error the target file is left untouched. */
int kv_plan_file_write(const char *path, const char *command, const char *profile_path,
                       const kv_model *m, const kv_alloc_params *a, kv_policy policy,
                       int evict_block, const int *tokens, const kv_search_opts *so,
                       const kv_search_result *sr, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
