/* The hardware probes (cuda/hwprobe.cu) are not built on the fake CUDA runtime: they time
 * copies and GEMMs, which only a device can answer. These stand-ins keep the loader
 * (runtime/backend/cuda_loader.c) out of a program linked against the fake, and say so. */
#include "backend/kvcuda.h"

extern "C" int kv_cuda_probe_copy(int dev, kv_cuda_copy_kind kind, const size_t *bytes, int n_sizes,
                                  int repeats, double *times, kv_progress *p, kv_error *err) {
    (void)dev, (void)kind, (void)bytes, (void)n_sizes, (void)repeats, (void)times, (void)p;
    return kv_fail(err, KV_EINPUT,
                   "CUDA copy probe: the fake CUDA runtime has no timings; "
                   "probe on a device");
}

extern "C" int kv_cuda_probe_gemm(int dev, kv_cuda_dtype dtype, const int *m, const int *n,
                                  const int *k, int n_shapes, int repeats, double *times,
                                  kv_progress *p, kv_error *err) {
    (void)dev, (void)dtype, (void)m, (void)n, (void)k, (void)n_shapes, (void)repeats, (void)times,
        (void)p;
    return kv_fail(err, KV_EINPUT,
                   "CUDA GEMM probe: the fake CUDA runtime has no timings; "
                   "probe on a device");
}
