/* One table of a decoder layer's tensors (internal to the model room): for each role (the query
 * projection, the FFN gate, ...) its name in GGUF (after "blk.N.") and in Hugging Face
 * safetensors (after "model.layers.N."), its shape in the model's sizes, and where the loaded
 * tensor goes in kv_layer_weights. Every consumer walks it: the GGUF and safetensors readers
 * (kv_layer_roles_each), the model's size arithmetic (model.c) and the CUDA uploads (the
 * backend's layers, cuda/backend_cuda.cu, and the KVPR executor's K/V projections,
 * cuda/kvpr_cuda.cu, both by role id), so a role is named and shaped once (as llama.cpp keeps
 * one map of tensor names per architecture). */
#ifndef KVPLAN_MODEL_TENSORS_H
#define KVPLAN_MODEL_TENSORS_H

#include "kvplan/model.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor dimension, in the config's sizes. */
typedef enum kv_tensor_dim {
    KV_TDIM_ONE = 0, /* rows of a vector: the tensor is 1-D */
    KV_TDIM_DIM,     /* dim (embedding_length / hidden_size) */
    KV_TDIM_Q,       /* H * d_h */
    KV_TDIM_KV,      /* H_kv * d_h */
    KV_TDIM_HIDDEN,  /* the FFN width (feed_forward_length / intermediate_size) */
} kv_tensor_dim;

/* The roles, in file order: the index of each in the table. */
typedef enum kv_role_id {
    KV_ROLE_ATTN_NORM = 0,
    KV_ROLE_WQ,
    KV_ROLE_WK,
    KV_ROLE_WV,
    KV_ROLE_WO,
    KV_ROLE_BQ,
    KV_ROLE_BK,
    KV_ROLE_BV,
    KV_ROLE_FFN_NORM,
    KV_ROLE_W_GATE,
    KV_ROLE_W_DOWN,
    KV_ROLE_W_UP,
    KV_ROLE_COUNT
} kv_role_id;

typedef struct kv_tensor_role {
    const char *gguf;         /* GGUF name after "blk.N." */
    const char *hf;           /* safetensors name after "model.layers.N." */
    kv_tensor_dim rows, cols; /* [rows, cols] row-major; rows KV_TDIM_ONE: a vector of cols */
    int bias;                 /* 1: an attention bias, present only when cfg.attn_bias */
    size_t offset;            /* where it goes: offsetof(kv_layer_weights, ...) */
    int matrix;               /* 1: a kv_weight (any type); 0: an fp32 vector (const float *) */
} kv_tensor_role;

/* The roles of one decoder layer, indexed by kv_role_id (file order); *n gets KV_ROLE_COUNT.
 * Static, never NULL. */
const kv_tensor_role *kv_layer_tensor_roles(size_t *n);

/* The size a dimension stands for in config c (KV_TDIM_ONE: 1). */
long long kv_tensor_dim_size(const kv_config *c, kv_tensor_dim d);

/* The slot of role r in layer w: *vec for a vector (r->matrix 0), *mat for a matrix; the other
 * is set to NULL. */
void kv_tensor_role_slot(const kv_tensor_role *r, kv_layer_weights *w, const float ***vec,
                         kv_weight **mat);

/* One tensor of one layer, as kv_layer_roles_each hands it over. */
typedef struct kv_role_tensor {
    kv_role_id id;
    const kv_tensor_role *role;
    int layer;
    long long rows, cols; /* in the config's sizes; rows 1 for a vector */
    int optional;         /* 1: may be absent (a bias of a model without them) */
    const float **vec;    /* the slot: vec for a vector, mat for a matrix (the other NULL) */
    kv_weight *mat;
    /* the expected shape in the key names of GGUF ("head_count*head_dim x embedding_length")
     * and of config.json ("heads*head_dim x hidden_size"), for messages */
    char gguf_shape[96], hf_shape[96];
} kv_role_tensor;

/* Calls fn(t, user) for every role of layers 0 .. c->n_layers - 1 of `layers` (layer by layer,
 * roles in file order) and returns the first non-zero value fn returns (then stops), else 0.
 * `layers` may be NULL (the slots are then NULL): a walk over the shapes only. */
int kv_layer_roles_each(const kv_config *c, kv_layer_weights *layers,
                        int (*fn)(const kv_role_tensor *t, void *user), void *user);

#ifdef __cplusplus
}
#endif
#endif
