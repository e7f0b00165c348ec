/* Options shared by `kvplan search` and `kvplan plan` (cli/cmd_search.c, cli/cmd_plan.c). */
#ifndef KVPLAN_CLI_PLAN_ARGS_H
#define KVPLAN_CLI_PLAN_ARGS_H

#include "kvplan/alloc.h"
#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/search.h"

typedef struct kv_plan_args {
    const char *profile, *model, *out, *policy, *allocation;
    double ratio;     /* 0 = not given */
    long context;     /* 0 = the model's seq_len */
    long evict_block; /* 0 = default 16 */
    long block_size;  /* 0 = default 16 */
    int quiet;
} kv_plan_args;

/* Take one shared option at argv[*i] (--profile, --model, -o/--output, --ratio, --policy,
 * --allocation, --context, --evict-block, --block-size, --quiet): 1 taken, 0 not one of
 * them, -1 error (err filled). */
int kv_plan_args_take(kv_plan_args *a, int argc, char **argv, int *i, kv_error *err);

/* Check the required options, load the model (*m, caller frees with kv_model_free) and the
 * profile (*prof, kv_profile_inputs_free; not needed and left empty for allocation uniform
 * without --profile), and fill the allocation parameters (kind, ratio, context, b_s,
 * min_tokens = policy fixed part + p), the policy and p. */
int kv_plan_args_setup(const kv_plan_args *a, kv_model **m, kv_profile_inputs *prof, int *have_prof,
                       kv_alloc_params *ap, kv_policy *policy, int *evict_block, kv_error *err);

/* Help text of the shared options. */
extern const char kv_plan_args_help[];

#endif
