/* CUDA hardware probes: copy timing and cuBLAS GEMM throughput (runtime/backend/kvcuda.h).
 * Timed with CUDA events on a dedicated non-blocking stream (CUDA Runtime API,
 * cudaEventElapsedTime: milliseconds between two recorded events). */
#include "backend/kvcuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

/* The copy kinds' names, in kv_cuda_copy_kind order (kinds checked against KV_CUDA_D2D first). */
const char *const copy_kind_names[] = {"host->device (pinned)", "host->device (pageable)",
                                       "device->host (pinned)", "device->host (pageable)",
                                       "device->device"};

const char *copy_kind_name(kv_cuda_copy_kind k) {
    return copy_kind_names[k];
}

/* Small deterministic values in [-0.06, 0.06] so that no type overflows, as T. */
template <typename T> __device__ T from_f32(float v);
template <> __device__ float from_f32<float>(float v) {
    return v;
}
template <> __device__ __half from_f32<__half>(float v) {
    return __float2half(v);
}
template <> __device__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16(v);
}
template <typename T> __global__ void fill_k(T *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = from_f32<T>((float)((int)(i % 13) - 6) * 0.01f);
}
template <typename T> cudaError_t fill_as(void *x, size_t n, cudaStream_t st) {
    fill_k<T><<<1024, 256, 0, st>>>(static_cast<T *>(x), n);
    return cudaGetLastError();
}

/* The GEMM probe's data types, one row each in kv_cuda_dtype order: name, cuBLAS type, bytes
 * per element, the fill kernel. */
struct gemm_dtype {
    const char *name;
    cudaDataType dt;
    size_t esz;
    cudaError_t (*fill)(void *x, size_t n, cudaStream_t st);
};
const gemm_dtype gemm_dtypes[] = {
    {"fp32", CUDA_R_32F, 4, fill_as<float>},
    {"fp16", CUDA_R_16F, 2, fill_as<__half>},
    {"bf16", CUDA_R_16BF, 2, fill_as<__nv_bfloat16>},
};
static_assert(KV_CUDA_FP32 == 0 && KV_CUDA_FP16 == 1 && KV_CUDA_BF16 == 2,
              "gemm_dtypes is in kv_cuda_dtype order");

} // namespace

/* On a CUDA error: fill err, set rc, jump to the cleanup. */
#define KV_CU_TRY(call, what)                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = kv_fail(err, KV_EINTERNAL, "CUDA %s on device %d: %s failed: %s", ctx, dev, what, \
                         cudaGetErrorString(e_));                                                  \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

#define KV_CUBLAS_TRY(call, what)                                                                  \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            rc = kv_fail(err, KV_EINTERNAL, "CUDA %s on device %d: %s failed: %s", ctx, dev, what, \
                         cublasGetStatusString(s_));                                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

extern "C" int kv_cuda_probe_copy(int dev, kv_cuda_copy_kind kind, const size_t *bytes, int n_sizes,
                                  int repeats, double *times, kv_progress *p, kv_error *err) {
    int rc = KV_OK;
    char ctx[96];
    void *host = NULL, *d0 = NULL, *d1 = NULL;
    int pinned = (kind == KV_CUDA_H2D_PINNED || kind == KV_CUDA_D2H_PINNED);
    cudaStream_t st = NULL;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    size_t maxb = 0;
    if ((int)kind < 0 || (int)kind > (int)KV_CUDA_D2D)
        return kv_fail(err, KV_EINPUT, "CUDA copy probe: unknown copy kind %d", (int)kind);
    snprintf(ctx, sizeof ctx, "copy probe %s", copy_kind_name(kind));
    if (!bytes || !times || n_sizes < 1 || repeats < 1)
        return kv_fail(err, KV_EINPUT, "CUDA %s: need at least one size and one repeat", ctx);
    for (int i = 0; i < n_sizes; i++) {
        if (bytes[i] == 0) return kv_fail(err, KV_EINPUT, "CUDA %s: size %d is 0 bytes", ctx, i);
        if (bytes[i] > maxb) maxb = bytes[i];
    }

    KV_CU_TRY(cudaSetDevice(dev), "cudaSetDevice");
    KV_CU_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    KV_CU_TRY(cudaEventCreate(&ev0), "cudaEventCreate");
    KV_CU_TRY(cudaEventCreate(&ev1), "cudaEventCreate");
    KV_CU_TRY(cudaMalloc(&d0, maxb), "cudaMalloc of the device buffer");
    KV_CU_TRY(cudaMemset(d0, 1, maxb), "cudaMemset");
    if (kind == KV_CUDA_D2D) {
        KV_CU_TRY(cudaMalloc(&d1, maxb), "cudaMalloc of the second device buffer");
        KV_CU_TRY(cudaMemset(d1, 0, maxb), "cudaMemset");
    } else if (pinned) {
        KV_CU_TRY(cudaHostAlloc(&host, maxb, cudaHostAllocDefault), "cudaHostAlloc");
        memset(host, 1, maxb);
    } else {
        host = malloc(maxb);
        if (!host) {
            rc = kv_fail(err, KV_EINTERNAL, "CUDA %s: out of memory for %zu host bytes", ctx, maxb);
            goto done;
        }
        memset(host, 1, maxb); /* fault the pages in before timing */
    }
    KV_CU_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    for (int s = 0; s < n_sizes; s++) {
        void *dst, *src;
        cudaMemcpyKind dir;
        if (kind == KV_CUDA_D2D) {
            dst = d1, src = d0, dir = cudaMemcpyDeviceToDevice;
        } else if (kind == KV_CUDA_H2D_PINNED || kind == KV_CUDA_H2D_PAGEABLE) {
            dst = d0, src = host, dir = cudaMemcpyHostToDevice;
        } else {
            dst = host, src = d0, dir = cudaMemcpyDeviceToHost;
        }
        kv_progress_print(p, 0, "hardware: CUDA %s, %zu bytes (%d/%d)", copy_kind_name(kind),
                          bytes[s], s + 1, n_sizes);
        KV_CU_TRY(cudaMemcpyAsync(dst, src, bytes[s], dir, st), "warm-up cudaMemcpyAsync");
        KV_CU_TRY(cudaStreamSynchronize(st), "cudaStreamSynchronize");
        for (int r = 0; r < repeats; r++) {
            float ms = 0.0f;
            KV_CU_TRY(cudaEventRecord(ev0, st), "cudaEventRecord");
            KV_CU_TRY(cudaMemcpyAsync(dst, src, bytes[s], dir, st), "cudaMemcpyAsync");
            KV_CU_TRY(cudaEventRecord(ev1, st), "cudaEventRecord");
            KV_CU_TRY(cudaEventSynchronize(ev1), "cudaEventSynchronize");
            KV_CU_TRY(cudaEventElapsedTime(&ms, ev0, ev1), "cudaEventElapsedTime");
            times[(size_t)s * repeats + r] = (double)ms * 1e-3;
        }
    }

done:
    if (host) {
        if (pinned)
            cudaFreeHost(host);
        else
            free(host);
    }
    if (d0) cudaFree(d0);
    if (d1) cudaFree(d1);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    if (st) cudaStreamDestroy(st);
    return rc;
}

extern "C" int kv_cuda_probe_gemm(int dev, kv_cuda_dtype dtype, const int *m, const int *n,
                                  const int *k, int n_shapes, int repeats, double *times,
                                  kv_progress *p, kv_error *err) {
    int rc = KV_OK;
    char ctx[96];
    void *a = NULL, *b = NULL, *c = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    cublasHandle_t h = NULL;
    size_t max_a = 0, max_b = 0, max_c = 0;
    const float alpha = 1.0f, beta = 0.0f;
    if ((int)dtype < 0 || (int)dtype > (int)KV_CUDA_BF16)
        return kv_fail(err, KV_EINPUT, "CUDA GEMM probe: unknown data type %d", (int)dtype);
    const gemm_dtype &T = gemm_dtypes[dtype];
    cudaDataType dt = T.dt;
    size_t esz = T.esz;
    snprintf(ctx, sizeof ctx, "GEMM probe %s", T.name);
    if (!m || !n || !k || !times || n_shapes < 1 || repeats < 1)
        return kv_fail(err, KV_EINPUT, "CUDA %s: need at least one shape and one repeat", ctx);
    for (int i = 0; i < n_shapes; i++) {
        if (m[i] < 1 || n[i] < 1 || k[i] < 1)
            return kv_fail(err, KV_EINPUT, "CUDA %s: shape %d is %dx%dx%d", ctx, i, m[i], n[i],
                           k[i]);
        size_t sa = (size_t)m[i] * k[i], sb = (size_t)k[i] * n[i], sc = (size_t)m[i] * n[i];
        if (sa > max_a) max_a = sa;
        if (sb > max_b) max_b = sb;
        if (sc > max_c) max_c = sc;
    }

    KV_CU_TRY(cudaSetDevice(dev), "cudaSetDevice");
    KV_CU_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    KV_CU_TRY(cudaEventCreate(&ev0), "cudaEventCreate");
    KV_CU_TRY(cudaEventCreate(&ev1), "cudaEventCreate");
    KV_CU_TRY(cudaMalloc(&a, max_a * esz), "cudaMalloc of A");
    KV_CU_TRY(cudaMalloc(&b, max_b * esz), "cudaMalloc of B");
    KV_CU_TRY(cudaMalloc(&c, max_c * esz), "cudaMalloc of C");
    KV_CU_TRY(T.fill(a, max_a, st), "fill kernel for A");
    KV_CU_TRY(T.fill(b, max_b, st), "fill kernel for B");
    KV_CU_TRY(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    KV_CUBLAS_TRY(cublasCreate(&h), "cublasCreate");
    KV_CUBLAS_TRY(cublasSetStream(h, st), "cublasSetStream");

    for (int s = 0; s < n_shapes; s++) {
        /* Row-major C[m,n] = A[m,k] B[k,n] is column-major C^T[n,m] = B^T[n,k] A^T[k,m]. */
        kv_progress_print(p, 0, "hardware: cuBLAS %s GEMM %dx%dx%d (%d/%d)", T.name, m[s], n[s],
                          k[s], s + 1, n_shapes);
        for (int r = -1; r < repeats; r++) { /* r = -1: warm-up, not recorded */
            float ms = 0.0f;
            KV_CU_TRY(cudaEventRecord(ev0, st), "cudaEventRecord");
            KV_CUBLAS_TRY(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n[s], m[s], k[s], &alpha, b, dt,
                                       n[s], a, dt, k[s], &beta, c, dt, n[s], CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx");
            KV_CU_TRY(cudaEventRecord(ev1, st), "cudaEventRecord");
            KV_CU_TRY(cudaEventSynchronize(ev1), "cudaEventSynchronize");
            KV_CU_TRY(cudaEventElapsedTime(&ms, ev0, ev1), "cudaEventElapsedTime");
            if (r >= 0) times[(size_t)s * repeats + r] = (double)ms * 1e-3;
        }
    }

done:
    if (h) cublasDestroy(h);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (c) cudaFree(c);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    if (st) cudaStreamDestroy(st);
    return rc;
}
