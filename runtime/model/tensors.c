/* The table of a decoder layer's tensors and its walker: see tensors.h. */
#include "model/tensors.h"

#include <stdio.h>

#define VEC(field) offsetof(kv_layer_weights, field), 0
#define MAT(field) offsetof(kv_layer_weights, field), 1

static const kv_tensor_role kv_layer_roles[KV_ROLE_COUNT] = {
    [KV_ROLE_ATTN_NORM] = {"attn_norm.weight", "input_layernorm.weight", KV_TDIM_ONE, KV_TDIM_DIM,
                           0, VEC(attn_norm)},
    [KV_ROLE_WQ] = {"attn_q.weight", "self_attn.q_proj.weight", KV_TDIM_Q, KV_TDIM_DIM, 0, MAT(wq)},
    [KV_ROLE_WK] = {"attn_k.weight", "self_attn.k_proj.weight", KV_TDIM_KV, KV_TDIM_DIM, 0,
                    MAT(wk)},
    [KV_ROLE_WV] = {"attn_v.weight", "self_attn.v_proj.weight", KV_TDIM_KV, KV_TDIM_DIM, 0,
                    MAT(wv)},
    [KV_ROLE_WO] = {"attn_output.weight", "self_attn.o_proj.weight", KV_TDIM_DIM, KV_TDIM_Q, 0,
                    MAT(wo)},
    [KV_ROLE_BQ] = {"attn_q.bias", "self_attn.q_proj.bias", KV_TDIM_ONE, KV_TDIM_Q, 1, VEC(bq)},
    [KV_ROLE_BK] = {"attn_k.bias", "self_attn.k_proj.bias", KV_TDIM_ONE, KV_TDIM_KV, 1, VEC(bk)},
    [KV_ROLE_BV] = {"attn_v.bias", "self_attn.v_proj.bias", KV_TDIM_ONE, KV_TDIM_KV, 1, VEC(bv)},
    [KV_ROLE_FFN_NORM] = {"ffn_norm.weight", "post_attention_layernorm.weight", KV_TDIM_ONE,
                          KV_TDIM_DIM, 0, VEC(ffn_norm)},
    [KV_ROLE_W_GATE] = {"ffn_gate.weight", "mlp.gate_proj.weight", KV_TDIM_HIDDEN, KV_TDIM_DIM, 0,
                        MAT(w_gate)},
    [KV_ROLE_W_DOWN] = {"ffn_down.weight", "mlp.down_proj.weight", KV_TDIM_DIM, KV_TDIM_HIDDEN, 0,
                        MAT(w_down)},
    [KV_ROLE_W_UP] = {"ffn_up.weight", "mlp.up_proj.weight", KV_TDIM_HIDDEN, KV_TDIM_DIM, 0,
                      MAT(w_up)},
};

/* The dimensions: their names in GGUF's and config.json's keys, and the config fields whose
 * product they are (n of them). */
static const struct {
    const char *gguf, *hf;
    int n;
    size_t field[2];
} kv_dims[] = {
    [KV_TDIM_ONE] = {"1", "1", 0, {0, 0}},
    [KV_TDIM_DIM] = {"embedding_length", "hidden_size", 1, {offsetof(kv_config, dim), 0}},
    [KV_TDIM_Q] = {"head_count*head_dim",
                   "heads*head_dim",
                   2,
                   {offsetof(kv_config, n_heads), offsetof(kv_config, head_dim)}},
    [KV_TDIM_KV] = {"head_count_kv*head_dim",
                    "kv_heads*head_dim",
                    2,
                    {offsetof(kv_config, n_kv_heads), offsetof(kv_config, head_dim)}},
    [KV_TDIM_HIDDEN] = {"feed_forward_length",
                        "intermediate_size",
                        1,
                        {offsetof(kv_config, hidden_dim), 0}},
};

const kv_tensor_role *kv_layer_tensor_roles(size_t *n) {
    *n = KV_ROLE_COUNT;
    return kv_layer_roles;
}

long long kv_tensor_dim_size(const kv_config *c, kv_tensor_dim d) {
    long long v = 1;
    for (int i = 0; i < kv_dims[d].n; i++)
        v *= *(const int *)(const void *)((const char *)c + kv_dims[d].field[i]);
    return v;
}

void kv_tensor_role_slot(const kv_tensor_role *r, kv_layer_weights *w, const float ***vec,
                         kv_weight **mat) {
    char *base = (char *)w + r->offset;
    *vec = r->matrix ? NULL : (const float **)(void *)base;
    *mat = r->matrix ? (kv_weight *)(void *)base : NULL;
}

/* "rows x cols" (or "cols" for a vector) in one format's key names (hf 0: GGUF's). */
static void shape_of(const kv_tensor_role *r, int hf, char *buf, size_t cap) {
    const char *cols = hf ? kv_dims[r->cols].hf : kv_dims[r->cols].gguf;
    if (r->rows == KV_TDIM_ONE)
        snprintf(buf, cap, "%s", cols);
    else
        snprintf(buf, cap, "%s x %s", hf ? kv_dims[r->rows].hf : kv_dims[r->rows].gguf, cols);
}

int kv_layer_roles_each(const kv_config *c, kv_layer_weights *layers,
                        int (*fn)(const kv_role_tensor *t, void *user), void *user) {
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < KV_ROLE_COUNT; k++) {
            const kv_tensor_role *r = &kv_layer_roles[k];
            kv_role_tensor t = {(kv_role_id)k,
                                r,
                                l,
                                kv_tensor_dim_size(c, r->rows),
                                kv_tensor_dim_size(c, r->cols),
                                r->bias && !c->attn_bias,
                                NULL,
                                NULL,
                                "",
                                ""};
            if (layers) kv_tensor_role_slot(r, &layers[l], &t.vec, &t.mat);
            shape_of(r, 0, t.gguf_shape, sizeof t.gguf_shape);
            shape_of(r, 1, t.hf_shape, sizeof t.hf_shape);
            int rc = fn(&t, user);
            if (rc) return rc;
        }
    return 0;
}
