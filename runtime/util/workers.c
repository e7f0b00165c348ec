/* The worker pool of include/kvplan/workers.h.
 *
 * One job at a time. The job is published in one 64-bit word, `claim`: generation (24 bits),
 * number of chunks (20 bits) and the next chunk to hand out (20 bits). A thread takes chunk i
 * by a compare-and-swap of (g, n, i) -> (g, n, i + 1), so a thread that wakes late, after job g
 * has ended, can never take a chunk of job g + 1 under g's function: its swap fails on the
 * generation. A taken chunk keeps its job alive (the caller waits for `done` to reach n), so the
 * function and context read after a successful swap are that job's.
 *
 * Workers spin briefly after a job (the next matmul of a decode step follows within
 * microseconds), then sleep on a condition variable; the caller wakes them only when some
 * sleep. The caller waits for the chunks others hold by spinning, yielding the core after a
 * while (a holder may be descheduled on a loaded machine).
 *
 * Load adaptation: on a machine busier than its cores (other processes runnable), a worker
 * that holds a chunk is often descheduled, and the caller, done with the rest, waits for it a
 * whole time slice; measured on the 2-core VM at load 7, 2 threads then decoded slower than 1.
 * So the caller times each job: when, averaged over recent jobs, more than a quarter of a job's
 * time went to waiting for chunks held by others, the next KV_WORKERS_BACKOFF jobs run on the
 * caller alone, then the pool is tried again. Only who runs a chunk changes, never its result. */
#define _GNU_SOURCE
#include "kvplan/workers.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Pauses a worker spins for the next job before it sleeps (~50 us on the EPYC VM this was
 * tuned on); pauses the caller spins for held chunks before it yields its core. */
#define KV_WORKERS_SPIN 2000
#define KV_WORKERS_WAIT_SPIN 4000
/* Jobs run on the caller alone after the waits exceeded KV_WORKERS_WAIT_FRACTION of the jobs'
 * time (an exponential average with weight 1/8 per job). */
#define KV_WORKERS_BACKOFF 256
#define KV_WORKERS_WAIT_FRACTION 0.25

#define GEN_SHIFT 40
#define N_SHIFT 20
#define FIELD ((uint64_t)0xfffff)
#define MAX_CHUNKS ((int)FIELD)

struct kv_workers {
    int n; /* threads in all, the caller included */
    pthread_t *th;
    int started; /* workers started (for a partial start's cleanup) */
    _Atomic uint64_t claim;
    _Atomic int done;
    _Atomic uint32_t gen; /* generation of the job being published (24 bits used) */
    kv_work_fn fn;        /* the job: written before claim is published */
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sleepers; /* under mu */
    int stop;     /* under mu */
    /* the caller's only (load adaptation) */
    double wait_avg; /* average fraction of a job's time spent waiting for others' chunks */
    int serial_left; /* jobs still to run on the caller alone */
};

typedef struct worker_arg {
    kv_workers *w;
    int tid;
} worker_arg;

int kv_cpus_available(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Take and run chunks of job g while there are any. */
static void work(kv_workers *w, uint32_t g, int tid) {
    uint64_t c = atomic_load_explicit(&w->claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(c >> GEN_SHIFT) != g) return;
        uint64_t n = (c >> N_SHIFT) & FIELD, i = c & FIELD;
        if (i >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&w->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* c now holds the current word */
        w->fn(w->ctx, (int)i, tid);
        atomic_fetch_add_explicit(&w->done, 1, memory_order_release);
        c = atomic_load_explicit(&w->claim, memory_order_acquire);
    }
}

static void *worker_main(void *p) {
    worker_arg a = *(worker_arg *)p;
    free(p);
    kv_workers *w = a.w;
    uint32_t seen = atomic_load_explicit(&w->gen, memory_order_acquire);
    for (;;) {
        uint32_t g = seen;
        for (int s = 0; s < KV_WORKERS_SPIN; s++) {
            g = atomic_load_explicit(&w->gen, memory_order_acquire);
            if (g != seen) break;
            cpu_relax();
        }
        if (g == seen) {
            pthread_mutex_lock(&w->mu);
            w->sleepers++;
            while (!w->stop && (g = atomic_load_explicit(&w->gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&w->cv, &w->mu);
            w->sleepers--;
            int stop = w->stop;
            pthread_mutex_unlock(&w->mu);
            if (stop) return NULL;
        }
        seen = g;
        work(w, g & 0xffffffu, a.tid);
    }
}

int kv_workers_new(int n_threads, kv_workers **out, kv_error *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = kv_cpus_available();
    if (n_threads > KV_WORKERS_MAX)
        return kv_fail(err, KV_EINPUT, "%d threads asked for; at most %d", n_threads,
                       KV_WORKERS_MAX);
    kv_workers *w = kv_calloc(1, sizeof *w, "worker pool", err);
    if (!w) return KV_EINTERNAL;
    w->n = n_threads;
    atomic_init(&w->claim, 0);
    atomic_init(&w->done, 0);
    atomic_init(&w->gen, 0);
    if (pthread_mutex_init(&w->mu, NULL)) {
        free(w);
        return kv_fail(err, KV_EINTERNAL, "worker pool: cannot make a mutex");
    }
    if (pthread_cond_init(&w->cv, NULL)) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return kv_fail(err, KV_EINTERNAL, "worker pool: cannot make a condition variable");
    }
    if (n_threads > 1) {
        w->th = kv_calloc((size_t)n_threads - 1, sizeof *w->th, "worker threads", err);
        if (!w->th) {
            kv_workers_free(w);
            return KV_EINTERNAL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (!a || (a->w = w, a->tid = i, pthread_create(&w->th[i - 1], NULL, worker_main, a))) {
                free(a);
                kv_workers_free(w);
                return kv_fail(err, KV_EINTERNAL, "worker pool: cannot start thread %d of %d", i,
                               n_threads);
            }
            w->started++;
        }
    }
    *out = w;
    return KV_OK;
}

void kv_workers_free(kv_workers *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->started; i++) pthread_join(w->th[i], NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->th);
    free(w);
}

int kv_workers_count(const kv_workers *w) {
    return w ? w->n : 1;
}

/* One job of at most MAX_CHUNKS chunks, chunk indices offset by base. */
typedef struct shifted {
    kv_work_fn fn;
    void *ctx;
    int base;
} shifted;

static void run_shifted(void *p, int c, int tid) {
    shifted *s = p;
    s->fn(s->ctx, s->base + c, tid);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_one(kv_workers *w, int n_chunks, kv_work_fn fn, void *ctx) {
    uint32_t g = (atomic_load_explicit(&w->gen, memory_order_relaxed) + 1) & 0xffffffu;
    w->fn = fn;
    w->ctx = ctx;
    atomic_store_explicit(&w->done, 0, memory_order_relaxed);
    atomic_store_explicit(&w->claim, (uint64_t)g << GEN_SHIFT | (uint64_t)n_chunks << N_SHIFT,
                          memory_order_release);
    atomic_store_explicit(&w->gen, g, memory_order_release);
    pthread_mutex_lock(&w->mu);
    if (w->sleepers) pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    double t0 = now_s(), t1 = 0.0;
    work(w, g, 0);
    if (atomic_load_explicit(&w->done, memory_order_acquire) < n_chunks) {
        t1 = now_s();
        for (int s = 0; atomic_load_explicit(&w->done, memory_order_acquire) < n_chunks; s++) {
            if (s < KV_WORKERS_WAIT_SPIN)
                cpu_relax();
            else
                sched_yield();
        }
    }
    double t2 = now_s(), frac = t1 > 0.0 && t2 > t0 ? (t2 - t1) / (t2 - t0) : 0.0;
    w->wait_avg += (frac - w->wait_avg) / 8.0;
    if (w->wait_avg > KV_WORKERS_WAIT_FRACTION) {
        w->serial_left = KV_WORKERS_BACKOFF;
        w->wait_avg = 0.0;
    }
}

void kv_workers_run(kv_workers *w, int n_chunks, kv_work_fn fn, void *ctx) {
    if (n_chunks <= 0) return;
    if (!w || w->n <= 1 || n_chunks == 1 || w->serial_left > 0) {
        if (w && w->serial_left > 0 && n_chunks > 1) w->serial_left--;
        for (int c = 0; c < n_chunks; c++) fn(ctx, c, 0);
        return;
    }
    for (int base = 0; base < n_chunks; base += MAX_CHUNKS) {
        int n = n_chunks - base < MAX_CHUNKS ? n_chunks - base : MAX_CHUNKS;
        if (base == 0 && n == n_chunks) {
            run_one(w, n, fn, ctx);
        } else {
            shifted s = {fn, ctx, base};
            run_one(w, n, run_shifted, &s);
        }
    }
}
