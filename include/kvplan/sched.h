/* kvplan scheduler: iteration-level (continuous) batching of generation requests on one engine
 * (kvplan/engine.h), admitted by the KV bytes of the engine's plan (Orca, Yu et al. 2022:
 * iteration-level scheduling; vLLM, Kwon et al. 2023: admission by free KV blocks; Batch-Max /
 * KV-Compress: compressed per-head budgets let more sequences share the same bytes).
 *
 * Requests arrive from any thread (kv_sched_submit) into a bounded FIFO queue. One thread runs
 * the steps (kv_sched_step, or kv_sched_run which loops until kv_sched_stop). Each step:
 *   1. cancelled requests are closed (their blocks go back to the pool at once);
 *   2. queued requests are admitted in arrival order while the KV pool can hold their worst
 *      case: the plan's per-head budgets (+ the eviction block p, capped by the request's
 *      prompt + max_new tokens), rounded up to whole blocks, in each head's KV type
 *      (kv_sched_request_bytes); the sum of the admitted requests' reservations never exceeds
 *      kv_mem, so neither do the bytes really held (checked every step: KV_EINTERNAL);
 *   3. admitted requests are prefilled in the engine's own prefill steps (the plan's eviction
 *      block p when some head can be over budget, else the whole prompt, as
 *      kv_engine_prefill), as many steps as fit the per-step token budget (at least one);
 *   4. every decoding sequence runs one decode step. A row's arithmetic must not depend on its
 *      neighbours: on the CPU backend the whole batch runs in one kv_engine_decode_invariant
 *      call (the matmuls' per-row paths, register-blocked over 4 rows), elsewhere in forward
 *      calls of at most KV_SCHED_GROUP rows (larger calls switch to GEMMs whose rounding
 *      depends on the batch): a greedy request gives the same tokens as kv_generate /
 *      `kvplan run` alone. With kv_engine_decode_invariant, a prefill step of one token (a
 *      plan with p = 1, or a prompt's last token) is one more row of that call instead of a
 *      forward call of its own (the same arithmetic: a one-row forward); such a request
 *      advances one prompt token per step, never stalling the decoding ones.
 *   5. a finished request (EOS / BOS, max_new, or the event callback asked to stop) frees its
 *      sequence and reservation at once.
 * Sampling is kv_sample with the request's seed + 1 (kv_generate's first sequence).
 *
 * Events (tokens, the end) are delivered by callback on the stepping thread. The scheduler is
 * thread-safe for submit / cancel / stats / stop; the steps themselves run on one thread.
 */
#ifndef KVPLAN_SCHED_H
#define KVPLAN_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Most sequences in one decode forward call on a backend without a batch-invariant decode
 * (kvplan/engine.h: KV_ENGINE_INVARIANT_ROWS, the per-row matmul paths of kvplan/quant.h). */
#define KV_SCHED_GROUP KV_ENGINE_INVARIANT_ROWS
/* Latency histogram buckets (seconds, upper bounds; the last is +Inf). */
#define KV_SCHED_NBUCKETS 17

typedef enum {
    KV_SCHED_OK = 0,
    KV_SCHED_QUEUE_FULL = 1, /* the queue holds max_queue requests */
    KV_SCHED_STOPPING = 2,   /* kv_sched_stop was called */
    KV_SCHED_TOO_BIG = 3,    /* the request alone needs more than kv_mem */
} kv_sched_status;

typedef enum {
    KV_FINISH_NONE = 0,
    KV_FINISH_STOP = 1,      /* EOS / BOS, or the callback asked to stop */
    KV_FINISH_LENGTH = 2,    /* max_new tokens */
    KV_FINISH_CANCELLED = 3, /* kv_sched_cancel, or cancelled at shutdown */
    KV_FINISH_ERROR = 4,     /* the engine failed (message in the event) */
} kv_finish;

typedef struct kv_sched_event {
    int token;         /* the new token (-1 in the final event) */
    int prev;          /* the token before it (the prompt's last for the first one) */
    int n_prompt;      /* prompt tokens (BOS included) */
    int n_generated;   /* tokens generated so far, this one included */
    kv_finish finish;  /* NONE for a token event; the reason in the final event */
    const char *error; /* KV_FINISH_ERROR: a one-line message; else NULL */
} kv_sched_event;

/* Called on the stepping thread for each generated token and once at the end (finish !=
 * KV_FINISH_NONE; the last call for this request, after which the scheduler holds nothing of
 * `user`). A nonzero return from a token event finishes the request with KV_FINISH_STOP (stop
 * strings). It must not call back into the scheduler except kv_sched_cancel / kv_sched_stats. */
typedef int (*kv_sched_event_fn)(void *user, const kv_sched_event *ev);

typedef struct kv_sched_request {
    const int *tokens; /* the prompt's ids, BOS first ([n_tokens], copied) */
    int n_tokens;      /* 1 .. C - 1 (C = the engine's context) */
    int max_new;       /* 1 .. C - n_tokens new tokens */
    float temperature; /* 0 = greedy */
    float top_p;       /* (0, 1] */
    uint64_t seed;     /* the sampler's seed is seed + 1, as kv_generate's sequence 0 */
    kv_sched_event_fn on_event;
    void *user;
} kv_sched_request;

typedef struct kv_sched_opts {
    size_t kv_mem;   /* KV bytes the admitted requests may reserve (> 0) */
    int max_queue;   /* queued (not yet admitted) requests at most (default 256) */
    int step_tokens; /* prompt tokens prefilled per step at most (default 64; one engine
                      * prefill step always runs, so a larger step still progresses). With
                      * kv_engine_decode_invariant, a one-token prefill step is a row of the
                      * step's decode call instead: one per request and step, not counted */
    int max_running; /* admitted sequences at most (default: the engine's max_seqs) */
    int group;       /* decode rows per forward call at most (default: every running row in one
                      * call where the engine has kv_engine_decode_invariant, the CPU backend,
                      * else KV_SCHED_GROUP). Each row's bits are independent of the batch with
                      * the invariant decode, or at most KV_SCHED_GROUP rows; larger groups on
                      * other backends round by the batch */
} kv_sched_opts;

/* Counters since creation, and the state now (kv_sched_stats). Histograms: cumulative counts
 * of observations <= kv_sched_bucket_bounds()[i] (Prometheus "le"), the sum in seconds. */
typedef struct kv_sched_hist {
    uint64_t count[KV_SCHED_NBUCKETS];
    uint64_t n;
    double sum;
} kv_sched_hist;

typedef struct kv_sched_stats {
    int running, prefilling, queued; /* running includes prefilling */
    int peak_running;                /* most admitted at once since creation */
    size_t kv_in_use, kv_peak;       /* bytes of K/V blocks held now / at most (engine pool) */
    size_t kv_reserved, kv_capacity; /* sum of the admitted reservations; kv_mem */
    size_t kv_reserved_peak;
    uint64_t submitted, refused_queue_full, refused_stopping, refused_too_big, admitted;
    uint64_t finished[KV_FINISH_ERROR + 1]; /* by reason (index KV_FINISH_*) */
    uint64_t prompt_tokens, generated_tokens, steps, admission_waits;
    uint64_t attended;       /* attention work of every step: kv_backend_attended of the engine's */
    kv_sched_hist ttft, itl; /* time to first token (from submit), inter-token latency */
} kv_sched_stats;

typedef struct kv_sched kv_sched;

/* A scheduler over engine e (built for model m, no sequence open; e must outlive it and is
 * used by the stepping thread only). opts may not be NULL (kv_mem is required). Caller owns
 * *out (kv_sched_free). KV_EINPUT for kv_mem 0; KV_EINTERNAL memory / threads. */
int kv_sched_new(kv_engine *e, const kv_model *m, const kv_tokenizer *tok,
                 const kv_sched_opts *opts, kv_sched **out, kv_error *err);
/* Frees the scheduler; requests still held get a KV_FINISH_CANCELLED event first. The
 * stepping thread must have returned. */
void kv_sched_free(kv_sched *s);

/* KV bytes request r would hold at most under the engine's plan: per (layer, KV head)
 * ceil(min(B + p, n_tokens + max_new, C) / b_s) blocks of that head's type, each
 * 2 * b_s * kv_type_row_bytes(type, d_h) bytes (kv_cache_blocks_needed_typed). */
size_t kv_sched_request_bytes(const kv_sched *s, int n_tokens, int max_new);

/* Queue a request (any thread). *id (may be NULL) gets its id (> 0) for kv_sched_cancel.
 * Returns KV_SCHED_OK, or a refusal (the request is not queued and no event comes):
 * KV_SCHED_QUEUE_FULL, KV_SCHED_STOPPING, KV_SCHED_TOO_BIG. KV_EINPUT-like mistakes (bad
 * token counts, temperature, top_p) return KV_SCHED_TOO_BIG with err filled; a caller checks
 * its inputs first. */
kv_sched_status kv_sched_submit(kv_sched *s, const kv_sched_request *r, uint64_t *id,
                                kv_error *err);
/* Ask that request `id` be cancelled (any thread; unknown or finished ids are ignored). Its
 * sequence is closed at the start of the next step and it gets a KV_FINISH_CANCELLED event. */
void kv_sched_cancel(kv_sched *s, uint64_t id);

/* One scheduling step (the stepping thread). *worked (may be NULL) gets 1 when something ran.
 * Errors: KV_EINTERNAL when the engine fails (the requests involved get KV_FINISH_ERROR) or
 * the bytes held exceed kv_mem. */
int kv_sched_step(kv_sched *s, int *worked, kv_error *err);

/* Step until kv_sched_stop and the drain below, sleeping while idle. After kv_sched_stop:
 * nothing new is admitted from then on (queued requests are cancelled), running requests go on
 * until they finish or `drain_s` seconds have passed, then they are cancelled, and it returns.
 * Returns the first step error (the loop goes on after one: the failed requests ended). */
int kv_sched_run(kv_sched *s, kv_error *err);
/* Stop accepting (submit answers KV_SCHED_STOPPING) and let kv_sched_run drain for at most
 * drain_s seconds (any thread, idempotent). */
void kv_sched_stop(kv_sched *s, double drain_s);

/* A consistent snapshot (any thread). */
void kv_sched_stats_get(kv_sched *s, kv_sched_stats *out);
/* The histogram bucket upper bounds in seconds [KV_SCHED_NBUCKETS - 1] (the last is +Inf). */
const double *kv_sched_bucket_bounds(void);
const char *kv_finish_name(kv_finish f);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
