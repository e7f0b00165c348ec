/* Synthetic Llama-shaped model for tests and benchmarks: see tests/support/synthetic.h. */
#include "synthetic.h"

#include "model/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

uint64_t synth_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float synth_uniform(uint64_t *s) { /* [-1, 1) from the top 24 bits */
    return (float)((double)(synth_next(s) >> 40) / 8388608.0 - 1.0);
}

/* n values adopted by m: a < 0 gives ones (norms), else the mean of three uniforms * a. */
static const float *synth_tensor(kv_model *m, size_t n, float a, uint64_t *s, kv_error *err) {
    float *p = kv_malloc(n * sizeof *p, "synthetic tensor", err);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++)
        p[i] = a < 0 ? 1.0f : a * (synth_uniform(s) + synth_uniform(s) + synth_uniform(s)) / 3.0f;
    return kv_model_adopt(m, p, err) ? NULL : p;
}

static int synth_weight(kv_model *m, kv_weight *dst, size_t n, float a, uint64_t *s,
                        kv_error *err) {
    const float *p = synth_tensor(m, n, a, s, err);
    if (p) *dst = kv_weight_f32(p);
    return p != NULL;
}

kv_model *synth_model(synth_shape shape, int tied, uint64_t seed, kv_error *err) {
    kv_model *m = kv_model_alloc(shape.layers, err);
    if (!m) return NULL;
    kv_config *c = &m->cfg;
    c->dim = shape.dim, c->hidden_dim = shape.hidden, c->n_layers = shape.layers;
    c->n_heads = shape.heads, c->n_kv_heads = shape.kv_heads;
    c->head_dim = shape.heads > 0 ? shape.dim / shape.heads : 0;
    c->vocab_size = shape.vocab, c->seq_len = shape.seq_len, c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f, c->rope_layout = KV_ROPE_ADJACENT, c->tied_embeddings = tied != 0;
    snprintf(c->arch, sizeof c->arch, "llama");
    snprintf(m->format, sizeof m->format, "synthetic");
    snprintf(m->path, sizeof m->path, "synthetic(seed %llu)", (unsigned long long)seed);
    uint64_t s = seed;
    size_t D = (size_t)shape.dim, Q = (size_t)shape.heads * (size_t)c->head_dim,
           KV = (size_t)shape.kv_heads * (size_t)c->head_dim, F = (size_t)shape.hidden,
           V = (size_t)shape.vocab;
    int ok = kv_config_check(c, "synthetic model", err) == KV_OK;
    float ad = sqrtf(3.0f / (float)D), aq = sqrtf(3.0f / (float)Q), af = sqrtf(3.0f / (float)F);
    ok = ok && synth_weight(m, &m->tok_emb, V * D, 1.0f, &s, err);
    if (ok && tied)
        m->classifier = m->tok_emb;
    else
        ok = ok && synth_weight(m, &m->classifier, V * D, ad, &s, err);
    ok = ok && (m->final_norm = synth_tensor(m, D, -1.0f, &s, err));
    for (int l = 0; ok && l < shape.layers; l++) {
        kv_layer_weights *w = &m->layers[l];
        ok = ok && (w->attn_norm = synth_tensor(m, D, -1.0f, &s, err));
        ok = ok && (w->ffn_norm = synth_tensor(m, D, -1.0f, &s, err));
        ok = ok && synth_weight(m, &w->wq, Q * D, ad, &s, err);
        ok = ok && synth_weight(m, &w->wk, KV * D, ad, &s, err);
        ok = ok && synth_weight(m, &w->wv, KV * D, ad, &s, err);
        ok = ok && synth_weight(m, &w->wo, D * Q, aq, &s, err);
        ok = ok && synth_weight(m, &w->w_gate, F * D, ad, &s, err);
        ok = ok && synth_weight(m, &w->w_up, F * D, ad, &s, err);
        ok = ok && synth_weight(m, &w->w_down, D * F, af, &s, err);
    }
    if (!ok) {
        kv_model_free(m);
        return NULL;
    }
    return m;
}
