/* Retrieval heads and the search stage that keeps retrieval (include/kvplan/retrieval.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/retrieval.h"
#include "kvplan/search.h"

void kv_retrieval_heads_free(kv_retrieval_heads *h) {
    if (!h) return;
    free(h->nll_rise);
    free(h->accuracy);
    memset(h, 0, sizeof *h);
}

int kv_retrieval_heads_measure(kv_engine *e, const kv_model *m, const kv_probes *p, int max_probes,
                               int window, kv_progress *progress, kv_retrieval_heads *out,
                               kv_error *err) {
    memset(out, 0, sizeof *out);
    const kv_plan *plan = kv_engine_plan(e);
    const int nh = plan->n_layers * plan->n_kv_heads, C = plan->context;
    if (window < KV_SINK_TOKENS + plan->evict_block || window >= C)
        return kv_fail(err, KV_EINPUT,
                       "retrieval heads: window %d outside [%d, %d) (sinks + p up to the context)",
                       window, KV_SINK_TOKENS + plan->evict_block, C);
    int n = max_probes > 0 && max_probes < p->n ? max_probes : p->n;
    out->n_layers = plan->n_layers, out->n_kv_heads = plan->n_kv_heads;
    out->window = window, out->n_probes = n;
    snprintf(out->probes, sizeof out->probes, "%s", p->path);
    out->nll_rise = kv_malloc((size_t)nh * sizeof *out->nll_rise, "retrieval heads", err);
    out->accuracy = kv_malloc((size_t)nh * sizeof *out->accuracy, "retrieval heads", err);
    int *budget = kv_malloc((size_t)nh * sizeof *budget, "budgets", err);
    kv_policy *pol = kv_malloc((size_t)nh * sizeof *pol, "policies", err);
    int rc = out->nll_rise && out->accuracy && budget && pol ? KV_OK : KV_EINTERNAL;
    kv_probe_score s;
    if (!rc) rc = kv_probes_eval(e, m, p, 0, n, NULL, NULL, NULL, &s, err);
    if (!rc) out->full_nll = s.nll, out->full_accuracy = s.accuracy;
    for (int h = 0; h < nh && !rc; h++) {
        for (int i = 0; i < nh; i++) budget[i] = C, pol[i] = KV_POLICY_SINK;
        budget[h] = window;
        rc = kv_probes_eval(e, m, p, 0, n, budget, pol, NULL, &s, err);
        if (rc) break;
        out->nll_rise[h] = s.nll - out->full_nll;
        out->accuracy[h] = s.accuracy;
        if (progress)
            kv_progress_print(progress, h + 1 == nh,
                              "retrieval heads: %d/%d (layer %d head %d: answer NLL %+.3f, "
                              "accuracy %.0f%%)",
                              h + 1, nh, h / plan->n_kv_heads, h % plan->n_kv_heads,
                              out->nll_rise[h], 100 * s.accuracy);
    }
    free(budget);
    free(pol);
    if (rc) kv_retrieval_heads_free(out);
    return rc;
}

/* /heads/<name> and /heads/<name>_accuracy with their attributes. */
static int heads_write(kv_h5 *f, const char *name, const kv_retrieval_heads *h, kv_error *err) {
    long dims[2] = {h->n_layers, h->n_kv_heads};
    char d[64], da[80];
    snprintf(d, sizeof d, "/heads/%s", name);
    snprintf(da, sizeof da, "/heads/%s_accuracy", name);
    int rc = kv_h5_write_f64(f, d, 2, dims, h->nll_rise,
                             "nats/token: rise of the probes' mean answer NLL when this head "
                             "alone keeps a sink + recent window of `window` tokens",
                             err);
    if (!rc)
        rc = kv_h5_write_f64(f, da, 2, dims, h->accuracy,
                             "fraction of the probes answered with this head cut", err);
    if (!rc) rc = kv_h5_attr_i64(f, d, "window", h->window, err);
    if (!rc) rc = kv_h5_attr_i64(f, d, "n_probes", h->n_probes, err);
    if (!rc) rc = kv_h5_attr_f64(f, d, "full_nll", h->full_nll, err);
    if (!rc) rc = kv_h5_attr_f64(f, d, "full_accuracy", h->full_accuracy, err);
    if (!rc) rc = kv_h5_attr_str(f, d, "probes", h->probes, err);
    return rc;
}

int kv_retrieval_heads_write(kv_h5 *f, const kv_retrieval_heads *h, kv_error *err) {
    return heads_write(f, "retrieval", h, err);
}

int kv_retrieval_induction_write(kv_h5 *f, const kv_retrieval_heads *h, kv_error *err) {
    return heads_write(f, "induction", h, err);
}

int kv_retrieval_heads_read(kv_h5 *f, const char *path, int n_layers, int n_kv_heads,
                            kv_retrieval_heads *out, int *found, kv_error *err) {
    memset(out, 0, sizeof *out);
    *found = 0;
    if (!kv_h5_exists(f, "/heads/retrieval")) return KV_OK;
    int rank = 0, rank2 = 0;
    long dims[KV_H5_MAX_RANK], dims2[KV_H5_MAX_RANK], v = 0;
    int rc = kv_h5_read_f64(f, "/heads/retrieval", &rank, dims, &out->nll_rise, err);
    if (!rc)
        rc = kv_h5_read_f64(f, "/heads/retrieval_accuracy", &rank2, dims2, &out->accuracy, err);
    if (!rc && (rank != 2 || dims[0] != n_layers || dims[1] != n_kv_heads || rank2 != 2 ||
                dims2[0] != n_layers || dims2[1] != n_kv_heads))
        rc = kv_fail(err, KV_EINPUT, "%s: /heads/retrieval is not [%d, %d]; re-run kvplan profile",
                     path, n_layers, n_kv_heads);
    const char *d = "/heads/retrieval";
    if (!rc) rc = kv_h5_read_attr_i64(f, d, "window", &v, err);
    out->window = (int)v;
    if (!rc) rc = kv_h5_read_attr_i64(f, d, "n_probes", &v, err);
    out->n_probes = (int)v;
    if (!rc) rc = kv_h5_read_attr_f64(f, d, "full_nll", &out->full_nll, err);
    if (!rc) rc = kv_h5_read_attr_f64(f, d, "full_accuracy", &out->full_accuracy, err);
    char *s = NULL;
    if (!rc) rc = kv_h5_read_attr_str(f, d, "probes", &s, err);
    if (s) snprintf(out->probes, sizeof out->probes, "%s", s);
    free(s);
    if (rc) {
        kv_retrieval_heads_free(out);
        return kv_fail_context(err, "%s", path);
    }
    out->n_layers = n_layers, out->n_kv_heads = n_kv_heads;
    *found = 1;
    return KV_OK;
}

void kv_retrieval_opts_default(kv_retrieval_opts *o) {
    memset(o, 0, sizeof *o);
    o->tolerance = 0.05;
}

void kv_retrieval_result_free(kv_retrieval_result *r) {
    if (!r) return;
    kv_retrieval_heads_free(&r->heads);
    memset(r, 0, sizeof *r);
}

int kv_retrieval_write(kv_h5 *f, const kv_retrieval_result *r, kv_error *err) {
    const kv_probe_score *s[4] = {&r->full, &r->uniform, &r->guard, &r->plan};
    const double ppl[4] = {r->full_ppl, r->uniform_ppl, r->guard_ppl, r->plan_ppl};
    double base[12], cand[KV_RETRIEVAL_MAX_CAND * 8];
    for (int i = 0; i < 4; i++)
        base[i * 3] = s[i]->accuracy, base[i * 3 + 1] = s[i]->nll, base[i * 3 + 2] = ppl[i];
    for (int k = 0; k < r->n_cand; k++) {
        double *c = cand + k * 8;
        c[0] = r->weight[k], c[1] = r->forced[k], c[2] = r->whole[k];
        c[3] = r->cand[k].accuracy, c[4] = r->cand[k].nll, c[5] = r->cand_ppl[k];
        c[6] = r->kept[k], c[7] = r->kept[k] ? r->others[k] : -1;
    }
    long d1[2] = {4, 3}, d2[2] = {r->n_cand, 8}, d3[2] = {r->heads.n_layers, r->heads.n_kv_heads};
    const char *g = "/search/retrieval";
    int rc = kv_h5_write_f64(f, "/search/retrieval/baselines", 2, d1, base,
                             "accuracy (fraction), answer NLL (nats/token), perplexity", err);
    if (!rc && r->n_cand)
        rc = kv_h5_write_f64(f, "/search/retrieval/candidates", 2, d2, cand,
                             "see the columns attribute", err);
    if (!rc && r->heads.nll_rise)
        rc = kv_h5_write_f64(f, "/search/retrieval/heads", 2, d3, r->heads.nll_rise,
                             "nats/token: answer NLL rise with the head cut to the window", err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/search/retrieval/baselines", "rows", "full,uniform,guard,plan",
                            err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/search/retrieval/baselines", "columns",
                            "accuracy,answer_nll,search_perplexity", err);
    if (!rc && r->n_cand)
        rc = kv_h5_attr_str(f, "/search/retrieval/candidates", "columns",
                            "weight,forced,whole,accuracy,answer_nll,search_perplexity,kept,others",
                            err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "chosen", r->chosen, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "decision", r->decision, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "tolerance", r->tolerance, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "probes", r->heads.probes, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "n_probes", r->full.n, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "window", r->heads.window, err);
    if (!rc)
        rc = kv_h5_attr_str(f, g, "heads_source", r->heads_measured ? "search" : "profile", err);
    return rc;
}
