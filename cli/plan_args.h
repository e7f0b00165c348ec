/* Options shared by `kvplan search` and `kvplan plan` (cli/cmd_search.c, cli/cmd_plan.c). */
#ifndef KVPLAN_CLI_PLAN_ARGS_H
#define KVPLAN_CLI_PLAN_ARGS_H

#include "kvplan/alloc.h"
#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/search.h"

#include "cli.h"

typedef struct kv_plan_args {
    const char *profile, *model, *out;
    long context; /* 0 = the model's seq_len */
    int quiet;
    int no_output;    /* 1: no -o needed (search --estimate) */
    kv_budget_args b; /* ratio (required), allocation, policy, evict_block, block_size;
                       * search also device */
} kv_plan_args;

/* The options of kv_plan_args itself (--model / MODEL, --profile, --context, -o / --output,
 * --quiet); the budget options are kv_budget_opts at offsetof(kv_plan_args, b). */
#define KV_PLAN_OPTS_N 5
extern const kv_opt kv_plan_opts[KV_PLAN_OPTS_N];

/* Check the required options, load the model (*m, caller frees with kv_model_free) and the
 * profile (*prof, kv_profile_inputs_free; not needed and left empty for allocation uniform
 * without --profile), and fill the allocation parameters (kind, ratio, context, b_s,
 * min_tokens = policy fixed part + p), the policy and p. */
int kv_plan_args_setup(const kv_plan_args *a, kv_model **m, kv_profile_inputs *prof, int *have_prof,
                       kv_alloc_params *ap, kv_policy *policy, int *evict_block, kv_error *err);

#endif
