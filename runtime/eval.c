/* kvplan perplexity under a full or budgeted KV cache, uniform budgets, and sampling.
 * See include/kvplan/eval.h. */
#include "kvplan/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kv_eval_opts_default(kv_eval_opts *o, const kv_model *m) {
    memset(o, 0, sizeof *o);
    o->context = m->cfg.seq_len;
    o->policy = KV_POLICY_SINK;
    o->evict_block = KV_DEFAULT_EVICT_BLOCK;
    o->block_size = KV_DEFAULT_BLOCK_SIZE;
}

int kv_eval_check_budget(const kv_model *m, const kv_eval_opts *o, kv_error *err) {
    if (o->context < 2 || o->context > m->cfg.seq_len)
        return kv_fail(err, KV_EINPUT, "context %d must be in [2, %d] (the model's context)",
                       o->context, m->cfg.seq_len);
    if (o->block_size < 1 || o->block_size > 4096)
        return kv_fail(err, KV_EINPUT, "block size %d must be in [1, 4096]", o->block_size);
    if (o->evict_block < 1 || o->evict_block > o->context)
        return kv_fail(err, KV_EINPUT, "eviction block p = %d must be in [1, context %d]",
                       o->evict_block, o->context);
    if (!o->budget) return KV_OK;
    int need = kv_policy_fixed_tokens(o->policy) + o->evict_block;
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    for (int i = 0; i < nh; i++)
        if (o->budget[i] < need && o->budget[i] < o->context)
            return kv_fail(err, KV_EINPUT,
                           "budget of layer %d KV head %d is %d tokens, below the %d the policy "
                           "'%s' needs (%d fixed + eviction block p = %d); raise the ratio or "
                           "lower --evict-block",
                           i / m->cfg.n_kv_heads, i % m->cfg.n_kv_heads, o->budget[i], need,
                           kv_policy_name(o->policy), kv_policy_fixed_tokens(o->policy),
                           o->evict_block);
    return KV_OK;
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

static int budgets_cover(const kv_model *m, const int *budget, int n) {
    if (!budget) return 1;
    for (int i = 0; i < m->cfg.n_layers * m->cfg.n_kv_heads; i++)
        if (budget[i] < n) return 0;
    return 1;
}

int kv_eval_chunk(const kv_model *m, kv_workspace *ws, kv_pool *pool, const int *tokens, int n,
                  const kv_eval_opts *o, double *nll_sum, size_t *peak_bytes, kv_error *err) {
    kv_cache c;
    int rc = kv_cache_init(&c, pool, m->cfg.n_layers, m->cfg.n_kv_heads, o->budget, o->policy, err);
    if (rc) return rc;
    kv_pool_reset_peak(pool);
    /* When no head can ever be over budget, blocking changes nothing: one pass. */
    int step = budgets_cover(m, o->budget, n) ? n : o->evict_block;
    int V = m->cfg.vocab_size;
    float *logits = kv_malloc((size_t)step * (size_t)V * sizeof(float), "logits", err);
    if (!logits) {
        kv_cache_destroy(&c);
        return KV_EINTERNAL;
    }
    double sum = 0.0;
    for (int t0 = 0; t0 < n && !rc; t0 += step) {
        int cnt = n - t0 < step ? n - t0 : step;
        rc = kv_forward(m, ws, (kv_cache *const[]){&c}, 1, tokens + t0, cnt, KV_LOGITS_ALL, logits,
                        NULL, err);
        for (int i = 0; i < cnt && !rc; i++)
            if (t0 + i + 1 < n) {
                double v = token_nll(logits + (size_t)i * V, V, tokens[t0 + i + 1]);
                if (!isfinite(v))
                    rc = kv_fail(err, KV_EINTERNAL, "non-finite loss at token %d", t0 + i);
                sum += v;
            }
    }
    if (peak_bytes) *peak_bytes = kv_pool_peak_bytes(pool);
    free(logits);
    kv_cache_destroy(&c);
    *nll_sum = sum;
    return rc;
}

int kv_eval_perplexity(const kv_model *m, const int *tokens, long n_tokens, const kv_eval_opts *o,
                       kv_eval_result *res, kv_error *err) {
    memset(res, 0, sizeof *res);
    int rc = kv_eval_check_budget(m, o, err);
    if (rc) return rc;
    int C = o->context;
    long chunks = n_tokens / C;
    if (o->max_chunks > 0 && chunks > o->max_chunks) chunks = o->max_chunks;
    if (chunks < 1)
        return kv_fail(err, KV_EINPUT, "the text has %ld tokens, fewer than one chunk of %d",
                       n_tokens, C);
    for (long i = 0; i < chunks * C; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return kv_fail(err, KV_EINPUT, "token %ld has id %d, outside the vocabulary [0, %d)", i,
                           tokens[i], m->cfg.vocab_size);
    int step = budgets_cover(m, o->budget, C) ? C : o->evict_block;
    long nblocks = kv_cache_blocks_needed(m->cfg.n_layers, m->cfg.n_kv_heads, o->budget, C,
                                          o->evict_block, o->block_size);
    kv_pool pool;
    kv_workspace *ws = NULL;
    rc = kv_pool_init(&pool, (int)nblocks, o->block_size, m->cfg.head_dim, err);
    if (rc) return rc;
    rc = kv_workspace_new(m, step, C, &ws, err);
    if (rc) {
        kv_pool_destroy(&pool);
        return rc;
    }
    double total = 0.0, t0 = kv_now();
    size_t peak = 0;
    for (long ch = 0; ch < chunks && !rc; ch++) {
        double s = 0.0;
        size_t pk = 0;
        rc = kv_eval_chunk(m, ws, &pool, tokens + ch * C, C, o, &s, &pk, err);
        total += s;
        if (pk > peak) peak = pk;
        if (o->progress) {
            double el = kv_now() - t0;
            kv_progress_print(o->progress, ch + 1 == chunks, "eval: chunk %ld/%ld, %.0f tokens/s",
                              ch + 1, chunks, (double)(ch + 1) * C / (el > 0 ? el : 1e-9));
        }
    }
    double secs = kv_now() - t0;
    if (!rc) {
        res->chunks = (int)chunks;
        res->tokens_scored = chunks * (C - 1);
        res->nll = total / (double)res->tokens_scored;
        res->perplexity = exp(res->nll);
        res->seconds = secs;
        res->tokens_per_s = (double)(chunks * C) / (secs > 0 ? secs : 1e-9);
        res->kv_bytes_peak = peak;
        res->kv_bytes_full = (size_t)m->cfg.n_layers * m->cfg.n_kv_heads *
                             (size_t)((C + o->block_size - 1) / o->block_size) *
                             kv_pool_block_bytes(&pool);
    }
    kv_workspace_free(ws);
    kv_pool_destroy(&pool);
    return rc;
}

int kv_budget_uniform(const kv_model *m, double ratio, int context, int block_size, int *budget,
                      kv_error *err) {
    if (!(ratio > 0.0 && ratio <= 1.0))
        return kv_fail(err, KV_EINPUT, "ratio %g must be in (0, 1]", ratio);
    long per = (long)floor(ratio * context / block_size + 1e-9) * block_size;
    if (per < block_size) per = block_size;
    if (per > context) per = context;
    for (int i = 0; i < m->cfg.n_layers * m->cfg.n_kv_heads; i++) budget[i] = (int)per;
    return KV_OK;
}

/* ---- sampling ---- */
void kv_sampler_init(kv_sampler *s, float temperature, float top_p, uint64_t seed) {
    s->temperature = temperature;
    s->top_p = top_p;
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
}

static float rand_f32(kv_sampler *s) { /* xorshift64* */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((s->rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

typedef struct prob_idx {
    float p;
    int i;
} prob_idx;

static int cmp_prob_desc(const void *a, const void *b) {
    float pa = ((const prob_idx *)a)->p, pb = ((const prob_idx *)b)->p;
    return (pa < pb) - (pa > pb);
}

int kv_sample(kv_sampler *s, float *logits, int vocab, void *scratch) {
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->temperature <= 0.0f) return best;
    float mx = logits[best], sum = 0.0f;
    for (int i = 0; i < vocab; i++) {
        logits[i] = expf((logits[i] - mx) / s->temperature);
        sum += logits[i];
    }
    for (int i = 0; i < vocab; i++) logits[i] /= sum;
    float r = rand_f32(s);
    if (s->top_p <= 0.0f || s->top_p >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < vocab; i++) {
            cdf += logits[i];
            if (r < cdf) return i;
        }
        return vocab - 1;
    }
    prob_idx *pi = scratch;
    for (int i = 0; i < vocab; i++) pi[i] = (prob_idx){logits[i], i};
    qsort(pi, (size_t)vocab, sizeof *pi, cmp_prob_desc);
    float cum = 0.0f;
    int last = vocab - 1;
    for (int i = 0; i < vocab; i++) {
        cum += pi[i].p;
        if (cum > s->top_p) {
            last = i;
            break;
        }
    }
    float target = r * cum, cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += pi[i].p;
        if (target < cdf) return pi[i].i;
    }
    return pi[last].i;
}
