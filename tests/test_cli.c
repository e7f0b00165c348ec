/* The command line's option engine (cli/opts.h), through the kvplan binary: `--opt value` and
 * `--opt=value` give the same results in every command that takes a model, MODEL positional
 * equals --model, --help lists every entry of each command's option tables, and a value
 * outside its range is refused with a message naming the option and the range. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/cli.h"
#include "testutil.h"

#define M260 "models/stories260K/stories260K.bin"
#define TOK260 "models/stories260K/tok512.bin"
#define TEXT "text/tinystories_val_head.txt"

/* args with each '@' (between an option and its value) turned into ' ' or '=', and each
 * "{M}" into the model: "--model@'path'" or the positional 'path'. */
static void expand(const char *tmpl, int eq, int positional, char *out, size_t cap) {
    size_t n = 0;
    char model[4200];
    if (positional)
        snprintf(model, sizeof model, "'%s'", tu_shared(M260));
    else
        snprintf(model, sizeof model, "--model%c'%s'", eq ? '=' : ' ', tu_shared(M260));
    for (const char *p = tmpl; *p && n + 1 < cap; p++) {
        if (!strncmp(p, "{M}", 3)) {
            n += (size_t)snprintf(out + n, cap - n, "%s", model);
            if (n >= cap) n = cap - 1;
            p += 2;
        } else {
            out[n++] = *p == '@' ? (eq ? '=' : ' ') : *p;
        }
    }
    out[n] = '\0';
}

/* Output without the lines that carry wall times or speeds. */
static void drop_timing(char *s) {
    static const char *const timed[] = {"tokens/s", "tokens_per_s", "token evals",      "cost   ",
                                        "speed   ", " s (",         "chunk evaluations"};
    char *w = s;
    for (char *line = s; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line + 1) : strlen(line);
        int keep = 1;
        for (size_t k = 0; k < sizeof timed / sizeof timed[0]; k++) {
            char *hit = strstr(line, timed[k]);
            if (hit && hit < line + len) keep = 0;
        }
        if (keep) memmove(w, line, len), w += len;
        line += len;
    }
    *w = '\0';
}

/* Run `kvplan <args>` (stdout and stderr) and then `kvplan inspect <out> --export <exp>` when
 * exp is set; the exit code of the command, *text the outputs without timing lines. */
static int run_case(const char *args, const char *out, const char *exp, char **text) {
    char *a = NULL, *b = NULL, cmd[8192];
    int rc = tu_run_kvplan(args, &a, 1);
    if (!rc && exp) {
        snprintf(cmd, sizeof cmd, "inspect '%s' --export %s", out, exp);
        rc = tu_run_kvplan(cmd, &b, 1);
    }
    size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
    *text = malloc(la + lb + 1);
    memcpy(*text, a ? a : "", la);
    memcpy(*text + la, b ? b : "", lb + 1);
    free(a);
    free(b);
    drop_timing(*text);
    return rc;
}

/* One command in three spellings: --model and options as `--opt value`, as `--opt=value`, and
 * MODEL positional; all must succeed with the same output. */
static void same_three_ways(const char *tmpl, const char *out, const char *exp) {
    char args[3][8192], *text[3] = {NULL, NULL, NULL};
    const int eq[3] = {0, 1, 0}, pos[3] = {0, 0, 1};
    for (int k = 0; k < 3; k++) {
        expand(tmpl, eq[k], pos[k], args[k], sizeof args[k]);
        int rc = run_case(args[k], out, exp, &text[k]);
        if (rc) printf("\n    kvplan %s: exit %d: %s\n", args[k], rc, text[k]);
        CU_ASSERT_EQUAL(rc, 0);
    }
    CU_ASSERT_FATAL(text[0] && text[1] && text[2]);
    CU_ASSERT(strlen(text[0]) > 20);
    for (int k = 1; k < 3; k++) {
        if (strcmp(text[0], text[k]))
            printf("\n    '%s' and '%s' differ:\n%s\n----\n%s\n", args[0], args[k], text[0],
                   text[k]);
        CU_ASSERT_STRING_EQUAL(text[0], text[k]);
    }
    for (int k = 0; k < 3; k++) free(text[k]);
}

static void test_run(void) {
    char t[4096];
    snprintf(t, sizeof t,
             "run {M} --tokenizer@'%s' --prompt@'Once upon a time' --temperature@0 -n 40 "
             "--seed@5 --top-p@0.8 --ratio@0.25 --allocation@uniform --policy@h2o "
             "--evict-block@4 --block-size@8 --device@cpu",
             tu_shared(TOK260));
    same_three_ways(t, NULL, NULL);
}

static void test_eval(void) {
    char t[4096];
    snprintf(t, sizeof t,
             "eval {M} --tokenizer@'%s' --text@'%s' --max-tokens@1024 --context@256 --quiet "
             "--json --ratio@0.5 --allocation@uniform --evict-block@8 --policy@avgattn",
             tu_shared(TOK260), tu_shared(TEXT));
    same_three_ways(t, NULL, NULL);
}

static void test_tokenize(void) {
    const char *txt = tu_tmp("t.txt");
    FILE *f = fopen(txt, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("Tom and Sue went to the park. The little bird sang.\n", f);
    fclose(f);
    char t[4096];
    snprintf(t, sizeof t, "tokenize {M} --tokenizer@'%s' --text@'%s' --no-bos", tu_shared(TOK260),
             txt);
    same_three_ways(t, NULL, NULL);
}

static void test_profile(void) {
    char t[4096];
    const char *out = tu_tmp("profile.h5");
    snprintf(t, sizeof t,
             "profile {M} --tokenizer@'%s' --text@'%s' --prompts@2 --prompt-len@32 --seed@3 "
             "--no-hw --quiet --device@cpu -o '%s'",
             tu_shared(TOK260), tu_shared(TEXT), out);
    same_three_ways(t, out, "importance-tsv");
}

static void test_plan(void) {
    char t[4096];
    const char *out = tu_tmp("plan.h5");
    snprintf(t, sizeof t,
             "plan {M} --ratio@0.25 --allocation@uniform --context@256 --evict-block@4 "
             "--block-size@8 --policy@h2o --output@'%s'",
             out);
    same_three_ways(t, out, "budgets-tsv");
}

static void test_search(void) {
    char t[4096];
    const char *out = tu_tmp("search.h5");
    snprintf(t, sizeof t,
             "search {M} --tokenizer@'%s' --text@'%s' --ratio@0.25 --allocation@uniform "
             "--context@256 --eval-tokens@1024 --heldout-tokens@0 --evict-block@8 "
             "--device@cpu --quiet --output@'%s'",
             tu_shared(TOK260), tu_shared(TEXT), out);
    same_three_ways(t, out, "budgets-tsv");
}

static void test_batch(void) {
    same_three_ways("batch {M} --device-mem@2M --prompt-len@256 --gen-len@64 --dtype-bytes@1 "
                    "--block-size@8 --hardware@l4 --json",
                    NULL, NULL);
}

static void test_kvpr(void) {
    same_three_ways("kvpr {M} --hardware@a100-40g-pcie4 --batch@8 --seq-len@512 --gen-len@10 "
                    "--dtype-bytes@2 --schedule@row --json",
                    NULL, NULL);
}

/* A help line lists `name` when name is a word of its left column ("  -o, --output PLAN"). */
static int listed(const char *help, const char *name) {
    for (const char *line = help; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len > 2 && line[0] == ' ' && line[1] == ' ' && line[2] != ' ') {
            char left[256];
            const char *end = strstr(line + 2, "  ");
            size_t l = end && end < line + len ? (size_t)(end - line) : len;
            if (l >= sizeof left) l = sizeof left - 1;
            memcpy(left, line, l);
            left[l] = '\0';
            for (char *save = NULL, *w = strtok_r(left, " ,", &save); w;
                 w = strtok_r(NULL, " ,", &save))
                if (!strcmp(w, name)) return 1;
        }
        line = nl ? nl + 1 : NULL;
    }
    return 0;
}

static void test_help_lists_every_entry(void) {
    size_t n = 0, entries = 0;
    const kv_cli_command *cmds = kv_cli_commands(&n);
    CU_ASSERT_EQUAL(n, 11); /* run eval tokenize probes profile search plan kvpr batch inspect serve */
    for (size_t c = 0; c < n; c++) {
        char args[256], *out = NULL;
        snprintf(args, sizeof args, "%s --help", cmds[c].name);
        CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
        CU_ASSERT_FATAL(out != NULL);
        CU_ASSERT(strncmp(out, "usage: kvplan ", 14) == 0);
        const kv_cli_spec *s = cmds[c].spec;
        CU_ASSERT_STRING_EQUAL(s->name, cmds[c].name);
        for (int g = 0; g < KV_CLI_MAX_GROUPS && s->groups[g].opts; g++)
            for (size_t k = 0; k < s->groups[g].n; k++, entries++) {
                const kv_opt *o = &s->groups[g].opts[k];
                const char *names[3] = {o->name, o->alias, o->positional ? o->meta : NULL};
                for (int j = 0; j < 3; j++) {
                    if (!names[j]) continue;
                    if (!listed(out, names[j]))
                        printf("\n    kvplan %s --help does not list %s\n", cmds[c].name, names[j]);
                    CU_ASSERT(listed(out, names[j]));
                }
            }
        free(out);
    }
    CU_ASSERT(entries >= 80);
}

static long to_long(double x) {
    return x >= (double)LONG_MAX ? LONG_MAX : (long)x;
}

/* Every numeric option of every command, just below its range, in both spellings. */
static void test_out_of_range_names_option_and_range(void) {
    size_t n = 0, checked = 0;
    const kv_cli_command *cmds = kv_cli_commands(&n);
    for (size_t c = 0; c < n; c++) {
        const kv_cli_spec *s = cmds[c].spec;
        for (int g = 0; g < KV_CLI_MAX_GROUPS && s->groups[g].opts; g++)
            for (size_t k = 0; k < s->groups[g].n; k++) {
                const kv_opt *o = &s->groups[g].opts[k];
                char val[64], range[96];
                if (o->type == KV_OPT_INT) {
                    snprintf(val, sizeof val, "%ld", to_long(o->lo) - 1);
                    snprintf(range, sizeof range, "[%ld, %ld]", to_long(o->lo), to_long(o->hi));
                } else if (o->type == KV_OPT_NUM || o->type == KV_OPT_QTY) {
                    snprintf(val, sizeof val, "%.17g", o->lo_open ? o->lo : o->lo - 1);
                    snprintf(range, sizeof range, "%c%g, %g]", o->lo_open ? '(' : '[', o->lo,
                             o->hi);
                } else {
                    continue;
                }
                for (int eq = 0; eq < 2; eq++) {
                    if (eq && o->name[1] != '-') continue; /* -n=5 is not a spelling */
                    char args[256], *out = NULL;
                    snprintf(args, sizeof args, "%s %s%s%s", cmds[c].name, o->name, eq ? "=" : " ",
                             val);
                    int rc = tu_run_kvplan(args, &out, 1);
                    int ok = rc == 1 && out && strstr(out, o->name) && strstr(out, range) &&
                             !strncmp(out, "kvplan ", 7);
                    if (!ok) printf("\n    kvplan %s: exit %d: %s", args, rc, out ? out : "");
                    CU_ASSERT(ok);
                    free(out);
                    checked++;
                }
            }
    }
    CU_ASSERT(checked >= 60);
    /* the budget group's ratio, by the message the other suites pin */
    char *out = NULL;
    CU_ASSERT_EQUAL(tu_run_kvplan("plan --ratio=2.5", &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "--ratio 2.5 must be in (0, 2]"));
    free(out);
}

/* Options are spelt in full (no getopt prefix matching), flags take no value, a value is
 * required, and one positional argument at most. */
static void test_refusals(void) {
    static const char *const cases[][2] = {
        {"eval --rat=0.5", "unknown option --rat=0.5"},
        {"eval --quiet=1", "--quiet takes no value"},
        {"eval --ratio", "--ratio needs a value"},
        {"tokenize a b", "unexpected argument b (MODEL is already a)"},
        {"tokenize a --model b", "MODEL is already a"},
        {"kvpr --frobnicate 3", "unknown option --frobnicate"},
        {"inspect a.h5 b.h5", "unexpected argument b.h5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = tu_run_kvplan(cases[i][0], &out, 1);
        int ok = rc == 1 && out && strstr(out, cases[i][1]);
        if (!ok) printf("\n    kvplan %s: exit %d: %s", cases[i][0], rc, out ? out : "");
        CU_ASSERT(ok);
        free(out);
    }
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"run: --opt value == --opt=value == MODEL positional", test_run},
        {"eval: --opt value == --opt=value == MODEL positional", test_eval},
        {"tokenize: --opt value == --opt=value == MODEL positional", test_tokenize},
        {"profile: --opt value == --opt=value == MODEL positional", test_profile},
        {"plan: --opt value == --opt=value == MODEL positional", test_plan},
        {"search: --opt value == --opt=value == MODEL positional", test_search},
        {"batch: --opt value == --opt=value == MODEL positional", test_batch},
        {"kvpr: --opt value == --opt=value == MODEL positional", test_kvpr},
        {"--help lists every table entry of every command", test_help_lists_every_entry},
        {"out of range: the option and its range are named",
         test_out_of_range_names_option_and_range},
        {"unknown, abbreviated, valueless and extra arguments", test_refusals},
    };
    return tu_main(argc, argv, "cli", tests, sizeof tests / sizeof tests[0]);
}
