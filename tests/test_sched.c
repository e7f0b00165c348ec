/* The iteration-level scheduler (kvplan/sched.h) on the real stories260K checkpoint, TinyStories
 * prompts and the bundled plans: a request's reservation is its plan's per-head blocks in the
 * plan's KV types; admission stops at the KV memory and resumes as requests finish; finished
 * and cancelled requests give every block back; and every request's tokens equal kv_generate's
 * (the `kvplan run` path) for the same prompt, plan and seed, whatever ran beside it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/generate.h"
#include "kvplan/sched.h"
#include "testutil.h"

#define M260 "models/stories260K/stories260K.bin"
#define TEXT "text/tinystories_val_head.txt"
#define PLAN8 KVPLAN_SOURCE_DIR "/plans/stories260K.r1-8.h5"
#define NP 10

/* What one request received. */
typedef struct got {
    int toks[512];
    int n, events, ended;
    kv_finish finish;
    int stop_after; /* return 1 after this many tokens (0: never) */
} got;

static int on_event(void *user, const kv_sched_event *ev) {
    got *g = user;
    g->events++;
    if (ev->finish != KV_FINISH_NONE) {
        CU_ASSERT_EQUAL(g->ended, 0);
        g->ended = 1;
        g->finish = ev->finish;
        return 0;
    }
    CU_ASSERT_EQUAL(ev->n_generated, g->n + 1);
    g->toks[g->n++] = ev->token;
    return g->stop_after && g->n >= g->stop_after;
}

/* NP prompts: the first lines of the TinyStories text, cut to 20 + 9 i bytes. */
static char **prompts(void) {
    char *data = NULL;
    size_t len = 0;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_read_file(tu_shared(TEXT), &data, &len, &err) == KV_OK);
    char **p = calloc(NP, sizeof *p);
    char *line = strtok(data, "\n");
    for (int i = 0; i < NP && line; line = strtok(NULL, "\n")) {
        if (strlen(line) < 80) continue;
        p[i] = strndup(line, (size_t)(20 + 9 * i));
        i++;
    }
    free(data);
    for (int i = 0; i < NP; i++) CU_ASSERT_FATAL(p[i] != NULL);
    return p;
}

static void free_prompts(char **p) {
    for (int i = 0; i < NP; i++) free(p[i]);
    free(p);
}

static void load_plan(const kv_model *m, int full, kv_plan *plan) {
    kv_error err = {0};
    int rc = full ? kv_plan_full(&m->cfg, m->cfg.seq_len, 16, 16, KV_POLICY_SINK, plan, &err)
                  : kv_plan_read(PLAN8, plan, &err);
    if (rc) printf("\n    %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
}

/* kv_generate's tokens (the `kvplan run` path) for one prompt, alone on its own engine. */
static int reference(const kv_model *m, const kv_tokenizer *tok, const kv_plan *plan,
                     const char *prompt, int max_new, float temp, uint64_t seed, int *out) {
    kv_engine *e = NULL;
    kv_error err = {0};
    kv_engine_opts eo = {.max_seqs = 1, .n_threads = 1};
    CU_ASSERT_FATAL(kv_engine_new(m, plan, &eo, &e, &err) == KV_OK);
    kv_gen_opts go = {.prompts = &prompt,
                      .n_prompts = 1,
                      .n_seqs = 1,
                      .max_new = max_new,
                      .temperature = temp,
                      .top_p = 0.9f,
                      .seed = seed};
    kv_gen_result r = {0};
    CU_ASSERT_FATAL(kv_generate(e, m, tok, &go, &r, &err) == KV_OK);
    int n = r.seqs[0].n - r.seqs[0].n_prompt;
    memcpy(out, r.seqs[0].ids + r.seqs[0].n_prompt, (size_t)n * sizeof *out);
    kv_gen_result_free(&r);
    kv_engine_free(e);
    return n;
}

static kv_sched_status submit(kv_sched *s, const kv_tokenizer *tok, const char *prompt, int max_new,
                              float temp, uint64_t seed, got *g, uint64_t *id) {
    int *ids = NULL, n = 0;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n, &err) == 0);
    kv_sched_request r = {ids, n, max_new, temp, 0.9f, seed, on_event, g};
    kv_sched_status st = kv_sched_submit(s, &r, id, &err);
    free(ids);
    return st;
}

/* Step until nothing runs or is queued; checks the bytes against kv_mem at every step. */
static void drain(kv_sched *s, size_t kv_mem, int *peak_running) {
    kv_sched_stats st;
    for (int k = 0; k < 100000; k++) {
        kv_error err = {0};
        int rc = kv_sched_step(s, NULL, &err);
        if (rc) printf("\n    %s\n", err.msg);
        CU_ASSERT_FATAL(rc == KV_OK);
        kv_sched_stats_get(s, &st);
        CU_ASSERT(st.kv_in_use <= st.kv_reserved);
        CU_ASSERT(st.kv_reserved <= kv_mem);
        if (peak_running && st.running > *peak_running) *peak_running = st.running;
        if (st.running == 0 && st.queued == 0) break;
    }
}

/* The reservation by hand: per head ceil(min(B + p, prompt + new, C) / b_s) blocks of
 * 2 b_s rows of its type. */
static size_t bytes_by_hand(const kv_plan *p, int d_h, int n_tok, int max_new) {
    size_t sum = 0;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++) {
        long t = p->full ? p->context : p->budget[i] + p->evict_block;
        if (t > n_tok + max_new) t = n_tok + max_new;
        if (t > p->context) t = p->context;
        long blocks = (t + p->block_size - 1) / p->block_size;
        sum += (size_t)blocks * 2 * (size_t)p->block_size * kv_type_row_bytes(p->kv_type[i], d_h);
    }
    return sum;
}

/* Every request's tokens equal its lone kv_generate, with requests arriving while others run,
 * admission limited to a few at a time by kv_mem, greedy and sampled alike. */
static void check_same_tokens(int full) {
    kv_model *m = tu_load_shared(M260);
    kv_tokenizer *tok = NULL;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_tokenizer_load(NULL, m, &tok, &err) == KV_OK);
    kv_plan plan;
    load_plan(m, full, &plan);
    char **p = prompts();
    const int max_new = 96;
    kv_engine *e = NULL;
    kv_engine_opts eo = {.max_seqs = NP, .n_threads = 2};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &eo, &e, &err) == KV_OK);
    kv_sched *s = NULL;
    size_t one = 0;
    kv_sched_opts so = {.kv_mem = 1, .step_tokens = 16};
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    one = kv_sched_request_bytes(s, 30, max_new);
    kv_sched_free(s);
    so.kv_mem = 4 * one; /* about four requests at once */
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    got *g = calloc(NP, sizeof *g);
    int peak = 0;
    for (int i = 0; i < NP; i++) {
        float temp = i % 3 == 2 ? 0.8f : 0.0f;
        CU_ASSERT_EQUAL(submit(s, tok, p[i], max_new, temp, 7 + (uint64_t)i, &g[i], NULL),
                        KV_SCHED_OK);
        for (int k = 0; k < 1 + i % 4; k++) CU_ASSERT(kv_sched_step(s, NULL, &err) == KV_OK);
    }
    drain(s, so.kv_mem, &peak);
    CU_ASSERT(peak >= 2 && peak <= 5);
    for (int i = 0; i < NP; i++) {
        int ref[512];
        float temp = i % 3 == 2 ? 0.8f : 0.0f;
        int n = reference(m, tok, &plan, p[i], max_new, temp, 7 + (uint64_t)i, ref);
        CU_ASSERT(g[i].ended && g[i].n == n);
        CU_ASSERT(g[i].finish == (n == max_new ? KV_FINISH_LENGTH : KV_FINISH_STOP));
        CU_ASSERT(n > 0 && memcmp(g[i].toks, ref, (size_t)n * sizeof *ref) == 0);
        if (g[i].n != n || memcmp(g[i].toks, ref, (size_t)n * sizeof *ref))
            printf("\n    prompt %d: %d tokens, kv_generate %d, differ\n", i, g[i].n, n);
    }
    CU_ASSERT_EQUAL(kv_engine_bytes_in_use(e), 0);
    kv_sched_free(s);
    free(g);
    kv_engine_free(e);
    free_prompts(p);
    kv_plan_free(&plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
}

static void test_same_tokens_full(void) {
    check_same_tokens(1);
}
static void test_same_tokens_plan8(void) {
    check_same_tokens(0);
}

/* Admission by bytes: the same kv_mem (8 full-context requests of the full cache) admits 8
 * full-cache requests and >= 6x as many under the 1/8 plan; the rest wait in the queue. */
static void check_admission(int full, size_t kv_mem, int *admitted, size_t *req_bytes) {
    kv_model *m = tu_load_shared(M260);
    kv_tokenizer *tok = NULL;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_tokenizer_load(NULL, m, &tok, &err) == KV_OK);
    kv_plan plan;
    load_plan(m, full, &plan);
    char **p = prompts();
    kv_engine *e = NULL;
    kv_engine_opts eo = {.max_seqs = 80, .n_threads = 2};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &eo, &e, &err) == KV_OK);
    kv_sched *s = NULL;
    kv_sched_opts so = {.kv_mem = kv_mem ? kv_mem : 1};
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    int *ids = NULL, n = 0;
    CU_ASSERT_FATAL(kv_tokenizer_encode(tok, p[0], strlen(p[0]), 1, &ids, &n, &err) == 0);
    int max_new = m->cfg.seq_len - n;
    *req_bytes = kv_sched_request_bytes(s, n, max_new);
    CU_ASSERT_EQUAL(*req_bytes, bytes_by_hand(&plan, m->cfg.head_dim, n, max_new));
    if (kv_mem) {
        got *g = calloc(80, sizeof *g);
        for (int i = 0; i < 80; i++) {
            g[i].stop_after = 3; /* ends early; the reservation is still its full context */
            CU_ASSERT_EQUAL(submit(s, tok, p[0], max_new, 0.0f, 1, &g[i], NULL), KV_SCHED_OK);
        }
        CU_ASSERT(kv_sched_step(s, NULL, &err) == KV_OK);
        kv_sched_stats st;
        kv_sched_stats_get(s, &st);
        *admitted = st.running;
        CU_ASSERT_EQUAL(st.kv_reserved, (size_t)st.running * *req_bytes);
        CU_ASSERT(st.kv_reserved + *req_bytes > kv_mem || st.running == 80);
        CU_ASSERT_EQUAL(st.queued, 80 - st.running);
        CU_ASSERT(st.kv_in_use > 0 && st.kv_in_use <= st.kv_reserved);
        drain(s, kv_mem, NULL);
        kv_sched_stats_get(s, &st);
        CU_ASSERT_EQUAL(st.finished[KV_FINISH_STOP], 80);
        CU_ASSERT_EQUAL(st.kv_reserved, 0);
        CU_ASSERT_EQUAL(kv_engine_bytes_in_use(e), 0);
        CU_ASSERT(st.kv_peak <= kv_mem);
        for (int i = 0; i < 80; i++) CU_ASSERT(g[i].ended && g[i].n == 3);
        free(g);
    }
    free(ids);
    kv_sched_free(s);
    kv_engine_free(e);
    free_prompts(p);
    kv_plan_free(&plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
}

static void test_admission_by_bytes(void) {
    size_t full_bytes = 0, plan_bytes = 0;
    int a_full = 0, a_plan = 0;
    check_admission(1, 0, &a_full, &full_bytes);
    size_t kv_mem = 8 * full_bytes + full_bytes / 2;
    check_admission(1, kv_mem, &a_full, &full_bytes);
    check_admission(0, kv_mem, &a_plan, &plan_bytes);
    CU_ASSERT_EQUAL(a_full, 8);
    CU_ASSERT_EQUAL(a_plan, (int)(kv_mem / plan_bytes < 80 ? kv_mem / plan_bytes : 80));
    CU_ASSERT(a_plan >= 6 * a_full);
    printf("\n    kv_mem %zu: full cache %zu bytes/request, %d admitted; 1/8 plan %zu, %d\n",
           kv_mem, full_bytes, a_full, plan_bytes, a_plan);
}

/* A cancelled request (running or queued) ends with KV_FINISH_CANCELLED and its blocks and
 * reservation are back at the next step; refusals: queue full, too big, stopping. */
static void test_cancel_and_refusals(void) {
    kv_model *m = tu_load_shared(M260);
    kv_tokenizer *tok = NULL;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_tokenizer_load(NULL, m, &tok, &err) == KV_OK);
    kv_plan plan;
    load_plan(m, 1, &plan);
    char **p = prompts();
    kv_engine *e = NULL;
    kv_engine_opts eo = {.max_seqs = 4, .n_threads = 2};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &eo, &e, &err) == KV_OK);
    kv_sched *s = NULL;
    kv_sched_opts so = {.kv_mem = 1, .max_queue = 2};
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    size_t one = kv_sched_request_bytes(s, 40, 200);
    kv_sched_free(s);
    so.kv_mem = one + one / 2; /* one request at a time */
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    got g[4] = {0};
    uint64_t id0 = 0, id1 = 0;
    CU_ASSERT_EQUAL(submit(s, tok, p[1], 200, 0.0f, 1, &g[0], &id0), KV_SCHED_OK);
    CU_ASSERT_EQUAL(submit(s, tok, p[1], 200, 0.0f, 1, &g[1], &id1), KV_SCHED_OK);
    CU_ASSERT_EQUAL(submit(s, tok, p[1], 200, 0.0f, 1, &g[2], NULL), KV_SCHED_QUEUE_FULL);
    CU_ASSERT_EQUAL(submit(s, tok, p[1], 500, 0.0f, 1, &g[2], NULL), KV_SCHED_TOO_BIG);
    for (int k = 0; k < 5; k++) CU_ASSERT(kv_sched_step(s, NULL, &err) == KV_OK);
    kv_sched_stats st;
    kv_sched_stats_get(s, &st);
    CU_ASSERT(st.running == 1 && st.queued == 1 && st.admission_waits >= 5);
    CU_ASSERT(g[0].n >= 4 && g[1].n == 0 && kv_engine_bytes_in_use(e) > 0);
    size_t reserved_one = st.kv_reserved;
    CU_ASSERT(reserved_one > 0 && reserved_one <= so.kv_mem);
    kv_sched_cancel(s, id0);
    CU_ASSERT(kv_sched_step(s, NULL, &err) == KV_OK); /* closes 0, admits 1 */
    CU_ASSERT(g[0].ended && g[0].finish == KV_FINISH_CANCELLED);
    kv_sched_stats_get(s, &st);
    CU_ASSERT(st.running == 1 && st.queued == 0 && st.kv_reserved == reserved_one);
    kv_sched_cancel(s, id1);
    CU_ASSERT(kv_sched_step(s, NULL, &err) == KV_OK);
    CU_ASSERT(g[1].ended && g[1].finish == KV_FINISH_CANCELLED);
    kv_sched_stats_get(s, &st);
    CU_ASSERT(st.running == 0 && st.kv_reserved == 0 && kv_engine_bytes_in_use(e) == 0);
    CU_ASSERT_EQUAL(st.finished[KV_FINISH_CANCELLED], 2);
    CU_ASSERT_EQUAL(st.refused_queue_full, 1);
    /* stopping: a queued request is cancelled, a new one refused, kv_sched_run returns */
    CU_ASSERT_EQUAL(submit(s, tok, p[1], 10, 0.0f, 1, &g[3], NULL), KV_SCHED_OK);
    kv_sched_stop(s, 0);
    CU_ASSERT_EQUAL(submit(s, tok, p[1], 10, 0.0f, 1, &g[2], NULL), KV_SCHED_STOPPING);
    CU_ASSERT(kv_sched_run(s, &err) == KV_OK);
    CU_ASSERT(g[3].ended && g[3].finish == KV_FINISH_CANCELLED && g[2].events == 0);
    kv_sched_free(s);
    kv_engine_free(e);
    free_prompts(p);
    kv_plan_free(&plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"same tokens as kv_generate, full cache", test_same_tokens_full},
        {"same tokens as kv_generate, 1/8 plan", test_same_tokens_plan8},
        {"admission by the plan's bytes", test_admission_by_bytes},
        {"cancel frees blocks, refusals", test_cancel_and_refusals},
    };
    return tu_main(argc, argv, "sched", tests, sizeof tests / sizeof tests[0]);
}
