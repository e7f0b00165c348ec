/* kvplan inspect FILE.h5 [--png DIR] [--json] [--export FORMAT]: summarise, draw and export a
 * kvplan profile or plan file. */
#include <cairo.h>
#include <fontconfig/fontconfig.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "inspect.h"
#include "kvplan/plan.h"
#include "kvplan/search.h"

typedef struct inspect_args {
    const char *file, *png_dir, *export_fmt;
    int json;
} inspect_args;

static const kv_opt inspect_opts[] = {
    {NULL, NULL, KV_OPT_STR, offsetof(inspect_args, file), "FILE.h5", .positional = 1,
     .help = "a kvplan profile or plan file"},
    {"--png", NULL, KV_OPT_STR, offsetof(inspect_args, png_dir), "DIR",
     .help = "also write heatmaps (1200x800 PNG) into DIR: head_importance.png, "
             "token_cos.png, layer_similarity.png, consistency.png (profile); "
             "search_perplexity.png (the (t, r) grid, one panel per SqueezeAttention p), "
             "budget_tokens.png (plan)"},
    {"--json", NULL, KV_OPT_FLAG, offsetof(inspect_args, json),
     .help = "print the same content as one JSON document instead of text (every dataset as "
             "nested lists, NaN as null)"},
    {"--export", NULL, KV_OPT_STR, offsetof(inspect_args, export_fmt), "FORMAT",
     .help = "print only one table, for other tools:\n"
             "budgets-tsv: plan budgets B[l][j] in tokens, one row per layer, one tab-separated "
             "column per KV head (DuoAttention's pattern-file shape)\n"
             "importance-tsv: profile head importance, same shape\n"
             "kv-types-tsv: plan KV storage type of each head (f32, f16, q8, q4), same shape "
             "(schema v1/v2 plans: f32)\n"
             "layer-fractions: the plan's kept fraction per layer as a list [f_0, ..., f_L-1] "
             "(kvpress per-layer compression takes 1 - f as its compression ratios)"},
};

const kv_cli_spec kv_spec_inspect = {
    "inspect",
    "usage: kvplan inspect FILE.h5 [--png DIR] [--json] [--export FORMAT]\n",
    "Summarise a kvplan file: provenance and model; for a profile the KV heads of each layer\n"
    "ordered by importance, layer similarity, prompt consistency and hardware fits (with the\n"
    "sizes each bandwidth fit used); for a plan the ratio, policy, allocation, the winner\n"
    "(/search@winner), budgets per layer and KV head, the search grid (best and worst cell\n"
    "over p, t, r), baselines, and whatever KVPR and batch tables it holds.\n",
    "Exit codes: 0 ok, 1 bad input (not HDF5, not a kvplan file, newer schema, missing data),\n"
    "2 internal error.\n",
    {{NULL, inspect_opts, sizeof inspect_opts / sizeof inspect_opts[0], 0}},
};

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

/* The plan's KV type per head as names, [L] rows x [H_kv] tab-separated columns. */
static int export_types(const ki_file *f, kv_error *err) {
    int L = 0, hkv = 0;
    if (!ki_matrix(f, "/budget/tokens", 0, &L, &hkv))
        return kv_fail(err, KV_EINPUT,
                       "%s: no /budget/tokens [L, H_kv] dataset (is it a plan "
                       "file?)",
                       f->path);
    for (int l = 0; l < L; l++) {
        for (int j = 0; j < hkv; j++)
            printf("%s%s", j ? "\t" : "", kv_type_name(ki_head_type(f, l * hkv + j)));
        putchar('\n');
    }
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

/* The output choice: --json or one --export table (or the text summary). */
static int check_output_choice(const inspect_args *a) {
    if (a->json && a->export_fmt) {
        fprintf(stderr, "kvplan inspect: --json and --export both choose the output; pick one\n");
        return 1;
    }
    if (a->export_fmt && strcmp(a->export_fmt, "budgets-tsv") &&
        strcmp(a->export_fmt, "importance-tsv") && strcmp(a->export_fmt, "layer-fractions") &&
        strcmp(a->export_fmt, "kv-types-tsv")) {
        fprintf(stderr,
                "kvplan inspect: --export '%s' is not one of budgets-tsv, "
                "importance-tsv, kv-types-tsv, layer-fractions\n",
                a->export_fmt);
        return 1;
    }
    return 0;
}

/* ki_write_pngs on a thread of its own with a 16 MiB stack: cairo's first text measurement
 * loads fontconfig's configuration, whose XML parser (expat, recursive) needs some 80 KiB of
 * stack, more than a small `ulimit -s` (96 KiB) leaves the main thread. */
typedef struct png_job {
    ki_file *f;
    const char *dir;
    int n, rc;
    kv_error *err;
} png_job;

static void *png_thread(void *arg) {
    png_job *j = arg;
    j->rc = ki_write_pngs(j->f, j->dir, stderr, &j->n, j->err);
    return NULL;
}

static int write_pngs(ki_file *f, const char *dir, int *n, kv_error *err) {
    png_job j = {f, dir, 0, KV_OK, err};
    pthread_attr_t attr;
    pthread_t th;
    int ok = pthread_attr_init(&attr) == 0;
    if (ok && pthread_attr_setstacksize(&attr, (size_t)16 << 20) == 0 &&
        pthread_create(&th, &attr, png_thread, &j) == 0)
        pthread_join(th, NULL);
    else
        j.rc = kv_fail(err, KV_EINTERNAL, "out of memory: no thread for drawing the pictures");
    if (ok) pthread_attr_destroy(&attr);
    *n = j.n;
    return j.rc;
}

int kv_cmd_inspect(int argc, char **argv) {
    inspect_args a = {0};
    int code = kv_cli_parse(&kv_spec_inspect, argc, argv, &a);
    if (code >= 0) return code;
    if (!a.file) {
        fprintf(stderr, "kvplan inspect: FILE.h5 is required\n");
        kv_cli_help(&kv_spec_inspect, stderr);
        return 1;
    }
    if (check_output_choice(&a)) return 1;
    kv_error err = {0};
    const char *file = a.file, *png_dir = a.png_dir, *export_fmt = a.export_fmt;
    int json = a.json;
    /* build: the file (and, for a plan, its validation) */
    ki_file f;
    int rc = ki_load(file, &f, &err);
    int invalid_plan = 0;
    kv_error plan_err = {0};
    /* a plan: /budget, or a plan_schema attribute (a plan that lost /budget is invalid) */
    if (!rc && (f.is_plan || ki_attr_find(&f, "/", "plan_schema"))) {
        /* a plan is validated by the plan module, the same checks as `run --plan`; a broken
         * one is still shown (that is what inspect is for) but the command exits 1 */
        kv_plan p;
        invalid_plan = kv_plan_read(file, &p, &plan_err) != KV_OK;
        if (!invalid_plan) kv_cli_plan_note("inspect", &p);
        kv_plan_free(&p);
    } else if (!rc && f.is_profile) {
        /* a profile: the checks of `plan --profile` (shapes, values in range) */
        invalid_plan = kv_profile_inputs_check(file, &plan_err) != KV_OK;
    }
    /* run and report: pictures, then one of export, JSON or text */
    if (!rc && png_dir) {
        int n = 0;
        rc = write_pngs(&f, png_dir, &n, &err);
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
        else if (export_fmt && !strcmp(export_fmt, "kv-types-tsv"))
            rc = export_types(&f, &err);
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
