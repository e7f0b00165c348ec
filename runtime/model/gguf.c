/* GGUF model loader (ggml docs/gguf.md; the container itself is read by runtime/model/gguf_meta.c).
 *
 * A ggml tensor with ne = [in, out] is the row-major matrix [out, in], the kv_model layout.
 * Weight matrices stay in their file's type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K; layouts: include/kvplan/quant.h), in place in the loaded file (docs/design.md,
 * "One engine": weights stay in the file's type); norms and biases in another type than F32 are
 * dequantised on load (runtime/quant/quant.c) into buffers the model owns. GGUF conversions of
 * llama models permute the Q and K rows for RoPE on adjacent pairs (KV_ROPE_ADJACENT); qwen2
 * conversions keep the rotate-half layout (KV_ROPE_HALF).
 *
 * The parsed file (kv_gguf, owning the loaded file bytes the weights point into) is kept in
 * model->gguf; the tokenizer reads the embedded vocabulary from it
 * (runtime/tokenizer/tokenizer_gguf.c). This loader never builds a tokenizer.
 */
#include "kvplan/model.h"
#include "model/model_impl.h"
#include "kvplan/quant.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_meta.h"
#include "model/tensors.h"

/* Seconds the last load of `m` spent dequantising (0 for other formats). For measurements. */
double kv_gguf_dequant_seconds(const kv_model *m);
double kv_gguf_dequant_seconds(const kv_model *m) {
    const kv_gguf *g = m && strcmp(m->format, "gguf") == 0 ? m->gguf : NULL;
    return g ? g->dequant_s : 0.0;
}

/* Tensor `name` expected to be [rows, cols] row-major (ne = [cols, rows]; a 1-D tensor has
 * rows = 1). With `wout` (matrices): the tensor in its own type, in place in the loaded file
 * (weights stay in their file's type, docs/design.md). With `out` (norms, biases): an fp32 view,
 * F32 in place, other types dequantised into a buffer the model adopts. Absent and optional: NULL
 * data and KV_OK. */
static int get_weight(kv_model *m, kv_gguf *g, const char *name, uint64_t rows, uint64_t cols,
                      int optional, const char *why, const float **out, kv_weight *wout,
                      kv_error *err) {
    if (out) *out = NULL;
    if (wout) wout->data = NULL, wout->type = KV_DT_F32;
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    if (!t) {
        if (optional) return KV_OK;
        return kv_fail(err, KV_EINPUT, "%s: tensor '%s' is missing (%s)", g->path, name, why);
    }
    int ok = t->ne[0] == cols && t->ne[1] == rows && t->ne[2] == 1 && t->ne[3] == 1;
    if (rows == 1) ok = t->n_dims == 1 && t->ne[0] == cols;
    if (!ok) {
        char shape[96] = "";
        size_t k = 0;
        for (uint32_t d = 0; d < t->n_dims && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, d ? ", %llu" : "%llu",
                                  (unsigned long long)t->ne[d]);
        if (rows == 1)
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%s' has ne [%s] but the config (%s) "
                           "needs [%llu]",
                           g->path, name, shape, why, (unsigned long long)cols);
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s' has ne [%s] but the config (%s) needs "
                       "[%llu, %llu]",
                       g->path, name, shape, why, (unsigned long long)cols,
                       (unsigned long long)rows);
    }
    const unsigned char *src = g->base + g->data_start + t->offset;
    size_t n = (size_t)(rows * cols);
    if (wout && (t->type != KV_DT_F32 || ((uintptr_t)src % sizeof(float)) == 0)) {
        wout->data = src; /* kv_gguf_open checked the type and the row's whole blocks */
        wout->type = (kv_dtype)t->type;
        return KV_OK;
    }
    if (t->type == KV_DT_F32 && ((uintptr_t)src % sizeof(float)) == 0) {
        *out = (const float *)(const void *)src;
        return KV_OK;
    }
    float *dst = kv_malloc(n * sizeof *dst, name, err);
    if (!dst) return KV_EINTERNAL;
    double t0 = kv_now();
    if (kv_dequantize_row((kv_dtype)t->type, src, dst, (int64_t)n, err)) {
        free(dst);
        return kv_fail_context(err, "%s: tensor '%s'", g->path, name);
    }
    g->dequant_s += kv_now() - t0;
    return kv_model_give_f32(m, dst, out, wout, err);
}

/* Required positive integer "<arch>.<suffix>" (or optional with a default when dflt >= 0). */
static int arch_int(const kv_gguf *g, const char *arch, const char *suffix, int64_t dflt, int *out,
                    kv_error *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    int got = kv_gguf_get_int(g, key, &v, err);
    if (got < 0) return KV_EINPUT;
    if (!got) {
        if (dflt >= 0) {
            *out = (int)dflt;
            return KV_OK;
        }
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is missing", g->path, key);
    }
    if (v <= 0 || v > (1 << 24))
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' = %lld is not sensible", g->path, key,
                       (long long)v);
    *out = (int)v;
    return KV_OK;
}

static int load_config(kv_gguf *g, kv_config *c, kv_error *err) {
    memset(c, 0, sizeof *c);
    char arch[sizeof((kv_config *)0)->arch] = "";
    int got = kv_gguf_get_str(g, "general.architecture", arch, sizeof arch, err);
    if (got < 0) return KV_EINPUT;
    if (!got)
        return kv_fail(err, KV_EINPUT, "%s: metadata 'general.architecture' is missing", g->path);
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2") != 0)
        return kv_fail(err, KV_EINPUT,
                       "%s: general.architecture '%s' is not supported (kvplan "
                       "reads llama and qwen2)",
                       g->path, arch);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    if (arch_int(g, arch, "embedding_length", -1, &c->dim, err) ||
        arch_int(g, arch, "feed_forward_length", -1, &c->hidden_dim, err) ||
        arch_int(g, arch, "block_count", -1, &c->n_layers, err) ||
        arch_int(g, arch, "attention.head_count", -1, &c->n_heads, err) ||
        arch_int(g, arch, "context_length", -1, &c->seq_len, err))
        return KV_EINPUT;
    if (arch_int(g, arch, "attention.head_count_kv", c->n_heads, &c->n_kv_heads, err))
        return KV_EINPUT;
    if (c->dim % c->n_heads)
        return kv_fail(err, KV_EINPUT,
                       "%s: %s.embedding_length %d is not a multiple of "
                       "%s.attention.head_count %d",
                       g->path, arch, c->dim, arch, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    char key[160];
    int64_t kl;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    got = kv_gguf_get_int(g, key, &kl, err);
    if (got < 0) return KV_EINPUT;
    if (got && kl != c->head_dim)
        return kv_fail(err, KV_EINPUT,
                       "%s: %s = %lld differs from embedding_length / head_count "
                       "= %d, which kvplan does not support",
                       g->path, key, (long long)kl, c->head_dim);
    int rot;
    if (arch_int(g, arch, "rope.dimension_count", c->head_dim, &rot, err)) return KV_EINPUT;
    if (rot != c->head_dim)
        return kv_fail(err, KV_EINPUT,
                       "%s: %s.rope.dimension_count %d is not the head size %d "
                       "(partial rotary embeddings are not supported)",
                       g->path, arch, rot, c->head_dim);
    double v;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    got = kv_gguf_get_float(g, key, &v, err);
    if (got < 0) return KV_EINPUT;
    if (!got) return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is missing", g->path, key);
    c->norm_eps = (float)v;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    got = kv_gguf_get_float(g, key, &v, err);
    if (got < 0) return KV_EINPUT;
    c->rope_theta = got ? (float)v : 10000.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char scaling[32] = "";
    if (kv_gguf_get_str(g, key, scaling, sizeof scaling, err) < 0) return KV_EINPUT;
    if (scaling[0] && strcmp(scaling, "none") != 0)
        return kv_fail(err, KV_EINPUT, "%s: %s = '%s': RoPE scaling is not supported", g->path, key,
                       scaling);
    c->rope_layout = strcmp(arch, "qwen2") == 0 ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
    c->attn_bias = strcmp(arch, "qwen2") == 0;
    int64_t id;
    c->bos_id = c->eos_id = -1;
    if ((got = kv_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &id, err)) < 0) return KV_EINPUT;
    if (got && id >= 0 && id < (1 << 24)) c->bos_id = (int)id;
    if ((got = kv_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id, err)) < 0) return KV_EINPUT;
    if (got && id >= 0 && id < (1 << 24)) c->eos_id = (int)id;
    return KV_OK;
}

/* A layer's tensors, read role by role from the table (model/tensors.h). */
typedef struct gguf_walk {
    kv_model *m;
    kv_gguf *g;
    kv_error *err;
} gguf_walk;

static int load_role(const kv_role_tensor *t, void *user) {
    const gguf_walk *w = user;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", t->layer, t->role->gguf);
    return get_weight(w->m, w->g, name, (uint64_t)t->rows, (uint64_t)t->cols, t->optional,
                      t->gguf_shape, t->vec, t->mat, w->err);
}

int kv_model_load_gguf(const char *path, kv_model **out, kv_error *err) {
    *out = NULL;
    kv_gguf *g = NULL;
    int rc = kv_gguf_open(path, &g, err);
    if (rc) return rc;
    kv_config c;
    rc = load_config(g, &c, err);
    /* the vocabulary size: llama.vocab_size, else the token list, else the embedding */
    if (!rc) {
        char key[96];
        snprintf(key, sizeof key, "%s.vocab_size", c.arch);
        int64_t v;
        int got = kv_gguf_get_int(g, key, &v, err);
        const kv_gguf_kv *toks = kv_gguf_find(g, "tokenizer.ggml.tokens");
        const kv_gguf_tensor *emb = kv_gguf_find_tensor(g, "token_embd.weight");
        if (got < 0)
            rc = KV_EINPUT;
        else if (got && (v <= 0 || v > INT_MAX))
            rc = kv_fail(err, KV_EINPUT, "%s: metadata '%s' = %lld is not a vocabulary size", path,
                         key, (long long)v);
        else if (got)
            c.vocab_size = (int)v;
        else if (toks && toks->type == KV_GGUF_ARRAY)
            c.vocab_size = (int)toks->arr_n;
        else if (emb)
            c.vocab_size = (int)emb->ne[1];
        else
            rc = kv_fail(err, KV_EINPUT, "%s: tensor 'token_embd.weight' is missing", path);
    }
    if (!rc) rc = kv_config_check(&c, path, err);
    kv_model *m = NULL;
    if (!rc && !(m = kv_model_alloc(c.n_layers, err))) rc = KV_EINTERNAL;
    if (rc) {
        kv_gguf_close(g);
        return rc;
    }
    m->gguf = g; /* owns the map the weights point into; kv_model_free closes it */
    m->cfg = c;
    snprintf(m->format, sizeof m->format, "gguf");
    uint64_t d = (uint64_t)c.dim, V = (uint64_t)c.vocab_size;
    rc = get_weight(m, g, "token_embd.weight", V, d, 0, "vocab_size x embedding_length", NULL,
                    &m->tok_emb, err);
    if (!rc)
        rc = get_weight(m, g, "output_norm.weight", 1, d, 0, "embedding_length", &m->final_norm,
                        NULL, err);
    if (!rc)
        rc = get_weight(m, g, "output.weight", V, d, 1, "vocab_size x embedding_length", NULL,
                        &m->classifier, err);
    if (!rc && !m->classifier.data) {
        m->classifier = m->tok_emb;
        m->cfg.tied_embeddings = 1;
    }
    if (!rc) {
        gguf_walk w = {m, g, err};
        rc = kv_layer_roles_each(&c, m->layers, load_role, &w);
    }
    if (!rc) { /* model_sha256 of the bytes loaded, which are the file's */
        const void *bytes = g->base;
        rc = kv_sha256_parts(&path, &bytes, &g->len, 1, m->sha256, err);
    }
    if (rc) {
        kv_model_free(m);
        return rc;
    }
    *out = m;
    return KV_OK;
}
