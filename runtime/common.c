/* kvplan common helpers: see include/kvplan/common.h. */
#include "kvplan/common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int kv_fail(kv_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int kv_fail_context(kv_error *err, const char *fmt, ...) {
    if (!err) return KV_EINTERNAL;
    char prefix[512];
    char old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t np = strlen(prefix);
    if (np > sizeof err->msg - 3) np = sizeof err->msg - 3;
    memcpy(err->msg, prefix, np);
    memcpy(err->msg + np, ": ", 2);
    size_t room = sizeof err->msg - np - 3, no = strlen(old);
    if (no > room) no = room;
    memcpy(err->msg + np + 2, old, no);
    err->msg[np + 2 + no] = '\0';
    if (err->code == KV_OK) err->code = KV_EINTERNAL;
    return err->code;
}

void kv_error_clear(kv_error *err) {
    if (!err) return;
    err->code = KV_OK;
    err->msg[0] = '\0';
}

void *kv_malloc(size_t bytes, const char *what, kv_error *err) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) kv_fail(err, KV_EINTERNAL, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *kv_calloc(size_t n, size_t size, const char *what, kv_error *err) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        kv_fail(err, KV_EINTERNAL, "out of memory allocating %zu x %zu bytes for %s", n, size,
                what);
    return p;
}

double kv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kv_progress_init(kv_progress *p, int quiet) {
    p->quiet = quiet;
    p->min_interval_s = 0.5;
    p->last_print_s = -1e9;
    p->start_s = kv_now();
    p->is_tty = isatty(2);
}

void kv_progress_print(kv_progress *p, int force, const char *fmt, ...) {
    if (!p || p->quiet) return;
    double now = kv_now();
    if (!force && now - p->last_print_s < p->min_interval_s) return;
    p->last_print_s = now;
    va_list ap;
    va_start(ap, fmt);
    if (p->is_tty) fputs("\r\033[K", stderr);
    vfprintf(stderr, fmt, ap);
    if (!p->is_tty) fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
}

void kv_progress_done(kv_progress *p) {
    if (!p || p->quiet) return;
    if (p->is_tty) fputc('\n', stderr);
    fflush(stderr);
}

int kv_read_file(const char *path, char **data, size_t *len, kv_error *err) {
    *data = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kv_fail(err, KV_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return kv_fail(err, KV_EINTERNAL, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return kv_fail(err, KV_EINTERNAL, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return kv_fail(err, KV_EINPUT, "%s: read error", path);
    }
    buf[n] = '\0';
    *data = buf;
    if (len) *len = n;
    return KV_OK;
}

static int sha256_feed(EVP_MD_CTX *ctx, const char *path, kv_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return kv_fail(err, KV_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(ctx, buf, got);
    int bad = ferror(f);
    fclose(f);
    if (bad) return kv_fail(err, KV_EINPUT, "%s: read error", path);
    return KV_OK;
}

int kv_sha256_files(const char *const *paths, int n, char hex[65], kv_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return kv_fail(err, KV_EINTERNAL, "OpenSSL: cannot initialise SHA-256");
    }
    for (int i = 0; i < n; i++) {
        int rc = sha256_feed(ctx, paths[i], err);
        if (rc) {
            EVP_MD_CTX_free(ctx);
            return rc;
        }
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < 32 && i < mdlen; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    hex[64] = '\0';
    return KV_OK;
}

int kv_sha256_file(const char *path, char hex[65], kv_error *err) {
    return kv_sha256_files(&path, 1, hex, err);
}

const char *kv_shared_dir(void) {
    const char *env = getenv("KVPLAN_SHARED");
    if (env && *env) return env;
    return KVPLAN_SHARED_DEFAULT;
}

int kv_temp_path(const char *final_path, char *tmp, size_t cap, kv_error *err) {
    int n = snprintf(tmp, cap, "%s.tmp.%ld", final_path, (long)getpid());
    if (n < 0 || (size_t)n >= cap) return kv_fail(err, KV_EINPUT, "%s: path too long", final_path);
    return KV_OK;
}

int kv_commit_file(const char *tmp, const char *final_path, kv_error *err) {
    if (rename(tmp, final_path) != 0) {
        int e = errno;
        remove(tmp);
        return kv_fail(err, KV_EINPUT, "%s: cannot move the finished file %s into place: %s",
                       final_path, tmp, strerror(e));
    }
    return KV_OK;
}

int kv_check_writable(const char *path, kv_error *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    if (access(dir, W_OK) != 0)
        return kv_fail(err, KV_EINPUT, "%s: cannot write here (directory %s: %s)", path, dir,
                       strerror(errno));
    return KV_OK;
}

int kv_parse_int(const char *s, const char *opt, long lo, long hi, long *out, kv_error *err) {
    if (!s || !*s) return kv_fail(err, KV_EINPUT, "%s needs a whole number", opt);
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end) return kv_fail(err, KV_EINPUT, "%s: '%s' is not a whole number", opt, s);
    if (v < lo || v > hi)
        return kv_fail(err, KV_EINPUT, "%s: %ld is out of range [%ld, %ld]", opt, v, lo, hi);
    *out = v;
    return KV_OK;
}

int kv_parse_double(const char *s, const char *opt, double lo, double hi, double *out,
                    kv_error *err) {
    if (!s || !*s) return kv_fail(err, KV_EINPUT, "%s needs a number", opt);
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return kv_fail(err, KV_EINPUT, "%s: '%s' is not a finite number", opt, s);
    if (v < lo || v > hi)
        return kv_fail(err, KV_EINPUT, "%s: %g is out of range [%g, %g]", opt, v, lo, hi);
    *out = v;
    return KV_OK;
}
