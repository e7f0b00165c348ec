/* Stand-in for the CUDA backend when no CUDA toolkit was found at build time: every query
 * answers "no device" so the CPU paths run. See include/kvplan/kvcuda.h. */
#include "kvplan/kvcuda.h"

#include <stdio.h>

int kv_cuda_built(void) {
    return 0;
}

int kv_cuda_device_count(char *why) {
    if (why) snprintf(why, 256, "kvplan was built without a CUDA toolkit");
    return 0;
}

int kv_cuda_device_info(int dev, kv_cuda_device *out, kv_error *err) {
    (void)dev;
    (void)out;
    return kv_fail(err, KV_EINPUT, "no CUDA backend in this build (no CUDA toolkit was found)");
}

int kv_cuda_probe_copy(int dev, kv_cuda_copy_kind kind, const size_t *bytes, int n_sizes,
                       int repeats, double *times, kv_progress *p, kv_error *err) {
    (void)dev;
    (void)kind;
    (void)bytes;
    (void)n_sizes;
    (void)repeats;
    (void)times;
    (void)p;
    return kv_fail(err, KV_EINPUT,
                   "CUDA copy probe: no CUDA backend in this build (no CUDA toolkit was found)");
}

int kv_cuda_probe_gemm(int dev, kv_cuda_dtype dtype, const int *m, const int *n, const int *k,
                       int n_shapes, int repeats, double *times, kv_progress *p, kv_error *err) {
    (void)dev;
    (void)dtype;
    (void)m;
    (void)n;
    (void)k;
    (void)n_shapes;
    (void)repeats;
    (void)times;
    (void)p;
    return kv_fail(err, KV_EINPUT,
                   "CUDA GEMM probe: no CUDA backend in this build (no CUDA toolkit was found)");
}

int kv_backend_cuda_new(const struct kv_model *m, int max_rows, int max_ctx,
                        struct kv_backend **out, kv_error *err) {
    (void)m;
    (void)max_rows;
    (void)max_ctx;
    *out = NULL;
    return kv_fail(err, KV_EINPUT,
                   "--device cuda: kvplan was built without a CUDA toolkit; use --device cpu");
}

int kv_cuda_kvpr_new(const struct kv_model *m, int max_ctx, kv_cuda_kvpr **out, kv_error *err) {
    (void)m;
    (void)max_ctx;
    *out = NULL;
    return kv_fail(err, KV_EINPUT, "CUDA KVPR: kvplan was built without a CUDA toolkit");
}

void kv_cuda_kvpr_free(kv_cuda_kvpr *e) {
    (void)e;
}

int kv_cuda_kvpr_rebuild(kv_cuda_kvpr *e, const struct kv_kvpr_layer *layers, int n,
                         float *const *k_out, float *const *v_out, struct kv_kvpr_timing *t,
                         kv_error *err) {
    (void)e;
    (void)layers;
    (void)n;
    (void)k_out;
    (void)v_out;
    (void)t;
    return kv_fail(err, KV_EINPUT, "CUDA KVPR: kvplan was built without a CUDA toolkit");
}
