/* kvplan KVPR executor, CPU path. See runtime/offload/kvpr_exec.h.
 * Source: KVPR (Jiang et al.) §3.2-3.3, Eq. 6 (bytes of X[0:l] and K, V [l:s']), Eq. 7
 * (K = X W_K, V = X W_V), Eq. 8-9 (recomputation FLOPs and time), Eq. 10-11 (the overlapped
 * step time the split balances). */
#include "offload/kvpr_exec.h"

#include "engine/forward.h"
#include "backend/backend_impl.h"
#include "backend/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The decode step runs through the engine's driver (kv_forward_embed / kv_forward_layer /
 * kv_forward_logits) on a one-sequence scratch cache whose layer is refilled with the rebuilt
 * K, V before each layer step: the same layer arithmetic and attention kernel as every other
 * path, only the cache's contents come from the offloaded copy. */
struct kv_kvpr_exec {
    const kv_model *m;
    int max_ctx;
    float *rope_cos, *rope_sin; /* [max_ctx, d_h/2] for the recomputed rows */
    float *k, *v;               /* [max_ctx, h_kv] rebuilt K, V of one layer */
    kv_backend *be;             /* CPU backend, one row */
    kv_pool pool;               /* host blocks for one layer of one sequence */
    kv_cache cache;             /* the scratch sequence */
    int pool_ok, cache_ok;
};

void kv_kvpr_exec_free(kv_kvpr_exec *e) {
    if (!e) return;
    if (e->cache_ok) kv_cache_destroy(&e->cache);
    if (e->pool_ok) kv_backend_pool_destroy(e->be, &e->pool);
    kv_backend_free(e->be);
    free(e->rope_cos);
    free(e->rope_sin);
    free(e->k);
    free(e->v);
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
    size_t T = (size_t)max_ctx, kvd = (size_t)c->n_kv_heads * c->head_dim,
           half = (size_t)c->head_dim / 2;
    e->rope_cos = malloc(T * half * sizeof(float));
    e->rope_sin = malloc(T * half * sizeof(float));
    e->k = malloc(T * kvd * sizeof(float));
    e->v = malloc(T * kvd * sizeof(float));
    if (!e->rope_cos || !e->rope_sin || !e->k || !e->v) {
        kv_kvpr_exec_free(e);
        return kv_fail(err, KV_EINTERNAL, "out of memory: kvpr executor for %d positions", max_ctx);
    }
    kv_op_rope_tables(c, max_ctx, e->rope_cos, e->rope_sin);
    int bs = KV_DEFAULT_BLOCK_SIZE, per_head = (max_ctx + bs - 1) / bs;
    int rc = kv_backend_cpu_new(m, 1, max_ctx, 1, &e->be, err);
    if (!rc)
        rc = kv_backend_pool_init(e->be, &e->pool, c->n_kv_heads * per_head, bs, c->head_dim, err);
    e->pool_ok = !rc && e->be;
    if (!rc)
        rc = kv_cache_init(&e->cache, &e->pool, c->n_layers, c->n_kv_heads, NULL, KV_POLICY_SINK,
                           err);
    e->cache_ok = !rc;
    if (rc) {
        kv_kvpr_exec_free(e);
        return rc;
    }
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
                kv_head_read(c->pool, &heads[j], i, out->k + off, out->v + off);
            }
    }
    return KV_OK;
oom:
    kv_kvpr_layer_free(out);
    return kv_fail_context(err, "kvpr offload of layer %d (s' = %d, l = %d)", layer, seq, split);
}

/* Eq. 7 for rows 0..l-1: K = X W_K^T (+ b_K, RoPE), V = X W_V^T (+ b_V). Typed (non-F32)
 * weights take kv_qmatmul's dot paths here (no scratch: quantised types the integer dots with
 * a buffer of their own, F16 / BF16 the fp32 dots), slower than a GEMM. */
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
    int L = c->n_layers, hd = c->head_dim, Hkv = c->n_kv_heads, kvd = Hkv * hd;
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
    /* the scratch sequence stands at position s' */
    kv_cache *c0 = &e->cache;
    kv_cache_clear(c0);
    c0->n_past = pos;
    int rc = kv_forward_embed(e->be, &c0, 1, &token, 1, err);
    for (int l = 0; l < L && !rc; l++) {
        kv_kvpr_layer *lc = &layers[l];
        rc = kv_kvpr_rebuild(e, lc, e->k, e->v, overlap, per_layer ? &per_layer[l] : NULL, err);
        /* refill the scratch cache's layer l with the rebuilt K, V at positions 0..s'-1 */
        for (int j = 0; j < Hkv && !rc; j++) {
            kv_head *h = kv_cache_head(c0, l, j);
            for (int i = 0; i < pos && !rc; i++)
                rc = kv_head_append(c0, h, e->k + (size_t)i * kvd + (size_t)j * hd,
                                    e->v + (size_t)i * kvd + (size_t)j * hd, i, err);
        }
        if (!rc) rc = kv_forward_layer(e->be, &c0, 1, 1, l, NULL, err);
        /* the new token's K, V go to host memory behind the transferred part */
        size_t row = (size_t)(lc->seq - lc->split) * kvd;
        for (int j = 0; j < Hkv && !rc; j++) {
            const kv_head *h = kv_cache_head(c0, l, j);
            kv_head_read(&e->pool, h, pos, lc->k + row + (size_t)j * hd,
                         lc->v + row + (size_t)j * hd);
        }
        /* this layer's blocks back to the pool before the next layer is refilled */
        for (int j = 0; j < Hkv; j++) {
            kv_head *h = kv_cache_head(c0, l, j);
            while (h->n_blocks > 0) kv_pool_release_block(&e->pool, h->table[--h->n_blocks]);
            h->len = h->wrot = 0;
        }
        if (!rc) lc->seq++;
    }
    if (!rc) rc = kv_forward_logits(e->be, 1, 1, KV_LOGITS_LAST, logits, err);
    return rc;
}
