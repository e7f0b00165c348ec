/* kvplan plan: write a plan for given allocation parameters without searching; and the
 * options shared with kvplan search (cli/plan_args.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/alloc.h"
#include "kvplan/search.h"
#include "plan_args.h"

const char kv_plan_args_help[] =
    "  --profile P            profile.h5 of this model (kvplan profile; not needed for uniform)\n"
    "  --model MODEL          llama2.c .bin, .gguf or Hugging Face directory\n"
    "  --ratio R              kept fraction of the full cache, 0 < R <= 1\n"
    "  --allocation A         baklava (plan's default), squeeze or uniform; search also\n"
    "                         takes sensitivity and both (its default)\n"
    "  --policy P             eviction policy: sink (default), h2o, avgattn, l2attn\n"
    "  --context C            tokens per chunk the ratio refers to (default: model context)\n"
    "  --evict-block p        tokens between evictions (default 16)\n"
    "  --block-size b         tokens per KV block (default 16)\n"
    "  -o PLAN.h5             output plan (written atomically)\n"
    "  --quiet                no progress on stderr\n";

int kv_plan_args_take(kv_plan_args *a, int argc, char **argv, int *i, kv_error *err) {
    const char *v = NULL;
    int r;
    if (!strcmp(argv[*i], "--quiet")) {
        a->quiet = 1;
        return 1;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--profile", &a->profile, err))) return r;
    if ((r = kv_cli_opt(argc, argv, i, "--model", &a->model, err))) return r;
    if ((r = kv_cli_opt(argc, argv, i, "-o", &a->out, err))) return r;
    if ((r = kv_cli_opt(argc, argv, i, "--output", &a->out, err))) return r;
    if ((r = kv_cli_opt(argc, argv, i, "--policy", &a->policy, err))) return r;
    if ((r = kv_cli_opt(argc, argv, i, "--allocation", &a->allocation, err))) return r;
    if ((r = kv_cli_opt(argc, argv, i, "--ratio", &v, err))) {
        if (r < 0) return r;
        if (kv_parse_double(v, "--ratio", 1e-9, 1.0, &a->ratio, err)) return -1;
        return 1;
    }
    if ((r = kv_cli_opt(argc, argv, i, "--context", &v, err)))
        return r < 0 || kv_parse_int(v, "--context", 2, 1 << 22, &a->context, err) ? -1 : 1;
    if ((r = kv_cli_opt(argc, argv, i, "--evict-block", &v, err)))
        return r < 0 || kv_parse_int(v, "--evict-block", 1, 1 << 20, &a->evict_block, err) ? -1 : 1;
    if ((r = kv_cli_opt(argc, argv, i, "--block-size", &v, err)))
        return r < 0 || kv_parse_int(v, "--block-size", 1, 4096, &a->block_size, err) ? -1 : 1;
    return 0;
}

int kv_plan_args_setup(const kv_plan_args *a, kv_model **m, kv_profile_inputs *prof, int *have_prof,
                       kv_alloc_params *ap, kv_policy *policy, int *evict_block, kv_error *err) {
    *m = NULL;
    *have_prof = 0;
    memset(prof, 0, sizeof *prof);
    kv_alloc_params_default(ap);
    if (!a->model) return kv_fail(err, KV_EINPUT, "--model MODEL is required");
    if (!(a->ratio > 0.0)) return kv_fail(err, KV_EINPUT, "--ratio R is required (0 < R <= 1)");
    if (!a->out) return kv_fail(err, KV_EINPUT, "-o PLAN.h5 is required");
    int rc = a->allocation ? kv_alloc_parse(a->allocation, &ap->kind, err) : KV_OK;
    if (rc) return rc;
    *policy = KV_POLICY_SINK;
    if (a->policy && (rc = kv_policy_parse(a->policy, policy, err))) return rc;
    if (ap->kind != KV_ALLOC_UNIFORM && !a->profile)
        return kv_fail(err, KV_EINPUT, "--profile P is required for allocation %s",
                       kv_alloc_name(ap->kind));
    const char *inputs[] = {a->model, a->profile};
    if ((rc = kv_check_output(a->out, "-o", inputs, 2, err))) return rc;
    if ((rc = kv_cli_load_model(a->model, m, err))) return rc;
    ap->ratio = a->ratio;
    ap->context = a->context ? (int)a->context : (*m)->cfg.seq_len;
    if (ap->context > (*m)->cfg.seq_len)
        return kv_fail(err, KV_EINPUT, "--context %d exceeds the model's context %d", ap->context,
                       (*m)->cfg.seq_len);
    ap->block_size = a->block_size ? (int)a->block_size : KV_DEFAULT_BLOCK_SIZE;
    *evict_block = a->evict_block ? (int)a->evict_block : KV_DEFAULT_EVICT_BLOCK;
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

static void help(FILE *f) {
    fprintf(f,
            "usage: kvplan plan --profile P --model MODEL --ratio R --allocation A\n"
            "                   [--t T --r R2] [--p P] [options] -o PLAN.h5\n"
            "Write per-head KV budgets for the given parameters without searching:\n"
            "layer budgets (uniform or SqueezeAttention with fraction p), BaKlaVa Alg. 2 inside\n"
            "each layer (threshold T on head similarity, reduction R2), rounded to whole blocks\n"
            "by a GLPK MIP so that the total is floor(R * L * H_kv * C / b_s) blocks.\n\n"
            "  --t T                  BaKlaVa similarity threshold in [0, 1] (baklava: required)\n"
            "  --r R2                 BaKlaVa reduction in [0, 1] (baklava: required)\n"
            "  --p P                  SqueezeAttention fraction kept by the most similar layers\n"
            "                         (default %.2f; 1 = uniform layers)\n%s",
            KV_SQUEEZE_DEFAULT_P, kv_plan_args_help);
}

int kv_cmd_plan(int argc, char **argv) {
    kv_error err = {0};
    kv_plan_args a;
    memset(&a, 0, sizeof a);
    double t = NAN, r = NAN, p = KV_SQUEEZE_DEFAULT_P;
    const kv_cli_numopt nums[] = {{"--t", .dval = &t, .dlo = 0.0, .dhi = 1.0},
                                  {"--r", .dval = &r, .dlo = 0.0, .dhi = 1.0},
                                  {"--p", .dval = &p, .dlo = 0.0, .dhi = 1.0}};
    for (int i = 1; i < argc; i++) {
        int k;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        if ((k = kv_plan_args_take(&a, argc, argv, &i, &err))) {
            if (k < 0) return kv_cli_report("plan", &err);
        } else if ((k = kv_cli_num_table(argc, argv, &i, nums, sizeof nums / sizeof nums[0],
                                         &err))) {
            if (k < 0) return kv_cli_report("plan", &err);
        } else {
            fprintf(stderr, "kvplan plan: unknown argument %s\n", argv[i]);
            help(stderr);
            return 1;
        }
    }
    kv_model *m = NULL;
    kv_profile_inputs prof;
    memset(&prof, 0, sizeof prof);
    int have_prof = 0, evict_block = 0;
    kv_alloc_params ap;
    kv_alloc_params_default(&ap);
    kv_policy policy = KV_POLICY_SINK;
    int rc = KV_OK;
    /* sensitivity planning measures loss curves on text with the model: that is a search */
    if (a.allocation && (!strcmp(a.allocation, "sensitivity") || !strcmp(a.allocation, "both")))
        rc = kv_fail(&err, KV_EINPUT,
                     "allocation %s measures per-head loss curves on text, which kvplan plan "
                     "does not read; run kvplan search --allocation %s --text T with the same "
                     "--model, --ratio and -o",
                     a.allocation, a.allocation);
    if (!rc) rc = kv_plan_args_setup(&a, &m, &prof, &have_prof, &ap, &policy, &evict_block, &err);
    if (!rc && ap.kind == KV_ALLOC_BAKLAVA && (isnan(t) || isnan(r)))
        rc = kv_fail(&err, KV_EINPUT,
                     "allocation baklava needs --t T and --r R2 (or use "
                     "kvplan search to find them)");
    ap.t = t;
    ap.r = r;
    ap.p = p;
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
    char cmd[4096] = "kvplan ";
    kv_cli_command_line(argc, argv, cmd + 7, sizeof cmd - 7);
    if (!rc)
        rc = kv_plan_file_write(a.out, cmd, a.profile, m, &ap, policy, evict_block, tokens, NULL,
                                NULL, &err);
    if (!rc) {
        long sum = 0;
        for (int i = 0; i < nh; i++) sum += tokens[i];
        printf("plan         %s\nallocation   %s", a.out, kv_alloc_name(ap.kind));
        if (ap.kind == KV_ALLOC_BAKLAVA)
            printf(" (t %.3g, r %.3g, p %.3g)", t, r, p);
        else if (ap.kind == KV_ALLOC_SQUEEZE)
            printf(" (p %.3g)", p);
        printf("\nratio        %.4g of %d layers x %d KV heads x %d tokens\n", ap.ratio,
               m->cfg.n_layers, m->cfg.n_kv_heads, ap.context);
        printf("budget       %ld tokens in %d-token blocks (%.4f of the full cache)\n", sum,
               ap.block_size, (double)sum / ((double)nh * ap.context));
        for (int l = 0; l < m->cfg.n_layers; l++) {
            printf("layer %-3d   ", l);
            for (int j = 0; j < m->cfg.n_kv_heads; j++)
                printf(" %5d", tokens[l * m->cfg.n_kv_heads + j]);
            printf("\n");
        }
    }
    free(tokens);
    free(blocks);
    kv_profile_inputs_free(&prof);
    kv_model_free(m);
    return rc ? kv_cli_report("plan", &err) : 0;
}
