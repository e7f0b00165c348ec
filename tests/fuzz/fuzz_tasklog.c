/* libFuzzer target: the resume log reader (runtime/util/tasks.c, issue 25): the input is a
 * task log PLAN.h5.tasks, opened with kv_tasks_log_open(resume = 1) and then consumed by three
 * kv_tasks_run_range calls of different shapes, as a resumed search would. Whatever the log
 * holds, every result handed back must lie in the call's range: a logged value that slipped
 * past the checks (NaN, 0 for an NLL sum, a wrong count) aborts, which libFuzzer reports.
 * Inputs of odd size get their records' CRC-32s fixed first (fix_crcs).
 * The log lives in a private directory (on /dev/shm when there is one: the appends are
 * fsync'd) made once per process. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "fuzz_util.h"
#include "kvplan/tasks.h"

static char dir[64], path[128];

/* the private directory goes when the fuzzer exits */
static void cleanup(void) {
    remove(path);
    rmdir(dir);
}

/* task t's results: t + 1 + k / 8 for k < n_out (positive, finite) */
static int task_fn(void *user, long task, double *out, kv_error *err) {
    (void)err;
    int n_out = *(const int *)user;
    for (int k = 0; k < n_out; k++) out[k] = (double)task + 1.0 + k / 8.0;
    return KV_OK;
}

/* An input of odd size has the CRC-32 of every complete record set right (as the writer
 * does), so that the checks behind the CRC are reached; an even one is taken as it is. */
static void fix_crcs(uint8_t *d, size_t n) {
    size_t at = 0;
    for (int line = 0; line < 2; line++) {
        const uint8_t *nl = at < n ? memchr(d + at, '\n', n - at) : NULL;
        if (!nl) return;
        at = (size_t)(nl - d) + 1;
    }
    while (at + 16 <= n) {
        int32_t n_out;
        memcpy(&n_out, d + at + 4, 4);
        if (n_out < 1 || n_out > KV_TASKS_MAX_OUT) return;
        size_t len = 16 + 8 * (size_t)n_out;
        if (at + len + 4 > n) return;
        uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), d + at, (uInt)len);
        memcpy(d + at + len, &crc, 4);
        at += len + 4;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        struct stat st;
        snprintf(dir, sizeof dir, "%s/kvplan-fuzz-tasklog.XXXXXX",
                 stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir)) abort();
        snprintf(path, sizeof path, "%s/plan.h5.tasks", dir);
        atexit(cleanup);
    }
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    if (size & 1) fix_crcs(copy, size);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (fwrite(copy, 1, size, f) != size || fclose(f) != 0) abort();
    free(copy);
    kv_error err = {0};
    kv_tasks *t = NULL;
    if (kv_tasks_init(NULL, NULL, &t, &err)) abort();
    /* the key of the seeds; a mutated key line is refused, which is part of the reader */
    const char *key = "format=fuzz-1 model=ab12 text=cd34";
    if (kv_tasks_log_open(t, path, key, 1, NULL, 0, &err) == KV_OK) {
        /* three steps: 6 NLL-like tasks of 1 value in (0, inf), 3 tasks of 2 finite values,
         * 4 tasks of 1 value in [1, 10] */
        const struct {
            long n;
            int n_out;
            double lo, hi;
        } steps[3] = {{6, 1, DBL_MIN, DBL_MAX}, {3, 2, -DBL_MAX, DBL_MAX}, {4, 1, 1.0, 10.0}};
        for (int s = 0; s < 3; s++) {
            double res[16];
            int n_out = steps[s].n_out;
            if (kv_tasks_run_range(t, steps[s].n, n_out, steps[s].lo, steps[s].hi, task_fn, &n_out,
                                   res, &err) != KV_OK)
                break;
            for (long i = 0; i < steps[s].n * n_out; i++)
                if (!(res[i] >= steps[s].lo && res[i] <= steps[s].hi)) abort();
        }
    }
    kv_tasks_finalize(t);
    return 0;
}
