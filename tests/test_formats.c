/* Cross-format equality of the model readers (runtime/model/): the same weights read from llama2.c,
 * GGUF (F32, F16, Q8_0) and Hugging Face safetensors give the same tokens, logits and perplexity,
 * and every CLI command works on every format. Also prints load times and the GGUF dequantisation
 * cost. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/eval.h"
#include "engine/forward.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"
#include "testutil.h"

double kv_gguf_dequant_seconds(const kv_model *m); /* runtime/model/gguf.c, for measurements */

#define M656 "models/tinystories-656k"
#define TEXT "text/tinystories_val_head.txt"

/* Greedy decoding from BOS for n steps; tokens[n] and logits[n][vocab] (may be NULL). */
static void greedy(const kv_model *m, int n, int *tokens, float *logits) {
    kv_error err = {0};
    kv_pool pool;
    kv_cache c;
    kv_workspace *ws = NULL;
    int V = m->cfg.vocab_size, ctx = n + 1;
    long blocks = kv_cache_blocks_needed(m->cfg.n_layers, m->cfg.n_kv_heads, NULL, ctx, 1, 16);
    CU_ASSERT_EQUAL_FATAL(kv_pool_init(&pool, (int)blocks, 16, m->cfg.head_dim, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(
        kv_cache_init(&c, &pool, m->cfg.n_layers, m->cfg.n_kv_heads, NULL, KV_POLICY_SINK, &err),
        KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_workspace_new(m, 1, ctx, &ws, &err), KV_OK);
    float *lg = malloc((size_t)V * sizeof *lg);
    int tok = m->cfg.bos_id >= 0 ? m->cfg.bos_id : 1;
    kv_cache *seqs[1] = {&c};
    for (int i = 0; i < n; i++) {
        int rc = kv_forward(m, ws, seqs, 1, &tok, 1, KV_LOGITS_LAST, lg, NULL, &err);
        if (rc) fprintf(stderr, "forward: %s\n", err.msg);
        CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        tokens[i] = best;
        if (logits) memcpy(logits + (size_t)i * V, lg, (size_t)V * sizeof *lg);
        tok = best;
    }
    free(lg);
    kv_workspace_free(ws);
    kv_cache_destroy(&c);
    kv_pool_destroy(&pool);
}

static void test_656k_safetensors_vs_f16_gguf(void) {
    kv_model *a = tu_load_shared(M656);
    kv_model *b = tu_load_shared(M656 "/TinyStories-656K.f16.gguf");
    CU_ASSERT_STRING_EQUAL(a->format, "safetensors");
    CU_ASSERT_STRING_EQUAL(b->format, "gguf");
    CU_ASSERT_EQUAL(a->cfg.rope_layout, KV_ROPE_HALF);
    CU_ASSERT_EQUAL(b->cfg.rope_layout, KV_ROPE_ADJACENT);
    CU_ASSERT_EQUAL(a->cfg.vocab_size, b->cfg.vocab_size);
    int n = 40, V = a->cfg.vocab_size;
    int ta[40], tb[40];
    float *la = malloc((size_t)n * V * sizeof *la), *lb = malloc((size_t)n * V * sizeof *lb);
    greedy(a, n, ta, la);
    greedy(b, n, tb, lb);
    CU_ASSERT_EQUAL(memcmp(ta, tb, sizeof ta), 0);
    double maxd = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        double d = fabs((double)la[i] - (double)lb[i]);
        if (d > maxd) maxd = d;
    }
    printf("\n  656K safetensors vs F16 GGUF: 40 greedy tokens %s, max |logit diff| %.3g\n",
           memcmp(ta, tb, sizeof ta) ? "DIFFER" : "equal", maxd);
    CU_ASSERT(maxd < 1e-2);
    /* the safetensors model's greedy text */
    kv_error err = {0};
    kv_tokenizer *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, a, &tok, &err), KV_OK);
    int ids[41];
    ids[0] = a->cfg.bos_id;
    memcpy(ids + 1, ta, sizeof ta);
    char *text = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_decode(tok, ids, 41, &text, &err), KV_OK);
    printf("  greedy text: %.120s...\n", text);
    const char *expect = "Once upon a time, there was a little girl named Lily. She had a toy car";
    CU_ASSERT_EQUAL(strncmp(text, expect, strlen(expect)), 0);
    free(text);
    kv_tokenizer_free(tok);
    free(la);
    free(lb);
    kv_model_free(a);
    kv_model_free(b);
}

/* Tokens of the TinyStories text with the 656K tokenizer.json. */
static int *text_ids_656k(const kv_model *m, int *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", tu_shared(M656));
    return tu_text_tokens(m, path, 0, n);
}

static double ppl(const kv_model *m, const int *ids, long n, int context, int max_chunks) {
    kv_error err = {0};
    kv_eval_opts o;
    kv_eval_opts_default(&o, m);
    o.context = context;
    o.max_chunks = max_chunks;
    kv_eval_result r;
    int rc = kv_eval_perplexity(m, ids, n, &o, &r, &err);
    if (rc) fprintf(stderr, "eval: %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    return r.perplexity;
}

static void test_656k_q8_0(void) {
    kv_model *a = tu_load_shared(M656);
    kv_model *q = tu_load_shared(M656 "/tinystories-656k-q8_0.gguf");
    int ta[20], tq[20];
    greedy(a, 20, ta, NULL);
    greedy(q, 20, tq, NULL);
    CU_ASSERT_EQUAL(memcmp(ta, tq, sizeof ta), 0);
    int n = 0;
    int *ids = text_ids_656k(a, &n);
    /* 30 chunks of 512 = 15360 tokens keep the suite fast (also under ASan); whole text: CLI */
    double pa = ppl(a, ids, n, 512, 30), pq = ppl(q, ids, n, 512, 30);
    printf(
        "\n  656K perplexity (30 x 512 tokens): F32 safetensors %.5f, Q8_0 GGUF %.5f (%+.3f%%)\n",
        pa, pq, 100.0 * (pq - pa) / pa);
    CU_ASSERT(fabs(pq - pa) / pa < 0.02);
    free(ids);
    kv_model_free(a);
    kv_model_free(q);
}

static void test_260k_gguf_vs_bin(void) {
    kv_model *a = tu_load_shared("models/stories260K/stories260K.bin");
    kv_model *b = tu_load_shared("models/stories260K/stories260K.gguf");
    kv_error err = {0};
    kv_tokenizer *tok = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, a, &tok, &err), KV_OK);
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(kv_read_file(tu_shared(TEXT), &text, &len, &err), KV_OK);
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(tok, text, len, 1, &ids, &n, &err), KV_OK);
    /* 20 chunks of the bin's context 512 (the GGUF says 2048); full text: see the report */
    double pa = ppl(a, ids, n, 512, 20), pb = ppl(b, ids, n, 512, 20);
    printf("\n  260K perplexity (20 x 512 tokens): llama2.c %.8f, GGUF %.8f\n", pa, pb);
    CU_ASSERT(fabs(pa - pb) / pa < 1e-5);
    int ga[30], gb[30];
    greedy(a, 30, ga, NULL);
    greedy(b, 30, gb, NULL);
    CU_ASSERT_EQUAL(memcmp(ga, gb, sizeof ga), 0);
    free(ids);
    free(text);
    kv_tokenizer_free(tok);
    kv_model_free(a);
    kv_model_free(b);
}

/* The 656K GGUF vocabulary (all scores equal, no byte pieces; ranked by id) tokenizes the text
 * like tokenizer.json, except that each byte of an unknown character is its own <unk> (id 0)
 * where Hugging Face fuses them: equal after collapsing runs of 0. */
static void test_656k_gguf_vocab(void) {
    kv_model *g = tu_load_shared(M656 "/TinyStories-656K.f16.gguf");
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, g, &t, &err), KV_OK);
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(kv_read_file(tu_shared(TEXT), &text, &len, &err), KV_OK);
    int *a = NULL, na = 0, nh = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, text, len, 1, &a, &na, &err), KV_OK);
    int *h = text_ids_656k(g, &nh);
    int ka = 0, kh = 0;
    for (int i = 0; i < na; i++)
        if (!(a[i] == 0 && ka > 0 && a[ka - 1] == 0)) a[ka++] = a[i];
    for (int i = 0; i < nh; i++)
        if (!(h[i] == 0 && kh > 0 && h[kh - 1] == 0)) h[kh++] = h[i];
    printf("\n  656K GGUF vocabulary: %d tokens (%d after fusing <unk>), tokenizer.json %d\n", na,
           ka, nh);
    CU_ASSERT_EQUAL(ka, kh);
    CU_ASSERT(ka == kh && memcmp(a, h, (size_t)ka * sizeof *a) == 0);
    free(a);
    free(h);
    free(text);
    kv_tokenizer_free(t);
    kv_model_free(g);
}

static void test_cli_all_formats(void) {
    const char *models[] = {"models/stories260K/stories260K.bin",
                            "models/stories260K/stories260K.gguf", M656,
                            M656 "/TinyStories-656K.f16.gguf", M656 "/tinystories-656k-q8_0.gguf"};
    FILE *f = fopen(tu_tmp("prompt.txt"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("Once upon a time, there was a little dog.", f);
    fclose(f);
    /* a text long enough for one 128-token chunk */
    f = fopen(tu_tmp("short.txt"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    for (int i = 0; i < 30; i++)
        fputs("Once upon a time, there was a little girl named Lily. She liked to play. ", f);
    fclose(f);
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char args[8192], *out = NULL;
        snprintf(args, sizeof args, "tokenize '%s' --text '%s'", tu_shared(models[i]),
                 tu_tmp("prompt.txt"));
        int rc = tu_run_kvplan(args, &out, 1);
        CU_ASSERT_EQUAL(rc, 0);
        if (rc) printf("\n  %s: %s\n", args, out ? out : "");
        free(out);
        snprintf(args, sizeof args,
                 "run '%s' --prompt 'Once upon a time' -n 8 --temperature 0 --quiet",
                 tu_shared(models[i]));
        rc = tu_run_kvplan(args, &out, 0);
        CU_ASSERT_EQUAL(rc, 0);
        CU_ASSERT(out && strncmp(out, "Once upon a time", 16) == 0);
        if (rc) printf("\n  %s: %s\n", args, out ? out : "");
        free(out);
        snprintf(args, sizeof args, "eval '%s' --text '%s' --context 128 --quiet --json",
                 tu_shared(models[i]), tu_tmp("short.txt"));
        rc = tu_run_kvplan(args, &out, 0);
        CU_ASSERT_EQUAL(rc, 0);
        CU_ASSERT(out && strstr(out, "\"perplexity\""));
        if (rc) printf("\n  %s: %s\n", args, out ? out : "");
        free(out);
    }
}

static void test_load_times(void) {
    const char *models[] = {"models/stories260K/stories260K.bin",
                            "models/stories260K/stories260K.gguf", M656,
                            M656 "/TinyStories-656K.f16.gguf", M656 "/tinystories-656k-q8_0.gguf"};
    printf("\n");
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        int reps = 20;
        double best = 1e9, deq = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = kv_now();
            kv_model *m = tu_load_shared(models[i]);
            double t = kv_now() - t0;
            if (t < best) {
                best = t;
                deq = kv_gguf_dequant_seconds(m);
            }
            kv_model_free(m);
        }
        printf("  load %-45s best of %d: %.2f ms (dequantise %.2f ms; includes SHA-256)\n",
               models[i], reps, 1e3 * best, 1e3 * deq);
    }
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"656K safetensors vs F16 GGUF: greedy 40, logits", test_656k_safetensors_vs_f16_gguf},
        {"656K Q8_0 GGUF: greedy 20, perplexity within 2%", test_656k_q8_0},
        {"260K GGUF vs llama2.c: perplexity, greedy", test_260k_gguf_vs_bin},
        {"656K GGUF vocabulary vs tokenizer.json", test_656k_gguf_vocab},
        {"CLI tokenize/run/eval on every format", test_cli_all_formats},
        {"load times and dequantisation cost", test_load_times},
    };
    return tu_main(argc, argv, "formats", tests, sizeof tests / sizeof tests[0]);
}
