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
            "                     [--allocation both|sensitivity|baklava|squeeze|uniform]\n"
            "                     [--t-grid a:b:step]\n"
            "                     [--r-grid a:b:step] [--p-grid ...] [--eval-tokens N]\n"
            "                     [--heldout-tokens N] [--halving ETA] [options] -o PLAN.h5\n"
            "BaKlaVa Alg. 3: every grid point's budgets are evaluated by budgeted perplexity on\n"
            "the first N tokens of the text (chunks of C tokens, a fresh cache per chunk); the\n"
            "minimum wins. The baselines full, uniform and squeeze are evaluated at the same\n"
            "ratio, and the winner and the baselines once more on held-out tokens after the\n"
            "search tokens. Grid points with identical rounded budgets share one evaluation.\n"
            "Sensitivity planning (--allocation both, the default, or sensitivity): every KV\n"
            "head's loss curve (change of NLL and KL to the full cache when that head alone\n"
            "gets budget b) is measured on the first search chunks in batched passes; a\n"
            "multiple-choice knapsack (GLPK MIP) picks one budget (and policy) per head under\n"
            "the same total; the solution is verified and refined on the search tokens. The\n"
            "better of it and the grid's winner on the search tokens becomes the plan.\n"
            "Without --block-size/--evict-block, b_s = p is chosen from R and C so that budget\n"
            "can move between heads (at least 8 blocks per head on average, floor <= half).\n"
            "Without --evict-block, the winner and uniform are then measured at p/2, ..., 1\n"
            "on the search tokens and the best (budgets, p) becomes the plan (a smaller p\n"
            "keeps more context per head at the same memory, for more eviction work).\n\n"
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
            "                         1/ETA, ETA times more chunks, ... (default: exhaustive)\n"
            "  --calib-chunks N       sensitivity: calibration chunks (default 2)\n"
            "  --sens-levels N        sensitivity: measured budget levels per head (default 16)\n"
            "  --sens-rounds N        sensitivity: solve rounds, 1 = no refinement (default 3)\n"
            "  --sens-batch N         sensitivity: perturbations per batched pass (default 32)\n"
            "  --sens-objective O     sensitivity: what the knapsack sums: kl (default: KL to the\n"
            "                         full cache), nll, or both (one solution each, the better\n"
            "                         on the search tokens kept)\n"
            "  --sens-policies LIST   sensitivity: policies a head may choose, e.g. sink,h2o\n"
            "                         (default: the --policy only)\n"
            "  --resume               continue a killed run from its task log PLAN.h5.tasks\n"
            "                         (written as the run goes, removed when it finishes)\n"
            "Under `mpirun -np N` or `srun` the chunk evaluations are shared among the ranks\n"
            "(rank 0 writes the plan, identical to a one-process run's).\n%s",
            KV_SQUEEZE_DEFAULT_P, kv_plan_args_help);
}

/* Default b_s = p from R and C (DESIGN.md "Sensitivity planning"; issue 13): the largest of
 * 16, 8, 4, 2, 1 with at least 8 blocks per head on average (R * C / b_s >= 8) and the
 * policy's floor (fixed part + p) at most half of R * C, so budget can move between heads.
 * Values given on the command line are kept. Refuses when even b_s = p = 1 leaves no room. */
static int choose_blocks(const kv_plan_args *a, kv_policy policy, kv_alloc_params *ap,
                         int *evict_block, kv_error *err) {
    if (a->block_size && a->evict_block) return KV_OK;
    double u = ap->ratio * ap->context;
    int fixed = kv_policy_fixed_tokens(policy);
    for (int b = 16; b >= 1; b /= 2) {
        int bs = a->block_size ? (int)a->block_size : b;
        int p = a->evict_block ? (int)a->evict_block : b;
        if (u / bs >= 8.0 && fixed + p <= u / 2) {
            ap->block_size = bs;
            *evict_block = p;
            ap->min_tokens = fixed + p;
            return KV_OK;
        }
    }
    return kv_fail(err, KV_EINPUT,
                   "R = %g of C = %d is %.1f tokens per head: with the %s policy's %d fixed "
                   "tokens no block size leaves room to move budget between heads; pass a "
                   "larger --ratio or --context, or --block-size 1 --evict-block 1 to accept it",
                   ap->ratio, ap->context, u, kv_policy_name(policy), fixed);
}

/* "sink,h2o" -> policies (at most KV_SENS_MAX_POLICIES). */
static int parse_policies(const char *s, kv_policy *out, int *n, kv_error *err) {
    *n = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == KV_SENS_MAX_POLICIES)
            return kv_fail(err, KV_EINPUT, "--sens-policies '%s': at most %d policies", s,
                           KV_SENS_MAX_POLICIES);
        int rc = kv_policy_parse(t, &out[*n], err);
        if (rc) return kv_fail_context(err, "--sens-policies '%s'", s);
        (*n)++;
    }
    if (*n == 0) return kv_fail(err, KV_EINPUT, "--sens-policies '%s': no policy", s);
    return KV_OK;
}

static int mixed_policies(const kv_policy *p, int n, kv_policy base) {
    for (int i = 0; i < n; i++)
        if (p[i] != base) return 1;
    return 0;
}

int kv_cmd_search(int argc, char **argv) {
    kv_error err = {0};
    kv_plan_args a;
    memset(&a, 0, sizeof a);
    const char *tok_path = NULL, *text_path = NULL, *tg = NULL, *rg = NULL, *pg = NULL,
               *device_name = NULL;
    long eval_tokens = 8192, heldout_tokens = 4096, eta = 0;
    long calib = 2, levels = 16, rounds = 3, sbatch = 32;
    const char *sobj = NULL, *spol = NULL;
    int resume = 0;
    const kv_cli_numopt nums[] = {
        {"--eval-tokens", .lval = &eval_tokens, .llo = 2, .lhi = 1L << 40},
        {"--heldout-tokens", .lval = &heldout_tokens, .llo = 0, .lhi = 1L << 40},
        {"--calib-chunks", .lval = &calib, .llo = 1, .lhi = 1 << 20},
        {"--sens-levels", .lval = &levels, .llo = 2, .lhi = 4096},
        {"--sens-rounds", .lval = &rounds, .llo = 1, .lhi = 100},
        {"--sens-batch", .lval = &sbatch, .llo = 1, .lhi = 64},
        {"--halving", .lval = &eta, .llo = 2, .lhi = 1000},
    };
    for (int i = 1; i < argc; i++) {
        int k;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--resume")) {
            resume = 1;
            continue;
        }
        if ((k = kv_plan_args_take(&a, argc, argv, &i, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--device", &device_name, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--text", &text_path, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--t-grid", &tg, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--r-grid", &rg, &err)) ||
            (k = kv_cli_opt(argc, argv, &i, "--p-grid", &pg, &err))) {
            if (k < 0) return kv_cli_report("search", &err);
        } else if ((k = kv_cli_opt(argc, argv, &i, "--sens-objective", &sobj, &err)) ||
                   (k = kv_cli_opt(argc, argv, &i, "--sens-policies", &spol, &err)) ||
                   (k = kv_cli_num_table(argc, argv, &i, nums, sizeof nums / sizeof nums[0],
                                         &err))) {
            if (k < 0) return kv_cli_report("search", &err);
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
    kv_tasks *tasks = NULL; /* MPI ranks when started by mpirun / srun */
    if (kv_tasks_init(NULL, NULL, &tasks, &err)) return kv_cli_report("search", &err);
    const int rank = kv_tasks_rank(tasks);
    kv_model *m = NULL;
    kv_profile_inputs prof;
    memset(&prof, 0, sizeof prof);
    int have_prof = 0, evict_block = 0;
    kv_alloc_params ap;
    kv_policy policy = KV_POLICY_SINK;
    double *tv = NULL, *rv = NULL, *pv = NULL;
    int nt = 0, nr = 0, np = 0;
    kv_tokenizer *tok = NULL;
    int *ids = NULL, n_ids = 0;
    kv_search_result res;
    memset(&res, 0, sizeof res);
    /* the text and tokenizer are inputs too: checked before the (long) search starts */
    const char *inputs[] = {a.model, a.profile, text_path, tok_path};
    int rc = a.out ? kv_check_output(a.out, "-o", inputs, 4, &err) : KV_OK;
    if (!rc) rc = kv_check_regular(text_path, "text", &err);
    if (!rc && tok_path) rc = kv_check_regular(tok_path, "tokenizer", &err);
    /* --allocation both (default) / sensitivity / a grid allocation */
    int sensitivity = 1;
    if (!a.allocation || !strcmp(a.allocation, "both")) {
        a.allocation = "baklava";
    } else if (!strcmp(a.allocation, "sensitivity")) {
        a.allocation = "uniform"; /* the grid is then the uniform plan alone */
    } else {
        sensitivity = 0;
    }
    if (!rc) rc = kv_plan_args_setup(&a, &m, &prof, &have_prof, &ap, &policy, &evict_block, &err);
    if (!rc) rc = choose_blocks(&a, policy, &ap, &evict_block, &err);
    kv_sens_objective objective = KV_SENS_OBJ_KL;
    kv_policy spolicies[KV_SENS_MAX_POLICIES];
    int n_spol = 0;
    if (!rc && sobj) {
        if (!strcmp(sobj, "kl"))
            objective = KV_SENS_OBJ_KL;
        else if (!strcmp(sobj, "nll"))
            objective = KV_SENS_OBJ_NLL;
        else if (!strcmp(sobj, "both"))
            objective = KV_SENS_OBJ_BOTH;
        else
            rc = kv_fail(&err, KV_EINPUT, "--sens-objective '%s': expected kl, nll or both", sobj);
    }
    if (!rc && spol) rc = parse_policies(spol, spolicies, &n_spol, &err);
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
    kv_progress_init(&prog, a.quiet || rank != 0); /* progress from rank 0 only */
    kv_search_opts so;
    if (!rc) {
        kv_search_opts_default(&so, m);
        so.allocation = ap.kind;
        so.ratio = ap.ratio;
        so.context = ap.context;
        so.block_size = ap.block_size;
        so.evict_block = evict_block;
        so.evict_block_search = !a.evict_block; /* a given --evict-block is kept */
        so.policy = policy;
        so.t_values = tv, so.n_t = nt;
        so.r_values = rv, so.n_r = nr;
        so.p_values = pv, so.n_p = np;
        so.eval_tokens = eval_tokens;
        so.heldout_tokens = heldout_tokens;
        so.halving_eta = (int)eta;
        so.progress = &prog;
        so.sensitivity = sensitivity;
        so.sens.calib_chunks = (int)calib;
        so.sens.max_levels = (int)levels;
        so.sens.max_rounds = (int)rounds;
        so.sens.batch = (int)sbatch;
        so.sens.objective = objective;
        so.sens.n_policies = n_spol;
        for (int q = 0; q < n_spol; q++) so.sens.policies[q] = spolicies[q];
        rc = kv_cli_device(device_name, &so.device, &err);
    }
    char log_path[4096], key[4096] = "search";
    if (!rc) { /* the task log beside the output, keyed by the arguments (not --resume, --quiet) */
        snprintf(log_path, sizeof log_path, "%s.tasks", a.out);
        for (int i = 1; i < argc; i++) {
            if (!strcmp(argv[i], "--resume") || !strcmp(argv[i], "--quiet")) continue;
            size_t l = strlen(key);
            snprintf(key + l, sizeof key - l, " %s", argv[i]);
        }
        for (char *q = key; *q; q++)
            if (*q == '\n') *q = ' ';
        rc = kv_tasks_log_open(tasks, log_path, key, resume, &err);
    }
    rc = kv_tasks_agree(tasks, rc, &err); /* no rank enters the search alone */
    if (!rc) {
        so.tasks = tasks;
        rc = kv_search_run(m, have_prof ? &prof : NULL, ids, n_ids, &so, &res, &err);
        if (!rc && rank == 0 && !a.quiet && kv_tasks_resumed(tasks) > 0)
            fprintf(stderr, "search: %ld chunk evaluations taken from %s\n",
                    kv_tasks_resumed(tasks), log_path);
    }
    char cmd[4096] = "kvplan ";
    kv_cli_command_line(argc, argv, cmd + 7, sizeof cmd - 7);
    if (!rc && rank == 0) { /* only rank 0 writes files and prints */
        ap.kind = res.winner_kind;
        ap.t = res.best_t;
        ap.r = res.best_r;
        ap.p = res.best_p;
        rc = kv_plan_file_write(a.out, cmd, a.profile, m, &ap, policy, res.evict_block, res.tokens,
                                &so, &res, &err);
        if (!rc) kv_tasks_log_close(tasks, 1); /* a finished run leaves no log behind */
    }
    if (!rc && rank == 0) {
        printf("plan         %s\nallocation   %s", a.out,
               res.winner_sens ? "sensitivity" : kv_alloc_name(ap.kind));
        if (res.winner_sens)
            printf(" (round %d of %d%s)", res.sens.best_round + 1, res.sens.rounds,
                   mixed_policies(res.policy, m->cfg.n_layers * m->cfg.n_kv_heads, policy)
                       ? ", mixed policies"
                       : "");
        else if (ap.kind == KV_ALLOC_BAKLAVA)
            printf(" (t %.3g, r %.3g, p %.3g)", res.best_t, res.best_r, res.best_p);
        else if (ap.kind == KV_ALLOC_SQUEEZE)
            printf(" (p %.3g)", res.best_p);
        if (!res.winner_sens && ap.kind != so.allocation)
            printf(" -- the %s baseline beat the %s grid's best on the search tokens",
                   kv_alloc_name(ap.kind), kv_alloc_name(so.allocation));
        printf("\nratio        %.4g, policy %s, C %d, b_s %d, p %d\n", ap.ratio,
               kv_policy_name(policy), ap.context, ap.block_size, res.evict_block);
        if (res.n_ladder > 1) {
            printf("evict block ");
            for (int i = 0; i < res.n_ladder; i++)
                printf(" p %d: %.4f/%.4f", res.ladder_p[i], res.ladder_plan_ppl[i],
                       res.ladder_uniform_ppl[i]);
            printf(" (search ppl plan/uniform)\n");
        }
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
        if (res.have_sens) {
            printf("allocations  %-10s %-10s %-10s\n", "", "grid", "sensitivity");
            printf("             %-10s %-10.4f %-10.4f\n", "search", res.grid_ppl, res.sens_ppl);
            if (res.heldout_chunks > 0)
                printf("             %-10s %-10.4f %-10.4f\n", "held-out", res.grid_heldout,
                       res.sens_heldout);
            printf("cost         grid + baselines %ld token evals, %.1f s; sensitivity %ld token "
                   "evals (curves %ld, %.1f s), %.1f s\n",
                   res.grid_token_evals_all, res.grid_seconds, res.sens.token_evals,
                   res.sens.curves.token_evals, res.sens.curves.seconds, res.sens.seconds);
        }
        if (res.identical_to_uniform)
            fprintf(stderr,
                    "kvplan search: note: the plan is identical to the uniform plan (every head "
                    "%d tokens): no allocation beat it on the search tokens%s\n",
                    res.tokens[0],
                    ap.block_size > 1 ? "; a smaller --block-size/--evict-block leaves more room"
                                      : "");
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
    return kv_cli_finish_tasks("search", tasks, rc, &err);
}
