/* The worker pool (include/kvplan/workers.h) and what it must not change: every chunk runs once
 * on a valid thread, across many jobs in a row; an engine's logits (prefill through the tiles,
 * pooled attention, decode through the integer / fp32 dots) are the same bits on 1, 2 and 3
 * threads for the real models; `kvplan eval --threads 1` and `--threads 2` print the same
 * perplexity. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "kvplan/quant.h"
#include "kvplan/workers.h"
#include "testutil.h"

#define M656 "models/tinystories-656k"
#define TEXT "text/tinystories_val_head.txt"

typedef struct count_job {
    int *hits;   /* [n_chunks] */
    int *bad;    /* [n_chunks] 1 when a chunk saw a thread index out of range */
    int threads; /* of the pool */
} count_job;

static void count_chunk(void *ctx, int c, int tid) {
    count_job *j = ctx;
    j->hits[c]++;
    if (tid < 0 || tid >= j->threads) j->bad[c] = 1;
}

static void test_every_chunk_once(void) {
    int sizes[] = {0, 1, 2, 3, 7, 64, 1000};
    for (int n = 1; n <= 4; n++) {
        kv_workers *w = NULL;
        CU_ASSERT_FATAL(kv_workers_new(n, &w, NULL) == KV_OK);
        CU_ASSERT_EQUAL(kv_workers_count(w), n);
        int wrong = 0;
        for (int rep = 0; rep < 300; rep++) { /* jobs in a row: the generations turn over */
            int nc = sizes[rep % 7];
            int *hits = calloc((size_t)nc + 1, sizeof *hits);
            int *bad = calloc((size_t)nc + 1, sizeof *bad);
            count_job j = {hits, bad, n};
            kv_workers_run(w, nc, count_chunk, &j);
            for (int c = 0; c < nc; c++) wrong += hits[c] != 1 || bad[c];
            free(hits);
            free(bad);
        }
        CU_ASSERT_EQUAL(wrong, 0);
        kv_workers_free(w);
    }
    /* NULL pool: the caller alone */
    int hits[5] = {0}, bad[5] = {0};
    count_job j = {hits, bad, 1};
    kv_workers_run(NULL, 5, count_chunk, &j);
    for (int c = 0; c < 5; c++) CU_ASSERT(hits[c] == 1 && !bad[c]);
    CU_ASSERT_EQUAL(kv_workers_count(NULL), 1);
    kv_workers_free(NULL);
}

static void test_counts(void) {
    int n = kv_cpus_available();
    CU_ASSERT(n >= 1);
    kv_workers *w = NULL;
    CU_ASSERT_FATAL(kv_workers_new(0, &w, NULL) == KV_OK); /* default: the CPUs available */
    CU_ASSERT_EQUAL(kv_workers_count(w), n);
    kv_workers_free(w);
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_workers_new(KV_WORKERS_MAX + 1, &w, &err), KV_EINPUT);
    CU_ASSERT_PTR_NULL(w);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "at most"));
}

/* Logits of a 512-token prefill (all rows) and 8 greedy decode steps on `threads` threads. */
static float *engine_logits_kv(kv_model *m, const int *tokens, int threads, int kv_type,
                               size_t *n_out) {
    kv_error err = {0};
    kv_plan plan = {0};
    CU_ASSERT_FATAL(kv_plan_full(&m->cfg, 512, 16, 16, KV_POLICY_SINK, &plan, &err) == KV_OK);
    if (kv_type >= 0) kv_plan_set_kv_type(&plan, (kv_cache_type)kv_type);
    kv_engine *e = NULL;
    kv_engine_opts o = {.device = KV_DEVICE_CPU, .max_seqs = 1, .n_threads = threads};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &o, &e, &err) == KV_OK);
    int V = m->cfg.vocab_size, P = 504, D = 8, seq = 0;
    float *out = malloc((size_t)(P + D) * V * sizeof *out);
    CU_ASSERT_FATAL(kv_engine_seq_open(e, NULL, NULL, &seq, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_engine_prefill(e, seq, tokens, P, KV_LOGITS_ALL, out, NULL, &err) == KV_OK);
    for (int d = 0; d < D; d++) {
        const float *last = out + (size_t)(P + d - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (last[v] > last[best]) best = v;
        CU_ASSERT_FATAL(kv_engine_decode(e, &seq, 1, &best, out + (size_t)(P + d) * V, &err) ==
                        KV_OK);
    }
    kv_engine_free(e);
    kv_plan_free(&plan);
    *n_out = (size_t)(P + D) * V;
    return out;
}

static float *engine_logits(kv_model *m, const int *tokens, int threads, size_t *n_out) {
    return engine_logits_kv(m, tokens, threads, -1, n_out);
}

static void test_engine_threads(void) {
    const char *models[] = {"models/stories260K/stories260K.gguf",
                            M656 "/TinyStories-656K.f16.gguf", M656 "/tinystories-656k-q8_0.gguf"};
    for (int i = 0; i < 3; i++) {
        kv_model *m = tu_load_shared(models[i]);
        int n = 0;
        int *tokens = tu_text_tokens(m, NULL, 16384, &n);
        CU_ASSERT_FATAL(n >= 504);
        size_t len = 0;
        float *one = engine_logits(m, tokens, 1, &len);
        int same = 1;
        for (int t = 2; t <= 3; t++) {
            float *many = engine_logits(m, tokens, t, &len);
            same &= memcmp(one, many, len * sizeof *one) == 0;
            free(many);
        }
        printf("\n  %s: 504-token prefill + 8 decode steps, logits at 1 / 2 / 3 threads %s",
               models[i], same ? "identical" : "DIFFER");
        CU_ASSERT(same);
        free(one);
        free(tokens);
        kv_model_free(m);
    }
}

/* The CPU attention's AVX2 + F16C loops (runtime/backend/backend_cpu.c) against its portable
 * loops (KVPLAN_PORTABLE_ATTENTION set when the backend is made): the same bits for every K/V
 * type and two head sizes (stories260K d_h 8, TinyStories-656K d_h 16). */
static void test_vector_attention(void) {
    if (!kv_isa_available(KV_ISA_AVX2)) {
        printf("\n  no AVX2 on this CPU: nothing to compare");
        return;
    }
    const char *models[] = {"models/stories260K/stories260K.gguf",
                            M656 "/TinyStories-656K.f16.gguf"};
    const kv_cache_type types[] = {KV_TYPE_F32, KV_TYPE_F16, KV_TYPE_Q8, KV_TYPE_Q4};
    for (int i = 0; i < 2; i++) {
        kv_model *m = tu_load_shared(models[i]);
        int n = 0;
        int *tokens = tu_text_tokens(m, NULL, 16384, &n);
        CU_ASSERT_FATAL(n >= 504);
        for (int k = 0; k < 4; k++) {
            size_t len = 0;
            float *vec = engine_logits_kv(m, tokens, 2, (int)types[k], &len);
            setenv("KVPLAN_PORTABLE_ATTENTION", "1", 1);
            float *ref = engine_logits_kv(m, tokens, 2, (int)types[k], &len);
            unsetenv("KVPLAN_PORTABLE_ATTENTION");
            int same = memcmp(vec, ref, len * sizeof *vec) == 0;
            printf("\n  %s, K/V %s: vector / portable attention logits %s", models[i],
                   kv_type_name(types[k]), same ? "identical" : "DIFFER");
            CU_ASSERT(same);
            free(vec);
            free(ref);
        }
        free(tokens);
        kv_model_free(m);
    }
}

static void test_cli_threads(void) {
    char *out[2] = {NULL, NULL};
    char args[1024];
    for (int t = 0; t < 2; t++) {
        snprintf(args, sizeof args,
                 "eval %s --text %s --max-tokens 2048 --json --quiet --threads %d",
                 tu_shared(M656 "/tinystories-656k-q8_0.gguf"), tu_shared(TEXT), t + 1);
        CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out[t], 0), 0);
    }
    /* the JSON line up to the timing */
    const char *p[2];
    for (int t = 0; t < 2; t++) {
        p[t] = strstr(out[t], "{\"perplexity\":");
        CU_ASSERT_PTR_NOT_NULL_FATAL(p[t]);
    }
    const char *e0 = strstr(p[0], "\"tokens_per_s\""), *e1 = strstr(p[1], "\"tokens_per_s\"");
    CU_ASSERT_PTR_NOT_NULL_FATAL(e0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(e1);
    CU_ASSERT_EQUAL(e0 - p[0], e1 - p[1]);
    CU_ASSERT(e0 - p[0] == e1 - p[1] && !memcmp(p[0], p[1], (size_t)(e0 - p[0])));
    printf("\n  eval --threads 1 / 2: %.*s", (int)(e0 - p[0]), p[0]);
    /* a bad count: one line, exit 1 */
    char *bad = NULL;
    snprintf(args, sizeof args, "eval %s --text %s --threads 0",
             tu_shared(M656 "/tinystories-656k-q8_0.gguf"), tu_shared(TEXT));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &bad, 1), 1);
    CU_ASSERT_TRUE(bad && strstr(bad, "--threads"));
    free(bad);
    free(out[0]);
    free(out[1]);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"every chunk once, on a valid thread, 300 jobs in a row", test_every_chunk_once},
        {"thread counts: default, limit", test_counts},
        {"engine logits: the same bits on 1, 2, 3 threads (real models)", test_engine_threads},
        {"engine logits: vector attention = portable attention, every K/V type",
         test_vector_attention},
        {"kvplan eval: the same perplexity at --threads 1 and 2", test_cli_threads},
    };
    return tu_main(argc, argv, "workers", tests, sizeof tests / sizeof tests[0]);
}
