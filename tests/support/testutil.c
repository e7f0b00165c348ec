#include "testutil.h"

#include <CUnit/Basic.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <signal.h>

#include "kvplan/common.h"
#include "kvplan/tokenizer.h"

const char *tu_shared(const char *rel) {
    static char buf[8][4096];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 4096, "%s/%s", kv_shared_dir(), rel);
    return b;
}

const char *tu_tmpdir(void) {
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvplan-test-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

const char *tu_tmp(const char *name) {
    static char buf[8][512];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 512, "%s/%s", tu_tmpdir(), name);
    return b;
}

int tu_run_sh(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = '\0';
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

long tu_header_bytes(const char *path, int lines) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int seen = 0, c;
    long n = 0;
    while (seen < lines && (c = fgetc(f)) != EOF) {
        n++;
        seen += c == '\n';
    }
    fclose(f);
    return seen == lines ? n : -1;
}

int tu_kill_when_logged(const char *cmd, const char *log, int header_lines, long tail_bytes) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int part_way = 0;
    for (long i = 0; i < 600000; i++) { /* 600,000 x 0.2 ms = 120 s */
        struct stat st;
        long h = tu_header_bytes(log, header_lines);
        if (h >= 0 && stat(log, &st) == 0 && st.st_size >= h + tail_bytes) {
            part_way = 1;
            break;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) return 0;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return part_way;
}

int tu_run_kvplan(const char *args, char **out, int merge_stderr) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s%s", KVPLAN_BINARY, args, merge_stderr ? " 2>&1" : "");
    return tu_run_sh(cmd, out);
}

double tu_json_number(const char *json, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = json ? strstr(json, pat) : NULL;
    return p ? strtod(p + strlen(pat), NULL) : (double)NAN;
}

/* Test i of suite s is selected by `want` (NULL: all): exact name, or (when no test anywhere
 * has exactly that name) a name containing it or the suite's name. */
static int tu_selected(const tu_suite *s, size_t i, const char *want, int exact) {
    if (!want) return 1;
    if (exact) return strcmp(s->tests[i].name, want) == 0;
    return strstr(s->tests[i].name, want) != NULL || strcmp(s->name, want) == 0;
}

static void tu_list(FILE *f, const tu_suite *suites, size_t n_suites) {
    for (size_t k = 0; k < n_suites; k++)
        for (size_t i = 0; i < suites[k].n_tests; i++)
            fprintf(f, "%s: %s\n", suites[k].name, suites[k].tests[i].name);
}

int tu_main_suites(int argc, char **argv, const tu_suite *suites, size_t n_suites) {
    const char *want = getenv("KVPLAN_TEST"), *prog = argc > 0 ? argv[0] : "test";
    if (want && !want[0]) want = NULL;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-l")) {
            tu_list(stdout, suites, n_suites);
            return 0;
        } else if (!strcmp(argv[a], "-t") && a + 1 < argc) {
            want = argv[++a];
        } else {
            fprintf(stderr,
                    "%s: %s '%s'\n"
                    "usage: %s [-t NAME] [-l]   (-t: only the tests named NAME, else those whose "
                    "name contains NAME; also KVPLAN_TEST=NAME; -l: list the tests)\n",
                    prog, strcmp(argv[a], "-t") ? "unknown argument" : "a test name must follow",
                    argv[a], prog);
            return 2;
        }
    }
    int exact = 0;
    size_t chosen = 0;
    for (size_t k = 0; want && k < n_suites; k++)
        for (size_t i = 0; i < suites[k].n_tests; i++)
            if (tu_selected(&suites[k], i, want, 1)) exact = 1;
    for (size_t k = 0; k < n_suites; k++)
        for (size_t i = 0; i < suites[k].n_tests; i++)
            chosen += tu_selected(&suites[k], i, want, exact);
    if (!chosen) {
        fprintf(stderr, "%s: no test named or containing '%s'; the tests are:\n", prog, want);
        tu_list(stderr, suites, n_suites);
        return 2;
    }
    /* One BLAS thread count for this process and the kvplan commands it runs, so results
     * computed here and by the CLI agree bit for bit (OPENBLAS_NUM_THREADS, default 1). */
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    openblas_set_num_threads(atoi(getenv("OPENBLAS_NUM_THREADS")));
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    for (size_t k = 0; k < n_suites; k++) {
        const tu_suite *s = &suites[k];
        CU_pSuite cs = NULL;
        for (size_t i = 0; i < s->n_tests; i++) {
            if (!tu_selected(s, i, want, exact)) continue;
            if (!cs) cs = CU_add_suite(s->name, s->init, s->cleanup);
            if (!cs || !CU_add_test(cs, s->tests[i].name, s->tests[i].fn)) {
                fprintf(stderr, "%s: cannot register %s: %s\n", prog, s->tests[i].name,
                        CU_get_error_msg());
                CU_cleanup_registry();
                return 2;
            }
        }
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    unsigned run = CU_get_number_of_tests_run();
    CU_cleanup_registry();
    return (failed || run == 0) ? 1 : 0;
}

int tu_main(int argc, char **argv, const char *suite, const tu_test *tests, size_t n) {
    const tu_suite s = {suite, NULL, NULL, tests, n};
    return tu_main_suites(argc, argv, &s, 1);
}

kv_model *tu_load_model(const char *path) {
    kv_error err = {0};
    kv_model *m = NULL;
    int rc = kv_model_load(path, &m, &err);
    if (rc) fprintf(stderr, "\n    load %s: %s\n", path, err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    return m;
}

kv_model *tu_load_shared(const char *rel) {
    return tu_load_model(tu_shared(rel));
}

int *tu_text_tokens(const kv_model *m, const char *tok_path, size_t max_bytes, int *n) {
    kv_tokenizer *t = NULL;
    kv_error err = {0};
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL;
    int rc = kv_tokenizer_load(tok_path, m, &t, &err);
    if (!rc) rc = kv_read_file(tu_shared("text/tinystories_val_head.txt"), &text, &len, &err);
    if (!rc && max_bytes && len > max_bytes) len = max_bytes;
    if (!rc) rc = kv_tokenizer_encode(t, text, len, 1, &ids, n, &err);
    if (rc) fprintf(stderr, "text tokens (%s): %s\n", tok_path ? tok_path : "model's", err.msg);
    free(text);
    kv_tokenizer_free(t);
    CU_ASSERT_FATAL(rc == KV_OK);
    return ids;
}

int *tu_roundtrip(const kv_tokenizer *t, const char *text, int *n) {
    kv_error err = {0};
    int *ids = NULL;
    char *back = NULL;
    *n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, text, strlen(text), 0, &ids, n, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_tokenizer_decode(t, ids, *n, &back, &err), KV_OK);
    CU_ASSERT_PTR_NOT_NULL(back);
    if (back) CU_ASSERT_STRING_EQUAL(back, text);
    free(back);
    return ids;
}

void tu_fake_model(kv_model *m, int n_layers, const char *sha) {
    memset(m, 0, sizeof *m);
    m->cfg.dim = 64;
    m->cfg.hidden_dim = 172;
    m->cfg.n_layers = n_layers;
    m->cfg.n_heads = 8;
    m->cfg.n_kv_heads = 4;
    m->cfg.head_dim = 8;
    m->cfg.vocab_size = 512;
    m->cfg.seq_len = 512;
    snprintf(m->format, sizeof m->format, "llama2c");
    snprintf(m->path, sizeof m->path, "models/stories260K.bin");
    snprintf(m->sha256, sizeof m->sha256, "%s", sha);
}

/* kv_hooks.after_attn of tu_prefill_capture: x_in of each layer of the S-row prefill */
static void prefill_cap_xin(void *user, int layer, int rows, const float *x_in, const float *o,
                            const float *v, const float *attn_out) {
    (void)o;
    (void)v;
    (void)attn_out;
    tu_prefill *f = user;
    if (rows == f->rows)
        memcpy(f->x_in + (size_t)layer * rows * f->dim, x_in,
               sizeof(float) * (size_t)rows * f->dim);
}

void tu_prefill_capture(const kv_model *m, const int *ids, int S, tu_prefill *f) {
    const kv_config *cfg = &m->cfg;
    int L = cfg->n_layers, Hk = cfg->n_kv_heads;
    kv_error err = {0};
    memset(f, 0, sizeof *f);
    f->rows = S;
    f->dim = cfg->dim;
    f->x_in = calloc((size_t)L * S * cfg->dim, sizeof(float));
    CU_ASSERT_FATAL(f->x_in != NULL);
    CU_ASSERT_FATAL(kv_pool_init(&f->pool, L * Hk * (S / 16 + 1), 16, cfg->head_dim, &err) ==
                    KV_OK);
    CU_ASSERT_FATAL(kv_cache_init(&f->cache, &f->pool, L, Hk, NULL, KV_POLICY_SINK, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_workspace_new(m, S, S, &f->ws, &err) == KV_OK);
    kv_hooks hk = {f, prefill_cap_xin, NULL};
    kv_cache *cp = &f->cache;
    int rc = kv_forward(m, f->ws, &cp, 1, ids, S, KV_LOGITS_NONE, NULL, &hk, &err);
    if (rc) fprintf(stderr, "prefill: %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
}

void tu_prefill_free(tu_prefill *f) {
    free(f->x_in);
    kv_workspace_free(f->ws);
    kv_cache_destroy(&f->cache);
    kv_pool_destroy(&f->pool);
    memset(f, 0, sizeof *f);
}
