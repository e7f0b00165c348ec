/* --plan / --ratio / --allocation / --policy / --evict-block / --block-size (cli/cli.h). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/eval.h"

const char kv_budget_args_help[] =
    "KV budget options (default: the full cache):\n"
    "  --plan PLAN.h5         per-head budgets from a plan (kvplan search / kvplan plan)\n"
    "  --ratio R              kept fraction of the full cache, 0 < R <= 1 ...\n"
    "  --allocation uniform   ... shared equally by every KV head (rounded down to blocks)\n"
    "  --policy P             eviction policy: sink (default), h2o, avgattn, l2attn\n"
    "  --evict-block p        tokens processed between evictions (default: the plan's, else\n"
    "                         16; 1 = token-by-token streaming)\n"
    "  --block-size b         tokens per KV block (default 16, or the plan's)\n"
    "  --device D             auto (default: CUDA when built and a device is present, else\n"
    "                         the CPU), cpu or cuda\n";

int kv_budget_args_take(kv_budget_args *a, int argc, char **argv, int *i, kv_error *err) {
    const char *v = NULL;
    int r;
    if ((r = kv_cli_opt(argc, argv, i, "--device", &v, err))) {
        if (r > 0) a->device = v;
        return r;
    }
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

int kv_cli_device(const char *s, kv_device *out, kv_error *err) {
    *out = KV_DEVICE_AUTO;
    return s ? kv_device_parse(s, out, err) : KV_OK;
}

int kv_budget_args_plan(const kv_budget_args *a, const kv_model *m, int context, kv_plan *out,
                        kv_device *device, kv_error *err) {
    memset(out, 0, sizeof *out);
    int rc = kv_cli_device(a->device, device, err);
    if (rc) return rc;
    kv_policy policy = KV_POLICY_SINK;
    if (a->policy && (rc = kv_policy_parse(a->policy, &policy, err))) return rc;
    if (a->plan && a->ratio > 0.0)
        return kv_fail(err, KV_EINPUT, "give either --plan or --ratio, not both");
    if (a->allocation && strcmp(a->allocation, "uniform") != 0)
        return kv_fail(err, KV_EINPUT,
                       "--allocation %s: only 'uniform' is computed here; other allocations "
                       "come from a plan (kvplan plan / kvplan search)",
                       a->allocation);
    if (a->allocation && !(a->ratio > 0.0))
        return kv_fail(err, KV_EINPUT, "--allocation needs --ratio R");
    int p = a->evict_block ? (int)a->evict_block : KV_DEFAULT_EVICT_BLOCK;
    int bs = a->block_size ? (int)a->block_size : KV_DEFAULT_BLOCK_SIZE;
    if (p > context) p = context;
    if (!a->plan) {
        if (a->ratio > 0.0 && a->ratio < 1.0)
            return kv_plan_uniform(&m->cfg, a->ratio, context, bs, p, policy, out, err);
        return kv_plan_full(&m->cfg, context, bs, p, policy, out, err);
    }
    if ((rc = kv_plan_read(a->plan, out, err))) return rc;
    if ((rc = kv_plan_check_model(out, m, err))) goto fail;
    if (out->context != context) {
        rc = kv_fail(err, KV_EINPUT,
                     "%s: the plan was made for context %d but this run uses %d; pass --context "
                     "%d or make a plan for this context",
                     a->plan, out->context, context, out->context);
        goto fail;
    }
    if (a->policy) {
        out->policy = policy;
        for (int i = 0; i < out->n_layers * out->n_kv_heads; i++) out->head_policy[i] = policy;
    }
    if (a->evict_block) out->evict_block = (int)a->evict_block;
    if (a->block_size) out->block_size = (int)a->block_size;
    if ((rc = kv_plan_validate(out, a->plan, err))) goto fail;
    return KV_OK;
fail:
    kv_plan_free(out);
    return rc;
}
