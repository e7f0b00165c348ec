/* Shared helpers of the kvplan commands (cli/cli.h). */
#include "cli.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* Length (2-4) of the valid UTF-8 multi-byte sequence at s, else 0 (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF). */
static int utf8_seq(const unsigned char *s) {
    unsigned c = s[0];
    int n = c >= 0xC2 && c <= 0xDF   ? 2
            : c >= 0xE0 && c <= 0xEF ? 3
            : c >= 0xF0 && c <= 0xF4 ? 4
                                     : 0;
    if (!n) return 0;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

char *kv_cli_clean_text(const char *s, int escape_controls) {
    size_t n = strlen(s);
    char *out = malloc(4 * n + 1);
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    while (*p) {
        int k = *p >= 0x80 ? utf8_seq(p) : 1;
        if (k > 1) {
            memcpy(out + o, p, (size_t)k);
            o += (size_t)k;
            p += k;
        } else if (k == 0) { /* a byte that is not UTF-8 */
            if (escape_controls)
                o += (size_t)snprintf(out + o, 5, "\\x%02x", *p);
            else
                memcpy(out + o, "\xef\xbf\xbd", 3), o += 3; /* U+FFFD */
            p++;
        } else if (escape_controls && (*p < 0x20 || *p == 0x7f)) {
            o += (size_t)snprintf(out + o, 5, "\\x%02x", *p);
            p++;
        } else {
            out[o++] = (char)*p++;
        }
    }
    out[o] = '\0';
    return out;
}

int kv_cli_report(const char *cmd, const kv_error *err) {
    /* messages carry strings from files: control characters and bytes that are not UTF-8
     * are shown as \xNN, so one message stays one printable line */
    char *clean = kv_cli_clean_text(err->msg[0] ? err->msg : "failed", 1);
    fprintf(stderr, "kvplan %s: %s\n", cmd, clean ? clean : err->msg);
    free(clean);
    return err->code == KV_EINPUT ? 1 : 2;
}

void kv_cli_plan_note(const char *cmd, const kv_plan *p) {
    if (!p || p->budget_sha256 || !p->source[0]) return;
    char *clean = kv_cli_clean_text(p->source, 1);
    fprintf(stderr,
            "kvplan %s: note: %s has no checksum (/budget@sha256; older plans have none): a "
            "damaged KV type or policy in it cannot be detected; remake it with kvplan search "
            "to add one\n",
            cmd, clean ? clean : p->source);
    free(clean);
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
    return kv_model_load(path, m, err);
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
