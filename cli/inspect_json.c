/* kvplan inspect --json: the same content as the text summary, as one JSON document
 * (cli/inspect.h). Layout:
 *   { "file", "kind": "profile" | "plan" | "kvplan",
 *     "attributes": {root attributes},
 *     "summary": { profile: "heads" [{layer, order, importance}], "layer_similarity",
 *                  "consistency" {prompts, pairs, mean_tau, min_tau, max_tau},
 *                  "hardware" {kind, device_name, device_mem_bytes, fits {group: {...}}};
 *                  plan: "plan" {ratio, context_length, block_size, policy, allocation, t, r, p,
 *                  total_tokens, target_tokens, layer_fractions}, "search" {baselines,
 *                  heldout, rank, axes, np, nt, nr, p_values, evaluated, max_chunks,
 *                  cells_at_max_chunks, best {p, t, r, perplexity, chunks}, worst {...},
 *                  per_p [{p, index, evaluated, ..., best, worst}] (3-D grids),
 *                  winner {allocation, from, p, t, r, perplexity, chunks, heldout},
 *                  texts {objective, decision, reason, lambda, rows [...]} (multi-text
 *                  searches, cli/inspect_texts.c), retrieval {...} (cli/inspect_retrieval.c)};
 *                  a profile with /heads/retrieval: retrieval {heads_nll_rise, window, probes} },
 *     "groups": {path: {attributes}},
 *     "datasets": {path: {"shape": [..], "units", "attributes": {..}, "data": nested lists}} }
 * NaN values are written as null (cJSON's convention). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "inspect.h"

/* Nested lists for dims[k..rank) of v. */
static cJSON *nested(const double *v, const long *dims, int rank, int k, size_t *pos) {
    cJSON *a = cJSON_CreateArray();
    if (!a) return NULL;
    for (long i = 0; i < dims[k]; i++) {
        cJSON *item =
            k + 1 == rank ? cJSON_CreateNumber(v[(*pos)++]) : nested(v, dims, rank, k + 1, pos);
        if (!item) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(a, item);
    }
    return a;
}

static cJSON *attrs_of(const ki_file *f, const char *obj) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (int i = 0; i < f->n_attrs; i++) {
        const ki_attr *a = &f->attrs[i];
        if (strcmp(a->obj, obj) != 0) continue;
        cJSON *it = a->kind == 's'                       ? cJSON_CreateString(a->str)
                    : (a->kind == 'i' || a->kind == 'f') ? cJSON_CreateNumber(a->num)
                                                         : cJSON_CreateNull();
        if (!it) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToObject(o, a->name, it);
    }
    return o;
}

static cJSON *num_array(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static void profile_summary(cJSON *s, const ki_file *f) {
    int L = 0, hkv = 0;
    double *imp = ki_head_importance(f, &L, &hkv);
    if (imp) {
        cJSON *heads = cJSON_AddArrayToObject(s, "heads");
        int *order = malloc((size_t)hkv * sizeof *order);
        double *sorted = malloc((size_t)hkv * sizeof *sorted);
        for (int l = 0; heads && order && sorted && l < L; l++) {
            const double *row = imp + (size_t)l * hkv;
            ki_order_desc(row, hkv, order);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "layer", l);
            cJSON *ord = cJSON_AddArrayToObject(e, "order");
            for (int k = 0; k < hkv; k++) {
                cJSON_AddItemToArray(ord, cJSON_CreateNumber(order[k]));
                sorted[k] = row[order[k]];
            }
            cJSON_AddItemToObject(e, "importance", num_array(sorted, hkv));
            cJSON_AddItemToArray(heads, e);
        }
        free(order);
        free(sorted);
        free(imp);
    }
    int r = 0, n = 0;
    const double *sim = ki_matrix(f, "/layers/similarity", 1, &r, &n);
    if (sim) cJSON_AddItemToObject(s, "layer_similarity", num_array(sim, n));
    ki_tau t;
    if (ki_dset_find(f, "/consistency/kendall_tau")) {
        ki_tau_summary(f, &t);
        cJSON *c = cJSON_AddObjectToObject(s, "consistency");
        cJSON_AddNumberToObject(c, "prompts", t.prompts);
        cJSON_AddNumberToObject(c, "pairs", t.pairs);
        cJSON_AddNumberToObject(c, "mean_tau", t.mean);
        cJSON_AddNumberToObject(c, "min_tau", t.min);
        cJSON_AddNumberToObject(c, "max_tau", t.max);
    }
    int hw = 0;
    for (int g = 0; g < f->n_groups; g++)
        if (!strcmp(f->groups[g], "/hardware")) hw = 1;
    if (hw) {
        cJSON *h = attrs_of(f, "/hardware");
        cJSON *fits = cJSON_AddObjectToObject(h, "fits");
        for (int g = 0; g < f->n_groups; g++) {
            if (strncmp(f->groups[g], "/hardware/", 10) != 0) continue;
            cJSON *a = attrs_of(f, f->groups[g]);
            /* a copy fit: the sizes it used (fit_min_bytes and up, docs/hardware-schema.md) */
            char path[300];
            snprintf(path, sizeof path, "%s/bytes", f->groups[g]);
            const ki_dset *b = ki_dset_find(f, path);
            double minb = ki_attr_num(f, f->groups[g], "fit_min_bytes", NAN);
            if (a && b && b->v && b->rank == 1 && !isnan(minb)) {
                cJSON *fb = cJSON_AddArrayToObject(a, "fitted_bytes");
                for (size_t i = 0; fb && i < b->count; i++)
                    if (b->v[i] >= minb) cJSON_AddItemToArray(fb, cJSON_CreateNumber(b->v[i]));
            }
            cJSON_AddItemToObject(fits, f->groups[g] + 10, a);
        }
        cJSON_AddItemToObject(s, "hardware", h);
    }
}

/* The axis values of a grid cell into o: p (3-D and p-only grids), t and r (2-D and 3-D),
 * and with `with_ppl` its perplexity and chunks. */
static void cell_json(cJSON *o, const ki_grid *g, long idx, int with_ppl) {
    int k, i, j;
    ki_grid_cell(g, idx, &k, &i, &j);
    if (g->rank != 2) cJSON_AddNumberToObject(o, "p", g->p ? g->p[k] : NAN);
    if (g->rank != 1) {
        cJSON_AddNumberToObject(o, "t", g->t ? g->t[i] : NAN);
        cJSON_AddNumberToObject(o, "r", g->r ? g->r[j] : NAN);
    }
    if (with_ppl) {
        cJSON_AddNumberToObject(o, "perplexity", g->ppl[idx]);
        if (g->chunks) cJSON_AddNumberToObject(o, "chunks", ki_grid_chunks(g, idx));
    }
}

/* evaluated, max_chunks / cells_at_max_chunks (when chunks are known), best, worst. */
static void grid_stats_json(cJSON *o, const ki_grid *g, const ki_grid_stats *st) {
    cJSON_AddNumberToObject(o, "evaluated", st->evaluated);
    if (g->chunks) {
        cJSON_AddNumberToObject(o, "max_chunks", st->max_chunks);
        cJSON_AddNumberToObject(o, "cells_at_max_chunks", st->n_max);
    }
    if (st->best < 0) return;
    cJSON *b = cJSON_AddObjectToObject(o, "best"), *w = cJSON_AddObjectToObject(o, "worst");
    if (b) cell_json(b, g, st->best, 1);
    if (w) cell_json(w, g, st->worst, 1);
}

/* "plan": total tokens, per-head KV storage types [L][H_kv] (v1/v2 plans: f32), the stored
 * bytes against the full F16 cache, and what R buys at the plan's bytes per token. */
static void plan_budget_json(cJSON *p, const ki_file *f) {
    int L = 0, hkv = 0;
    const double *tok = ki_matrix(f, "/budget/tokens", 0, &L, &hkv);
    if (!tok) return;
    double total = 0;
    for (int i = 0; i < L * hkv; i++) total += tok[i];
    cJSON_AddNumberToObject(p, "total_tokens", total);
    cJSON *types = cJSON_AddArrayToObject(p, "kv_types");
    int hd = ki_head_dim(f);
    double bytes = 0;
    for (int l = 0; types && l < L; l++) {
        cJSON *row = cJSON_CreateArray();
        for (int j = 0; row && j < hkv; j++) {
            kv_cache_type ty = ki_head_type(f, l * hkv + j);
            cJSON_AddItemToArray(row, cJSON_CreateString(kv_type_name(ty)));
            if (hd > 0) bytes += tok[l * hkv + j] * (double)kv_type_token_bytes(ty, hd);
        }
        if (row) cJSON_AddItemToArray(types, row);
    }
    double full16 = hd > 0 ? L * hkv * ki_attr_num(f, "/", "context_length", NAN) *
                                 (double)kv_type_token_bytes(KV_TYPE_F16, hd)
                           : NAN;
    /* the ratio is bytes over the full F16 cache (v1/v2 files store the token fraction, which
     * is half of it for their f32 heads) */
    double Rb =
        ki_attr_num(f, "/", "ratio", NAN) * (ki_dset_find(f, "/budget/kv_type") ? 1.0 : 2.0);
    cJSON_AddNumberToObject(p, "target_tokens", Rb * full16 * total / bytes);
    cJSON_AddNumberToObject(p, "kv_bytes", hd > 0 ? bytes : NAN);
    cJSON_AddNumberToObject(p, "kv_bytes_full_f16", full16);
    cJSON_AddNumberToObject(p, "ratio_f16_bytes", Rb);
}

/* "search": the named figures, baselines (full, uniform, squeeze) and held-out perplexities. */
static void search_named_json(cJSON *sr, const ki_file *f) {
    const struct {
        const char *path, *key, *names;
    } named[] = {{"/search/baselines", "baselines", "full,uniform,squeeze"},
                 {"/search/heldout", "heldout", NULL}};
    for (int k = 0; sr && k < 2; k++) {
        const ki_dset *d = ki_dset_find(f, named[k].path);
        const char *names = d ? ki_attr_str(f, d->path, "names") : NULL;
        if (!names) names = named[k].names;
        if (!d || !d->v || d->rank != 1 || !names) continue;
        cJSON *o = cJSON_AddObjectToObject(sr, named[k].key);
        const char *q = names;
        for (size_t i = 0; i < d->count && q && *q; i++) {
            char nm[64];
            size_t n = strcspn(q, ",");
            if (n >= sizeof nm) n = sizeof nm - 1;
            memcpy(nm, q, n);
            nm[n] = '\0';
            cJSON_AddNumberToObject(o, nm, d->v[i]);
            q = q[strcspn(q, ",")] ? q + strcspn(q, ",") + 1 : NULL;
        }
    }
}

/* "search": the grid's axes, sizes and statistics (per p too for a 3-D grid). */
static void search_grid_json(cJSON *sr, const ki_grid *g) {
    cJSON_AddNumberToObject(sr, "rank", g->rank);
    cJSON *axes = cJSON_AddArrayToObject(sr, "axes");
    if (g->rank != 2) cJSON_AddItemToArray(axes, cJSON_CreateString("p"));
    if (g->rank != 1) {
        cJSON_AddItemToArray(axes, cJSON_CreateString("t"));
        cJSON_AddItemToArray(axes, cJSON_CreateString("r"));
    }
    cJSON_AddNumberToObject(sr, "np", g->np);
    cJSON_AddNumberToObject(sr, "nt", g->nt);
    cJSON_AddNumberToObject(sr, "nr", g->nr);
    if (g->p) cJSON_AddItemToObject(sr, "p_values", num_array(g->p, g->np));
    grid_stats_json(sr, g, &g->all);
    if (g->rank != 3) return;
    /* one entry per p: its (t, r) map's statistics; the map itself is
     * datasets["/search/perplexity"].data[k] */
    cJSON *per = cJSON_AddArrayToObject(sr, "per_p");
    for (int k = 0; per && k < g->np; k++) {
        ki_grid_stats st;
        ki_grid_slice(g, k, &st);
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddNumberToObject(o, "p", g->p ? g->p[k] : NAN);
        cJSON_AddNumberToObject(o, "index", k);
        grid_stats_json(o, g, &st);
        cJSON_AddItemToArray(per, o);
    }
}

/* "search.winner": the plan's allocation, where it came from, its perplexities. */
static void search_winner_json(cJSON *sr, const ki_file *f, const ki_grid *g, int has_grid) {
    int from_grid = 0;
    const char *w = ki_search_winner(f, has_grid ? g : NULL, &from_grid);
    if (!w) return;
    cJSON *o = cJSON_AddObjectToObject(sr, "winner");
    cJSON_AddStringToObject(o, "allocation", w);
    cJSON_AddStringToObject(o, "from", from_grid ? "grid" : "baseline");
    if (from_grid && has_grid && g->all.best >= 0) cell_json(o, g, g->all.best, 0);
    cJSON_AddNumberToObject(o, "perplexity", ki_attr_num(f, "/search", "best_perplexity", NAN));
    cJSON_AddNumberToObject(o, "chunks", ki_attr_num(f, "/search", "best_chunks", NAN));
    const ki_dset *h = ki_dset_find(f, "/search/heldout");
    if (h && h->v && h->rank == 1 && h->count > 0) cJSON_AddNumberToObject(o, "heldout", h->v[0]);
}

static void plan_summary(cJSON *s, const ki_file *f) {
    cJSON *p = cJSON_AddObjectToObject(s, "plan");
    const char *num[] = {"ratio", "context_length", "block_size", "t", "r", "p"};
    for (int i = 0; i < 6; i++)
        cJSON_AddNumberToObject(p, num[i], ki_attr_num(f, "/", num[i], NAN));
    const char *str[] = {"policy", "allocation"};
    for (int i = 0; i < 2; i++) {
        const char *v = ki_attr_str(f, "/", str[i]);
        if (v)
            cJSON_AddStringToObject(p, str[i], v);
        else
            cJSON_AddNullToObject(p, str[i]);
    }
    plan_budget_json(p, f);
    kv_error e = {0};
    int n = 0;
    double *fr = ki_layer_fractions(f, &n, &e);
    if (fr) cJSON_AddItemToObject(p, "layer_fractions", num_array(fr, n));
    free(fr);
    ki_grid g;
    int has_grid = ki_search_grid(f, &g);
    int from_grid = 0;
    if (!has_grid && !ki_dset_find(f, "/search/baselines") && !ki_dset_find(f, "/search/heldout") &&
        !ki_attr_find(f, "/search", "winner") && !ki_search_winner(f, NULL, &from_grid))
        return;
    cJSON *sr = cJSON_AddObjectToObject(s, "search");
    search_named_json(sr, f);
    if (has_grid) search_grid_json(sr, &g);
    search_winner_json(sr, f, &g, has_grid);
    ki_texts_json(sr, f);
    ki_retrieval_json(sr, f);
}

int ki_print_json(FILE *out, const ki_file *f, kv_error *err) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return kv_fail(err, KV_EINTERNAL, "out of memory: JSON");
    cJSON_AddStringToObject(root, "file", f->path);
    cJSON_AddStringToObject(root, "kind",
                            f->is_plan      ? "plan"
                            : f->is_profile ? "profile"
                                            : "kvplan");
    cJSON_AddItemToObject(root, "attributes", attrs_of(f, "/"));
    cJSON *s = cJSON_AddObjectToObject(root, "summary");
    if (f->is_profile) profile_summary(s, f);
    if (f->is_profile) ki_retrieval_json(s, f);
    if (f->is_plan) plan_summary(s, f);
    if (!f->is_profile && !f->is_plan) profile_summary(s, f); /* hardware-only files */
    cJSON *groups = cJSON_AddObjectToObject(root, "groups");
    for (int g = 0; groups && g < f->n_groups; g++)
        cJSON_AddItemToObject(groups, f->groups[g], attrs_of(f, f->groups[g]));
    cJSON *ds = cJSON_AddObjectToObject(root, "datasets");
    for (int i = 0; ds && i < f->n_dsets; i++) {
        const ki_dset *d = &f->dsets[i];
        cJSON *o = cJSON_CreateObject();
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int k = 0; k < d->rank; k++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)d->dims[k]));
        const char *u = ki_units(f, d->path);
        if (u) cJSON_AddStringToObject(o, "units", u);
        cJSON_AddStringToObject(o, "type", d->v ? (d->is_int ? "int" : "float") : "other");
        cJSON_AddItemToObject(o, "attributes", attrs_of(f, d->path));
        size_t pos = 0;
        if (d->v && d->rank > 0)
            cJSON_AddItemToObject(o, "data", nested(d->v, d->dims, d->rank, 0, &pos));
        else
            cJSON_AddNullToObject(o, "data");
        cJSON_AddItemToObject(ds, d->path, o);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return kv_fail(err, KV_EINTERNAL, "out of memory: JSON text");
    /* strings from the file (attributes, names) may hold bytes that are not UTF-8; JSON must
     * be UTF-8: each such byte becomes U+FFFD (cJSON escapes control characters itself) */
    char *clean = kv_cli_clean_text(text, 0);
    cJSON_free(text);
    if (!clean) return kv_fail(err, KV_EINTERNAL, "out of memory: JSON text");
    fputs(clean, out);
    fputc('\n', out);
    free(clean);
    return KV_OK;
}
