/* kvplan inspect FILE.h5 [--png DIR] [--json] [--export FORMAT]: summarise, draw and export a
 * kvplan profile or plan file (issue 8). */
#include <cairo.h>
#include <fontconfig/fontconfig.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "inspect.h"
#include "kvplan/plan.h"

static const char *help =
    "usage: kvplan inspect FILE.h5 [--png DIR] [--json] [--export FORMAT]\n"
    "Summarise a kvplan file: provenance and model; for a profile the KV heads of each layer\n"
    "ordered by importance, layer similarity, prompt consistency and hardware fits (with the\n"
    "sizes each bandwidth fit used); for a plan the ratio, policy, allocation, the winner\n"
    "(/search@winner), budgets per layer and KV head, the search grid (best and worst cell\n"
    "over p, t, r), baselines, and whatever KVPR and batch tables it holds.\n"
    "  --png DIR        also write heatmaps (1200x800 PNG) into DIR: head_importance.png,\n"
    "                   token_cos.png, layer_similarity.png, consistency.png (profile);\n"
    "                   search_perplexity.png (the (t, r) grid, one panel per\n"
    "                   SqueezeAttention p), budget_tokens.png (plan)\n"
    "  --json           print the same content as one JSON document instead of text\n"
    "                   (every dataset as nested lists, NaN as null)\n"
    "  --export FORMAT  print only one table, for other tools:\n"
    "                   budgets-tsv     plan budgets B[l][j] in tokens: one row per layer, one\n"
    "                                   tab-separated column per KV head (DuoAttention's\n"
    "                                   pattern-file shape)\n"
    "                   importance-tsv  profile head importance, same shape\n"
    "                   layer-fractions plan's kept fraction per layer as a list\n"
    "                                   [f_0, ..., f_L-1] (kvpress per-layer compression takes\n"
    "                                   1 - f as its compression ratios)\n"
    "Exit codes: 0 ok, 1 bad input (not HDF5, not a kvplan file, newer schema, missing data),\n"
    "2 internal error.\n";

static int export_matrix(const ki_file *f, const char *path, int as_int, kv_error *err) {
    int L = 0, hkv = 0;
    double *imp = NULL;
    const double *v = ki_matrix(f, path, 0, &L, &hkv);
    if (!v && !strcmp(path, "/heads/importance")) v = imp = ki_head_importance(f, &L, &hkv);
    if (!v)
        return kv_fail(err, KV_EINPUT, "%s: no %s [L, H_kv] dataset (is it a %s file?)", f->path,
                       path, as_int ? "plan" : "profile");
    for (int l = 0; l < L; l++) {
        for (int j = 0; j < hkv; j++) {
            double x = v[(size_t)l * hkv + j];
            if (j) putchar('\t');
            if (as_int)
                printf("%.0f", x);
            else
                printf("%.6f", x);
        }
        putchar('\n');
    }
    free(imp);
    return KV_OK;
}

static int export_fractions(const ki_file *f, kv_error *err) {
    int L = 0;
    double *fr = ki_layer_fractions(f, &L, err);
    if (!fr) return err->code ? err->code : KV_EINPUT;
    putchar('[');
    for (int l = 0; l < L; l++) printf("%s%.6g", l ? ", " : "", fr[l]);
    printf("]\n");
    free(fr);
    return KV_OK;
}

int kv_cmd_inspect(int argc, char **argv) {
    kv_error err = {0};
    const char *file = NULL, *png_dir = NULL, *export_fmt = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((r = kv_cli_opt(argc, argv, &i, "--png", &png_dir, &err))) {
            if (r < 0) return kv_cli_report("inspect", &err);
        } else if ((r = kv_cli_opt(argc, argv, &i, "--export", &export_fmt, &err))) {
            if (r < 0) return kv_cli_report("inspect", &err);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "kvplan inspect: unknown option %s\n%s", argv[i], help);
            return 1;
        } else if (!file) {
            file = argv[i];
        } else {
            fprintf(stderr, "kvplan inspect: unexpected argument %s\n%s", argv[i], help);
            return 1;
        }
    }
    if (!file) {
        fprintf(stderr, "kvplan inspect: FILE.h5 is required\n%s", help);
        return 1;
    }
    if (json && export_fmt) {
        fprintf(stderr, "kvplan inspect: --json and --export both choose the output; pick one\n");
        return 1;
    }
    if (export_fmt && strcmp(export_fmt, "budgets-tsv") && strcmp(export_fmt, "importance-tsv") &&
        strcmp(export_fmt, "layer-fractions")) {
        fprintf(stderr,
                "kvplan inspect: --export '%s' is not one of budgets-tsv, "
                "importance-tsv, layer-fractions\n",
                export_fmt);
        return 1;
    }
    ki_file f;
    int rc = ki_load(file, &f, &err);
    int invalid_plan = 0;
    kv_error plan_err = {0};
    if (!rc && f.is_plan) {
        /* a plan is validated by the plan module, the same checks as `run --plan`; a broken
         * one is still shown (that is what inspect is for) but the command exits 1 */
        kv_plan p;
        invalid_plan = kv_plan_read(file, &p, &plan_err) != KV_OK;
        kv_plan_free(&p);
    }
    if (!rc && png_dir) {
        int n = 0;
        rc = ki_write_pngs(&f, png_dir, stderr, &n, &err);
        /* the command draws nothing more: release cairo's font caches and fontconfig's
         * configuration, so that leak checkers see nothing left over */
        cairo_debug_reset_static_data();
        FcFini();
        if (!rc && n == 0) fprintf(stderr, "kvplan inspect: %s holds nothing to draw\n", file);
    }
    if (!rc) {
        if (export_fmt && !strcmp(export_fmt, "budgets-tsv"))
            rc = export_matrix(&f, "/budget/tokens", 1, &err);
        else if (export_fmt && !strcmp(export_fmt, "importance-tsv"))
            rc = export_matrix(&f, "/heads/importance", 0, &err);
        else if (export_fmt)
            rc = export_fractions(&f, &err);
        else if (json)
            rc = ki_print_json(stdout, &f, &err);
        else
            ki_print_text(stdout, &f);
    }
    ki_free(&f);
    fflush(stdout);
    if (!rc && invalid_plan) return kv_cli_report("inspect", &plan_err);
    return rc ? kv_cli_report("inspect", &err) : 0;
}
