/* Benchmark: successive halving vs the exhaustive BaKlaVa grid (docs/design.md Planning 4).
 *
 * usage: bench_search [--model M] [--profile P] [--text T] [--ratios 0.25,0.5] [--eta 3,4]
 *                     [--context C] [--eval-tokens N]
 * For each ratio: the exhaustive search over the default grid (t 0.50:0.95:0.05 x
 * r 0.05:0.95:0.05) and successive halving with each eta, on the same search tokens. Reports
 * the winners, the halving winner's perplexity on all search chunks (from the exhaustive grid)
 * relative to the exhaustive winner's, and the token-evaluation ratio. The requirement: within
 * 0.5% of the exhaustive winner's perplexity with <= 25% of its token evaluations; the exit
 * code is 1 when a row fails it. Without --profile the model is profiled first
 * (`kvplan profile --no-hw`, 8 prompts of 256 tokens). Held-out evaluation is off here.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "../cli/cli.h"
#include "kvplan/search.h"
#include "kvplan/tokenizer.h"

static int fail(kv_error *e) {
    fprintf(stderr, "bench_search: %s\n", e->msg);
    return 2;
}

typedef struct bench_args {
    const char *model, *text, *profile, *ratios, *etas;
    long context, eval_tokens;
} bench_args;

static const kv_opt bench_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(bench_args, model), "M",
     .help = "model (default: the shared stories260K)"},
    {"--profile", NULL, KV_OPT_STR, offsetof(bench_args, profile), "P",
     .help = "profile.h5 (default: profiled first)"},
    {"--text", NULL, KV_OPT_STR, offsetof(bench_args, text), "T",
     .help = "text (default: the shared TinyStories text)"},
    {"--ratios", NULL, KV_OPT_STR, offsetof(bench_args, ratios), "LIST", .def = "0.25,0.5",
     .help = "ratios"},
    {"--eta", NULL, KV_OPT_STR, offsetof(bench_args, etas), "LIST", .def = "2,3,4",
     .help = "successive halving factors"},
    {"--context", NULL, KV_OPT_INT, offsetof(bench_args, context), "C", 2, 1 << 20,
     .help = "chunk length (default: the model's context)"},
    {"--eval-tokens", NULL, KV_OPT_INT, offsetof(bench_args, eval_tokens), "N", 2, 1099511627776.0,
     .def = "8192", .help = "search tokens"},
};

static const kv_cli_spec bench_spec = {
    "bench_search",
    "usage: bench_search [--model M] [--profile P] [--text T] [--ratios 0.25,0.5] [--eta 3,4]\n"
    "                    [--context C] [--eval-tokens N]\n",
    NULL,
    NULL,
    {{NULL, bench_opts, sizeof bench_opts / sizeof bench_opts[0], 0}},
};

int main(int argc, char **argv) {
    char model_path[4096], text_path[4096], prof_tmp[4096] = "";
    bench_args a = {0};
    int code = kv_cli_parse(&bench_spec, argc, argv, &a);
    if (code >= 0) return code ? 2 : 0;
    snprintf(model_path, sizeof model_path, "%s/models/stories260K/stories260K.bin",
             kv_shared_dir());
    snprintf(text_path, sizeof text_path, "%s/text/tinystories_val_head.txt", kv_shared_dir());
    if (a.model) snprintf(model_path, sizeof model_path, "%s", a.model);
    if (a.text) snprintf(text_path, sizeof text_path, "%s", a.text);
    const char *profile = a.profile, *ratios_s = a.ratios, *etas_s = a.etas;
    long context = a.context, eval_tokens = a.eval_tokens;
    kv_error err = {0};
    if (!profile) {
        snprintf(prof_tmp, sizeof prof_tmp, "/tmp/bench_search_profile.%ld.h5", (long)getpid());
        char *pargv[] = {"profile", model_path, "--no-hw", "--quiet", "-o", prof_tmp, NULL};
        if (kv_cmd_profile(6, pargv) != 0) return 2;
        profile = prof_tmp;
    }
    double *ratios = NULL, *etas = NULL, *tv = NULL, *rv = NULL;
    int n_ratio = 0, n_eta = 0, nt = 0, nr = 0, n_ids = 0, *ids = NULL;
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    kv_profile_inputs prof;
    memset(&prof, 0, sizeof prof);
    char *text = NULL;
    size_t len = 0;
    int rc = kv_grid_parse(ratios_s, "--ratios", 1e-9, 1.0, &ratios, &n_ratio, &err);
    if (!rc) rc = kv_grid_parse(etas_s, "--eta", 2, 1000, &etas, &n_eta, &err);
    if (!rc) rc = kv_grid_parse("0.50:0.95:0.05", "t", 0, 1, &tv, &nt, &err);
    if (!rc) rc = kv_grid_parse("0.05:0.95:0.05", "r", 0, 1, &rv, &nr, &err);
    if (!rc) rc = kv_model_load(model_path, &m, &err);
    if (!rc) rc = kv_profile_inputs_read(profile, m, &prof, &err);
    if (!rc) rc = kv_tokenizer_load(NULL, m, &tok, &err);
    if (!rc) rc = kv_read_file(text_path, &text, &len, &err);
    if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &ids, &n_ids, &err);
    free(text);
    int failed = 0;
    if (!rc) {
        printf("model %s, profile %s\ngrid t 0.50:0.95:0.05 x r 0.05:0.95:0.05 (%d points), "
               "%ld search tokens\n\n",
               model_path, profile, nt * nr, eval_tokens);
        printf("%-6s %-10s %-16s %-10s %-16s %-10s %-9s %-12s %-12s %-7s %s\n", "ratio", "method",
               "winner (t, r)", "ppl", "winner ppl@all", "vs exh.", "distinct", "token evals",
               "exhaustive", "ratio", "ok");
    }
    for (int ir = 0; ir < n_ratio && !rc; ir++) {
        kv_search_opts o;
        kv_search_opts_default(&o, m);
        o.allocation = KV_ALLOC_BAKLAVA;
        o.ratio = ratios[ir];
        if (context) o.context = (int)context;
        o.t_values = tv, o.n_t = nt, o.r_values = rv, o.n_r = nr;
        o.eval_tokens = eval_tokens;
        o.heldout_tokens = 0;
        kv_search_result ex;
        rc = kv_search_run(m, &prof, ids, n_ids, &o, &ex, &err);
        if (rc) break;
        printf("%-6.3g %-10s (%.2f, %.2f)     %-10.5f %-16.5f %-10s %-9d %-12ld %-12ld %-7.3f %s\n",
               o.ratio, "exhaust.", ex.best_t, ex.best_r, ex.best_ppl, ex.best_ppl, "-",
               ex.distinct_budgets, ex.token_evals, ex.token_evals_exhaustive, 1.0, "-");
        printf("%-6s %-10s baselines: full %.5f, uniform %.5f, squeeze %.5f (%.1f s)\n", "", "",
               ex.base_ppl[0], ex.base_ppl[1], ex.base_ppl[2], ex.seconds);
        for (int ie = 0; ie < n_eta && !rc; ie++) {
            o.halving_eta = (int)etas[ie];
            kv_search_result h;
            rc = kv_search_run(m, &prof, ids, n_ids, &o, &h, &err);
            if (rc) break;
            double at_all = ex.perplexity[h.best]; /* same point on all search chunks */
            double rel = at_all / ex.best_ppl - 1.0;
            double tr = (double)h.token_evals / (double)ex.token_evals;
            int ok = rel <= 0.005 && tr <= 0.25;
            failed |= !ok;
            char name[16];
            snprintf(name, sizeof name, "halv. %d", o.halving_eta);
            printf("%-6.3g %-10s (%.2f, %.2f)     %-10.5f %-16.5f %+-10.4f %-9d %-12ld %-12ld "
                   "%-7.3f %s\n",
                   o.ratio, name, h.best_t, h.best_r, h.best_ppl, at_all, 100.0 * rel,
                   h.distinct_budgets, h.token_evals, ex.token_evals, tr, ok ? "yes" : "NO");
            kv_search_result_free(&h);
        }
        kv_search_result_free(&ex);
        fflush(stdout);
    }
    if (!rc) printf("\n'vs exh.' is in percent of the exhaustive winner's perplexity.\n");
    if (prof_tmp[0]) remove(prof_tmp);
    free(ids);
    kv_tokenizer_free(tok);
    kv_profile_inputs_free(&prof);
    kv_model_free(m);
    free(ratios), free(etas), free(tv), free(rv);
    if (rc) return fail(&err);
    return failed ? 1 : 0;
}
