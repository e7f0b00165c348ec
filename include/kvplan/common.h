/* kvplan common: error reporting, progress, files, hashing.
 *
 * Errors travel as return codes with a message: every fallible function takes a
 * `kv_error *err` (may be NULL), fills it on failure and returns one of the KV_E* codes.
 * Library code never calls exit(). The CLI maps KV_EINPUT to exit code 1 and anything else
 * non-zero to exit code 2 (DESIGN.md, CLI).
 */
#ifndef KVPLAN_COMMON_H
#define KVPLAN_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KV_OK = 0,
    KV_EINPUT = 1,    /* bad input from the user: files, arguments, plans (exit code 1) */
    KV_EINTERNAL = 2, /* failure inside kvplan or its libraries, out of memory (exit code 2) */
};

/* One error: a code and a human-readable message naming the file and what to do. */
typedef struct kv_error {
    int code;
    char msg[1024];
} kv_error;

/* Fill `err` (if not NULL) with `code` and a printf-style message; returns `code`. */
int kv_fail(kv_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefix the existing message in `err` with more context ("while X: <old message>"). */
int kv_fail_context(kv_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset an error to KV_OK with an empty message. */
void kv_error_clear(kv_error *err);

/* Allocation helpers: on failure set `err` to KV_EINTERNAL ("out of memory: <what>") and return
 * NULL. The caller owns the returned memory and releases it with free(). */
void *kv_malloc(size_t bytes, const char *what, kv_error *err);
void *kv_calloc(size_t n, size_t size, const char *what, kv_error *err);

/* Progress on stderr for long work. A NULL or quiet reporter prints nothing. Lines are
 * rewritten in place on a terminal (\r) and printed one per call otherwise, at most every
 * `min_interval_s` seconds unless `force` is set. */
typedef struct kv_progress {
    int quiet;
    double min_interval_s;
    double last_print_s;
    double start_s;
    int is_tty;
} kv_progress;
void kv_progress_init(kv_progress *p, int quiet);
void kv_progress_print(kv_progress *p, int force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* End a progress line (newline on a terminal). */
void kv_progress_done(kv_progress *p);

/* Monotonic wall-clock time in seconds. */
double kv_now(void);

/* Read a whole file into a NUL-terminated buffer owned by the caller (free()). `len` gets the
 * byte count without the terminator. Errors name the file: KV_EINPUT when it cannot be opened
 * or read. */
int kv_read_file(const char *path, char **data, size_t *len, kv_error *err);

/* SHA-256 (OpenSSL libcrypto) of a file's bytes as 64 lowercase hex digits + NUL. */
int kv_sha256_file(const char *path, char hex[65], kv_error *err);

/* SHA-256 of several files' bytes concatenated in the given order. */
int kv_sha256_files(const char *const *paths, int n, char hex[65], kv_error *err);

/* Location of the shared data directory: $KVPLAN_SHARED if set, else the build's default
 * (the `shared/` directory beside the repository). Returns a static string. */
const char *kv_shared_dir(void);

/* Write `path`.tmp.<pid> style temporary names: fills `tmp` (size `cap`) with a temporary
 * path in the same directory as `final_path`, so that rename() is atomic. */
int kv_temp_path(const char *final_path, char *tmp, size_t cap, kv_error *err);

/* Rename `tmp` over `final_path`; on failure removes `tmp` and names both files. */
int kv_commit_file(const char *tmp, const char *final_path, kv_error *err);

/* Check that the directory of `path` exists and is writable, before long work starts. */
int kv_check_writable(const char *path, kv_error *err);

/* Parse helpers for the CLI: strict numbers, error names the option. */
int kv_parse_int(const char *s, const char *opt, long lo, long hi, long *out, kv_error *err);
int kv_parse_double(const char *s, const char *opt, double lo, double hi, double *out,
                    kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
