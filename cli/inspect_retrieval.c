/* kvplan inspect: the retrieval records (docs/retrieval.md): a profile's /heads/retrieval and a
 * plan's /search/retrieval, as text and as JSON (cli/inspect.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

#define HR "/heads/retrieval"
#define SR "/search/retrieval"

/* The heads' answer-NLL rise [L, H_kv] of a profile, else of a plan's retrieval stage. */
static const double *heads_rise(const ki_file *f, int *L, int *H, const char **obj) {
    const double *v = ki_matrix(f, HR, 0, L, H);
    *obj = HR;
    if (!v) {
        v = ki_matrix(f, SR "/heads", 0, L, H);
        *obj = SR;
    }
    return v;
}

static void print_heads(FILE *out, const ki_file *f) {
    int L = 0, H = 0, La = 0, Ha = 0;
    const char *obj = NULL;
    const double *v = heads_rise(f, &L, &H, &obj);
    if (!v) return;
    const double *acc = ki_matrix(f, HR "_accuracy", 0, &La, &Ha);
    if (acc && (La != L || Ha != H)) acc = NULL;
    const char *pr = ki_attr_str(f, obj, "probes");
    fprintf(out,
            "\nretrieval heads (rise of the probes' answer NLL, nats/token, when the head alone "
            "keeps a window of %.0f tokens; %s):\n",
            ki_attr_num(f, obj, "window", NAN), pr ? pr : "probes not named");
    if (!strcmp(obj, HR))
        fprintf(out, "  full cache: accuracy %.1f%%, answer NLL %.4f over %.0f probes\n",
                100 * ki_attr_num(f, HR, "full_accuracy", NAN), ki_attr_num(f, HR, "full_nll", NAN),
                ki_attr_num(f, HR, "n_probes", NAN));
    int *order = malloc((size_t)L * H * sizeof *order);
    if (!order) return;
    ki_order_desc(v, L * H, order);
    int n = L * H < 5 ? L * H : 5;
    fprintf(out, "  costliest:");
    for (int k = 0; k < n; k++) {
        int i = order[k];
        fprintf(out, "%s layer %d kv%d %+.4f", k ? "," : "", i / H, i % H, v[i]);
        if (acc) fprintf(out, " (accuracy %.1f%%)", 100 * acc[i]);
    }
    fputc('\n', out);
    free(order);
}

static void print_search(FILE *out, const ki_file *f) {
    int R = 0, C = 0;
    const double *b = ki_matrix(f, SR "/baselines", 0, &R, &C);
    if (!b || R != 4 || C != 3) return;
    const char *dec = ki_attr_str(f, SR, "decision");
    fprintf(out,
            "\nretrieval (%.0f probes, tolerance %.0f points): decision: %s\n"
            "  %-10s %9s  %-12s %-10s\n",
            ki_attr_num(f, SR, "n_probes", NAN), 100 * ki_attr_num(f, SR, "tolerance", NAN),
            dec ? dec : "?", "", "accuracy", "answer NLL", "search ppl");
    static const char *const rows[4] = {"full", "uniform", "ppl plan", "the plan"};
    for (int r = 0; r < 4; r++)
        fprintf(out, "  %-10s %8.1f%%  %-12.4f %-10.4f\n", rows[r], 100 * b[r * 3], b[r * 3 + 1],
                b[r * 3 + 2]);
    const double *c = ki_matrix(f, SR "/candidates", 0, &R, &C);
    if (!c || C < 6 || C > 8) return;
    int chosen = (int)ki_attr_num(f, SR, "chosen", -1);
    fprintf(out, "  candidates (weight, heads forced whole or heads x tokens kept by l2attn; heads "
                 "whole; accuracy; NLL; ppl):\n");
    for (int k = 0; k < R; k++) {
        const double *x = c + k * C;
        if (isfinite(x[0]))
            fprintf(out, "  %s weight %-6g", k == chosen ? "*" : " ", x[0]);
        else if (C >= 7 && x[6] > 0)
            fprintf(out, "  %s l2attn %.0fx%-3.0f %-4s", k == chosen ? "*" : " ", x[1], x[6],
                    C < 8 || x[7] < 0 ? "ks" : kv_type_name((kv_cache_type)x[7]));
        else
            fprintf(out, "  %s forced %-6.0f", k == chosen ? "*" : " ", x[1]);
        fprintf(out, " whole %-3.0f %5.1f%% %.4f %.4f\n", x[2], 100 * x[3], x[4], x[5]);
    }
}

/* /heads/induction (profile --induction): the costliest heads on random-token copies. */
static void print_induction(FILE *out, const ki_file *f) {
    int L = 0, H = 0;
    const double *v = ki_matrix(f, "/heads/induction", 0, &L, &H);
    if (!v) return;
    int *order = malloc((size_t)L * H * sizeof *order);
    if (!order) return;
    ki_order_desc(v, L * H, order);
    fprintf(out,
            "\ninduction proxy (copy NLL rise of BOS + R + R, nats/token, window %.0f; full cache "
            "%.4f):\n  costliest:",
            ki_attr_num(f, "/heads/induction", "window", NAN),
            ki_attr_num(f, "/heads/induction", "full_nll", NAN));
    for (int k = 0; k < L * H && k < 5; k++)
        fprintf(out, "%s layer %d kv%d %+.4f", k ? "," : "", order[k] / H, order[k] % H,
                v[order[k]]);
    fputc('\n', out);
    free(order);
}

void ki_print_retrieval(FILE *out, const ki_file *f) {
    print_heads(out, f);
    print_induction(out, f);
    print_search(out, f);
}

static cJSON *nums(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, isfinite(v[i]) ? cJSON_CreateNumber(v[i]) : cJSON_CreateNull());
    return a;
}

void ki_retrieval_json(cJSON *parent, const ki_file *f) {
    int L = 0, H = 0;
    const char *obj = NULL;
    const double *v = heads_rise(f, &L, &H, &obj);
    int R = 0, C = 0;
    const double *b = ki_matrix(f, SR "/baselines", 0, &R, &C);
    if (!v && !b) return;
    cJSON *o = cJSON_AddObjectToObject(parent, "retrieval");
    if (!o) return;
    if (v) {
        cJSON *rows = cJSON_AddArrayToObject(o, "heads_nll_rise");
        for (int l = 0; rows && l < L; l++) cJSON_AddItemToArray(rows, nums(v + l * H, H));
        cJSON_AddNumberToObject(o, "window", ki_attr_num(f, obj, "window", NAN));
        const char *pr = ki_attr_str(f, obj, "probes");
        if (pr) cJSON_AddStringToObject(o, "probes", pr);
    }
    if (!b || R != 4 || C != 3) return;
    static const char *const rows[4] = {"full", "uniform", "guard", "plan"};
    for (int r = 0; r < 4; r++) {
        cJSON *x = cJSON_AddObjectToObject(o, rows[r]);
        if (!x) return;
        cJSON_AddNumberToObject(x, "accuracy", b[r * 3]);
        cJSON_AddNumberToObject(x, "answer_nll", b[r * 3 + 1]);
        cJSON_AddNumberToObject(x, "search_perplexity", b[r * 3 + 2]);
    }
    const char *dec = ki_attr_str(f, SR, "decision");
    if (dec) cJSON_AddStringToObject(o, "decision", dec);
    cJSON_AddNumberToObject(o, "chosen", ki_attr_num(f, SR, "chosen", -1));
    cJSON_AddNumberToObject(o, "tolerance", ki_attr_num(f, SR, "tolerance", NAN));
}
