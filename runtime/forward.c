/* kvplan CPU forward pass for Llama-family models over the paged per-head KV cache.
 * See include/kvplan/forward.h. Architecture: Llama (Touvron et al. 2023) — RMSNorm,
 * RoPE (Su et al. 2021), SwiGLU FFN, grouped-query attention (Ainslie et al. 2023). */
#include "kvplan/forward.h"

#include "ops.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct kv_workspace {
    int max_rows, max_ctx;
    float *x, *xb, *xb2, *xin;  /* [rows, dim] */
    float *q;                   /* [rows, H*d_h] */
    float *k, *v;               /* [rows, H_kv*d_h] */
    float *o;                   /* [rows, H*d_h] attention output before W_o */
    float *hb, *hb2;            /* [rows, hidden] */
    float *rope_cos, *rope_sin; /* [max_ctx, d_h/2] */
    int n_threads;
    float *scores;    /* [n_threads, max_ctx] */
    float *gather;    /* [rows, dim] rows selected for logits */
    kv_op_scratch mm; /* dequantised weight tiles of the typed matmuls (prefill) */
};

void kv_workspace_free(kv_workspace *ws) {
    if (!ws) return;
    free(ws->x);
    free(ws->xb);
    free(ws->xb2);
    free(ws->xin);
    free(ws->q);
    free(ws->k);
    free(ws->v);
    free(ws->o);
    free(ws->hb);
    free(ws->hb2);
    free(ws->rope_cos);
    free(ws->rope_sin);
    free(ws->scores);
    free(ws->gather);
    free(ws->mm.p);
    free(ws);
}

int kv_workspace_new(const kv_model *m, int max_rows, int max_ctx, kv_workspace **out,
                     kv_error *err) {
    *out = NULL;
    const kv_config *c = &m->cfg;
    if (max_rows < 1 || max_ctx < 1)
        return kv_fail(err, KV_EINPUT, "workspace needs at least one row and one position");
    kv_workspace *ws = kv_calloc(1, sizeof *ws, "workspace", err);
    if (!ws) return KV_EINTERNAL;
    ws->max_rows = max_rows;
    ws->max_ctx = max_ctx;
    ws->n_threads = omp_get_max_threads();
    size_t R = (size_t)max_rows, d = (size_t)c->dim, qd = (size_t)c->n_heads * c->head_dim,
           kvd = (size_t)c->n_kv_heads * c->head_dim, hid = (size_t)c->hidden_dim,
           half = (size_t)c->head_dim / 2;
    ws->x = malloc(R * d * sizeof(float));
    ws->xb = malloc(R * d * sizeof(float));
    ws->xb2 = malloc(R * d * sizeof(float));
    ws->xin = malloc(R * d * sizeof(float));
    ws->gather = malloc(R * d * sizeof(float));
    ws->q = malloc(R * qd * sizeof(float));
    ws->o = malloc(R * qd * sizeof(float));
    ws->k = malloc(R * kvd * sizeof(float));
    ws->v = malloc(R * kvd * sizeof(float));
    ws->hb = malloc(R * hid * sizeof(float));
    ws->hb2 = malloc(R * hid * sizeof(float));
    ws->rope_cos = malloc((size_t)max_ctx * half * sizeof(float));
    ws->rope_sin = malloc((size_t)max_ctx * half * sizeof(float));
    ws->scores = malloc((size_t)ws->n_threads * (size_t)max_ctx * sizeof(float));
    ws->mm.n = kv_model_matmul_scratch(m, max_rows);
    ws->mm.p = ws->mm.n ? malloc(ws->mm.n * sizeof(float)) : NULL;
    if (!ws->x || !ws->xb || !ws->xb2 || !ws->xin || !ws->gather || !ws->q || !ws->o || !ws->k ||
        !ws->v || !ws->hb || !ws->hb2 || !ws->rope_cos || !ws->rope_sin || !ws->scores ||
        (ws->mm.n && !ws->mm.p)) {
        kv_workspace_free(ws);
        return kv_fail(err, KV_EINTERNAL, "out of memory (forward workspace, %d rows)", max_rows);
    }
    kv_op_rope_tables(c, max_ctx, ws->rope_cos, ws->rope_sin);
    *out = ws;
    return KV_OK;
}

#define KV_L2_EXCLUDED_WINDOW 10 /* KV-Compress KVC-full: v = 10 (kvcache.c) */
/* Attention multiply-adds (all heads of a layer) below which the layer runs on one thread.
 * Single-sequence decode stays serial up to ~4k context (1 x 4096 x 2 x 12 x 64 = 6.3M for a
 * 12-head, d_h 64 model): measured on 2 loaded cores, a parallel region per layer made
 * decode at context 2048 2-3x slower (3.5 vs 9 tokens/s) than serial attention, which is
 * ~15% of that token's time. Prefill blocks and batched decode exceed it and fork. */
#define KV_ATTN_PARALLEL_MACS 8388608.0

/* Attention of one (sequence, KV head): n new queries per query head of the group over the
 * head's first `base + i + 1` entries for query i (retained + causal new). */
static inline __attribute__((always_inline)) void attend_head_hd(const kv_model *m,
                                                                 kv_workspace *ws, kv_cache *c,
                                                                 int j, int layer, int n, int row0,
                                                                 float *scores, const int hd) {
    const kv_config *cfg = &m->cfg;
    int g = cfg->n_heads / cfg->n_kv_heads, qd = cfg->n_heads * hd;
    kv_head *h = kv_cache_head(c, layer, j);
    const kv_pool *p = c->pool;
    int base = h->len - n;
    float inv = 1.0f / sqrtf((float)hd);
    int bs = p->block_size;
    for (int i = 0; i < n; i++) {
        int n_ent = base + i + 1;
        int qpos = h->pos[base + i];
        for (int gh = 0; gh < g; gh++) {
            int qh = j * g + gh;
            const float *q = ws->q + (size_t)(row0 + i) * qd + (size_t)qh * hd;
            float *o = ws->o + (size_t)(row0 + i) * qd + (size_t)qh * hd;
            float mx = -INFINITY;
            float qv[hd];
            for (int d = 0; d < hd; d++) qv[d] = q[d] * inv;
            for (int e0 = 0; e0 < n_ent; e0 += bs) {
                const float *kb = kv_head_k(p, h, e0);
                int cnt = n_ent - e0 < bs ? n_ent - e0 : bs;
                for (int e = 0; e < cnt; e++) {
                    const float *kk = kb + (size_t)e * hd;
                    /* 8 partial sums: a fixed association order, vectorisable. Written as
                     * 8-lane chunks: `part[d & 7]` in one loop compiled to a scalar
                     * store-to-load chain through the stack (perf: ~60% of prefill attention
                     * time); this form keeps the same order of additions, so the same bits. */
                    float part[8] = {0};
                    int d = 0;
                    for (; d + 8 <= hd; d += 8)
                        for (int u = 0; u < 8; u++) part[u] += qv[d + u] * kk[d + u];
                    for (; d < hd; d++) part[d & 7] += qv[d] * kk[d];
                    float dot = ((part[0] + part[4]) + (part[1] + part[5])) +
                                ((part[2] + part[6]) + (part[3] + part[7]));
                    scores[e0 + e] = dot;
                    mx = dot > mx ? dot : mx;
                }
            }
            float sum = 0.0f;
            for (int e = 0; e < n_ent; e++) {
                scores[e] = expf(scores[e] - mx);
                sum += scores[e];
            }
            float rs = 1.0f / sum;
            float acc[hd];
            for (int d = 0; d < hd; d++) acc[d] = 0.0f;
            for (int e0 = 0; e0 < n_ent; e0 += bs) {
                const float *vb = kv_head_v(p, h, e0);
                int cnt = n_ent - e0 < bs ? n_ent - e0 : bs;
                for (int e = 0; e < cnt; e++) {
                    float w = scores[e0 + e] * rs;
                    scores[e0 + e] = w;
                    const float *vv = vb + (size_t)e * hd;
                    for (int d = 0; d < hd; d++) acc[d] += w * vv[d];
                }
            }
            for (int d = 0; d < hd; d++) o[d] = acc[d];
            if (c->track_stats) {
                for (int e = 0; e < n_ent; e++) {
                    float w = scores[e];
                    h->acc[e] += w;
                    if (qpos - h->pos[e] >= KV_L2_EXCLUDED_WINDOW) h->acc2[e] += w * w;
                }
            }
        }
    }
}

/* One specialisation per common head size so the d_h loops unroll and vectorise. */
static void attend_head(const kv_model *m, kv_workspace *ws, kv_cache *c, int j, int layer, int n,
                        int row0, float *scores) {
    switch (m->cfg.head_dim) {
    case 8:
        attend_head_hd(m, ws, c, j, layer, n, row0, scores, 8);
        break;
    case 16:
        attend_head_hd(m, ws, c, j, layer, n, row0, scores, 16);
        break;
    case 32:
        attend_head_hd(m, ws, c, j, layer, n, row0, scores, 32);
        break;
    case 64:
        attend_head_hd(m, ws, c, j, layer, n, row0, scores, 64);
        break;
    case 128:
        attend_head_hd(m, ws, c, j, layer, n, row0, scores, 128);
        break;
    default:
        attend_head_hd(m, ws, c, j, layer, n, row0, scores, m->cfg.head_dim);
        break;
    }
}

int kv_forward(const kv_model *m, kv_workspace *ws, kv_cache *const *seqs, int n_seqs,
               const int *tokens, int n, kv_logits_mode mode, float *logits, const kv_hooks *hooks,
               kv_error *err) {
    const kv_config *cfg = &m->cfg;
    int rows = n_seqs * n;
    if (n < 1 || n_seqs < 1) return kv_fail(err, KV_EINPUT, "forward: nothing to process");
    if (rows > ws->max_rows)
        return kv_fail(err, KV_EINTERNAL, "forward: %d rows exceed the workspace's %d", rows,
                       ws->max_rows);
    int dim = cfg->dim, hd = cfg->head_dim, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    int qd = H * hd, kvd = Hkv * hd, half = hd / 2;
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s]->n_past + n > ws->max_ctx)
            return kv_fail(err, KV_EINPUT,
                           "sequence %d would reach position %d, beyond the context of %d", s,
                           seqs[s]->n_past + n, ws->max_ctx);
        for (int i = 0; i < n; i++) {
            int t = tokens[s * n + i];
            if (t < 0 || t >= cfg->vocab_size)
                return kv_fail(err, KV_EINPUT, "token id %d is outside the vocabulary [0, %d)", t,
                               cfg->vocab_size);
        }
    }
    for (int r = 0; r < rows; r++)
        kv_weight_row(m->tok_emb, dim, tokens[r], ws->x + (size_t)r * dim);

    for (int l = 0; l < cfg->n_layers; l++) {
        const kv_layer_weights *w = &m->layers[l];
        kv_op_rmsnorm(ws->xb, ws->x, w->attn_norm, rows, dim, cfg->norm_eps);
        kv_op_matmul(ws->q, ws->xb, w->wq, rows, dim, qd, &ws->mm);
        kv_op_matmul(ws->k, ws->xb, w->wk, rows, dim, kvd, &ws->mm);
        kv_op_matmul(ws->v, ws->xb, w->wv, rows, dim, kvd, &ws->mm);
        kv_op_add_bias(ws->q, w->bq, rows, qd);
        kv_op_add_bias(ws->k, w->bk, rows, kvd);
        kv_op_add_bias(ws->v, w->bv, rows, kvd);
        for (int s = 0; s < n_seqs; s++)
            for (int i = 0; i < n; i++) {
                int r = s * n + i, pos = seqs[s]->n_past + i;
                const float *cs = ws->rope_cos + (size_t)pos * half;
                const float *sn = ws->rope_sin + (size_t)pos * half;
                kv_op_rope_row(ws->q + (size_t)r * qd, H, hd, cs, sn, cfg->rope_layout);
                kv_op_rope_row(ws->k + (size_t)r * kvd, Hkv, hd, cs, sn, cfg->rope_layout);
            }
        /* Batch-Max Alg. 1: make room, then append the block's K/V (serial: the pool is shared) */
        for (int s = 0; s < n_seqs; s++) {
            kv_cache *c = seqs[s];
            for (int j = 0; j < Hkv; j++) {
                kv_head *h = kv_cache_head(c, l, j);
                int rc = kv_head_make_room(c, h, n, c->n_past + n - 1, err);
                if (rc) return kv_fail_context(err, "layer %d KV head %d", l, j);
                for (int i = 0; i < n; i++) {
                    int r = s * n + i;
                    rc = kv_head_append(c, h, ws->k + (size_t)r * kvd + (size_t)j * hd,
                                        ws->v + (size_t)r * kvd + (size_t)j * hd, c->n_past + i,
                                        err);
                    if (rc) return rc;
                }
            }
        }
        /* Fork threads only when the attention work amortises the fork/join: a parallel
         * region per layer for a few thousand multiply-adds costs more than it saves, and on
         * a loaded machine spinning OpenMP threads starve the BLAS threads (measured: 94 vs
         * 7450 tokens/s for stories260K decode with 2 threads at load 10). Each task writes
         * only its own rows and head, so the result does not depend on the thread count. */
        int tasks = n_seqs * Hkv;
        double macs = 0.0;
        for (int s = 0; s < n_seqs; s++)
            macs += (double)n * (double)kv_cache_head(seqs[s], l, 0)->len;
        macs *= 2.0 * (double)H * (double)hd;
        int par = tasks > 1 && ws->n_threads > 1 && macs >= KV_ATTN_PARALLEL_MACS;
#pragma omp parallel for schedule(static) if (par)
        for (int task = 0; task < tasks; task++) {
            int s = task / Hkv, j = task % Hkv;
            float *scores = ws->scores + (size_t)omp_get_thread_num() * (size_t)ws->max_ctx;
            attend_head(m, ws, seqs[s], j, l, n, s * n, scores);
        }
        kv_op_matmul(ws->xb2, ws->o, w->wo, rows, qd, dim, &ws->mm);
        if (hooks && hooks->after_attn) {
            memcpy(ws->xin, ws->x, (size_t)rows * dim * sizeof(float));
            hooks->after_attn(hooks->user, l, rows, ws->xin, ws->o, ws->v, ws->xb2);
        }
        for (size_t i = 0; i < (size_t)rows * dim; i++) ws->x[i] += ws->xb2[i];
        kv_op_ffn_residual(w, cfg, ws->x, ws->xb, ws->hb, ws->hb2, rows, &ws->mm);
        if (hooks && hooks->after_block) hooks->after_block(hooks->user, l, rows, ws->x);
    }
    for (int s = 0; s < n_seqs; s++) seqs[s]->n_past += n;
    if (mode == KV_LOGITS_NONE) return KV_OK;
    int out_rows = mode == KV_LOGITS_ALL ? rows : n_seqs;
    if (mode == KV_LOGITS_ALL) {
        kv_op_rmsnorm(ws->gather, ws->x, m->final_norm, rows, dim, cfg->norm_eps);
    } else {
        for (int s = 0; s < n_seqs; s++)
            kv_op_rmsnorm(ws->gather + (size_t)s * dim, ws->x + (size_t)(s * n + n - 1) * dim,
                          m->final_norm, 1, dim, cfg->norm_eps);
    }
    kv_op_matmul(logits, ws->gather, m->classifier, out_rows, dim, cfg->vocab_size, &ws->mm);
    return KV_OK;
}
