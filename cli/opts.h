/* The option engine of the kvplan commands: each command declares its options once, as tables
 * (name, type, range, default, help), and the engine parses the command line with getopt_long
 * from them and prints --help from them.
 *
 * Values land in the command's argument struct: an option's `off` is the offset of its field
 * in its group's struct, and the group's `off` the offset of that struct in the command's
 * (offsetof), so the tables are static const and one group (the KV budget options) serves
 * several commands. Both `--opt value` and `--opt=value` work; an option must be spelt in
 * full (no getopt prefix matching). The command's one positional argument (MODEL, FILE.h5)
 * fills the option marked `positional`, which is also accepted by name (MODEL or --model).
 *
 * Adding an option is one table row and one field: e.g. a KV element type in the budget group
 * is `const char *kv_type;` in kv_budget_args plus
 *   {"--kv-type", NULL, KV_OPT_STR, offsetof(kv_budget_args, kv_type), "T", .help = "..."}
 * in kv_budget_opts (cli/budget_args.c); the parser and --help pick it up. */
#ifndef KVPLAN_CLI_OPTS_H
#define KVPLAN_CLI_OPTS_H

#include <stddef.h>
#include <stdio.h>

typedef enum kv_opt_type {
    KV_OPT_FLAG, /* no value; sets an int to 1 */
    KV_OPT_STR,  /* const char * (points into argv or at the default) */
    KV_OPT_INT,  /* long, whole number in [lo, hi] */
    KV_OPT_NUM,  /* double, finite number in [lo, hi] (or (lo, hi] with lo_open) */
    KV_OPT_QTY,  /* double with an optional SI / binary suffix (kv_cli_parse_qty), in [lo, hi] */
    KV_OPT_STRS, /* kv_opt_strs: a string option that may be given up to KV_OPT_MAX_STRS times,
                  * each value appended in command-line order (e.g. --text A --text B) */
} kv_opt_type;

#define KV_OPT_MAX_STRS 16

/* The values of a KV_OPT_STRS option (pointers into argv or at the default). */
typedef struct kv_opt_strs {
    const char *v[KV_OPT_MAX_STRS];
    int n;
} kv_opt_strs;

typedef struct kv_opt {
    const char *name;  /* "--ratio" or a one-letter "-n" */
    const char *alias; /* a second spelling ("--output" for "-o"), or NULL */
    kv_opt_type type;
    size_t off;       /* offset of the value in the group's struct (type as above) */
    const char *meta; /* the value's name in --help ("R"); NULL for flags */
    double lo, hi;    /* inclusive range of INT, NUM and QTY values */
    int lo_open;      /* NUM: lo itself is refused: (lo, hi] */
    const char *def;  /* default as typed on the command line: applied before parsing and
                       * shown in --help; NULL: the field keeps its initial value and the help
                       * text says what the default is */
    const char *help; /* one paragraph; '\n' forces a line break */
    int positional;   /* STR: the command's positional argument also fills it */
} kv_opt;

typedef struct kv_opt_group {
    const char *title; /* heading in --help, NULL: the command's own options */
    const kv_opt *opts;
    size_t n;
    size_t off; /* offset of the group's struct in the command's argument struct */
} kv_opt_group;

#define KV_CLI_MAX_GROUPS 4

typedef struct kv_cli_spec {
    const char *name;   /* the command ("run") */
    const char *usage;  /* "usage: kvplan run MODEL ..." lines, '\n'-terminated */
    const char *about;  /* what the command does, '\n'-terminated (may be NULL) */
    const char *footer; /* printed after the options (may be NULL) */
    kv_opt_group groups[KV_CLI_MAX_GROUPS]; /* unused slots have opts == NULL */
} kv_cli_spec;

/* Parse argv[1..argc-1] (argv[0] is the command's name) into args, the command's argument
 * struct: the defaults of every table entry are applied first, then each option in order.
 * --help / -h prints kv_cli_help to stdout. Errors print "kvplan <cmd>: <message>" on stderr:
 * an unknown option, a missing value ("--ratio needs a value"), a value outside its range
 * (naming the option and the range, e.g. "--ratio 1.5 must be in (0, 1]" or
 * "--block-size: 0 is out of range [1, 4096]"), a second positional argument.
 * Returns -1 when the command should go on, else its exit code (0 after --help, 1 for bad
 * input). Not reentrant (getopt_long's state). */
int kv_cli_parse(const kv_cli_spec *s, int argc, char **argv, void *args);

/* The command's help: usage, about, then one line per table entry (name, alias, value name,
 * help, default and range), group by group, then the footer. */
void kv_cli_help(const kv_cli_spec *s, FILE *f);

/* The spec of each command, NULL-terminated (cli/commands.c), e.g. for tests of the help. */
typedef struct kv_cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
    const kv_cli_spec *spec;
} kv_cli_command;
const kv_cli_command *kv_cli_commands(size_t *n);

#endif
