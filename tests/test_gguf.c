/* GGUF reader (runtime/model/gguf.c): stories260K.gguf against stories260K.bin (config, weights,
 * embedded vocabulary vs tok512.bin), a synthetic GGUF v2 exercising every metadata type, F16, BF16
 * and Q8_0 tensors, alignment and a "gpt2" (byte-level BPE) vocabulary, and bad input made by
 * corrupting copies of the real file under tu_tmpdir(). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/model.h"
#include "model/model_impl.h"
#include "kvplan/tokenizer.h"
#include "gguf_writer.h"
#include "testutil.h"
#include "../runtime/util/f16.h"

#define G260 "models/stories260K/stories260K.gguf"
#define B260 "models/stories260K/stories260K.bin"

static void test_260k_config_and_weights(void) {
    kv_model *g = tu_load_shared(G260);
    kv_model *b = tu_load_shared(B260);
    const kv_config *c = &g->cfg;
    CU_ASSERT_STRING_EQUAL(g->format, "gguf");
    CU_ASSERT_STRING_EQUAL(c->arch, "llama");
    CU_ASSERT_EQUAL(c->dim, 64);
    CU_ASSERT_EQUAL(c->hidden_dim, 172);
    CU_ASSERT_EQUAL(c->n_layers, 5);
    CU_ASSERT_EQUAL(c->n_heads, 8);
    CU_ASSERT_EQUAL(c->n_kv_heads, 4);
    CU_ASSERT_EQUAL(c->head_dim, 8);
    CU_ASSERT_EQUAL(c->vocab_size, 512);
    CU_ASSERT_EQUAL(c->seq_len, 2048); /* what the GGUF says; the .bin says 512 */
    CU_ASSERT(fabsf(c->norm_eps - 1e-5f) < 1e-9f);
    CU_ASSERT_EQUAL(c->rope_theta, 10000.0f);
    CU_ASSERT_EQUAL(c->rope_layout, KV_ROPE_ADJACENT);
    CU_ASSERT_EQUAL(c->bos_id, 1);
    CU_ASSERT_EQUAL(c->eos_id, 2);
    CU_ASSERT_EQUAL(c->attn_bias, 0);
    CU_ASSERT_STRING_EQUAL(g->sha256,
                           "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");
    size_t d = 64, V = 512, hid = 172, kvd = 32;
    CU_ASSERT_EQUAL(memcmp(g->tok_emb.data, b->tok_emb.data, V * d * 4), 0);
    CU_ASSERT_EQUAL(memcmp(g->final_norm, b->final_norm, d * 4), 0);
    CU_ASSERT_EQUAL(memcmp(g->classifier.data, b->classifier.data, V * d * 4), 0);
    for (int l = 0; l < 5; l++) {
        const kv_layer_weights *x = &g->layers[l], *y = &b->layers[l];
        CU_ASSERT_EQUAL(memcmp(x->attn_norm, y->attn_norm, d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->wq.data, y->wq.data, d * d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->wk.data, y->wk.data, kvd * d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->wv.data, y->wv.data, kvd * d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->wo.data, y->wo.data, d * d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->ffn_norm, y->ffn_norm, d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->w_gate.data, y->w_gate.data, hid * d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->w_down.data, y->w_down.data, hid * d * 4), 0);
        CU_ASSERT_EQUAL(memcmp(x->w_up.data, y->w_up.data, hid * d * 4), 0);
        CU_ASSERT_PTR_NULL(x->bq);
    }
    kv_model_free(g);
    kv_model_free(b);
}

static void test_260k_vocab_vs_tok512(void) {
    kv_model *g = tu_load_shared(G260);
    kv_model *b = tu_load_shared(B260);
    kv_error err = {0};
    kv_tokenizer *tg = NULL, *tb = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, g, &tg, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, b, &tb, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_tokenizer_kind(tg), KV_TOK_SPM);
    CU_ASSERT_EQUAL(kv_tokenizer_bos(tg), 1);
    CU_ASSERT_EQUAL(kv_tokenizer_eos(tg), 2);
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(
        kv_read_file(tu_shared("text/tinystories_val_head.txt"), &text, &len, &err), KV_OK);
    int *a = NULL, *c = NULL, na = 0, nc = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(tg, text, len, 1, &a, &na, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(tb, text, len, 1, &c, &nc, &err), KV_OK);
    printf("\n  TinyStories text: %d tokens (GGUF vocabulary), %d (tok512.bin)\n", na, nc);
    CU_ASSERT_EQUAL(na, nc);
    CU_ASSERT(na == nc && memcmp(a, c, (size_t)na * sizeof *a) == 0);
    char *da = NULL, *dc = NULL;
    CU_ASSERT_EQUAL(kv_tokenizer_decode(tg, a, na, &da, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_tokenizer_decode(tb, c, nc, &dc, &err), KV_OK);
    CU_ASSERT(da && dc && strcmp(da, dc) == 0);
    free(da);
    free(dc);
    free(a);
    free(c);
    free(text);
    kv_tokenizer_free(tg);
    kv_tokenizer_free(tb);
    kv_model_free(g);
    kv_model_free(b);
}

/* ---- synthetic files, written with the tests' GGUF writer (tests/support/gguf_writer.h) ---- */
static uint16_t to_f16(float f) { /* exact for the small dyadic values used here */
    uint32_t b;
    memcpy(&b, &f, 4);
    uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, man = b & 0x7fffff;
    if (exp == 0) return (uint16_t)sign;
    return (uint16_t)(sign | ((exp - 127 + 15) << 10) | (man >> 13));
}

#define SY_DIM 32
#define SY_HID 64
#define SY_NTOK 266

/* Byte-level vocabulary: the 256 byte code points in byte order, then merges' results. */
static void gpt2_tokens(char tok[SY_NTOK][32]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable =
            (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = b;
        if (!printable) {
            cp = 256;
            for (int x = 0; x < b; x++)
                if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) ||
                      (x >= 0xAE && x <= 0xFF)))
                    cp++;
        }
        char *o = tok[n++];
        if (cp < 0x80) {
            o[0] = (char)cp;
            o[1] = 0;
        } else {
            o[0] = (char)(0xC0 | (cp >> 6));
            o[1] = (char)(0x80 | (cp & 0x3F));
            o[2] = 0;
        }
    }
    const char *extra[] = {"\xc4\xa0w", "or", "\xc4\xa0wor", "\xc4\xa0worl", "\xc4\xa0world",
                           "He",        "ll", "Hell",        "Hello",        "<|endoftext|>"};
    for (int i = 0; i < 10; i++) snprintf(tok[n++], 32, "%s", extra[i]);
}
static const char *gpt2_merges[] = {"\xc4\xa0 w",     "o r", "\xc4\xa0w or", "\xc4\xa0wor l",
                                    "\xc4\xa0worl d", "H e", "l l",          "He ll",
                                    "Hell o"};

typedef struct sy_tensor {
    const char *name;
    uint64_t ne0, ne1; /* ne1 = 0: 1-D */
    uint32_t type;
} sy_tensor;

/* Value of element i of tensor k (exactly representable in F16, BF16 and Q8_0 with d = 1/64). */
static float sy_value(int k, size_t i) {
    return (float)((int)((i * 7 + (size_t)k * 13) % 101) - 50) / 64.0f;
}

static const sy_tensor sy_t[] = {
    {"token_embd.weight", SY_DIM, SY_NTOK, 0},       {"output_norm.weight", SY_DIM, 0, 0},
    {"blk.0.attn_norm.weight", SY_DIM, 0, 0},        {"blk.0.attn_q.weight", SY_DIM, SY_DIM, 1},
    {"blk.0.attn_k.weight", SY_DIM, 16, 30},         {"blk.0.attn_v.weight", SY_DIM, 16, 8},
    {"blk.0.attn_output.weight", SY_DIM, SY_DIM, 0}, {"blk.0.ffn_norm.weight", SY_DIM, 0, 0},
    {"blk.0.ffn_gate.weight", SY_DIM, SY_HID, 8},    {"blk.0.ffn_down.weight", SY_HID, SY_DIM, 1},
    {"blk.0.ffn_up.weight", SY_DIM, SY_HID, 30},
};
#define SY_N (sizeof sy_t / sizeof sy_t[0])

static size_t sy_bytes(const sy_tensor *t) {
    size_t n = t->ne0 * (t->ne1 ? t->ne1 : 1);
    return t->type == 0 ? 4 * n : t->type == 8 ? n / 32 * 34 : 2 * n;
}

/* Variants of the synthetic file with hostile metadata (issue 25): llama.vocab_size as a u64
 * of 2^32 + 256; token_type as float32 with one value 2^31 or NaN. */
enum { SY_PLAIN, SY_VOCAB_2P32, SY_TYPE_2P31, SY_TYPE_NAN };

static void write_synthetic_v(const char *path, uint32_t version, uint32_t align, const char *pre,
                              int variant) {
    tw_buf w = {0};
    tw_gguf_header(&w, version, SY_N);
    tw_kv_str(&w, "general.architecture", "llama");
    tw_kv_u32(&w, "general.alignment", align);
    tw_kv_u32(&w, "llama.embedding_length", SY_DIM);
    tw_kv_u32(&w, "llama.feed_forward_length", SY_HID);
    tw_kv_u32(&w, "llama.block_count", 1);
    tw_kv_u32(&w, "llama.attention.head_count", 2);
    tw_kv_u32(&w, "llama.attention.head_count_kv", 1);
    tw_kv_u32(&w, "llama.context_length", 64);
    tw_kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    tw_kv_f32(&w, "llama.rope.freq_base", 5000.0f);
    /* one scalar of every type, and arrays of every type (skipped by the reader) */
    for (uint32_t t = 0; t <= 12; t++) {
        if (t == TW_STRING || t == TW_ARRAY) continue;
        char k[64];
        uint64_t one = 1;
        size_t size = t == 0 || t == 1 || t == 7 ? 1 : t == 2 || t == 3 ? 2 : t >= 10 ? 8 : 4;
        snprintf(k, sizeof k, "test.scalar.%u", t);
        tw_key(&w, k, t);
        tw_put(&w, &one, size);
        snprintf(k, sizeof k, "test.array.%u", t);
        tw_kv_array(&w, k, t, 3);
        for (int i = 0; i < 3; i++) tw_put(&w, &one, size);
    }
    tw_kv_str(&w, "tokenizer.ggml.model", "gpt2");
    tw_kv_str(&w, "tokenizer.ggml.pre", pre);
    char tok[SY_NTOK][32];
    gpt2_tokens(tok);
    tw_kv_array(&w, "tokenizer.ggml.tokens", TW_STRING, SY_NTOK);
    for (int i = 0; i < SY_NTOK; i++) tw_str(&w, tok[i]);
    if (variant == SY_VOCAB_2P32) {
        tw_key(&w, "llama.vocab_size", TW_UINT64);
        tw_u64(&w, ((uint64_t)1 << 32) + 256);
    }
    if (variant == SY_TYPE_2P31 || variant == SY_TYPE_NAN) {
        tw_kv_array(&w, "tokenizer.ggml.token_type", TW_FLOAT32, SY_NTOK);
        for (int i = 0; i < SY_NTOK; i++)
            tw_f32(&w, i != 5 ? 1.0f : variant == SY_TYPE_NAN ? NAN : 2147483648.0f);
    } else {
        tw_kv_array(&w, "tokenizer.ggml.token_type", TW_INT32, SY_NTOK);
        for (int i = 0; i < SY_NTOK; i++) tw_u32(&w, i == SY_NTOK - 1 ? 3 : 1);
    }
    tw_kv_array(&w, "tokenizer.ggml.merges", TW_STRING, 9);
    for (int i = 0; i < 9; i++) tw_str(&w, gpt2_merges[i]);
    tw_kv_u32(&w, "tokenizer.ggml.bos_token_id", SY_NTOK - 1);
    tw_kv_u32(&w, "tokenizer.ggml.eos_token_id", SY_NTOK - 1);
    tw_gguf_kv_count(&w);
    uint64_t off = 0;
    for (size_t k = 0; k < SY_N; k++) {
        tw_tensor_info(&w, sy_t[k].name, sy_t[k].ne1 ? 2 : 1, sy_t[k].ne0, sy_t[k].ne1,
                       sy_t[k].type, off);
        off += (sy_bytes(&sy_t[k]) + align - 1) / align * align;
    }
    tw_pad(&w, align);
    for (size_t k = 0; k < SY_N; k++) {
        size_t n = sy_t[k].ne0 * (sy_t[k].ne1 ? sy_t[k].ne1 : 1);
        if (sy_t[k].type == 0)
            for (size_t i = 0; i < n; i++) tw_f32(&w, sy_value((int)k, i));
        else if (sy_t[k].type == 1)
            for (size_t i = 0; i < n; i++) {
                uint16_t h = to_f16(sy_value((int)k, i));
                tw_put(&w, &h, 2);
            }
        else if (sy_t[k].type == 30)
            for (size_t i = 0; i < n; i++) {
                float v = sy_value((int)k, i);
                uint32_t b;
                memcpy(&b, &v, 4);
                uint16_t h = (uint16_t)(b >> 16);
                tw_put(&w, &h, 2);
            }
        else
            for (size_t b = 0; b < n / 32; b++) {
                uint16_t d = to_f16(1.0f / 64.0f);
                tw_put(&w, &d, 2);
                for (int j = 0; j < 32; j++) {
                    int8_t q = (int8_t)lrintf(sy_value((int)k, b * 32 + (size_t)j) * 64.0f);
                    tw_put(&w, &q, 1);
                }
            }
        tw_pad(&w, align);
    }
    kv_error err = {0};
    int rc = tw_save(&w, path, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    tw_buf_free(&w);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
}

static void write_synthetic(const char *path, uint32_t version, uint32_t align, const char *pre) {
    write_synthetic_v(path, version, align, pre, SY_PLAIN);
}

/* Issue 25: a token_type of 2^31 or NaN was converted to int (undefined behaviour; found by
 * the gguf fuzz target) and a u64 vocab_size of 2^32 + 256 was read as 256. Each is refused
 * with exit 1 naming the file and the key, through the library and `kvplan tokenize`. */
static void test_hostile_metadata(void) {
    struct {
        int variant;
        const char *key, *what;
    } cases[] = {
        {SY_TYPE_2P31, "tokenizer.ggml.token_type[5]", "2.14748e+09"},
        {SY_TYPE_NAN, "tokenizer.ggml.token_type[5]", "nan"},
        {SY_VOCAB_2P32, "llama.vocab_size", "4294967552"},
    };
    const char *path = tu_tmp("hostile.gguf");
    for (int i = 0; i < 3; i++) {
        write_synthetic_v(path, 3, 32, "default", cases[i].variant);
        kv_error err = {0};
        kv_model *m = NULL;
        kv_tokenizer *t = NULL;
        int rc = kv_model_load(path, &m, &err);
        if (!rc) rc = kv_tokenizer_load(NULL, m, &t, &err);
        CU_ASSERT_EQUAL(rc, KV_EINPUT);
        if (!strstr(err.msg, cases[i].key) || !strstr(err.msg, cases[i].what))
            fprintf(stderr, "\ncase %d: %s\n", i, err.msg);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, cases[i].key));
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, cases[i].what));
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
        kv_tokenizer_free(t);
        kv_model_free(m);
        /* the command: a crafted vocabulary given as --tokenizer */
        if (cases[i].variant == SY_VOCAB_2P32) continue;
        FILE *f = fopen(tu_tmp("hostile.txt"), "w");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fputs("Hello world\n", f);
        fclose(f);
        char args[2048], *out = NULL;
        snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text '%s'", path,
                 tu_tmp("hostile.txt"));
        CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
        CU_ASSERT_PTR_NOT_NULL(out ? strstr(out, cases[i].key) : NULL);
        free(out);
    }
}

/* The weight's n values, dequantised from the type it is kept in, are tensor k's. */
static int equal_values(kv_weight w, int k, size_t n) {
    float *p = malloc(n * sizeof *p);
    int ok = p && kv_dequantize_row(w.type, w.data, p, (int64_t)n, NULL) == KV_OK;
    for (size_t i = 0; ok && i < n; i++)
        if (p[i] != sy_value(k, i)) ok = 0;
    free(p);
    return ok;
}

static void test_synthetic_types(void) {
    const char *path = tu_tmp("synthetic.gguf");
    uint32_t versions[] = {2, 3}, aligns[] = {32, 64};
    for (int v = 0; v < 2; v++) {
        write_synthetic(path, versions[v], aligns[v], "default");
        kv_model *m = tu_load_model(path);
        CU_ASSERT_EQUAL(m->cfg.dim, SY_DIM);
        CU_ASSERT_EQUAL(m->cfg.hidden_dim, SY_HID);
        CU_ASSERT_EQUAL(m->cfg.n_kv_heads, 1);
        CU_ASSERT_EQUAL(m->cfg.head_dim, 16);
        CU_ASSERT_EQUAL(m->cfg.vocab_size, SY_NTOK);
        CU_ASSERT_EQUAL(m->cfg.rope_theta, 5000.0f);
        CU_ASSERT_EQUAL(m->cfg.tied_embeddings, 1);
        CU_ASSERT_PTR_EQUAL(m->classifier.data, m->tok_emb.data);
        const kv_layer_weights *l = &m->layers[0];
        CU_ASSERT(equal_values(m->tok_emb, 0, SY_DIM * SY_NTOK));
        CU_ASSERT(equal_values(l->wq, 3, SY_DIM * SY_DIM));     /* F16 */
        CU_ASSERT(equal_values(l->wk, 4, SY_DIM * 16));         /* BF16 */
        CU_ASSERT(equal_values(l->wv, 5, SY_DIM * 16));         /* Q8_0 */
        CU_ASSERT(equal_values(l->w_gate, 8, SY_DIM * SY_HID)); /* Q8_0 */
        CU_ASSERT(equal_values(l->w_down, 9, SY_DIM * SY_HID)); /* F16 */
        CU_ASSERT(equal_values(l->w_up, 10, SY_DIM * SY_HID));  /* BF16 */
        /* the matrices stay in their file's type */
        CU_ASSERT_EQUAL(l->wq.type, KV_DT_F16);
        CU_ASSERT_EQUAL(l->wk.type, KV_DT_BF16);
        CU_ASSERT_EQUAL(l->wv.type, KV_DT_Q8_0);
        CU_ASSERT_EQUAL(l->w_gate.type, KV_DT_Q8_0);
        CU_ASSERT_EQUAL(l->w_down.type, KV_DT_F16);
        CU_ASSERT_EQUAL(l->w_up.type, KV_DT_BF16);
        kv_model_free(m);
    }
}

static void test_synthetic_gpt2_vocab(void) {
    const char *path = tu_tmp("synthetic-gpt2.gguf");
    write_synthetic(path, 3, 32, "default");
    kv_model *m = tu_load_model(path);
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    int rc = kv_tokenizer_load(NULL, m, &t, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT_EQUAL(kv_tokenizer_kind(t), KV_TOK_BPE);
    const char *text = "Hello world<|endoftext|>Hello";
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &err), KV_OK);
    int expect[] = {264, 260, 265, 264}; /* Hello, Ġworld, <|endoftext|>, Hello */
    CU_ASSERT_EQUAL(n, 4);
    CU_ASSERT(n == 4 && memcmp(ids, expect, sizeof expect) == 0);
    free(ids);
    /* byte-level BPE is lossless on any bytes */
    free(tu_roundtrip(t, "caf\xc3\xa9 \xf0\x9f\x99\x82\n\n\tdon't  stop 123", &n));
    kv_tokenizer_free(t);
    kv_model_free(m);
}

/* The other pre-tokenizer patterns compile and stay lossless; an unknown one is refused. */
static void test_synthetic_pre(void) {
    const char *pres[] = {"qwen2", "llama-bpe", "no-such-pre"};
    for (int i = 0; i < 3; i++) {
        const char *path = tu_tmp("synthetic-pre.gguf");
        write_synthetic(path, 3, 32, pres[i]);
        kv_model *m = tu_load_model(path);
        kv_error err = {0};
        kv_tokenizer *t = NULL;
        int rc = kv_tokenizer_load(NULL, m, &t, &err);
        if (i == 2) {
            CU_ASSERT_EQUAL(rc, KV_EINPUT);
            CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "tokenizer.ggml.pre"));
            CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
        } else {
            CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
            int n = 0;
            int *ids = tu_roundtrip(
                t, "Hello world, it's 2024!\r\n\n  \xc3\xa9t\xc3\xa9 \xf0\x9f\x99\x82", &n);
            CU_ASSERT(n > 0 && ids[0] == 264); /* Hello */
            free(ids);
        }
        kv_tokenizer_free(t);
        kv_model_free(m);
    }
}

/* ---- bad input: corrupted copies of stories260K.gguf ---- */
static unsigned char *orig;
static size_t orig_len;

static void read_orig(void) {
    if (orig) return;
    kv_error err = {0};
    char *d = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_read_file(tu_shared(G260), &d, &orig_len, &err), KV_OK);
    orig = (unsigned char *)d;
}

static size_t find(const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= orig_len; i++)
        if (memcmp(orig + i, needle, n) == 0) return i;
    CU_FAIL_FATAL("needle not found");
    return 0;
}

/* Write `len` bytes of buf to a temp file, load it, expect KV_EINPUT and every substring. */
static void expect_bad(const char *name, const unsigned char *buf, size_t len, int direct,
                       const char *s1, const char *s2) {
    const char *path = tu_tmp(name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fwrite(buf, 1, len, f);
    fclose(f);
    kv_error err = {0};
    kv_model *m = NULL;
    int rc = direct ? kv_model_load_gguf(path, &m, &err) : kv_model_load(path, &m, &err);
    printf("\n    %s -> %s", name, err.msg);
    CU_ASSERT_EQUAL(rc, KV_EINPUT);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
    if (s1) CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, s1));
    if (s2) CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, s2));
    kv_model_free(m);
}

/* Offset of the tensor info fields after the name `name` (n_dims). */
static size_t tinfo(const char *name) {
    char key[128];
    size_t n = strlen(name);
    memcpy(key, &(uint64_t){n}, 8);
    memcpy(key + 8, name, n + 1);
    for (size_t i = 0; i + 8 + n <= orig_len; i++)
        if (memcmp(orig + i, key, 8 + n) == 0) return i + 8 + n;
    CU_FAIL_FATAL("tensor info not found");
    return 0;
}

static void test_bad_gguf(void) {
    read_orig();
    unsigned char *b = malloc(orig_len);
    /* wrong magic */
    memcpy(b, orig, orig_len);
    memcpy(b, "GGUG", 4);
    expect_bad("magic.gguf", b, orig_len, 1, "magic", NULL);
    /* version 1 and 99 */
    memcpy(b, orig, orig_len);
    memcpy(b + 4, &(uint32_t){1}, 4);
    expect_bad("v1.gguf", b, orig_len, 0, "version 1", NULL);
    memcpy(b + 4, &(uint32_t){99}, 4);
    expect_bad("v99.gguf", b, orig_len, 0, "version 99", NULL);
    /* truncated header and truncated tensor data */
    expect_bad("header-cut.gguf", orig, 5000, 0, "truncated GGUF header", NULL);
    expect_bad("data-cut.gguf", orig, orig_len - 1000, 0, "extends past the end", "truncated");
    /* an offset past the end of the file */
    memcpy(b, orig, orig_len);
    size_t p = tinfo("blk.2.attn_q.weight");
    memcpy(b + p + 4 + 16 + 4, &(uint64_t){(uint64_t)orig_len * 4}, 8);
    expect_bad("offset.gguf", b, orig_len, 0, "blk.2.attn_q.weight", "past the end");
    /* unsupported and unknown tensor types; a supported type whose block does not fit the row
     * (Q4_K blocks hold 256 elements, this tensor's rows 64) */
    memcpy(b, orig, orig_len);
    memcpy(b + p + 4 + 16, &(uint32_t){10}, 4);
    expect_bad("q2k.gguf", b, orig_len, 0, "blk.2.attn_q.weight", "Q2_K");
    memcpy(b + p + 4 + 16, &(uint32_t){12}, 4);
    expect_bad("q4k.gguf", b, orig_len, 0, "blk.2.attn_q.weight", "multiple of 256");
    memcpy(b + p + 4 + 16, &(uint32_t){99}, 4);
    expect_bad("type99.gguf", b, orig_len, 0, "blk.2.attn_q.weight", "type 99");
    /* a missing tensor */
    memcpy(b, orig, orig_len);
    size_t q = find("blk.4.ffn_up.weight");
    memcpy(b + q, "blk.4.ffn_UP.weight", 19);
    expect_bad("missing.gguf", b, orig_len, 0, "'blk.4.ffn_up.weight' is missing", NULL);
    /* a shape that disagrees with the config */
    memcpy(b, orig, orig_len);
    size_t k = find("llama.feed_forward_length");
    memcpy(b + k + strlen("llama.feed_forward_length") + 4, &(uint32_t){173}, 4);
    expect_bad("shape.gguf", b, orig_len, 0, "blk.0.ffn_gate.weight", "feed_forward_length");
    /* a missing config key */
    memcpy(b, orig, orig_len);
    k = find("llama.block_count");
    memcpy(b + k, "llama.block_xxxxx", 17);
    expect_bad("nokey.gguf", b, orig_len, 0, "llama.block_count", "missing");
    /* a metadata value of an unknown type */
    memcpy(b, orig, orig_len);
    k = find("general.name");
    memcpy(b + k + strlen("general.name"), &(uint32_t){77}, 4);
    expect_bad("kvtype.gguf", b, orig_len, 0, "general.name", "unknown value type 77");
    /* an absurd string length in the metadata */
    memcpy(b, orig, orig_len);
    memcpy(b + k - 8, &(uint64_t){(uint64_t)1 << 60}, 8);
    expect_bad("strlen.gguf", b, orig_len, 0, "metadata key at byte", "only");
    printf("\n");
    free(b);
    free(orig);
    orig = NULL;
}

/* Every binary16 pattern against value = (-1)^s * 2^(e-15) * (1 + m/1024) (2^-14 * m/1024 for
 * subnormals), infinities and NaN; bfloat16 is the top half of an fp32. */
static void test_half_conversions(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
        float got = kv_f16_to_f32((uint16_t)h);
        if (e == 31) {
            bad += m ? !isnan(got) : !(isinf(got) && (got < 0) == s);
            continue;
        }
        double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
        if (s) v = -v;
        bad += (double)got != v || (signbit(got) != 0) != s;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(kv_bf16_to_f32(0x3f80), 1.0f);
    CU_ASSERT_EQUAL(kv_bf16_to_f32(0xc040), -3.0f);
    CU_ASSERT_EQUAL(kv_load_u16le((const unsigned char *)"\x34\x12"), 0x1234);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"F16 / BF16 conversions, all 65536 halves", test_half_conversions},
        {"stories260K.gguf config and weights equal the .bin", test_260k_config_and_weights},
        {"embedded vocabulary tokenizes like tok512.bin", test_260k_vocab_vs_tok512},
        {"synthetic v2/v3: metadata types, F16/BF16/Q8_0, alignment", test_synthetic_types},
        {"synthetic gpt2 vocabulary", test_synthetic_gpt2_vocab},
        {"synthetic gpt2 vocabulary: qwen2 / llama-bpe patterns", test_synthetic_pre},
        {"bad input: magic, version, truncation, offsets, types, tensors, shapes", test_bad_gguf},
        {"hostile metadata: token_type 2^31 / NaN, vocab_size 2^32 + 256", test_hostile_metadata},
    };
    return tu_main(argc, argv, "gguf", tests, sizeof tests / sizeof tests[0]);
}
