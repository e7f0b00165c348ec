/* Internal to cuda/: weight matrices on the device in their file's type, and the matmul that
 * reads them, shared by the CUDA backend (backend_cuda.cu) and the KVPR executor
 * (kvpr_cuda.cu), so both multiply by the same weights in the same way. C++ only (nvcc, or g++
 * against the fake CUDA runtime of tests/cuda_fake/). */
#ifndef KVPLAN_CUDA_MATMUL_H
#define KVPLAN_CUDA_MATMUL_H

#include "kvplan/common.h"
#include "kvplan/quant.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stddef.h>

namespace kvcu {

/* A weight matrix [rows, cols] on the device as its file stores it: rows of row_bytes bytes
 * in ggml type `type` (p == nullptr: no such weight). */
struct dev_weight {
    void *p = nullptr;
    kv_dtype type = KV_DT_F32;
    size_t row_bytes = 0;
};

/* A device scratch buffer that grows on demand (bytes); owned by the caller, cudaFree(p). */
struct dev_scratch {
    void *p = nullptr;
    size_t cap = 0;
};

/* Upload w [rows, cols] unchanged: one cudaMalloc of rows * kv_dtype_row_bytes(type, cols)
 * bytes (owned by *dst; cudaFree(dst->p)) and one synchronous copy. A weight without data
 * leaves *dst empty. Errors: KV_EINPUT for a row length the type cannot hold, KV_EINTERNAL for
 * a CUDA failure (message prefixed with `who`); *dst may then hold an allocation to free. */
int upload_weight(dev_weight *dst, kv_weight w, size_t rows, size_t cols, const char *who,
                  kv_error *err);

/* y [rows, out] = x [rows, in] W^T on stream s (blas is bound to s), W [out, in] in its type,
 * fp32 x and y (device pointers), FP32 accumulation:
 *   - F32 W: cublasGemmEx in FP32;
 *   - rows <= KV_K_GEMV_ROWS: the typed GEMV (each weight row read once in its type);
 *   - F16 / BF16 W: x rounded to W's 16-bit type into *tile, cublasGemmEx with 16-bit A and B,
 *     FP32 C and compute (tensor cores under the default math mode);
 *   - block types: tiles of up to 4 Mi weight rows' elements dequantised into *tile, each
 *     multiplied by an FP32 cublasGemmEx into its columns of y (as the CPU's kv_qmatmul).
 * *tile grows on demand (at most 16 MiB) and is reused in stream order. Errors: KV_EINTERNAL
 * naming the failed call, prefixed with `who`; y is then unspecified. */
int matmul(cublasHandle_t blas, cudaStream_t s, dev_scratch *tile, float *y, const float *x,
           const dev_weight &w, int rows, int in, int out, const char *who, kv_error *err);

} // namespace kvcu

#endif
