/* kvplan command line: one function per subcommand (cli/cmd_*.c) and shared option helpers.
 * Each kv_cmd_* returns the process exit code: 0 ok, 1 bad input, 2 internal error
 * (docs/design.md CLI). Errors are printed as "kvplan <cmd>: <message>" on stderr. */
#ifndef KVPLAN_CLI_H
#define KVPLAN_CLI_H

#include "kvplan/common.h"
#include "kvplan/backend.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "kvplan/tasks.h"
#include "opts.h"

int kv_cmd_run(int argc, char **argv);
int kv_cmd_eval(int argc, char **argv);
int kv_cmd_tokenize(int argc, char **argv);
int kv_cmd_probes(int argc, char **argv);
int kv_cmd_profile(int argc, char **argv);
int kv_cmd_search(int argc, char **argv);
int kv_cmd_plan(int argc, char **argv);
int kv_cmd_kvpr(int argc, char **argv);
int kv_cmd_batch(int argc, char **argv);
int kv_cmd_inspect(int argc, char **argv);
int kv_cmd_serve(int argc, char **argv);

/* Each command's options (cli/cmd_*.c): the tables its parser and --help are made from. */
extern const kv_cli_spec kv_spec_run, kv_spec_eval, kv_spec_tokenize, kv_spec_profile,
    kv_spec_search, kv_spec_plan, kv_spec_kvpr, kv_spec_batch, kv_spec_inspect, kv_spec_serve,
    kv_spec_probes;

/* kv_model_load. (OpenBLAS's thread count is no longer chosen here: the CPU backend runs every
 * BLAS call on one thread of its own pool, --threads, so OpenBLAS is set to one thread when
 * a backend is made; runtime/backend/backend_cpu.c.) */
int kv_cli_load_model(const char *path, kv_model **m, kv_error *err);

/* OpenBLAS's work buffer per thread (BUFFER_SIZE of its x86-64 builds, 128 MiB, plus a page
 * and a margin for malloc's own headers). */
#define KV_CLI_BLAS_BUFFER_BYTES ((uint64_t)136 << 20)
/* The process's address-space limit in bytes: the lower of RLIMIT_AS and RLIMIT_DATA (which
 * counts private mappings, so malloc), 0 when neither is set. */
uint64_t kv_cli_memory_limit(void);
/* With a memory limit: allocate (and free) KV_CLI_BLAS_BUFFER_BYTES, then run one small GEMM
 * so that OpenBLAS takes its buffer for this thread now, while it fits (it keeps it for later
 * calls). KV_EINTERNAL "out of memory: ..." when it does not fit (exit 2), instead of OpenBLAS
 * retrying its allocation forever in the first GEMM. Nothing without a limit. Called by the
 * commands that run the model (eval, run, profile, search) after loading it. */
int kv_cli_blas_ready(kv_error *err);

/* Print "kvplan <cmd>: <msg>" and return the exit code for err->code (1 or 2). */
int kv_cli_report(const char *cmd, const kv_error *err);

/* A copy of the NUL-terminated `s` for output (the caller frees it; NULL when out of memory):
 * valid UTF-8 is kept; a byte that does not start a valid UTF-8 sequence becomes "\xNN"
 * (escape_controls = 1, for messages; control characters and DEL too) or U+FFFD
 * (escape_controls = 0, e.g. JSON text, whose control characters cJSON escapes itself). */
char *kv_cli_clean_text(const char *s, int escape_controls);

/* The end of a command that ran under kv_tasks (profile, search): rank 0 reports err when rc
 * is not KV_OK ("kvplan <cmd>: ...") and sends its exit code to every rank; workers print
 * nothing and return rank 0's code. Finalises tasks (MPI) in every rank. Returns the exit
 * code (0, 1 or 2). */
int kv_cli_finish_tasks(const char *cmd, kv_tasks *tasks, int rc, const kv_error *err);

/* After kv_plan_read: a plan file without /budget@sha256 (p->budget_sha256 0) gets one note
 * on stderr ("kvplan <cmd>: note: PLAN has no checksum ..."), nothing otherwise. */
void kv_cli_plan_note(const char *cmd, const kv_plan *p);

/* The command line joined with spaces into buf (for the `command` provenance attribute). */
void kv_cli_command_line(int argc, char **argv, char *buf, size_t cap);

/* A quantity with an optional SI (K, M, G, T: powers of 1000) or binary (Ki, Mi, Gi, Ti: powers
 * of 1024) suffix and an optional trailing B ("80Gi", "3.35T", "1e9"). KV_EINPUT names `opt`. */
int kv_cli_parse_qty(const char *s, const char *opt, double *out, kv_error *err);

/* ---- KV budget options: one group (kv_budget_opts) ----
 * run and eval take all of them; search all but --plan; plan the first six; profile only
 * --kv-type (the first). */
typedef struct kv_budget_args {
    const char *kv_type;    /* NULL = f16 (a plan file: its own types) */
    double ratio;           /* 0 = not given */
    const char *allocation; /* "uniform" (run, eval), an allocation name (plan, search) */
    const char *policy;     /* NULL = the plan's, else sink */
    long evict_block;       /* 0 = the plan's, else 16 */
    long block_size;        /* 0 = the plan's or 16 */
    const char *device;     /* NULL = auto */
    const char *plan;       /* plan.h5 path or NULL */
} kv_budget_args;

#define KV_BUDGET_OPTS_TYPE 1   /* --kv-type */
#define KV_BUDGET_OPTS_CORE 6   /* ... --ratio --allocation --policy --evict-block --block-size */
#define KV_BUDGET_OPTS_DEVICE 7 /* ... --device */
#define KV_BUDGET_OPTS_ALL 8    /* ... --plan */
extern const kv_opt kv_budget_opts[KV_BUDGET_OPTS_ALL];

/* The plan these options describe, for context C: the plan file (checked against the model
 * and the context; --policy sets every head's policy, --evict-block / --block-size override,
 * --kv-type retypes every head keeping the budgets), uniform at --ratio of the full F16
 * cache's bytes in --kv-type (kv_plan_uniform_typed, the one definition), or the full cache
 * in --kv-type. Fills *out
 * (kv_plan_free) and *device. */
int kv_budget_args_plan(const kv_budget_args *a, const kv_model *m, int context, kv_plan *out,
                        kv_device *device, kv_error *err);

/* The --kv-type value (NULL: KV_TYPE_DEFAULT). */
int kv_budget_args_type(const kv_budget_args *a, kv_cache_type *out, kv_error *err);

/* Parse a --device value (NULL = auto). */
int kv_cli_device(const char *s, kv_device *out, kv_error *err);

/* ---- --threads: one group (kv_threads_opts, cli/threads_args.c) for run, eval, profile and
 * search ---- */
typedef struct kv_threads_args {
    long threads; /* 0 = not given: the CPUs available */
} kv_threads_args;
#define KV_THREADS_OPTS_N 1
extern const kv_opt kv_threads_opts[KV_THREADS_OPTS_N];
/* The thread count to run with: --threads, else kv_cpus_available() (kvplan/workers.h). */
int kv_threads_args_count(const kv_threads_args *a);

#endif
