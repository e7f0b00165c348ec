/* One table of a decoder layer's tensors (internal to the model room): for each role (the query
 * projection, the FFN gate, ...) its name in GGUF (after "blk.N.") and in Hugging Face
 * safetensors (after "model.layers.N."), its shape in the model's sizes, and where the loaded
 * tensor goes in kv_layer_weights. The GGUF and safetensors readers both walk it, so a role is
 * named and shaped once (as llama.cpp keeps one map of tensor names per architecture). */
#ifndef KVPLAN_MODEL_TENSORS_H
#define KVPLAN_MODEL_TENSORS_H

#include "kvplan/model.h"

#include <stddef.h>

/* A tensor dimension, in the config's sizes. */
typedef enum kv_tensor_dim {
    KV_TDIM_ONE = 0, /* rows of a vector: the tensor is 1-D */
    KV_TDIM_DIM,     /* dim (embedding_length / hidden_size) */
    KV_TDIM_Q,       /* H * d_h */
    KV_TDIM_KV,      /* H_kv * d_h */
    KV_TDIM_HIDDEN,  /* the FFN width (feed_forward_length / intermediate_size) */
} kv_tensor_dim;

typedef struct kv_tensor_role {
    const char *gguf;         /* GGUF name after "blk.N." */
    const char *hf;           /* safetensors name after "model.layers.N." */
    kv_tensor_dim rows, cols; /* [rows, cols] row-major; rows KV_TDIM_ONE: a vector of cols */
    int bias;                 /* 1: an attention bias, present only when cfg.attn_bias */
    const char *gguf_shape;   /* the expected shape in GGUF's key names, for messages */
    const char *hf_shape;     /* the same in config.json's key names */
    size_t offset;            /* where it goes: offsetof(kv_layer_weights, ...) */
    int matrix;               /* 1: a kv_weight (any type); 0: an fp32 vector (const float *) */
} kv_tensor_role;

/* The roles of one decoder layer, in file order; *n gets their count. Static, never NULL. */
const kv_tensor_role *kv_layer_tensor_roles(size_t *n);

/* The size a dimension stands for in config c (KV_TDIM_ONE: 1). */
long long kv_tensor_dim_size(const kv_config *c, kv_tensor_dim d);

/* The slot of role r in layer w: *vec for a vector (r->matrix 0), *mat for a matrix; the other
 * is set to NULL. */
void kv_tensor_role_slot(const kv_tensor_role *r, kv_layer_weights *w, const float ***vec,
                         kv_weight **mat);

#endif
