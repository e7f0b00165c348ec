/* kvplan search: BaKlaVa Alg. 3 parameter search by budgeted perplexity, with baselines,
 * held-out check and optional successive halving; writes plan.h5. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/search.h"
#include "kvplan/tokenizer.h"
#include "plan_args.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: kvplan search --profile P --model MODEL [--tokenizer TOK] --text T --ratio R\n"
            "                     [--allocation baklava|squeeze|uniform] [--t-grid a:b:step]\n"
            "                     [--r-grid a:b:step] [--p-grid ...] [--eval-tokens N]\n"
            "                     [--heldout-tokens N] [--halving ETA] [options] -o PLAN.h5\n"
            "BaKlaVa Alg. 3: every grid point's budgets are evaluated by budgeted perplexity on\n"
            "the first N tokens of the text (chunks of C tokens, a fresh cache per chunk); the\n"
            "minimum wins. The baselines full, uniform and squeeze are evaluated at the same\n"
            "ratio, and the winner and the baselines once more on held-out tokens after the\n"
            "search tokens. Grid points with identical rounded budgets share one evaluation.\n\n"
            "  --text T               evaluation text (tokenized with BOS first)\n"
            "  --tokenizer TOK        tokenizer file (default: the model's)\n"
            "  --device D             auto (default), cpu or cuda: where the evaluations run\n"
            "  --t-grid a:b:step      thresholds on head similarity (default 0.50:0.95:0.05)\n"
            "  --r-grid a:b:step      reductions (default 0.05:0.95:0.05)\n"
            "  --p-grid a:b:step      SqueezeAttention p values (default %.2f; squeeze searches\n"
            "                         0.1:1.0:0.1 by default); a list a,b,c works for all grids\n"
            "  --eval-tokens N        search tokens (default 8192)\n"
            "  --heldout-tokens N     held-out tokens after them (default 4096; 0 = none)\n"
            "  --halving ETA          successive halving: all points on 1 chunk, keep the best\n"
            "                         1/ETA, ETA times more chunks, ... (default: exhaustive)\n%s",
            KV_SQUEEZE_DEFAULT_P, kv_plan_args_help);
}

int kv_cmd_search(int argc, char **argv) {
    kv_error err = {0};
    kv_plan_args a;
    memset(&a, 0, sizeof a);
    const char *tok_path = NULL, *text_path = NULL, *tg = NULL, *rg = NULL, *pg = NULL,
               *device_name = NULL;
    long eval_tokens = 8192, heldout_tokens = 4096, eta = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int k;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        if ((k = kv_plan_args_take(&a, argc, argv, &i, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--device", &device_name, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--text", &text_path, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--t-grid", &tg, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--r-grid", &rg, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--p-grid", &pg, &err))) {
            if (k < 0) return kv_cli_report("search", &err);
        } else if ((k = kv_cli_opt(argc, argv, &i, "--eval-tokens", &v, &err))) {
            if (k < 0 || kv_parse_int(v, "--eval-tokens", 2, 1L << 40, &eval_tokens, &err))
                return kv_cli_report("search", &err);
        } else if ((k = kv_cli_opt(argc, argv, &i, "--heldout-tokens", &v, &err))) {
            if (k < 0 || kv_parse_int(v, "--heldout-tokens", 0, 1L << 40, &heldout_tokens, &err))
                return kv_cli_report("search", &err);
        } else if ((k = kv_cli_opt(argc, argv, &i, "--halving", &v, &err))) {
            if (k < 0 || kv_parse_int(v, "--halving", 2, 1000, &eta, &err))
                return kv_cli_report("search", &err);
        } else {
            fprintf(stderr, "kvplan search: unknown argument %s\n", argv[i]);
            help(stderr);
            return 1;
        }
    }
    if (!text_path) {
        fprintf(stderr, "kvplan search: --text T is required\n");
        help(stderr);
        return 1;
    }
    kv_model *m = NULL;
    kv_profile_inputs prof;
    int have_prof = 0, evict_block = 0;
    kv_alloc_params ap;
    kv_policy policy = KV_POLICY_SINK;
    double *tv = NULL, *rv = NULL, *pv = NULL;
    int nt = 0, nr = 0, np = 0;
    kv_tokenizer *tok = NULL;
    int *ids = NULL, n_ids = 0;
    kv_search_result res;
    memset(&res, 0, sizeof res);
    int rc = kv_plan_args_setup(&a, &m, &prof, &have_prof, &ap, &policy, &evict_block, &err);
    if (!rc) rc = kv_grid_parse(tg ? tg : "0.50:0.95:0.05", "--t-grid", 0.0, 1.0, &tv, &nt, &err);
    if (!rc) rc = kv_grid_parse(rg ? rg : "0.05:0.95:0.05", "--r-grid", 0.0, 1.0, &rv, &nr, &err);
    if (!rc) {
        char defp[32];
        snprintf(defp, sizeof defp, "%.17g", KV_SQUEEZE_DEFAULT_P);
        const char *ps = pg ? pg : (ap.kind == KV_ALLOC_SQUEEZE ? "0.1:1.0:0.1" : defp);
        rc = kv_grid_parse(ps, "--p-grid", 0.0, 1.0, &pv, &np, &err);
    }
    if (!rc) {
        char *text = NULL;
        size_t len = 0;
        rc = kv_tokenizer_load(tok_path, m, &tok, &err);
        if (!rc) rc = kv_read_file(text_path, &text, &len, &err);
        if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &ids, &n_ids, &err);
        if (rc && text) kv_fail_context(&err, "tokenizing %s", text_path);
        free(text);
    }
    kv_progress prog;
    kv_progress_init(&prog, a.quiet);
    kv_search_opts so;
    if (!rc) {
        kv_search_opts_default(&so, m);
        so.allocation = ap.kind;
        so.ratio = ap.ratio;
        so.context = ap.context;
        so.block_size = ap.block_size;
        so.evict_block = evict_block;
        so.policy = policy;
        so.t_values = tv, so.n_t = nt;
        so.r_values = rv, so.n_r = nr;
        so.p_values = pv, so.n_p = np;
        so.eval_tokens = eval_tokens;
        so.heldout_tokens = heldout_tokens;
        so.halving_eta = (int)eta;
        so.progress = &prog;
        rc = kv_cli_device(device_name, &so.device, &err);
    }
    if (!rc) {
        rc = kv_search_run(m, have_prof ? &prof : NULL, ids, n_ids, &so, &res, &err);
    }
    char cmd[4096] = "kvplan ";
    kv_cli_command_line(argc, argv, cmd + 7, sizeof cmd - 7);
    if (!rc) {
        ap.kind = res.winner_kind;
        ap.t = res.best_t;
        ap.r = res.best_r;
        ap.p = res.best_p;
        rc = kv_plan_file_write(a.out, cmd, a.profile, m, &ap, policy, evict_block, res.tokens, &so,
                                &res, &err);
    }
    if (!rc) {
        printf("plan         %s\nallocation   %s", a.out, kv_alloc_name(ap.kind));
        if (ap.kind == KV_ALLOC_BAKLAVA)
            printf(" (t %.3g, r %.3g, p %.3g)", res.best_t, res.best_r, res.best_p);
        else if (ap.kind == KV_ALLOC_SQUEEZE)
            printf(" (p %.3g)", res.best_p);
        if (ap.kind != so.allocation)
            printf(" -- the %s baseline beat the %s grid's best on the search tokens",
                   kv_alloc_name(ap.kind), kv_alloc_name(so.allocation));
        printf("\nratio        %.4g, policy %s, C %d, b_s %d, p %d\n", ap.ratio,
               kv_policy_name(policy), ap.context, ap.block_size, evict_block);
        printf("search       %s over %d points (%d distinct budgets), %d chunks x %d tokens\n",
               eta ? "successive halving" : "exhaustive", res.n_p * res.n_t * res.n_r,
               res.distinct_budgets, res.search_chunks, ap.context);
        printf("token evals  %ld (exhaustive: %ld, ratio %.3f), %.1f s\n", res.token_evals,
               res.token_evals_exhaustive,
               (double)res.token_evals /
                   (double)(res.token_evals_exhaustive ? res.token_evals_exhaustive : 1),
               res.seconds);
        printf("perplexity   %-10s %-10s %-10s %-10s %-10s\n", "", "winner", "full", "uniform",
               "squeeze");
        printf("             %-10s %-10.4f %-10.4f %-10.4f %-10.4f\n", "search", res.best_ppl,
               res.base_ppl[0], res.base_ppl[1], res.base_ppl[2]);
        if (res.heldout_chunks > 0)
            printf("             %-10s %-10.4f %-10.4f %-10.4f %-10.4f\n", "held-out",
                   res.heldout_ppl[0], res.heldout_ppl[1], res.heldout_ppl[2], res.heldout_ppl[3]);
        if (res.best_chunks < res.search_chunks)
            printf("note         the winner's search perplexity uses %d of %d chunks\n",
                   res.best_chunks, res.search_chunks);
    }
    kv_search_result_free(&res);
    free(ids);
    kv_tokenizer_free(tok);
    free(tv);
    free(rv);
    free(pv);
    kv_profile_inputs_free(&prof);
    kv_model_free(m);
    return rc ? kv_cli_report("search", &err) : 0;
}
