/* kvplan inspect: loading a kvplan HDF5 file whole and the summaries derived from it
 * (cli/inspect.h). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

/* ---- loading ---- */

typedef struct load_ctx {
    ki_file *f;
    kv_h5 *h;
    const char *obj; /* object whose attributes are being listed */
    int rc;
    kv_error *err;
} load_ctx;

static char *dupstr(const char *s, kv_error *err) {
    size_t n = strlen(s);
    char *d = kv_malloc(n + 1, "inspect: string", err);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static void on_attr(void *user, const char *name, char kind) {
    load_ctx *c = user;
    ki_file *f = c->f;
    if (c->rc) return;
    if (f->n_attrs == f->cap_attrs) {
        int cap = f->cap_attrs ? 2 * f->cap_attrs : 32;
        ki_attr *na = realloc(f->attrs, (size_t)cap * sizeof *na);
        if (!na) {
            c->rc = kv_fail(c->err, KV_EINTERNAL, "out of memory: inspect attributes");
            return;
        }
        f->attrs = na;
        f->cap_attrs = cap;
    }
    ki_attr *a = &f->attrs[f->n_attrs];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->num = NAN;
    a->obj = dupstr(c->obj, c->err);
    a->name = dupstr(name, c->err);
    if (!a->obj || !a->name) {
        free(a->obj);
        free(a->name);
        c->rc = KV_EINTERNAL;
        return;
    }
    f->n_attrs++;
    kv_error e2 = {0};
    if (kind == 's') {
        if (kv_h5_read_attr_str(c->h, c->obj, name, &a->str, &e2)) a->kind = '?';
    } else if (kind == 'i') {
        long v = 0;
        if (kv_h5_read_attr_i64(c->h, c->obj, name, &v, &e2))
            a->kind = '?';
        else
            a->num = (double)v;
    } else if (kind == 'f') {
        if (kv_h5_read_attr_f64(c->h, c->obj, name, &a->num, &e2)) a->kind = '?';
    }
}

static int load_attrs(load_ctx *c, const char *obj) {
    c->obj = obj;
    int rc = kv_h5_list_attrs(c->h, obj, on_attr, c, c->err);
    return rc ? rc : c->rc;
}

static void on_group(void *user, const char *path) {
    load_ctx *c = user;
    ki_file *f = c->f;
    if (c->rc) return;
    if (f->n_groups == f->cap_groups) {
        int cap = f->cap_groups ? 2 * f->cap_groups : 16;
        char **ng = realloc(f->groups, (size_t)cap * sizeof *ng);
        if (!ng) {
            c->rc = kv_fail(c->err, KV_EINTERNAL, "out of memory: inspect groups");
            return;
        }
        f->groups = ng;
        f->cap_groups = cap;
    }
    char *p = dupstr(path, c->err);
    if (!p) {
        c->rc = KV_EINTERNAL;
        return;
    }
    f->groups[f->n_groups++] = p;
}

static void on_dset(void *user, const char *path) {
    load_ctx *c = user;
    ki_file *f = c->f;
    if (c->rc) return;
    if (f->n_dsets == f->cap_dsets) {
        int cap = f->cap_dsets ? 2 * f->cap_dsets : 32;
        ki_dset *nd = realloc(f->dsets, (size_t)cap * sizeof *nd);
        if (!nd) {
            c->rc = kv_fail(c->err, KV_EINTERNAL, "out of memory: inspect datasets");
            return;
        }
        f->dsets = nd;
        f->cap_dsets = cap;
    }
    ki_dset *d = &f->dsets[f->n_dsets];
    memset(d, 0, sizeof *d);
    d->path = dupstr(path, c->err);
    if (!d->path) {
        c->rc = KV_EINTERNAL;
        return;
    }
    f->n_dsets++;
    kv_error e2 = {0};
    if (kv_h5_read_f64(c->h, path, &d->rank, d->dims, &d->v, &e2) == KV_OK) {
        d->count = 1;
        for (int i = 0; i < d->rank; i++) d->count *= (size_t)d->dims[i];
        d->is_int = 1;
        for (size_t i = 0; i < d->count; i++)
            if (!(isfinite(d->v[i]) && d->v[i] == floor(d->v[i]))) {
                d->is_int = 0;
                break;
            }
    } else if (e2.code == KV_EINTERNAL || kv_h5_dataset_numeric(c->h, path)) {
        /* a numeric dataset that cannot be read (declared larger than the file, damaged) is
         * an error, not "not numeric" */
        c->rc = kv_fail(c->err, e2.code ? e2.code : KV_EINPUT, "%s", e2.msg);
    }
}

int ki_load(const char *path, ki_file *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    kv_h5 *h = NULL;
    int rc = kv_h5_open_read(path, &h, err);
    if (rc) return rc;
    load_ctx c = {out, h, "/", KV_OK, err};
    if ((rc = load_attrs(&c, "/"))) goto done;
    if ((rc = kv_h5_list_groups(h, on_group, &c, err)) || (rc = c.rc)) goto done;
    if ((rc = kv_h5_list_datasets(h, on_dset, &c, err)) || (rc = c.rc)) goto done;
    for (int i = 0; i < out->n_groups; i++)
        if ((rc = load_attrs(&c, out->groups[i]))) goto done;
    for (int i = 0; i < out->n_dsets; i++)
        if ((rc = load_attrs(&c, out->dsets[i].path))) goto done;
    out->is_profile = kv_h5_exists(h, "/heads");
    out->is_plan = kv_h5_exists(h, "/budget");
done:
    kv_h5_close(h);
    return rc;
}

void ki_free(ki_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_attrs; i++) {
        free(f->attrs[i].obj);
        free(f->attrs[i].name);
        free(f->attrs[i].str);
    }
    free(f->attrs);
    for (int i = 0; i < f->n_dsets; i++) {
        free(f->dsets[i].path);
        free(f->dsets[i].v);
    }
    free(f->dsets);
    for (int i = 0; i < f->n_groups; i++) free(f->groups[i]);
    free(f->groups);
    memset(f, 0, sizeof *f);
}

/* ---- lookups ---- */

const ki_dset *ki_dset_find(const ki_file *f, const char *path) {
    for (int i = 0; i < f->n_dsets; i++)
        if (!strcmp(f->dsets[i].path, path)) return &f->dsets[i];
    return NULL;
}

const ki_attr *ki_attr_find(const ki_file *f, const char *obj, const char *name) {
    for (int i = 0; i < f->n_attrs; i++)
        if (!strcmp(f->attrs[i].obj, obj) && !strcmp(f->attrs[i].name, name)) return &f->attrs[i];
    return NULL;
}

double ki_attr_num(const ki_file *f, const char *obj, const char *name, double dflt) {
    const ki_attr *a = ki_attr_find(f, obj, name);
    return a && (a->kind == 'i' || a->kind == 'f') ? a->num : dflt;
}

const char *ki_attr_str(const ki_file *f, const char *obj, const char *name) {
    const ki_attr *a = ki_attr_find(f, obj, name);
    return a && a->kind == 's' ? a->str : NULL;
}

const char *ki_units(const ki_file *f, const char *path) {
    return ki_attr_str(f, path, "units");
}

const double *ki_matrix(const ki_file *f, const char *path, int allow_1d, int *rows, int *cols) {
    const ki_dset *d = ki_dset_find(f, path);
    if (!d || !d->v || d->count == 0) return NULL;
    if (d->rank == 2) {
        *rows = (int)d->dims[0];
        *cols = (int)d->dims[1];
        return d->v;
    }
    if (d->rank == 1 && allow_1d) {
        *rows = 1;
        *cols = (int)d->dims[0];
        return d->v;
    }
    return NULL;
}

int ki_whole_in(double x, int lo, int hi, int *out) {
    if (!(isfinite(x) && x == floor(x) && x >= (double)lo && x <= (double)hi)) return 0;
    *out = (int)x;
    return 1;
}

int ki_head_dim(const ki_file *f) {
    int hd = 0;
    ki_whole_in(ki_attr_num(f, "/", "model_head_dim", NAN), 1, 1 << 20, &hd);
    return hd;
}

kv_cache_type ki_head_type(const ki_file *f, int i) {
    int L = 0, H = 0, code = 0;
    const double *t = ki_matrix(f, "/budget/kv_type", 0, &L, &H);
    if (!t || i < 0 || i >= L * H || !ki_whole_in(t[i], 0, KV_CACHE_TYPES - 1, &code) ||
        !kv_type_valid(code))
        return KV_TYPE_F32;
    return (kv_cache_type)code;
}

/* ---- derived ---- */

double *ki_head_importance(const ki_file *f, int *L, int *hkv) {
    const double *imp = ki_matrix(f, "/heads/importance", 0, L, hkv);
    int from_sim = 0;
    if (!imp) {
        imp = ki_matrix(f, "/heads/similarity", 0, L, hkv);
        from_sim = 1;
    }
    if (!imp) return NULL;
    size_t n = (size_t)*L * (size_t)*hkv;
    double *out = malloc(n * sizeof *out);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) out[i] = from_sim ? 1.0 - imp[i] : imp[i];
    return out;
}

void ki_order_desc(const double *v, int n, int *order) {
    for (int i = 0; i < n; i++) order[i] = i;
    /* insertion sort: n is a head count; NaN sorts last */
    for (int i = 1; i < n; i++) {
        int k = order[i], j = i - 1;
        while (j >= 0) {
            double a = v[order[j]], b = v[k];
            int before = isnan(a) ? !isnan(b) : (!isnan(b) && b > a);
            if (!before) break;
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = k;
    }
}

int ki_tau_summary(const ki_file *f, ki_tau *out) {
    memset(out, 0, sizeof *out);
    out->mean = out->min = out->max = NAN;
    int p = 0, q = 0;
    const double *t = ki_matrix(f, "/consistency/kendall_tau", 0, &p, &q);
    if (!t || p != q) return 0;
    out->prompts = p;
    double sum = 0;
    for (int i = 0; i < p; i++)
        for (int j = i + 1; j < p; j++) {
            double v = t[(size_t)i * p + j];
            if (isnan(v)) continue;
            if (!out->pairs || v < out->min) out->min = v;
            if (!out->pairs || v > out->max) out->max = v;
            sum += v;
            out->pairs++;
        }
    if (out->pairs) out->mean = sum / out->pairs;
    return out->pairs > 0;
}

double *ki_layer_fractions(const ki_file *f, int *L, kv_error *err) {
    int hkv = 0;
    const double *b = ki_matrix(f, "/budget/tokens", 0, L, &hkv);
    if (!b) {
        kv_fail(err, KV_EINPUT, "%s: no /budget/tokens [L, H_kv] (is it a plan file?)", f->path);
        return NULL;
    }
    double c = ki_attr_num(f, "/", "context_length", NAN);
    if (!(c > 0)) {
        kv_fail(err, KV_EINPUT, "%s: no context_length attribute, so no kept fractions", f->path);
        return NULL;
    }
    double *fr = kv_malloc((size_t)*L * sizeof *fr, "layer fractions", err);
    if (!fr) return NULL;
    for (int l = 0; l < *L; l++) {
        double s = 0;
        for (int j = 0; j < hkv; j++) s += b[(size_t)l * hkv + j];
        fr[l] = s / (hkv * c);
    }
    return fr;
}

/* An axis dataset /search/<name> of exactly n values, or NULL. */
static const double *grid_axis(const ki_file *f, const char *path, int n) {
    int a = 0, b = 0;
    const double *v = ki_matrix(f, path, 1, &a, &b);
    return v && a == 1 && b == n ? v : NULL;
}

int ki_grid_chunks(const ki_grid *g, long idx) {
    if (!g->chunks || !isfinite(g->ppl[idx])) return 0;
    return (int)g->chunks[idx]; /* whole numbers in [0, INT_MAX]: checked by ki_search_grid */
}

/* Statistics of the cells [from, to). */
static void grid_stats(const ki_grid *g, long from, long to, ki_grid_stats *s) {
    memset(s, 0, sizeof *s);
    s->best = s->worst = -1;
    for (long i = from; i < to; i++) {
        if (!isfinite(g->ppl[i])) continue;
        s->evaluated++;
        int c = ki_grid_chunks(g, i);
        if (c > s->max_chunks) s->max_chunks = c, s->n_max = 0;
        if (c == s->max_chunks) s->n_max++;
    }
    for (long i = from; i < to; i++) {
        double v = g->ppl[i];
        if (!isfinite(v) || ki_grid_chunks(g, i) != s->max_chunks) continue;
        if (s->best < 0 || v < g->ppl[s->best]) s->best = i;
        if (s->worst < 0 || v > g->ppl[s->worst]) s->worst = i;
    }
}

int ki_search_grid(const ki_file *f, ki_grid *g) {
    memset(g, 0, sizeof *g);
    g->all.best = g->all.worst = -1;
    const ki_dset *d = ki_dset_find(f, "/search/perplexity");
    if (!d || !d->v || d->count == 0 || d->rank < 1 || d->rank > 3) return 0;
    g->rank = d->rank;
    g->np = g->nt = g->nr = 1;
    if (d->rank == 3) {
        g->np = (int)d->dims[0];
        g->nt = (int)d->dims[1];
        g->nr = (int)d->dims[2];
    } else if (d->rank == 2) {
        g->nt = (int)d->dims[0];
        g->nr = (int)d->dims[1];
    } else {
        /* [NP]: squeeze's p search; without p values it is not a grid we can label */
        g->np = (int)d->dims[0];
        if (!grid_axis(f, "/search/p_values", g->np)) return 0;
    }
    g->ppl = d->v;
    if (d->rank != 2) g->p = grid_axis(f, "/search/p_values", g->np);
    if (d->rank != 1) {
        g->t = grid_axis(f, "/search/t_values", g->nt);
        g->r = grid_axis(f, "/search/r_values", g->nr);
    }
    const ki_dset *c = ki_dset_find(f, "/search/chunks");
    if (c && c->v && c->rank == d->rank && c->count == d->count) {
        int same = 1;
        for (int k = 0; k < d->rank; k++)
            if (c->dims[k] != d->dims[k]) same = 0;
        /* chunk counts are whole numbers an int holds (else the dataset is ignored) */
        for (size_t i = 0; same && i < c->count; i++)
            if (!(c->v[i] >= 0 && c->v[i] <= INT_MAX && c->v[i] == floor(c->v[i]))) same = 0;
        if (same) g->chunks = c->v;
    }
    grid_stats(g, 0, (long)d->count, &g->all);
    return 1;
}

void ki_grid_slice(const ki_grid *g, int k, ki_grid_stats *out) {
    long n = (long)g->nt * g->nr;
    grid_stats(g, k * n, (k + 1) * n, out);
}

void ki_grid_cell(const ki_grid *g, long idx, int *k, int *i, int *j) {
    *j = (int)(idx % g->nr);
    *i = (int)((idx / g->nr) % g->nt);
    *k = (int)(idx / ((long)g->nr * g->nt));
}

const char *ki_search_winner(const ki_file *f, const ki_grid *g, int *from_grid) {
    const char *w = ki_attr_str(f, "/search", "winner");
    *from_grid = 0;
    if (!w) return NULL;
    /* the grid's own allocation: baklava when it has (t, r) axes, squeeze for a p-only grid;
     * without a grid, the plan's allocation */
    const char *grid_kind =
        g && g->ppl ? (g->rank >= 2 ? "baklava" : "squeeze") : ki_attr_str(f, "/", "allocation");
    *from_grid = grid_kind && !strcmp(w, grid_kind);
    return w;
}
