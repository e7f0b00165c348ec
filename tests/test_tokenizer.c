/* Tokenizers (runtime/tokenizer/) against llama.cpp's own tokenizer tests.
 *
 * ../shared/vocab/ holds six vocabulary-only GGUF files written by llama.cpp's converter with
 * llama.cpp's test strings (NAME.gguf.inp, separated by "\n__ggml_vocab_test__\n") and the ids
 * it expects (NAME.gguf.out, one line per string). llama.cpp's tests/test-tokenizer-0.cpp
 * tokenizes each string with common_tokenize(ctx, text, add_special = false,
 * parse_special = false): no BOS, control tokens not parsed (user-defined tokens still are).
 * The suite does the same through kv_tokenizer_encode_ex(add_bos 0, parse_special 0) and
 * asserts every id. The vocabularies are loaded as tokenizers on their own, without a model.
 *
 * Also: the Llama 2 tokenizer.bin of llama2.c gives the ids of ggml-vocab-llama-spm.gguf; the
 * F16 GGUF from llama.cpp's converter (llama-2-tiny-random) loads, its weights are the file's
 * F16 values, its embedded vocabulary tokenizes as llama-spm, and it generates.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/chat.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"
#include "tokenizer/tokenizer_impl.h" /* add_bos */
#include "testutil.h"
#include "../runtime/util/f16.h"
#include "../runtime/model/gguf_meta.h"

#define SPM "vocab/ggml-vocab-llama-spm.gguf"
#define TINY "models/llama-2-tiny-random/llama-2-tiny-random.gguf"
#define L2TOK "models/llama2-tokenizer/tokenizer.bin"

/* One vocabulary's test set: strings and expected ids. */
typedef struct vtest {
    int n;
    char **s;
    size_t *len;
    int **ids;
    int *n_ids;
} vtest;

static void vtest_free(vtest *v) {
    for (int i = 0; i < v->n; i++) {
        free(v->s[i]);
        free(v->ids[i]);
    }
    free(v->s);
    free(v->len);
    free(v->ids);
    free(v->n_ids);
}

/* Read NAME.gguf.inp / .out as test-tokenizer-0.cpp read_tests does. */
static vtest read_vtest(const char *gguf_rel) {
    vtest v = {0};
    char p[4200];
    kv_error err = {0};
    char *inp = NULL, *out = NULL;
    size_t li = 0, lo = 0;
    snprintf(p, sizeof p, "%s.inp", tu_shared(gguf_rel));
    CU_ASSERT_EQUAL_FATAL(kv_read_file(p, &inp, &li, &err), KV_OK);
    snprintf(p, sizeof p, "%s.out", tu_shared(gguf_rel));
    CU_ASSERT_EQUAL_FATAL(kv_read_file(p, &out, &lo, &err), KV_OK);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t cap = 64;
    v.s = calloc(cap, sizeof *v.s);
    v.len = calloc(cap, sizeof *v.len);
    v.ids = calloc(cap, sizeof *v.ids);
    v.n_ids = calloc(cap, sizeof *v.n_ids);
    CU_ASSERT_FATAL(v.s && v.len && v.ids && v.n_ids);
    for (size_t pos = 0; pos < li && v.n < (int)cap;) {
        char *next = strstr(inp + pos, sep);
        size_t end = next ? (size_t)(next - inp) : li;
        v.len[v.n] = end - pos;
        v.s[v.n] = malloc(end - pos + 1);
        memcpy(v.s[v.n], inp + pos, end - pos);
        v.s[v.n][end - pos] = '\0';
        v.n++;
        pos = next ? end + strlen(sep) : li;
    }
    int line = 0;
    for (char *l = out; l && *l && line < v.n; line++) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = '\0';
        v.ids[line] = malloc(strlen(l) * sizeof(int) + sizeof(int));
        for (char *q = l, *e; (strtol(q, &e, 10), e != q); q = e)
            v.ids[line][v.n_ids[line]++] = (int)strtol(q, NULL, 10);
        l = nl ? nl + 1 : NULL;
    }
    CU_ASSERT_EQUAL(line, v.n); /* one .out line per string */
    free(inp);
    free(out);
    return v;
}

static kv_tokenizer *load_tok(const char *path) {
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    int rc = kv_tokenizer_load(path, NULL, &t, &err);
    if (rc) fprintf(stderr, "\n  %s: %s\n", path, err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    return t;
}

/* Strings of v whose ids from t (no BOS, no special parsing) equal the expected ids. */
static int count_exact(const kv_tokenizer *t, const vtest *v, const char *name) {
    int ok = 0;
    for (int i = 0; i < v->n; i++) {
        kv_error err = {0};
        int *ids = NULL, n = 0;
        CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode_ex(t, v->s[i], v->len[i], 0, 0, &ids, &n, &err),
                              KV_OK);
        int same = n == v->n_ids[i] && (n == 0 || !memcmp(ids, v->ids[i], (size_t)n * sizeof *ids));
        ok += same;
        if (!same) {
            fprintf(stderr, "\n  %s: string %d '%s': got", name, i, v->s[i]);
            for (int k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, ", expected");
            for (int k = 0; k < v->n_ids[i]; k++) fprintf(stderr, " %d", v->ids[i][k]);
        }
        free(ids);
    }
    return ok;
}

static void test_llamacpp_vectors(void) {
    const char *names[] = {"llama-spm", "phi-3", "gpt-2", "starcoder", "deepseek-coder", "falcon"};
    const kv_tok_kind kinds[] = {KV_TOK_SPM, KV_TOK_SPM, KV_TOK_BPE,
                                 KV_TOK_BPE, KV_TOK_BPE, KV_TOK_BPE};
    printf("\n");
    for (int k = 0; k < 6; k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", names[k]);
        vtest v = read_vtest(rel);
        kv_tokenizer *t = load_tok(tu_shared(rel));
        CU_ASSERT_EQUAL(t->kind, kinds[k]);
        int ok = count_exact(t, &v, names[k]);
        printf("  %-15s %2d/%d strings exact\n", names[k], ok, v.n);
        CU_ASSERT_EQUAL(v.n, 46); /* llama.cpp@c392e50 models/ test strings */
        CU_ASSERT_EQUAL(ok, v.n);
        /* decoding gives the text back (SentencePiece: after a BOS, which drops the prefix) */
        int rt = 0;
        for (int i = 0; i < v.n; i++) {
            kv_error err = {0};
            int *ids = NULL, n = 0;
            int bos = kinds[k] == KV_TOK_SPM;
            CU_ASSERT_EQUAL_FATAL(
                kv_tokenizer_encode_ex(t, v.s[i], v.len[i], bos, 0, &ids, &n, &err), KV_OK);
            char *back = NULL;
            CU_ASSERT_EQUAL_FATAL(kv_tokenizer_decode(t, ids, n, &back, &err), KV_OK);
            rt += strcmp(back, v.s[i]) == 0;
            free(back);
            free(ids);
        }
        CU_ASSERT_EQUAL(rt, v.n);
        kv_tokenizer_free(t);
        vtest_free(&v);
    }
}

/* Control tokens: recognised by default, plain text with parse_special = 0; a user-defined
 * token is cut out either way (deepseek-coder's "ü", id 32009, in llama.cpp's "Führer"). */
static void test_special_tokens(void) {
    kv_tokenizer *t = load_tok(tu_shared("vocab/ggml-vocab-gpt-2.gguf"));
    kv_error err = {0};
    const char *s = "Hi<|endoftext|>";
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, s, strlen(s), 0, &ids, &n, &err), KV_OK);
    CU_ASSERT(n == 2 && ids[1] == 50256);
    free(ids);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode_ex(t, s, strlen(s), 0, 0, &ids, &n, &err), KV_OK);
    CU_ASSERT(n > 2);
    for (int i = 0; i < n; i++) CU_ASSERT_NOT_EQUAL(ids[i], 50256);
    free(ids);
    kv_tokenizer_free(t);

    t = load_tok(tu_shared("vocab/ggml-vocab-deepseek-coder.gguf"));
    s = "F\xc3\xbchrer";
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode_ex(t, s, strlen(s), 0, 0, &ids, &n, &err), KV_OK);
    int expect[] = {37, 32009, 71, 6247}; /* ggml-vocab-deepseek-coder.gguf.out line 2 */
    CU_ASSERT(n == 4 && !memcmp(ids, expect, sizeof expect));
    free(ids);
    CU_ASSERT_EQUAL(t->bos_id, 32013);
    CU_ASSERT_EQUAL(t->add_bos, 1); /* tokenizer.ggml.add_bos_token */
    kv_tokenizer_free(t);
}

/* Every pre-tokenizer list kvplan knows (docs/formats.md; llama.cpp's names) compiles and
 * gives a lossless tokenizer; an unknown value is refused by name. The values are written
 * into copies of ggml-vocab-gpt-2.gguf (a vocabulary-only GGUF has no tensor offsets to fix). */
static void test_every_pre_value(void) {
    /* one name of each of kvplan's pre-tokenizer lists (runtime/tokenizer/tokenizer_gguf.c), and
     * the three whose digit grouping is checked below; loading a 50257-token vocabulary per name is
     * the cost, so the aliases of each list are not all loaded */
    static const char *pres[] = {"default",        "llama-bpe",   "dbrx",       "deepseek-llm",
                                 "deepseek-coder", "deepseek-v3", "falcon",     "starcoder",
                                 "gpt-2",          "qwen2",       "poro-chat",  "seed-coder",
                                 "tekken",         "gpt-4o",      "no-such-pre"};
    const int n_pres = (int)(sizeof pres / sizeof pres[0]);
    kv_error err = {0};
    char *data = NULL;
    size_t len = 0;
    const char *src = tu_shared("vocab/ggml-vocab-gpt-2.gguf");
    CU_ASSERT_EQUAL_FATAL(kv_read_file(src, &data, &len, &err), KV_OK);
    kv_gguf *g = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_gguf_open(src, &g, &err), KV_OK);
    const kv_gguf_kv *kv = kv_gguf_find(g, "tokenizer.ggml.pre");
    CU_ASSERT_FATAL(kv != NULL && kv->type == KV_GGUF_STRING);
    uint64_t old_len;
    memcpy(&old_len, data + kv->off, 8);
    size_t val_at = kv->off, rest_at = kv->off + 8 + (size_t)old_len;
    kv_gguf_close(g);
    vtest v = read_vtest("vocab/ggml-vocab-gpt-2.gguf");
    int loaded = 0, lossless = 0;
    for (int p = 0; p < n_pres; p++) {
        const char *path = tu_tmp("pre.gguf");
        FILE *f = fopen(path, "wb");
        CU_ASSERT_FATAL(f != NULL);
        uint64_t nl = strlen(pres[p]);
        fwrite(data, 1, val_at, f);
        fwrite(&nl, 8, 1, f);
        fwrite(pres[p], 1, (size_t)nl, f);
        fwrite(data + rest_at, 1, len - rest_at, f);
        fclose(f);
        kv_tokenizer *t = NULL;
        int rc = kv_tokenizer_load(path, NULL, &t, &err);
        if (p == n_pres - 1) {
            CU_ASSERT_EQUAL(rc, KV_EINPUT);
            CU_ASSERT(strstr(err.msg, "'no-such-pre'") != NULL && strstr(err.msg, path) != NULL);
            continue;
        }
        if (rc) fprintf(stderr, "\n  pre '%s': %s", pres[p], err.msg);
        CU_ASSERT_EQUAL(rc, KV_OK);
        if (rc) continue;
        loaded++;
        int ok = 1;
        for (int i = 0; i < v.n; i++) {
            int *ids = NULL, n = 0;
            char *back = NULL;
            CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode_ex(t, v.s[i], v.len[i], 0, 0, &ids, &n, &err),
                                  KV_OK);
            CU_ASSERT_EQUAL_FATAL(kv_tokenizer_decode(t, ids, n, &back, &err), KV_OK);
            ok &= strcmp(back, v.s[i]) == 0;
            free(back);
            free(ids);
        }
        lossless += ok;
        /* digit grouping (llama.cpp's comments in test-tokenizer-0.cpp: Llama 3 splits
         * "333333333" as 333|333|333); Qwen2 and StarCoder take digits one by one */
        const char *nine = "333333333";
        int group = !strcmp(pres[p], "llama-bpe")                                ? 3
                    : !strcmp(pres[p], "qwen2") || !strcmp(pres[p], "starcoder") ? 1
                                                                                 : 0;
        if (group) {
            int *a = NULL, *b = NULL, na = 0, nb = 0;
            CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode_ex(t, nine, 9, 0, 0, &a, &na, &err), KV_OK);
            CU_ASSERT_EQUAL_FATAL(
                kv_tokenizer_encode_ex(t, nine, (size_t)group, 0, 0, &b, &nb, &err), KV_OK);
            CU_ASSERT_EQUAL(nb, 1); /* "333" and "3" are GPT-2 tokens */
            CU_ASSERT_EQUAL(na, 9 / group);
            for (int i = 0; nb == 1 && i < na; i++) CU_ASSERT_EQUAL(a[i], b[0]);
            free(a);
            free(b);
        }
        kv_tokenizer_free(t);
    }
    printf("\n  %d pre-tokenizer lists load, %d lossless on llama.cpp's strings\n", loaded,
           lossless);
    CU_ASSERT_EQUAL(loaded, n_pres - 1);
    CU_ASSERT_EQUAL(lossless, n_pres - 1);
    vtest_free(&v);
    free(data);
}

/* Byte-level BPE over a long text (one 794 KB fragment: the regex runs over the whole text, so
 * each match must not re-scan it) gives the text back byte for byte. */
static void test_bytelevel_long_text(void) {
    kv_tokenizer *t = load_tok(tu_shared("vocab/ggml-vocab-gpt-2.gguf"));
    kv_error err = {0};
    char *text = NULL, *back = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(
        kv_read_file(tu_shared("text/tinystories_val_head.txt"), &text, &len, &err), KV_OK);
    int *ids = NULL, n = 0;
    double t0 = kv_now();
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, text, len, 0, &ids, &n, &err), KV_OK);
    printf("\n  gpt-2 vocabulary, TinyStories text: %d tokens in %.2f s\n", n, kv_now() - t0);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_decode(t, ids, n, &back, &err), KV_OK);
    CU_ASSERT(strcmp(back, text) == 0);
    free(back);
    free(ids);
    free(text);
    kv_tokenizer_free(t);
}

/* llama2.c's tokenizer.bin of Llama 2 == ggml-vocab-llama-spm.gguf: llama.cpp's strings, and
 * the TinyStories text. */
static void test_llama2_tokenizer_bin(void) {
    kv_tokenizer *b = load_tok(tu_shared(L2TOK));
    kv_tokenizer *g = load_tok(tu_shared(SPM));
    CU_ASSERT_EQUAL(b->vocab_size, 32000);
    CU_ASSERT_EQUAL(b->bos_id, 1);
    CU_ASSERT_EQUAL(b->eos_id, 2);
    vtest v = read_vtest(SPM);
    int ok = count_exact(b, &v, "llama2 tokenizer.bin");
    printf("\n  llama2.c tokenizer.bin on llama-spm's strings: %d/%d exact\n", ok, v.n);
    CU_ASSERT_EQUAL(ok, v.n);
    vtest_free(&v);
    kv_error err = {0};
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(
        kv_read_file(tu_shared("text/tinystories_val_head.txt"), &text, &len, &err), KV_OK);
    int *a = NULL, *c = NULL, na = 0, nc = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(b, text, len, 1, &a, &na, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(g, text, len, 1, &c, &nc, &err), KV_OK);
    printf("  TinyStories text: %d tokens (tokenizer.bin), %d (GGUF)\n", na, nc);
    CU_ASSERT(na == nc && !memcmp(a, c, (size_t)na * sizeof *a));
    /* The 794 KB text is encoded in spans of ~64 KiB cut where no piece can cross
     * (runtime/tokenizer/tokenizer.c, spm_cut_ok); the count and hash are those of one pass
     * over the whole text, measured before the spans existed. */
    unsigned long long hash = 0;
    for (int i = 0; i < na; i++) hash = (hash * 1000003ULL + (unsigned)a[i]) % 2147483647ULL;
    CU_ASSERT_EQUAL(na, 212398);
    CU_ASSERT_EQUAL(hash, 2011581378ULL);
    char *back = NULL;
    CU_ASSERT_EQUAL(kv_tokenizer_decode(g, c, nc, &back, &err), KV_OK);
    CU_ASSERT(back && strcmp(back, text) == 0);
    free(back);
    free(a);
    free(c);
    free(text);
    kv_tokenizer_free(b);
    kv_tokenizer_free(g);
}

/* llama-2-tiny-random.gguf: llama.cpp's converter, F16 matrices, 32000 vocabulary. */
static void test_tiny_random_f16(void) {
    kv_error err = {0};
    kv_model *m = NULL;
    int rc = kv_model_load(tu_shared(TINY), &m, &err);
    if (rc) fprintf(stderr, "\n  %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    const kv_config *c = &m->cfg;
    CU_ASSERT_EQUAL(c->dim, 8);
    CU_ASSERT_EQUAL(c->hidden_dim, 32);
    CU_ASSERT_EQUAL(c->n_layers, 1);
    CU_ASSERT_EQUAL(c->n_heads, 2);
    CU_ASSERT_EQUAL(c->n_kv_heads, 2);
    CU_ASSERT_EQUAL(c->head_dim, 4);
    CU_ASSERT_EQUAL(c->vocab_size, 32000);
    CU_ASSERT_EQUAL(c->seq_len, 4096);
    CU_ASSERT_STRING_EQUAL(m->sha256,
                           "81f226c62d28ed4a1a9b9fa080fcd9f0cc40e0f9d5680036583ff98fbcd035cb");
    /* the weights are the file's F16 values, kept in place in their type */
    kv_gguf *g = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_gguf_open(tu_shared(TINY), &g, &err), KV_OK);
    const char *names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight"};
    kv_weight mine[] = {m->tok_emb, m->layers[0].wq, m->layers[0].w_down};
    size_t counts[] = {32000 * 8, 8 * 8, 8 * 32};
    for (int k = 0; k < 3; k++) {
        const kv_gguf_tensor *t = kv_gguf_find_tensor(g, names[k]);
        CU_ASSERT_FATAL(t != NULL);
        CU_ASSERT_EQUAL(t->type, KV_DT_F16);
        CU_ASSERT_EQUAL(mine[k].type, KV_DT_F16);
        const unsigned char *src = g->base + g->data_start + t->offset;
        CU_ASSERT_EQUAL(memcmp(mine[k].data, src, counts[k] * 2), 0);
    }
    kv_gguf_close(g);
    /* the embedded vocabulary tokenizes as llama-spm */
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, m, &t, &err), KV_OK);
    vtest v = read_vtest(SPM);
    int ok = count_exact(t, &v, "llama-2-tiny-random");
    printf("\n  llama-2-tiny-random vocabulary on llama-spm's strings: %d/%d exact\n", ok, v.n);
    CU_ASSERT_EQUAL(ok, v.n);
    vtest_free(&v);
    kv_tokenizer_free(t);
    kv_model_free(m);
    /* it generates: greedy, the prompt and 8 tokens */
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "run '%s' --prompt 'Hello world' -n 8 --temperature 0 --quiet",
             tu_shared(TINY));
    rc = tu_run_kvplan(args, &out, 0);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT(out && strncmp(out, "Hello world", 11) == 0 && strlen(out) > 12);
    char *again = NULL;
    tu_run_kvplan(args, &again, 0);
    CU_ASSERT(out && again && strcmp(out, again) == 0); /* greedy is deterministic */
    free(out);
    free(again);
}

/* kvplan tokenize with a vocabulary and no model; bad vocabulary files are refused clearly. */
static void test_cli_and_errors(void) {
    const char *txt = tu_tmp("hello.txt");
    FILE *f = fopen(txt, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(" Hello world", f); /* llama.cpp: 29871 15043 3186 */
    fclose(f);
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text '%s'", tu_shared(SPM), txt);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 0);
    CU_ASSERT(out && strcmp(out, "1 29871 15043 3186\n") == 0);
    free(out);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text '%s' --no-bos",
             tu_shared("vocab/ggml-vocab-gpt-2.gguf"), txt);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 0);
    CU_ASSERT(out && strcmp(out, "18435 995\n") == 0); /* gpt-2.gguf.out: " Hello world" */
    free(out);
    /* a vocabulary of another size than the model's */
    snprintf(args, sizeof args, "tokenize '%s' --tokenizer '%s' --text '%s'",
             tu_shared("models/stories260K/stories260K.gguf"), tu_shared(SPM), txt);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT(out && strstr(out, "do not belong together") != NULL);
    free(out);
    /* truncated vocabulary */
    char *data = NULL;
    size_t len = 0;
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_read_file(tu_shared(SPM), &data, &len, &err), KV_OK);
    const char *bad = tu_tmp("truncated-vocab.gguf");
    f = fopen(bad, "wb");
    fwrite(data, 1, len / 2, f);
    fclose(f);
    free(data);
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL(kv_tokenizer_load(bad, NULL, &t, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, bad) != NULL && strstr(err.msg, "truncated") != NULL);
    /* a GGUF without a vocabulary: the header of a vocabulary-only file with no metadata */
    const char *empty = tu_tmp("no-vocab.gguf");
    f = fopen(empty, "wb");
    unsigned char hdr[24] = {'G', 'G', 'U', 'F', 3};
    fwrite(hdr, 1, sizeof hdr, f);
    fclose(f);
    CU_ASSERT_EQUAL(kv_tokenizer_load(empty, NULL, &t, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "tokenizer.ggml.model") != NULL);
}

/* The number of times id occurs in ids[0..n). */
static int count_id(const int *ids, int n, int id) {
    int c = 0;
    for (int i = 0; i < n; i++) c += ids[i] == id;
    return c;
}

/* The one id `text` encodes to (no BOS), or -1 when it is not one token. */
static int one_id(const kv_tokenizer *t, const char *text) {
    int *ids = NULL, n = 0, id = -1;
    kv_error err = {0};
    if (!kv_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &err) && n == 1) id = ids[0];
    free(ids);
    return id;
}

/* Chat templates. The phi-3 vocabulary carries Phi-3's own Jinja template
 * (tokenizer.chat_template); kvplan names its family, renders a chat as that template does (the
 * expected text below is what Jinja2 3.1.6 printed for the file's template on these messages,
 * add_generation_prompt true, bos_token left to the encoder), and the markers are single control
 * tokens of the vocabulary: the rendered prompt holds <|user|> twice, <|assistant|> twice and
 * <|end|> three times. */
static void test_chat_phi3_gguf(void) {
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(
        kv_tokenizer_load(tu_shared("vocab/ggml-vocab-phi-3.gguf"), NULL, &t, &err), KV_OK);
    const char *jinja = kv_tokenizer_chat_template(t);
    CU_ASSERT_FATAL(jinja != NULL);
    CU_ASSERT(strstr(jinja, "message['role'] == 'user'") != NULL);
    int known = 0;
    CU_ASSERT_EQUAL(kv_chat_detect(jinja, &known), KV_CHAT_PHI3);
    CU_ASSERT_EQUAL(known, 1);
    kv_chat_msg m[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Tell a story"}};
    char *txt = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_chat_render(KV_CHAT_PHI3, m, 3, &txt, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(txt, "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\n"
                                "Tell a story<|end|>\n<|assistant|>\n");
    int user = one_id(t, "<|user|>"), asst = one_id(t, "<|assistant|>");
    int end = one_id(t, kv_chat_end_of_turn(KV_CHAT_PHI3));
    CU_ASSERT(user >= 0 && asst >= 0 && end >= 0 && user != asst && asst != end);
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, txt, strlen(txt), 1, &ids, &n, &err), KV_OK);
    CU_ASSERT_EQUAL(ids[0], kv_tokenizer_bos(t));
    CU_ASSERT_EQUAL(count_id(ids, n, user), 2);
    CU_ASSERT_EQUAL(count_id(ids, n, asst), 2);
    CU_ASSERT_EQUAL(count_id(ids, n, end), 3);
    free(ids);
    free(txt);
    kv_tokenizer_free(t);
    /* a vocabulary without a template has none: the server joins messages as plain text */
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(tu_shared(SPM), NULL, &t, &err), KV_OK);
    CU_ASSERT_PTR_NULL(kv_tokenizer_chat_template(t));
    CU_ASSERT_EQUAL(kv_chat_detect(kv_tokenizer_chat_template(t), &known), KV_CHAT_PLAIN);
    CU_ASSERT_EQUAL(known, 0);
    kv_tokenizer_free(t);
}

/* Every family renders system + user + assistant + user as chat.h documents; a template list in
 * tokenizer_config.json gives the one named "default"; bad roles and names are refused. */
static void test_chat_formats(void) {
    static const struct {
        kv_chat_format f;
        const char *want;
    } cases[] = {
        {KV_CHAT_PLAIN, "Be brief.\n Hi \nHello!\nMore"},
        {KV_CHAT_CHATML, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi "
                         "<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n"
                         "More<|im_end|>\n<|im_start|>assistant\n"},
        {KV_CHAT_LLAMA2, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] "
                         "More [/INST]"},
        {KV_CHAT_LLAMA3, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                         "<|start_header_id|>user<|end_header_id|>\n\nMore<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        {KV_CHAT_ZEPHYR, "<|system|>\nBe brief.</s>\n<|user|>\n Hi </s>\n<|assistant|>\nHello!"
                         "</s>\n<|user|>\nMore</s>\n<|assistant|>\n"},
        {KV_CHAT_GEMMA, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
                        "Hello!<end_of_turn>\n<start_of_turn>user\nMore<end_of_turn>\n"
                        "<start_of_turn>model\n"},
    };
    kv_chat_msg m[] = {
        {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello!"}, {"user", "More"}};
    kv_error err = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *txt = NULL;
        CU_ASSERT_EQUAL_FATAL(kv_chat_render(cases[i].f, m, 4, &txt, &err), KV_OK);
        if (strcmp(txt, cases[i].want))
            fprintf(stderr, "\n%s rendered:\n%s\n", kv_chat_format_name(cases[i].f), txt);
        CU_ASSERT_STRING_EQUAL(txt, cases[i].want);
        kv_chat_format back;
        CU_ASSERT_EQUAL(kv_chat_format_parse(kv_chat_format_name(cases[i].f), &back, &err), KV_OK);
        CU_ASSERT_EQUAL(back, cases[i].f);
        free(txt);
    }
    char *txt = NULL;
    kv_chat_msg bad[] = {{"tool", "x"}};
    CU_ASSERT_EQUAL(kv_chat_render(KV_CHAT_CHATML, bad, 1, &txt, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "role") != NULL && txt == NULL);
    kv_chat_format f;
    CU_ASSERT_EQUAL(kv_chat_format_parse("jinja", &f, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "'jinja'") != NULL && strstr(err.msg, "chatml") != NULL);
    /* tokenizer.json with a tokenizer_config.json that lists named templates */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -sf '%s' '%s/tokenizer.json'",
             tu_tmp("chat-json"), tu_shared("models/tinystories-656k/tokenizer.json"),
             tu_tmp("chat-json"));
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    FILE *cf = fopen(tu_tmp("chat-json/tokenizer_config.json"), "w");
    CU_ASSERT_FATAL(cf != NULL);
    fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"[INST]\"},"
          " {\"name\": \"default\", \"template\": \"{{ '<|im_start|>' }}\"}]}",
          cf);
    fclose(cf);
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(tu_tmp("chat-json/tokenizer.json"), NULL, &t, &err),
                          KV_OK);
    CU_ASSERT_STRING_EQUAL(kv_tokenizer_chat_template(t), "{{ '<|im_start|>' }}");
    CU_ASSERT_EQUAL(kv_chat_detect(kv_tokenizer_chat_template(t), NULL), KV_CHAT_CHATML);
    kv_tokenizer_free(t);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"llama.cpp tokenizer vectors, six vocabularies", test_llamacpp_vectors},
        {"special and user-defined tokens", test_special_tokens},
        {"byte-level BPE on a long text: round trip", test_bytelevel_long_text},
        {"every pre-tokenizer list; an unknown tokenizer.ggml.pre", test_every_pre_value},
        {"Llama 2 tokenizer.bin == llama-spm GGUF", test_llama2_tokenizer_bin},
        {"llama-2-tiny-random F16 GGUF: load, tokenize, generate", test_tiny_random_f16},
        {"CLI tokenize without a model; bad vocabulary files", test_cli_and_errors},
        {"chat template of the phi-3 vocabulary: family, rendering, control ids",
         test_chat_phi3_gguf},
        {"chat formats; named templates in tokenizer_config.json", test_chat_formats},
    };
    return tu_main(argc, argv, "tokenizer", tests, sizeof tests / sizeof tests[0]);
}
