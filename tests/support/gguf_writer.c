/* The tests' GGUF writer; see gguf_writer.h. */
#include "gguf_writer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TW_ALIGN 32
#define TW_MAX_TENSORS (3 + 9 * 1024)

typedef struct tw_tensor {
    char name[64];
    int rows, cols; /* [rows, cols] row-major; rows = 1 and one_d: a vector */
    int one_d;      /* written with n_dims = 1 */
    kv_dtype type;  /* type on disk */
    kv_weight src;  /* the model's tensor, in its own type */
    int perm_hd;    /* > 0: permute rows from rotate-half to adjacent pairs, head size */
    size_t bytes, offset;
} tw_tensor;

void tw_buf_free(tw_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void tw_put(tw_buf *b, const void *p, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2 + 1024;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
void tw_u32(tw_buf *b, uint32_t v) {
    tw_put(b, &v, 4);
}
void tw_u64(tw_buf *b, uint64_t v) {
    tw_put(b, &v, 8);
}
void tw_f32(tw_buf *b, float v) {
    tw_put(b, &v, 4);
}
void tw_str(tw_buf *b, const char *s) {
    tw_u64(b, strlen(s));
    tw_put(b, s, strlen(s));
}
void tw_pad(tw_buf *b, size_t align) {
    static const unsigned char zero[64];
    while (!b->failed && b->n % align) {
        size_t k = align - b->n % align;
        tw_put(b, zero, k < sizeof zero ? k : sizeof zero);
    }
}

void tw_gguf_header(tw_buf *b, uint32_t version, uint64_t n_tensors) {
    tw_put(b, "GGUF", 4);
    tw_u32(b, version);
    tw_u64(b, n_tensors);
    tw_u64(b, 0);
    b->n_kv = 0;
}
void tw_gguf_kv_count(tw_buf *b) {
    if (!b->failed && b->n >= 24) memcpy(b->p + 16, &b->n_kv, 8);
}
void tw_key(tw_buf *b, const char *key, uint32_t type) {
    tw_str(b, key);
    tw_u32(b, type);
    b->n_kv++;
}
void tw_kv_u32(tw_buf *b, const char *key, uint32_t v) {
    tw_key(b, key, TW_UINT32);
    tw_u32(b, v);
}
void tw_kv_f32(tw_buf *b, const char *key, float v) {
    tw_key(b, key, TW_FLOAT32);
    tw_f32(b, v);
}
void tw_kv_str(tw_buf *b, const char *key, const char *v) {
    tw_key(b, key, TW_STRING);
    tw_str(b, v);
}
void tw_kv_array(tw_buf *b, const char *key, uint32_t elem_type, uint64_t count) {
    tw_key(b, key, TW_ARRAY);
    tw_u32(b, elem_type);
    tw_u64(b, count);
}
void tw_tensor_info(tw_buf *b, const char *name, int n_dims, uint64_t ne0, uint64_t ne1,
                    uint32_t type, uint64_t offset) {
    tw_str(b, name);
    tw_u32(b, (uint32_t)n_dims);
    tw_u64(b, ne0);
    if (n_dims > 1) tw_u64(b, ne1);
    tw_u32(b, type);
    tw_u64(b, offset);
}

int tw_save(const tw_buf *b, const char *path, kv_error *err) {
    if (b->failed) return kv_fail(err, KV_EINTERNAL, "%s: out of memory building the file", path);
    FILE *f = fopen(path, "wb");
    if (!f) return kv_fail(err, KV_EINTERNAL, "%s: cannot create: %s", path, strerror(errno));
    int bad = fwrite(b->p, 1, b->n, f) != b->n;
    if (fclose(f) != 0) bad = 1;
    if (bad) return kv_fail(err, KV_EINTERNAL, "%s: write failed: %s", path, strerror(errno));
    return KV_OK;
}

static int add(tw_tensor *t, int *n, const char *name, int rows, int cols, int one_d, kv_dtype type,
               kv_weight src, int perm_hd, kv_error *err) {
    tw_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->rows = rows, x->cols = cols, x->one_d = one_d, x->type = type, x->src = src;
    x->perm_hd = perm_hd;
    size_t row;
    if (kv_dtype_row_bytes(type, cols, name, &row, err)) return KV_EINPUT;
    x->bytes = row * (size_t)rows;
    return KV_OK;
}

/* A placeholder SentencePiece ("llama") vocabulary of V tokens, so that llama.cpp loads the
 * file: <unk>, <s>, </s> (control), the 256 byte tokens <0xNN>, then "t%d" (normal). */
static void put_vocab(tw_buf *w, int V) {
    tw_kv_str(w, "tokenizer.ggml.model", "llama");
    tw_kv_array(w, "tokenizer.ggml.tokens", TW_STRING, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        char s[32];
        if (i < 3)
            snprintf(s, sizeof s, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 3 + 256)
            snprintf(s, sizeof s, "<0x%02X>", i - 3);
        else
            snprintf(s, sizeof s, "t%d", i);
        tw_str(w, s);
    }
    tw_kv_array(w, "tokenizer.ggml.scores", TW_FLOAT32, (uint64_t)V);
    for (int i = 0; i < V; i++) tw_f32(w, i < 3 + 256 ? 0.0f : -(float)i);
    tw_kv_array(w, "tokenizer.ggml.token_type", TW_INT32, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        int32_t ty = i == 0 ? 2 : i < 3 ? 3 : i < 3 + 256 ? 6 : 1;
        tw_put(w, &ty, 4);
    }
    tw_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    tw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    tw_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
}

static int write_gguf(const char *path, const kv_model *m, kv_dtype type, int vocab, size_t *bytes,
                      kv_error *err);

int tw_write_gguf(const char *path, const kv_model *m, kv_dtype type, size_t *bytes,
                  kv_error *err) {
    return write_gguf(path, m, type, 0, bytes, err);
}

int tw_write_gguf_vocab(const char *path, const kv_model *m, kv_dtype type, size_t *bytes,
                        kv_error *err) {
    if (m->cfg.vocab_size < 3 + 256 + 1)
        return kv_fail(err, KV_EINPUT, "%s: a placeholder vocabulary needs 260 tokens or more",
                       path);
    return write_gguf(path, m, type, 1, bytes, err);
}

static int write_gguf(const char *path, const kv_model *m, kv_dtype type, int vocab, size_t *bytes,
                      kv_error *err) {
    const kv_config *c = &m->cfg;
    if (c->attn_bias)
        return kv_fail(err, KV_EINPUT, "%s: the test writer does not write attention biases", path);
    if (c->n_layers > 1024) return kv_fail(err, KV_EINPUT, "%s: too many layers", path);
    tw_tensor *t = calloc(TW_MAX_TENSORS, sizeof *t);
    if (!t) return kv_fail(err, KV_EINTERNAL, "out of memory (GGUF writer)");
    int n = 0, rc = KV_OK;
    int d = c->dim, hid = c->hidden_dim, q = c->n_heads * c->head_dim,
        kvd = c->n_kv_heads * c->head_dim, V = c->vocab_size;
    int perm = c->rope_layout == KV_ROPE_HALF ? c->head_dim : 0;
    rc = add(t, &n, "token_embd.weight", V, d, 0, type, m->tok_emb, 0, err);
    if (!rc)
        rc = add(t, &n, "output_norm.weight", 1, d, 1, KV_DT_F32, kv_weight_f32(m->final_norm), 0,
                 err);
    if (!rc && !c->tied_embeddings && m->classifier.data != m->tok_emb.data)
        rc = add(t, &n, "output.weight", V, d, 0, type, m->classifier, 0, err);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const kv_layer_weights *w = &m->layers[l];
        struct {
            const char *suffix;
            int rows, cols, one_d;
            kv_weight p;
            int perm;
        } spec[] = {
            {"attn_norm.weight", 1, d, 1, kv_weight_f32(w->attn_norm), 0},
            {"attn_q.weight", q, d, 0, w->wq, perm},
            {"attn_k.weight", kvd, d, 0, w->wk, perm},
            {"attn_v.weight", kvd, d, 0, w->wv, 0},
            {"attn_output.weight", d, q, 0, w->wo, 0},
            {"ffn_norm.weight", 1, d, 1, kv_weight_f32(w->ffn_norm), 0},
            {"ffn_gate.weight", hid, d, 0, w->w_gate, 0},
            {"ffn_up.weight", hid, d, 0, w->w_up, 0},
            {"ffn_down.weight", d, hid, 0, w->w_down, 0},
        };
        for (size_t k = 0; k < sizeof spec / sizeof spec[0] && !rc; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, spec[k].suffix);
            rc = add(t, &n, name, spec[k].rows, spec[k].cols, spec[k].one_d,
                     spec[k].one_d ? KV_DT_F32 : type, spec[k].p, spec[k].perm, err);
        }
    }
    if (rc) {
        free(t);
        return kv_fail_context(err, "writing %s", path);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        t[i].offset = off;
        off = (off + t[i].bytes + TW_ALIGN - 1) / TW_ALIGN * TW_ALIGN;
    }
    tw_buf w = {0};
    tw_gguf_header(&w, 3, (uint64_t)n);
    tw_kv_str(&w, "general.architecture", "llama");
    tw_kv_u32(&w, "general.alignment", TW_ALIGN);
    tw_kv_u32(&w, "llama.embedding_length", (uint32_t)d);
    tw_kv_u32(&w, "llama.feed_forward_length", (uint32_t)hid);
    tw_kv_u32(&w, "llama.block_count", (uint32_t)c->n_layers);
    tw_kv_u32(&w, "llama.attention.head_count", (uint32_t)c->n_heads);
    tw_kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    tw_kv_u32(&w, "llama.context_length", (uint32_t)c->seq_len);
    tw_kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    tw_kv_f32(&w, "llama.rope.freq_base", c->rope_theta);
    tw_kv_u32(&w, "llama.vocab_size", (uint32_t)V);
    if (vocab) {
        put_vocab(&w, V);
    } else {
        if (c->bos_id >= 0) tw_kv_u32(&w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
        if (c->eos_id >= 0) tw_kv_u32(&w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id);
    }
    tw_gguf_kv_count(&w);
    for (int i = 0; i < n; i++)
        tw_tensor_info(&w, t[i].name, t[i].one_d ? 1 : 2, (uint64_t)t[i].cols, (uint64_t)t[i].rows,
                       (uint32_t)t[i].type, (uint64_t)t[i].offset);
    int maxc = 0;
    for (int i = 0; i < n; i++) maxc = t[i].cols > maxc ? t[i].cols : maxc;
    unsigned char *row = malloc((size_t)maxc * 4 + 64);
    float *f32 = malloc((size_t)maxc * sizeof *f32);
    if (!row || !f32) w.failed = 1;
    /* the data: every tensor at a multiple of the alignment (the data section starts at one) */
    for (int i = 0; i < n && !w.failed && !rc; i++) {
        tw_pad(&w, TW_ALIGN);
        size_t rb = t[i].bytes / (size_t)t[i].rows;
        for (int r = 0; r < t[i].rows && !rc; r++) {
            int src = r;
            if (t[i].perm_hd) { /* adjacent row 2j <- half row j, 2j+1 <- j + hd/2 */
                int hd = t[i].perm_hd, h = r / hd, j = r % hd;
                src = h * hd + (j % 2 ? hd / 2 : 0) + j / 2;
            }
            size_t sb = 0; /* the source row in its own type */
            kv_dtype_row_bytes(t[i].src.type, t[i].cols, t[i].name, &sb, NULL);
            const unsigned char *sp = (const unsigned char *)t[i].src.data + (size_t)src * sb;
            if (t[i].src.type == t[i].type) { /* same type: the bytes as they are */
                tw_put(&w, sp, rb);
                continue;
            }
            rc = kv_dequantize_row(t[i].src.type, sp, f32, t[i].cols, err);
            if (!rc) rc = kv_quantize_row(t[i].type, f32, row, t[i].cols, err);
            tw_put(&w, row, rb);
        }
    }
    free(row);
    free(f32);
    free(t);
    rc = rc ? kv_fail_context(err, "writing %s", path) : tw_save(&w, path, err);
    size_t size = w.n;
    tw_buf_free(&w);
    if (rc) return rc;
    if (bytes) *bytes = size;
    return KV_OK;
}
