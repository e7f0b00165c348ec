/* Iteration-level scheduler over one engine: see include/kvplan/sched.h. */
#include "kvplan/sched.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvplan/eval.h"
#include "kvplan/kvcache.h"

typedef enum { RQ_QUEUED, RQ_PREFILL, RQ_DECODE } rq_state;

typedef struct rq {
    uint64_t id;
    int *tokens;
    int n_tokens, max_new;
    kv_sampler sampler;
    kv_sched_event_fn on_event;
    void *user;
    rq_state state;
    int seq;        /* engine handle, -1 before it is opened */
    int done;       /* prompt tokens prefilled */
    int last, prev; /* the token to decode next and the one before it */
    int n_gen;
    int cancel;     /* set under the lock by kv_sched_cancel */
    size_t reserve; /* bytes reserved at admission */
    double t_submit, t_last;
    struct rq *next; /* queue link */
} rq;

struct kv_sched {
    kv_engine *e;
    const kv_model *m;
    int eos, bos, vocab, ctx;
    kv_sched_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rq *qhead, *qtail; /* FIFO of queued requests */
    int n_queued;
    rq **run; /* [max_running] admitted requests, admission order */
    int n_run;
    uint64_t next_id;
    int stopping;
    double drain_deadline;
    kv_sched_stats st; /* counters (under mu) */
    int invariant;     /* the engine has kv_engine_decode_invariant (any group, same bits) */
    float *logits;     /* [group, vocab]: the engine's (kv_engine_logits_buffer), not owned */
    void *scratch;     /* kv_sample's */
    int *g_seqs, *g_toks;
    rq **g_reqs;
};

static const double bucket_bounds[KV_SCHED_NBUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,   0.05,
    0.1,    0.25,    0.5,    1.0,   2.5,    5.0,   10.0, INFINITY};

const double *kv_sched_bucket_bounds(void) {
    return bucket_bounds;
}

const char *kv_finish_name(kv_finish f) {
    switch (f) {
    case KV_FINISH_STOP:
        return "stop";
    case KV_FINISH_LENGTH:
        return "length";
    case KV_FINISH_CANCELLED:
        return "cancelled";
    case KV_FINISH_ERROR:
        return "error";
    default:
        return "none";
    }
}

static void hist_add(kv_sched_hist *h, double v) {
    for (int i = 0; i < KV_SCHED_NBUCKETS; i++)
        if (v <= bucket_bounds[i]) h->count[i]++;
    h->n++;
    h->sum += v;
}

size_t kv_sched_request_bytes(const kv_sched *s, int n_tokens, int max_new) {
    const kv_plan *p = kv_engine_plan(s->e);
    long counts[KV_CACHE_TYPES];
    long ctx = (long)n_tokens + (long)max_new;
    if (ctx > s->ctx) ctx = s->ctx;
    kv_cache_blocks_needed_typed(p->n_layers, p->n_kv_heads, p->full ? NULL : p->budget, p->kv_type,
                                 (int)ctx, p->evict_block, p->block_size, counts);
    size_t bytes = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++)
        bytes += (size_t)counts[t] * 2 * (size_t)p->block_size *
                 kv_type_row_bytes((kv_cache_type)t, s->m->cfg.head_dim);
    return bytes;
}

int kv_sched_new(kv_engine *e, const kv_model *m, const kv_tokenizer *tok,
                 const kv_sched_opts *opts, kv_sched **out, kv_error *err) {
    *out = NULL;
    if (!opts || opts->kv_mem == 0)
        return kv_fail(err, KV_EINPUT, "scheduler: the KV memory (kv_mem) must be positive");
    kv_sched *s = kv_calloc(1, sizeof *s, "scheduler", err);
    if (!s) return KV_EINTERNAL;
    s->e = e;
    s->m = m;
    s->o = *opts;
    s->eos = kv_tokenizer_eos(tok);
    s->bos = kv_tokenizer_bos(tok);
    s->vocab = m->cfg.vocab_size;
    s->ctx = kv_engine_plan(e)->context;
    if (s->o.max_queue <= 0) s->o.max_queue = 256;
    if (s->o.step_tokens <= 0) s->o.step_tokens = 64;
    int cap = kv_engine_max_seqs(e);
    if (s->o.max_running <= 0 || s->o.max_running > cap) s->o.max_running = cap;
    s->invariant = kv_engine_decode_invariant_ok(e);
    if (s->o.group <= 0) s->o.group = s->invariant ? s->o.max_running : KV_SCHED_GROUP;
    if (s->o.group > s->o.max_running) s->o.group = s->o.max_running;
    s->next_id = 1;
    s->st.kv_capacity = s->o.kv_mem;
    size_t g = (size_t)s->o.group, R = (size_t)s->o.max_running;
    s->run = calloc(R, sizeof *s->run);
    s->logits = kv_engine_logits_buffer(e, (int)g, NULL); /* no host copy on a device */
    s->scratch = malloc((size_t)s->vocab * 2 * sizeof(float) * 2);
    s->g_seqs = calloc(g, sizeof *s->g_seqs);
    s->g_toks = calloc(g, sizeof *s->g_toks);
    s->g_reqs = calloc(g, sizeof *s->g_reqs);
    int mu_ok = pthread_mutex_init(&s->mu, NULL) == 0;
    int cv_ok = mu_ok && pthread_cond_init(&s->cv, NULL) == 0;
    if (!s->run || !s->logits || !s->scratch || !s->g_seqs || !s->g_toks || !s->g_reqs || !cv_ok) {
        if (cv_ok) pthread_cond_destroy(&s->cv);
        if (mu_ok) pthread_mutex_destroy(&s->mu);
        free(s->run);
        free(s->scratch);
        free(s->g_seqs);
        free(s->g_toks);
        free(s->g_reqs);
        free(s);
        return kv_fail(err, KV_EINTERNAL, "scheduler: out of memory");
    }
    *out = s;
    return KV_OK;
}

static void rq_free(rq *r) {
    if (!r) return;
    free(r->tokens);
    free(r);
}

/* The final event of r, its sequence closed and reservation released (stepping thread; the
 * request must already be out of the queue and the running array). */
static void finish(kv_sched *s, rq *r, kv_finish why, const char *msg) {
    if (r->seq >= 0) kv_engine_seq_close(s->e, r->seq);
    r->seq = -1;
    size_t in_use = kv_engine_bytes_in_use(s->e);
    pthread_mutex_lock(&s->mu);
    s->st.kv_in_use = in_use;
    s->st.finished[why]++;
    if (r->state != RQ_QUEUED) s->st.kv_reserved -= r->reserve;
    pthread_mutex_unlock(&s->mu);
    kv_sched_event ev = {.token = -1,
                         .prev = r->last,
                         .n_prompt = r->n_tokens,
                         .n_generated = r->n_gen,
                         .finish = why,
                         .error = msg};
    r->on_event(r->user, &ev);
    rq_free(r);
}

/* Remove running request i (under the lock): the array keeps admission order. */
static void run_remove(kv_sched *s, int i) {
    memmove(s->run + i, s->run + i + 1, (size_t)(s->n_run - i - 1) * sizeof *s->run);
    s->n_run--;
}

void kv_sched_free(kv_sched *s) {
    if (!s) return;
    while (s->n_run > 0) {
        rq *r = s->run[s->n_run - 1];
        s->n_run--;
        finish(s, r, KV_FINISH_CANCELLED, NULL);
    }
    while (s->qhead) {
        rq *r = s->qhead;
        s->qhead = r->next;
        finish(s, r, KV_FINISH_CANCELLED, NULL);
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->run);
    free(s->scratch);
    free(s->g_seqs);
    free(s->g_toks);
    free(s->g_reqs);
    free(s);
}

static kv_sched_status check_request(const kv_sched *s, const kv_sched_request *r, kv_error *err) {
    if (!r->tokens || r->n_tokens < 1 || r->n_tokens >= s->ctx) {
        kv_fail(err, KV_EINPUT, "the prompt has %d tokens, the context is %d", r->n_tokens, s->ctx);
        return KV_SCHED_TOO_BIG;
    }
    if (r->max_new < 1 || r->max_new > s->ctx - r->n_tokens) {
        kv_fail(err, KV_EINPUT, "max_new %d is outside [1, %d] (context %d - %d prompt tokens)",
                r->max_new, s->ctx - r->n_tokens, s->ctx, r->n_tokens);
        return KV_SCHED_TOO_BIG;
    }
    if (!(r->temperature >= 0.0f) || !(r->top_p > 0.0f && r->top_p <= 1.0f) || !r->on_event) {
        kv_fail(err, KV_EINPUT, "temperature must be >= 0, top_p in (0, 1], an event callback");
        return KV_SCHED_TOO_BIG;
    }
    for (int i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= s->vocab) {
            kv_fail(err, KV_EINPUT, "token id %d is outside the vocabulary [0, %d)", r->tokens[i],
                    s->vocab);
            return KV_SCHED_TOO_BIG;
        }
    size_t need = kv_sched_request_bytes(s, r->n_tokens, r->max_new);
    if (need > s->o.kv_mem) {
        kv_fail(err, KV_EINPUT,
                "%d prompt + %d new tokens need %zu KV bytes under the plan, more than the "
                "whole KV memory (%zu bytes)",
                r->n_tokens, r->max_new, need, s->o.kv_mem);
        return KV_SCHED_TOO_BIG;
    }
    return KV_SCHED_OK;
}

kv_sched_status kv_sched_submit(kv_sched *s, const kv_sched_request *r, uint64_t *id,
                                kv_error *err) {
    kv_sched_status st = check_request(s, r, err);
    if (st != KV_SCHED_OK) {
        pthread_mutex_lock(&s->mu);
        s->st.refused_too_big++;
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    rq *q = calloc(1, sizeof *q);
    int *toks = malloc((size_t)r->n_tokens * sizeof *toks);
    if (!q || !toks) {
        free(q);
        free(toks);
        kv_fail(err, KV_EINTERNAL, "scheduler: out of memory for a request");
        return KV_SCHED_TOO_BIG;
    }
    memcpy(toks, r->tokens, (size_t)r->n_tokens * sizeof *toks);
    *q = (rq){.tokens = toks,
              .n_tokens = r->n_tokens,
              .max_new = r->max_new,
              .on_event = r->on_event,
              .user = r->user,
              .state = RQ_QUEUED,
              .seq = -1,
              .last = r->tokens[r->n_tokens - 1],
              .reserve = kv_sched_request_bytes(s, r->n_tokens, r->max_new),
              .t_submit = kv_now()};
    kv_sampler_init(&q->sampler, r->temperature, r->top_p, r->seed + 1);
    pthread_mutex_lock(&s->mu);
    s->st.submitted++;
    if (s->stopping || s->n_queued >= s->o.max_queue) {
        st = s->stopping ? KV_SCHED_STOPPING : KV_SCHED_QUEUE_FULL;
        if (s->stopping)
            s->st.refused_stopping++;
        else
            s->st.refused_queue_full++;
        pthread_mutex_unlock(&s->mu);
        rq_free(q);
        return st;
    }
    q->id = s->next_id++;
    if (s->qtail)
        s->qtail->next = q;
    else
        s->qhead = q;
    s->qtail = q;
    s->n_queued++;
    if (id) *id = q->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return KV_SCHED_OK;
}

void kv_sched_cancel(kv_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    for (rq *q = s->qhead; q; q = q->next)
        if (q->id == id) q->cancel = 1;
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i]->id == id) s->run[i]->cancel = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Take cancelled requests out of the queue and the running array, and (when `all`) every
 * request; they are chained through `next` into *out (under the lock). */
static void take_cancelled(kv_sched *s, int all, int queued_only, rq **out) {
    rq **pp = &s->qhead, *prev = NULL;
    while (*pp) {
        rq *q = *pp;
        if (q->cancel || all || queued_only) {
            *pp = q->next;
            s->n_queued--;
            q->next = *out;
            *out = q;
        } else {
            prev = q;
            pp = &q->next;
        }
    }
    s->qtail = prev;
    for (int i = s->n_run - 1; i >= 0; i--)
        if (s->run[i]->cancel || all) {
            rq *q = s->run[i];
            run_remove(s, i);
            q->next = *out;
            *out = q;
        }
}

/* Admit queued requests in order while their reservations fit (under the lock). Returns the
 * number admitted. */
static int admit(kv_sched *s) {
    int n = 0;
    while (s->qhead && s->n_run < s->o.max_running && !s->stopping) {
        rq *q = s->qhead;
        if (s->st.kv_reserved + q->reserve > s->o.kv_mem) {
            s->st.admission_waits++;
            break;
        }
        s->qhead = q->next;
        if (!s->qhead) s->qtail = NULL;
        s->n_queued--;
        q->next = NULL;
        q->state = RQ_PREFILL;
        s->st.kv_reserved += q->reserve;
        if (s->st.kv_reserved > s->st.kv_reserved_peak) s->st.kv_reserved_peak = s->st.kv_reserved;
        s->st.admitted++;
        s->run[s->n_run++] = q;
        if (s->n_run > s->st.peak_running) s->st.peak_running = s->n_run;
        n++;
    }
    return n;
}

/* Sample r's next token from logits [vocab] and deliver it; *ended gets the finish reason
 * (NONE while it goes on). */
static int emit_token(kv_sched *s, rq *r, float *logits, kv_finish *ended, kv_error *err) {
    *ended = KV_FINISH_NONE;
    for (int v = 0; v < s->vocab; v++)
        if (!isfinite(logits[v]))
            return kv_fail(err, KV_EINTERNAL,
                           "%s: the model's output is not finite (logit %d is %g after %d "
                           "tokens)",
                           s->m->path, v, (double)logits[v], r->n_tokens + r->n_gen);
    int next = kv_sample(&r->sampler, logits, s->vocab, s->scratch);
    double now = kv_now();
    pthread_mutex_lock(&s->mu);
    if (r->n_gen == 0)
        hist_add(&s->st.ttft, now - r->t_submit);
    else
        hist_add(&s->st.itl, now - r->t_last);
    if (next != s->eos && next != s->bos) s->st.generated_tokens++;
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
    if (next == s->eos || next == s->bos) {
        *ended = KV_FINISH_STOP;
        return KV_OK;
    }
    r->prev = r->last;
    r->last = next;
    r->n_gen++;
    kv_sched_event ev = {.token = next,
                         .prev = r->prev,
                         .n_prompt = r->n_tokens,
                         .n_generated = r->n_gen,
                         .finish = KV_FINISH_NONE};
    if (r->on_event(r->user, &ev))
        *ended = KV_FINISH_STOP;
    else if (r->n_gen >= r->max_new)
        *ended = KV_FINISH_LENGTH;
    return KV_OK;
}

/* End running request r (stepping thread): out of the running array, then its final event. */
static void end_running(kv_sched *s, rq *r, kv_finish why, const char *msg) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i] == r) {
            run_remove(s, i);
            break;
        }
    pthread_mutex_unlock(&s->mu);
    finish(s, r, why, msg);
}

/* 1 when no head of r's cache can be over budget while it takes n more tokens (the engine
 * prefills such a prompt in one step, else in steps of p). */
static int covers(kv_cache *c, int n) {
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].budget < c->n_past + n) return 0;
    return 1;
}

/* Tokens of r's next prefill piece (the engine's own step: the eviction block p when a head
 * can go over budget, else the rest of the prompt); opens r's sequence first. */
static int piece_tokens(kv_sched *s, rq *r, int *n, kv_error *err) {
    int rc = KV_OK;
    if (r->seq < 0 && (rc = kv_engine_seq_open(s->e, NULL, NULL, &r->seq, err))) return rc;
    kv_cache *c = kv_engine_cache(s->e, r->seq);
    int left = r->n_tokens - r->done, p = kv_engine_plan(s->e)->evict_block;
    *n = covers(c, left) || left < p ? left : p;
    return KV_OK;
}

/* 1 when r prefills and its next piece is one token that rides in the step's batched decode
 * call (decode_phase) instead of a forward call of its own: with the batch-invariant decode a
 * row's arithmetic is that of a one-row forward, which is what a one-token piece is. */
static int folds(kv_sched *s, rq *r) {
    int n = 0;
    return s->invariant && r->state == RQ_PREFILL && r->seq >= 0 &&
           piece_tokens(s, r, &n, NULL) == KV_OK && n == 1;
}

/* One prefill piece of r (the engine's own step), sampling the first token after the last. */
static int prefill_piece(kv_sched *s, rq *r, int *used, kv_error *err) {
    int n = 0, rc = piece_tokens(s, r, &n, err);
    if (rc) return rc;
    int last = r->done + n == r->n_tokens;
    rc = kv_engine_prefill(s->e, r->seq, r->tokens + r->done, n,
                           last ? KV_LOGITS_LAST : KV_LOGITS_NONE, s->logits, NULL, err);
    if (rc) return rc;
    r->done += n;
    *used += n;
    pthread_mutex_lock(&s->mu);
    s->st.prompt_tokens += (uint64_t)n;
    pthread_mutex_unlock(&s->mu);
    if (!last) return KV_OK;
    kv_finish why = KV_FINISH_NONE;
    rc = emit_token(s, r, s->logits, &why, err);
    if (rc) return rc;
    r->state = RQ_DECODE;
    if (why != KV_FINISH_NONE) end_running(s, r, why, NULL);
    return KV_OK;
}

/* Prefill pieces of the admitted requests, oldest first, within the step's token budget; the
 * one-token pieces (folds) are left to decode_phase, one per request and step. */
static int prefill_phase(kv_sched *s, int *worked, kv_error *err) {
    int used = 0, rc = KV_OK;
    for (int i = 0; i < s->n_run && used < s->o.step_tokens;) {
        rq *r = s->run[i];
        int n = 0;
        if (r->state == RQ_PREFILL && (rc = piece_tokens(s, r, &n, err))) {
            end_running(s, r, KV_FINISH_ERROR, err->msg);
            return rc;
        }
        if (r->state != RQ_PREFILL || folds(s, r)) {
            i++;
            continue;
        }
        int before = s->n_run;
        rc = prefill_piece(s, r, &used, err);
        *worked = 1;
        if (rc) {
            end_running(s, r, KV_FINISH_ERROR, err->msg);
            return rc;
        }
        if (s->n_run != before) continue; /* it ended (and is freed): same index */
        if (r->state != RQ_PREFILL) i++;  /* decoding from now on */
    }
    return KV_OK;
}

/* After a batched call: a decoding request samples its next token from its row's logits; a
 * folded prefill piece advances its prompt and, at the prompt's end, samples the first token
 * (as prefill_piece). `failed`: the call failed, the request ends with the error. */
static int row_done(kv_sched *s, rq *r, float *logits, int failed, kv_error *err) {
    kv_finish why = KV_FINISH_ERROR;
    int rc = failed;
    if (!rc && r->state == RQ_PREFILL) {
        r->done++;
        pthread_mutex_lock(&s->mu);
        s->st.prompt_tokens++;
        pthread_mutex_unlock(&s->mu);
        if (r->done < r->n_tokens) return KV_OK;
        r->state = RQ_DECODE;
    }
    if (!rc) rc = emit_token(s, r, logits, &why, err);
    if (rc) why = KV_FINISH_ERROR;
    if (why != KV_FINISH_NONE) end_running(s, r, why, rc ? err->msg : NULL);
    return rc;
}

/* One decode step of every decoding request, and the one-token prefill pieces (folds), in
 * forward calls of at most `group` rows (batch-invariant ones where the engine has them). */
static int decode_phase(kv_sched *s, int *worked, kv_error *err) {
    int n_dec = 0;
    for (int i = 0; i < s->n_run; i++)
        n_dec += s->run[i]->state == RQ_DECODE || folds(s, s->run[i]);
    if (n_dec == 0) return KV_OK;
    *worked = 1;
    /* the requests of this step, in admission order (the array shrinks as they finish) */
    rq **todo = malloc((size_t)n_dec * sizeof *todo);
    if (!todo) return kv_fail(err, KV_EINTERNAL, "scheduler: out of memory");
    int k = 0, rc = KV_OK;
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i]->state == RQ_DECODE || folds(s, s->run[i])) todo[k++] = s->run[i];
    for (int g0 = 0; g0 < n_dec && !rc; g0 += s->o.group) {
        int n = n_dec - g0 < s->o.group ? n_dec - g0 : s->o.group;
        for (int j = 0; j < n; j++) {
            rq *r = todo[g0 + j];
            s->g_reqs[j] = r;
            s->g_seqs[j] = r->seq;
            s->g_toks[j] = r->state == RQ_PREFILL ? r->tokens[r->done] : r->last;
        }
        rc = s->invariant
                 ? kv_engine_decode_invariant(s->e, s->g_seqs, n, s->g_toks, s->logits, err)
                 : kv_engine_decode(s->e, s->g_seqs, n, s->g_toks, s->logits, err);
        for (int j = 0; j < n; j++) {
            int r2 = row_done(s, s->g_reqs[j], s->logits + (size_t)j * s->vocab, rc, err);
            if (!rc) rc = r2;
        }
    }
    free(todo);
    return rc;
}

/* Close the cancelled requests (and every one when `all`; the queued ones when stopping). */
static void reap(kv_sched *s, int all) {
    rq *gone = NULL;
    pthread_mutex_lock(&s->mu);
    take_cancelled(s, all, s->stopping, &gone);
    pthread_mutex_unlock(&s->mu);
    while (gone) {
        rq *r = gone;
        gone = r->next;
        finish(s, r, KV_FINISH_CANCELLED, NULL);
    }
}

int kv_sched_step(kv_sched *s, int *worked, kv_error *err) {
    int w = 0;
    reap(s, 0);
    pthread_mutex_lock(&s->mu);
    w |= admit(s) > 0;
    pthread_mutex_unlock(&s->mu);
    int rc = prefill_phase(s, &w, err);
    int rc2 = decode_phase(s, &w, err);
    if (!rc) rc = rc2;
    size_t in_use = kv_engine_bytes_in_use(s->e), peak = kv_engine_bytes_peak(s->e);
    uint64_t attended = kv_backend_attended(kv_engine_backend(s->e));
    pthread_mutex_lock(&s->mu);
    s->st.steps += (uint64_t)w;
    s->st.attended = attended;
    s->st.kv_in_use = in_use;
    s->st.kv_peak = peak;
    pthread_mutex_unlock(&s->mu);
    if (!rc && (in_use > s->o.kv_mem || peak > s->o.kv_mem))
        rc = kv_fail(err, KV_EINTERNAL,
                     "scheduler: %zu KV bytes in use exceed the KV memory of %zu bytes", in_use,
                     s->o.kv_mem);
    if (worked) *worked = w;
    return rc;
}

/* Wait (under the lock) until something is queued, cancelled or stopping, at most 50 ms. */
static void idle_wait(kv_sched *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

int kv_sched_run(kv_sched *s, kv_error *err) {
    int first = KV_OK;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stopping = s->stopping, busy = s->n_run > 0 || s->n_queued > 0;
        int late = stopping && kv_now() > s->drain_deadline;
        if (!busy && !stopping) idle_wait(s);
        pthread_mutex_unlock(&s->mu);
        if (stopping && (late || !busy)) break;
        kv_error e2 = {0};
        int rc = kv_sched_step(s, NULL, &e2);
        if (rc && !first) {
            first = rc;
            if (err) *err = e2;
        }
    }
    reap(s, 1);
    return first;
}

void kv_sched_stop(kv_sched *s, double drain_s) {
    pthread_mutex_lock(&s->mu);
    if (!s->stopping) {
        s->stopping = 1;
        s->drain_deadline = kv_now() + (drain_s > 0 ? drain_s : 0);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void kv_sched_stats_get(kv_sched *s, kv_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_queued;
    out->running = s->n_run;
    out->prefilling = 0;
    for (int i = 0; i < s->n_run; i++) out->prefilling += s->run[i]->state == RQ_PREFILL;
    pthread_mutex_unlock(&s->mu);
}
