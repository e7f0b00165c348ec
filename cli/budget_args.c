/* --plan / --ratio / --allocation / --policy / --evict-block / --block-size (cli/cli.h). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/eval.h"
#include "kvplan/h5io.h"

const char kv_budget_args_help[] =
    "KV budget options (default: the full cache):\n"
    "  --plan PLAN.h5         per-head budgets from a plan (kvplan search / kvplan plan)\n"
    "  --ratio R              kept fraction of the full cache, 0 < R <= 1 ...\n"
    "  --allocation uniform   ... shared equally by every KV head (rounded down to blocks)\n"
    "  --policy P             eviction policy: sink (default), h2o, avgattn, l2attn\n"
    "  --evict-block p        tokens processed between evictions (default: the plan's, else\n"
    "                         16; 1 = token-by-token streaming)\n"
    "  --block-size b         tokens per KV block (default 16, or the plan's)\n";

int kv_budget_args_take(kv_budget_args *a, int argc, char **argv, int *i, kv_error *err) {
    const char *v = NULL;
    int r;
    if ((r = kv_cli_opt(argc, argv, i, "--plan", &v, err))) {
        if (r > 0) a->plan = v;
        return r;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--ratio", &v, err))) {
        if (r < 0) return r;
        if (kv_parse_double(v, "--ratio", -1e300, 1e300, &a->ratio, err)) return -1;
        if (!(a->ratio > 0.0 && a->ratio <= 1.0)) {
            kv_fail(err, KV_EINPUT, "--ratio %g must be in (0, 1] (1 = the full cache)", a->ratio);
            return -1;
        }
        return 1;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--allocation", &v, err))) {
        if (r > 0) a->allocation = v;
        return r;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--policy", &v, err))) {
        if (r > 0) a->policy = v;
        return r;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--evict-block", &v, err))) {
        if (r < 0) return r;
        return kv_parse_int(v, "--evict-block", 1, 1 << 20, &a->evict_block, err) ? -1 : 1;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--block-size", &v, err))) {
        if (r < 0) return r;
        return kv_parse_int(v, "--block-size", 1, 4096, &a->block_size, err) ? -1 : 1;
    }
    return 0;
}

int kv_budget_args_resolve(const kv_budget_args *a, const kv_model *m, int context, int **budget,
                           kv_policy *policy, int *evict_block, int *block_size, double *ratio_out,
                           kv_error *err) {
    *budget = NULL;
    *policy = KV_POLICY_SINK;
    *evict_block = a->evict_block ? (int)a->evict_block : KV_DEFAULT_EVICT_BLOCK;
    *block_size = a->block_size ? (int)a->block_size : KV_DEFAULT_BLOCK_SIZE;
    *ratio_out = 1.0;
    if (a->plan && a->ratio > 0.0)
        return kv_fail(err, KV_EINPUT, "give either --plan or --ratio, not both");
    if (a->allocation && strcmp(a->allocation, "uniform") != 0)
        return kv_fail(err, KV_EINPUT,
                       "--allocation %s: only 'uniform' is computed here; other allocations "
                       "come from a plan (kvplan plan / kvplan search)",
                       a->allocation);
    if (a->allocation && !(a->ratio > 0.0))
        return kv_fail(err, KV_EINPUT, "--allocation needs --ratio R");
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    if (a->plan) {
        kv_plan_budget pb;
        int rc = kv_plan_budget_read(a->plan, &pb, err);
        if (rc) return rc;
        rc = kv_plan_check_model(&pb, m, a->plan, err);
        if (!rc && a->policy)
            rc = kv_policy_parse(a->policy, policy, err);
        else if (!rc)
            rc = kv_policy_parse(pb.policy, policy, err);
        if (!rc && !a->block_size) *block_size = pb.block_size;
        if (!rc && !a->evict_block && pb.evict_block > 0) *evict_block = pb.evict_block;
        if (!rc && pb.context_length != context)
            rc = kv_fail(err, KV_EINPUT,
                         "%s: the plan was made for context %d but this run uses %d; pass "
                         "--context %d or make a plan for this context",
                         a->plan, pb.context_length, context, pb.context_length);
        if (!rc) {
            *budget = malloc((size_t)nh * sizeof **budget);
            if (!*budget)
                rc = kv_fail(err, KV_EINTERNAL, "out of memory");
            else
                memcpy(*budget, pb.tokens, (size_t)nh * sizeof **budget);
            *ratio_out = pb.ratio;
        }
        kv_plan_budget_free(&pb);
        return rc;
    }
    if (a->policy) {
        int rc = kv_policy_parse(a->policy, policy, err);
        if (rc) return rc;
    }
    if (a->ratio > 0.0) {
        *budget = malloc((size_t)nh * sizeof **budget);
        if (!*budget) return kv_fail(err, KV_EINTERNAL, "out of memory");
        int rc = kv_budget_uniform(m, a->ratio, context, *block_size, *budget, err);
        if (rc) {
            free(*budget);
            *budget = NULL;
            return rc;
        }
        *ratio_out = a->ratio;
    }
    return KV_OK;
}
