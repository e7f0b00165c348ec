/* The forward pass (runtime/engine/forward.c) on the real stories260K checkpoint: loader
 * errors, tokenizer, the forward pass against a naive implementation written here, prefill ==
 * decode, greedy text, perplexity by prefill and by decode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/eval.h"
#include "engine/forward.h"
#include "kvplan/generate.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"
#include "naive_ref.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.bin"
#define TOK "models/stories260K/tok512.bin"
#define TEXT "text/tinystories_val_head.txt"

static kv_tokenizer *load_tok(const kv_model *m) {
    kv_tokenizer *t = NULL;
    kv_error err = {0};
    int rc = kv_tokenizer_load(tu_shared(TOK), m, &t, &err);
    if (rc) fprintf(stderr, "tokenizer: %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
    return t;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    if (n) CU_ASSERT_FATAL(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void test_config_and_hash(void) {
    kv_model *m = tu_load_shared(MODEL);
    CU_ASSERT_EQUAL(m->cfg.dim, 64);
    CU_ASSERT_EQUAL(m->cfg.hidden_dim, 172);
    CU_ASSERT_EQUAL(m->cfg.n_layers, 5);
    CU_ASSERT_EQUAL(m->cfg.n_heads, 8);
    CU_ASSERT_EQUAL(m->cfg.n_kv_heads, 4);
    CU_ASSERT_EQUAL(m->cfg.head_dim, 8);
    CU_ASSERT_EQUAL(m->cfg.vocab_size, 512);
    CU_ASSERT_EQUAL(m->cfg.seq_len, 512);
    CU_ASSERT(m->cfg.tied_embeddings);
    /* sha256 published in ../shared/models/README.md */
    CU_ASSERT_STRING_EQUAL(m->sha256,
                           "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696");
    kv_model_free(m);
}

static void test_loader_errors(void) {
    char *data = NULL;
    size_t len = 0;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_read_file(tu_shared(MODEL), &data, &len, &err) == KV_OK);
    kv_model *m = NULL;
    /* truncated */
    const char *p = tu_tmp("truncated.bin");
    write_bytes(p, data, len - 100);
    CU_ASSERT_EQUAL(kv_model_load(p, &m, &err), KV_EINPUT);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "truncated"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "truncated.bin"));
    /* oversized */
    char *big = malloc(len + 64);
    memcpy(big, data, len);
    memset(big + len, 0, 64);
    p = tu_tmp("oversized.bin");
    write_bytes(p, big, len + 64);
    CU_ASSERT_EQUAL(kv_model_load(p, &m, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "oversized"));
    /* nonsensical header: n_kv_heads does not divide n_heads */
    memcpy(big, data, len);
    int32_t bad = 3;
    memcpy(big + 16, &bad, 4);
    p = tu_tmp("badheader.bin");
    write_bytes(p, big, len);
    CU_ASSERT_EQUAL(kv_model_load(p, &m, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "n_kv_heads"));
    /* text file / too short / empty */
    p = tu_tmp("short.bin");
    write_bytes(p, "hello", 5);
    CU_ASSERT_EQUAL(kv_model_load(p, &m, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "short.bin"));
    write_bytes(p, "", 0);
    CU_ASSERT_EQUAL(kv_model_load(p, &m, &err), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_model_load(tu_tmp("missing.bin"), &m, &err), KV_EINPUT);
    /* truncated tokenizer */
    m = tu_load_shared(MODEL);
    char *tdata = NULL;
    size_t tlen = 0;
    CU_ASSERT_FATAL(kv_read_file(tu_shared(TOK), &tdata, &tlen, &err) == KV_OK);
    p = tu_tmp("tok_trunc.bin");
    write_bytes(p, tdata, tlen / 2);
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL(kv_tokenizer_load(p, m, &t, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "tok_trunc.bin"));
    free(tdata);
    kv_model_free(m);
    free(big);
    free(data);
}

/* The naive llama2.c encode loop (O(n^2)) over the pieces and scores read straight from
 * tok512.bin here: an independent reference for the heap-based tokenizer. */
static int naive_encode(const char *tok_path, int V, const char *text, int *out) {
    char *data = NULL;
    size_t len = 0;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_read_file(tok_path, &data, &len, &err) == KV_OK);
    char **pieces = calloc((size_t)V, sizeof *pieces);
    float *scores = calloc((size_t)V, sizeof *scores);
    size_t off = 4;
    for (int i = 0; i < V; i++) {
        int32_t pl;
        memcpy(&scores[i], data + off, 4);
        memcpy(&pl, data + off + 4, 4);
        off += 8;
        pieces[i] = calloc((size_t)pl + 1, 1);
        memcpy(pieces[i], data + off, (size_t)pl);
        off += (size_t)pl;
    }
    int n = 0;
    out[n++] = 1; /* BOS */
    for (int i = 0; i < V; i++)
        if (!strcmp(pieces[i], " ")) {
            out[n++] = i;
            break;
        }
    for (const char *c = text; *c; c++) { /* ASCII test text: one byte per code point */
        int id = -1;
        for (int i = 0; i < V && id < 0; i++)
            if (pieces[i][0] == *c && pieces[i][1] == 0) id = i;
        out[n++] = id >= 0 ? id : (unsigned char)*c + 3;
    }
    for (;;) {
        float best = -1e30f;
        int bi = -1, bid = -1;
        for (int i = 1; i + 1 < n; i++) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s%s", pieces[out[i]], pieces[out[i + 1]]);
            for (int v = 0; v < V; v++)
                if (!strcmp(pieces[v], buf)) {
                    if (scores[v] > best) {
                        best = scores[v];
                        bi = i;
                        bid = v;
                    }
                    break;
                }
        }
        if (bi < 0) break;
        out[bi] = bid;
        memmove(out + bi + 1, out + bi + 2, (size_t)(n - bi - 2) * sizeof *out);
        n--;
    }
    for (int i = 0; i < V; i++) free(pieces[i]);
    free(pieces);
    free(scores);
    free(data);
    return n;
}

static void test_tokenizer(void) {
    kv_model *m = tu_load_shared(MODEL);
    kv_tokenizer *t = load_tok(m);
    kv_error err = {0};
    const char *s = "Once upon a time, there was a little girl named Lily. She loved to play.";
    int *ids = NULL, n = 0;
    CU_ASSERT_FATAL(kv_tokenizer_encode(t, s, strlen(s), 1, &ids, &n, &err) == KV_OK);
    CU_ASSERT_EQUAL(ids[0], 1);
    int ref[512];
    int nr = naive_encode(tu_shared(TOK), kv_tokenizer_vocab_size(t), s, ref);
    CU_ASSERT_EQUAL(n, nr);
    for (int i = 0; i < n && i < nr; i++) CU_ASSERT_EQUAL(ids[i], ref[i]);
    char *back = NULL;
    CU_ASSERT_FATAL(kv_tokenizer_decode(t, ids, n, &back, &err) == KV_OK);
    CU_ASSERT_STRING_EQUAL(back, s);
    free(back);
    free(ids);
    /* round trip of the first 20 KB of the TinyStories text (byte fallback, newlines) */
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_FATAL(kv_read_file(tu_shared(TEXT), &text, &len, &err) == KV_OK);
    if (len > 20000) text[len = 20000] = 0;
    CU_ASSERT_FATAL(kv_tokenizer_encode(t, text, len, 1, &ids, &n, &err) == KV_OK);
    CU_ASSERT(n > 2000 && n < (int)len);
    CU_ASSERT_FATAL(kv_tokenizer_decode(t, ids, n, &back, &err) == KV_OK);
    CU_ASSERT_STRING_EQUAL(back, text);
    free(back);
    free(ids);
    free(text);
    kv_tokenizer_free(t);
    kv_model_free(m);
}

static int *text_tokens(kv_model *m, int *n) {
    return tu_text_tokens(m, tu_shared(TOK), 40000, n);
}

/* Run prefill (one call) or decode (one token per call) over tokens; logits [T, V]. */
static void run_forward(kv_model *m, const int *tokens, int T, int decode, float *logits) {
    kv_error err = {0};
    kv_pool pool;
    CU_ASSERT_FATAL(kv_pool_init(&pool, m->cfg.n_layers * m->cfg.n_kv_heads * (T / 16 + 1), 16,
                                 m->cfg.head_dim, &err) == KV_OK);
    kv_cache c;
    CU_ASSERT_FATAL(kv_cache_init(&c, &pool, m->cfg.n_layers, m->cfg.n_kv_heads, NULL,
                                  KV_POLICY_SINK, &err) == KV_OK);
    kv_workspace *ws = NULL;
    CU_ASSERT_FATAL(kv_workspace_new(m, T, m->cfg.seq_len, &ws, &err) == KV_OK);
    kv_cache *cp = &c;
    if (decode) {
        for (int t = 0; t < T; t++)
            CU_ASSERT_FATAL(kv_forward(m, ws, &cp, 1, tokens + t, 1, KV_LOGITS_LAST,
                                       logits + (size_t)t * m->cfg.vocab_size, NULL,
                                       &err) == KV_OK);
    } else {
        CU_ASSERT_FATAL(kv_forward(m, ws, &cp, 1, tokens, T, KV_LOGITS_ALL, logits, NULL, &err) ==
                        KV_OK);
    }
    kv_workspace_free(ws);
    kv_cache_destroy(&c);
    kv_pool_destroy(&pool);
}

static void test_forward_vs_naive(void) {
    kv_model *m = tu_load_shared(MODEL);
    int n = 0;
    int *ids = text_tokens(m, &n);
    int T = 96, V = m->cfg.vocab_size;
    float *a = malloc((size_t)T * V * sizeof *a), *b = malloc((size_t)T * V * sizeof *b);
    tu_naive_forward(m, ids, T, a, NULL);
    run_forward(m, ids, T, 0, b);
    double maxerr = 0;
    for (size_t i = 0; i < (size_t)T * V; i++)
        if (fabs(a[i] - b[i]) > maxerr) maxerr = fabs(a[i] - b[i]);
    printf("\n    max |naive - prefill| logit error over %d tokens: %.3g\n", T, maxerr);
    CU_ASSERT(maxerr < 1e-3);
    free(a), free(b), free(ids);
    kv_model_free(m);
}

static void test_prefill_equals_decode(void) {
    kv_model *m = tu_load_shared(MODEL);
    int n = 0;
    int *ids = text_tokens(m, &n);
    int T = 512, V = m->cfg.vocab_size;
    float *a = malloc((size_t)T * V * sizeof *a), *b = malloc((size_t)T * V * sizeof *b);
    run_forward(m, ids, T, 0, a);
    run_forward(m, ids, T, 1, b);
    double maxerr = 0, nll_a = 0, nll_b = 0;
    for (size_t i = 0; i < (size_t)T * V; i++)
        if (fabs(a[i] - b[i]) > maxerr) maxerr = fabs(a[i] - b[i]);
    for (int t = 0; t + 1 < T; t++) {
        const float *la = a + (size_t)t * V, *lb = b + (size_t)t * V;
        double sa = 0, sb = 0, ma = la[0], mb = lb[0];
        for (int v = 1; v < V; v++) ma = la[v] > ma ? la[v] : ma, mb = lb[v] > mb ? lb[v] : mb;
        for (int v = 0; v < V; v++) sa += exp(la[v] - ma), sb += exp(lb[v] - mb);
        nll_a += log(sa) + ma - la[ids[t + 1]];
        nll_b += log(sb) + mb - lb[ids[t + 1]];
    }
    double rel = fabs(nll_a - nll_b) / nll_a;
    printf("\n    prefill vs decode: max logit diff %.3g, chunk NLL %.8f vs %.8f (rel %.2g)\n",
           maxerr, nll_a / (T - 1), nll_b / (T - 1), rel);
    CU_ASSERT(maxerr < 1e-3);
    CU_ASSERT(rel < 1e-5);
    /* and through the eval API: kv_eval_chunk scores the same chunk by one prefill */
    kv_error err = {0};
    kv_eval_opts o;
    kv_eval_opts_default(&o, m);
    o.kv_type = KV_TYPE_F32; /* like the f32 pool above */
    kv_eval_result r;
    CU_ASSERT_FATAL(kv_eval_perplexity(m, ids, T, &o, &r, &err) == KV_OK);
    CU_ASSERT(fabs(r.nll - nll_a / (T - 1)) / r.nll < 1e-6);
    CU_ASSERT_EQUAL(r.tokens_scored, T - 1);
    free(a), free(b), free(ids);
    kv_model_free(m);
}

static void test_greedy_text(void) {
    char *out = NULL;
    char args[2048];
    snprintf(args, sizeof args, "run '%s' --tokenizer '%s' --temperature 0 -n 200 --quiet",
             tu_shared(MODEL), tu_shared(TOK));
    int rc = tu_run_kvplan(args, &out, 0);
    CU_ASSERT_EQUAL(rc, 0);
    const char *expect =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_EQUAL(strncmp(out, expect, strlen(expect)), 0);
    free(out);
}

/* Streamed text of sequence 0 (kv_gen_opts.on_token). */
typedef struct gen_stream {
    const kv_tokenizer *tok;
    char text[8192];
    size_t len;
    int calls_other;
} gen_stream;

static void gen_collect(void *user, int seq, int prev, int token) {
    gen_stream *g = user;
    if (seq != 0) {
        g->calls_other++;
        return;
    }
    char piece[256];
    int k = kv_tokenizer_piece(g->tok, prev, token, piece, sizeof piece);
    if (k > 0 && g->len + (size_t)k < sizeof g->text) memcpy(g->text + g->len, piece, (size_t)k);
    g->len += k > 0 ? (size_t)k : 0;
    g->text[g->len] = '\0';
}

/* kv_generate (runtime/engine/generate.c) without the CLI: three greedy sequences decoded together
 * (prompts "", "Tom and Sue went to the park", "" again) reproduce the published continuation
 * of BOS alone in sequences 0 and 2, token for token, and the streamed text equals the
 * decoded one. */
static void test_generate_api(void) {
    kv_model *m = tu_load_shared(MODEL);
    kv_error err = {0};
    kv_tokenizer *tok = NULL;
    CU_ASSERT_FATAL(kv_tokenizer_load(tu_shared(TOK), m, &tok, &err) == KV_OK);
    kv_plan plan;
    CU_ASSERT_FATAL(kv_plan_full(&m->cfg, m->cfg.seq_len, 16, 16, KV_POLICY_SINK, &plan, &err) ==
                    KV_OK);
    kv_engine *eng = NULL;
    kv_engine_opts eo = {.device = KV_DEVICE_CPU, .max_seqs = 3};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &eo, &eng, &err) == KV_OK);
    const char *prompts[2] = {"", "Tom and Sue went to the park"};
    gen_stream gs = {.tok = tok};
    kv_gen_opts o = {.prompts = prompts,
                     .n_prompts = 2,
                     .n_seqs = 3,
                     .max_new = 120,
                     .temperature = 0.0f,
                     .top_p = 0.9f,
                     .seed = 0,
                     .on_token = gen_collect,
                     .user = &gs};
    kv_gen_result r;
    int rc = kv_generate(eng, m, tok, &o, &r, &err);
    if (rc) printf("\n    kv_generate: %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
    CU_ASSERT_EQUAL(r.n_seqs, 3);
    CU_ASSERT_EQUAL(r.seqs[0].n_prompt, 1); /* BOS alone */
    CU_ASSERT(r.seqs[1].n_prompt > 5);
    CU_ASSERT_EQUAL(r.prefill_tokens, 2 + r.seqs[1].n_prompt);
    CU_ASSERT_EQUAL(r.seqs[0].n, r.seqs[2].n);
    CU_ASSERT(memcmp(r.seqs[0].ids, r.seqs[2].ids, sizeof(int) * (size_t)r.seqs[0].n) == 0);
    CU_ASSERT(r.seqs[0].n > 100);
    CU_ASSERT(gs.calls_other > 0);
    char *text = NULL;
    CU_ASSERT_FATAL(kv_tokenizer_decode(tok, r.seqs[0].ids, r.seqs[0].n, &text, &err) == KV_OK);
    const char *expect =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
    CU_ASSERT_EQUAL(strncmp(text, expect, strlen(expect)), 0);
    CU_ASSERT_STRING_EQUAL(gs.text, text);
    CU_ASSERT(r.kv_peak > 0 && r.decoded > 0);
    free(text);
    kv_gen_result_free(&r);
    kv_engine_free(eng);
    kv_plan_free(&plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
}

static void test_cli_errors(void) {
    char *out = NULL;
    CU_ASSERT_EQUAL(tu_run_kvplan("eval /nonexistent/model.bin --text x", &out, 1), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "/nonexistent/model.bin"));
    free(out);
    char args[2048];
    snprintf(args, sizeof args, "eval '%s' --text /nonexistent.txt", tu_shared(MODEL));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "/nonexistent.txt"));
    free(out);
    snprintf(args, sizeof args, "eval '%s' --text '%s' --context 4096", tu_shared(MODEL),
             tu_shared(TEXT));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    free(out);
    CU_ASSERT_EQUAL(tu_run_kvplan("--help", NULL, 0), 0);
    CU_ASSERT_EQUAL(tu_run_kvplan("frobnicate", NULL, 1), 1);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"config and sha256 of stories260K", test_config_and_hash},
        {"loader errors: truncated, oversized, bad header, short", test_loader_errors},
        {"tokenizer: naive reference, known BOS, round trip", test_tokenizer},
        {"forward pass equals a naive implementation", test_forward_vs_naive},
        {"prefill logits equal decode logits; chunk NLL", test_prefill_equals_decode},
        {"greedy text of stories260K", test_greedy_text},
        {"kv_generate: a batch of three reproduces the greedy text", test_generate_api},
        {"CLI errors name the file", test_cli_errors},
    };
    return tu_main(argc, argv, "forward", tests, sizeof tests / sizeof tests[0]);
}
