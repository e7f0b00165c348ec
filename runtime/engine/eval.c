/* kvplan perplexity under a full or budgeted KV cache, uniform budgets, and sampling.
 * See include/kvplan/eval.h. */
#include "kvplan/eval.h"
#include "backend/backend_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kv_eval_opts_default(kv_eval_opts *o, const kv_model *m) {
    memset(o, 0, sizeof *o);
    o->context = m->cfg.seq_len;
    o->policy = KV_POLICY_SINK;
    o->evict_block = KV_DEFAULT_EVICT_BLOCK;
    o->block_size = KV_DEFAULT_BLOCK_SIZE;
    o->kv_type = KV_TYPE_DEFAULT;
}

double kv_perplexity_from_nll(double nll_sum, long n_scored) {
    return n_scored > 0 ? exp(nll_sum / (double)n_scored) : NAN;
}

void kv_nll_sum_range(long n_scored, int vocab, double *lo, double *hi) {
    double n = n_scored > 0 ? (double)n_scored : 1.0;
    double lv = vocab > 2 ? log((double)vocab) : 1.0;
    *lo = n * 1e-9;
    *hi = n * 100.0 * (lv > 1.0 ? lv : 1.0);
}

int kv_eval_opts_plan(const kv_model *m, const kv_eval_opts *o, kv_plan *out, kv_error *err) {
    if (o->context < 2 || o->context > m->cfg.seq_len)
        return kv_fail(err, KV_EINPUT, "context %d must be in [2, %d] (the model's context)",
                       o->context, m->cfg.seq_len);
    if (!kv_type_valid((int)o->kv_type))
        return kv_fail(err, KV_EINPUT, "unknown KV type code %d", (int)o->kv_type);
    if (!o->budget) {
        int rc =
            kv_plan_full(&m->cfg, o->context, o->block_size, o->evict_block, o->policy, out, err);
        if (!rc) kv_plan_set_kv_type(out, o->kv_type);
        return rc;
    }
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    int *b = kv_malloc((size_t)nh * sizeof *b, "budgets", err);
    if (!b) return KV_EINTERNAL;
    long sum = 0;
    for (int i = 0; i < nh; i++) {
        b[i] = o->budget[i] > o->context ? o->context : o->budget[i];
        sum += b[i];
    }
    double ratio = (double)sum / ((double)nh * (double)o->context);
    int rc = kv_plan_from_budgets(&m->cfg, b, NULL, o->policy, ratio, o->context, o->block_size,
                                  o->evict_block, "custom", NAN, NAN, NAN, 0, out, err);
    if (!rc) kv_plan_set_kv_type(out, o->kv_type);
    free(b);
    return rc;
}

int kv_eval_engine(kv_engine *e, const int *tokens, long n_tokens, int max_chunks,
                   kv_progress *progress, kv_eval_result *res, kv_error *err) {
    memset(res, 0, sizeof *res);
    const kv_plan *p = kv_engine_plan(e);
    const kv_model *m = kv_engine_backend(e)->model;
    int C = p->context;
    long chunks = n_tokens / C;
    if (max_chunks > 0 && chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1)
        return kv_fail(err, KV_EINPUT, "the text has %ld tokens, fewer than one chunk of %d",
                       n_tokens, C);
    for (long i = 0; i < chunks * C; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return kv_fail(err, KV_EINPUT, "token %ld has id %d, outside the vocabulary [0, %d)", i,
                           tokens[i], m->cfg.vocab_size);
    double total = 0.0, t0 = kv_now();
    size_t peak = 0;
    int rc = KV_OK;
    for (long ch = 0; ch < chunks && !rc; ch++) {
        double s = 0.0;
        size_t pk = 0;
        rc = kv_engine_chunk_nll(e, tokens + ch * C, C, 1, NULL, NULL, &s, &pk, err);
        total += s;
        if (pk > peak) peak = pk;
        if (progress) {
            double el = kv_now() - t0;
            kv_progress_print(progress, ch + 1 == chunks, "eval: chunk %ld/%ld, %.0f tokens/s",
                              ch + 1, chunks, (double)(ch + 1) * C / (el > 0 ? el : 1e-9));
        }
    }
    double secs = kv_now() - t0;
    if (rc) return rc;
    res->chunks = (int)chunks;
    res->tokens_scored = chunks * (C - 1);
    res->nll = total / (double)res->tokens_scored;
    res->perplexity = kv_perplexity_from_nll(total, res->tokens_scored);
    res->seconds = secs;
    res->tokens_per_s = (double)(chunks * C) / (secs > 0 ? secs : 1e-9);
    res->kv_bytes_peak = peak;
    res->kv_bytes_full = kv_engine_bytes_full(e, C);
    return KV_OK;
}

int kv_eval_perplexity(const kv_model *m, const int *tokens, long n_tokens, const kv_eval_opts *o,
                       kv_eval_result *res, kv_error *err) {
    memset(res, 0, sizeof *res);
    kv_plan plan;
    int rc = kv_eval_opts_plan(m, o, &plan, err);
    if (rc) return rc;
    kv_engine *e = NULL;
    kv_engine_opts eo = {.device = KV_DEVICE_CPU, .max_seqs = 1};
    rc = kv_engine_new(m, &plan, &eo, &e, err);
    if (!rc) rc = kv_eval_engine(e, tokens, n_tokens, o->max_chunks, o->progress, res, err);
    kv_engine_free(e);
    kv_plan_free(&plan);
    return rc;
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
