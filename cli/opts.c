/* The option engine (cli/opts.h): getopt_long over the commands' option tables. */
#include "opts.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define HELP_COL 25   /* column of the help text */
#define HELP_WIDTH 80 /* wrap before this column */
#define LONG_BASE 256 /* getopt_long val of table entry k: LONG_BASE + k */

/* The table entries of a spec, flattened: entry k is group g[k]'s option o[k]. */
typedef struct flat {
    const kv_opt *o[256];
    int g[256];
    int n;
} flat;

static void flatten(const kv_cli_spec *s, flat *f) {
    f->n = 0;
    for (int g = 0; g < KV_CLI_MAX_GROUPS && s->groups[g].opts; g++)
        for (size_t k = 0; k < s->groups[g].n && f->n < 256; k++, f->n++) {
            f->o[f->n] = &s->groups[g].opts[k];
            f->g[f->n] = g;
        }
}

static void *field(const kv_cli_spec *s, const flat *f, int k, void *args) {
    return (char *)args + s->groups[f->g[k]].off + f->o[k]->off;
}

static long to_long(double x) {
    return x >= (double)LONG_MAX ? LONG_MAX : x <= (double)LONG_MIN ? LONG_MIN : (long)x;
}

/* Store value v of option o (spelt `name`) at p. */
static int set_value(const kv_opt *o, const char *name, const char *v, void *p, kv_error *err) {
    double x = 0;
    switch (o->type) {
    case KV_OPT_FLAG:
        *(int *)p = 1;
        return KV_OK;
    case KV_OPT_STR:
        *(const char **)p = v;
        return KV_OK;
    case KV_OPT_STRS: {
        kv_opt_strs *l = p;
        if (l->n == KV_OPT_MAX_STRS)
            return kv_fail(err, KV_EINPUT, "%s %s: at most %d values may be given", name, v,
                           KV_OPT_MAX_STRS);
        l->v[l->n++] = v;
        return KV_OK;
    }
    case KV_OPT_INT:
        return kv_parse_int(v, name, to_long(o->lo), to_long(o->hi), (long *)p, err);
    case KV_OPT_NUM:
        if (!o->lo_open) return kv_parse_double(v, name, o->lo, o->hi, (double *)p, err);
        if (kv_parse_double(v, name, -HUGE_VAL, HUGE_VAL, &x, err)) return err->code;
        if (!(x > o->lo && x <= o->hi))
            return kv_fail(err, KV_EINPUT, "%s %g must be in (%g, %g]", name, x, o->lo, o->hi);
        *(double *)p = x;
        return KV_OK;
    case KV_OPT_QTY:
        if (kv_cli_parse_qty(v, name, &x, err)) return err->code;
        if (!(x >= o->lo && x <= o->hi))
            return kv_fail(err, KV_EINPUT, "%s: %g is out of range [%g, %g]", name, x, o->lo,
                           o->hi);
        *(double *)p = x;
        return KV_OK;
    }
    return kv_fail(err, KV_EINTERNAL, "%s: unknown option type", name);
}

/* The positional argument a: into the entry marked positional, once. */
static int take_positional(const kv_cli_spec *s, const flat *f, const char *a, void *args) {
    for (int k = 0; k < f->n; k++) {
        if (!f->o[k]->positional) continue;
        const char **p = field(s, f, k, args);
        if (*p) {
            fprintf(stderr, "kvplan %s: unexpected argument %s (%s is already %s)\n", s->name, a,
                    f->o[k]->meta, *p);
            return 1;
        }
        *p = a;
        return 0;
    }
    fprintf(stderr, "kvplan %s: unexpected argument %s (see kvplan %s --help)\n", s->name, a,
            s->name);
    return 1;
}

/* getopt_long's tables for the flattened entries; long options are named without "--". */
static void build_getopt(const flat *f, struct option *lo, char *shortopts) {
    int nl = 0;
    size_t ns = 0;
    shortopts[ns++] = '-'; /* non-options in order (code 1), argv not permuted */
    shortopts[ns++] = ':'; /* ':' for a missing value, no getopt messages */
    shortopts[ns++] = 'h';
    for (int k = 0; k < f->n; k++) {
        const char *names[2] = {f->o[k]->name, f->o[k]->alias};
        int has_arg = f->o[k]->type == KV_OPT_FLAG ? no_argument : required_argument;
        for (int j = 0; j < 2; j++) {
            const char *nm = names[j];
            if (!nm || nm[0] != '-') continue;
            if (nm[1] == '-') {
                lo[nl++] = (struct option){nm + 2, has_arg, NULL, LONG_BASE + k};
            } else {
                shortopts[ns++] = nm[1];
                if (has_arg) shortopts[ns++] = ':';
            }
        }
    }
    lo[nl++] = (struct option){"help", no_argument, NULL, 'h'};
    lo[nl] = (struct option){NULL, 0, NULL, 0};
    shortopts[ns] = '\0';
}

/* The entry getopt returned as code c (a short letter or LONG_BASE + k), or -1. */
static int entry_of(const flat *f, int c) {
    if (c >= LONG_BASE) return c - LONG_BASE < f->n ? c - LONG_BASE : -1;
    for (int k = 0; k < f->n; k++) {
        const char *names[2] = {f->o[k]->name, f->o[k]->alias};
        for (int j = 0; j < 2; j++)
            if (names[j] && names[j][0] == '-' && names[j][1] == c && !names[j][2]) return k;
    }
    return -1;
}

/* The spelling of entry k that `typed` uses, or NULL when typed is only a prefix of it. */
static const char *spelt(const kv_opt *o, const char *typed) {
    const char *names[2] = {o->name, o->alias};
    for (int j = 0; j < 2; j++) {
        if (!names[j]) continue;
        size_t l = strlen(names[j]);
        if (!strncmp(typed, names[j], l) && (typed[l] == '\0' || typed[l] == '=')) return names[j];
        if (names[j][1] != '-' && !strncmp(typed, names[j], 2)) return names[j]; /* -n5 */
    }
    return NULL;
}

static int apply_defaults(const kv_cli_spec *s, const flat *f, void *args) {
    kv_error err = {0};
    for (int k = 0; k < f->n; k++)
        if (f->o[k]->def &&
            set_value(f->o[k], f->o[k]->name, f->o[k]->def, field(s, f, k, args), &err))
            return kv_cli_report(s->name, &err);
    return -1;
}

int kv_cli_parse(const kv_cli_spec *s, int argc, char **argv, void *args) {
    flat f;
    flatten(s, &f);
    int code = apply_defaults(s, &f, args);
    if (code >= 0) return code;
    struct option lo[2 * 256 + 2];
    char shortopts[3 * 256 + 4];
    build_getopt(&f, lo, shortopts);
    kv_error err = {0};
    opterr = 0;
    optind = 0; /* glibc: start afresh */
    for (;;) {
        int at = optind ? optind : 1;
        int c = getopt_long(argc, argv, shortopts, lo, NULL);
        if (c == -1) break;
        if (c == 'h') {
            kv_cli_help(s, stdout);
            return 0;
        }
        if (c == 1) {
            if (take_positional(s, &f, optarg, args)) return 1;
            continue;
        }
        int k = entry_of(&f, c == ':' ? optopt : c);
        const char *name = k >= 0 && c != '?' ? spelt(f.o[k], argv[at]) : NULL;
        if (c == ':' && k >= 0) {
            fprintf(stderr, "kvplan %s: %s needs a value (see kvplan %s --help)\n", s->name,
                    f.o[k]->name, s->name);
            return 1;
        }
        if (!name) {
            for (int j = 0; j < f.n; j++)
                if (f.o[j]->type == KV_OPT_FLAG && (name = spelt(f.o[j], argv[at]))) break;
            if (name)
                fprintf(stderr, "kvplan %s: %s takes no value\n", s->name, name);
            else
                fprintf(stderr, "kvplan %s: unknown option %s (see kvplan %s --help)\n", s->name,
                        argv[at], s->name);
            return 1;
        }
        if (f.o[k]->positional && *(const char **)field(s, &f, k, args)) {
            fprintf(stderr, "kvplan %s: %s %s: %s is already %s\n", s->name, name, optarg,
                    f.o[k]->meta, *(const char **)field(s, &f, k, args));
            return 1;
        }
        if (set_value(f.o[k], name, optarg, field(s, &f, k, args), &err))
            return kv_cli_report(s->name, &err);
    }
    for (int i = optind; i < argc; i++) /* after "--" */
        if (take_positional(s, &f, argv[i], args)) return 1;
    return -1;
}

/* ---- help ---- */

/* Print text from column `col`, wrapped before HELP_WIDTH, continuation lines at HELP_COL. */
static void wrap(FILE *out, const char *text, int col) {
    const char *p = text;
    int space = 0; /* a space is due before the next word on this line */
    while (*p) {
        if (*p == '\n' || *p == ' ') {
            if (*p == '\n') {
                fprintf(out, "\n%*s", HELP_COL, "");
                col = HELP_COL;
            }
            space = *p == ' ' && col > HELP_COL;
            p++;
            continue;
        }
        size_t w = strcspn(p, " \n");
        if (col > HELP_COL && col + space + (int)w >= HELP_WIDTH) {
            fprintf(out, "\n%*s", HELP_COL, "");
            col = HELP_COL;
            space = 0;
        }
        if (space) fputc(' ', out);
        fwrite(p, 1, w, out);
        col += space + (int)w;
        space = 0;
        p += w;
    }
    fputc('\n', out);
}

static void help_entry(FILE *out, const kv_opt *o) {
    char left[128], text[1024];
    int n =
        snprintf(left, sizeof left, "  %s%s%s%s%s", o->name ? o->name : "", o->alias ? ", " : "",
                 o->alias ? o->alias : "", o->meta && o->name ? " " : "", o->meta ? o->meta : "");
    if (o->positional && o->name)
        n = snprintf(left, sizeof left, "  %s, %s %s", o->meta, o->name, o->meta);
    fputs(left, out);
    if (n >= HELP_COL - 1) {
        fprintf(out, "\n%*s", HELP_COL, "");
    } else {
        fprintf(out, "%*s", HELP_COL - n, "");
    }
    size_t l = (size_t)snprintf(text, sizeof text, "%s", o->help ? o->help : "");
    if (o->def && o->def[0] && l < sizeof text)
        l += (size_t)snprintf(text + l, sizeof text - l, " (default %s)", o->def);
    if (l < sizeof text && o->type == KV_OPT_INT)
        snprintf(text + l, sizeof text - l, " [%ld, %ld]", to_long(o->lo), to_long(o->hi));
    else if (l < sizeof text && (o->type == KV_OPT_NUM || o->type == KV_OPT_QTY))
        snprintf(text + l, sizeof text - l, " %c%g, %g]", o->lo_open ? '(' : '[', o->lo, o->hi);
    wrap(out, text, HELP_COL);
}

void kv_cli_help(const kv_cli_spec *s, FILE *f) {
    fputs(s->usage, f);
    if (s->about) fputs(s->about, f);
    for (int g = 0; g < KV_CLI_MAX_GROUPS && s->groups[g].opts; g++) {
        fprintf(f, "\n%s:\n", s->groups[g].title ? s->groups[g].title : "options");
        for (size_t k = 0; k < s->groups[g].n; k++) help_entry(f, &s->groups[g].opts[k]);
    }
    if (s->footer) fputs(s->footer, f);
}
