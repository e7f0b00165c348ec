/* kvplan command line: one function per subcommand (cli/cmd_*.c) and shared option helpers.
 * Each kv_cmd_* returns the process exit code: 0 ok, 1 bad input, 2 internal error
 * (DESIGN.md CLI). Errors are printed as "kvplan <cmd>: <message>" on stderr. */
#ifndef KVPLAN_CLI_H
#define KVPLAN_CLI_H

#include "kvplan/common.h"

int kv_cmd_run(int argc, char **argv);
int kv_cmd_eval(int argc, char **argv);
int kv_cmd_tokenize(int argc, char **argv);
int kv_cmd_profile(int argc, char **argv);
int kv_cmd_search(int argc, char **argv);
int kv_cmd_plan(int argc, char **argv);
int kv_cmd_kvpr(int argc, char **argv);
int kv_cmd_batch(int argc, char **argv);
int kv_cmd_inspect(int argc, char **argv);

/* Print "kvplan <cmd>: <msg>" and return the exit code for err->code (1 or 2). */
int kv_cli_report(const char *cmd, const kv_error *err);

/* The command line joined with spaces into buf (for the `command` provenance attribute). */
void kv_cli_command_line(int argc, char **argv, char *buf, size_t cap);

/* Option scanning: if argv[*i] equals `name`, take its value from argv[*i + 1] (advancing *i)
 * into *val and return 1; when the value is missing set err and return -1; else 0. */
int kv_cli_opt(int argc, char **argv, int *i, const char *name, const char **val, kv_error *err);

#endif
