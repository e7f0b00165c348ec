/* kvplan tasks: a local loop or an on-demand MPI task farm. See include/kvplan/tasks.h. */
#include "kvplan/tasks.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#ifdef KVPLAN_HAVE_MPI
#include <mpi.h>
#endif

/* One logged task: its call, index, result count and where its results start in vals. */
typedef struct log_rec {
    int call, n_out;
    long task, off;
} log_rec;

/* The record header as written to the log (fixed-width, host byte order). */
typedef struct log_head {
    int32_t call, n_out;
    int64_t task;
} log_head;

/* Each record is its header, its n_out doubles and a CRC-32 (zlib's crc32, uint32 in host
 * byte order) of those header and value bytes. */
static const char log_magic[] = "kvplan task log 3\n";

static uint32_t record_crc(const log_head *h, const double *vals) {
    uLong c = crc32(0L, Z_NULL, 0);
    c = crc32(c, (const Bytef *)h, (uInt)sizeof *h);
    c = crc32(c, (const Bytef *)vals, (uInt)((size_t)h->n_out * sizeof *vals));
    return (uint32_t)c;
}

struct kv_tasks {
    int rank, size;
    int own_init;   /* this context called MPI_Init */
    int call;       /* kv_tasks_run calls so far */
    long resumed;   /* tasks taken from the log */
    long discarded; /* bytes of an earlier run's log that a run without resume replaced */
    FILE *log;      /* rank 0: the open task log, or NULL */
    char *log_path;
    log_rec *recs; /* logged results read at a resume [n_recs], owned */
    long n_recs;
    double *vals; /* their values, owned */
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

#ifdef KVPLAN_HAVE_MPI
/* Message tags: tasks, their results, the end of a kv_tasks_run call, kv_tasks_bcast_int. */
enum {
    TAG_TASK = 1,
    TAG_RESULT = 2,
    TAG_END_RC = 3,
    TAG_END_MSG = 4,
    TAG_END_RES = 5,
    TAG_INT = 6
};

/* Waiting without spinning: MPI's blocking calls poll the network on a core the whole time,
 * which on a shared machine takes a core from the ranks (or other jobs) that have work. These
 * waits test, then sleep 0.2 ms, and test again. */
static void nap(void) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

static void wait_quiet(MPI_Request *req) {
    int done = 0;
    for (;;) {
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        nap();
    }
}

/* Rank 0's buf [count] to every rank (point to point, the others waiting quietly). */
static void bcast_quiet(const kv_tasks *t, void *buf, int count, MPI_Datatype type, int tag) {
    if (t->rank == 0) {
        for (int w = 1; w < t->size; w++) MPI_Send(buf, count, type, w, tag, t->comm);
        return;
    }
    MPI_Request req;
    MPI_Irecv(buf, count, type, 0, tag, t->comm, &req);
    wait_quiet(&req);
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

void kv_tasks_log_close(kv_tasks *t, int remove) {
    if (!t) return;
    if (t->log && remove && t->log_path) {
        /* only the file this run wrote (and still holds locked), never one renamed over it */
        struct stat mine, now;
        if (fstat(fileno(t->log), &mine) == 0 && lstat(t->log_path, &now) == 0 &&
            mine.st_dev == now.st_dev && mine.st_ino == now.st_ino)
            unlink(t->log_path);
    }
    if (t->log) fclose(t->log); /* releases the lock */
    t->log = NULL;
    free(t->log_path);
    t->log_path = NULL;
    free(t->recs);
    free(t->vals);
    t->recs = NULL;
    t->vals = NULL;
    t->n_recs = 0;
}

long kv_tasks_resumed(const kv_tasks *t) {
    return t ? t->resumed : 0;
}

/* Names of the fields ("name=value", separated by spaces) of `want` that `have` lacks or
 * gives another value, comma-separated into out (at most cap bytes). */
static void key_diff(const char *have, const char *want, char *out, size_t cap) {
    out[0] = '\0';
    size_t used = 0;
    for (const char *w = want; *w;) {
        while (*w == ' ') w++;
        size_t wl = strcspn(w, " ");
        if (!wl) break;
        const char *eq = memchr(w, '=', wl);
        size_t nl = eq ? (size_t)(eq - w) : wl;
        int same = 0;
        for (const char *h = have; *h && !same;) {
            while (*h == ' ') h++;
            size_t hl = strcspn(h, " ");
            if (!hl) break;
            if (hl == wl && !memcmp(h, w, wl)) same = 1;
            h += hl;
        }
        if (!same && used + nl + 3 < cap) {
            if (used) out[used++] = ',', out[used++] = ' ';
            memcpy(out + used, w, nl);
            used += nl;
            out[used] = '\0';
        }
        w += wl;
    }
    if (!out[0]) snprintf(out, cap, "the run's settings");
}

static int log_damaged(kv_error *err, const char *path, const char *what) {
    return kv_fail(err, KV_EINPUT,
                   "%s: the task log is damaged (%s); delete it or run without --resume", path,
                   what);
}

/* Read the records of an existing log whose key matches; *valid_end: bytes of whole records.
 * A complete record that is not valid (bad header, non-finite value, a step number going
 * back, a repeated task, another result count within one step) refuses the whole log; only a
 * torn last record (a kill during its write) is cut off. */
static int log_read(kv_tasks *t, FILE *f, const char *path, const char *key, long *valid_end,
                    kv_error *err) {
    char line[KV_TASKS_KEY_MAX + 2];
    size_t klen = strlen(key);
    if (!fgets(line, sizeof line, f) || strcmp(line, log_magic) != 0) {
        if (!strncmp(line, "kvplan task log ", 16))
            return kv_fail(err, KV_EINPUT,
                           "%s: a task log of another kvplan version; delete it or run without "
                           "--resume",
                           path);
        return kv_fail(err, KV_EINPUT,
                       "%s: not a kvplan task log; delete it or run without --resume", path);
    }
    if (!fgets(line, sizeof line, f) || !strchr(line, '\n'))
        return log_damaged(err, path, "its key line is cut or too long");
    line[strcspn(line, "\n")] = '\0';
    if (strlen(line) != klen || memcmp(line, key, klen) != 0) {
        char diff[512];
        key_diff(line, key, diff, sizeof diff);
        return kv_fail(err, KV_EINPUT,
                       "%s: the task log belongs to another run (changed since it was written: "
                       "%s); run the same command on the same inputs with --resume, or drop "
                       "--resume to start afresh",
                       path, diff);
    }
    *valid_end = ftell(f);
    long cap_r = 0, cap_v = 0, n_v = 0;
    for (;;) {
        log_head h;
        if (fread(&h, sizeof h, 1, f) != 1) break; /* the end, or a torn header */
        if (h.n_out < 1 || h.n_out > KV_TASKS_MAX_OUT || h.task < 0 || h.task > INT64_MAX / 2 ||
            h.call < 1)
            return log_damaged(err, path, "a record header out of range");
        if (t->n_recs > 0) {
            const log_rec *prev = &t->recs[t->n_recs - 1];
            if (h.call < prev->call) return log_damaged(err, path, "a step number goes back");
            if (h.call == prev->call && h.n_out != prev->n_out)
                return log_damaged(err, path, "two result counts in one step");
        }
        if (t->n_recs == cap_r) {
            cap_r = cap_r ? 2 * cap_r : 256;
            log_rec *nr = realloc(t->recs, (size_t)cap_r * sizeof *nr);
            if (!nr) return kv_fail(err, KV_EINTERNAL, "out of memory: task log");
            t->recs = nr;
        }
        if (n_v + h.n_out > cap_v) {
            cap_v = 2 * (cap_v + h.n_out);
            double *nv = realloc(t->vals, (size_t)cap_v * sizeof *nv);
            if (!nv) return kv_fail(err, KV_EINTERNAL, "out of memory: task log");
            t->vals = nv;
        }
        uint32_t crc;
        if (fread(t->vals + n_v, sizeof(double), (size_t)h.n_out, f) != (size_t)h.n_out ||
            fread(&crc, sizeof crc, 1, f) != 1)
            break; /* a torn last record: cut off below */
        if (crc != record_crc(&h, t->vals + n_v))
            return log_damaged(err, path, "a record whose CRC-32 does not match its bytes");
        for (int i = 0; i < h.n_out; i++)
            if (!isfinite(t->vals[n_v + i]))
                return log_damaged(err, path, "a value that is not a finite number");
        t->recs[t->n_recs++] = (log_rec){h.call, h.n_out, (long)h.task, n_v};
        n_v += h.n_out;
        *valid_end = ftell(f);
    }
    if (ferror(f))
        return kv_fail(err, KV_EINPUT, "%s: cannot read the task log: %s", path, strerror(errno));
    return KV_OK;
}

/* Refuse a log name that is not ours to write: a symbolic link, anything but a regular file,
 * or one of the inputs (same st_dev / st_ino). *exists: a regular file is there. */
static int log_check_name(const char *path, const char *const *inputs, int n_inputs, int *exists,
                          struct stat *ls, kv_error *err) {
    *exists = 0;
    if (lstat(path, ls) != 0) {
        if (errno == ENOENT) return KV_OK;
        return kv_fail(err, KV_EINPUT, "%s: cannot use this task log name: %s", path,
                       strerror(errno));
    }
    if (S_ISLNK(ls->st_mode))
        return kv_fail(err, KV_EINPUT,
                       "%s: the task log name is a symbolic link, which kvplan does not follow; "
                       "remove it or choose another -o",
                       path);
    if (!S_ISREG(ls->st_mode))
        return kv_fail(err, KV_EINPUT,
                       "%s: the task log name is %s, not a task log; remove it or choose "
                       "another -o",
                       path, kv_file_kind(ls->st_mode));
    for (int i = 0; i < n_inputs; i++) {
        struct stat si;
        if (!inputs || !inputs[i] || stat(inputs[i], &si) != 0) continue;
        if (si.st_dev == ls->st_dev && si.st_ino == ls->st_ino)
            return kv_fail(err, KV_EINPUT,
                           "%s: the task log name is the input file %s; the log would destroy "
                           "it: choose another -o",
                           path, inputs[i]);
    }
    *exists = 1;
    return KV_OK;
}

/* Take the log's lock (flock, exclusive, not waiting): KV_EINPUT when another run holds it. */
static int log_lock(int fd, const char *path, kv_error *err) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return KV_OK;
    if (errno == EWOULDBLOCK)
        return kv_fail(err, KV_EINPUT,
                       "%s: another kvplan run is writing this output (it holds the task log's "
                       "lock); wait for it to finish or choose another -o",
                       path);
    return kv_fail(err, KV_EINPUT, "%s: cannot lock the task log: %s", path, strerror(errno));
}

/* An existing log that a run without resume would replace: refused while another run holds
 * it, else its size is noted in t->discarded (the command says so). */
static int log_check_idle(kv_tasks *t, const char *path, const struct stat *ls, kv_error *err) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return KV_OK; /* gone meanwhile: nothing to discard */
    int rc = log_lock(fd, path, err);
    close(fd);
    if (!rc) t->discarded = ls->st_size > 0 ? (long)ls->st_size : 1;
    return rc;
}

/* Resume: open the regular file that was checked (O_NOFOLLOW, O_NONBLOCK: no symlink, no
 * waiting on a FIFO swapped in since) and read it. */
static int log_resume(kv_tasks *t, const char *path, const char *key, const struct stat *ls,
                      kv_error *err) {
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != ls->st_dev ||
        st.st_ino != ls->st_ino) {
        int e = errno;
        if (fd >= 0) close(fd);
        return kv_fail(err, KV_EINPUT, "%s: cannot open the task log: %s", path,
                       fd < 0 ? strerror(e) : "it was replaced while being opened");
    }
    int rc = log_lock(fd, path, err);
    if (rc) {
        close(fd);
        return rc;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "r+b");
    if (!f) {
        close(fd);
        return kv_fail(err, KV_EINTERNAL, "%s: cannot open the task log: %s", path,
                       strerror(errno));
    }
    long end = 0;
    rc = log_read(t, f, path, key, &end, err);
    if (!rc && (fflush(f) || ftruncate(fileno(f), end) || fseek(f, end, SEEK_SET)))
        rc = kv_fail(err, KV_EINPUT, "%s: cannot truncate the task log: %s", path, strerror(errno));
    if (rc) {
        fclose(f);
        return rc;
    }
    t->log = f;
    return KV_OK;
}

/* A fresh log: its header written and fsync'd in a temporary file (O_EXCL | O_NOFOLLOW,
 * kv_temp_create), renamed over the name, so a planted file is replaced, never written. */
/* Put the finished temporary log at `path`: where no log was, with link(2), which fails when
 * another run has created one since (refused: that log is never replaced); over an earlier
 * run's log (checked unlocked), with rename(2). */
static int log_place(const char *tmp, const char *path, int was_there, kv_error *err) {
    if (!was_there) {
        if (link(tmp, path) == 0) {
            unlink(tmp);
            return KV_OK;
        }
        if (errno == EEXIST) {
            unlink(tmp);
            return kv_fail(err, KV_EINPUT,
                           "%s: another kvplan run started on this output at the same time (its "
                           "task log appeared); wait for it to finish or choose another -o",
                           path);
        } /* a file system without hard links: rename */
    }
    return kv_commit_file(tmp, path, err);
}

static int log_create(kv_tasks *t, const char *path, const char *key, int was_there,
                      kv_error *err) {
    char tmp[PATH_MAX + 64];
    int fd = -1;
    int rc = kv_temp_create(path, tmp, sizeof tmp, &fd, err);
    if (rc) return rc;
    rc = log_lock(fd, tmp, err); /* held from before the rename until the log is closed */
    size_t nm = strlen(log_magic), nk = strlen(key);
    char *head = rc ? NULL : kv_malloc(nm + nk + 2, "task log", err);
    if (!rc && !head) rc = KV_EINTERNAL;
    if (!rc) {
        memcpy(head, log_magic, nm);
        memcpy(head + nm, key, nk);
        head[nm + nk] = '\n';
        rc = kv_write_all(fd, head, nm + nk + 1, tmp, err);
    }
    free(head);
    if (!rc) rc = log_place(tmp, path, was_there, err);
    if (rc) {
        close(fd);
        unlink(tmp);
        return kv_fail_context(err, "%s: the task log was not created", path);
    }
    t->log = fdopen(fd, "ab");
    if (!t->log) {
        close(fd);
        return kv_fail(err, KV_EINTERNAL, "%s: cannot open the task log: %s", path,
                       strerror(errno));
    }
    return KV_OK;
}

int kv_tasks_log_path(const char *out, char *path, size_t cap, kv_error *err) {
    if (!out || !*out) return kv_fail(err, KV_EINPUT, "the task log needs an output name (-o)");
    const char *slash = strrchr(out, '/');
    const char *base = slash ? slash + 1 : out;
    size_t nb = strlen(base);
    int n;
    if (nb + 6 <= NAME_MAX) {
        n = snprintf(path, cap, "%s.tasks", out);
    } else { /* OUT.tasks would be too long a name: a prefix and a hash of the whole name */
        char hex[65];
        const void *bufs[1] = {base};
        const char *names[1] = {out};
        int rc = kv_sha256_parts(names, bufs, &nb, 1, hex, err);
        if (rc) return rc;
        size_t keep = NAME_MAX - 6 - 17;
        n = snprintf(path, cap, "%.*s%.*s.%.16s.tasks", (int)(base - out), out, (int)keep, base,
                     hex);
    }
    if (n < 0 || (size_t)n >= cap) return kv_fail(err, KV_EINPUT, "%s: path too long", out);
    return KV_OK;
}

int kv_tasks_log_open(kv_tasks *t, const char *path, const char *key, int resume,
                      const char *const *inputs, int n_inputs, kv_error *err) {
    if (!t || t->rank != 0) return KV_OK;
    kv_tasks_log_close(t, 0);
    if (!path || !*path) return kv_fail(err, KV_EINPUT, "no task log name given");
    if (strchr(key, '\n') || strlen(key) > KV_TASKS_KEY_MAX)
        return kv_fail(err, KV_EINPUT, "task log key: one line of at most %d characters",
                       KV_TASKS_KEY_MAX);
    struct stat ls;
    int exists = 0;
    int rc = log_check_name(path, inputs, n_inputs, &exists, &ls, err);
    if (rc) return rc;
    t->log_path = kv_malloc(strlen(path) + 1, "task log", err);
    if (!t->log_path) return KV_EINTERNAL;
    strcpy(t->log_path, path);
    t->discarded = 0;
    if (resume && exists)
        rc = log_resume(t, path, key, &ls, err);
    else if (!(rc = exists ? log_check_idle(t, path, &ls, err) : KV_OK))
        rc = log_create(t, path, key, exists, err);
    if (rc) kv_tasks_log_close(t, 0);
    return rc;
}

long kv_tasks_log_discarded(const kv_tasks *t) {
    return t ? t->discarded : 0;
}

/* Append one finished task to the log (rank 0), fsync'd. */
static int log_append(kv_tasks *t, long task, int n_out, const double *vals, kv_error *err) {
    if (!t || !t->log) return KV_OK;
    log_head h = {t->call, n_out, task};
    uint32_t crc = record_crc(&h, vals);
    if (fwrite(&h, sizeof h, 1, t->log) != 1 ||
        fwrite(vals, sizeof(double), (size_t)n_out, t->log) != (size_t)n_out ||
        fwrite(&crc, sizeof crc, 1, t->log) != 1 || fflush(t->log) || fsync(fileno(t->log)))
        return kv_fail(err, KV_EINTERNAL, "%s: cannot append to the task log: %s", t->log_path,
                       strerror(errno));
    return KV_OK;
}

void kv_tasks_finalize(kv_tasks *t) {
    if (!t) return;
    kv_tasks_log_close(t, 0);
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
    /* the other ranks wait here while rank 0 alone writes files or probes the hardware */
    if (t && t->size > 1) bcast_quiet(t, &v, 1, MPI_INT, TAG_INT);
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

static int run_local(kv_tasks *t, const long *todo, long n_todo, int n_out, kv_task_fn fn,
                     void *user, double *results, kv_error *err) {
    for (long i = 0; i < n_todo; i++) {
        double *r = results + todo[i] * n_out;
        int rc = fn(user, todo[i], r, err);
        if (!rc) rc = log_append(t, todo[i], n_out, r, err);
        if (rc) return rc;
    }
    return KV_OK;
}

#ifdef KVPLAN_HAVE_MPI

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
static int run_master(kv_tasks *t, long n_tasks, const long *todo, long n, int n_out, kv_task_fn fn,
                      void *user, double *results, kv_error *err) {
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
            long task = next < n ? todo[next++] : -1;
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
            long task = todo[next++];
            kv_error e1;
            kv_error_clear(&e1);
            int r = fn(user, task, results + task * n_out, &e1);
            if (!r) r = log_append(t, task, n_out, results + task * n_out, &e1);
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
            for (int there = 0;;) { /* wait quietly when rank 0 has nothing left to run */
                MPI_Iprobe(MPI_ANY_SOURCE, TAG_RESULT, t->comm, &there, MPI_STATUS_IGNORE);
                if (there) break;
                nap();
            }
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
            } else if (!h.rc && h.task >= 0 && h.task < n_tasks) {
                memcpy(results + h.task * n_out, buf + sizeof h, (size_t)n_out * sizeof(double));
                int r = log_append(t, h.task, n_out, results + h.task * n_out, err);
                if (r && !rc) rc = r;
            }
            if (!stopped[w]) {
                long task = next < n && !rc ? todo[next++] : -1;
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
    MPI_Request first;
    MPI_Irecv(&cur, 1, MPI_LONG, 0, TAG_TASK, t->comm, &first);
    wait_quiet(&first);
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
        wait_quiet(&req);
        cur = nxt;
    }
    free(buf);
    return rc;
}
#endif

/* Take the logged results of this call into results; a record that does not fit this task
 * list (another result count, a task beyond it, a repeat, a value outside [lo, hi]) refuses
 * the log. */
static int take_logged(kv_tasks *t, long n_tasks, int n_out, const double *los, const double *his,
                       double *results, char *have, kv_error *err) {
    for (long r = 0; r < t->n_recs; r++) {
        const log_rec *x = &t->recs[r];
        if (x->call != t->call) continue;
        if (x->n_out != n_out || x->task >= n_tasks)
            return kv_fail(err, KV_EINPUT,
                           "%s: task %ld of step %d in the task log (%d values) does not fit "
                           "the run's step of %ld tasks of %d values each; the log is damaged: "
                           "delete it or run without --resume",
                           t->log_path, x->task, x->call, x->n_out, n_tasks, n_out);
        if (have[x->task])
            return kv_fail(err, KV_EINPUT,
                           "%s: task %ld of step %d is in the task log twice; the log is "
                           "damaged: delete it or run without --resume",
                           t->log_path, x->task, x->call);
        for (int i = 0; i < n_out; i++) {
            double v = t->vals[x->off + i], lo = los[i], hi = his[i];
            if (v >= lo && v <= hi) continue;
            char lo_s[40], hi_s[40];
            if (lo == DBL_MIN)
                snprintf(lo_s, sizeof lo_s, "(0");
            else if (lo == -DBL_MAX)
                snprintf(lo_s, sizeof lo_s, "(-inf");
            else
                snprintf(lo_s, sizeof lo_s, "[%g", lo);
            if (hi == DBL_MAX)
                snprintf(hi_s, sizeof hi_s, "inf)");
            else
                snprintf(hi_s, sizeof hi_s, "%g]", hi);
            return kv_fail(err, KV_EINPUT,
                           "%s: task %ld of step %d in the task log has the value %g, outside "
                           "%s, %s; the log is damaged: delete it or run without --resume",
                           t->log_path, x->task, x->call, v, lo_s, hi_s);
        }
        memcpy(results + x->task * n_out, t->vals + x->off, (size_t)n_out * sizeof(double));
        have[x->task] = 1;
    }
    for (long i = 0; i < n_tasks; i++) t->resumed += have[i];
    return KV_OK;
}

int kv_tasks_run(kv_tasks *t, long n_tasks, int n_out, kv_task_fn fn, void *user, double *results,
                 kv_error *err) {
    return kv_tasks_run_range(t, n_tasks, n_out, -DBL_MAX, DBL_MAX, fn, user, results, err);
}

int kv_tasks_run_range(kv_tasks *t, long n_tasks, int n_out, double lo, double hi, kv_task_fn fn,
                       void *user, double *results, kv_error *err) {
    if (n_out < 1 || n_out > KV_TASKS_MAX_OUT)
        return kv_fail(err, KV_EINPUT, "task list: need 1 <= n_out <= %d", KV_TASKS_MAX_OUT);
    double *los = kv_malloc((size_t)n_out * 2 * sizeof *los, "task ranges", err);
    if (!los) return KV_EINTERNAL;
    for (int i = 0; i < n_out; i++) los[i] = lo, los[n_out + i] = hi;
    int rc = kv_tasks_run_ranges(t, n_tasks, n_out, los, los + n_out, fn, user, results, err);
    free(los);
    return rc;
}

int kv_tasks_run_ranges(kv_tasks *t, long n_tasks, int n_out, const double *lo, const double *hi,
                        kv_task_fn fn, void *user, double *results, kv_error *err) {
    int ordered = lo && hi;
    for (int i = 0; ordered && i < n_out; i++) ordered = lo[i] <= hi[i];
    if (n_out < 1 || n_tasks < 0 || !fn || !ordered)
        return kv_fail(err, KV_EINPUT,
                       "task list: need n_out >= 1, n_tasks >= 0, lo <= hi and a function");
    if (t) t->call++;
    int rc = KV_OK;
    long *todo = NULL, n_todo = 0;
    if (!t || t->rank == 0) { /* the tasks the log does not answer */
        todo = kv_malloc((size_t)(n_tasks > 0 ? n_tasks : 1) * sizeof *todo, "task list", err);
        char *have = kv_calloc((size_t)(n_tasks > 0 ? n_tasks : 1), 1, "task list", err);
        if (!todo || !have) rc = KV_EINTERNAL;
        if (!rc && t && t->n_recs > 0)
            rc = take_logged(t, n_tasks, n_out, lo, hi, results, have, err);
        for (long i = 0; !rc && i < n_tasks; i++)
            if (!have[i]) todo[n_todo++] = i;
        free(have);
    }
    if (!t || t->size == 1) {
        if (!rc) rc = run_local(t, todo, n_todo, n_out, fn, user, results, err);
        free(todo);
        return rc;
    }
#ifdef KVPLAN_HAVE_MPI
    if (t->rank == 0)
        /* on an error here the workers are still released (no tasks, then the stop) */
        rc = rc ? (run_master(t, n_tasks, todo, 0, n_out, fn, user, results, err), rc)
                : run_master(t, n_tasks, todo, n_todo, n_out, fn, user, results, err);
    else
        rc = run_worker(t, n_out, fn, user, err);
    free(todo);
    /* every rank leaves with rank 0's code, message and results */
    bcast_quiet(t, &rc, 1, MPI_INT, TAG_END_RC);
    if (rc) {
        char msg[sizeof((kv_error *)0)->msg];
        memset(msg, 0, sizeof msg);
        if (t->rank == 0 && err) memcpy(msg, err->msg, sizeof msg);
        bcast_quiet(t, msg, (int)sizeof msg, MPI_CHAR, TAG_END_MSG);
        if (t->rank != 0 && err) {
            err->code = rc;
            memcpy(err->msg, msg, sizeof msg);
        }
        return rc;
    }
    if (n_tasks > 0) bcast_quiet(t, results, (int)(n_tasks * n_out), MPI_DOUBLE, TAG_END_RES);
    return KV_OK;
#else
    free(todo);
    return rc;
#endif
}
