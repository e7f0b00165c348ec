/* kvplan model: configuration and weights of a decoder-only Llama-family model.
 *
 * Loaders (llama2.c `.bin`, GGUF, Hugging Face safetensors directories) all produce the same
 * in-memory form: every weight matrix is row-major [out_features, in_features] (the PyTorch
 * nn.Linear layout), so y = W x, and stays in its file's data type (kv_weight: F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; include/kvplan/quant.h), pointing into the
 * file's bytes, which the loader read into a buffer the model owns (kv_file_load: never a
 * memory map, which a truncation of the file by another process would turn into SIGBUS); the
 * matmuls convert while they compute (kv_qmatmul), so a model needs about its file size in
 * memory (docs/design.md). Norms and biases are fp32 (converted on
 * load when the file stores them otherwise).
 *
 * RoPE layout: KV_ROPE_ADJACENT rotates pairs (2i, 2i+1) of each head (llama2.c, GGUF);
 * KV_ROPE_HALF rotates pairs (i, i + d_h/2) ("rotate_half", Hugging Face checkpoints).
 */
#ifndef KVPLAN_MODEL_H
#define KVPLAN_MODEL_H

#include "kvplan/common.h"
#include "kvplan/h5io.h"
#include "kvplan/quant.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef enum { KV_ROPE_ADJACENT = 0, KV_ROPE_HALF = 1 } kv_rope_layout;

typedef struct kv_config {
    int dim;        /* hidden size h */
    int hidden_dim; /* FFN intermediate size */
    int n_layers;   /* L */
    int n_heads;    /* H, query heads */
    int n_kv_heads; /* H_kv */
    int head_dim;   /* d_h = dim / H */
    int vocab_size;
    int seq_len; /* trained context length */
    float norm_eps;
    float rope_theta;
    kv_rope_layout rope_layout;
    int tied_embeddings; /* classifier == token embedding */
    int attn_bias;       /* q/k/v projections carry a bias (qwen2) */
    int bos_id;          /* -1 when unknown */
    int eos_id;          /* -1 when unknown */
    char arch[32];       /* "llama", "mistral", "qwen2" */
} kv_config;

typedef struct kv_layer_weights {
    const float *attn_norm;    /* [dim] fp32 */
    kv_weight wq;              /* [H*d_h, dim] */
    kv_weight wk;              /* [H_kv*d_h, dim] */
    kv_weight wv;              /* [H_kv*d_h, dim] */
    kv_weight wo;              /* [dim, H*d_h] */
    const float *bq, *bk, *bv; /* [H*d_h], [H_kv*d_h], [H_kv*d_h] fp32 or NULL */
    const float *ffn_norm;     /* [dim] fp32 */
    kv_weight w_gate;          /* [hidden, dim]  (llama2.c w1) */
    kv_weight w_down;          /* [dim, hidden]  (llama2.c w2) */
    kv_weight w_up;            /* [hidden, dim]  (llama2.c w3) */
} kv_layer_weights;

typedef struct kv_model {
    kv_config cfg;
    kv_weight tok_emb;        /* [vocab, dim]; rows dequantised per token (kv_weight_row) */
    kv_layer_weights *layers; /* [n_layers], owned */
    const float *final_norm;  /* [dim] fp32 */
    kv_weight classifier;     /* [vocab, dim]; aliases tok_emb when tied */
    char format[16];          /* "llama2c", "gguf", "safetensors" */
    char path[4096];          /* what the user passed */
    char sha256[65];          /* model_sha256: hash of the weight file(s), see kv_model_load */
    /* ownership (internal): the owned heap buffers (the loaded file among them) */
    void **owned;
    int n_owned, cap_owned;
    void *gguf; /* the parsed GGUF file (runtime/model/gguf_meta.h): owns the loaded file's bytes,
                 * kept for the embedded tokenizer; owned, or NULL */
} kv_model;

/* Load a model, detecting the format from the content: a directory with config.json
 * (Hugging Face safetensors), a file starting with "GGUF", else a llama2.c legacy checkpoint.
 * `model_sha256` is the SHA-256 of the file (GGUF, llama2.c) or of config.json followed by the
 * safetensors shards in order (Hugging Face). On success *out is owned by the caller
 * (kv_model_free). Errors (KV_EINPUT) name the file and what is wrong with it. */
int kv_model_load(const char *path, kv_model **out, kv_error *err);
void kv_model_free(kv_model *m);

/* Bytes of weights the forward pass reads per decoded token, in their stored types (all
 * matrices + norms + classifier; the embedding row is one row). */
size_t kv_model_weight_bytes(const kv_model *m);

/* Parameters the forward pass reads per decoded token (all matrices + norms + classifier +
 * one embedding row), whatever their stored type: kv_model_weight_bytes of an fp32 copy / 4. */
size_t kv_model_read_param_count(const kv_model *m);

/* Bytes of all weight data the model holds in memory (every matrix in its type, embedding and
 * classifier once when tied, norms and biases fp32). */
size_t kv_model_resident_bytes(const kv_model *m);

/* Floats of matmul scratch (kv_qmatmul) that the model's largest matrix needs for `rows` rows
 * a call; 0 when every matrix is F32 or rows <= 4. */
size_t kv_model_matmul_scratch(const kv_model *m, int rows);
/* The same for kv_qmatmul_pool on n_threads threads, for any call of up to `rows` rows. */
size_t kv_model_matmul_scratch_threads(const kv_model *m, int rows, int n_threads);

/* The weight types present, as a short string ("F32", "F16+F32", "Q4_K+Q6_K+F32" ...) in buf. */
void kv_model_weight_types(const kv_model *m, char *buf, size_t cap);

/* Parameter count (embedding counted once when tied). */
size_t kv_model_param_count(const kv_model *m);

/* Root provenance of an output file (runtime/model/provenance.c): kvplan_version, schema_version,
 * created (UTC ISO-8601), command (the command line), model_sha256; and the model's config as
 * attributes model_* (format, path, dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim,
 * vocab_size, seq_len). `m` may be NULL for a file that belongs to no model: model_sha256 is then
 * "" and no model_* is written. */
int kv_h5_write_provenance(kv_h5 *f, const char *command, const kv_model *m, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
