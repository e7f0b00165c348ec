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

#ifdef __cplusplus
}
#endif
#endif
