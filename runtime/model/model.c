/* kvplan model: ownership, config checks and size arithmetic. See include/kvplan/model.h. The
 * format readers (llama2c.c, gguf.c, hf.c) call into this file; which reader a path goes to is
 * decided by the registry in formats.c, so no reader calls back into its dispatcher. */
#include "kvplan/model.h"
#include "model/model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_meta.h"
#include "model/tensors.h"

kv_model *kv_model_alloc(int n_layers, kv_error *err) {
    kv_model *m = kv_calloc(1, sizeof *m, "model", err);
    if (!m) return NULL;
    m->layers =
        kv_calloc((size_t)(n_layers > 0 ? n_layers : 1), sizeof *m->layers, "layer table", err);
    if (!m->layers) {
        free(m);
        return NULL;
    }
    m->cfg.bos_id = -1;
    m->cfg.eos_id = -1;
    return m;
}

int kv_model_adopt(kv_model *m, void *p, kv_error *err) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 16;
        void **nw = realloc(m->owned, (size_t)cap * sizeof *nw);
        if (!nw) {
            free(p);
            return kv_fail(err, KV_EINTERNAL, "out of memory (model buffers)");
        }
        m->owned = nw;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return KV_OK;
}

int kv_model_give_f32(kv_model *m, float *dst, const float **out, kv_weight *wout, kv_error *err) {
    if (kv_model_adopt(m, dst, err)) return KV_EINTERNAL;
    if (wout)
        *wout = kv_weight_f32(dst);
    else
        *out = dst;
    return KV_OK;
}

void kv_model_free(kv_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    kv_gguf_close(m->gguf); /* GGUF: the parsed file and its bytes */
    free(m->layers);
    free(m);
}

int kv_config_check(const kv_config *c, const char *what, kv_error *err) {
#define BAD(...) return kv_fail(err, KV_EINPUT, __VA_ARGS__)
    if (c->dim <= 0 || c->dim > (1 << 16))
        BAD("%s: dim %d is not a sensible model width", what, c->dim);
    if (c->hidden_dim <= 0 || c->hidden_dim > (1 << 18))
        BAD("%s: hidden_dim %d is not sensible", what, c->hidden_dim);
    if (c->n_layers <= 0 || c->n_layers > 1024)
        BAD("%s: n_layers %d is not sensible", what, c->n_layers);
    if (c->n_heads <= 0 || c->n_heads > 1024)
        BAD("%s: n_heads %d is not sensible", what, c->n_heads);
    if (c->n_kv_heads <= 0 || c->n_kv_heads > c->n_heads)
        BAD("%s: n_kv_heads %d must be in [1, n_heads = %d]", what, c->n_kv_heads, c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        BAD("%s: n_heads %d is not a multiple of n_kv_heads %d (GQA groups must be equal)", what,
            c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2)
        BAD("%s: head_dim %d must be positive and even (RoPE rotates pairs)", what, c->head_dim);
    if (c->vocab_size <= 0 || c->vocab_size > (1 << 22))
        BAD("%s: vocab_size %d is not sensible", what, c->vocab_size);
    if (c->seq_len <= 0 || c->seq_len > (1 << 22))
        BAD("%s: seq_len %d is not sensible", what, c->seq_len);
    if (!(c->norm_eps > 0.0f && c->norm_eps < 1.0f))
        BAD("%s: norm eps %g is not sensible", what, c->norm_eps);
    if (!(c->rope_theta > 1.0f)) BAD("%s: rope theta %g is not sensible", what, c->rope_theta);
#undef BAD
    return KV_OK;
}

/* Parameters of one layer: every role of the table (model/tensors.h) that the config has. */
static size_t layer_params(const kv_config *c) {
    size_t n_roles, n = 0;
    const kv_tensor_role *roles = kv_layer_tensor_roles(&n_roles);
    for (size_t k = 0; k < n_roles; k++)
        if (!(roles[k].bias && !c->attn_bias))
            n += (size_t)kv_tensor_dim_size(c, roles[k].rows) *
                 (size_t)kv_tensor_dim_size(c, roles[k].cols);
    return n;
}

size_t kv_model_param_count(const kv_model *m) {
    const kv_config *c = &m->cfg;
    size_t n = (size_t)c->n_layers * layer_params(c) + (size_t)c->dim;
    n += (size_t)c->vocab_size * c->dim * (c->tied_embeddings ? 1 : 2);
    return n;
}

/* Bytes of a [rows, cols] matrix in w's type. */
static size_t mat_bytes(kv_weight w, size_t rows, size_t cols) {
    return rows * (cols / (size_t)kv_dtype_block(w.type)) * kv_dtype_block_bytes(w.type);
}

/* Bytes of one tensor of the layers: a matrix in its type, a vector the model has in fp32. */
static int tensor_bytes(const kv_role_tensor *t, void *user) {
    size_t *n = user;
    if (t->mat)
        *n += mat_bytes(*t->mat, (size_t)t->rows, (size_t)t->cols);
    else if (!t->optional)
        *n += (size_t)t->cols * sizeof(float);
    return 0;
}

/* Bytes of every matrix and fp32 vector of the layers, + the final norm. */
static size_t layer_bytes(const kv_model *m) {
    size_t n = (size_t)m->cfg.dim * sizeof(float);
    kv_layer_roles_each(&m->cfg, m->layers, tensor_bytes, &n);
    return n;
}

size_t kv_model_weight_bytes(const kv_model *m) {
    size_t V = (size_t)m->cfg.vocab_size, d = (size_t)m->cfg.dim;
    return layer_bytes(m) + mat_bytes(m->classifier, V, d) + mat_bytes(m->tok_emb, 1, d);
}

size_t kv_model_read_param_count(const kv_model *m) {
    const kv_config *c = &m->cfg;
    size_t n = (size_t)c->n_layers * layer_params(c) + (size_t)c->dim;
    return n + (size_t)c->vocab_size * c->dim + (size_t)c->dim; /* classifier + one embedding row */
}

size_t kv_model_resident_bytes(const kv_model *m) {
    size_t V = (size_t)m->cfg.vocab_size, d = (size_t)m->cfg.dim;
    size_t n = layer_bytes(m) + mat_bytes(m->tok_emb, V, d);
    if (m->classifier.data != m->tok_emb.data) n += mat_bytes(m->classifier, V, d);
    return n;
}

/* Calls f(w, out, in, user) for every matrix of the model: the classifier, then the layers'
 * (model/tensors.h). */
typedef struct matrix_walk {
    void (*f)(kv_weight, int, int, void *);
    void *user;
} matrix_walk;
static int matrix_one(const kv_role_tensor *t, void *user) {
    const matrix_walk *w = user;
    if (t->mat) w->f(*t->mat, (int)t->rows, (int)t->cols, w->user);
    return 0;
}
static void each_matrix(const kv_model *m, void (*f)(kv_weight, int, int, void *), void *user) {
    f(m->classifier, m->cfg.vocab_size, m->cfg.dim, user);
    matrix_walk w = {f, user};
    kv_layer_roles_each(&m->cfg, m->layers, matrix_one, &w);
}

typedef struct scratch_need {
    int rows, threads;
    size_t floats;
} scratch_need;
static void scratch_one(kv_weight w, int out, int in, void *user) {
    scratch_need *s = user;
    /* at `rows` rows: fewer need no more (16 rows of quantised activations are smaller than
     * the tiles of 17 and more) */
    size_t n = kv_qmatmul_scratch_threads(w.type, s->rows, in, out, s->threads);
    if (n > s->floats) s->floats = n;
}
size_t kv_model_matmul_scratch_threads(const kv_model *m, int rows, int n_threads) {
    scratch_need s = {rows, n_threads, 0};
    each_matrix(m, scratch_one, &s);
    return s.floats;
}
size_t kv_model_matmul_scratch(const kv_model *m, int rows) {
    return kv_model_matmul_scratch_threads(m, rows, 1);
}

static void type_one(kv_weight w, int out, int in, void *user) {
    (void)out, (void)in;
    unsigned *seen = user; /* bit per kv_dtype_all index */
    for (int i = 0; i < KV_DT_COUNT; i++)
        if (kv_dtype_all[i] == w.type) *seen |= 1u << i;
}
void kv_model_weight_types(const kv_model *m, char *buf, size_t cap) {
    unsigned seen = 1; /* norms: F32 */
    each_matrix(m, type_one, &seen);
    size_t k = 0;
    buf[0] = '\0';
    for (int i = KV_DT_COUNT - 1; i >= 0 && k < cap; i--) /* quantised types first, F32 last */
        if (seen & (1u << i))
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? "+" : "",
                                  kv_dtype_name((uint32_t)kv_dtype_all[i]));
}
