/* The model room's internals (not installed): what a format reader (llama2c.c, gguf.c, hf.c)
 * needs to build a kv_model, and the readers themselves, which formats.c's registry calls. Tests
 * and benchmarks that build synthetic models include it too. The public face is
 * include/kvplan/model.h. */
#ifndef KVPLAN_MODEL_IMPL_H
#define KVPLAN_MODEL_IMPL_H

#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format readers, one per row of formats.c's registry. Each fills *out (kv_model_free) or
 * returns KV_EINPUT naming the file and what is wrong with it. */
int kv_model_load_llama2c(const char *path, kv_model **out, kv_error *err);
int kv_model_load_gguf(const char *path, kv_model **out, kv_error *err);
int kv_model_load_hf(const char *dir, kv_model **out, kv_error *err);

/* A zeroed model with n_layers layer slots (kv_model_free), or NULL (err says why). */
kv_model *kv_model_alloc(int n_layers, kv_error *err);
/* Adopt heap buffer p so that kv_model_free releases it; frees p itself when it fails. */
int kv_model_adopt(kv_model *m, void *p, kv_error *err);
/* A loader's fp32 copy `dst` (heap, one tensor's values) handed to the model: adopted (so
 * kv_model_free releases it) and returned through *wout as an F32 weight when wout is given,
 * else through *out. On failure dst is freed, the outputs untouched, KV_EINTERNAL. */
int kv_model_give_f32(kv_model *m, float *dst, const float **out, kv_weight *wout, kv_error *err);

/* Validate a filled config: positive sizes, H divisible by H_kv, dim == H * d_h (or d_h given),
 * even d_h. `what` names the file in the message. */
int kv_config_check(const kv_config *c, const char *what, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
