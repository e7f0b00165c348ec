/* kvplan common helpers: see include/kvplan/common.h. */
#include "kvplan/common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
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

double kv_cpu_now(void) {
    return (double)clock() / (double)CLOCKS_PER_SEC;
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

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

const char *kv_file_kind(unsigned m) {
    return file_kind((mode_t)m);
}

int kv_open_regular(const char *path, const char *what, uint64_t max_bytes, int *fd, uint64_t *size,
                    kv_error *err) {
    *fd = -1;
    if (size) *size = 0;
    const char *role = what ? what : "file";
    if (!path || !*path)
        return what ? kv_fail(err, KV_EINPUT, "no %s file name given", what)
                    : kv_fail(err, KV_EINPUT, "no file name given");
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; cleared again below */
    int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0)
        return kv_fail(err, KV_EINPUT, "%s: cannot open the %s: %s", path, role, strerror(errno));
    struct stat st;
    if (fstat(d, &st) != 0) {
        int e = errno;
        close(d);
        return kv_fail(err, KV_EINPUT, "%s: cannot stat the %s: %s", path, role, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(d);
        return kv_fail(err, KV_EINPUT, "%s: the %s is %s; give a regular file", path, role,
                       file_kind(st.st_mode));
    }
    if (max_bytes && (uint64_t)st.st_size > max_bytes) {
        close(d);
        return kv_fail(err, KV_EINPUT,
                       "%s: the %s is %lld bytes, more than the %llu bytes kvplan reads for it; "
                       "is this the right file?",
                       path, role, (long long)st.st_size, (unsigned long long)max_bytes);
    }
    int fl = fcntl(d, F_GETFL);
    if (fl >= 0) fcntl(d, F_SETFL, fl & ~O_NONBLOCK);
    *fd = d;
    if (size) *size = (uint64_t)st.st_size;
    return KV_OK;
}

int kv_check_regular(const char *path, const char *what, kv_error *err) {
    int fd = -1;
    int rc = kv_open_regular(path, what, 0, &fd, NULL, err);
    if (fd >= 0) close(fd);
    return rc;
}

int kv_read_file_max(const char *path, uint64_t max_bytes, char **data, size_t *len,
                     kv_error *err) {
    *data = NULL;
    if (len) *len = 0;
    if (!max_bytes) max_bytes = KV_READ_FILE_MAX;
    int fd = -1;
    uint64_t size = 0;
    int rc = kv_open_regular(path, NULL, max_bytes, &fd, &size, err);
    if (rc) return rc;
    /* the size from fstat sizes the buffer; a file that grows while read is still bounded */
    size_t cap = (size_t)size + 1 < 4096 ? 4096 : (size_t)size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return kv_fail(err, KV_EINTERNAL, "%s: out of memory for %zu bytes", path, cap);
    }
    for (;;) {
        if (n + 1 >= cap) {
            /* the buffer holds the size fstat gave: a one-byte read confirms the end, so a
             * file is never given twice its size (a text of half the ulimit -v fitted not) */
            char probe;
            ssize_t g = read(fd, &probe, 1);
            if (g < 0 && errno == EINTR) continue;
            if (g == 0) break;
            if (g < 0) {
                int e = errno;
                free(buf);
                close(fd);
                return kv_fail(err, KV_EINPUT, "%s: read error: %s", path, strerror(e));
            }
            if ((uint64_t)cap > max_bytes) {
                free(buf);
                close(fd);
                return kv_fail(err, KV_EINPUT,
                               "%s: grew past %llu bytes while being read; is this the right "
                               "file?",
                               path, (unsigned long long)max_bytes);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return kv_fail(err, KV_EINTERNAL, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
            buf[n++] = probe; /* it grew while being read */
            continue;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return kv_fail(err, KV_EINPUT, "%s: read error: %s", path, strerror(e));
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    if ((uint64_t)n > max_bytes) {
        free(buf);
        return kv_fail(err, KV_EINPUT, "%s: grew past %llu bytes while being read", path,
                       (unsigned long long)max_bytes);
    }
    buf[n] = '\0';
    *data = buf;
    if (len) *len = n;
    return KV_OK;
}

/* Chunk of kv_file_load's reads, and of the page cache it lets the kernel drop behind it. */
#define KV_LOAD_CHUNK ((size_t)16 << 20)
/* Files from this size on have their page cache dropped behind the read (posix_fadvise
 * DONTNEED): a real LLM (hundreds of MiB and more) then does not sit in memory twice, while the
 * small files (test models, tokenizers, read again by every run) stay cached: dropping the
 * cache of a 1 MiB model made each later load read it from disk (~5 ms instead of ~0.3 ms). */
#define KV_LOAD_DROP_CACHE ((size_t)32 << 20)
/* Size (and alignment) of a transparent huge page on x86-64 and most arm64 kernels. */
#define KV_LOAD_HUGE ((size_t)2 << 20)

int kv_file_load(const char *path, const char *what, uint64_t max_bytes, void **data, size_t *len,
                 kv_error *err) {
    *data = NULL;
    if (len) *len = 0;
    const char *role = what ? what : "file";
    int fd = -1;
    int rc = kv_open_regular(path, what, max_bytes, &fd, NULL, err);
    if (rc) return rc;
    struct stat before, after;
    if (fstat(fd, &before) != 0) {
        int e = errno;
        close(fd);
        return kv_fail(err, KV_EINPUT, "%s: cannot stat the %s: %s", path, role, strerror(e));
    }
    if ((uint64_t)before.st_size >= (uint64_t)SIZE_MAX) {
        close(fd);
        return kv_fail(err, KV_EINPUT, "%s: the %s is too large to load (%lld bytes)", path, role,
                       (long long)before.st_size);
    }
    size_t size = (size_t)before.st_size;
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 0 ? (size_t)page : 4096;
    /* files of 2 MiB or more: 2 MiB-aligned for transparent huge pages, where the kernel gives
     * them on request (THP "madvise" mode). First touch of fresh memory costs a page fault per
     * page; on this project's VM 4 KiB faults made a 256 MiB buffer cost 1.4 s to fill, 2 MiB
     * ones 31 ms (a 1 MiB buffer gained nothing measurable). */
    if (size >= KV_LOAD_HUGE) align = KV_LOAD_HUGE;
    void *buf = NULL;
    if (posix_memalign(&buf, align, size + 1) != 0) {
        close(fd);
        return kv_fail(err, KV_EINTERNAL,
                       "%s: out of memory loading the %s (%zu bytes); a smaller or quantised "
                       "model may fit",
                       path, role, size);
    }
    unsigned char *p = buf;
#ifdef MADV_HUGEPAGE
    if (align == KV_LOAD_HUGE) /* advisory: refused or unsupported only costs time */
        (void)madvise(buf, (size + 1 + (size_t)page - 1) / (size_t)page * (size_t)page,
                      MADV_HUGEPAGE);
#endif
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t off = 0, dropped = 0;
    while (off < size && !rc) {
        size_t want = size - off < KV_LOAD_CHUNK ? size - off : KV_LOAD_CHUNK;
        ssize_t got = pread(fd, p + off, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            rc = kv_fail(err, KV_EINPUT, "%s: read error in the %s at byte %zu: %s", path, role,
                         off, strerror(errno));
        else if (got == 0)
            rc = kv_fail(err, KV_EINPUT,
                         "%s: the %s ended at byte %zu while being read, but was %zu bytes: "
                         "another program is changing it; try again when it is finished",
                         path, role, off, size);
        else
            off += (size_t)got;
        if (!rc && size >= KV_LOAD_DROP_CACHE && (off - dropped >= KV_LOAD_CHUNK || off == size)) {
            /* our copy holds these bytes now: the cache of them may go */
            (void)posix_fadvise(fd, (off_t)dropped, (off_t)(off - dropped), POSIX_FADV_DONTNEED);
            dropped = off;
        }
    }
    if (!rc && fstat(fd, &after) != 0)
        rc = kv_fail(err, KV_EINPUT, "%s: cannot stat the %s: %s", path, role, strerror(errno));
    if (!rc && (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
                after.st_mtim.tv_nsec != before.st_mtim.tv_nsec))
        rc = kv_fail(err, KV_EINPUT,
                     "%s: the %s changed while being read (%lld bytes before, %lld after): "
                     "another program is writing it; try again when it is finished",
                     path, role, (long long)before.st_size, (long long)after.st_size);
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    p[size] = 0;
    *data = buf;
    if (len) *len = size;
    return KV_OK;
}

int kv_read_file(const char *path, char **data, size_t *len, kv_error *err) {
    return kv_read_file_max(path, KV_READ_FILE_MAX, data, len, err);
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

int kv_sha256_parts(const char *const *paths, const void *const *bufs, const size_t *lens, int n,
                    char hex[65], kv_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return kv_fail(err, KV_EINTERNAL, "OpenSSL: cannot initialise SHA-256");
    }
    for (int i = 0; i < n; i++) {
        int rc = KV_OK;
        if (bufs && bufs[i])
            EVP_DigestUpdate(ctx, bufs[i], lens[i]);
        else
            rc = sha256_feed(ctx, paths[i], err);
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

int kv_sha256_files(const char *const *paths, int n, char hex[65], kv_error *err) {
    return kv_sha256_parts(paths, NULL, NULL, n, hex, err);
}

int kv_sha256_file(const char *path, char hex[65], kv_error *err) {
    return kv_sha256_files(&path, 1, hex, err);
}

const char *kv_shared_dir(void) {
    const char *env = getenv("KVPLAN_SHARED");
    if (env && *env) return env;
    return KVPLAN_SHARED_DEFAULT;
}

/* Directory part of `path` into dir (".", "/" or the prefix before the last slash) and a
 * pointer to the base name. */
static const char *split_dir(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
        return path;
    }
    if (slash == path) {
        snprintf(dir, cap, "/");
        return slash + 1;
    }
    size_t n = (size_t)(slash - path);
    if (n >= cap) n = cap - 1;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return slash + 1;
}

/* "<pid>" or "<pid>.<hex>" with nothing else: the pid, else -1. */
static long temp_suffix_pid(const char *s) {
    if (!isdigit((unsigned char)*s)) return -1;
    char *end = NULL;
    errno = 0;
    long pid = strtol(s, &end, 10);
    if (errno || pid <= 0 || pid > INT_MAX) return -1;
    if (*end == '\0') return pid;
    if (*end != '.' || !end[1]) return -1;
    for (const char *q = end + 1; *q; q++)
        if (!isxdigit((unsigned char)*q)) return -1;
    return pid;
}

/* The part of a base name that temporary names keep: all of it, or, when the temporary's
 * name would exceed NAME_MAX, its first NAME_MAX - KV_TEMP_SUFFIX_MAX bytes (".tmp.", a pid
 * of up to 10 digits, "." and 12 hex digits). */
#define KV_TEMP_SUFFIX_MAX 28
static size_t temp_base_len(const char *base) {
    size_t nb = strlen(base);
    return nb + KV_TEMP_SUFFIX_MAX > NAME_MAX ? NAME_MAX - KV_TEMP_SUFFIX_MAX : nb;
}

int kv_temp_cleanup(const char *final_path) {
    char dir[4096];
    const char *base = split_dir(final_path, dir, sizeof dir);
    size_t nb = temp_base_len(base);
    if (!nb) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strncmp(name, base, nb) != 0 || strncmp(name + nb, ".tmp.", 5) != 0) continue;
        long pid = temp_suffix_pid(name + nb + 5);
        if (pid < 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours) */
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
        if (unlinkat(dirfd(d), name, 0) == 0) removed++;
    }
    closedir(d);
    return removed;
}

int kv_temp_create(const char *final_path, char *tmp, size_t cap, int *fd, kv_error *err) {
    *fd = -1;
    if (!final_path || !*final_path) return kv_fail(err, KV_EINPUT, "no output file name given");
    kv_temp_cleanup(final_path);
    for (int attempt = 0; attempt < 16; attempt++) {
        unsigned char rnd[6];
        ssize_t got = getrandom(rnd, sizeof rnd, 0);
        if (got != (ssize_t)sizeof rnd) {
            /* getrandom(2) only fails before the entropy pool is ready or on old kernels;
             * fall back to the clock, still never opening an existing name (O_EXCL) */
            uint64_t t = (uint64_t)(kv_now() * 1e9) ^ ((uint64_t)attempt << 40);
            for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (unsigned char)(t >> (8 * i));
        }
        /* the directory, the base name (cut so that the whole name fits NAME_MAX), the suffix */
        const char *slash = strrchr(final_path, '/');
        const char *base = slash ? slash + 1 : final_path;
        int n = snprintf(tmp, cap, "%.*s%.*s.tmp.%ld.%02x%02x%02x%02x%02x%02x",
                         (int)(base - final_path), final_path, (int)temp_base_len(base), base,
                         (long)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
        if (n < 0 || (size_t)n >= cap)
            return kv_fail(err, KV_EINPUT, "%s: path too long", final_path);
        int d = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (d >= 0) {
            *fd = d;
            return KV_OK;
        }
        if (errno == EEXIST || errno == ELOOP) continue; /* taken (or a planted symlink) */
        int e = errno;
        char dir[4096];
        split_dir(final_path, dir, sizeof dir);
        return kv_fail(err, KV_EINPUT, "%s: cannot create a temporary file in %s: %s", final_path,
                       dir, strerror(e));
    }
    return kv_fail(err, KV_EINPUT,
                   "%s: could not find a free temporary file name in 16 tries; remove files "
                   "named like %s.tmp.* beside it",
                   final_path, final_path);
}

int kv_write_all(int fd, const void *buf, size_t n, const char *path, kv_error *err) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return kv_fail(err, KV_EINTERNAL, "%s: write failed: %s", path, strerror(errno));
        if (w == 0) return kv_fail(err, KV_EINTERNAL, "%s: write failed: no progress", path);
        p += w;
        n -= (size_t)w;
    }
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        return kv_fail(err, KV_EINTERNAL, "%s: write failed (fsync): %s", path, strerror(errno));
    return KV_OK;
}

int kv_write_file_atomic(const char *final_path, const void *buf, size_t n, kv_error *err) {
    char tmp[4200];
    int fd = -1;
    int rc = kv_check_output_name(final_path, "output", err);
    if (!rc) rc = kv_temp_create(final_path, tmp, sizeof tmp, &fd, err);
    if (rc) return rc;
    rc = kv_write_all(fd, buf, n, tmp, err);
    if (close(fd) != 0 && !rc)
        rc = kv_fail(err, KV_EINTERNAL, "%s: write failed (close): %s", tmp, strerror(errno));
    if (rc) {
        unlink(tmp);
        return kv_fail_context(err, "%s was not written (the old file, if any, is unchanged)",
                               final_path);
    }
    return kv_commit_file(tmp, final_path, err);
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
    split_dir(path, dir, sizeof dir);
    if (access(dir, W_OK) != 0)
        return kv_fail(err, KV_EINPUT, "%s: cannot write here (directory %s: %s)", path, dir,
                       strerror(errno));
    return KV_OK;
}

/* 1 when the directory `dir` resolves (realpath) to /dev, /proc or /sys or below them. */
static int dir_is_system(const char *dir, char *real, size_t cap) {
    char buf[PATH_MAX];
    if (!realpath(dir, buf)) return 0; /* a missing directory is reported by kv_check_writable */
    snprintf(real, cap, "%s", buf);
    static const char *const sys[] = {"/dev", "/proc", "/sys"};
    for (size_t i = 0; i < sizeof sys / sizeof *sys; i++) {
        size_t l = strlen(sys[i]);
        if (!strncmp(buf, sys[i], l) && (buf[l] == '\0' || buf[l] == '/')) return 1;
    }
    return 0;
}

int kv_check_output_name(const char *path, const char *opt, kv_error *err) {
    if (!opt) opt = "-o";
    if (!path || !*path) return kv_fail(err, KV_EINPUT, "%s needs a file name", opt);
    char dir[4096];
    const char *base = split_dir(path, dir, sizeof dir);
    size_t nb = strlen(base), np = strlen(path);
    if (!nb)
        return kv_fail(err, KV_EINPUT, "%s %s: names a directory; give a file name (e.g. %sout.h5)",
                       opt, path, path);
    long name_max = pathconf(dir, _PC_NAME_MAX);
    if (name_max <= 0 || name_max > NAME_MAX) name_max = NAME_MAX;
    if (nb > (size_t)name_max)
        return kv_fail(err, KV_EINPUT,
                       "%s: the file name is %zu bytes, longer than this file system allows "
                       "(%ld); choose a shorter -o",
                       opt, nb, name_max);
    /* the temporary beside it: the directory, the base name cut to fit NAME_MAX, the suffix */
    size_t tmp_len = (size_t)(base - path) + temp_base_len(base) + KV_TEMP_SUFFIX_MAX;
    if (np >= PATH_MAX || tmp_len >= PATH_MAX)
        return kv_fail(err, KV_EINPUT,
                       "%s: the path is %zu bytes; with its temporary file's suffix it exceeds "
                       "PATH_MAX (%d); choose a shorter -o",
                       opt, np, PATH_MAX);
    struct stat sl;
    if (lstat(path, &sl) == 0 && S_ISLNK(sl.st_mode))
        return kv_fail(err, KV_EINPUT,
                       "%s %s: is a symbolic link, which an output would replace (kvplan does "
                       "not write through links); give the target's own name or remove the link",
                       opt, path);
    char real[PATH_MAX];
    if (dir_is_system(dir, real, sizeof real))
        return kv_fail(err, KV_EINPUT,
                       "%s %s: is in %s, a system directory (/dev, /proc, /sys) that takes no "
                       "output files; choose a file in an ordinary directory",
                       opt, path, real);
    return KV_OK;
}

int kv_check_output(const char *path, const char *opt, const char *const *inputs, int n,
                    kv_error *err) {
    if (!opt) opt = "-o";
    int rc = kv_check_output_name(path, opt, err);
    if (rc) return rc;
    struct stat so;
    int exists = stat(path, &so) == 0;
    if (exists && S_ISDIR(so.st_mode))
        return kv_fail(err, KV_EINPUT, "%s %s: is a directory; give a file name (e.g. %s/out.h5)",
                       opt, path, path);
    if (exists && !S_ISREG(so.st_mode))
        return kv_fail(err, KV_EINPUT,
                       "%s %s: is %s, which an output file would replace; give a regular file "
                       "name",
                       opt, path, file_kind(so.st_mode));
    rc = kv_check_writable(path, err);
    if (rc) return rc;
    char dir[4096];
    split_dir(path, dir, sizeof dir);
    struct stat sd;
    int have_dir = stat(dir, &sd) == 0;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t nb = strlen(base);
    int model_like = (nb >= 5 && !strcmp(base + nb - 5, ".json")) ||
                     (nb >= 12 && !strcmp(base + nb - 12, ".safetensors"));
    for (int i = 0; i < n; i++) {
        if (!inputs[i]) continue;
        struct stat si;
        if (stat(inputs[i], &si) != 0) continue; /* the input's own reader reports it */
        if (exists && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
            return kv_fail(err, KV_EINPUT,
                           "%s %s is the input file %s: writing it would destroy the input; "
                           "choose another output name",
                           opt, path, inputs[i]);
        if (S_ISDIR(si.st_mode) && have_dir && model_like && si.st_dev == sd.st_dev &&
            si.st_ino == sd.st_ino)
            return kv_fail(err, KV_EINPUT,
                           "%s %s is inside the model directory %s and could replace one of "
                           "its files; choose another output name",
                           opt, path, inputs[i]);
    }
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
