/* kvplan CUDA backend: the C face of cuda/ (device query, hardware probes, and later the GPU
 * forward operations). Built by nvcc when a CUDA toolkit is present; otherwise cuda/none.c
 * provides the same functions, which report that no CUDA backend was built.
 * Every function returns KV_OK, or an error code with a message; none exits.
 */
#ifndef KVPLAN_KVCUDA_H
#define KVPLAN_KVCUDA_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_cuda_device {
    char name[256];
    size_t total_mem; /* bytes */
    int cc_major, cc_minor;
    int multiprocessors;
    double mem_bus_bw; /* theoretical device memory bandwidth, bytes/s (0 if unknown) */
} kv_cuda_device;

/* 1 when this build contains the CUDA backend. */
int kv_cuda_built(void);
/* Number of usable CUDA devices (0 when none, or when no backend was built). Never fails:
 * a driver without devices counts as 0 and `why` (may be NULL, 256 bytes) says why. */
int kv_cuda_device_count(char *why);
int kv_cuda_device_info(int dev, kv_cuda_device *out, kv_error *err);

/* ---- hardware probes (called by profiler/hwprobe.c) ---- */

/* Copy directions timed by kv_cuda_probe_copy. */
typedef enum kv_cuda_copy_kind {
    KV_CUDA_H2D_PINNED = 0,   /* host (cudaHostAlloc) -> device */
    KV_CUDA_H2D_PAGEABLE = 1, /* host (malloc) -> device */
    KV_CUDA_D2H_PINNED = 2,   /* device -> host (cudaHostAlloc) */
    KV_CUDA_D2H_PAGEABLE = 3, /* device -> host (malloc) */
    KV_CUDA_D2D = 4,          /* device -> device (bytes copied; traffic is twice that) */
} kv_cuda_copy_kind;

/* Element types of kv_cuda_probe_gemm: A, B and C all of this type, FP32 accumulation. */
typedef enum kv_cuda_dtype {
    KV_CUDA_FP32 = 0,
    KV_CUDA_FP16 = 1,
    KV_CUDA_BF16 = 2,
} kv_cuda_dtype;

/* Time copies of each size bytes[0..n_sizes-1] (bytes, > 0), `repeats` times each, on device
 * `dev`: cudaMemcpyAsync on a dedicated stream between two CUDA events, one copy per sample,
 * after one untimed warm-up copy per size. Buffers of max(bytes) are allocated once and freed
 * before returning. times (caller-owned, n_sizes * repeats doubles) receives seconds,
 * row-major [size][repeat]. `p` (may be NULL) gets progress. Errors: KV_EINPUT for bad
 * arguments or no CUDA backend, KV_EINTERNAL for CUDA failures (message names the call and
 * the size). */
int kv_cuda_probe_copy(int dev, kv_cuda_copy_kind kind, const size_t *bytes, int n_sizes,
                       int repeats, double *times, kv_progress *p, kv_error *err);

/* Time cublasGemmEx C[m,n] = A[m,k] B[k,n] (row-major; alpha 1, beta 0, compute
 * CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) for each shape i of m, n, k (n_shapes > 0, all
 * > 0), `repeats` times, one GEMM per sample between CUDA events after one warm-up. Inputs are
 * filled with small values on the device. times (caller-owned, n_shapes * repeats) receives
 * seconds, row-major [shape][repeat]. Errors as kv_cuda_probe_copy; a data type the device
 * does not support (e.g. BF16 before sm_80) is a KV_EINTERNAL naming the type. */
int kv_cuda_probe_gemm(int dev, kv_cuda_dtype dtype, const int *m, const int *n, const int *k,
                       int n_shapes, int repeats, double *times, kv_progress *p, kv_error *err);

/* The CUDA backend of the engine (kvplan/backend.h) for model `m` (passed as the opaque
 * kv_model and returned as the opaque kv_backend, so this header needs neither): weights
 * uploaded once, cuBLAS GEMMs, paged attention kernels. KV_EINPUT when this build has no CUDA
 * backend or no device is present (the message says which); KV_EINTERNAL on CUDA failures. */
struct kv_model;
struct kv_backend;
int kv_backend_cuda_new(const struct kv_model *m, int max_rows, int max_ctx,
                        struct kv_backend **out, kv_error *err);

/* ---- KVPR executor on the device (cuda/kvpr_cuda.cu; KVPR, Jiang et al., §3.2-3.3) ----
 * The device half of kv_kvpr_rebuild (runtime/offload/kvpr_exec.h): K, V [l:s'] cross to the
 * device on a copy stream while a compute stream uploads X [0:l] and recomputes K, V [0:l]
 * (W_K, W_V in their file's type: the CUDA backend's typed matmul; bias, RoPE), and a third
 * stream downloads K, V [0:s'] into pinned staging after both, ordered by CUDA events; layers
 * alternate between two buffer sets and no copy touches pageable memory, so one layer's work
 * is queued while the previous one is in flight (n host waits for n layers). */
typedef struct kv_cuda_kvpr kv_cuda_kvpr;
struct kv_kvpr_layer;
struct kv_kvpr_timing;
/* Executor for model `m` (must outlive it) holding up to max_ctx tokens per layer: every
 * layer's W_K, W_V (in their type) and biases uploaded once, pinned input and output staging
 * and two device buffer sets.
 * Caller owns *out (kv_cuda_kvpr_free). KV_EINPUT without a device or for max_ctx < 1;
 * KV_EINTERNAL on CUDA failures. */
int kv_cuda_kvpr_new(const struct kv_model *m, int max_ctx, kv_cuda_kvpr **out, kv_error *err);
void kv_cuda_kvpr_free(kv_cuda_kvpr *e);
/* Rebuild n offloaded layers (layers[i] as kv_kvpr_layer_offload makes them) into k_out[i],
 * v_out[i] (host, s' * h_kv floats each): the same rows as kv_kvpr_rebuild. t [n] (may be
 * NULL) receives per layer t_transfer and t_recompute from CUDA events, the bytes and FLOPs
 * of Eq. 6 and 8, and t_total = the call's wall time / n. Errors: KV_EINPUT for an entry
 * inconsistent with the model or beyond max_ctx (checked before anything is queued);
 * KV_EINTERNAL on CUDA / cuBLAS failures, after which k_out, v_out and t are unspecified and
 * the executor can be used again. */
int kv_cuda_kvpr_rebuild(kv_cuda_kvpr *e, const struct kv_kvpr_layer *layers, int n,
                         float *const *k_out, float *const *v_out, struct kv_kvpr_timing *t,
                         kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
