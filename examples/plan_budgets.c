/* An outside program on libkvplan: read a plan (plan.h5), validate it, and print its per-head
 * token budgets, one line per layer. What another serving engine would do to adopt a kvplan
 * plan for its own cache.
 *
 * Build against an installed kvplan:
 *   cc plan_budgets.c $(pkg-config --cflags --libs kvplan) -o plan_budgets
 * or with CMake (examples/CMakeLists.txt): find_package(kvplan) + kvplan::kvplan.
 * Usage: plan_budgets PLAN.h5     exit 0 ok, 1 bad plan (the reason on stderr) */
#include <kvplan/plan.h>

#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: plan_budgets PLAN.h5\n");
        return 1;
    }
    kv_plan plan = {0};
    kv_error err = {0};
    if (kv_plan_read(argv[1], &plan, &err)) { /* reads and validates */
        fprintf(stderr, "plan_budgets: %s\n", err.msg);
        return 1;
    }
    printf("%s: %d layers x %d KV heads, context %d, ratio %.6g, block %d, eviction block %d, "
           "allocation %s, policy %s\n",
           argv[1], plan.n_layers, plan.n_kv_heads, plan.context, plan.ratio, plan.block_size,
           plan.evict_block, plan.allocation, kv_policy_name(plan.policy));
    for (int l = 0; l < plan.n_layers; l++) {
        printf("layer %d:", l);
        for (int j = 0; j < plan.n_kv_heads; j++)
            printf(" %d", plan.budget[l * plan.n_kv_heads + j]);
        printf("\n");
    }
    printf("total %ld tokens of %ld (%.4f of the full cache)\n", kv_plan_total_tokens(&plan),
           (long)plan.n_layers * plan.n_kv_heads * plan.context,
           (double)kv_plan_total_tokens(&plan) /
               ((double)plan.n_layers * plan.n_kv_heads * plan.context));
    kv_plan_free(&plan);
    return 0;
}
