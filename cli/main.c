/* kvplan: offline profiler and KV-cache budget planner for decoder-only LLMs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvplan COMMAND [options]   (kvplan COMMAND --help for each)\n\n"
               "kvplan profiles a model's attention heads and hardware, plans per-head KV-cache\n"
               "budgets for a memory target, and runs the plan.\n\ncommands:\n");
    size_t n = 0;
    const kv_cli_command *commands = kv_cli_commands(&n);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

/* Every command's output to stdout is checked here, once: a write error (a full disk, a closed
 * pipe, /dev/full) that stdio kept in its buffer or flagged in ferror turns a successful exit
 * into exit code 2 with a message, so no truncated output passes for a complete one. */
static int finish(const char *cmd, int code) {
    int bad = ferror(stdout);
    errno = 0;
    if (fflush(stdout) != 0) bad = 1;
    int e = errno;
    if (fclose(stdout) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        fprintf(stderr, "kvplan%s%s: cannot write to standard output: %s\n", cmd ? " " : "",
                cmd ? cmd : "", e ? strerror(e) : "write error");
        if (code == 0) code = 2;
    }
    return code;
}

/* Under an address-space limit (ulimit -v, RLIMIT_AS, or RLIMIT_DATA) OpenBLAS must not start
 * more threads than the limit holds. Its pthreads build starts its thread pool when the
 * library is loaded, before main, with one thread per core (or OPENBLAS_NUM_THREADS /
 * GOTO_NUM_THREADS / OMP_NUM_THREADS), and each thread allocates a 128 MiB work buffer at
 * once; when malloc fails it retries forever (0.3.21 blas_memory_alloc): the thread spins at
 * 100% CPU, a GEMM that needs it never returns and exit() waits for it (seen: `ulimit -v
 * 900000; kvplan --help` never ended on a many-core machine). So when a limit is set and the
 * pool would exceed a quarter of it (KV_CLI_BLAS_BUFFER_BYTES per thread), kvplan sets
 * OPENBLAS_NUM_THREADS to what fits (at least 1: no pool thread) and executes itself again
 * once, before any work. The main thread's own buffer is checked by kv_cli_load_model. */
static void fit_blas_threads(char **argv) {
    if (getenv("KVPLAN_BLAS_FITTED")) {
        unsetenv("KVPLAN_BLAS_FITTED"); /* a kvplan started by this one decides again */
        return;
    }
    uint64_t limit = kv_cli_memory_limit();
    if (!limit) return;
    const char *vars[] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"};
    long want = 0;
    for (int i = 0; i < 3 && want <= 0; i++) {
        const char *v = getenv(vars[i]);
        want = v && *v ? strtol(v, NULL, 10) : 0;
    }
    if (want <= 0) want = sysconf(_SC_NPROCESSORS_ONLN);
    if (want <= 1) return;
    uint64_t fit = limit / 4 / KV_CLI_BLAS_BUFFER_BYTES;
    if (fit < 1) fit = 1;
    if ((uint64_t)want <= fit) return;
    char n[32];
    snprintf(n, sizeof n, "%llu", (unsigned long long)fit);
    setenv("OPENBLAS_NUM_THREADS", n, 1);
    setenv("KVPLAN_BLAS_FITTED", "1", 1);
    fflush(NULL);
    execv("/proc/self/exe", argv);
    unsetenv("KVPLAN_BLAS_FITTED"); /* no /proc: go on as before */
}

int main(int argc, char **argv) {
    fit_blas_threads(argv);
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish(NULL, 0);
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvplan %s\n", KVPLAN_VERSION_STRING);
        return finish(NULL, 0);
    }
    size_t n = 0;
    const kv_cli_command *commands = kv_cli_commands(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(argv[1], commands[i].name))
            return finish(commands[i].name, commands[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "kvplan: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 1;
}
