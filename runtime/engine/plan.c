/* kvplan plan module: see include/kvplan/plan.h. */
#include "kvplan/plan.h"

#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kv_plan_free(kv_plan *p) {
    if (!p) return;
    free(p->budget);
    free(p->head_policy);
    free(p->kv_type);
    memset(p, 0, sizeof *p);
}

double kv_plan_bytes(const kv_plan *p) {
    double s = 0.0;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++)
        s += (double)p->budget[i] * (double)kv_type_token_bytes(p->kv_type[i], p->model_head_dim);
    return s;
}

double kv_plan_full_f16_bytes(const kv_plan *p) {
    return (double)p->n_layers * (double)p->n_kv_heads * (double)p->context *
           (double)kv_type_token_bytes(KV_TYPE_F16, p->model_head_dim);
}

void kv_plan_set_kv_type(kv_plan *p, kv_cache_type t) {
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++) p->kv_type[i] = t;
    p->ratio = kv_plan_bytes(p) / kv_plan_full_f16_bytes(p);
}

int kv_plan_mixed_types(const kv_plan *p, kv_cache_type *first) {
    if (first) *first = p->kv_type[0];
    for (int i = 1; i < p->n_layers * p->n_kv_heads; i++)
        if (p->kv_type[i] != p->kv_type[0]) return 1;
    return 0;
}

double kv_type_token_ratio(double ratio, kv_cache_type t, int head_dim) {
    return ratio * (double)kv_type_token_bytes(KV_TYPE_F16, head_dim) /
           (double)kv_type_token_bytes(t, head_dim);
}

long kv_plan_total_tokens(const kv_plan *p) {
    long s = 0;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++) s += p->budget[i];
    return s;
}

int kv_plan_mixed_policies(const kv_plan *p) {
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++)
        if (p->head_policy[i] != p->policy) return 1;
    return 0;
}

static void update_full(kv_plan *p) {
    p->full = 1;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++)
        if (p->budget[i] < p->context) p->full = 0;
}

/* Allocate the arrays and fill the scalar fields common to every constructor. */
static int plan_alloc(kv_plan *p, const kv_config *cfg, double ratio, int context, int block_size,
                      int evict_block, kv_policy policy, const char *allocation, kv_error *err) {
    memset(p, 0, sizeof *p);
    if (!cfg || cfg->n_layers < 1 || cfg->n_kv_heads < 1)
        return kv_fail(err, KV_EINPUT, "plan: the model has no layers or KV heads");
    if (context < 2 || block_size < 1 || block_size > 4096 || evict_block < 1 ||
        evict_block > context)
        return kv_fail(err, KV_EINPUT,
                       "plan: context %d, block size %d, eviction block p = %d: need C >= 2, "
                       "b_s in [1, 4096] and p in [1, C]",
                       context, block_size, evict_block);
    size_t nh = (size_t)cfg->n_layers * (size_t)cfg->n_kv_heads;
    p->budget = kv_calloc(nh, sizeof *p->budget, "plan budgets", err);
    p->head_policy = kv_calloc(nh, sizeof *p->head_policy, "plan policies", err);
    p->kv_type = kv_calloc(nh, sizeof *p->kv_type, "plan KV types", err);
    if (!p->budget || !p->head_policy || !p->kv_type) {
        kv_plan_free(p);
        return KV_EINTERNAL;
    }
    p->n_layers = cfg->n_layers;
    p->n_kv_heads = cfg->n_kv_heads;
    p->context = context;
    p->block_size = block_size;
    p->evict_block = evict_block;
    p->ratio = ratio;
    p->policy = policy;
    for (size_t i = 0; i < nh; i++) {
        p->head_policy[i] = policy;
        p->kv_type[i] = KV_TYPE_DEFAULT;
    }
    snprintf(p->allocation, sizeof p->allocation, "%s", allocation ? allocation : "");
    p->t = p->r = p->p = NAN;
    p->model_dim = cfg->dim;
    p->model_n_heads = cfg->n_heads;
    p->model_head_dim = cfg->head_dim;
    p->model_vocab_size = cfg->vocab_size;
    p->schema_version = KV_PLAN_SCHEMA_VERSION;
    return KV_OK;
}

int kv_plan_full(const kv_config *cfg, int context, int block_size, int evict_block,
                 kv_policy policy, kv_plan *out, kv_error *err) {
    /* ratio 1: the full cache in the default type F16 is the reference itself */
    int rc = plan_alloc(out, cfg, 1.0, context, block_size, evict_block, policy, "full", err);
    if (rc) return rc;
    for (int i = 0; i < out->n_layers * out->n_kv_heads; i++) out->budget[i] = context;
    out->full = 1;
    return KV_OK;
}

int kv_uniform_budgets(int n, double ratio, int context, int block_size, int *tokens, int *blocks,
                       kv_error *err) {
    if (!(ratio > 0.0 && ratio <= 1.0))
        return kv_fail(err, KV_EINPUT, "ratio %g must be in (0, 1] (1 = the full cache)", ratio);
    if (n < 1 || context < 1 || block_size < 1)
        return kv_fail(err, KV_EINPUT, "uniform budgets need heads, a context and a block size");
    /* 1e-9: R * C that is a whole number of blocks in exact arithmetic stays one */
    long N = (long)floor(ratio * (double)n * (double)context / (double)block_size + 1e-9);
    long cap = (context + block_size - 1) / block_size;
    for (long i = 0; i < n; i++) {
        long b = (i + 1) * N / n - i * N / n;
        if (b > cap) b = cap;
        long tok = b * block_size;
        tokens[i] = (int)(tok > context ? context : tok);
        if (blocks) blocks[i] = (int)b;
    }
    return KV_OK;
}

int kv_plan_uniform(const kv_config *cfg, double ratio, int context, int block_size,
                    int evict_block, kv_policy policy, kv_plan *out, kv_error *err) {
    return kv_plan_uniform_typed(cfg, ratio, KV_TYPE_F16, context, block_size, evict_block, policy,
                                 out, err);
}

int kv_plan_uniform_typed(const kv_config *cfg, double ratio, kv_cache_type t, int context,
                          int block_size, int evict_block, kv_policy policy, kv_plan *out,
                          kv_error *err) {
    if (!(ratio > 0.0 && ratio <= KV_PLAN_MAX_RATIO))
        return kv_fail(err, KV_EINPUT, "ratio %g must be in (0, %g] (1 = the full F16 cache)",
                       ratio, KV_PLAN_MAX_RATIO);
    if (!kv_type_valid((int)t)) return kv_fail(err, KV_EINPUT, "unknown KV type code %d", (int)t);
    double tr = cfg ? kv_type_token_ratio(ratio, t, cfg->head_dim) : ratio;
    if (tr > 1.0 + 1e-12)
        return kv_fail(err, KV_EINPUT,
                       "ratio %g of the full F16 cache is more than the full cache in %s (ratio "
                       "%g)",
                       ratio, kv_type_name(t), ratio / tr);
    int capped = tr > 1.0;
    if (capped) tr = 1.0;
    int rc = plan_alloc(out, cfg, ratio, context, block_size, evict_block, policy, "uniform", err);
    if (rc) return rc;
    for (int i = 0; i < out->n_layers * out->n_kv_heads; i++) out->kv_type[i] = t;
    long n = (long)out->n_layers * out->n_kv_heads;
    rc = kv_uniform_budgets((int)n, tr, context, block_size, out->budget, NULL, err);
    if (rc) {
        kv_plan_free(out);
        return rc;
    }
    int floor_tok = kv_policy_fixed_tokens(policy) + evict_block;
    for (long i = 0; i < n; i++)
        if (out->budget[i] < context && (out->budget[i] < floor_tok || out->budget[i] < 1)) {
            double need =
                (double)((floor_tok + block_size - 1) / block_size * block_size) / (double)context;
            kv_fail(err, KV_EINPUT,
                    "ratio %g gives %d tokens per KV head (blocks of %d), below the %d the "
                    "policy '%s' needs (%d fixed + eviction block p = %d); use --ratio >= %.4g, "
                    "a smaller --block-size or a smaller --evict-block",
                    ratio, out->budget[i], block_size, floor_tok, kv_policy_name(policy),
                    kv_policy_fixed_tokens(policy), evict_block, need * ratio / tr);
            kv_plan_free(out);
            return KV_EINPUT;
        }
    update_full(out);
    if (capped) out->ratio = kv_plan_bytes(out) / kv_plan_full_f16_bytes(out);
    return KV_OK;
}

int kv_plan_from_budgets(const kv_config *cfg, const int *budget, const kv_policy *head_policy,
                         kv_policy policy, double ratio, int context, int block_size,
                         int evict_block, const char *allocation, double t, double r, double p,
                         int min_tokens, kv_plan *out, kv_error *err) {
    return kv_plan_from_budgets_typed(cfg, budget, head_policy, NULL, policy, ratio, context,
                                      block_size, evict_block, allocation, t, r, p, min_tokens, out,
                                      err);
}

int kv_plan_from_budgets_typed(const kv_config *cfg, const int *budget,
                               const kv_policy *head_policy, const kv_cache_type *types,
                               kv_policy policy, double ratio, int context, int block_size,
                               int evict_block, const char *allocation, double t, double r,
                               double p, int min_tokens, kv_plan *out, kv_error *err) {
    int rc = plan_alloc(out, cfg, ratio, context, block_size, evict_block, policy, allocation, err);
    if (rc) return rc;
    size_t nh = (size_t)out->n_layers * (size_t)out->n_kv_heads;
    memcpy(out->budget, budget, nh * sizeof *budget);
    if (head_policy) memcpy(out->head_policy, head_policy, nh * sizeof *head_policy);
    if (types) memcpy(out->kv_type, types, nh * sizeof *types);
    out->t = t;
    out->r = r;
    out->p = p;
    out->min_tokens = min_tokens;
    update_full(out);
    rc = kv_plan_validate(out, "plan", err);
    if (rc) kv_plan_free(out);
    return rc;
}

int kv_plan_copy(kv_plan *dst, const kv_plan *src, kv_error *err) {
    size_t nh = (size_t)src->n_layers * (size_t)src->n_kv_heads;
    *dst = *src;
    dst->budget = kv_malloc(nh * sizeof *dst->budget, "plan budgets", err);
    dst->head_policy = kv_malloc(nh * sizeof *dst->head_policy, "plan policies", err);
    dst->kv_type = kv_malloc(nh * sizeof *dst->kv_type, "plan KV types", err);
    if (!dst->budget || !dst->head_policy || !dst->kv_type) {
        free(dst->budget);
        free(dst->head_policy);
        free(dst->kv_type);
        memset(dst, 0, sizeof *dst);
        return KV_EINTERNAL;
    }
    memcpy(dst->budget, src->budget, nh * sizeof *dst->budget);
    memcpy(dst->head_policy, src->head_policy, nh * sizeof *dst->head_policy);
    memcpy(dst->kv_type, src->kv_type, nh * sizeof *dst->kv_type);
    return KV_OK;
}

static int valid_policy(int v) {
    return v == KV_POLICY_SINK || v == KV_POLICY_H2O || v == KV_POLICY_AVGATTN ||
           v == KV_POLICY_L2ATTN;
}

int kv_plan_validate(const kv_plan *p, const char *what, kv_error *err) {
    const char *w = what && *what ? what : "plan";
    if (!p || !p->budget || !p->head_policy || !p->kv_type || p->n_layers < 1 ||
        p->n_kv_heads < 1 || p->model_head_dim < 1)
        return kv_fail(err, KV_EINPUT, "%s: no budgets", w);
    if (p->context < 2)
        return kv_fail(err, KV_EINPUT, "%s: context_length %d must be at least 2", w, p->context);
    if (p->block_size < 1 || p->block_size > 4096)
        return kv_fail(err, KV_EINPUT, "%s: block_size %d must be in [1, 4096]", w, p->block_size);
    if (p->evict_block < 1 || p->evict_block > p->context)
        return kv_fail(err, KV_EINPUT, "%s: evict_block p = %d must be in [1, context %d]", w,
                       p->evict_block, p->context);
    if (!(isfinite(p->ratio) && p->ratio > 0.0 && p->ratio <= KV_PLAN_MAX_RATIO))
        return kv_fail(err, KV_EINPUT,
                       "%s: ratio %g must be in (0, %g] (bytes over the full F16 cache's)", w,
                       p->ratio, KV_PLAN_MAX_RATIO);
    if (!valid_policy((int)p->policy))
        return kv_fail(err, KV_EINPUT, "%s: unknown default policy code %d", w, (int)p->policy);
    int nh = p->n_layers * p->n_kv_heads;
    for (int i = 0; i < nh; i++) {
        int l = i / p->n_kv_heads, j = i % p->n_kv_heads, b = p->budget[i];
        if (!valid_policy((int)p->head_policy[i]))
            return kv_fail(err, KV_EINPUT,
                           "%s: layer %d KV head %d has unknown policy code %d (known: 0 sink, "
                           "1 h2o, 2 avgattn, 3 l2attn)",
                           w, l, j, (int)p->head_policy[i]);
        if (!kv_type_valid((int)p->kv_type[i]))
            return kv_fail(err, KV_EINPUT,
                           "%s: layer %d KV head %d has unknown KV type code %d (known: 0 f32, "
                           "1 f16, 2 q8, 3 q4)",
                           w, l, j, (int)p->kv_type[i]);
        if (b < 1 || b > p->context)
            return kv_fail(err, KV_EINPUT,
                           "%s: layer %d KV head %d has a budget of %d tokens, outside [1, "
                           "context %d]; remake the plan for this context",
                           w, l, j, b, p->context);
        int need = kv_policy_fixed_tokens(p->head_policy[i]) + p->evict_block;
        if (b < p->context && b < need)
            return kv_fail(err, KV_EINPUT,
                           "%s: layer %d KV head %d has a budget of %d tokens, below the %d "
                           "its policy '%s' needs (%d fixed + eviction block p = %d); raise the "
                           "ratio or lower --evict-block",
                           w, l, j, b, need, kv_policy_name(p->head_policy[i]),
                           kv_policy_fixed_tokens(p->head_policy[i]), p->evict_block);
    }
    double want = p->ratio * kv_plan_full_f16_bytes(p);
    double have = kv_plan_bytes(p), slack = 0.0;
    for (int i = 0; i < nh; i++)
        slack +=
            (double)p->block_size * (double)kv_type_token_bytes(p->kv_type[i], p->model_head_dim);
    if (fabs(have - want) > slack * (1.0 + 1e-12))
        return kv_fail(err, KV_EINPUT,
                       "%s: the budgets keep %.0f bytes of K/V in all, but ratio %g of the full "
                       "F16 cache is %.0f bytes (more than one block per head apart); the plan "
                       "does not keep the ratio it claims",
                       w, have, p->ratio, want);
    return KV_OK;
}

int kv_plan_check_model(const kv_plan *p, const kv_model *m, kv_error *err) {
    if (!p || !m) return kv_fail(err, KV_EINTERNAL, "plan check without a plan or a model");
    const char *pp = p->source[0] ? p->source : "plan";
    const kv_config *c = &m->cfg;
    const struct {
        const char *what;
        int plan, model;
    } cmp[] = {
        {"n_layers", p->n_layers, c->n_layers},
        {"n_kv_heads", p->n_kv_heads, c->n_kv_heads},
        {"dim", p->model_dim, c->dim},
        {"n_heads", p->model_n_heads, c->n_heads},
        {"head_dim", p->model_head_dim, c->head_dim},
        {"vocab_size", p->model_vocab_size, c->vocab_size},
    };
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
        if (cmp[i].plan != cmp[i].model)
            return kv_fail(err, KV_EINPUT,
                           "%s: this plan was made for another model: %s is %d in the plan but "
                           "%d in %s; run kvplan search for this model",
                           pp, cmp[i].what, cmp[i].plan, cmp[i].model, m->path);
    if (!p->source[0]) return KV_OK;
    if (!p->model_sha256[0])
        return kv_fail(err, KV_EINPUT,
                       "%s: the plan does not name its model (empty model_sha256), so it cannot "
                       "be checked against %s; remake it with kvplan search",
                       pp, m->path);
    if (m->sha256[0] && strcmp(p->model_sha256, m->sha256) != 0)
        return kv_fail(err, KV_EINPUT,
                       "%s: this plan was made for another model file: model_sha256 %.12s... in "
                       "the plan, %.12s... for %s (same shape, different weights); run kvplan "
                       "search for this model",
                       pp, p->model_sha256, m->sha256, m->path);
    return KV_OK;
}

/* ---- plan.h5 ---- */

static const char policy_codes[] = "0 sink, 1 h2o, 2 avgattn, 3 l2attn";
static const char type_codes[] = "0 f32, 1 f16, 2 q8, 3 q4";

static void put_le32(unsigned char *b, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int k = 0; k < 4; k++) b[k] = (unsigned char)(u >> (8 * k));
}

int kv_plan_budget_sha256(const kv_plan *p, char hex[65], kv_error *err) {
    static const char tag[16] = "kvplan budget 1";
    size_t nh = (size_t)p->n_layers * (size_t)p->n_kv_heads;
    size_t n = sizeof tag + 8 + 16 * nh;
    unsigned char *b = kv_malloc(n, "plan checksum", err);
    if (!b) return KV_EINTERNAL;
    memcpy(b, tag, sizeof tag);
    put_le32(b + 16, p->n_layers);
    put_le32(b + 20, p->n_kv_heads);
    for (size_t i = 0; i < nh; i++) {
        unsigned char *q = b + 24 + 16 * i;
        put_le32(q, p->budget[i]);
        put_le32(q + 4, kv_plan_head_blocks(p, (int)i));
        put_le32(q + 8, (int32_t)p->head_policy[i]);
        put_le32(q + 12, (int32_t)p->kv_type[i]);
    }
    const char *names[1] = {"plan budgets"};
    const void *bufs[1] = {b};
    int rc = kv_sha256_parts(names, bufs, &n, 1, hex, err);
    free(b);
    return rc;
}

int kv_plan_write(kv_h5 *f, const kv_plan *p, kv_error *err) {
    int rc = kv_plan_validate(p, kv_h5_path(f), err);
    if (rc) return rc;
    int nh = p->n_layers * p->n_kv_heads;
    int *blocks = kv_malloc((size_t)nh * sizeof *blocks, "plan blocks", err);
    int *pol = kv_malloc((size_t)nh * sizeof *pol, "plan policies", err);
    int *ty = kv_malloc((size_t)nh * sizeof *ty, "plan KV types", err);
    if (!blocks || !pol || !ty) {
        free(blocks);
        free(pol);
        free(ty);
        return KV_EINTERNAL;
    }
    for (int i = 0; i < nh; i++) {
        blocks[i] = kv_plan_head_blocks(p, i);
        pol[i] = (int)p->head_policy[i];
        ty[i] = (int)p->kv_type[i];
    }
    long dims[2] = {p->n_layers, p->n_kv_heads};
    if (!rc) rc = kv_h5_attr_f64(f, "/", "ratio", p->ratio, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/", "context_length", p->context, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/", "block_size", p->block_size, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/", "evict_block", p->evict_block, err);
    if (!rc) rc = kv_h5_attr_str(f, "/", "policy", kv_policy_name(p->policy), err);
    if (!rc) rc = kv_h5_attr_str(f, "/", "allocation", p->allocation, err);
    if (!rc) rc = kv_h5_attr_f64(f, "/", "t", p->t, err);
    if (!rc) rc = kv_h5_attr_f64(f, "/", "r", p->r, err);
    if (!rc) rc = kv_h5_attr_f64(f, "/", "p", p->p, err);
    if (!rc && p->min_tokens > 0) rc = kv_h5_attr_i64(f, "/", "min_tokens", p->min_tokens, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/", "plan_schema", KV_PLAN_SCHEMA_VERSION, err);
    if (!rc) rc = kv_h5_write_i32(f, "/budget/tokens", 2, dims, p->budget, "tokens", err);
    if (!rc) rc = kv_h5_write_i32(f, "/budget/blocks", 2, dims, blocks, "blocks", err);
    if (!rc) rc = kv_h5_write_i32(f, "/budget/policy", 2, dims, pol, NULL, err);
    if (!rc) rc = kv_h5_attr_str(f, "/budget/policy", "codes", policy_codes, err);
    if (!rc) rc = kv_h5_write_i32(f, "/budget/kv_type", 2, dims, ty, NULL, err);
    if (!rc) rc = kv_h5_attr_str(f, "/budget/kv_type", "codes", type_codes, err);
    char sha[65];
    if (!rc) rc = kv_plan_budget_sha256(p, sha, err);
    if (!rc) rc = kv_h5_attr_str(f, "/budget", "sha256", sha, err);
    free(blocks);
    free(pol);
    free(ty);
    return rc;
}

/* A whole-number root attribute in [lo, hi], read as float64 so that a fraction (16.5), NaN
 * or 1e300 stored in a float attribute is seen and named with the file's value, instead of
 * being truncated or clamped by an integer read. */
static int read_int_attr(kv_h5 *f, const char *name, long lo, long hi, int *out, kv_error *err) {
    double v = 0;
    int rc = kv_h5_read_attr_f64(f, "/", name, &v, err);
    if (rc) return rc;
    const char *bad = !isfinite(v)     ? "is not a finite number"
                      : v != floor(v)  ? "is not a whole number"
                      : v < (double)lo ? "is out of range"
                      : v > (double)hi ? "is out of range"
                                       : NULL;
    if (bad)
        return kv_fail(err, KV_EINPUT, "%s: attribute %s = %.17g %s; allowed [%ld, %ld]",
                       kv_h5_path(f), name, v, bad, lo, hi);
    *out = (int)v;
    return KV_OK;
}

static int read_str_attr(kv_h5 *f, const char *name, char *dst, size_t cap, kv_error *err) {
    char *s = NULL;
    int rc = kv_h5_read_attr_str(f, "/", name, &s, err);
    if (rc) return rc;
    if (strlen(s) >= cap)
        rc =
            kv_fail(err, KV_EINPUT, "%s: attribute %s is %zu characters long, at most %zu expected",
                    kv_h5_path(f), name, strlen(s), cap - 1);
    else
        memcpy(dst, s, strlen(s) + 1);
    free(s);
    return rc;
}

/* An [L, H_kv] matrix of whole numbers, read as float64 so that fractions and NaN are seen
 * (an int32 read would truncate them silently). *out [L * H_kv] owned by the caller. */
static int read_matrix(kv_h5 *f, const char *path, int L, int H, long lo, long hi, int **out,
                       kv_error *err) {
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *d = NULL;
    int rc = kv_h5_read_f64(f, path, &rank, dims, &d, err);
    if (rc) return rc;
    if (rank != 2 || dims[0] != L || dims[1] != H) {
        free(d);
        return kv_fail(err, KV_EINPUT, "%s: dataset %s must have shape [%d, %d] ([L, H_kv])",
                       kv_h5_path(f), path, L, H);
    }
    int *v = kv_malloc((size_t)L * (size_t)H * sizeof *v, "plan matrix", err);
    for (long i = 0; v && i < (long)L * H; i++) {
        double x = d[i];
        const char *bad = !isfinite(x)     ? "is not a number"
                          : x != floor(x)  ? "is not a whole number"
                          : x < (double)lo ? "is too small"
                          : x > (double)hi ? "is too large"
                                           : NULL;
        if (bad) {
            rc = kv_fail(err, KV_EINPUT,
                         "%s: %s of layer %ld KV head %ld (%g) %s; allowed [%ld, %ld]",
                         kv_h5_path(f), path, i / H, i % H, x, bad, lo, hi);
            break;
        }
        v[i] = (int)x;
    }
    free(d);
    if (!v) return KV_EINTERNAL;
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    return KV_OK;
}

/* The budget shape [L, H_kv] from /budget/tokens (before anything else is read). */
static int budget_shape(kv_h5 *f, int *L, int *H, kv_error *err) {
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *d = NULL;
    int rc = kv_h5_read_f64(f, "/budget/tokens", &rank, dims, &d, err);
    free(d);
    if (rc) return rc;
    if (rank != 2 || dims[0] < 1 || dims[1] < 1 || dims[0] > 4096 || dims[1] > 4096)
        return kv_fail(err, KV_EINPUT, "%s: dataset /budget/tokens must have shape [L, H_kv]",
                       kv_h5_path(f));
    *L = (int)dims[0];
    *H = (int)dims[1];
    return KV_OK;
}

/* Stage 1 of kv_plan_read: a plan (a /budget group) of a schema this build reads. */
static int plan_check_schema(kv_h5 *f, const char *path, kv_error *err) {
    if (!kv_h5_exists(f, "/budget"))
        return kv_fail(err, KV_EINPUT,
                       "%s: not a plan file (no /budget group; was it written by kvplan search?)",
                       path);
    if (!kv_h5_attr_exists(f, "/", "plan_schema")) return KV_OK; /* absent in the first v1 plans */
    int ps = 0;
    int rc = read_int_attr(f, "plan_schema", 1, INT_MAX, &ps, err);
    if (!rc && ps > KV_PLAN_SCHEMA_VERSION)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: plan_schema %d is newer than this kvplan reads (%d); upgrade "
                     "kvplan or remake the plan",
                     path, ps, KV_PLAN_SCHEMA_VERSION);
    return rc;
}

/* Stage 2: the root attributes (ratio, C, b_s, p, policy, allocation and its parameters). */
static int plan_read_attrs(kv_h5 *f, const char *path, kv_plan *p, kv_error *err) {
    char pol[32] = "";
    int rc = kv_h5_read_attr_f64(f, "/", "ratio", &p->ratio, err);
    if (rc) return rc;
    if (!(isfinite(p->ratio) && p->ratio > 0.0 && p->ratio <= KV_PLAN_MAX_RATIO))
        return kv_fail(err, KV_EINPUT, "%s: attribute ratio = %g is outside (0, %g]", path,
                       p->ratio, KV_PLAN_MAX_RATIO);
    if ((rc = read_int_attr(f, "context_length", 2, 1 << 24, &p->context, err))) return rc;
    if ((rc = read_int_attr(f, "block_size", 1, 4096, &p->block_size, err))) return rc;
    p->evict_block = p->context < KV_DEFAULT_EVICT_BLOCK ? p->context : KV_DEFAULT_EVICT_BLOCK;
    if (kv_h5_attr_exists(f, "/", "evict_block") &&
        (rc = read_int_attr(f, "evict_block", 1, p->context, &p->evict_block, err)))
        return rc;
    if ((rc = read_str_attr(f, "policy", pol, sizeof pol, err))) return rc;
    if ((rc = kv_policy_parse(pol, &p->policy, err))) {
        kv_fail_context(err, "%s: attribute policy", path);
        return rc;
    }
    if ((rc = read_str_attr(f, "allocation", p->allocation, sizeof p->allocation, err))) return rc;
    p->t = p->r = p->p = NAN;
    const struct {
        const char *name;
        double *dst;
    } opt[] = {{"t", &p->t}, {"r", &p->r}, {"p", &p->p}};
    for (int i = 0; i < 3; i++)
        if (kv_h5_attr_exists(f, "/", opt[i].name) &&
            (rc = kv_h5_read_attr_f64(f, "/", opt[i].name, opt[i].dst, err)))
            return rc;
    if (kv_h5_attr_exists(f, "/", "min_tokens") &&
        (rc = read_int_attr(f, "min_tokens", 0, 1 << 24, &p->min_tokens, err)))
        return rc;
    return KV_OK;
}

/* Stage 3: the model's identity; its L and H_kv, when recorded, must match /budget/tokens. */
static int plan_read_model(kv_h5 *f, const char *path, kv_plan *p, kv_error *err) {
    int rc = read_str_attr(f, "model_sha256", p->model_sha256, sizeof p->model_sha256, err);
    if (!rc) rc = read_int_attr(f, "model_dim", 1, INT_MAX, &p->model_dim, err);
    if (!rc) rc = read_int_attr(f, "model_n_heads", 1, INT_MAX, &p->model_n_heads, err);
    if (!rc) rc = read_int_attr(f, "model_head_dim", 1, INT_MAX, &p->model_head_dim, err);
    if (!rc) rc = read_int_attr(f, "model_vocab_size", 1, INT_MAX, &p->model_vocab_size, err);
    const struct {
        const char *name;
        int want;
    } shape[] = {{"model_n_layers", p->n_layers}, {"model_n_kv_heads", p->n_kv_heads}};
    for (int i = 0; i < 2 && !rc; i++) {
        int v = 0;
        if (!kv_h5_attr_exists(f, "/", shape[i].name)) continue;
        if ((rc = read_int_attr(f, shape[i].name, 1, INT_MAX, &v, err))) break;
        if (v != shape[i].want)
            rc = kv_fail(err, KV_EINPUT, "%s: attribute %s = %d disagrees with /budget/tokens (%d)",
                         path, shape[i].name, v, shape[i].want);
    }
    return rc;
}

/* Stage 4: /budget/tokens in [1, C] and /budget/blocks, which must be their block counts. */
static int plan_read_budgets(kv_h5 *f, const char *path, kv_plan *p, kv_error *err) {
    int rc = read_matrix(f, "/budget/tokens", p->n_layers, p->n_kv_heads, 1, p->context, &p->budget,
                         err);
    if (rc) return rc;
    int *blocks = NULL;
    const int bs = p->block_size;
    long max_blocks = (p->context + bs - 1) / bs;
    if ((rc = read_matrix(f, "/budget/blocks", p->n_layers, p->n_kv_heads, 1, max_blocks, &blocks,
                          err)))
        return rc;
    for (int i = 0; i < p->n_layers * p->n_kv_heads && !rc; i++)
        if (blocks[i] != (p->budget[i] + bs - 1) / bs)
            rc = kv_fail(err, KV_EINPUT,
                         "%s: /budget/blocks of layer %d KV head %d is %d, but %d tokens in "
                         "blocks of %d need %d; the file is inconsistent",
                         path, i / p->n_kv_heads, i % p->n_kv_heads, blocks[i], p->budget[i], bs,
                         (p->budget[i] + bs - 1) / bs);
    free(blocks);
    return rc;
}

/* Stage 5: per-head policies (schema 2; the root policy for every head in schema 1). */
static int plan_read_policies(kv_h5 *f, kv_plan *p, kv_error *err) {
    size_t nh = (size_t)p->n_layers * (size_t)p->n_kv_heads;
    int *codes = NULL;
    p->schema_version = 1;
    if (kv_h5_exists(f, "/budget/policy")) {
        int rc = read_matrix(f, "/budget/policy", p->n_layers, p->n_kv_heads, 0, 3, &codes, err);
        if (rc) return rc;
        p->schema_version = 2;
    }
    p->head_policy = kv_malloc(nh * sizeof *p->head_policy, "plan policies", err);
    for (size_t i = 0; p->head_policy && i < nh; i++)
        p->head_policy[i] = codes ? (kv_policy)codes[i] : p->policy;
    free(codes);
    return p->head_policy ? KV_OK : KV_EINTERNAL;
}

/* Stage 6: per-head KV storage types (schema 3). Schema 1 and 2 plans were made by a runtime
 * that kept K/V in f32, and their ratio attribute is the token fraction r: in bytes over the
 * full F16 cache that is 2 r (exact). */
static int plan_read_kv_types(kv_h5 *f, const char *path, kv_plan *p, kv_error *err) {
    size_t nh = (size_t)p->n_layers * (size_t)p->n_kv_heads;
    int *codes = NULL;
    if (kv_h5_exists(f, "/budget/kv_type")) {
        int rc = read_matrix(f, "/budget/kv_type", p->n_layers, p->n_kv_heads, 0,
                             KV_CACHE_TYPES - 1, &codes, err);
        if (rc) return rc;
        p->schema_version = 3;
    } else if (p->ratio > 1.0) {
        return kv_fail(err, KV_EINPUT, "%s: attribute ratio = %g is outside (0, 1] (schema %d)",
                       path, p->ratio, p->schema_version);
    } else {
        p->ratio *= (double)kv_type_token_bytes(KV_TYPE_F32, 1) /
                    (double)kv_type_token_bytes(KV_TYPE_F16, 1);
    }
    p->kv_type = kv_malloc(nh * sizeof *p->kv_type, "plan KV types", err);
    for (size_t i = 0; p->kv_type && i < nh; i++)
        p->kv_type[i] = codes ? (kv_cache_type)codes[i] : KV_TYPE_F32;
    free(codes);
    return p->kv_type ? KV_OK : KV_EINTERNAL;
}

/* Stage 7: /budget@sha256, when the file has one, must be the SHA-256 of what was read. */
static int plan_check_sha256(kv_h5 *f, const char *path, kv_plan *p, kv_error *err) {
    p->budget_sha256 = 0;
    if (!kv_h5_attr_exists(f, "/budget", "sha256")) return KV_OK;
    char *have = NULL, want[65];
    int rc = kv_h5_read_attr_str(f, "/budget", "sha256", &have, err);
    if (!rc) rc = kv_plan_budget_sha256(p, want, err);
    if (!rc && strcmp(have, want) != 0)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: /budget does not match its SHA-256 (attribute /budget@sha256 %.12s..., "
                     "the data %.12s...): budgets, policies or KV types changed after the plan "
                     "was written; remake it with kvplan search",
                     path, have, want);
    free(have);
    if (!rc) p->budget_sha256 = 1;
    return rc;
}

int kv_plan_read(const char *path, kv_plan *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    kv_h5 *f = NULL;
    int rc = kv_h5_open_read(path, &f, err);
    if (rc) return rc;
    kv_plan p;
    memset(&p, 0, sizeof p);
    rc = plan_check_schema(f, path, err);
    if (!rc) rc = budget_shape(f, &p.n_layers, &p.n_kv_heads, err);
    if (!rc) rc = plan_read_attrs(f, path, &p, err);
    if (!rc) rc = plan_read_model(f, path, &p, err);
    if (!rc) rc = plan_read_budgets(f, path, &p, err);
    if (!rc) rc = plan_read_policies(f, &p, err);
    if (!rc) rc = plan_read_kv_types(f, path, &p, err);
    if (!rc) rc = plan_check_sha256(f, path, &p, err);
    if (!rc) {
        snprintf(p.source, sizeof p.source, "%s", path);
        update_full(&p);
        rc = kv_plan_validate(&p, path, err);
    }
    kv_h5_close(f);
    if (rc)
        kv_plan_free(&p);
    else
        *out = p;
    return rc;
}
