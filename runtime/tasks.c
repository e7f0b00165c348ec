/* kvplan tasks: a local loop or an on-demand MPI task farm. See include/kvplan/tasks.h. */
#include "kvplan/tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVPLAN_HAVE_MPI
#include <mpi.h>
#endif

struct kv_tasks {
    int rank, size;
    int own_init; /* this context called MPI_Init */
#ifdef KVPLAN_HAVE_MPI
    MPI_Comm comm;
#endif
};

#ifdef KVPLAN_HAVE_MPI
/* A launcher started this process (Open MPI's mpirun, a PMI / PMIx launcher, or Slurm). */
static int launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}
#endif

int kv_tasks_init(int *argc, char ***argv, kv_tasks **out, kv_error *err) {
    *out = NULL;
    kv_tasks *t = kv_calloc(1, sizeof *t, "task context", err);
    if (!t) return KV_EINTERNAL;
    t->size = 1;
#ifdef KVPLAN_HAVE_MPI
    if (launched()) {
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited) {
            if (MPI_Init(argc, argv) != MPI_SUCCESS) {
                free(t);
                return kv_fail(err, KV_EINTERNAL, "MPI_Init failed");
            }
            t->own_init = 1;
        }
        MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
        MPI_Comm_rank(t->comm, &t->rank);
        MPI_Comm_size(t->comm, &t->size);
    }
#else
    (void)argc;
    (void)argv;
#endif
    *out = t;
    return KV_OK;
}

void kv_tasks_finalize(kv_tasks *t) {
    if (!t) return;
#ifdef KVPLAN_HAVE_MPI
    if (t->size > 1 || t->own_init) MPI_Comm_free(&t->comm);
    if (t->own_init) MPI_Finalize();
#endif
    free(t);
}

int kv_tasks_rank(const kv_tasks *t) {
    return t ? t->rank : 0;
}
int kv_tasks_size(const kv_tasks *t) {
    return t ? t->size : 1;
}

int kv_tasks_bcast_int(const kv_tasks *t, int v) {
#ifdef KVPLAN_HAVE_MPI
    if (t && t->size > 1) MPI_Bcast(&v, 1, MPI_INT, 0, t->comm);
#else
    (void)t;
#endif
    return v;
}

int kv_tasks_agree(const kv_tasks *t, int rc, kv_error *err) {
#ifdef KVPLAN_HAVE_MPI
    if (!t || t->size == 1) return rc;
    int mine = rc ? t->rank : t->size, first = t->size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, t->comm);
    if (first == t->size) return KV_OK;
    int code = rc;
    char msg[sizeof((kv_error *)0)->msg];
    memset(msg, 0, sizeof msg);
    if (t->rank == first && err) memcpy(msg, err->msg, sizeof msg);
    MPI_Bcast(&code, 1, MPI_INT, first, t->comm);
    MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, first, t->comm);
    if (t->rank != first) {
        msg[sizeof msg - 1] = 0;
        kv_fail(err, code, "rank %d: %.1000s", first, msg);
    }
    return code;
#else
    (void)t;
    (void)err;
    return rc;
#endif
}

static int run_local(long n_tasks, int n_out, kv_task_fn fn, void *user, double *results,
                     kv_error *err) {
    for (long i = 0; i < n_tasks; i++) {
        int rc = fn(user, i, results + i * n_out, err);
        if (rc) return rc;
    }
    return KV_OK;
}

#ifdef KVPLAN_HAVE_MPI
enum { TAG_TASK = 1, TAG_RESULT = 2 };

/* A worker's answer: header, n_out doubles, the error message when rc != 0. */
typedef struct result_head {
    long task;
    int rc;
    int pad;
} result_head;

static size_t result_bytes(int n_out) {
    return sizeof(result_head) + (size_t)n_out * sizeof(double) + sizeof(((kv_error *)0)->msg);
}

/* Rank 0: hand out tasks on demand, compute tasks itself between answers, gather by index. */
static int run_master(kv_tasks *t, long n, int n_out, kv_task_fn fn, void *user, double *results,
                      kv_error *err) {
    int W = t->size;
    size_t rb = result_bytes(n_out);
    char *buf = kv_malloc(rb, "task result", err);
    int *outstanding = kv_calloc((size_t)W, sizeof *outstanding, "task farm", err);
    int *stopped = kv_calloc((size_t)W, sizeof *stopped, "task farm", err);
    if (!buf || !outstanding || !stopped) {
        /* still release the workers: they wait for a task */
        long stop = -1;
        for (int w = 1; w < W; w++) MPI_Send(&stop, 1, MPI_LONG, w, TAG_TASK, t->comm);
        free(buf);
        free(outstanding);
        free(stopped);
        return KV_EINTERNAL;
    }
    long next = 0, n_out_total = 0;
    int rc = KV_OK;
    /* give every worker two tasks: one to run, one in reserve */
    for (int k = 0; k < 2; k++)
        for (int w = 1; w < W; w++) {
            if (stopped[w]) continue;
            long task = next < n ? next++ : -1;
            MPI_Send(&task, 1, MPI_LONG, w, TAG_TASK, t->comm);
            if (task < 0)
                stopped[w] = 1;
            else
                outstanding[w]++, n_out_total++;
        }
    for (;;) {
        if (n_out_total == 0 && (next >= n || rc)) break;
        int flag = 1;
        if (next < n && !rc) {
            long task = next++;
            kv_error e1;
            kv_error_clear(&e1);
            int r = fn(user, task, results + task * n_out, &e1);
            if (r) {
                rc = r;
                if (err) *err = e1;
            }
            MPI_Iprobe(MPI_ANY_SOURCE, TAG_RESULT, t->comm, &flag, MPI_STATUS_IGNORE);
        }
        /* answer every worker that is waiting (blocking once rank 0 has nothing left to run) */
        while (flag && n_out_total > 0) {
            MPI_Status st;
            memset(buf, 0, rb);
            MPI_Recv(buf, (int)rb, MPI_BYTE, MPI_ANY_SOURCE, TAG_RESULT, t->comm, &st);
            int w = st.MPI_SOURCE;
            result_head h;
            memcpy(&h, buf, sizeof h);
            outstanding[w]--;
            n_out_total--;
            if (h.rc && !rc) {
                rc = h.rc;
                const char *msg = buf + sizeof h + (size_t)n_out * sizeof(double);
                kv_fail(err, h.rc, "rank %d, task %ld: %.900s", w, h.task, msg);
            } else if (!h.rc && h.task >= 0 && h.task < n) {
                memcpy(results + h.task * n_out, buf + sizeof h, (size_t)n_out * sizeof(double));
            }
            if (!stopped[w]) {
                long task = next < n && !rc ? next++ : -1;
                MPI_Send(&task, 1, MPI_LONG, w, TAG_TASK, t->comm);
                if (task < 0)
                    stopped[w] = 1;
                else
                    outstanding[w]++, n_out_total++;
            }
            if (next < n && !rc)
                MPI_Iprobe(MPI_ANY_SOURCE, TAG_RESULT, t->comm, &flag, MPI_STATUS_IGNORE);
        }
    }
    /* every worker got its stop already: each answer of a worker draws a task or the stop */
    for (int w = 1; w < W; w++)
        if (!stopped[w]) {
            long stop = -1;
            MPI_Send(&stop, 1, MPI_LONG, w, TAG_TASK, t->comm);
        }
    free(buf);
    free(outstanding);
    free(stopped);
    return rc;
}

/* Other ranks: run the tasks rank 0 sends (one in reserve) until the stop. */
static int run_worker(kv_tasks *t, int n_out, kv_task_fn fn, void *user, kv_error *err) {
    size_t rb = result_bytes(n_out);
    char *buf = kv_calloc(1, rb, "task result", err);
    int rc = buf ? KV_OK : KV_EINTERNAL;
    long cur = -1, nxt = -1;
    MPI_Recv(&cur, 1, MPI_LONG, 0, TAG_TASK, t->comm, MPI_STATUS_IGNORE);
    while (cur >= 0) {
        MPI_Request req;
        MPI_Irecv(&nxt, 1, MPI_LONG, 0, TAG_TASK, t->comm, &req);
        result_head h = {.task = cur, .rc = KV_OK};
        kv_error e1;
        kv_error_clear(&e1);
        if (buf) {
            memset(buf, 0, rb);
            h.rc = fn(user, cur, (double *)(void *)(buf + sizeof h), &e1);
            if (h.rc) {
                memcpy(buf + sizeof h + (size_t)n_out * sizeof(double), e1.msg, sizeof e1.msg);
                rc = h.rc;
            }
            memcpy(buf, &h, sizeof h);
            MPI_Send(buf, (int)rb, MPI_BYTE, 0, TAG_RESULT, t->comm);
        } else { /* out of memory for the answer: send the header alone */
            result_head oom = {.task = cur, .rc = KV_EINTERNAL};
            MPI_Send(&oom, (int)sizeof oom, MPI_BYTE, 0, TAG_RESULT, t->comm);
        }
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        cur = nxt;
    }
    free(buf);
    return rc;
}
#endif

int kv_tasks_run(kv_tasks *t, long n_tasks, int n_out, kv_task_fn fn, void *user, double *results,
                 kv_error *err) {
    if (n_out < 1 || n_tasks < 0 || !fn)
        return kv_fail(err, KV_EINPUT, "task list: need n_out >= 1, n_tasks >= 0 and a function");
    if (!t || t->size == 1) return run_local(n_tasks, n_out, fn, user, results, err);
#ifdef KVPLAN_HAVE_MPI
    int rc;
    if (t->rank == 0)
        rc = run_master(t, n_tasks, n_out, fn, user, results, err);
    else
        rc = run_worker(t, n_out, fn, user, err);
    /* every rank leaves with rank 0's code, message and results */
    MPI_Bcast(&rc, 1, MPI_INT, 0, t->comm);
    if (rc) {
        char msg[sizeof((kv_error *)0)->msg];
        memset(msg, 0, sizeof msg);
        if (t->rank == 0 && err) memcpy(msg, err->msg, sizeof msg);
        MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, t->comm);
        if (t->rank != 0 && err) {
            err->code = rc;
            memcpy(err->msg, msg, sizeof msg);
        }
        return rc;
    }
    if (n_tasks > 0) MPI_Bcast(results, (int)(n_tasks * n_out), MPI_DOUBLE, 0, t->comm);
    return KV_OK;
#else
    return run_local(n_tasks, n_out, fn, user, results, err);
#endif
}
