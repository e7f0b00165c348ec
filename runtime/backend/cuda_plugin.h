/* The CUDA plugin's interface: the one table libkvplan-cuda.so exports (internal to kvplan; the
 * public face is runtime/backend/kvcuda.h).
 *
 * The main library links no CUDA library. When a CUDA run is asked for (or --device auto finds
 * an NVIDIA driver), runtime/backend/cuda_loader.c opens the plugin with dlopen and takes this
 * table from its one exported symbol, KV_CUDA_PLUGIN_SYMBOL; every kvcuda.h call forwards to it.
 * A program that links the cuda/ objects itself (a test on the fake CUDA runtime) gets them
 * directly, without the loader. */
#ifndef KVPLAN_CUDA_PLUGIN_H
#define KVPLAN_CUDA_PLUGIN_H

#include "backend/kvcuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the table or a type it passes (kv_model, kv_backend, ...) changes layout; the
 * loader refuses a plugin built against another version. */
#define KV_CUDA_PLUGIN_ABI 1
#define KV_CUDA_PLUGIN_SYMBOL "kvplan_cuda_plugin_v1"
#define KV_CUDA_PLUGIN_FILE "libkvplan-cuda.so"

typedef struct kv_cuda_plugin {
    int abi;           /* KV_CUDA_PLUGIN_ABI of the build that made the plugin */
    size_t table_size; /* sizeof(kv_cuda_plugin) of that build */
    int (*device_count)(char *why);
    int (*device_info)(int dev, kv_cuda_device *out, kv_error *err);
    int (*probe_copy)(int dev, kv_cuda_copy_kind kind, const size_t *bytes, int n_sizes,
                      int repeats, double *times, kv_progress *p, kv_error *err);
    int (*probe_gemm)(int dev, kv_cuda_dtype dtype, const int *m, const int *n, const int *k,
                      int n_shapes, int repeats, double *times, kv_progress *p, kv_error *err);
    int (*backend_new)(const struct kv_model *m, int max_rows, int max_ctx, struct kv_backend **out,
                       kv_error *err);
    int (*kvpr_new)(const struct kv_model *m, int max_ctx, kv_cuda_kvpr **out, kv_error *err);
    void (*kvpr_free)(kv_cuda_kvpr *e);
    int (*kvpr_rebuild)(kv_cuda_kvpr *e, const struct kv_kvpr_layer *layers, int n,
                        float *const *k_out, float *const *v_out, struct kv_kvpr_timing *t,
                        kv_error *err);
} kv_cuda_plugin;

/* The plugin's one export: a pointer to its static table (never NULL, owned by the plugin). */
typedef const kv_cuda_plugin *(*kv_cuda_plugin_fn)(void);

#ifdef __cplusplus
}
#endif
#endif
