/* Hugging Face directories (runtime/model/hf.c): config.json + safetensors (single file, sharded
 * index, F32/F16/BF16, tied embeddings through the __metadata__ alias), tokenizer.json BPE in the
 * SentencePiece style (tinystories-656k) and the GPT-2 byte-level style (synthetic), and bad
 * input made by corrupting copies of the real files under tu_tmpdir(). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/forward.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "model/model_impl.h"
#include "kvplan/tokenizer.h"
#include "tokenizer/tokenizer_bpe.h" /* kv_tokenizer_load_json, the fields */
#include "testutil.h"

#define M656 "models/tinystories-656k"

int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(fwrite(data, 1, len, f), len);
    fclose(f);
}

static char *slurp(const char *path, size_t *len) {
    kv_error err = {0};
    char *d = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_read_file(path, &d, len, &err), KV_OK);
    return d;
}

static void test_656k_model(void) {
    kv_model *m = tu_load_shared(M656);
    const kv_config *c = &m->cfg;
    CU_ASSERT_STRING_EQUAL(m->format, "safetensors");
    CU_ASSERT_STRING_EQUAL(c->arch, "llama");
    CU_ASSERT_EQUAL(c->dim, 128);
    CU_ASSERT_EQUAL(c->hidden_dim, 384);
    CU_ASSERT_EQUAL(c->n_layers, 2);
    CU_ASSERT_EQUAL(c->n_heads, 8);
    CU_ASSERT_EQUAL(c->n_kv_heads, 4);
    CU_ASSERT_EQUAL(c->head_dim, 16);
    CU_ASSERT_EQUAL(c->vocab_size, 2048);
    CU_ASSERT_EQUAL(c->seq_len, 512);
    CU_ASSERT(fabsf(c->norm_eps - 1e-6f) < 1e-12f);
    CU_ASSERT_EQUAL(c->rope_theta, 10000.0f);
    CU_ASSERT_EQUAL(c->rope_layout, KV_ROPE_HALF);
    CU_ASSERT_EQUAL(c->tied_embeddings, 1);
    CU_ASSERT_EQUAL(c->attn_bias, 0);
    CU_ASSERT_EQUAL(c->bos_id, 1);
    CU_ASSERT_EQUAL(c->eos_id, 2);
    /* only lm_head.weight is stored; __metadata__ aliases model.embed_tokens.weight to it */
    CU_ASSERT_PTR_EQUAL(m->classifier.data, m->tok_emb.data);
    char cfg[4200], st[4200], hex[65];
    snprintf(cfg, sizeof cfg, "%s/config.json", tu_shared(M656));
    snprintf(st, sizeof st, "%s/model.safetensors", tu_shared(M656));
    const char *paths[] = {cfg, st};
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_sha256_files(paths, 2, hex, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(m->sha256, hex);
    CU_ASSERT_EQUAL(kv_model_param_count(m), 656000);
    kv_model_free(m);
}

static void test_656k_tokenizer(void) {
    kv_model *m = tu_load_shared(M656);
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, m, &t, &err), KV_OK);
    CU_ASSERT_EQUAL(t->kind, KV_TOK_BPE);
    CU_ASSERT_EQUAL(t->bos_id, 1);
    CU_ASSERT_EQUAL(t->eos_id, 2);
    CU_ASSERT_EQUAL(t->add_bos, 1); /* tokenizer_config.json add_bos_token */
    /* ids checked against a direct Python implementation of the tokenizers BPE merge loop */
    const char *s = "Once upon a time, there was a little girl.\n";
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, s, strlen(s), -1, &ids, &n, &err), KV_OK);
    int expect[] = {1, 80, 147, 201, 282, 215, 286, 1890, 122};
    CU_ASSERT_EQUAL(n, 9);
    CU_ASSERT(n == 9 && memcmp(ids, expect, sizeof expect) == 0);
    free(ids);
    /* special tokens are matched verbatim; each segment around them is normalised alone */
    const char *sp = "The end.<|end_story|><|start_story|>Once";
    int *a = NULL, *b = NULL, *c = NULL, na, nb, nc;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, sp, strlen(sp), 0, &a, &na, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, "The end.", 8, 0, &b, &nb, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, "Once", 4, 0, &c, &nc, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(na, nb + 2 + nc);
    CU_ASSERT_EQUAL(memcmp(a, b, (size_t)nb * sizeof *a), 0);
    CU_ASSERT_EQUAL(a[nb], 2);
    CU_ASSERT_EQUAL(a[nb + 1], 1);
    CU_ASSERT_EQUAL(memcmp(a + nb + 2, c, (size_t)nc * sizeof *a), 0);
    free(a);
    free(b);
    free(c);
    kv_tokenizer_free(t);
    kv_model_free(m);
}

/* decode(encode(text)) == text for the whole TinyStories file. The 656K vocabulary declares
 * byte_fallback but has no <0xXX> tokens, so the code points it lacks (a few mojibake
 * characters and '/') become <unk> exactly as in Hugging Face tokenizers; they are found by
 * encoding each distinct code point alone, and the round trip must give the text without
 * them, byte for byte. */
static void test_656k_round_trip(void) {
    kv_model *m = tu_load_shared(M656);
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_load(NULL, m, &t, &err), KV_OK);
    size_t len = 0;
    char *text = slurp(tu_shared("text/tinystories_val_head.txt"), &len);
    double t0 = kv_now();
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, text, len, 1, &ids, &n, &err), KV_OK);
    double enc = kv_now() - t0;
    char *back = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_decode(t, ids, n, &back, &err), KV_OK);
    int unk = 0;
    for (int i = 0; i < n; i++) unk += ids[i] == 0;
    /* the expected text: drop every code point the vocabulary cannot spell */
    char *expect = malloc(len + 1);
    size_t k = 0, dropped = 0;
    for (size_t i = 0; i < len;) {
        size_t cl = 1;
        unsigned char c0 = (unsigned char)text[i];
        if (c0 >= 0xF0)
            cl = 4;
        else if (c0 >= 0xE0)
            cl = 3;
        else if (c0 >= 0xC0)
            cl = 2;
        int *ci = NULL, nci = 0, oov = 0;
        if (text[i] != ' ' && text[i] != '\n') {
            CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, text + i, cl, 0, &ci, &nci, &err), KV_OK);
            for (int j = 0; j < nci; j++) oov |= ci[j] == 0;
            free(ci);
        }
        if (!oov) {
            memcpy(expect + k, text + i, cl);
            k += cl;
        } else {
            dropped++;
        }
        i += cl;
    }
    expect[k] = '\0';
    printf("\n  %zu bytes -> %d tokens in %.3f s; %d <unk> tokens for %zu code points the "
           "vocabulary lacks\n",
           len, n, enc, unk, dropped);
    CU_ASSERT(dropped > 0 && dropped < 1000);
    CU_ASSERT_EQUAL(strlen(back), k);
    CU_ASSERT(strcmp(back, expect) == 0);
    free(expect);
    free(back);
    free(ids);
    free(text);
    kv_tokenizer_free(t);
    kv_model_free(m);
}

/* A SentencePiece-style tokenizer.json with real byte fallback: lossless on any UTF-8. */
static void test_spm_byte_fallback(void) {
    char *js = malloc(64 * 1024);
    size_t k = (size_t)sprintf(js, "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                                   "\"unk_token\": \"<unk>\", \"fuse_unk\": true, \"vocab\": {"
                                   "\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2");
    for (int b = 0; b < 256; b++) k += (size_t)sprintf(js + k, ", \"<0x%02X>\": %d", b, 3 + b);
    const char *chars[] = {"\xe2\x96\x81",
                           "h",
                           "e",
                           "l",
                           "o",
                           "w",
                           "r",
                           "d",
                           "\xe2\x96\x81h",
                           "el",
                           "\xe2\x96\x81hel",
                           "lo",
                           "\xe2\x96\x81hello"};
    for (int i = 0; i < 13; i++) k += (size_t)sprintf(js + k, ", \"%s\": %d", chars[i], 259 + i);
    k += (size_t)sprintf(js + k,
                         "}, \"merges\": [\"\xe2\x96\x81 h\", \"e l\", "
                         "\"\xe2\x96\x81h el\", \"l o\", \"\xe2\x96\x81hel lo\"]}, "
                         "\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true},"
                         "{\"id\": 2, \"content\": \"</s>\", \"special\": true}], "
                         "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
                         "{\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"}, {\"type\": "
                         "\"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": "
                         "\"\xe2\x96\x81\"}]}, \"pre_tokenizer\": null, \"post_processor\": "
                         "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                         "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\"}}]}}");
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tu_tmp("spm"));
    mkdir(dir, 0755);
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, js, k);
    free(js);
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    int rc = kv_tokenizer_load_json(path, NULL, &t, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT_EQUAL(t->add_bos, 1); /* from the post_processor template */
    int n = 0;
    int *ids = tu_roundtrip(t, "hello w\xc3\xa9rld \xf0\x9f\x99\x82", &n);
    /* ▁hello ▁ w <0xC3> <0xA9> r l d ▁ <0xF0> <0x9F> <0x99> <0x82> */
    int expect[] = {271, 259, 264,      3 + 0xC3, 3 + 0xA9, 265,     262,
                    266, 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x99, 3 + 0x82};
    CU_ASSERT_EQUAL(n, 13);
    CU_ASSERT(n == 13 && memcmp(ids, expect, sizeof expect) == 0);
    free(ids);
    kv_tokenizer_free(t);
}

/* GPT-2 byte-level tokenizer.json with the regex pre-tokenizer. */
static void test_bytelevel_json(void) {
    char *js = malloc(64 * 1024);
    size_t k = (size_t)sprintf(js, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    int id = 0;
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
        if (cp == '"' || cp == '\\')
            k += (size_t)sprintf(js + k, "%s\"\\%c\": %d", id ? ", " : "", cp, id);
        else
            k += (size_t)sprintf(js + k, "%s\"\\u%04x\": %d", id ? ", " : "", cp, id);
        id++;
    }
    /* 256 Ġt, 257 he, 258 Ġthe, 259 's, 260 Ġ1, 261 12 */
    k += (size_t)sprintf(js + k,
                         ", \"\\u0120t\": 256, \"he\": 257, \"\\u0120the\": 258, \"'s\": 259,"
                         " \"\\u01201\": 260, \"12\": 261, \"<|endoftext|>\": 262}, \"merges\": ["
                         "[\"\\u0120\", \"t\"], [\"h\", \"e\"], [\"\\u0120t\", \"he\"], "
                         "[\"'\", \"s\"], [\"\\u0120\", \"1\"], [\"1\", \"2\"]]}, "
                         "\"added_tokens\": [{\"id\": 262, \"content\": \"<|endoftext|>\", "
                         "\"special\": true}], \"normalizer\": null, \"pre_tokenizer\": {\"type\": "
                         "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
                         "\"decoder\": {\"type\": \"ByteLevel\"}}");
    const char *path = tu_tmp("bytelevel.json");
    write_file(path, js, k);
    free(js);
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    int rc = kv_tokenizer_load_json(path, NULL, &t, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT_EQUAL(t->add_bos, 0);
    /* "it's the 12" -> it | 's | Ġthe | Ġ12: the regex splits " 12" before BPE, so Ġ1 2 */
    const char *s = "it's the 12<|endoftext|>";
    int *ids = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(kv_tokenizer_encode(t, s, strlen(s), 0, &ids, &n, &err), KV_OK);
    int expect[] = {'i', 't', 259, 258, 260, '2', 262};
    CU_ASSERT_EQUAL(n, 7);
    CU_ASSERT(n == 7 && memcmp(ids, expect, sizeof expect) == 0);
    free(ids);
    free(tu_roundtrip(t, "Caf\xc3\xa9\n\n  \t\xf0\x9f\x99\x82 x", &n));
    kv_tokenizer_free(t);
}

/* ---- safetensors writer for sharded / half-precision copies ---- */
static uint16_t f16_rne(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    uint32_t sign = (b >> 16) & 0x8000;
    int e = (int)((b >> 23) & 0xff) - 127 + 15;
    uint32_t man = b & 0x7fffff;
    if (e <= 0) { /* subnormal: a multiple of 2^-24 */
        float a = fabsf(f) * 16777216.0f;
        return (uint16_t)(sign | (uint32_t)lrintf(a));
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}
static uint16_t bf16_rne(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fff + ((b >> 16) & 1);
    return (uint16_t)(b >> 16);
}

typedef struct wt {
    char name[96];
    const float *data; /* fp32: in place, or a copy dequantised from the model's type */
    int rows, cols;    /* rows 0 = 1-D */
} wt;

/* Write tensors [from, to) of list to `path` with dtype 1 F16, 2 BF16, 0 F32. */
static void write_st(const char *path, const wt *list, int from, int to, int dtype) {
    char *hdr = malloc(65536);
    size_t hk = (size_t)sprintf(hdr, "{\"__metadata__\": {\"format\": \"pt\"}");
    size_t off = 0, es = dtype ? 2 : 4;
    for (int i = from; i < to; i++) {
        size_t n = (size_t)(list[i].rows ? list[i].rows : 1) * (size_t)list[i].cols;
        if (list[i].rows)
            hk += (size_t)sprintf(hdr + hk,
                                  ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%d, %d], "
                                  "\"data_offsets\": [%zu, %zu]}",
                                  list[i].name,
                                  dtype == 1   ? "F16"
                                  : dtype == 2 ? "BF16"
                                               : "F32",
                                  list[i].rows, list[i].cols, off, off + n * es);
        else
            hk += (size_t)sprintf(hdr + hk,
                                  ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%d], "
                                  "\"data_offsets\": [%zu, %zu]}",
                                  list[i].name,
                                  dtype == 1   ? "F16"
                                  : dtype == 2 ? "BF16"
                                               : "F32",
                                  list[i].cols, off, off + n * es);
        off += n * es;
    }
    hk += (size_t)sprintf(hdr + hk, "}");
    while ((8 + hk) % 8) hdr[hk++] = ' ';
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint64_t hn = hk;
    fwrite(&hn, 8, 1, f);
    fwrite(hdr, 1, hk, f);
    for (int i = from; i < to; i++) {
        size_t n = (size_t)(list[i].rows ? list[i].rows : 1) * (size_t)list[i].cols;
        for (size_t j = 0; j < n; j++) {
            if (dtype == 0)
                fwrite(&list[i].data[j], 4, 1, f);
            else {
                uint16_t h = dtype == 1 ? f16_rne(list[i].data[j]) : bf16_rne(list[i].data[j]);
                fwrite(&h, 2, 1, f);
            }
        }
    }
    fclose(f);
    free(hdr);
}

/* fp32 values of a matrix kept in its own type: in place for F32, else a dequantised copy
 * adopted by the model (freed with it). */
static const float *f32_of(const kv_model *m, kv_weight w, int rows, int cols) {
    if (w.type == KV_DT_F32) return w.data;
    float *p = malloc((size_t)rows * cols * sizeof *p);
    kv_dequantize_row(w.type, w.data, p, (int64_t)rows * cols, NULL);
    kv_model_adopt((kv_model *)m, p, NULL); /* test-only: the model frees the copy */
    return p;
}

static int list_weights(const kv_model *m, wt *l) {
    int n = 0, d = m->cfg.dim, h = m->cfg.hidden_dim, q = m->cfg.n_heads * m->cfg.head_dim,
        kv = m->cfg.n_kv_heads * m->cfg.head_dim;
#define ADD(nm, p, r, c)                                                                           \
    (snprintf(l[n].name, sizeof l[n].name, "%s", nm), l[n].data = (p), l[n].rows = (r),            \
     l[n].cols = (c), n++)
    ADD("model.embed_tokens.weight", f32_of(m, m->tok_emb, m->cfg.vocab_size, d), m->cfg.vocab_size,
        d);
    ADD("model.norm.weight", m->final_norm, 0, d);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const kv_layer_weights *w = &m->layers[i];
        char b[96];
#define LADD(sfx, p, r, c) (snprintf(b, sizeof b, "model.layers.%d.%s", i, sfx), ADD(b, p, r, c))
        LADD("input_layernorm.weight", w->attn_norm, 0, d);
        LADD("self_attn.q_proj.weight", f32_of(m, w->wq, q, d), q, d);
        LADD("self_attn.k_proj.weight", f32_of(m, w->wk, kv, d), kv, d);
        LADD("self_attn.v_proj.weight", f32_of(m, w->wv, kv, d), kv, d);
        LADD("self_attn.o_proj.weight", f32_of(m, w->wo, d, q), d, q);
        LADD("post_attention_layernorm.weight", w->ffn_norm, 0, d);
        LADD("mlp.gate_proj.weight", f32_of(m, w->w_gate, h, d), h, d);
        LADD("mlp.down_proj.weight", f32_of(m, w->w_down, d, h), d, h);
        LADD("mlp.up_proj.weight", f32_of(m, w->w_up, h, d), h, d);
#undef LADD
    }
#undef ADD
    return n;
}

static void copy_file(const char *from, const char *to) {
    size_t len;
    char *d = slurp(from, &len);
    write_file(to, d, len);
    free(d);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-4);
        if (d > m) m = d;
    }
    return m;
}

static void test_sharded_half(void) {
    kv_model *ref = tu_load_shared(M656);
    wt list[64];
    int n = list_weights(ref, list);
    const char *dir = tu_tmp("sharded");
    mkdir(dir, 0755);
    char p[700], q[700];
    snprintf(p, sizeof p, "%s/config.json", tu_shared(M656));
    snprintf(q, sizeof q, "%s/config.json", dir);
    copy_file(p, q);
    char s1[700], s2[700];
    snprintf(s1, sizeof s1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(s2, sizeof s2, "%s/model-00002-of-00002.safetensors", dir);
    int half = n / 2;
    write_st(s1, list, 0, half, 1); /* F16 */
    write_st(s2, list, half, n, 2); /* BF16 */
    char idx[65536];
    size_t k = (size_t)sprintf(idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0; i < n; i++)
        k += (size_t)sprintf(idx + k, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                             i ? ", " : "", list[i].name, i < half ? 1 : 2);
    k += (size_t)sprintf(idx + k, "}}");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, idx, k);
    kv_model *m = tu_load_model(dir);
    CU_ASSERT_PTR_EQUAL(m->classifier.data, m->tok_emb.data); /* tied, no lm_head stored */
    wt got[64];
    CU_ASSERT_EQUAL_FATAL(list_weights(m, got), n);
    double f16 = 0, bf16 = 0;
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)(list[i].rows ? list[i].rows : 1) * (size_t)list[i].cols;
        double r = max_rel(got[i].data, list[i].data, cnt);
        if (i < half && r > f16) f16 = r;
        if (i >= half && r > bf16) bf16 = r;
    }
    /* BF16 is exact here: every 656K weight is bfloat16-representable (trained in bf16) */
    printf("\n  sharded copy: max relative error F16 %.2e, BF16 %.2e\n", f16, bf16);
    CU_ASSERT(f16 < 1.0 / 1024);
    CU_ASSERT(bf16 < 1.0 / 128);
    const char *paths[] = {q, s1, s2};
    char hex[65];
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_sha256_files(paths, 3, hex, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(m->sha256, hex);
    kv_model_free(m);
    kv_model_free(ref);
}

static void patch(const char *dir, const char *file, const char *from, const char *to);

/* Logits after BOS then token 147 ("On"): [vocab] into out. */
static void two_step_logits(const kv_model *m, float *out) {
    kv_error err = {0};
    kv_pool pool;
    kv_cache c;
    kv_workspace *ws = NULL;
    long blocks = kv_cache_blocks_needed(m->cfg.n_layers, m->cfg.n_kv_heads, NULL, 4, 1, 16);
    CU_ASSERT_EQUAL_FATAL(kv_pool_init(&pool, (int)blocks, 16, m->cfg.head_dim, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(
        kv_cache_init(&c, &pool, m->cfg.n_layers, m->cfg.n_kv_heads, NULL, KV_POLICY_SINK, &err),
        KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_workspace_new(m, 2, 4, &ws, &err), KV_OK);
    int toks[2] = {1, 147};
    kv_cache *seqs[1] = {&c};
    CU_ASSERT_EQUAL(kv_forward(m, ws, seqs, 1, toks, 2, KV_LOGITS_LAST, out, NULL, &err), KV_OK);
    kv_workspace_free(ws);
    kv_cache_destroy(&c);
    kv_pool_destroy(&pool);
}

/* qwen2: q/k/v biases. A copy of the 656K weights with zero biases must give the same logits
 * as the llama original; a missing bias is refused. */
static void test_qwen2_bias(void) {
    kv_model *ref = tu_load_shared(M656);
    wt list[96];
    int n = list_weights(ref, list);
    int q = ref->cfg.n_heads * ref->cfg.head_dim, kv = ref->cfg.n_kv_heads * ref->cfg.head_dim;
    float *zero = calloc((size_t)q, sizeof *zero);
    for (int l = 0; l < ref->cfg.n_layers; l++) {
        const char *sfx[] = {"q_proj", "k_proj", "v_proj"};
        for (int k = 0; k < 3; k++) {
            snprintf(list[n].name, sizeof list[n].name, "model.layers.%d.self_attn.%s.bias", l,
                     sfx[k]);
            list[n].data = zero;
            list[n].rows = 0;
            list[n].cols = k ? kv : q;
            n++;
        }
    }
    const char *dir = tu_tmp("qwen2");
    mkdir(dir, 0755);
    char p[700], src[4200];
    snprintf(src, sizeof src, "%s/config.json", tu_shared(M656));
    snprintf(p, sizeof p, "%s/config.json", dir);
    copy_file(src, p);
    patch(dir, "config.json", "\"model_type\": \"llama\"", "\"model_type\": \"qwen2\"");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_st(p, list, 0, n, 0);
    kv_model *m = tu_load_model(dir);
    CU_ASSERT_EQUAL(m->cfg.attn_bias, 1);
    CU_ASSERT_STRING_EQUAL(m->cfg.arch, "qwen2");
    CU_ASSERT_EQUAL(m->cfg.rope_layout, KV_ROPE_HALF);
    CU_ASSERT_PTR_NOT_NULL(m->layers[1].bk);
    CU_ASSERT(m->layers[1].bk && m->layers[1].bk[0] == 0.0f);
    CU_ASSERT_EQUAL(
        memcmp(m->layers[1].wq.data, ref->layers[1].wq.data, (size_t)q * ref->cfg.dim * 4), 0);
    float *la = malloc(2048 * sizeof *la), *lb = malloc(2048 * sizeof *lb);
    double d;
    two_step_logits(ref, la);
    two_step_logits(m, lb);
    d = 0;
    for (int i = 0; i < 2048; i++) d = fmax(d, fabs((double)la[i] - lb[i]));
    CU_ASSERT(d < 1e-5);
    free(la);
    free(lb);
    kv_model_free(m);
    /* a non-zero v bias must change the logits (the forward pass applies it) */
    float *half = malloc((size_t)q * sizeof *half);
    for (int i = 0; i < q; i++) half[i] = 0.5f;
    list[n - 4].data = half; /* layer 0's v_proj.bias: the list ends with 3 biases per layer */
    write_st(p, list, 0, n, 0);
    m = tu_load_model(dir);
    la = malloc(2048 * sizeof *la);
    lb = malloc(2048 * sizeof *lb);
    two_step_logits(ref, la);
    two_step_logits(m, lb);
    d = 0;
    for (int i = 0; i < 2048; i++) d = fmax(d, fabs((double)la[i] - lb[i]));
    CU_ASSERT(d > 1e-3);
    free(la);
    free(lb);
    free(half);
    kv_model_free(m);
    list[n - 4].data = zero;
    write_st(p, list, 0, n - 1, 0); /* drop the last v_proj.bias */
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_model_load(dir, &m, &err), KV_EINPUT);
    printf("\n    qwen2 without a bias -> %s\n", err.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "model.layers.1.self_attn.v_proj.bias"));
    free(zero);
    kv_model_free(ref);
}

/* ---- bad input ---- */
static int case_no;

/* A fresh copy of the 656K directory; returns its path (static slot). */
static const char *copy_656k(void) {
    static char dir[8][600];
    char *d = dir[case_no & 7];
    char name[32];
    snprintf(name, sizeof name, "bad%d", case_no++);
    snprintf(d, 600, "%s", tu_tmp(name));
    mkdir(d, 0755);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        char a[4200], b[700];
        snprintf(a, sizeof a, "%s/%s", tu_shared(M656), files[i]);
        snprintf(b, sizeof b, "%s/%s", d, files[i]);
        copy_file(a, b);
    }
    return d;
}

/* Replace the first occurrence of `from` by `to` in dir/file (same or different length). */
static void patch(const char *dir, const char *file, const char *from, const char *to) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    size_t len;
    char *d = slurp(p, &len);
    char *at = NULL;
    for (size_t i = 0; i + strlen(from) <= len && !at; i++)
        if (memcmp(d + i, from, strlen(from)) == 0) at = d + i;
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    FILE *f = fopen(p, "wb");
    fwrite(d, 1, (size_t)(at - d), f);
    fwrite(to, 1, strlen(to), f);
    size_t rest = (size_t)(at - d) + strlen(from);
    fwrite(d + rest, 1, len - rest, f);
    fclose(f);
    free(d);
}

static void expect_bad(const char *dir, const char *what, const char *s1, const char *s2) {
    kv_error err = {0};
    kv_model *m = NULL;
    int rc = kv_model_load(dir, &m, &err);
    printf("\n    %s -> %s", what, err.msg);
    CU_ASSERT_EQUAL(rc, KV_EINPUT);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, dir));
    if (s1) CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, s1));
    if (s2) CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, s2));
    kv_model_free(m);
}

static void test_bad_hf(void) {
    const char *d = copy_656k();
    patch(d, "config.json", "\"hidden_size\": 128,", "\"hidden_size\": 128,,");
    expect_bad(d, "invalid config.json", "config.json", "invalid JSON");
    d = copy_656k();
    patch(d, "config.json", "\"hidden_size\": 128,", "");
    expect_bad(d, "missing field", "config.json", "hidden_size");
    d = copy_656k();
    patch(d, "config.json", "\"model_type\": \"llama\"", "\"model_type\": \"gpt_neox\"");
    expect_bad(d, "unsupported model_type", "config.json", "gpt_neox");
    d = copy_656k();
    patch(d, "config.json", "\"intermediate_size\": 384", "\"intermediate_size\": 385");
    expect_bad(d, "shape vs config", "mlp.gate_proj.weight", "intermediate_size");
    d = copy_656k();
    patch(d, "model.safetensors", "{\"dtype\":\"F32\",\"shape\":[128]",
          "{\"dtype\":\"I32\",\"shape\":[128]");
    expect_bad(d, "unknown dtype", "model.safetensors", "\"I32\"");
    d = copy_656k();
    patch(d, "model.safetensors", "\"model.norm.weight\"", "\"model.norX.weight\"");
    expect_bad(d, "missing tensor", "model.safetensors: tensor 'model.norm.weight' is missing",
               NULL);
    d = copy_656k();
    {
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        size_t len;
        char *data = slurp(p, &len);
        write_file(p, data, len - 1000);
        expect_bad(d, "truncated data", "extend past the end", "truncated");
        uint64_t huge = (uint64_t)len * 2;
        memcpy(data, &huge, 8);
        write_file(p, data, len);
        expect_bad(d, "header size past the end", "header size", "model.safetensors");
        free(data);
    }
    d = copy_656k();
    patch(d, "model.safetensors", "\"data_offsets\":[2623488,2624000]",
          "\"data_offsets\":[2623488,9624000]");
    expect_bad(d, "offset past the end", "model.norm.weight", "past the end");
    d = copy_656k();
    {
        char p[700];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        remove(p);
        expect_bad(d, "no weights", "model.safetensors", NULL);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
        {
            const char *ix = "{\"weight_map\": {\"model.norm.weight\": \"nowhere.safetensors\"}}";
            write_file(p, ix, strlen(ix));
        }
        expect_bad(d, "index names a missing shard", "nowhere.safetensors", NULL);
    }
    /* tokenizer.json */
    d = copy_656k();
    patch(d, "tokenizer.json", "\"merges\"", "\"merges\" [");
    kv_model *m = tu_load_model(d);
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    int rc = kv_tokenizer_load(NULL, m, &t, &err);
    printf("\n    invalid tokenizer.json -> %s", err.msg);
    CU_ASSERT_EQUAL(rc, KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "tokenizer.json"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "invalid JSON"));
    kv_model_free(m);
    d = copy_656k();
    patch(d, "tokenizer.json", "\"e \xe2\x96\x81\"", "\"e \xe2\x96\x82\"");
    m = tu_load_model(d);
    rc = kv_tokenizer_load(NULL, m, &t, &err);
    printf("\n    merge of an unknown token -> %s", err.msg);
    CU_ASSERT_EQUAL(rc, KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "merges[0]"));
    kv_model_free(m);
    printf("\n");
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"656K directory: config, tied alias, sha256", test_656k_model},
        {"656K tokenizer.json: ids, special tokens, add_bos", test_656k_tokenizer},
        {"656K tokenizer: decode(encode(text)) on the whole file", test_656k_round_trip},
        {"SentencePiece-style tokenizer.json with byte fallback", test_spm_byte_fallback},
        {"GPT-2 byte-level tokenizer.json", test_bytelevel_json},
        {"sharded index, F16 and BF16 shards", test_sharded_half},
        {"qwen2 attention biases", test_qwen2_bias},
        {"bad input: JSON, fields, dtype, truncation, tensors, shapes", test_bad_hf},
    };
    return tu_main(argc, argv, "hf", tests, sizeof tests / sizeof tests[0]);
}
