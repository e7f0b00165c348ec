/* --plan / --ratio / --allocation / --policy / --evict-block / --block-size (cli/cli.h). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/eval.h"

/* The KV budget options, one table for run, eval, search and plan (cli/cli.h). --ratio is a
 * kept fraction in (0, 1]: kv_plan_uniform's definition (0 keeps nothing, 1 the full cache);
 * plan and search used to refuse below 1e-9 instead, a stand-in for the open bound. */
const kv_opt kv_budget_opts[KV_BUDGET_OPTS_ALL] = {
    {"--kv-type", NULL, KV_OPT_STR, offsetof(kv_budget_args, kv_type), "T",
     .help = "KV storage type of every head: f16 (default; a plan file: its own types), f32, "
             "q8 (int8 + a binary16 scale per row of d_h) or q4 (4-bit + scale and minimum per "
             "row)"},
    {"--ratio", NULL, KV_OPT_NUM, offsetof(kv_budget_args, ratio), "R", 0.0, KV_PLAN_MAX_RATIO,
     .lo_open = 1,
     .help = "kept bytes over the full F16 cache's (1 = the full cache in F16; up to 2 for "
             "f32)"},
    {"--allocation", NULL, KV_OPT_STR, offsetof(kv_budget_args, allocation), "A",
     .help = "how R is shared among the KV heads: uniform (run, eval: equal shares rounded "
             "down to blocks; other allocations come from a plan), baklava (plan's default), "
             "squeeze; search also takes sensitivity and both (its default)"},
    {"--policy", NULL, KV_OPT_STR, offsetof(kv_budget_args, policy), "P",
     .help = "eviction policy: sink (default; run, eval: the plan's), h2o, avgattn, l2attn"},
    {"--evict-block", NULL, KV_OPT_INT, offsetof(kv_budget_args, evict_block), "p", 1, 1 << 20,
     .help = "tokens processed between evictions (default: the plan's, else 16; search chooses "
             "it from R and C; 1 = token-by-token streaming)"},
    {"--block-size", NULL, KV_OPT_INT, offsetof(kv_budget_args, block_size), "b", 1, 4096,
     .help = "tokens per KV block (default: the plan's, else 16; search chooses it from R and "
             "C)"},
    {"--device", NULL, KV_OPT_STR, offsetof(kv_budget_args, device), "D",
     .help = "auto (default: CUDA when built and a device is present, else the CPU), cpu or "
             "cuda"},
    {"--plan", NULL, KV_OPT_STR, offsetof(kv_budget_args, plan), "PLAN.h5",
     .help = "per-head budgets from a plan (kvplan search / kvplan plan) instead of --ratio"},
};

int kv_cli_device(const char *s, kv_device *out, kv_error *err) {
    *out = KV_DEVICE_AUTO;
    return s ? kv_device_parse(s, out, err) : KV_OK;
}

int kv_budget_args_type(const kv_budget_args *a, kv_cache_type *out, kv_error *err) {
    *out = KV_TYPE_DEFAULT;
    int rc = a->kv_type ? kv_type_parse(a->kv_type, out, err) : KV_OK;
    if (rc) kv_fail_context(err, "--kv-type");
    return rc;
}

int kv_budget_args_plan(const kv_budget_args *a, const kv_model *m, int context, kv_plan *out,
                        kv_device *device, kv_error *err) {
    memset(out, 0, sizeof *out);
    int rc = kv_cli_device(a->device, device, err);
    if (rc) return rc;
    kv_cache_type type = KV_TYPE_DEFAULT;
    if ((rc = kv_budget_args_type(a, &type, err))) return rc;
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
        /* a ratio above what the type holds in full is refused by kv_plan_uniform_typed */
        if (a->ratio > 0.0 && kv_type_token_ratio(a->ratio, type, m->cfg.head_dim) != 1.0)
            return kv_plan_uniform_typed(&m->cfg, a->ratio, type, context, bs, p, policy, out, err);
        rc = kv_plan_full(&m->cfg, context, bs, p, policy, out, err);
        if (!rc) kv_plan_set_kv_type(out, type);
        return rc;
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
    if (a->kv_type) kv_plan_set_kv_type(out, type);
    if (a->evict_block) out->evict_block = (int)a->evict_block;
    if (a->block_size) out->block_size = (int)a->block_size;
    if ((rc = kv_plan_validate(out, a->plan, err))) goto fail;
    return KV_OK;
fail:
    kv_plan_free(out);
    return rc;
}
