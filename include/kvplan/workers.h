/* kvplan worker pool: one persistent set of threads per CPU backend for the runtime's matmuls
 * and attention. The threads start once (kv_workers_new) and sleep between
 * jobs; a job is a number of independent chunks, handed out one at a time from a shared
 * counter, so a thread that the OS has descheduled (a shared machine) only delays the chunk it
 * holds: the others, the caller included, take the rest. No fork of a parallel region per
 * call, no global state: the pool belongs to its owner (the CPU backend) and is used by one
 * calling thread at a time.
 *
 * Determinism: the pool decides only which thread runs a chunk, never what a chunk computes.
 * Callers cut their work into chunks that do not depend on the thread count and write disjoint
 * outputs, so results are the same bits for any number of threads (tests/test_workers.c,
 * tests/test_quant.c).
 *
 * BLAS: chunks may call cblas; the process's OpenBLAS should then run on one thread, else its
 * threads and the pool's contend for the same cores (the CPU backend sets it so,
 * runtime/backend/backend_cpu.c). */
#ifndef KVPLAN_WORKERS_H
#define KVPLAN_WORKERS_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef struct kv_workers kv_workers;

/* One chunk of a job: chunk index in [0, n_chunks), tid the running thread's index in
 * [0, kv_workers_count) (0 is the caller), for per-thread scratch. */
typedef void (*kv_work_fn)(void *ctx, int chunk, int tid);

/* Threads the process may run on: the CPUs of its affinity mask (sched_getaffinity), at least 1
 * (sysconf(_SC_NPROCESSORS_ONLN) where the mask cannot be read). */
int kv_cpus_available(void);

/* A pool of n_threads threads in all: the caller and n_threads - 1 workers (n_threads <= 0:
 * kv_cpus_available()). n_threads > KV_WORKERS_MAX is refused. Caller owns *out
 * (kv_workers_free). Errors: KV_EINPUT for too many threads, KV_EINTERNAL when a thread or
 * memory cannot be had. */
#define KV_WORKERS_MAX 256
int kv_workers_new(int n_threads, kv_workers **out, kv_error *err);
/* Stop and join the workers. NULL is allowed. */
void kv_workers_free(kv_workers *w);
/* Threads of the pool, the caller included (1 for NULL). */
int kv_workers_count(const kv_workers *w);

/* Run fn(ctx, c, tid) for every chunk c in [0, n_chunks) and return when all have finished.
 * The caller takes chunks too. w NULL, one thread or n_chunks 1: a plain loop on the caller.
 * Chunks run in no particular order and concurrently: each must write only its own outputs.
 * Not reentrant: fn must not call kv_workers_run on the same pool. */
void kv_workers_run(kv_workers *w, int n_chunks, kv_work_fn fn, void *ctx);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
