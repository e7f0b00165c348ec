/* Test-side GGUF writer; see gguf_writer.h. */
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

typedef struct tw_file {
    FILE *f;
    int failed;
} tw_file;

static void put(tw_file *w, const void *p, size_t n) {
    if (!w->failed && fwrite(p, 1, n, w->f) != n) w->failed = 1;
}
static void put_u32(tw_file *w, uint32_t v) {
    put(w, &v, 4);
}
static void put_u64(tw_file *w, uint64_t v) {
    put(w, &v, 8);
}
static void put_str(tw_file *w, const char *s) {
    put_u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_u32(tw_file *w, const char *k, uint32_t v) {
    put_str(w, k);
    put_u32(w, 4); /* GGUF_TYPE_UINT32 */
    put_u32(w, v);
}
static void kv_f32(tw_file *w, const char *k, float v) {
    put_str(w, k);
    put_u32(w, 6); /* GGUF_TYPE_FLOAT32 */
    put(w, &v, 4);
}
static void kv_string(tw_file *w, const char *k, const char *v) {
    put_str(w, k);
    put_u32(w, 8); /* GGUF_TYPE_STRING */
    put_str(w, v);
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

int tw_write_gguf(const char *path, const kv_model *m, kv_dtype type, size_t *bytes,
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
    tw_file w = {fopen(path, "wb"), 0};
    if (!w.f) {
        free(t);
        return kv_fail(err, KV_EINTERNAL, "%s: cannot create: %s", path, strerror(errno));
    }
    int n_kv = 11 + (c->bos_id >= 0) + (c->eos_id >= 0);
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, (uint64_t)n);
    put_u64(&w, (uint64_t)n_kv);
    kv_string(&w, "general.architecture", "llama");
    kv_u32(&w, "general.alignment", TW_ALIGN);
    kv_u32(&w, "llama.embedding_length", (uint32_t)d);
    kv_u32(&w, "llama.feed_forward_length", (uint32_t)hid);
    kv_u32(&w, "llama.block_count", (uint32_t)c->n_layers);
    kv_u32(&w, "llama.attention.head_count", (uint32_t)c->n_heads);
    kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    kv_u32(&w, "llama.context_length", (uint32_t)c->seq_len);
    kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    kv_f32(&w, "llama.rope.freq_base", c->rope_theta);
    kv_u32(&w, "llama.vocab_size", (uint32_t)V);
    if (c->bos_id >= 0) kv_u32(&w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
    if (c->eos_id >= 0) kv_u32(&w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id);
    for (int i = 0; i < n; i++) {
        put_str(&w, t[i].name);
        put_u32(&w, t[i].one_d ? 1 : 2);
        put_u64(&w, (uint64_t)t[i].cols);
        if (!t[i].one_d) put_u64(&w, (uint64_t)t[i].rows);
        put_u32(&w, (uint32_t)t[i].type);
        put_u64(&w, (uint64_t)t[i].offset);
    }
    static const unsigned char zeros[TW_ALIGN];
    long pos = ftell(w.f);
    if (pos < 0) w.failed = 1;
    size_t here = pos < 0 ? 0 : (size_t)pos;
    put(&w, zeros, (TW_ALIGN - here % TW_ALIGN) % TW_ALIGN);
    size_t data_start = (here + TW_ALIGN - 1) / TW_ALIGN * TW_ALIGN;
    size_t written = 0; /* bytes of the data section so far */
    int maxc = 0;
    for (int i = 0; i < n; i++) maxc = t[i].cols > maxc ? t[i].cols : maxc;
    unsigned char *row = malloc((size_t)maxc * 4 + 64);
    float *f32 = malloc((size_t)maxc * sizeof *f32);
    if (!row || !f32) w.failed = 1;
    for (int i = 0; i < n && !w.failed && !rc; i++) {
        put(&w, zeros, t[i].offset - written);
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
                put(&w, sp, rb);
                continue;
            }
            rc = kv_dequantize_row(t[i].src.type, sp, f32, t[i].cols, err);
            if (!rc) rc = kv_quantize_row(t[i].type, f32, row, t[i].cols, err);
            put(&w, row, rb);
        }
        written = t[i].offset + t[i].bytes;
    }
    free(row);
    free(f32);
    free(t);
    if (fclose(w.f) != 0) w.failed = 1;
    if (rc) return kv_fail_context(err, "writing %s", path);
    if (w.failed) return kv_fail(err, KV_EINTERNAL, "%s: write failed: %s", path, strerror(errno));
    if (bytes) *bytes = data_start + written;
    return KV_OK;
}
