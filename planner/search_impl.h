/* kvplan search, the planner's internal header for what its parts share: the inputs
 * (planner/search_inputs.c: profile, grids, defaults and the options every stage derives), the
 * search (planner/search.c), the plan-file writer (planner/search_write.c) and the stages that
 * run with a search's options (the guard, planner/robust.c; the retrieval stage,
 * planner/retrieval_search.c). Not installed; the public API is include/kvplan/search.h. */
#ifndef KVPLAN_PLANNER_SEARCH_IMPL_H
#define KVPLAN_PLANNER_SEARCH_IMPL_H

#include "kvplan/engine.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/search.h"
#include "planner/sensitivity.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sensitivity options a search runs with: o->sens with the search's ratio, C, b_s, grid p,
 * policy, base KV type, progress, task farm and the knapsack's KV types (o->kv_types_mask when
 * sensitivity planning runs, else none). A value; nothing to free. */
kv_sens_opts kv_search_sens_opts(const kv_search_opts *o);

/* An engine whose reservation is the full cache of m at C = o->context with block size
 * block_size, Batch-Max eviction block p, the search's policy and KV type t in every head, for
 * up to `seqs` sequences of a batch, on o->device with o->n_threads; type_mask: the further KV
 * types a sequence may store (kv_engine_opts.type_mask, 0 = t only). Any budget plan of the
 * search runs on it (KV-Compress block tables per head). *out is the caller's
 * (kv_engine_free). Errors: those of kv_plan_full and kv_engine_new. */
int kv_search_engine(const kv_model *m, const kv_search_opts *o, kv_cache_type t, int block_size,
                     int p, int seqs, int type_mask, kv_engine **out, kv_error *err);

/* Chunk evaluations successive halving runs with prefix reuse (a budget evaluated on c chunks
 * and later on c' > c runs only the c' - c new ones): n configurations on c0 chunks, the best
 * ceil(n / eta) kept and the chunks multiplied by eta (capped at cmax), until one is left or
 * a round ran on cmax chunks (kv_successive_halving's schedule, planner/alloc.c). *last (may
 * be NULL): the chunks of the last round. */
long kv_search_halving_chunk_evals(int n, int eta, int c0, int cmax, int *last);

/* The grid's and the baselines' budgets as kv_search_run builds them. */
typedef struct kv_search_arms {
    int points;        /* grid points */
    int distinct;      /* distinct rounded budgets among them (what the grid evaluates) */
    int base;          /* baselines: full, uniform, squeeze (with a profile) */
    int base_distinct; /* distinct budgets among the baselines */
    int base_new;      /* distinct baseline budgets that no grid point has */
} kv_search_arms;

/* The search's chunk evaluations (each C tokens) per stage, as kv_search_chunk_plan counts
 * them; _max where the count depends on the data (the largest it can be). */
typedef struct kv_search_chunks {
    long grid;                     /* the grid (halving: + finishing the winner) */
    long baselines, baselines_max; /* full, uniform, squeeze on the search chunks */
    long ladder_max;               /* the eviction-block ladder (plan and uniform at p/2..1) */
    long heldout;                  /* winner, baselines (and the other allocation) held out */
} kv_search_chunks;

/* The chunk evaluations of kv_search_run's grid, baseline, eviction-block and held-out stages
 * for the budgets a (kv_search_count_budgets), S search and HC held-out chunks under options
 * o, into *w (may be NULL); returns the largest total (the progress ETA's). The sensitivity
 * stage counts its own (kv_sens_count). */
long kv_search_chunk_plan(const kv_search_opts *o, const kv_search_arms *a, int S, int HC,
                          kv_search_chunks *w);

/* The grid's and the baselines' budgets as kv_search_run builds them (kv_plan_budgets per
 * point, identical rounded budgets shared) into *out. m is read for its cfg only. Errors:
 * those of kv_plan_budgets and kv_plan_from_budgets; KV_EINPUT when the allocation needs a
 * profile and prof is NULL. */
int kv_search_count_budgets(const kv_model *m, const kv_profile_inputs *prof,
                            const kv_search_opts *o, kv_search_arms *out, kv_error *err);

/* What sensitivity planning (kv_sens_search under kv_search_sens_opts(o)) evaluates with S
 * search chunks, in tokens, from kv_sens_count's point lists: round 0's curves on the first
 * min(calib_chunks, S) chunks; one refinement round's on kv_sens_refine_chunks of them (the
 * search runs 0 .. rounds - 1 of them: a round that does not improve ends it); verification:
 * each distinct solution of a round's knapsacks (one per objective) on the S search chunks,
 * none when it repeats the kept one. _max: the most. */
typedef struct kv_search_sens_work {
    long curves, curves_max; /* round 0 (exact with full curves) */
    long round, round_max;   /* one refinement round */
    long verify_one;         /* one solution's verification */
    long verify_max;         /* rounds x objectives x verify_one */
    long passes;             /* forward passes of round 0's least */
    int rounds;              /* o->sens.max_rounds: round 0 and at most rounds - 1 more */
} kv_search_sens_work;

/* Fill *w (zeros when o->sensitivity is 0). m is read for its cfg only. Errors: those of
 * kv_sens_count. */
int kv_search_sens_count(const kv_model *m, const kv_search_opts *o, int S, kv_search_sens_work *w,
                         kv_error *err);

/* The progress ETA's sensitivity work in chunk evaluations (C tokens each): round 0 and every
 * refinement round midway between their least and most, a verification per round; 0 without
 * sensitivity planning or on an error. */
long kv_search_sens_chunks(const kv_search_opts *o, const kv_model *m, int S);

/* The chunk evaluations of the uniform caches per KV type of o->kv_types_mask
 * (search_type_baselines): S + HC for each type whose uniform budget at the plan's bytes
 * stays at or above the policy's floor at Batch-Max eviction block p (the plan's: the
 * eviction-block ladder may lower it), into *chunks. m is read for its cfg only. Errors:
 * those of kv_uniform_budgets; KV_EINTERNAL for memory. */
int kv_search_type_chunks(const kv_model *m, const kv_search_opts *o, int p, int S, int HC,
                          long *chunks, kv_error *err);

/* What the guard (kv_robust_guard, planner/robust.c) evaluates, in tokens. */
typedef struct kv_search_guard_count {
    long curve_evals;     /* the per-text loss curves (one calibration chunk per text), least */
    long curve_evals_max; /* the most (sparse curves: the second pass depends on the data) */
    long evals;           /* every chunk under full, uniform and the candidates it always has */
    long evals_max;       /* with the sensitivity knapsack's solution as a further source */
    long alone_evals;     /* guard_choose's single-sequence passes over every chunk: the plan
                           * itself, always (least) */
    long alone_evals_max; /* every candidate once (most; a chosen candidate that loses when
                           * measured alone makes the next best measured) */
    int sequences_max;    /* candidates scored in one batched pass, at most */
} kv_search_guard_count;

/* The guard's token evaluations for n_texts calibration texts and nc = S + HC chunks under
 * the search's options o: the per-text curves (kv_sens_count on one chunk per text, with two
 * texts or more and sensitivity planning) and per chunk C tokens for the full cache, the
 * uniform one and each candidate (KV_ROBUST_N_LAMBDA blends per source). Whether the
 * sensitivity knapsack's solution is a further source depends on the search (evals_max).
 * m is read for its cfg only. Errors: those of kv_sens_count. */
int kv_robust_guard_count(const kv_model *m, const kv_search_opts *o, int n_texts, int nc,
                          kv_search_guard_count *out, kv_error *err);

/* What the retrieval stage (kv_retrieval_search, planner/retrieval_search.c) evaluates. */
typedef struct kv_search_retrieval_count {
    long curve_evals;     /* loss curves measured there when the search has none, least */
    long curve_evals_max; /* the most (sparse curves) */
    long chunk_evals;     /* search chunks under full, uniform and the guard's plan, tokens */
    long probe_evals;     /* probe passes (full, uniform, the plan), tokens */
    long chunk_evals_max; /* with the candidates (when the plan loses retrieval) */
    long probe_evals_max; /* with the head costs' and the candidates' probe passes */
} kv_search_retrieval_count;

/* The retrieval stage's token evaluations with probes p (the first ro->max_probes), S search
 * chunks under options o; have_heads: the profile holds the heads' costs. A probe pass costs
 * its prompt's prefill and one decode per answer token but the last. m is read for its cfg
 * only. Errors: those of kv_sens_count. */
int kv_retrieval_count(const kv_model *m, const kv_search_opts *o, const kv_probes *p,
                       const kv_retrieval_opts *ro, int S, int have_heads,
                       kv_search_retrieval_count *out, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
