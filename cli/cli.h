/* kvplan command line: one function per subcommand (cli/cmd_*.c) and shared option helpers.
 * Each kv_cmd_* returns the process exit code: 0 ok, 1 bad input, 2 internal error
 * (DESIGN.md CLI). Errors are printed as "kvplan <cmd>: <message>" on stderr. */
#ifndef KVPLAN_CLI_H
#define KVPLAN_CLI_H

#include "kvplan/common.h"
#include "kvplan/backend.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "kvplan/tasks.h"

int kv_cmd_run(int argc, char **argv);
int kv_cmd_eval(int argc, char **argv);
int kv_cmd_tokenize(int argc, char **argv);
int kv_cmd_profile(int argc, char **argv);
int kv_cmd_search(int argc, char **argv);
int kv_cmd_plan(int argc, char **argv);
int kv_cmd_kvpr(int argc, char **argv);
int kv_cmd_batch(int argc, char **argv);
int kv_cmd_inspect(int argc, char **argv);

/* kv_model_load, then the BLAS thread count for the model: unless the user set
 * OPENBLAS_NUM_THREADS, models whose weights fit in KV_CLI_SMALL_MODEL_BYTES run their GEMMs
 * on one thread. Measured on the bundled models (2-core Xeon): waking OpenBLAS's thread pool
 * for matrices of 64 x 172 costs more than the work, e.g. stories260K budgeted eval 6.7k vs
 * 10.3k tokens/s. A process-wide setting made by the command, not by the library. */
#define KV_CLI_SMALL_MODEL_BYTES (16u << 20)
int kv_cli_load_model(const char *path, kv_model **m, kv_error *err);

/* A command's non-option argument: the first is MODEL (stored in *model_path); an unknown
 * option or a second positional argument prints "kvplan <cmd>: ..." with a pointer to --help.
 * Returns 0 when taken, else the exit code 1. */
int kv_cli_take_model(const char *cmd, const char *arg, const char **model_path);

/* Print "kvplan <cmd>: <msg>" and return the exit code for err->code (1 or 2). */
int kv_cli_report(const char *cmd, const kv_error *err);

/* The end of a command that ran under kv_tasks (profile, search): rank 0 reports err when rc
 * is not KV_OK ("kvplan <cmd>: ...") and sends its exit code to every rank; workers print
 * nothing and return rank 0's code. Finalises tasks (MPI) in every rank. Returns the exit
 * code (0, 1 or 2). */
int kv_cli_finish_tasks(const char *cmd, kv_tasks *tasks, int rc, const kv_error *err);

/* The command line joined with spaces into buf (for the `command` provenance attribute). */
void kv_cli_command_line(int argc, char **argv, char *buf, size_t cap);

/* Option scanning: if argv[*i] equals `name`, take its value from argv[*i + 1] (advancing *i)
 * into *val and return 1; when the value is missing set err and return -1; else 0. */
int kv_cli_opt(int argc, char **argv, int *i, const char *name, const char **val, kv_error *err);

/* A quantity with an optional SI (K, M, G, T: powers of 1000) or binary (Ki, Mi, Gi, Ti: powers
 * of 1024) suffix and an optional trailing B ("80Gi", "3.35T", "1e9"). KV_EINPUT names `opt`. */
int kv_cli_parse_qty(const char *s, const char *opt, double *out, kv_error *err);

/* A table of string-valued options: if argv[*i] is one of them, its value is stored (1), a
 * missing value sets err (-1), else 0. */
typedef struct kv_cli_optval {
    const char *name;
    const char **val;
} kv_cli_optval;
int kv_cli_opt_table(int argc, char **argv, int *i, const kv_cli_optval *t, size_t n,
                     kv_error *err);
/* A table of numeric options: with lval set, a whole number in [llo, lhi] into *lval, else a
 * finite number in [dlo, dhi] into *dval. If argv[*i] is one of them its value is parsed and
 * stored (1); a missing or bad value sets err naming the option (-1); else 0. */
typedef struct kv_cli_numopt {
    const char *name;
    long *lval;
    long llo, lhi;
    double *dval;
    double dlo, dhi;
} kv_cli_numopt;
int kv_cli_num_table(int argc, char **argv, int *i, const kv_cli_numopt *t, size_t n,
                     kv_error *err);

/* The whole command line of a command whose options are all in table t plus --json (stored in
 * *json) and --help (prints `help`). Returns -1 when every argument was taken, else the exit
 * code to return (0 after --help, 1 for an unknown or incomplete option, with the message). */
int kv_cli_scan(const char *cmd, int argc, char **argv, const kv_cli_optval *t, size_t n,
                const char *help, int *json);

/* ---- KV budget options shared by run and eval ----
 * --plan PLAN | --ratio R [--allocation uniform], --policy P, --evict-block p, --block-size b,
 * --device D */
typedef struct kv_budget_args {
    const char *plan;       /* plan.h5 path or NULL */
    double ratio;           /* 0 = not given */
    const char *allocation; /* "uniform" */
    const char *policy;     /* NULL = the plan's, else sink */
    long evict_block;       /* 0 = the plan's, else 16 */
    long block_size;        /* 0 = the plan's or 16 */
    const char *device;     /* NULL = auto */
} kv_budget_args;

/* Take one budget option at argv[*i]: 1 taken, 0 not a budget option, -1 error. */
int kv_budget_args_take(kv_budget_args *a, int argc, char **argv, int *i, kv_error *err);

/* The plan these options describe, for context C: the plan file (checked against the model
 * and the context; --policy sets every head's policy, --evict-block / --block-size override),
 * uniform at --ratio (kv_plan_uniform, the one definition), or the full cache. Fills *out
 * (kv_plan_free) and *device. */
int kv_budget_args_plan(const kv_budget_args *a, const kv_model *m, int context, kv_plan *out,
                        kv_device *device, kv_error *err);

/* Parse a --device value (NULL = auto). */
int kv_cli_device(const char *s, kv_device *out, kv_error *err);

/* Usage text of the budget options. */
extern const char kv_budget_args_help[];

#endif
