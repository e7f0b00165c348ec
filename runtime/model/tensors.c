/* The table of a decoder layer's tensors: see tensors.h. */
#include "model/tensors.h"

#define VEC(field) offsetof(kv_layer_weights, field), 0
#define MAT(field) offsetof(kv_layer_weights, field), 1

static const kv_tensor_role kv_layer_roles[] = {
    {"attn_norm.weight", "input_layernorm.weight", KV_TDIM_ONE, KV_TDIM_DIM, 0, "embedding_length",
     "hidden_size", VEC(attn_norm)},
    {"attn_q.weight", "self_attn.q_proj.weight", KV_TDIM_Q, KV_TDIM_DIM, 0,
     "head_count*head_dim x embedding_length", "heads*head_dim x hidden_size", MAT(wq)},
    {"attn_k.weight", "self_attn.k_proj.weight", KV_TDIM_KV, KV_TDIM_DIM, 0,
     "head_count_kv*head_dim x embedding_length", "kv_heads*head_dim x hidden_size", MAT(wk)},
    {"attn_v.weight", "self_attn.v_proj.weight", KV_TDIM_KV, KV_TDIM_DIM, 0,
     "head_count_kv*head_dim x embedding_length", "kv_heads*head_dim x hidden_size", MAT(wv)},
    {"attn_output.weight", "self_attn.o_proj.weight", KV_TDIM_DIM, KV_TDIM_Q, 0,
     "embedding_length x head_count*head_dim", "hidden_size x heads*head_dim", MAT(wo)},
    {"attn_q.bias", "self_attn.q_proj.bias", KV_TDIM_ONE, KV_TDIM_Q, 1, "head_count*head_dim",
     "heads*head_dim", VEC(bq)},
    {"attn_k.bias", "self_attn.k_proj.bias", KV_TDIM_ONE, KV_TDIM_KV, 1, "head_count_kv*head_dim",
     "kv_heads*head_dim", VEC(bk)},
    {"attn_v.bias", "self_attn.v_proj.bias", KV_TDIM_ONE, KV_TDIM_KV, 1, "head_count_kv*head_dim",
     "kv_heads*head_dim", VEC(bv)},
    {"ffn_norm.weight", "post_attention_layernorm.weight", KV_TDIM_ONE, KV_TDIM_DIM, 0,
     "embedding_length", "hidden_size", VEC(ffn_norm)},
    {"ffn_gate.weight", "mlp.gate_proj.weight", KV_TDIM_HIDDEN, KV_TDIM_DIM, 0,
     "feed_forward_length x embedding_length", "intermediate_size x hidden_size", MAT(w_gate)},
    {"ffn_down.weight", "mlp.down_proj.weight", KV_TDIM_DIM, KV_TDIM_HIDDEN, 0,
     "embedding_length x feed_forward_length", "hidden_size x intermediate_size", MAT(w_down)},
    {"ffn_up.weight", "mlp.up_proj.weight", KV_TDIM_HIDDEN, KV_TDIM_DIM, 0,
     "feed_forward_length x embedding_length", "intermediate_size x hidden_size", MAT(w_up)},
};

const kv_tensor_role *kv_layer_tensor_roles(size_t *n) {
    *n = sizeof kv_layer_roles / sizeof kv_layer_roles[0];
    return kv_layer_roles;
}

long long kv_tensor_dim_size(const kv_config *c, kv_tensor_dim d) {
    switch (d) {
    case KV_TDIM_ONE:
        return 1;
    case KV_TDIM_DIM:
        return c->dim;
    case KV_TDIM_Q:
        return (long long)c->n_heads * c->head_dim;
    case KV_TDIM_KV:
        return (long long)c->n_kv_heads * c->head_dim;
    case KV_TDIM_HIDDEN:
        return c->hidden_dim;
    }
    return 0;
}

void kv_tensor_role_slot(const kv_tensor_role *r, kv_layer_weights *w, const float ***vec,
                         kv_weight **mat) {
    char *base = (char *)w + r->offset;
    *vec = r->matrix ? NULL : (const float **)(void *)base;
    *mat = r->matrix ? (kv_weight *)(void *)base : NULL;
}
