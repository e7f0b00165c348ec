/* Batched generation on an engine (kvplan/generate.h). */
#include "kvplan/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/eval.h"

/* The working state of one generation: per-sequence samplers and handles, and the batch's
 * step arrays. */
typedef struct gen_state {
    kv_engine *e;
    const kv_tokenizer *tok;
    const kv_gen_opts *o;
    const kv_model *m;
    int B, vocab;
    kv_gen_seq *seqs; /* [B], handed to the result */
    int *cap, *done, *handle;
    kv_sampler *sampler;                    /* [B] */
    int *step_seqs, *step_tokens, *act_idx; /* [B] */
    float *logits;                          /* [B, vocab] */
    void *scratch;                          /* kv_sample's */
} gen_state;

static void state_free(gen_state *g) {
    free(g->cap);
    free(g->done);
    free(g->handle);
    free(g->sampler);
    free(g->step_seqs);
    free(g->step_tokens);
    free(g->act_idx);
    free(g->logits);
    free(g->scratch);
}

static int state_init(gen_state *g, kv_error *err) {
    size_t B = (size_t)g->B, V = (size_t)g->vocab;
    g->seqs = calloc(B, sizeof *g->seqs);
    g->cap = calloc(B, sizeof *g->cap);
    g->done = calloc(B, sizeof *g->done);
    g->handle = calloc(B, sizeof *g->handle);
    g->sampler = calloc(B, sizeof *g->sampler);
    g->step_seqs = calloc(B, sizeof *g->step_seqs);
    g->step_tokens = calloc(B, sizeof *g->step_tokens);
    g->act_idx = calloc(B, sizeof *g->act_idx);
    g->logits = malloc(B * V * sizeof *g->logits);
    g->scratch = malloc(V * 2 * sizeof(float) * 2);
    if (!g->seqs || !g->cap || !g->done || !g->handle || !g->sampler || !g->step_seqs ||
        !g->step_tokens || !g->act_idx || !g->logits || !g->scratch)
        return kv_fail(err, KV_EINTERNAL, "generation: out of memory for %d sequences", g->B);
    return KV_OK;
}

static int seq_push(gen_state *g, int s, int id, kv_error *err) {
    kv_gen_seq *q = &g->seqs[s];
    if (q->n == g->cap[s]) {
        int nc = g->cap[s] ? 2 * g->cap[s] : 256;
        int *nw = realloc(q->ids, (size_t)nc * sizeof *nw);
        if (!nw) return kv_fail(err, KV_EINTERNAL, "generation: out of memory");
        q->ids = nw;
        g->cap[s] = nc;
    }
    q->ids[q->n++] = id;
    return KV_OK;
}

/* Tokenize each sequence's prompt (BOS first), seed its sampler and open its sequence.
 * *max_rows gets the longest prompt. */
static int open_sequences(gen_state *g, int C, int *max_rows, kv_error *err) {
    int rc = KV_OK;
    *max_rows = 0;
    for (int s = 0; !rc && s < g->B; s++) {
        kv_gen_seq *q = &g->seqs[s];
        g->handle[s] = -1;
        const char *p = g->o->prompts[s % g->o->n_prompts];
        int *ids = NULL, n = 0;
        rc = kv_tokenizer_encode(g->tok, p, strlen(p), 1, &ids, &n, err);
        if (rc) break;
        q->ids = ids;
        q->n = q->n_prompt = g->cap[s] = n;
        if (n >= C)
            rc = kv_fail(err, KV_EINPUT, "prompt %d has %d tokens, the context is %d", s, n, C);
        if (n > *max_rows) *max_rows = n;
        kv_sampler_init(&g->sampler[s], g->o->temperature, g->o->top_p,
                        g->o->seed + (uint64_t)s + 1);
        if (!rc) rc = kv_engine_seq_open(g->e, NULL, NULL, &g->handle[s], err);
    }
    return rc;
}

/* Sample every unfinished sequence's next token and gather the ones to decode (none at the
 * last step). Returns the number gathered (*na) through the step arrays. */
static int sample_step(gen_state *g, long step, long max_new, int *na, kv_error *err) {
    *na = 0;
    for (int s = 0; s < g->B; s++) {
        kv_gen_seq *q = &g->seqs[s];
        if (g->done[s]) continue;
        float *row = g->logits + (size_t)s * g->vocab;
        for (int v = 0; v < g->vocab; v++)
            if (!isfinite(row[v]))
                return kv_fail(err, KV_EINPUT,
                               "%s: the model's output is not finite (logit %d of sequence %d "
                               "is %g after %d tokens); its weights are damaged or overflow",
                               g->m->path, v, s, (double)row[v], q->n);
        int next = kv_sample(&g->sampler[s], row, g->vocab, g->scratch);
        if (next == kv_tokenizer_eos(g->tok) || next == kv_tokenizer_bos(g->tok)) {
            g->done[s] = 1;
            continue;
        }
        if (seq_push(g, s, next, err)) return err->code;
        if (g->o->on_token) g->o->on_token(g->o->user, s, q->ids[q->n - 2], next);
        if (step + 1 == max_new) continue;
        g->step_seqs[*na] = g->handle[s];
        g->act_idx[*na] = s;
        g->step_tokens[*na] = next;
        (*na)++;
    }
    return KV_OK;
}

/* Decode all sequences together until max_new tokens or every sequence has ended. */
static int decode_loop(gen_state *g, long max_new, kv_gen_result *res, kv_error *err) {
    int rc = KV_OK;
    for (long step = 0; !rc && step < max_new; step++) {
        int na = 0;
        if ((rc = sample_step(g, step, max_new, &na, err)) || na == 0) break;
        rc = kv_engine_decode(g->e, g->step_seqs, na, g->step_tokens, g->logits, err);
        /* scatter logits back to their sequences (in place, descending is safe: act_idx >= i) */
        for (int i = na - 1; !rc && i >= 0; i--)
            if (g->act_idx[i] != i)
                memmove(g->logits + (size_t)g->act_idx[i] * g->vocab,
                        g->logits + (size_t)i * g->vocab, (size_t)g->vocab * sizeof(float));
        res->decoded += na;
        size_t in_use = kv_engine_bytes_in_use(g->e);
        if (in_use > res->kv_peak) res->kv_peak = in_use;
    }
    return rc;
}

int kv_generate(kv_engine *e, const kv_model *m, const kv_tokenizer *tok, const kv_gen_opts *o,
                kv_gen_result *res, kv_error *err) {
    memset(res, 0, sizeof *res);
    if (o->n_seqs < 1 || o->n_prompts < 1 || !o->prompts)
        return kv_fail(err, KV_EINPUT, "generation needs a prompt and at least one sequence");
    gen_state g = {.e = e, .tok = tok, .o = o, .m = m, .B = o->n_seqs, .vocab = m->cfg.vocab_size};
    const int C = m->cfg.seq_len;
    int max_rows = 0;
    int rc = state_init(&g, err);
    if (!rc) rc = open_sequences(&g, C, &max_rows, err);
    /* prefill each sequence (Batch-Max Alg. 1 blocks of p when a head can be over budget) */
    double t0 = kv_now();
    for (int s = 0; !rc && s < g.B; s++) {
        rc = kv_engine_prefill(e, g.handle[s], g.seqs[s].ids, g.seqs[s].n_prompt, KV_LOGITS_LAST,
                               g.logits + (size_t)s * g.vocab, NULL, err);
        res->prefill_tokens += g.seqs[s].n_prompt;
    }
    double t1 = kv_now();
    for (int s = 0; !rc && o->on_token && s < g.B; s++)
        for (int i = 0; i < g.seqs[s].n_prompt; i++)
            o->on_token(o->user, s, i ? g.seqs[s].ids[i - 1] : -1, g.seqs[s].ids[i]);
    long max_new = o->max_new > C - max_rows ? C - max_rows : o->max_new;
    if (!rc) rc = decode_loop(&g, max_new, res, err);
    res->prefill_s = t1 - t0;
    res->decode_s = kv_now() - t1;
    res->seqs = g.seqs;
    res->n_seqs = g.seqs ? g.B : 0;
    state_free(&g);
    if (rc) kv_gen_result_free(res);
    return rc;
}

void kv_gen_result_free(kv_gen_result *res) {
    for (int s = 0; res->seqs && s < res->n_seqs; s++) free(res->seqs[s].ids);
    free(res->seqs);
    res->seqs = NULL;
    res->n_seqs = 0;
}
