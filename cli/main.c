/* kvplan: offline profiler and KV-cache budget planner for decoder-only LLMs. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

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

int main(int argc, char **argv) {
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
