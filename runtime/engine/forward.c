/* kvplan forward driver: see runtime/engine/forward.h. Backend-neutral: the arithmetic is the
 * backend's (runtime/backend/backend_cpu.c, cuda/), the block tables, eviction schedule and
 * policies are the cache's (runtime/cache/kvcache.c). */
#include "engine/forward.h"
#include "backend/backend_impl.h"

#include <string.h>

int kv_workspace_new(const kv_model *m, int max_rows, int max_ctx, kv_workspace **out,
                     kv_error *err) {
    return kv_backend_cpu_new(m, max_rows, max_ctx, 1, out, err);
}

void kv_workspace_free(kv_workspace *ws) {
    kv_backend_free(ws);
}

int kv_forward_embed(kv_backend *b, kv_cache *const *seqs, int n_seqs, const int *tokens, int n,
                     kv_error *err) {
    const kv_config *cfg = &b->model->cfg;
    int rows = n_seqs * n;
    if (n < 1 || n_seqs < 1) return kv_fail(err, KV_EINPUT, "forward: nothing to process");
    if (rows > b->max_rows)
        return kv_fail(err, KV_EINTERNAL, "forward: %d rows exceed the backend's %d", rows,
                       b->max_rows);
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s]->failed)
            return kv_fail(err, KV_EINPUT,
                           "sequence %d: an earlier step failed after evicting or accumulating "
                           "statistics, so its cache is incomplete; clear it and prefill again",
                           s);
        if (seqs[s]->n_past + n > b->max_ctx)
            return kv_fail(err, KV_EINPUT,
                           "sequence %d would reach position %d, beyond the context of %d", s,
                           seqs[s]->n_past + n, b->max_ctx);
        for (int i = 0; i < n; i++) {
            int t = tokens[s * n + i];
            if (t < 0 || t >= cfg->vocab_size)
                return kv_fail(err, KV_EINPUT, "token id %d is outside the vocabulary [0, %d)", t,
                               cfg->vocab_size);
            b->row_pos[s * n + i] = seqs[s]->n_past + i;
        }
    }
    return b->ops->embed(b, tokens, rows, err);
}

/* Ask for the cache lines the head's next append reads and writes (pos at len; acc / acc2 when
 * tracked; its block id in the table only for a window ring: a plain head's append takes it
 * from kv_head.last_block). At batch 32 with 32 KV heads a layer appends to 1024
 * heads whose metadata lie in different pages, and the misses (mostly the page walks of those
 * pages: more of them than the TLB holds) were most of a decode step's host time. The append
 * loop asks for the head a few places ahead, so that the translation is still in the TLB when
 * the append writes. A hint only (a prefetch never faults). */
static void prefetch_append(const kv_head *h, int bs) {
#if defined(__GNUC__) || defined(__clang__)
    if (h->wrot > 0 && h->len < h->n_blocks * bs) /* a ring's block id (kv_head_slot) */
        __builtin_prefetch(h->table + h->len / bs, 0);
    if (h->len < h->cap) {
        __builtin_prefetch(h->pos + h->len, 1);
        if (h->track_stats) { /* an untracked head's append writes pos only */
            __builtin_prefetch(h->acc + h->len, 1);
            __builtin_prefetch(h->acc2 + h->len, 1);
        }
    }
#else
    (void)h;
    (void)bs;
#endif
}

static int append_tasks(kv_backend *b, kv_cache *const *seqs, int n_seqs, int n, int l, int *nw,
                        kv_error *err);

int kv_forward_layer(kv_backend *b, kv_cache *const *seqs, int n_seqs, int n, int l,
                     const kv_hooks *hooks, kv_error *err) {
    const kv_backend_ops *ops = b->ops;
    int Hkv = b->model->cfg.n_kv_heads, rows = n_seqs * n;
    kv_pool *pool = seqs[0]->pool;
    for (int s = 1; s < n_seqs; s++)
        if (seqs[s]->pool != pool)
            return kv_fail(err, KV_EINTERNAL, "forward: the sequences of one step share one pool");
    int rc = ops->qkv(b, l, rows, b->row_pos, err);
    if (rc) return rc;
    /* Batch-Max Alg. 1: every head's eviction schedule (plain C), then one gather */
    b->moves.n = b->moves.n_ev = b->moves.n_tab = 0;
    for (int s = 0; s < n_seqs; s++) {
        kv_cache *c = seqs[s];
        for (int j = 0; j < Hkv; j++) {
            kv_head *h = kv_cache_head(c, l, j);
            int len = h->len;
            rc = kv_head_schedule_room(c, h, n, c->n_past + n - 1, &b->moves, err);
            c->step_lossy |= h->len != len; /* evicted entries cannot be restored */
            if (rc) return kv_fail_context(err, "layer %d KV head %d", l, j);
        }
    }
    if (b->moves.n_ev > 0) { /* the evictions left to the device, before any row moves */
        if (!ops->evict)
            return kv_fail(err, KV_EINTERNAL, "backend %s recorded evictions it cannot run",
                           ops->name);
        rc = ops->evict(b, pool, b->moves.ev, b->moves.n_ev, b->moves.tab, err);
        if (rc) return rc;
    }
    if (b->moves.n > 0 && (rc = ops->gather(b, pool, b->moves.v, b->moves.n, err))) return rc;
    int nw = 0;
    if ((rc = append_tasks(b, seqs, n_seqs, n, l, &nw, err))) return rc;
    if ((rc = ops->cache_write(b, pool, b->writes, nw, err))) return rc;
    if ((rc = ops->attention(b, pool, b->tasks, n_seqs * Hkv, err))) return rc;
    if ((rc = ops->out_residual(b, l, rows, hooks, err))) return rc;
    return ops->ffn(b, l, rows, hooks, err);
}

/* Layer l of a step: the n new tokens' slots appended to every (sequence, KV head) with their
 * writes in b->writes (*nw of them), and one attention task per (sequence, KV head) in b->tasks.
 * The errors of kv_head_append_slot. */
static int append_tasks(kv_backend *b, kv_cache *const *seqs, int n_seqs, int n, int l, int *nw,
                        kv_error *err) {
    int Hkv = b->model->cfg.n_kv_heads, bs = seqs[0]->pool->block_size, ahead = 4;
    for (int k = 0; k < ahead && k < n_seqs * Hkv; k++)
        prefetch_append(kv_cache_head(seqs[k / Hkv], l, k % Hkv), bs);
    for (int s = 0; s < n_seqs; s++) {
        kv_cache *c = seqs[s];
        for (int j = 0; j < Hkv; j++) {
            int k = s * Hkv + j + ahead;
            if (k < n_seqs * Hkv) prefetch_append(kv_cache_head(seqs[k / Hkv], l, k % Hkv), bs);
            kv_head *h = kv_cache_head(c, l, j);
            for (int i = 0; i < n; i++) {
                int slot = 0;
                int rc = kv_head_append_slot(c, h, c->n_past + i, &slot, err);
                if (rc) return rc;
                b->writes[(*nw)++] = (kv_slot_write){s * n + i, j, slot};
            }
            b->tasks[s * Hkv + j] = (kv_attn_task){.row0 = s * n,
                                                   .n = n,
                                                   .kv_head = j,
                                                   .len = h->len,
                                                   .table = h->table,
                                                   .pos = h->pos,
                                                   .acc = h->track_stats ? h->acc : NULL,
                                                   .acc2 = h->track_stats ? h->acc2 : NULL,
                                                   .mirror = &h->mirror,
                                                   .wbase = h->wbase,
                                                   .wrot = h->wrot,
                                                   .n_blocks = h->n_blocks};
            c->step_lossy |= h->track_stats; /* attention adds to the old entries' acc */
            b->attended += (unsigned long long)n * (unsigned long long)h->len -
                           (unsigned long long)n * (unsigned long long)(n - 1) / 2;
        }
    }
    return KV_OK;
}

int kv_forward_logits(kv_backend *b, int n_seqs, int n, kv_logits_mode mode, float *logits,
                      kv_error *err) {
    if (mode == KV_LOGITS_NONE) return KV_OK;
    int n_sel = mode == KV_LOGITS_ALL ? n_seqs * n : n_seqs;
    for (int i = 0; i < n_sel; i++) b->row_pos[i] = mode == KV_LOGITS_ALL ? i : i * n + n - 1;
    return b->ops->logits(b, b->row_pos, n_sel, logits, err);
}

/* A step that failed after layer `last` began: each sequence whose step only appended gets its
 * new entries dropped (heads in the reverse order of their appends, so the pool's free list is
 * as before); one that evicted or accumulated statistics is marked failed. */
static void forward_undo(kv_cache *const *seqs, int n_seqs, int last) {
    for (int l = last; l >= 0; l--)
        for (int s = n_seqs - 1; s >= 0; s--) {
            kv_cache *c = seqs[s];
            if (c->step_lossy) continue;
            for (int j = c->n_kv_heads - 1; j >= 0; j--)
                kv_head_drop_from(c, kv_cache_head(c, l, j), c->n_past);
        }
    for (int s = 0; s < n_seqs; s++) seqs[s]->failed |= seqs[s]->step_lossy;
}

int kv_forward(const kv_model *m, kv_backend *b, kv_cache *const *seqs, int n_seqs,
               const int *tokens, int n, kv_logits_mode mode, float *logits, const kv_hooks *hooks,
               kv_error *err) {
    if (b->model != m)
        return kv_fail(err, KV_EINTERNAL, "forward: the backend serves another model");
    int rc = kv_forward_embed(b, seqs, n_seqs, tokens, n, err);
    if (rc) return rc;
    for (int s = 0; s < n_seqs; s++) seqs[s]->step_lossy = 0;
    int l = 0;
    for (; !rc && l < m->cfg.n_layers; l++)
        rc = kv_forward_layer(b, seqs, n_seqs, n, l, hooks, err);
    /* the logits before n_past moves: a step whose logits fail is undone like any other */
    if (!rc) rc = kv_forward_logits(b, n_seqs, n, mode, logits, err);
    if (!rc && b->ops->end_step) rc = b->ops->end_step(b, 1, err);
    if (rc) {
        if (b->ops->end_step) b->ops->end_step(b, 0, NULL);
        forward_undo(seqs, n_seqs, l - 1);
        return rc;
    }
    for (int s = 0; s < n_seqs; s++) seqs[s]->n_past += n;
    return KV_OK;
}
