/* kvplan plan: write a plan for given allocation parameters without searching; and the
 * options shared with kvplan search (cli/plan_args.h). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/alloc.h"
#include "kvplan/search.h"
#include "plan_args.h"

const kv_opt kv_plan_opts[KV_PLAN_OPTS_N] = {
    {"--model", NULL, KV_OPT_STR, offsetof(kv_plan_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory"},
    {"--profile", NULL, KV_OPT_STR, offsetof(kv_plan_args, profile), "P",
     .help = "profile.h5 of this model (kvplan profile; not needed for uniform)"},
    {"--context", NULL, KV_OPT_INT, offsetof(kv_plan_args, context), "C", 2, 1 << 22,
     .help = "tokens per chunk the ratio refers to (default: the model's context)"},
    {"-o", "--output", KV_OPT_STR, offsetof(kv_plan_args, out), "PLAN.h5",
     .help = "output plan (written atomically)"},
    {"--quiet", NULL, KV_OPT_FLAG, offsetof(kv_plan_args, quiet), .help = "no progress on stderr"},
};

int kv_plan_args_setup(const kv_plan_args *a, kv_model **m, kv_profile_inputs *prof, int *have_prof,
                       kv_alloc_params *ap, kv_policy *policy, int *evict_block, kv_error *err) {
    *m = NULL;
    *have_prof = 0;
    memset(prof, 0, sizeof *prof);
    kv_alloc_params_default(ap);
    if (!a->model) return kv_fail(err, KV_EINPUT, "--model MODEL is required");
    if (!(a->b.ratio > 0.0))
        return kv_fail(err, KV_EINPUT,
                       "--ratio R is required (0 < R <= 1 of the full F16 cache, up to 2 in f32)");
    if (!a->out && !a->no_output) return kv_fail(err, KV_EINPUT, "-o PLAN.h5 is required");
    int rc = a->b.allocation ? kv_alloc_parse(a->b.allocation, &ap->kind, err) : KV_OK;
    if (rc) return rc;
    *policy = KV_POLICY_SINK;
    if (a->b.policy && (rc = kv_policy_parse(a->b.policy, policy, err))) return rc;
    if (ap->kind != KV_ALLOC_UNIFORM && !a->profile)
        return kv_fail(err, KV_EINPUT, "--profile P is required for allocation %s",
                       kv_alloc_name(ap->kind));
    const char *inputs[] = {a->model, a->profile};
    if (a->out && (rc = kv_check_output(a->out, "-o", inputs, 2, err))) return rc;
    if ((rc = kv_cli_load_model(a->model, m, err))) return rc;
    if ((rc = kv_budget_args_type(&a->b, &ap->kv_type, err))) return rc;
    /* the allocators share tokens: R in bytes over the full F16 cache -> a token fraction */
    rc = kv_search_ratio_tokens(a->b.ratio, ap->kv_type, (*m)->cfg.head_dim, &ap->ratio, err);
    if (rc) return rc;
    ap->context = a->context ? (int)a->context : (*m)->cfg.seq_len;
    if (ap->context > (*m)->cfg.seq_len)
        return kv_fail(err, KV_EINPUT, "--context %d exceeds the model's context %d", ap->context,
                       (*m)->cfg.seq_len);
    ap->block_size = a->b.block_size ? (int)a->b.block_size : KV_DEFAULT_BLOCK_SIZE;
    *evict_block = a->b.evict_block ? (int)a->b.evict_block : KV_DEFAULT_EVICT_BLOCK;
    if (*evict_block > ap->context)
        return kv_fail(err, KV_EINPUT, "--evict-block %d exceeds the context %d", *evict_block,
                       ap->context);
    ap->min_tokens = kv_policy_fixed_tokens(*policy) + *evict_block;
    ap->layer_kind = KV_ALLOC_SQUEEZE;
    if (a->profile) {
        rc = kv_profile_inputs_read(a->profile, *m, prof, err);
        if (rc) return rc;
        *have_prof = 1;
    }
    return KV_OK;
}

#define STR_(x) #x
#define STR(x) STR_(x)

typedef struct plan_cmd_args {
    double t, r, p;
    kv_plan_args a;
} plan_cmd_args;

static const kv_opt plan_opts[] = {
    {"--t", NULL, KV_OPT_NUM, offsetof(plan_cmd_args, t), "T", 0.0, 1.0,
     .help = "BaKlaVa similarity threshold (baklava: required)"},
    {"--r", NULL, KV_OPT_NUM, offsetof(plan_cmd_args, r), "R2", 0.0, 1.0,
     .help = "BaKlaVa reduction (baklava: required)"},
    {"--p", NULL, KV_OPT_NUM, offsetof(plan_cmd_args, p), "P", 0.0, 1.0,
     .def = STR(KV_SQUEEZE_DEFAULT_P),
     .help = "SqueezeAttention fraction kept by the most similar layers (1 = uniform layers)"},
};

const kv_cli_spec kv_spec_plan = {
    "plan",
    "usage: kvplan plan --profile P --model MODEL --ratio R --allocation A\n"
    "                   [--t T --r R2] [--p P] [options] -o PLAN.h5\n",
    "Write per-head KV budgets for the given parameters without searching:\n"
    "layer budgets (uniform or SqueezeAttention with fraction p), BaKlaVa Alg. 2 inside\n"
    "each layer (threshold T on head similarity, reduction R2), rounded to whole blocks\n"
    "by a GLPK MIP so that the total is floor(R * L * H_kv * C / b_s) blocks.\n",
    NULL,
    {{NULL, plan_opts, sizeof plan_opts / sizeof plan_opts[0], 0},
     {"plan and search options", kv_plan_opts, KV_PLAN_OPTS_N, offsetof(plan_cmd_args, a)},
     {"KV budget options", kv_budget_opts, KV_BUDGET_OPTS_CORE,
      offsetof(plan_cmd_args, a) + offsetof(kv_plan_args, b)}},
};

/* The plan's summary: allocation, ratio, total budget and every head's budget. */
static void print_plan(const kv_plan_args *a, const kv_model *m, const kv_alloc_params *ap,
                       const int *tokens) {
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    long sum = 0;
    for (int i = 0; i < nh; i++) sum += tokens[i];
    printf("plan         %s\nallocation   %s", a->out, kv_alloc_name(ap->kind));
    if (ap->kind == KV_ALLOC_BAKLAVA)
        printf(" (t %.3g, r %.3g, p %.3g)", ap->t, ap->r, ap->p);
    else if (ap->kind == KV_ALLOC_SQUEEZE)
        printf(" (p %.3g)", ap->p);
    printf("\nratio        %.4g of the full F16 cache (%s: %.4g of %d layers x %d KV heads x %d "
           "tokens)\n",
           a->b.ratio, kv_type_name(ap->kv_type), ap->ratio, m->cfg.n_layers, m->cfg.n_kv_heads,
           ap->context);
    printf("budget       %ld tokens in %d-token blocks (%.4f of the full cache)\n", sum,
           ap->block_size, (double)sum / ((double)nh * ap->context));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        printf("layer %-3d   ", l);
        for (int j = 0; j < m->cfg.n_kv_heads; j++)
            printf(" %5d", tokens[l * m->cfg.n_kv_heads + j]);
        printf("\n");
    }
}

/* kvplan plan reads no text: sensitivity planning measures loss curves, that is a search. */
static int check_allocation(const kv_plan_args *a, kv_error *err) {
    const char *al = a->b.allocation;
    if (al && (!strcmp(al, "sensitivity") || !strcmp(al, "both")))
        return kv_fail(err, KV_EINPUT,
                       "allocation %s measures per-head loss curves on text, which kvplan plan "
                       "does not read; run kvplan search --allocation %s --text T with the same "
                       "--model, --ratio and -o",
                       al, al);
    return KV_OK;
}

int kv_cmd_plan(int argc, char **argv) {
    plan_cmd_args pa = {.t = NAN, .r = NAN};
    int code = kv_cli_parse(&kv_spec_plan, argc, argv, &pa);
    if (code >= 0) return code;
    /* build: model, profile, allocation parameters */
    kv_error err = {0};
    const kv_plan_args *a = &pa.a;
    kv_model *m = NULL;
    kv_profile_inputs prof;
    memset(&prof, 0, sizeof prof);
    int have_prof = 0, evict_block = 0;
    kv_alloc_params ap;
    kv_alloc_params_default(&ap);
    kv_policy policy = KV_POLICY_SINK;
    int rc = check_allocation(a, &err);
    if (!rc) rc = kv_plan_args_setup(a, &m, &prof, &have_prof, &ap, &policy, &evict_block, &err);
    if (!rc && ap.kind == KV_ALLOC_BAKLAVA && (isnan(pa.t) || isnan(pa.r)))
        rc = kv_fail(&err, KV_EINPUT,
                     "allocation baklava needs --t T and --r R2 (or use "
                     "kvplan search to find them)");
    ap.t = pa.t;
    ap.r = pa.r;
    ap.p = pa.p;
    /* run: budgets per head, rounded to blocks */
    int *tokens = NULL, *blocks = NULL;
    int nh = m ? m->cfg.n_layers * m->cfg.n_kv_heads : 0;
    if (!rc) {
        tokens = kv_malloc((size_t)nh * sizeof *tokens, "budgets", &err);
        blocks = kv_malloc((size_t)nh * sizeof *blocks, "blocks", &err);
        if (!tokens || !blocks) rc = KV_EINTERNAL;
    }
    if (!rc)
        rc = kv_plan_budgets(&ap, m->cfg.n_layers, m->cfg.n_kv_heads,
                             have_prof ? prof.layer_sim : NULL, have_prof ? prof.head_sim : NULL,
                             have_prof ? prof.head_imp : NULL, tokens, blocks, NULL, &err);
    /* report: the plan file and its summary */
    char cmd[4096] = "kvplan ";
    kv_cli_command_line(argc, argv, cmd + 7, sizeof cmd - 7);
    if (!rc)
        rc = kv_plan_file_write(a->out, cmd, a->profile, m, &ap, policy, evict_block, tokens, NULL,
                                NULL, &err);
    if (!rc) print_plan(a, m, &ap, tokens);
    free(tokens);
    free(blocks);
    kv_profile_inputs_free(&prof);
    kv_model_free(m);
    return rc ? kv_cli_report("plan", &err) : 0;
}
