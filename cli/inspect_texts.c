/* kvplan inspect: the per-text table of a multi-text search (/search/texts, written by
 * kv_robust_write, include/kvplan/robust.h), as text and as JSON (cli/inspect.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "inspect.h"

#define TX "/search/texts"

/* Text i of the '\n'-joined names: its last path component into buf (control bytes and
 * anything past cap - 1 dropped, so a hostile file cannot print escapes); 0 when missing. */
static int text_name(const char *names, int i, char *buf, size_t cap) {
    const char *p = names;
    for (int k = 0; p && k < i; k++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (!p) return 0;
    size_t len = strcspn(p, "\n");
    for (size_t k = len; k > 0; k--)
        if (p[k - 1] == '/') {
            len -= k;
            p += k;
            break;
        }
    size_t n = 0;
    for (size_t k = 0; k < len && n + 1 < cap; k++)
        if ((unsigned char)p[k] >= 0x20 && p[k] != 0x7f) buf[n++] = p[k];
    buf[n] = '\0';
    return 1;
}

/* The [N, 2] tables of /search/texts, or 0 when the file has none of the right shapes. */
typedef struct texts {
    int n;
    const double *tokens, *chunks, *full, *uniform, *plan;
    const char *names;
} texts;

static int load(const ki_file *f, texts *t) {
    int r = 0, c = 0, n = 0, one = 0;
    memset(t, 0, sizeof t[0]);
    const double *m[4];
    const char *paths[4] = {TX "/chunks", TX "/full", TX "/uniform", TX "/plan"};
    for (int k = 0; k < 4; k++) {
        m[k] = ki_matrix(f, paths[k], 0, &r, &c);
        if (!m[k] || c != 2 || (k && r != n)) return 0;
        n = r;
    }
    t->tokens = ki_matrix(f, TX "/tokens", 1, &one, &c);
    if (!t->tokens || c != n) return 0;
    t->n = n;
    t->chunks = m[0], t->full = m[1], t->uniform = m[2], t->plan = m[3];
    t->names = ki_attr_str(f, TX, "names");
    return n > 0;
}

void ki_print_texts(FILE *out, const ki_file *f) {
    texts t;
    if (!load(f, &t)) return;
    const char *dec = ki_attr_str(f, TX, "decision"), *obj = ki_attr_str(f, TX, "objective");
    fprintf(out,
            "  calibration texts (/search/texts; perplexity per text and part, uniform = every "
            "head R * C tokens at b_s = p = %.0f):\n",
            ki_attr_num(f, TX, "uniform_block_size", 1));
    fprintf(out, "    %-28s %9s %-6s %7s %10s %10s %10s %9s\n", "text", "tokens", "part", "chunks",
            "full", "uniform", "plan", "plan/unif");
    for (int i = 0; i < t.n * 2; i++) {
        if (!(t.chunks[i] > 0)) continue;
        char nm[64];
        if (!t.names || !text_name(t.names, i / 2, nm, sizeof nm))
            snprintf(nm, sizeof nm, "text %d", i / 2);
        fprintf(out, "    %-28.28s %9.0f %-6s %7.0f %10.4f %10.4f %10.4f %9.4f\n", nm,
                t.tokens[i / 2], i % 2 ? "held" : "calib", t.chunks[i], t.full[i], t.uniform[i],
                t.plan[i], t.plan[i] / t.uniform[i]);
    }
    fprintf(out, "    guard: objective %s, decision %s (lambda %.2f)", obj ? obj : "?",
            dec ? dec : "?", ki_attr_num(f, TX, "lambda", NAN));
    const char *why = ki_attr_str(f, TX, "reason");
    if (why && why[0]) {
        char buf[256];
        size_t n = 0;
        for (size_t k = 0; why[k] && n + 1 < sizeof buf; k++)
            if ((unsigned char)why[k] >= 0x20 && why[k] != 0x7f) buf[n++] = why[k];
        buf[n] = '\0';
        fprintf(out, ": %s", buf);
    }
    fputc('\n', out);
}

void ki_texts_json(cJSON *search, const ki_file *f) {
    texts t;
    if (!search || !load(f, &t)) return;
    cJSON *o = cJSON_AddObjectToObject(search, "texts");
    if (!o) return;
    const char *s[3] = {"objective", "decision", "reason"};
    for (int k = 0; k < 3; k++) {
        const char *v = ki_attr_str(f, TX, s[k]);
        if (v) cJSON_AddStringToObject(o, s[k], v);
    }
    cJSON_AddNumberToObject(o, "lambda", ki_attr_num(f, TX, "lambda", NAN));
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int i = 0; rows && i < t.n * 2; i++) {
        if (!(t.chunks[i] > 0)) continue;
        cJSON *r = cJSON_CreateObject();
        if (!r) return;
        char nm[1024];
        if (t.names && text_name(t.names, i / 2, nm, sizeof nm))
            cJSON_AddStringToObject(r, "text", nm);
        cJSON_AddNumberToObject(r, "index", i / 2);
        cJSON_AddNumberToObject(r, "tokens", t.tokens[i / 2]);
        cJSON_AddStringToObject(r, "part", i % 2 ? "heldout" : "calibration");
        cJSON_AddNumberToObject(r, "chunks", t.chunks[i]);
        cJSON_AddNumberToObject(r, "full", t.full[i]);
        cJSON_AddNumberToObject(r, "uniform", t.uniform[i]);
        cJSON_AddNumberToObject(r, "plan", t.plan[i]);
        cJSON_AddItemToArray(rows, r);
    }
}
