/* kvplan common: error reporting, progress, files, hashing.
 *
 * Errors travel as return codes with a message: every fallible function takes a
 * `kv_error *err` (may be NULL), fills it on failure and returns one of the KV_E* codes.
 * Library code never calls exit(). The CLI maps KV_EINPUT to exit code 1 and anything else
 * non-zero to exit code 2 (docs/design.md CLI).
 */
#ifndef KVPLAN_COMMON_H
#define KVPLAN_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* The exported API: the library is built with -fvisibility=hidden, and every public header
 * declares its functions and objects between KV_API_BEGIN and KV_API_END, which give them
 * default visibility; everything else in libkvplan.so stays internal
 * (scripts/check-symbols.sh checks that the exports are exactly the public declarations). */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define KV_API_BEGIN _Pragma("GCC visibility push(default)")
#define KV_API_END _Pragma("GCC visibility pop")
#else
#define KV_API_BEGIN
#define KV_API_END
#endif

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

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
/* CPU seconds the process has used so far, user + system of all its threads (C11 clock()). */
double kv_cpu_now(void);

/* Largest file kv_read_file reads (1 GiB): text, tokenizer.json and config.json files are far
 * smaller; anything bigger is refused before it is read. */
#define KV_READ_FILE_MAX ((uint64_t)1 << 30)

/* Open `path` for reading only if it is a regular file of at most `max_bytes` bytes (0: no
 * limit). The open never blocks: FIFOs, devices (/dev/zero), sockets and directories are
 * refused by fstat on the opened descriptor, before a byte is read. On success *fd is the open
 * descriptor (caller closes it) and *size the file's size in bytes. `what` names the file's
 * role in messages ("model", "text"; may be NULL). KV_EINPUT names the file and the problem. */
int kv_open_regular(const char *path, const char *what, uint64_t max_bytes, int *fd, uint64_t *size,
                    kv_error *err);

/* Refuse anything but an existing regular file (see kv_open_regular), without reading it. */
int kv_check_regular(const char *path, const char *what, kv_error *err);

/* What a file of mode m (st_mode) is, for messages: "a directory", "a FIFO (named pipe)",
 * "a character device", ..., "not a regular file". A static string. */
const char *kv_file_kind(unsigned m);

/* Read a whole regular file of at most `max_bytes` (0: KV_READ_FILE_MAX) into a NUL-terminated
 * buffer owned by the caller (free()). `len` gets the byte count without the terminator.
 * Errors name the file: KV_EINPUT when it cannot be opened or read, is not a regular file or
 * is too large (checked by fstat before reading, and again while reading a file that grows). */
int kv_read_file_max(const char *path, uint64_t max_bytes, char **data, size_t *len, kv_error *err);
/* kv_read_file_max with the default limit KV_READ_FILE_MAX. */
int kv_read_file(const char *path, char **data, size_t *len, kv_error *err);

/* Load a whole regular file into memory kvplan owns: the model loaders' way of reading weight
 * files (llama2.c checkpoints, GGUF, safetensors shards), so that no weight points into a
 * memory map of a file another process may truncate or rewrite (a truncated mapping raises
 * SIGBUS on the next access to a dropped page, which library code cannot catch without a
 * process-wide signal handler).
 *
 * The file is opened with kv_open_regular (FIFOs, devices, sockets and directories refused
 * before a byte is read; `max_bytes` > 0 caps the size, 0 means no cap), read with a pread(2)
 * loop in 16 MiB chunks into one buffer aligned to the page size (files of 2 MiB or more: to
 * 2 MiB, with madvise MADV_HUGEPAGE, so filling it takes few page faults), and fstat()ed again
 * at the end: a file whose size or modification time changed during the read, or that ended
 * early, is refused. For files of 32 MiB or more the kernel is told behind each chunk that it
 * may drop the file's page cache (posix_fadvise POSIX_FADV_DONTNEED; advisory, its failure is
 * ignored), so a large model does not stay in memory twice (our copy plus the cache); smaller
 * files stay cached for the next run.
 *
 * On success *data holds *len bytes followed by one NUL byte (so text parsers may read it as
 * a string); the caller owns it and releases it with free(). `what` names the file's role in
 * messages ("model"; may be NULL). Errors name the file: KV_EINPUT when it cannot be opened,
 * is not a regular file, is too large, cannot be read or changed while read; KV_EINTERNAL
 * when memory for it cannot be allocated. */
int kv_file_load(const char *path, const char *what, uint64_t max_bytes, void **data, size_t *len,
                 kv_error *err);

/* SHA-256 (OpenSSL libcrypto) of a file's bytes as 64 lowercase hex digits + NUL. */
int kv_sha256_file(const char *path, char hex[65], kv_error *err);

/* SHA-256 of several files' bytes concatenated in the given order. */
int kv_sha256_files(const char *const *paths, int n, char hex[65], kv_error *err);

/* SHA-256 of n parts concatenated in order, each either bytes already in memory (bufs[i] not
 * NULL: lens[i] bytes) or a file read from disk (bufs NULL or bufs[i] NULL: paths[i]). A model
 * loader hashes the bytes it loaded (kv_file_load), so model_sha256 names exactly the weights
 * in memory and the file is not read a second time. paths[i] names the part in errors. */
int kv_sha256_parts(const char *const *paths, const void *const *bufs, const size_t *lens, int n,
                    char hex[65], kv_error *err);

/* Location of the shared data directory: $KVPLAN_SHARED if set, else the build's default
 * (the `shared/` directory beside the repository). Returns a static string. */
const char *kv_shared_dir(void);

/* ---- atomic output files ----
 * An output is written to a temporary file beside it and renamed over it when complete, so a
 * crash, a kill or a full disk never leaves a half-written file under the final name and never
 * destroys the old one (rename(2) is atomic within a directory).
 * Temporary names are "<final>.tmp.<pid>.<12 random hex digits>" (getrandom(2); a base name
 * longer than NAME_MAX - 28 bytes is cut to that length first, so the name stays within
 * NAME_MAX): not predictable, and created with O_CREAT | O_EXCL | O_NOFOLLOW, so a file or a
 * symlink planted under the name is never opened or followed; creation retries with a fresh name.
 */

/* Create a new temporary file for `final_path` in the same directory: fills `tmp` (size `cap`)
 * with its name and *fd with a descriptor open for writing (caller closes it, and removes the
 * file or commits it with kv_commit_file). Temporary files of `final_path` left by processes
 * that no longer exist (killed during a write) are removed first (kv_temp_cleanup).
 * KV_EINPUT names the directory and the reason (not writable, read-only file system...). */
int kv_temp_create(const char *final_path, char *tmp, size_t cap, int *fd, kv_error *err);

/* Remove the temporary files "<final>.tmp.<pid>[.<hex>]" of `final_path` whose process <pid>
 * no longer exists: only regular files (never symlinks) owned by this user. Returns the
 * number removed. Errors are ignored: this is cleanup. */
int kv_temp_cleanup(const char *final_path);

/* Write all `n` bytes of `buf` to `fd` (retrying short writes and EINTR), then fsync it.
 * `path` names the file in messages. KV_EINTERNAL (exit code 2) on failure with the system's reason
 * (ENOSPC "No space left on device", EFBIG "File too large", EIO...). Does not close fd. */
int kv_write_all(int fd, const void *buf, size_t n, const char *path, kv_error *err);

/* Write `n` bytes to `final_path` atomically: kv_temp_create, kv_write_all, close, commit.
 * On any failure the temporary file is removed and the old `final_path` is left untouched. */
int kv_write_file_atomic(const char *final_path, const void *buf, size_t n, kv_error *err);

/* Rename `tmp` over `final_path`; on failure removes `tmp` and names both files. */
int kv_commit_file(const char *tmp, const char *final_path, kv_error *err);

/* Check that the directory of `path` exists and is writable, before long work starts. */
int kv_check_writable(const char *path, kv_error *err);

/* Check an output's name (every output: -o, the PNGs of inspect, at check time and again
 * just before the write): not empty, not ending in '/', a base name within the file system's
 * NAME_MAX, the path and its temporary's name ("<final>.tmp.<pid>.<hex>", base cut as in
 * kv_temp_create) within PATH_MAX, not a symbolic link (the rename would replace the link,
 * e.g. /dev/stdout, instead of writing its target), and not in /dev, /proc or /sys (after
 * realpath of the directory). `opt` names the option in messages. KV_EINPUT on any of them. */
int kv_check_output_name(const char *path, const char *opt, kv_error *err);

/* Check an output path before any work starts: kv_check_output_name, it is not empty, not an
 * existing directory or other non-regular file (rename would replace a device node), its directory
 * is writable (kv_check_writable), and it is not the same file (st_dev, st_ino, after symlinks and
 * "./") as any of the `n` input paths (NULL entries are skipped). When an input is a directory (a
 * Hugging Face model), an output inside it named *.json or *.safetensors is refused too.
 * `opt` names the option in messages ("-o"). KV_EINPUT says which input would be destroyed. */
int kv_check_output(const char *path, const char *opt, const char *const *inputs, int n,
                    kv_error *err);

/* Parse helpers for the CLI: strict numbers, error names the option. */
int kv_parse_int(const char *s, const char *opt, long lo, long hi, long *out, kv_error *err);
int kv_parse_double(const char *s, const char *opt, double lo, double hi, double *out,
                    kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
