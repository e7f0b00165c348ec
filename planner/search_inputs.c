/* kvplan search, its inputs: the profile's head and layer figures, the option grids, the
 * search's defaults, and what every stage derives from the options (the sensitivity options and
 * the engine the budgets run on). See include/kvplan/search.h and planner/search_impl.h. */
#include "planner/search_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/plan.h"

/* ---------------------------------------------------------------- profile ---- */

void kv_profile_inputs_free(kv_profile_inputs *p) {
    if (!p) return;
    free(p->head_sim);
    free(p->head_imp);
    free(p->layer_sim);
    memset(p, 0, sizeof *p);
}

/* rounding slack of cosines computed in float (|cos| may exceed 1 by a few ulp) */
#define KV_PROFILE_RANGE_TOL 1e-6

static int read_matrix(kv_h5 *f, const char *path, int want_rank, long d0, long d1, double **out,
                       kv_error *err) {
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    *out = NULL;
    /* the shape is checked before the data is read: a forged [5, 6e7] is never loaded */
    int rc = kv_h5_dataset_shape(f, path, &rank, dims, err);
    if (!rc && rank == want_rank && dims[0] == d0 && (want_rank == 1 || dims[1] == d1))
        rc = kv_h5_read_f64(f, path, &rank, dims, out, err);
    if (rc) return rc;
    if (rank != want_rank || dims[0] != d0 || (want_rank == 2 && dims[1] != d1)) {
        free(*out);
        *out = NULL;
        char shape[64] = "[";
        for (int i = 0; i < rank && i < 3; i++) {
            size_t l = strlen(shape);
            snprintf(shape + l, sizeof shape - l, "%s%ld", i ? ", " : "", dims[i]);
        }
        strncat(shape, rank > 3 ? ", ...]" : "]", sizeof shape - strlen(shape) - 1);
        if (want_rank == 2)
            return kv_fail(err, KV_EINPUT,
                           "%s: %s has shape %s, expected [%ld, %ld] for this "
                           "model (L, H_kv)",
                           kv_h5_path(f), path, shape, d0, d1);
        return kv_fail(err, KV_EINPUT, "%s: %s has shape %s, expected [%ld] for this model (L)",
                       kv_h5_path(f), path, shape, d0);
    }
    return KV_OK;
}

/* The profile's values: head similarity s = (mean cos + 1) / 2 and importance 1 - s lie in
 * [0, 1]; layer similarity is a cosine in [-1, 1] (docs/design.md Profiling;
 * include/kvplan/profiler.h). */
static int profile_check_values(const char *path, const kv_profile_inputs *p, kv_error *err) {
    const int L = p->n_layers, H = p->n_kv_heads;
    for (int i = 0; i < L * H; i++)
        if (!(p->head_sim[i] >= -KV_PROFILE_RANGE_TOL &&
              p->head_sim[i] <= 1.0 + KV_PROFILE_RANGE_TOL) ||
            !(p->head_imp[i] >= -KV_PROFILE_RANGE_TOL &&
              p->head_imp[i] <= 1.0 + KV_PROFILE_RANGE_TOL))
            return kv_fail(err, KV_EINPUT,
                           "%s: head similarity/importance of layer %d head %d is %.6g/%.6g, "
                           "outside [0, 1]; the profile is damaged: run kvplan profile again",
                           path, i / H, i % H, p->head_sim[i], p->head_imp[i]);
    for (int l = 0; l < L; l++)
        if (!(p->layer_sim[l] >= -1.0 - KV_PROFILE_RANGE_TOL &&
              p->layer_sim[l] <= 1.0 + KV_PROFILE_RANGE_TOL))
            return kv_fail(err, KV_EINPUT,
                           "%s: layer similarity of layer %d is %.6g, outside [-1, 1]; the "
                           "profile is damaged: run kvplan profile again",
                           path, l, p->layer_sim[l]);
    return KV_OK;
}

/* The shape [L, H_kv] of /heads/similarity, for a profile read without its model. */
static int profile_shape(kv_h5 *f, int *L, int *H, kv_error *err) {
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    int rc = kv_h5_dataset_shape(f, "/heads/similarity", &rank, dims, err);
    if (rc) return rc;
    if (rank != 2 || dims[0] < 1 || dims[1] < 1 || dims[0] > 65536 || dims[1] > 65536)
        return kv_fail(err, KV_EINPUT,
                       "%s: /heads/similarity must have shape [L, H_kv] (rank 2, each 1 to "
                       "65536); the profile is damaged: run kvplan profile again",
                       kv_h5_path(f));
    *L = (int)dims[0];
    *H = (int)dims[1];
    return KV_OK;
}

/* kv_profile_inputs_read, for model m or (m NULL) any model: then the shape comes from
 * /heads/similarity and model_sha256 is only copied. */
static int profile_read(const char *path, const kv_model *m, kv_profile_inputs *out,
                        kv_error *err) {
    memset(out, 0, sizeof *out);
    kv_h5 *f = NULL;
    int rc = kv_h5_open_read(path, &f, err);
    if (rc) return rc;
    char *sha = NULL;
    rc = kv_h5_read_attr_str(f, "/", "model_sha256", &sha, err);
    if (!rc && m && strcmp(sha, m->sha256) != 0)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: the profile belongs to another model (model_sha256 %.16s..., but %s "
                     "has %.16s...); run `kvplan profile %s` first",
                     path, sha, m->path, m->sha256, m->path);
    if (!rc && strlen(sha) < sizeof out->model_sha256) strcpy(out->model_sha256, sha);
    free(sha);
    int L = m ? m->cfg.n_layers : 0, H = m ? m->cfg.n_kv_heads : 0;
    if (!rc && !m) rc = profile_shape(f, &L, &H, err);
    out->n_layers = L;
    out->n_kv_heads = H;
    if (!rc) rc = read_matrix(f, "/heads/similarity", 2, L, H, &out->head_sim, err);
    if (!rc) rc = read_matrix(f, "/layers/similarity", 1, L, 0, &out->layer_sim, err);
    if (!rc && kv_h5_exists(f, "/heads/importance")) {
        rc = read_matrix(f, "/heads/importance", 2, L, H, &out->head_imp, err);
    } else if (!rc) {
        out->head_imp = kv_malloc((size_t)L * H * sizeof *out->head_imp, "importance", err);
        if (!out->head_imp) rc = KV_EINTERNAL;
        for (int i = 0; !rc && i < L * H; i++) out->head_imp[i] = 1.0 - out->head_sim[i];
    }
    if (!rc) rc = profile_check_values(path, out, err);
    kv_h5_close(f);
    if (rc) kv_profile_inputs_free(out);
    return rc;
}

int kv_profile_inputs_read(const char *path, const kv_model *m, kv_profile_inputs *out,
                           kv_error *err) {
    return profile_read(path, m, out, err);
}

int kv_profile_inputs_check(const char *path, kv_error *err) {
    kv_profile_inputs p;
    int rc = profile_read(path, NULL, &p, err);
    kv_profile_inputs_free(&p);
    return rc;
}

/* ---------------------------------------------------------------- grids ---- */

int kv_grid_parse(const char *s, const char *opt, double lo, double hi, double **vals, int *n,
                  kv_error *err) {
    *vals = NULL;
    *n = 0;
    if (!s || !*s) return kv_fail(err, KV_EINPUT, "%s: empty grid", opt);
    double a, b, step;
    char tail;
    int cnt = 0;
    double *v = NULL;
    if (sscanf(s, "%lf:%lf:%lf%c", &a, &b, &step, &tail) == 3) {
        if (!(step > 0) || !(b >= a) || !isfinite(a) || !isfinite(b))
            return kv_fail(err, KV_EINPUT, "%s '%s': need a <= b and step > 0 in a:b:step", opt, s);
        double nn = floor((b - a) / step + 1e-3) + 1;
        if (nn > 100000) return kv_fail(err, KV_EINPUT, "%s '%s': too many points", opt, s);
        cnt = (int)nn;
        v = kv_malloc((size_t)cnt * sizeof *v, "grid", err);
        if (!v) return KV_EINTERNAL;
        for (int i = 0; i < cnt; i++) {
            v[i] = a + i * step;
            /* snap to the step's decimal grid: 0.05 * 3 prints as 0.15 */
            v[i] = round(v[i] * 1e9) / 1e9;
        }
    } else {
        int commas = 1;
        for (const char *p = s; *p; p++) commas += *p == ',';
        v = kv_malloc((size_t)commas * sizeof *v, "grid", err);
        if (!v) return KV_EINTERNAL;
        const char *p = s;
        while (*p) {
            char *end;
            double x = strtod(p, &end);
            if (end == p || (*end && *end != ',')) {
                free(v);
                return kv_fail(err, KV_EINPUT,
                               "%s '%s': expected a:b:step, a value or a comma "
                               "list of values",
                               opt, s);
            }
            v[cnt++] = x;
            p = *end ? end + 1 : end;
        }
    }
    for (int i = 0; i < cnt; i++)
        if (!(v[i] >= lo - 1e-12 && v[i] <= hi + 1e-12)) {
            double bad = v[i];
            free(v);
            return kv_fail(err, KV_EINPUT, "%s: value %g is outside [%g, %g]", opt, bad, lo, hi);
        }
    if (cnt < 1) {
        free(v);
        return kv_fail(err, KV_EINPUT, "%s: empty grid", opt);
    }
    *vals = v;
    *n = cnt;
    return KV_OK;
}

/* ---------------------------------------------------------------- search state ---- */

void kv_search_opts_default(kv_search_opts *o, const kv_model *m) {
    memset(o, 0, sizeof *o);
    o->kv_type = KV_TYPE_DEFAULT;
    static const double default_p = KV_SQUEEZE_DEFAULT_P;
    o->allocation = KV_ALLOC_BAKLAVA;
    o->ratio = 0.5;
    o->context = m ? m->cfg.seq_len : 256;
    o->block_size = KV_DEFAULT_BLOCK_SIZE;
    o->evict_block = KV_DEFAULT_EVICT_BLOCK;
    o->policy = KV_POLICY_SINK;
    o->p_values = &default_p;
    o->n_p = 1;
    o->eval_tokens = 8192;
    o->heldout_tokens = 4096;
    o->halving_min_chunks = 1;
    kv_sens_opts_default(&o->sens, m);
}

/* ---------------------------------------------------------------- derived options ---- */

kv_sens_opts kv_search_sens_opts(const kv_search_opts *o) {
    kv_sens_opts so = o->sens;
    so.ratio = o->ratio;
    so.context = o->context;
    so.block_size = o->block_size;
    so.evict_block = o->evict_block;
    so.policy = o->policy;
    so.progress = o->progress;
    so.tasks = o->tasks;
    so.kv_type = o->kv_type;
    so.types_mask = o->sensitivity ? o->kv_types_mask : 0;
    return so;
}

int kv_search_engine(const kv_model *m, const kv_search_opts *o, kv_cache_type t, int block_size,
                     int p, int seqs, int type_mask, kv_engine **out, kv_error *err) {
    kv_plan full;
    int rc = kv_plan_full(&m->cfg, o->context, block_size, p, o->policy, &full, err);
    if (rc) return rc;
    kv_plan_set_kv_type(&full, t);
    kv_engine_opts eo = {
        .device = o->device, .max_seqs = seqs, .n_threads = o->n_threads, .type_mask = type_mask};
    rc = kv_engine_new(m, &full, &eo, out, err);
    kv_plan_free(&full);
    return rc;
}

/* ---------------------------------------------------------------- ratio and blocks ---- */

int kv_search_ratio_tokens(double ratio, kv_cache_type t, int head_dim, double *tokens,
                           kv_error *err) {
    double r = kv_type_token_ratio(ratio, t, head_dim);
    if (r > 1.0 + 1e-12)
        return kv_fail(err, KV_EINPUT,
                       "--ratio %g of the full F16 cache is more than the full cache in %s (at "
                       "most %g)",
                       ratio, kv_type_name(t), ratio / r);
    *tokens = r > 1.0 ? 1.0 : r;
    return KV_OK;
}

double kv_search_ratio_bytes(double tokens, kv_cache_type t, int head_dim) {
    return tokens * (double)kv_type_token_bytes(t, head_dim) /
           (double)kv_type_token_bytes(KV_TYPE_F16, head_dim);
}

int kv_search_default_blocks(double ratio, int context, kv_policy policy, int block_size,
                             int evict_block, int *bs_out, int *p_out, int *min_tokens,
                             kv_error *err) {
    if (block_size && evict_block) return KV_OK;
    double u = ratio * context;
    int fixed = kv_policy_fixed_tokens(policy);
    for (int b = 16; b >= 1; b /= 2) {
        int bs = block_size ? block_size : b;
        int p = evict_block ? evict_block : b;
        if (u / bs >= 8.0 && fixed + p <= u / 2) {
            *bs_out = bs;
            *p_out = p;
            *min_tokens = fixed + p;
            return KV_OK;
        }
    }
    return kv_fail(err, KV_EINPUT,
                   "R = %g of C = %d is %.1f tokens per head: with the %s policy's %d fixed "
                   "tokens no block size leaves room to move budget between heads; pass a "
                   "larger --ratio or --context, or --block-size 1 --evict-block 1 to accept it",
                   ratio, context, u, kv_policy_name(policy), fixed);
}
