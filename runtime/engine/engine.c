/* kvplan engine: see include/kvplan/engine.h. */
#include "kvplan/engine.h"
#include "engine/forward.h"
#include "backend/backend_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_engine {
    const kv_model *m;
    kv_plan plan; /* owned copy */
    kv_backend *be;
    kv_pool pool;
    int pool_ok;
    int max_seqs, max_ctx, max_step;
    kv_cache *seqs;  /* [max_seqs] */
    int *open;       /* [max_seqs] 1 when the handle is in use */
    kv_cache **ptrs; /* [max_seqs] scratch for batched steps */
    int *tok;        /* [max_seqs * max_step] scratch tokens */
    float *logits;   /* [max_step * vocab] scratch for chunk scoring */
    float *out;      /* kv_engine_logits_buffer's when the backend has none (owned) */
    size_t out_n;
};

const kv_plan *kv_engine_plan(const kv_engine *e) {
    return &e->plan;
}
kv_backend *kv_engine_backend(kv_engine *e) {
    return e->be;
}
float *kv_engine_logits_buffer(kv_engine *e, int rows, kv_error *err) {
    if (rows < 1) {
        kv_fail(err, KV_EINPUT, "logits buffer: %d rows", rows);
        return NULL;
    }
    size_t n = (size_t)rows * (size_t)e->m->cfg.vocab_size;
    if (e->be->ops->out_buffer) return e->be->ops->out_buffer(e->be, n, err);
    if (n > e->out_n) {
        float *p = realloc(e->out, n * sizeof *p);
        if (!p) {
            kv_fail(err, KV_EINTERNAL, "out of memory (logits buffer of %zu floats)", n);
            return NULL;
        }
        e->out = p;
        e->out_n = n;
    }
    return e->out;
}

int kv_engine_max_seqs(const kv_engine *e) {
    return e->max_seqs;
}
kv_device kv_engine_device(const kv_engine *e) {
    return e->be->device;
}
kv_cache *kv_engine_cache(kv_engine *e, int seq) {
    return seq >= 0 && seq < e->max_seqs && e->open[seq] ? &e->seqs[seq] : NULL;
}

void kv_engine_free(kv_engine *e) {
    if (!e) return;
    for (int s = 0; e->seqs && s < e->max_seqs; s++)
        if (e->open[s]) kv_cache_destroy(&e->seqs[s]);
    if (e->pool_ok) kv_backend_pool_destroy(e->be, &e->pool);
    kv_backend_free(e->be);
    kv_plan_free(&e->plan);
    free(e->seqs);
    free(e->open);
    free(e->ptrs);
    free(e->tok);
    free(e->logits);
    free(e->out);
    free(e);
}

/* Rows of one forward step on a CUDA device when the caller sets no max_step: a longer prompt
 * is prefilled in chunks of this many tokens (chunked prefill), so the backend's activations
 * (rows x (dim + q/k/v + FFN widths) floats on the device) and the engine's logits scratch (rows
 * x vocab floats) are sized for 512 rows, not for the whole context. 512 rows keep the 7B-size
 * GEMMs compute-bound (arithmetic intensity far above the device's ridge point). */
#define KV_ENGINE_CUDA_STEP 512

/* The default max_step: the context on the CPU, at most KV_ENGINE_CUDA_STEP on CUDA. */
static int default_step(kv_device dev, int max_ctx) {
    kv_device d = KV_DEVICE_CPU;
    kv_error ignored = {0}; /* an unavailable device fails later, in the backend's creation */
    if (kv_device_resolve(dev, &d, &ignored) == KV_OK && d == KV_DEVICE_CUDA &&
        max_ctx > KV_ENGINE_CUDA_STEP)
        return KV_ENGINE_CUDA_STEP;
    return max_ctx;
}

int kv_engine_new(const kv_model *m, const kv_plan *plan, const kv_engine_opts *opts,
                  kv_engine **out, kv_error *err) {
    *out = NULL;
    kv_engine_opts o = {0};
    if (opts) o = *opts;
    int rc = kv_plan_validate(plan, plan->source[0] ? plan->source : "plan", err);
    if (!rc) rc = kv_plan_check_model(plan, m, err);
    if (rc) return rc;
    kv_engine *e = kv_calloc(1, sizeof *e, "engine", err);
    if (!e) return KV_EINTERNAL;
    e->m = m;
    e->max_seqs = o.max_seqs > 0 ? o.max_seqs : 1;
    e->max_ctx = o.max_ctx > 0 ? o.max_ctx : plan->context;
    e->max_step = o.max_step > 0 ? o.max_step : default_step(o.device, e->max_ctx);
    if (e->max_step > e->max_ctx) e->max_step = e->max_ctx;
    rc = kv_plan_copy(&e->plan, plan, err);
    if (rc) {
        free(e);
        return rc;
    }
    long rows = (long)e->max_step > (long)e->max_seqs ? e->max_step : e->max_seqs;
    /* batched chunk scoring runs max_seqs sequences in steps of p */
    if ((long)e->max_seqs * plan->evict_block > rows) rows = (long)e->max_seqs * plan->evict_block;
    if (rows > (1L << 24)) rows = 1L << 24;
    /* every backend stores the plan's K/V types (f32, f16, q8, q4) */
    rc = kv_backend_new_threads(m, o.device, (int)rows, e->max_ctx, o.n_threads, &e->be, err);
    /* blocks per type: what the heads of that type need (a caller's seq_blocks, for sequences
     * given larger budgets, is reserved in every type the plan uses) */
    long per_type[KV_CACHE_TYPES], total = 0;
    kv_cache_blocks_needed_typed(plan->n_layers, plan->n_kv_heads, plan->full ? NULL : plan->budget,
                                 plan->kv_type, e->max_ctx, plan->evict_block, plan->block_size,
                                 per_type);
    /* types a caller asked for besides the plan's get what the plan's heads need in all */
    long plan_need = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++) plan_need += per_type[t];
    int counts[KV_CACHE_TYPES] = {0};
    for (int t = 0; t < KV_CACHE_TYPES; t++) {
        if (per_type[t] == 0 && (o.type_mask & (1 << t))) per_type[t] = plan_need;
        long n = o.seq_blocks > 0 && per_type[t] > 0 ? o.seq_blocks : per_type[t];
        if (n > 0x7fffffffL / e->max_seqs) n = 0x7fffffffL / e->max_seqs;
        total += n * e->max_seqs;
        counts[t] = (int)(n * e->max_seqs);
    }
    if (!rc && total >= 0x7fffffffL)
        rc = kv_fail(err, KV_EINPUT, "engine: the blocks for %d sequences exceed the pool's range",
                     e->max_seqs);
    if (!rc)
        rc = kv_backend_pool_init_typed(e->be, &e->pool, counts, plan->block_size, m->cfg.head_dim,
                                        err);
    e->pool_ok = !rc;
    if (!rc) {
        e->seqs = kv_calloc((size_t)e->max_seqs, sizeof *e->seqs, "engine sequences", err);
        e->open = kv_calloc((size_t)e->max_seqs, sizeof *e->open, "engine sequences", err);
        e->ptrs = kv_calloc((size_t)e->max_seqs, sizeof *e->ptrs, "engine sequences", err);
        e->tok = kv_calloc((size_t)rows, sizeof *e->tok, "engine tokens", err);
        e->logits = kv_malloc((size_t)rows * (size_t)m->cfg.vocab_size * sizeof(float),
                              "engine logits", err);
        if (!e->seqs || !e->open || !e->ptrs || !e->tok || !e->logits) rc = KV_EINTERNAL;
    }
    if (rc) {
        kv_engine_free(e);
        return rc;
    }
    *out = e;
    return KV_OK;
}

int kv_engine_seq_open(kv_engine *e, const int *budget, const kv_policy *policy, int *seq,
                       kv_error *err) {
    return kv_engine_seq_open_typed(e, budget, policy, NULL, seq, err);
}

int kv_engine_seq_open_typed(kv_engine *e, const int *budget, const kv_policy *policy,
                             const kv_cache_type *types, int *seq, kv_error *err) {
    int s = 0;
    while (s < e->max_seqs && e->open[s]) s++;
    if (s == e->max_seqs)
        return kv_fail(err, KV_EINTERNAL, "engine: all %d sequences are in use", e->max_seqs);
    const kv_plan *p = &e->plan;
    kv_cache *c = &e->seqs[s];
    int rc = kv_cache_init(c, &e->pool, p->n_layers, p->n_kv_heads, NULL, p->policy, err);
    if (!rc)
        rc = kv_cache_set_budgets(c, budget ? budget : p->budget, policy ? policy : p->head_policy,
                                  e->max_ctx, err);
    if (!rc) rc = kv_cache_set_types(c, types ? types : p->kv_type, err);
    if (rc) {
        kv_cache_destroy(c);
        return rc;
    }
    e->open[s] = 1;
    *seq = s;
    return KV_OK;
}

void kv_engine_seq_close(kv_engine *e, int seq) {
    if (seq < 0 || seq >= e->max_seqs || !e->open[seq]) return;
    kv_cache_destroy(&e->seqs[seq]);
    e->open[seq] = 0;
}

int kv_engine_seq_fork(kv_engine *e, int src, int *seq, kv_error *err) {
    kv_cache *a = kv_engine_cache(e, src);
    if (!a) return kv_fail(err, KV_EINTERNAL, "engine: fork of a closed sequence %d", src);
    int nh = a->n_layers * a->n_kv_heads;
    int *bud = kv_malloc((size_t)nh * sizeof *bud, "fork budgets", err);
    kv_policy *pol = kv_malloc((size_t)nh * sizeof *pol, "fork policies", err);
    kv_cache_type *ty = kv_malloc((size_t)nh * sizeof *ty, "fork types", err);
    int rc = bud && pol && ty ? KV_OK : KV_EINTERNAL;
    for (int i = 0; !rc && i < nh; i++) {
        bud[i] = a->heads[i].budget;
        pol[i] = a->heads[i].policy;
        ty[i] = a->heads[i].type;
    }
    int d = -1;
    if (!rc) rc = kv_engine_seq_open_typed(e, bud, pol, ty, &d, err);
    free(bud);
    free(pol);
    free(ty);
    if (rc) return rc;
    kv_cache *b = &e->seqs[d];
    a = &e->seqs[src];
    kv_moves mv = {0};
    for (int i = 0; !rc && i < nh; i++) {
        kv_head *hs = &a->heads[i], *hd = &b->heads[i];
        for (int k = 0; !rc && k < hs->len; k++) {
            int slot = 0;
            rc = kv_head_append_slot(b, hd, hs->pos[k], &slot, err);
            if (rc) break;
            hd->acc[k] = hs->acc[k];
            hd->acc2[k] = hs->acc2[k];
            kv_move mvk = {kv_head_slot(&e->pool, hs, k), slot};
            if (mv.n == mv.cap) {
                int nc = mv.cap ? 2 * mv.cap : 1024;
                kv_move *nv = realloc(mv.v, (size_t)nc * sizeof *nv);
                if (!nv) {
                    rc = kv_fail(err, KV_EINTERNAL, "out of memory (fork)");
                    break;
                }
                mv.v = nv;
                mv.cap = nc;
            }
            mv.v[mv.n++] = mvk;
        }
    }
    if (!rc && mv.n) rc = e->be->ops->gather(e->be, &e->pool, mv.v, mv.n, err);
    kv_moves_free(&mv);
    if (rc) {
        kv_engine_seq_close(e, d);
        return rc;
    }
    b->n_past = a->n_past;
    *seq = d;
    return KV_OK;
}

/* 1 when no head of `c` can be over budget while it takes n more tokens. */
static int covers(const kv_cache *c, int n) {
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].budget < c->n_past + n) return 0;
    return 1;
}

int kv_engine_prefill(kv_engine *e, int seq, const int *tokens, int n, kv_logits_mode mode,
                      float *logits, const kv_hooks *hooks, kv_error *err) {
    kv_cache *c = kv_engine_cache(e, seq);
    if (!c) return kv_fail(err, KV_EINTERNAL, "engine: prefill of a closed sequence %d", seq);
    if (n < 1) return KV_OK;
    int step = covers(c, n) ? e->max_step : e->plan.evict_block;
    if (step > e->max_step) step = e->max_step;
    int V = e->m->cfg.vocab_size, rc = KV_OK;
    for (int t = 0; t < n && !rc; t += step) {
        int cnt = n - t < step ? n - t : step;
        kv_logits_mode md = mode == KV_LOGITS_ALL                    ? KV_LOGITS_ALL
                            : mode == KV_LOGITS_LAST && t + cnt == n ? KV_LOGITS_LAST
                                                                     : KV_LOGITS_NONE;
        float *lg = mode == KV_LOGITS_ALL ? logits + (size_t)t * V : logits;
        rc = kv_forward(e->m, e->be, &c, 1, tokens + t, cnt, md, lg, hooks, err);
    }
    return rc;
}

int kv_engine_decode(kv_engine *e, const int *seqs, int n_seqs, const int *tokens, float *logits,
                     kv_error *err) {
    if (n_seqs < 1 || n_seqs > e->max_seqs)
        return kv_fail(err, KV_EINTERNAL, "engine: decode of %d sequences (at most %d)", n_seqs,
                       e->max_seqs);
    for (int i = 0; i < n_seqs; i++) {
        e->ptrs[i] = kv_engine_cache(e, seqs[i]);
        if (!e->ptrs[i])
            return kv_fail(err, KV_EINTERNAL, "engine: decode of a closed sequence %d", seqs[i]);
    }
    return kv_forward(e->m, e->be, e->ptrs, n_seqs, tokens, 1, KV_LOGITS_LAST, logits, NULL, err);
}

int kv_engine_decode_invariant_ok(const kv_engine *e) {
    return e->be->rowwise_capable;
}

int kv_engine_decode_invariant(kv_engine *e, const int *seqs, int n_seqs, const int *tokens,
                               float *logits, kv_error *err) {
    if (!e->be->rowwise_capable)
        return kv_fail(err, KV_EINPUT,
                       "engine: the %s backend has no batch-invariant decode; decode at most %d "
                       "sequences per call instead",
                       e->be->ops->name, KV_ENGINE_INVARIANT_ROWS);
    e->be->rowwise = 1;
    int rc = kv_engine_decode(e, seqs, n_seqs, tokens, logits, err);
    e->be->rowwise = 0;
    return rc;
}

/* log-softmax NLL of `target` under logits[vocab] */
static double token_nll(const float *logits, int vocab, int target) {
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)(logits[i] - mx));
    return log(sum) - (double)(logits[target] - mx);
}

/* KL(ref || q) of one position: ref_lp [vocab] log-probabilities, q given by logits. */
static double token_kl(const float *ref_lp, const float *logits, int vocab) {
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)(logits[i] - mx));
    double lse = log(sum) + (double)mx, kl = 0.0;
    for (int i = 0; i < vocab; i++) {
        double lp = (double)ref_lp[i];
        kl += exp(lp) * (lp - ((double)logits[i] - lse));
    }
    return kl;
}

int kv_engine_chunk_nll(kv_engine *e, const int *tokens, int n, int n_sets,
                        const int *const *budgets, const kv_policy *const *policies,
                        double *nll_sum, size_t *peak_bytes, kv_error *err) {
    return kv_engine_chunk_score(e, tokens, n, n_sets, budgets, policies, NULL, nll_sum, NULL,
                                 peak_bytes, err);
}

int kv_engine_chunk_score(kv_engine *e, const int *tokens, int n, int n_sets,
                          const int *const *budgets, const kv_policy *const *policies,
                          const float *ref_logprobs, double *nll_sum, double *kl_sum,
                          size_t *peak_bytes, kv_error *err) {
    return kv_engine_chunk_score_typed(e, tokens, n, n_sets, budgets, policies, NULL, ref_logprobs,
                                       nll_sum, kl_sum, peak_bytes, err);
}

int kv_engine_chunk_score_typed(kv_engine *e, const int *tokens, int n, int n_sets,
                                const int *const *budgets, const kv_policy *const *policies,
                                const kv_cache_type *const *types, const float *ref_logprobs,
                                double *nll_sum, double *kl_sum, size_t *peak_bytes,
                                kv_error *err) {
    if (n_sets < 1 || n_sets > e->max_seqs)
        return kv_fail(err, KV_EINTERNAL, "engine: %d budget sets for %d sequences", n_sets,
                       e->max_seqs);
    int *ids = kv_malloc((size_t)n_sets * sizeof *ids, "chunk sequences", err);
    if (!ids) return KV_EINTERNAL;
    int rc = KV_OK, opened = 0;
    for (; opened < n_sets && !rc; opened++)
        rc = kv_engine_seq_open_typed(e, budgets ? budgets[opened] : NULL,
                                      policies ? policies[opened] : NULL,
                                      types ? types[opened] : NULL, &ids[opened], err);
    if (rc) opened--;
    kv_pool_reset_peak(&e->pool);
    /* When no head can ever be over budget, blocking changes nothing: one pass per step of
     * max_step tokens (the whole chunk when it fits). */
    int all_cover = 1;
    for (int s = 0; s < n_sets && !rc; s++) {
        e->ptrs[s] = &e->seqs[ids[s]];
        all_cover &= covers(e->ptrs[s], n);
    }
    int step = all_cover ? e->max_step : e->plan.evict_block;
    if ((long)step * n_sets > e->be->max_rows) step = e->be->max_rows / n_sets;
    if (step < 1 && !rc) rc = kv_fail(err, KV_EINTERNAL, "engine: no room for %d sets", n_sets);
    int V = e->m->cfg.vocab_size;
    for (int s = 0; s < n_sets; s++) nll_sum[s] = 0.0;
    if (kl_sum)
        for (int s = 0; s < n_sets; s++) kl_sum[s] = 0.0;
    for (int t0 = 0; t0 < n && !rc; t0 += step) {
        int cnt = n - t0 < step ? n - t0 : step;
        for (int s = 0; s < n_sets; s++)
            memcpy(e->tok + (size_t)s * cnt, tokens + t0, (size_t)cnt * sizeof *tokens);
        rc = kv_forward(e->m, e->be, e->ptrs, n_sets, e->tok, cnt, KV_LOGITS_ALL, e->logits, NULL,
                        err);
        for (int s = 0; s < n_sets && !rc; s++)
            for (int i = 0; i < cnt && !rc; i++)
                if (t0 + i + 1 < n) {
                    double v =
                        token_nll(e->logits + ((size_t)s * cnt + i) * V, V, tokens[t0 + i + 1]);
                    if (!isfinite(v))
                        rc = kv_fail(err, KV_EINPUT,
                                     "%s: the model's output is not finite (NaN or infinite "
                                     "logits at token %d); its weights are damaged or overflow",
                                     e->m->path, t0 + i);
                    nll_sum[s] += v;
                    if (ref_logprobs && kl_sum)
                        kl_sum[s] += token_kl(ref_logprobs + (size_t)(t0 + i) * V,
                                              e->logits + ((size_t)s * cnt + i) * V, V);
                }
    }
    if (peak_bytes) *peak_bytes = kv_pool_peak_bytes(&e->pool);
    for (int s = 0; s < opened; s++) kv_engine_seq_close(e, ids[s]);
    free(ids);
    return rc;
}

size_t kv_engine_bytes_in_use(const kv_engine *e) {
    return kv_pool_bytes_in_use(&e->pool);
}
size_t kv_engine_bytes_peak(const kv_engine *e) {
    return kv_pool_peak_bytes(&e->pool);
}
void kv_engine_reset_peak(kv_engine *e) {
    kv_pool_reset_peak(&e->pool);
}
size_t kv_engine_bytes_full(const kv_engine *e, int tokens) {
    /* the ratio reference: the full cache in F16 */
    return (size_t)e->plan.n_layers * (size_t)e->plan.n_kv_heads *
           (size_t)((tokens + e->plan.block_size - 1) / e->plan.block_size) * 2 *
           (size_t)e->plan.block_size * kv_type_row_bytes(KV_TYPE_F16, e->m->cfg.head_dim);
}
