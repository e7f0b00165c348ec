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

/* The token work of the search's stages in chunk evaluations (one sequence of C tokens), for
 * the progress ETA and `search --estimate`:
 * kv_search_halving_chunks: successive halving of n distinct budgets with factor eta from c0
 *   chunks up to cmax (each budget's chunks evaluated once, reused as it goes on);
 * kv_search_sens_chunks: sensitivity planning (o->sensitivity) with S search chunks, a
 *   projection: round 0's curves and o->sens.max_rounds - 1 refinement rounds, each midway
 *   between what always runs and the most it can run (kv_sens_curve_evals), and a verification
 *   per round (kv_sens_verify_evals);
 * kv_search_type_chunks: the uniform caches of the KV types of o->kv_types_mask on the S search
 *   and HC held-out chunks. */
long kv_search_halving_chunks(int n, int eta, int c0, int cmax);
long kv_search_sens_chunks(const kv_search_opts *o, const kv_model *m, int S);
long kv_search_type_chunks(const kv_search_opts *o, int S, int HC);

#ifdef __cplusplus
}
#endif
#endif
