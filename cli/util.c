/* Shared helpers of the kvplan commands (cli/cli.h). */
#include "cli.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int kv_cli_report(const char *cmd, const kv_error *err) {
    fprintf(stderr, "kvplan %s: %s\n", cmd, err->msg[0] ? err->msg : "failed");
    return err->code == KV_EINPUT ? 1 : 2;
}

void kv_cli_command_line(int argc, char **argv, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < argc && len + 1 < cap; i++) {
        int n = snprintf(buf + len, cap - len, "%s%s", i ? " " : "", argv[i]);
        if (n < 0) break;
        len += (size_t)n;
        if (len >= cap) len = cap - 1;
    }
}

uint64_t kv_cli_memory_limit(void) {
    uint64_t lim = 0;
    const int which[2] = {RLIMIT_AS, RLIMIT_DATA};
    for (int i = 0; i < 2; i++) {
        struct rlimit rl;
        if (getrlimit(which[i], &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
        if (!lim || (uint64_t)rl.rlim_cur < lim) lim = (uint64_t)rl.rlim_cur;
    }
    return lim;
}

int kv_cli_blas_ready(kv_error *err) {
    uint64_t lim = kv_cli_memory_limit();
    if (!lim) return KV_OK;
    void *probe = malloc((size_t)KV_CLI_BLAS_BUFFER_BYTES);
    if (!probe)
        return kv_fail(err, KV_EINTERNAL,
                       "out of memory: the BLAS library needs a %llu MiB work buffer beside the "
                       "model, which the memory limit of %llu MiB (ulimit -v) does not leave; "
                       "raise the limit",
                       (unsigned long long)(KV_CLI_BLAS_BUFFER_BYTES >> 20),
                       (unsigned long long)(lim >> 20));
    free(probe);
    /* large enough for OpenBLAS's blocked path (small sizes skip the buffer) */
    enum { N = 256 };
    float *a = calloc((size_t)3 * N * N, sizeof *a);
    if (!a) return kv_fail(err, KV_EINTERNAL, "out of memory: BLAS warm-up");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f,
                a + 2 * N * N, N);
    free(a);
    return KV_OK;
}

int kv_cli_load_model(const char *path, kv_model **m, kv_error *err) {
    int rc = kv_model_load(path, m, err);
    if (rc) return rc;
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    if ((!env || !*env) && kv_model_weight_bytes(*m) <= KV_CLI_SMALL_MODEL_BYTES)
        openblas_set_num_threads(1);
    return KV_OK;
}

int kv_cli_parse_qty(const char *s, const char *opt, double *out, kv_error *err) {
    if (!s || !*s) return kv_fail(err, KV_EINPUT, "%s needs a number", opt);
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v))
        return kv_fail(err, KV_EINPUT, "%s: '%s' is not a finite number", opt, s);
    double mul = 1.0;
    if (*end) {
        static const char units[] = "KMGT";
        const char *u = strchr(units, end[0] == 'k' ? 'K' : end[0]);
        if (!u || !end[0]) return kv_fail(err, KV_EINPUT, "%s: '%s' is not a number", opt, s);
        int bin = end[1] == 'i';
        const char *rest = end + 1 + bin;
        if (*rest == 'B') rest++;
        if (*rest) return kv_fail(err, KV_EINPUT, "%s: '%s' has an unknown suffix", opt, s);
        mul = pow(bin ? 1024.0 : 1000.0, (double)(u - units + 1));
    }
    *out = v * mul;
    return KV_OK;
}

int kv_cli_finish_tasks(const char *cmd, kv_tasks *tasks, int rc, const kv_error *err) {
    int code;
    if (kv_tasks_rank(tasks) != 0) { /* workers exit quietly with rank 0's code */
        code = kv_tasks_bcast_int(tasks, rc ? 1 : 0);
    } else {
        code = rc ? kv_cli_report(cmd, err) : 0;
        kv_tasks_bcast_int(tasks, code);
    }
    kv_tasks_finalize(tasks);
    return code;
}
