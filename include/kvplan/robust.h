/* kvplan robust planning: several calibration texts, per-text figures and the guard against a
 * plan worse than the uniform cache (planner/robust.c; docs/design.md "Several calibration
 * texts and the guard").
 *
 * The search (include/kvplan/search.h) runs on one token array. With several texts the CLI lays
 * their chunks of C tokens out in that array so that every chunk holds one text only: the
 * search chunks first, interleaved text by text (chunk k of every text before chunk k + 1 of
 * any, so the first calibration chunks of the sensitivity curves cover every text), then the
 * held-out chunks in the same order. kv_robust_layout says which text each chunk came from.
 *
 * After the search, kv_robust_guard measures on every chunk the full cache, the strongest
 * uniform cache (every head R * C tokens at b_s = p = 1, what `kvplan eval --ratio R
 * --allocation uniform --block-size 1 --evict-block 1` runs; when the caller fixed the
 * eviction block, o->evict_block_search 0, uniform at the search's own b_s and p) and
 * candidates made from the
 * plan: its budgets blended towards uniform, B(lambda) = floor(U + lambda (P - U)) per head
 * for lambda = 1, 3/4, 1/2, 1/4 (U the uniform budgets at the plan's b_s, P the plan's; the
 * plan's b_s, p and per-head policies); with two texts or more and sensitivity planning, the
 * same blends of two per-text knapsacks: every head's NLL curve is measured on each text's
 * first calibration chunk alone (kv_sens_measure at the search's levels), the curves are
 * combined per head and level as their mean over the texts (the pooled knapsack, each text
 * weighing the same) or as their largest value (a max-regret knapsack on an upper bound:
 * sum_h max_t d[h][t] >= max_t sum_h d[h][t]), and each is solved by kv_sens_allocate with
 * the NLL objective (planner/sensitivity.h), and the knapsack on each text's curves
 * alone (the first KV_ROBUST_TEXT_SOURCES texts: a plan for that text, which the guard holds
 * to the others); the sensitivity knapsack's own solution with its per-head KV types, when
 * the search kept another plan (the grid's cell, or a uniform cache of one KV type that beat
 * it on the pooled search chunks: a mixed-type solution can be the one that holds on every
 * text); and lambda = 0, the uniform cache itself.
 * (The search's own verification pools every text's chunks: a solution that helps one text
 * and hurts another by more is dropped there; the per-text check sees both.) A candidate
 * passes when its perplexity is at most the uniform cache's on every text's calibration
 * chunks and on every text's held-out chunks, and when on every text its chunk-by-chunk
 * changes predict a new sample of the text within 0.5% of uniform (KV_ROBUST_PRED_*: a
 * plan's gain measured on 12 chunks can be chunk-to-chunk noise, and then it does not hold
 * on the next 2048 tokens); lambda = 0 always passes (it is that cache). A candidate fitted on
 * every text's curves (mean, worst, KV_ROBUST_SRC_SENS) qualifies only when it also passes the
 * transfer check (leave one text out): with two or more per-text knapsacks, each text's own
 * knapsack at the same lambda holds on every text it was not fitted on (the pass above, per
 * text); with two texts that is the knapsack fitted without text t, tested on t. It has seen
 * every calibration text, so only that check says whether its allocation carries to a kind of
 * text no calibration had.
 * Among the passing candidates the objective picks the lowest (ties: the search's own plan,
 * then the larger lambda; there is no standard-error margin in the search's plan's favour:
 * docs/benchmarks.md "Search cost" measures what one cost on unseen text):
 *   mean   the mean over texts of log(ppl_cand / ppl_uniform) (all of a text's chunks),
 *   worst  the largest of those (max regret against uniform over the texts),
 *   both   mean + worst (the mean with a penalty on the worst text).
 * Floor rounding keeps every blended budget at least min(U, P) (so above the policy's floor)
 * and their sum at most the larger of the two sums (so within the ratio).
 */
#ifndef KVPLAN_ROBUST_H
#define KVPLAN_ROBUST_H

#include "kvplan/common.h"
#include "kvplan/h5io.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

struct kv_search_opts;
struct kv_search_result;

#define KV_ROBUST_MAX_TEXTS 16
#define KV_ROBUST_N_LAMBDA 4     /* lambda = 1, 3/4, 1/2, 1/4 per source */
#define KV_ROBUST_TEXT_SOURCES 4 /* texts whose own knapsack is a candidate */
/* source code of the sensitivity knapsack's own solution (below) */
#define KV_ROBUST_SRC_SENS (3 + KV_ROBUST_TEXT_SOURCES)
#define KV_ROBUST_N_SRC (4 + KV_ROBUST_TEXT_SOURCES) /* plan, mean, worst, per text, sens */
#define KV_ROBUST_MAX_CAND (KV_ROBUST_N_SRC * KV_ROBUST_N_LAMBDA + 1) /* then uniform */
/* The prediction bound a candidate must also meet on every text (see above): with the per-chunk
 * changes d_c = (NLL_cand - NLL_uniform) / (C - 1) of the text's n chunks (calibration and
 * held-out), mean m and sample deviation s, m + z s sqrt(1/n + 1/n_new) <= log(1 + tol): a new
 * sample of n_new chunks of that text is predicted within (1 + tol) x uniform's perplexity at
 * one-sided level 95% (z = 1.645; Student's t would widen it for small n). n_new = 4 chunks
 * (2048 tokens at C = 512, the size of the search's held-out evaluations), tol = 0.5%. */
#define KV_ROBUST_PRED_Z 1.645
#define KV_ROBUST_PRED_CHUNKS 4
#define KV_ROBUST_PRED_TOL 0.005

typedef enum kv_robust_objective {
    KV_ROBUST_MEAN = 0,  /* mean over texts of log(ppl / uniform ppl) */
    KV_ROBUST_WORST = 1, /* the largest of them (max regret) */
    KV_ROBUST_BOTH = 2,  /* their sum: the mean with a penalty on the worst text */
} kv_robust_objective;

/* "mean" / "worst" / "both"; KV_EINPUT names the option value otherwise. */
int kv_robust_objective_parse(const char *s, kv_robust_objective *out, kv_error *err);
const char *kv_robust_objective_name(kv_robust_objective o);

/* Where the texts' chunks are in the search's token array. */
typedef struct kv_robust_layout {
    int n_texts;              /* 1..KV_ROBUST_MAX_TEXTS */
    const char *const *names; /* [n_texts] the texts' file names */
    const long *text_tokens;  /* [n_texts] tokens of each text (BOS included) */
    int S, HC;                /* search and held-out chunks (of C tokens) in the array */
    const int *chunk_text;    /* [S + HC] text of each chunk: search chunks, then held-out */
} kv_robust_layout;

/* Lay out texts ids[t][0..n[t]) for the search: each text gives its first
 * floor(min(eval_tokens / N, n[t]) / C) chunks as search chunks and then up to
 * floor(heldout_tokens / N / C) held-out chunks from the tokens after them (N = n_texts);
 * chunks interleaved as described above. With one text the array is its first
 * (S + HC) * C tokens, as the search always read. *out_ids [(S + HC) * C] and *chunk_text
 * [S + HC] are the caller's (free()). Errors KV_EINPUT naming the text (names[t]) with fewer
 * tokens than one search chunk, or when heldout_tokens > 0 and no text has a held-out chunk. */
int kv_robust_lay_out(int n_texts, const char *const *names, const int *const *ids, const long *n,
                      int C, long eval_tokens, long heldout_tokens, int **out_ids, int *S, int *HC,
                      int **chunk_text, kv_error *err);

/* The per-text figures and the guard's decision (/search/texts). Arrays [n_texts * 2] are
 * indexed [t * 2 + part], part 0 the calibration (search) chunks, 1 the held-out chunks; NaN
 * where a text has no chunk of that part. */
typedef struct kv_robust_result {
    int n_texts;
    char **names;           /* [n_texts] owned copies */
    long *text_tokens;      /* [n_texts] */
    long token_evals;       /* tokens the guard evaluated: per-text curves and every chunk's
                               full, uniform and candidate figures */
    int *chunks;            /* [n_texts * 2] chunks of each part */
    double *full, *uniform; /* [n_texts * 2] perplexity: full cache, uniform b_s = p = 1 */
    double *plan;           /* [n_texts * 2] the chosen candidate (the shipped plan) */
    int n_cand;             /* candidates: per source 4 lambdas, then uniform */
    double lambda[KV_ROBUST_MAX_CAND];    /* 1, 0.75, 0.5, 0.25 (per source), 0 */
    int source[KV_ROBUST_MAX_CAND];       /* 0 the search's plan, 1 mean knapsack, 2 worst, 3 + t
                                           * text t's own knapsack, KV_ROBUST_SRC_SENS the
                                           * sensitivity knapsack's solution, -1 uniform */
    double *cand;                         /* [n_cand * n_texts * 2] each candidate */
    double objective[KV_ROBUST_MAX_CAND]; /* its objective value; +inf when it failed */
    double bound[KV_ROBUST_MAX_CAND];     /* its largest per-text prediction bound (log ratio) */
    int passed[KV_ROBUST_MAX_CAND];       /* 1 when <= uniform on every text and part */
    int transfer[KV_ROBUST_MAX_CAND];     /* leave-one-text-out check of a candidate fitted on
                                           * every text (sources 1, 2, KV_ROBUST_SRC_SENS): 1
                                           * held, 0 failed (not chosen), -1 not applicable */
    int chosen;                           /* index of the chosen candidate */
    kv_robust_objective obj;
    int uniform_block_size, uniform_evict_block; /* the uniform compared with: 1, 1 or b_s, p */
    char reason[512]; /* "" when the plan passed; else the first text and part it lost on */
    double se_margin; /* the standard error of the objective's difference between the chosen
                       * candidate and the search's own plan (log ratio; information only);
                       * 0 when not computed */
} kv_robust_result;

/* The guard (see the top of this file). Runs on m with the search's options o (ratio, C, b_s,
 * policy, kv_type, device) and result res (the plan: res->tokens, res->policy,
 * res->evict_block), over ids laid out as lay says. When a candidate other than lambda = 1 is
 * chosen, res->tokens / blocks / policy become its budgets; for lambda = 0 the caller must
 * write the plan as allocation uniform with b_s = rr->uniform_block_size
 * (rr->source[rr->chosen] < 0), and res->evict_block is set to rr->uniform_evict_block; a knapsack
 * candidate sets res->winner_sens. rr is filled (kv_robust_result_free). Costs 3 passes over every
 * chunk (full, uniform, the candidates as one batch of up to 28 sequences) and the per-text
 * curves (one chunk per text). Errors: KV_EINPUT for a layout that does not match res; KV_EINTERNAL
 * from the engine. */
int kv_robust_guard(const kv_model *m, const int *ids, const kv_robust_layout *lay,
                    const struct kv_search_opts *o, kv_robust_objective obj,
                    struct kv_search_result *res, kv_robust_result *rr, kv_error *err);
void kv_robust_result_free(kv_robust_result *r);

/* The decision in words: "plan" (the search's plan kept), "blend" (of it towards uniform),
 * "mean knapsack" / "worst knapsack" / "text knapsack" (a per-text knapsack's solution; the
 * text's number is /search/texts/candidates/source - 3) or "... blend" (a blend
 * of it), "uniform". */
const char *kv_robust_decision(const kv_robust_result *r);

/* Write /search/texts: datasets tokens [N] (int32), chunks [N, 2] (int32), full, uniform,
 * plan [N, 2] (perplexity; columns calibration, held-out), candidates/lambda [K],
 * candidates/source [K] (int32: 0 plan, 1 knapsack, -1 uniform), candidates/perplexity
 * [K, N, 2], candidates/objective [K], candidates/passed [K] (int32);
 * attributes names (the file names joined by '\n'), n_texts, objective, decision
 * (kv_robust_decision), lambda, reason, uniform_block_size, uniform_evict_block. */
int kv_robust_write(kv_h5 *f, const kv_robust_result *r, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
