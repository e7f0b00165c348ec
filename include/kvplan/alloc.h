/* kvplan budget allocation (planner/alloc.c): pure planning functions, no model needed.
 *
 * docs/design.md "Planning" 1-4:
 *   1. layer budgets: `uniform` or `squeeze` (SqueezeAttention, Wang et al. 2024, as summarised
 *      in BaKlaVa §3.1.4: 1-D k-means with k = 3 on the layer similarity, the most similar
 *      cluster keeps a fraction p of its share, the rest goes equally to the other layers);
 *   2. head budgets inside a layer: BaKlaVa Alg. 2 (threshold t, reduction r);
 *   3. rounding to whole KV blocks: a small MIP solved with GLPK;
 *   4. successive halving over an evaluation callback (used by the search, BaKlaVa Alg. 3).
 *
 * Units: budgets are in tokens (KV entries of one (layer, KV head)); real-valued budgets are
 * double, rounded budgets int32. Arrays of shape [L, H_kv] are row-major (layer-major):
 * element (l, j) is at l * H_kv + j. All functions are reentrant (no global mutable state) and
 * report failures through kv_error (KV_EINPUT for bad arguments or infeasible plans,
 * KV_EINTERNAL for out-of-memory and solver failures). No function keeps a pointer to its
 * arguments; every output array is owned by the caller.
 *
 * Bounds used throughout ("caps"): a head keeps at most the context C tokens and at least
 * `min_tokens` (the eviction policy's fixed part plus the eviction block p of Batch-Max
 * Alg. 1, see kv_policy_fixed_tokens). Whenever a cap or a floor moves a budget, the amount is
 * redistributed so that the total is kept: the budgets are replaced by their Euclidean
 * projection onto {lo <= x <= hi, sum x = S}, i.e. x_i + lambda clamped to [lo_i, hi_i] with
 * one common shift lambda — what a cap removes is shared in equal parts by every entry that is
 * still strictly between its bounds (kv_project_box).
 */
#ifndef KVPLAN_ALLOC_H
#define KVPLAN_ALLOC_H

#include "kvplan/common.h"
#include "kvplan/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Allocation methods (docs/design.md Planning 1-2). */
typedef enum {
    KV_ALLOC_UNIFORM = 0, /* every head R * C tokens */
    KV_ALLOC_SQUEEZE = 1, /* SqueezeAttention layer budgets, equal heads inside a layer */
    KV_ALLOC_BAKLAVA = 2, /* layer budgets (squeeze or uniform) + BaKlaVa Alg. 2 per layer */
} kv_alloc_kind;

/* "uniform", "squeeze", "baklava". */
const char *kv_alloc_name(kv_alloc_kind k);
/* Parse one of the names above; KV_EINPUT names the bad value. */
int kv_alloc_parse(const char *s, kv_alloc_kind *out, kv_error *err);

/* Default SqueezeAttention fraction p kept by the most similar layer cluster. */
#define KV_SQUEEZE_DEFAULT_P 0.5

/* ---- helpers ---- */

/* Euclidean projection onto the box-with-sum {lo <= y <= hi, sum(y) = total}:
 * y_i = clamp(x_i + lambda, lo_i, hi_i) with the common shift lambda solved exactly (the sum is
 * piecewise linear and non-decreasing in lambda; the breakpoints are examined in order).
 * x, lo, hi, y: [n] (y may alias x); lo or hi may be NULL for 0 / +infinity. When the sum of x
 * already equals `total` and x is inside the box, y = x.
 * Errors: KV_EINPUT when lo_i > hi_i, or total < sum(lo) or total > sum(hi) (the message gives
 * both sums); KV_EINTERNAL out of memory. */
int kv_project_box(int n, const double *x, const double *lo, const double *hi, double total,
                   double *y, kv_error *err);

/* Deterministic 1-D k-means (Lloyd's algorithm), used by SqueezeAttention's layer clustering.
 * x: [n] values. k_req: requested clusters (>= 1). The effective k is min(k_req, number of
 * distinct values) and is returned in *k_out (so L < 3 or constant similarities give fewer
 * clusters). Initialisation: the centres are the sorted data's quantiles at
 * (c + 0.5) / k of the distinct values, c = 0..k-1. Assignment ties (a value exactly halfway
 * between two centres) go to the lower centre; an emptied cluster keeps its centre. Iterates
 * until no assignment changes (at most 1000 rounds). Output: labels [n] in 0..k-1 ordered by
 * ascending centre, centers [k_req] (only the first *k_out are set), ascending.
 * Errors: KV_EINPUT for n < 1, k_req < 1 or a non-finite value; KV_EINTERNAL out of memory. */
int kv_kmeans_1d(const double *x, int n, int k_req, int *labels, double *centers, int *k_out,
                 kv_error *err);

/* ---- 1. layer budgets ---- */

/* Real-valued layer budgets (tokens per layer, summed over its H_kv heads), docs/design.md
 * Planning 1. Total = ratio * L * H_kv * C. uniform: every layer total / L. squeeze
 * (SqueezeAttention): k-means (k = 3, kv_kmeans_1d) on layer_sim [L]; the layers of the cluster
 * with the highest centre (most similar input/output = least important) keep p * (total / L) each,
 * and what they give up is shared equally by all other layers. When every layer falls in one
 * cluster nothing changes (uniform). Then every layer is kept within [H_kv * min_tokens, H_kv * C]
 * by kv_project_box (what the cap removes is shared equally by the layers below it). layer_sim may
 * be NULL for uniform. out: [L] tokens. Errors: KV_EINPUT for ratio outside (0, 1], p outside [0,
 * 1], L, H_kv or C < 1, a kind other than uniform/squeeze, or when H_kv * min_tokens * L > total
 * (the ratio is too small for the policy's fixed part; the message gives both numbers). */
int kv_layer_budgets(kv_alloc_kind kind, const double *layer_sim, int n_layers, int n_kv_heads,
                     double ratio, int context, double p, int min_tokens, double *out,
                     kv_error *err);

/* ---- 2. head budgets inside one layer ---- */

/* BaKlaVa Alg. 2 on the m KV heads of one layer, in place on budget [m] (tokens).
 * sim [m]: head similarity s in [0, 1] (/heads/similarity); importance [m]: 1 - s
 * (/heads/importance), or NULL to use 1 - sim. Heads with sim > t are *low* (Alg. 2 line 1
 * with importance < 1 - t). With n low heads: if n == 0 or n == m nothing changes (line 2);
 * otherwise every low head gives up r * budget (line 6; 0 <= r <= 1), and the freed total is
 * added in equal parts to the k = min(n, m - n) non-low heads of highest importance (lines
 * 9-13; importance ties go to the lower head index).
 * Bounds: afterwards every head is kept in [lo, hi] (lo = min_tokens, hi = C in the planner;
 * pass 0 and HUGE_VAL for the bare algorithm) by kv_project_box over the layer: the overflow
 * of a head capped at hi is shared in equal parts by all heads of the layer still below hi
 * (the layer total never changes). *n_low (may be NULL) receives n.
 * Errors: KV_EINPUT for m < 1, r outside [0, 1], lo > hi or a layer total outside
 * [m * lo, m * hi]. */
int kv_head_realloc(int m, const double *sim, const double *importance, double t, double r,
                    double lo, double hi, double *budget, int *n_low, kv_error *err);

/* ---- 3. whole allocation ---- */

typedef struct kv_alloc_params {
    kv_alloc_kind kind;       /* uniform, squeeze or baklava */
    kv_alloc_kind layer_kind; /* baklava only: the layer budgets, uniform or squeeze */
    double ratio;             /* R in (0, 1]: the token fraction the budgets share */
    kv_cache_type kv_type;    /* KV type of every head (default f16); the plan's byte ratio
                               * over the full F16 cache is R * token_bytes(T) / token_bytes(f16) */
    int context;              /* C tokens */
    int block_size;           /* b_s tokens per KV block */
    int min_tokens;           /* policy fixed part + eviction block p (>= 1) */
    double t, r;              /* BaKlaVa threshold and reduction (baklava only) */
    double p;                 /* SqueezeAttention fraction (squeeze layers only) */
} kv_alloc_params;

/* Defaults: baklava over squeeze layers, R = 0.5, C = 256, b_s = 16, min_tokens = 20
 * (4 sinks + p = 16), t = 0.75, r = 0.5, p = KV_SQUEEZE_DEFAULT_P. */
void kv_alloc_params_default(kv_alloc_params *a);

/* Real-valued budgets [L * H_kv] in tokens, summing to R * L * H_kv * C:
 *   uniform: R * C per head;
 *   squeeze: kv_layer_budgets(squeeze), each layer's budget split equally over its heads;
 *   baklava: kv_layer_budgets(layer_kind), then kv_head_realloc per layer with t, r, and bounds
 *     [min_tokens, C] (BaKlaVa: layer importance from SqueezeAttention §3.1.4, heads Alg. 2).
 * layer_sim [L] is needed for squeeze layers, head_sim [L * H_kv] for baklava; head_imp
 * [L * H_kv] may be NULL (1 - head_sim). out: [L * H_kv] written by the function.
 * Errors: as kv_layer_budgets / kv_head_realloc, and KV_EINPUT for a missing input array. */
int kv_alloc_budgets(const kv_alloc_params *a, int n_layers, int n_kv_heads,
                     const double *layer_sim, const double *head_sim, const double *head_imp,
                     double *out, kv_error *err);

/* ---- 4. rounding to blocks (GLPK MIP) ---- */

/* Round real budgets x [n] (tokens) to whole blocks (docs/design.md Planning 3):
 *   variables  b_i integer blocks, lo <= b_i <= hi with lo = ceil(min_tokens / b_s),
 *              hi = ceil(C / b_s); d_i >= 0 continuous (|b_i - y_i|, y_i = x_i / b_s);
 *   constraint sum_i b_i = N = floor(total / b_s);
 *   minimise   sum_i d_i  with d_i >= b_i - y_i, d_i >= y_i - b_i, and the valid chord
 *              inequality d_i >= phi_i + (1 - 2 phi_i) (b_i - floor(y_i)), phi_i = y_i -
 *              floor(y_i), which equals |b - y| at the two integers around y_i and lies below it
 *              at every other integer. It makes the root LP relaxation integral, so GLPK's
 *              branch and bound does not explode on many equal fractional parts.
 * Solved with glp_intopt (presolver on, terminal output off); the return code and
 * glp_mip_status must say GLP_OPT. tokens [n] = b_i * b_s (int32); blocks [n] may be NULL.
 * Errors: KV_EINPUT for n < 1, b_s < 1, min_tokens > C, or an infeasible model: sum of lower
 * bounds > N ("the ratio is too small for the policy's fixed part ... short by K blocks") or
 * sum of upper bounds < N (over by K blocks), both checked before solving; KV_EINTERNAL when
 * GLPK fails or reports a non-optimal status. */
int kv_round_budgets(int n, const double *x, double total, int block_size, int min_tokens,
                     int context, int *tokens, int *blocks, kv_error *err);

/* kv_alloc_budgets followed by kv_round_budgets with total = R * L * H_kv * C; for kind uniform
 * the rounding is kv_uniform_budgets (kvplan/plan.h), the one definition of uniform at R that
 * `eval --ratio` runs as well (KV_EINPUT when it falls below min_tokens).
 * tokens, blocks: [L * H_kv]; real_out [L * H_kv] (may be NULL) receives the real budgets. */
int kv_plan_budgets(const kv_alloc_params *a, int n_layers, int n_kv_heads, const double *layer_sim,
                    const double *head_sim, const double *head_imp, int *tokens, int *blocks,
                    double *real_out, kv_error *err);

/* ---- 5. successive halving (docs/design.md Planning 4) ---- */

/* Evaluate configuration `config` (0..n_configs-1) on the first `n_chunks` chunks of the
 * evaluation text; write its perplexity (lower is better; NaN counts as worst) to *ppl.
 * Return KV_OK or an error code with `err` filled; the search stops at the first error. */
typedef int (*kv_sh_eval_fn)(void *user, int config, int n_chunks, double *ppl, kv_error *err);

typedef struct kv_sh_opts {
    int eta;               /* keep the best ceil(n / eta) each round, chunks *= eta (>= 2) */
    int min_chunks;        /* chunks of the first round (>= 1) */
    int max_chunks;        /* chunks never exceed this (>= min_chunks) */
    long tokens_per_chunk; /* tokens one chunk costs (for the token-evaluation count) */
    int prefix_reuse;      /* 1 when the callback caches per-chunk results of a config, so a
                              call on n chunks after one on n' chunks costs n - n' chunks */
    /* optional (NULL: none): called at the start of each round with the round's configs
     * [n] and chunk count, before eval is called for each of them, so a caller can evaluate
     * the whole round as one batch (e.g. a kv_tasks_run over MPI ranks) and answer the evals
     * from its cache. Its error stops the search like eval's. */
    int (*round)(void *user, const int *configs, int n, int n_chunks, kv_error *err);
} kv_sh_opts;

typedef struct kv_sh_result {
    int winner;        /* best configuration of the last round */
    double winner_ppl; /* its perplexity on winner_chunks chunks */
    int winner_chunks;
    int rounds;       /* rounds run */
    long chunk_evals; /* chunks evaluated, summed over all calls (after prefix reuse) */
    long token_evals; /* chunk_evals * tokens_per_chunk */
} kv_sh_result;

/* Successive halving (Jamieson & Talwalkar 2016) over n configs:
 * round 0 evaluates every config on c_0 = min_chunks chunks; each round keeps the best
 * ceil(n_alive / eta) (ties: lower config index) and multiplies the chunk count by eta (capped
 * at max_chunks). It stops after the round in which one config is left, or after a round on
 * max_chunks chunks (then the best of that round wins). last_ppl [n_configs] (may be NULL)
 * receives each config's most recent perplexity (NaN if never evaluated).
 * Errors: KV_EINPUT for bad options or n_configs < 1; errors of the callback are passed on. */
int kv_successive_halving(int n_configs, const kv_sh_opts *o, kv_sh_eval_fn eval, void *user,
                          kv_sh_result *res, double *last_ppl, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
