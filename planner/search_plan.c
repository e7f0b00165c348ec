/* kvplan search as a command runs it: the search, the guard over the texts, the retrieval
 * stage, and the parameters of the plan that won. See include/kvplan/search.h. */
#include "planner/search_impl.h"

#include <math.h>
#include <string.h>

#include "kvplan/retrieval.h"

/* The parameters of the plan that won, for kv_plan_file_write: the winner's allocation, t, r
 * and p; when the guard fell back to the uniform cache it compares with (and the retrieval
 * stage did not replace it), that cache's block size and floor. */
static void plan_params(const kv_search_opts *o, const kv_search_result *res, kv_alloc_params *ap) {
    ap->kind = res->winner_kind;
    ap->t = res->best_t;
    ap->r = res->best_r;
    ap->p = res->best_p;
    int retrieval_plan = res->retrieval && res->retrieval->chosen >= 0;
    if (!retrieval_plan && res->robust && res->robust->source[res->robust->chosen] < 0) {
        ap->kind = KV_ALLOC_UNIFORM;
        ap->block_size = res->robust->uniform_block_size;
        ap->min_tokens = kv_policy_fixed_tokens(o->policy) + res->robust->uniform_evict_block;
    }
}

int kv_search_plan(const kv_model *m, const kv_profile_inputs *prof, const int *ids, long n_ids,
                   const kv_robust_layout *lay, kv_robust_objective obj, const kv_search_opts *o,
                   const kv_probes *probes, const kv_retrieval_opts *ro, kv_search_result *res,
                   kv_robust_result *rob, kv_retrieval_result *rr, kv_alloc_params *ap,
                   kv_error *err) {
    int rc = kv_search_run(m, prof, ids, n_ids, o, res, err);
    /* the guard: per-text figures, fall back towards uniform where the plan loses */
    double w = kv_now(), cpu = kv_cpu_now();
    if (!rc) rc = kv_robust_guard(m, ids, lay, o, obj, res, rob, err);
    if (!rc) res->robust = rob;
    res->stage_wall[KV_SEARCH_ST_GUARD] = kv_now() - w;
    res->stage_cpu[KV_SEARCH_ST_GUARD] = kv_cpu_now() - cpu;
    if (!rc && probes) {
        const kv_robust_result *g = res->robust;
        int guard_bs = g && g->source[g->chosen] < 0 ? g->uniform_block_size : o->block_size;
        w = kv_now(), cpu = kv_cpu_now();
        rc = kv_retrieval_search(m, ids, lay->S, o, probes, ro, guard_bs, res, rr, err);
        if (!rc) res->retrieval = rr;
        res->stage_wall[KV_SEARCH_ST_RETRIEVAL] = kv_now() - w;
        res->stage_cpu[KV_SEARCH_ST_RETRIEVAL] = kv_cpu_now() - cpu;
    }
    if (!rc) plan_params(o, res, ap);
    return rc;
}
