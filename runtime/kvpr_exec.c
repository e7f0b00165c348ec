/* kvplan KVPR executor, CPU path. See include/kvplan/kvpr_exec.h.
 * Source: KVPR (Jiang et al.) §3.2-3.3, Eq. 6 (bytes of X[0:l] and K, V [l:s']), Eq. 7
 * (K = X W_K, V = X W_V), Eq. 8-9 (recomputation FLOPs and time), Eq. 10-11 (the overlapped
 * step time the split balances). */
#include "kvplan/kvpr_exec.h"

#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kv_kvpr_exec {
    const kv_model *m;
    int max_ctx;
    float *rope_cos, *rope_sin; /* [max_ctx, d_h/2] */
    float *k, *v;               /* [max_ctx, h_kv] rebuilt K, V of one layer */
    float *x, *xb, *xb2;        /* [dim] */
    float *q, *o;               /* [H*d_h] */
    float *kn, *vn;             /* [h_kv] the new token's K, V */
    float *hb, *hb2;            /* [hidden] */
    double *scores;             /* [max_ctx] */
};

void kv_kvpr_exec_free(kv_kvpr_exec *e) {
    if (!e) return;
    free(e->rope_cos);
    free(e->rope_sin);
    free(e->k);
    free(e->v);
    free(e->x);
    free(e->xb);
    free(e->xb2);
    free(e->q);
    free(e->o);
    free(e->kn);
    free(e->vn);
    free(e->hb);
    free(e->hb2);
    free(e->scores);
    free(e);
}

int kv_kvpr_exec_new(const kv_model *m, int max_ctx, kv_kvpr_exec **out, kv_error *err) {
    if (!out) return kv_fail(err, KV_EINPUT, "kvpr executor: no output pointer");
    *out = NULL;
    if (!m) return kv_fail(err, KV_EINPUT, "kvpr executor: no model");
    if (max_ctx < 1)
        return kv_fail(err, KV_EINPUT, "kvpr executor: max_ctx = %d, need at least 1 position",
                       max_ctx);
    const kv_config *c = &m->cfg;
    kv_kvpr_exec *e = kv_calloc(1, sizeof *e, "kvpr executor", err);
    if (!e) return KV_EINTERNAL;
    e->m = m;
    e->max_ctx = max_ctx;
    size_t T = (size_t)max_ctx, d = (size_t)c->dim, qd = (size_t)c->n_heads * c->head_dim,
           kvd = (size_t)c->n_kv_heads * c->head_dim, hid = (size_t)c->hidden_dim,
           half = (size_t)c->head_dim / 2;
    e->rope_cos = malloc(T * half * sizeof(float));
    e->rope_sin = malloc(T * half * sizeof(float));
    e->k = malloc(T * kvd * sizeof(float));
    e->v = malloc(T * kvd * sizeof(float));
    e->x = malloc(d * sizeof(float));
    e->xb = malloc(d * sizeof(float));
    e->xb2 = malloc(d * sizeof(float));
    e->q = malloc(qd * sizeof(float));
    e->o = malloc(qd * sizeof(float));
    e->kn = malloc(kvd * sizeof(float));
    e->vn = malloc(kvd * sizeof(float));
    e->hb = malloc(hid * sizeof(float));
    e->hb2 = malloc(hid * sizeof(float));
    e->scores = malloc(T * sizeof(double));
    if (!e->rope_cos || !e->rope_sin || !e->k || !e->v || !e->x || !e->xb || !e->xb2 || !e->q ||
        !e->o || !e->kn || !e->vn || !e->hb || !e->hb2 || !e->scores) {
        kv_kvpr_exec_free(e);
        return kv_fail(err, KV_EINTERNAL, "out of memory: kvpr executor for %d positions", max_ctx);
    }
    kv_op_rope_tables(c, max_ctx, e->rope_cos, e->rope_sin);
    *out = e;
    return KV_OK;
}

void kv_kvpr_activations(const kv_model *m, int layer, const float *x_in, int rows, float *out) {
    kv_op_rmsnorm(out, x_in, m->layers[layer].attn_norm, rows, m->cfg.dim, m->cfg.norm_eps);
}

void kv_kvpr_layer_free(kv_kvpr_layer *lc) {
    if (!lc) return;
    free(lc->x);
    free(lc->k);
    free(lc->v);
    memset(lc, 0, sizeof *lc);
}

/* Shape checks shared by rebuild and decode. */
static int check_layer(const kv_kvpr_exec *e, const kv_kvpr_layer *lc, kv_error *err) {
    const kv_config *c = &e->m->cfg;
    if (!lc) return kv_fail(err, KV_EINPUT, "kvpr: no layer cache");
    if (lc->layer < 0 || lc->layer >= c->n_layers)
        return kv_fail(err, KV_EINPUT, "kvpr: layer %d outside 0..%d", lc->layer, c->n_layers - 1);
    if (lc->dim != c->dim || lc->kv_width != c->n_kv_heads * c->head_dim)
        return kv_fail(err, KV_EINPUT,
                       "kvpr layer %d: widths h = %d, h_kv = %d differ from the model's %d, %d",
                       lc->layer, lc->dim, lc->kv_width, c->dim, c->n_kv_heads * c->head_dim);
    if (lc->seq < 0)
        return kv_fail(err, KV_EINPUT, "kvpr layer %d: s' = %d is negative", lc->layer, lc->seq);
    if (lc->split < 0 || lc->split > lc->seq)
        return kv_fail(err, KV_EINPUT, "kvpr layer %d: split l = %d outside 0..s' = %d", lc->layer,
                       lc->split, lc->seq);
    if (lc->split > 0 && !lc->x)
        return kv_fail(err, KV_EINPUT,
                       "kvpr layer %d: split l = %d but no activations X[0:l] to recompute from",
                       lc->layer, lc->split);
    if (lc->split < lc->seq && (!lc->k || !lc->v))
        return kv_fail(err, KV_EINPUT,
                       "kvpr layer %d: %d tokens (l = %d .. s' = %d) to transfer but K or V is "
                       "NULL",
                       lc->layer, lc->seq - lc->split, lc->split, lc->seq);
    if (lc->seq > e->max_ctx)
        return kv_fail(err, KV_EINPUT, "kvpr layer %d: s' = %d exceeds the executor's %d entries",
                       lc->layer, lc->seq, e->max_ctx);
    return KV_OK;
}

int kv_kvpr_layer_offload(const kv_model *m, const kv_cache *c, int layer, const float *x_in,
                          int split, kv_kvpr_layer *out, kv_error *err) {
    if (!out) return kv_fail(err, KV_EINPUT, "kvpr offload: no output layer cache");
    memset(out, 0, sizeof *out);
    if (!m || !c) return kv_fail(err, KV_EINPUT, "kvpr offload: no model or cache");
    const kv_config *cfg = &m->cfg;
    if (layer < 0 || layer >= cfg->n_layers)
        return kv_fail(err, KV_EINPUT, "kvpr offload: layer %d outside 0..%d", layer,
                       cfg->n_layers - 1);
    if (c->n_layers != cfg->n_layers || c->n_kv_heads != cfg->n_kv_heads ||
        c->pool->head_dim != cfg->head_dim)
        return kv_fail(err, KV_EINPUT,
                       "kvpr offload: cache shape (%d layers, %d KV heads, d_h %d) differs from "
                       "the model (%d, %d, %d)",
                       c->n_layers, c->n_kv_heads, c->pool->head_dim, cfg->n_layers,
                       cfg->n_kv_heads, cfg->head_dim);
    int Hkv = cfg->n_kv_heads, hd = cfg->head_dim, kvd = Hkv * hd, dim = cfg->dim;
    const kv_head *heads = c->heads + (size_t)layer * (size_t)Hkv;
    int seq = heads[0].len;
    for (int j = 0; j < Hkv; j++) {
        if (heads[j].len != seq)
            return kv_fail(err, KV_EINPUT,
                           "kvpr offload: layer %d KV head %d holds %d entries, head 0 holds %d",
                           layer, j, heads[j].len, seq);
        for (int i = 0; i < seq; i++)
            if (heads[j].pos[i] != i)
                return kv_fail(err, KV_EINPUT,
                               "kvpr offload: layer %d KV head %d entry %d is position %d: the "
                               "cache evicted entries; KVPR offloads a full cache",
                               layer, j, i, heads[j].pos[i]);
    }
    if (split < 0 || split > seq)
        return kv_fail(err, KV_EINPUT, "kvpr offload: split l = %d outside 0..s' = %d", split, seq);
    if (split > 0 && !x_in)
        return kv_fail(err, KV_EINPUT,
                       "kvpr offload: split l = %d but no activations x_in for tokens 0..%d", split,
                       split - 1);
    out->layer = layer;
    out->seq = seq;
    out->split = split;
    out->dim = dim;
    out->kv_width = kvd;
    int tail = seq - split;
    if (split > 0) {
        out->x = kv_malloc((size_t)split * dim * sizeof(float), "kvpr activations", err);
        if (!out->x) goto oom;
        kv_kvpr_activations(m, layer, x_in, split, out->x);
    }
    if (tail > 0) {
        out->k = kv_malloc((size_t)tail * kvd * sizeof(float), "kvpr offloaded K", err);
        out->v = kv_malloc((size_t)tail * kvd * sizeof(float), "kvpr offloaded V", err);
        if (!out->k || !out->v) goto oom;
        out->cap_tail = tail;
        for (int j = 0; j < Hkv; j++)
            for (int i = split; i < seq; i++) {
                size_t off = (size_t)(i - split) * kvd + (size_t)j * hd;
                memcpy(out->k + off, kv_head_k(c->pool, &heads[j], i), (size_t)hd * sizeof(float));
                memcpy(out->v + off, kv_head_v(c->pool, &heads[j], i), (size_t)hd * sizeof(float));
            }
    }
    return KV_OK;
oom:
    kv_kvpr_layer_free(out);
    return kv_fail_context(err, "kvpr offload of layer %d (s' = %d, l = %d)", layer, seq, split);
}

/* Eq. 7 for rows 0..l-1: K = X W_K^T (+ b_K, RoPE), V = X W_V^T (+ b_V). Typed (non-F32)
 * weights take kv_qmatmul's dot path here (no tile scratch): exact, slower than a GEMM. */
static void recompute(const kv_kvpr_exec *e, const kv_kvpr_layer *lc, float *k, float *v) {
    const kv_config *c = &e->m->cfg;
    const kv_layer_weights *w = &e->m->layers[lc->layer];
    int l = lc->split, dim = c->dim, kvd = lc->kv_width, hd = c->head_dim, half = hd / 2;
    if (l == 0) return;
    kv_op_matmul(k, lc->x, w->wk, l, dim, kvd, NULL);
    kv_op_matmul(v, lc->x, w->wv, l, dim, kvd, NULL);
    kv_op_add_bias(k, w->bk, l, kvd);
    kv_op_add_bias(v, w->bv, l, kvd);
    for (int p = 0; p < l; p++)
        kv_op_rope_row(k + (size_t)p * kvd, c->n_kv_heads, hd, e->rope_cos + (size_t)p * half,
                       e->rope_sin + (size_t)p * half, c->rope_layout);
}

/* Eq. 6 second line: K, V [l:s'] over the link (memcpy stands in for the PCIe copy). */
static void transfer(const kv_kvpr_layer *lc, float *k, float *v) {
    size_t tail = (size_t)(lc->seq - lc->split), kvd = (size_t)lc->kv_width;
    if (tail == 0) return;
    memcpy(k + (size_t)lc->split * kvd, lc->k, tail * kvd * sizeof(float));
    memcpy(v + (size_t)lc->split * kvd, lc->v, tail * kvd * sizeof(float));
}

int kv_kvpr_rebuild(kv_kvpr_exec *e, const kv_kvpr_layer *lc, float *k_out, float *v_out,
                    int overlap, kv_kvpr_timing *t, kv_error *err) {
    if (!e) return kv_fail(err, KV_EINPUT, "kvpr rebuild: no executor");
    int rc = check_layer(e, lc, err);
    if (rc) return rc;
    if (!k_out || !v_out) return kv_fail(err, KV_EINPUT, "kvpr rebuild: no output K or V");
    double t_rec = 0.0, t_xfer = 0.0, t0 = kv_now();
    /* Two "streams": recomputation and transfer write disjoint rows, so running them
     * concurrently or in sequence gives the same bits. */
#pragma omp parallel sections num_threads(2) if (overlap)
    {
#pragma omp section
        {
            double s = kv_now();
            recompute(e, lc, k_out, v_out);
            t_rec = kv_now() - s;
        }
#pragma omp section
        {
            double s = kv_now();
            transfer(lc, k_out, v_out);
            t_xfer = kv_now() - s;
        }
    }
    double t_all = kv_now() - t0;
    if (t) {
        double p = (double)sizeof(float), l = lc->split, h = lc->dim, hkv = lc->kv_width;
        t->t_recompute = t_rec;
        t->t_transfer = t_xfer;
        t->t_total = t_all;
        t->bytes_activations = l * h * p;
        t->bytes_kv = 2.0 * (double)(lc->seq - lc->split) * hkv * p;
        t->flops = 4.0 * l * h * hkv;
    }
    return KV_OK;
}

int kv_kvpr_attend(kv_kvpr_exec *e, const float *q, const float *k, const float *v, int n_ctx,
                   float *o, kv_error *err) {
    if (!e || !q || !k || !v || !o)
        return kv_fail(err, KV_EINPUT, "kvpr attend: NULL executor, q, K, V or output");
    if (n_ctx < 1 || n_ctx > e->max_ctx)
        return kv_fail(err, KV_EINPUT, "kvpr attend: %d entries outside 1..%d", n_ctx, e->max_ctx);
    const kv_config *c = &e->m->cfg;
    int H = c->n_heads, Hkv = c->n_kv_heads, hd = c->head_dim, g = H / Hkv, kvd = Hkv * hd;
    double inv = 1.0 / sqrt((double)hd);
    double *sc = e->scores;
    for (int qh = 0; qh < H; qh++) {
        int j = qh / g;
        const float *qq = q + (size_t)qh * hd;
        double mx = -INFINITY;
        for (int t = 0; t < n_ctx; t++) {
            const float *kk = k + (size_t)t * kvd + (size_t)j * hd;
            double dot = 0.0;
            for (int d = 0; d < hd; d++) dot += (double)qq[d] * kk[d];
            sc[t] = dot * inv;
            if (sc[t] > mx) mx = sc[t];
        }
        double sum = 0.0;
        for (int t = 0; t < n_ctx; t++) sum += sc[t] = exp(sc[t] - mx);
        float *oo = o + (size_t)qh * hd;
        for (int d = 0; d < hd; d++) {
            double a = 0.0;
            for (int t = 0; t < n_ctx; t++) a += sc[t] * v[(size_t)t * kvd + (size_t)j * hd + d];
            oo[d] = (float)(a / sum);
        }
    }
    return KV_OK;
}

/* Make room for one more row in the layer's transferred part. */
static int grow_tail(kv_kvpr_layer *lc, kv_error *err) {
    int need = lc->seq - lc->split + 1;
    if (need <= lc->cap_tail) return KV_OK;
    int cap = lc->cap_tail < 8 ? 16 : 2 * lc->cap_tail;
    size_t bytes = (size_t)cap * (size_t)lc->kv_width * sizeof(float);
    float *k = realloc(lc->k, bytes);
    if (!k) return kv_fail(err, KV_EINTERNAL, "out of memory: kvpr layer %d K", lc->layer);
    lc->k = k;
    float *v = realloc(lc->v, bytes);
    if (!v) return kv_fail(err, KV_EINTERNAL, "out of memory: kvpr layer %d V", lc->layer);
    lc->v = v;
    lc->cap_tail = cap;
    return KV_OK;
}

int kv_kvpr_decode(kv_kvpr_exec *e, kv_kvpr_layer *layers, int token, float *logits, int overlap,
                   kv_kvpr_timing *per_layer, kv_error *err) {
    if (!e || !layers || !logits)
        return kv_fail(err, KV_EINPUT, "kvpr decode: NULL executor, layers or logits");
    const kv_model *m = e->m;
    const kv_config *c = &m->cfg;
    if (token < 0 || token >= c->vocab_size)
        return kv_fail(err, KV_EINPUT, "kvpr decode: token id %d is outside the vocabulary [0, %d)",
                       token, c->vocab_size);
    int L = c->n_layers, dim = c->dim, hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads;
    int qd = H * hd, kvd = Hkv * hd, half = hd / 2;
    int pos = layers[0].seq;
    for (int l = 0; l < L; l++) {
        int rc = check_layer(e, &layers[l], err);
        if (rc) return kv_fail_context(err, "kvpr decode");
        if (layers[l].layer != l)
            return kv_fail(err, KV_EINPUT,
                           "kvpr decode: layers[%d] is layer %d; pass 0..%d in order", l,
                           layers[l].layer, L - 1);
        if (layers[l].seq != pos)
            return kv_fail(err, KV_EINPUT, "kvpr decode: layer %d holds s' = %d, layer 0 holds %d",
                           l, layers[l].seq, pos);
    }
    if (pos + 1 > e->max_ctx)
        return kv_fail(err, KV_EINPUT,
                       "kvpr decode: position %d needs %d entries, beyond the executor's %d", pos,
                       pos + 1, e->max_ctx);
    for (int l = 0; l < L; l++) {
        int rc = grow_tail(&layers[l], err);
        if (rc) return rc;
    }
    kv_weight_row(m->tok_emb, dim, token, e->x);
    const float *cs = e->rope_cos + (size_t)pos * half, *sn = e->rope_sin + (size_t)pos * half;
    for (int l = 0; l < L; l++) {
        const kv_layer_weights *w = &m->layers[l];
        kv_kvpr_layer *lc = &layers[l];
        int rc = kv_kvpr_rebuild(e, lc, e->k, e->v, overlap, per_layer ? &per_layer[l] : NULL, err);
        if (rc) return rc; /* not reached: checked above */
        kv_op_rmsnorm(e->xb, e->x, w->attn_norm, 1, dim, c->norm_eps);
        kv_op_matmul(e->q, e->xb, w->wq, 1, dim, qd, NULL);
        kv_op_matmul(e->kn, e->xb, w->wk, 1, dim, kvd, NULL);
        kv_op_matmul(e->vn, e->xb, w->wv, 1, dim, kvd, NULL);
        kv_op_add_bias(e->q, w->bq, 1, qd);
        kv_op_add_bias(e->kn, w->bk, 1, kvd);
        kv_op_add_bias(e->vn, w->bv, 1, kvd);
        kv_op_rope_row(e->q, H, hd, cs, sn, c->rope_layout);
        kv_op_rope_row(e->kn, Hkv, hd, cs, sn, c->rope_layout);
        memcpy(e->k + (size_t)pos * kvd, e->kn, (size_t)kvd * sizeof(float));
        memcpy(e->v + (size_t)pos * kvd, e->vn, (size_t)kvd * sizeof(float));
        rc = kv_kvpr_attend(e, e->q, e->k, e->v, pos + 1, e->o, err);
        if (rc) return rc;
        kv_op_matmul(e->xb2, e->o, w->wo, 1, qd, dim, NULL);
        for (int i = 0; i < dim; i++) e->x[i] += e->xb2[i];
        kv_op_ffn_residual(w, c, e->x, e->xb, e->hb, e->hb2, 1, NULL);
        /* the new token's K, V go to host memory behind the transferred part */
        size_t row = (size_t)(lc->seq - lc->split) * kvd;
        memcpy(lc->k + row, e->kn, (size_t)kvd * sizeof(float));
        memcpy(lc->v + row, e->vn, (size_t)kvd * sizeof(float));
        lc->seq++;
    }
    kv_op_rmsnorm(e->xb, e->x, m->final_norm, 1, dim, c->norm_eps);
    kv_op_matmul(logits, e->xb, m->classifier, 1, dim, c->vocab_size, NULL);
    return KV_OK;
}
