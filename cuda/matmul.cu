/* Weights in their file's type on the device and the matmul over them (cuda/matmul.h). */
#include "matmul.h"

#include "kernels.h"

namespace kvcu {

namespace {

int cuda_err(kv_error *err, const char *who, cudaError_t e, const char *what) {
    return kv_fail(err, KV_EINTERNAL, "%s: %s: %s", who, what, cudaGetErrorString(e));
}

int blas_err(kv_error *err, const char *who, cublasStatus_t s, const char *what) {
    return kv_fail(err, KV_EINTERNAL, "%s: %s: %s", who, what, cublasGetStatusString(s));
}

#define MM_CK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cuda_err(err, who, e_, #call);                               \
    } while (0)

#define MM_CKB(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) return blas_err(err, who, s_, #call);                     \
    } while (0)

int grow(dev_scratch *b, size_t bytes, const char *who, kv_error *err) {
    if (bytes <= b->cap) return KV_OK;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < bytes) cap *= 2;
    if (b->p) cudaFree(b->p);
    b->p = nullptr;
    b->cap = 0;
    MM_CK(cudaMalloc(&b->p, cap));
    b->cap = cap;
    return KV_OK;
}

/* Floats of the prefill tile: 4 Mi floats (16 MiB, few large GEMMs, as the CPU's 4 MiB tile),
 * or less when no matrix needs that much. */
constexpr size_t kTileFloats = (size_t)1 << 22;

} // namespace

int upload_weight(dev_weight *dst, kv_weight w, size_t rows, size_t cols, const char *who,
                  kv_error *err) {
    *dst = dev_weight();
    if (!w.data) return KV_OK;
    size_t rb = 0;
    if (kv_dtype_row_bytes(w.type, (int64_t)cols, who, &rb, err)) return KV_EINPUT;
    MM_CK(cudaMalloc(&dst->p, rows * rb));
    dst->type = w.type;
    dst->row_bytes = rb;
    MM_CK(cudaMemcpy(dst->p, w.data, rows * rb, cudaMemcpyHostToDevice));
    return KV_OK;
}

/* In cuBLAS's column-major terms Y' [out, rows] = W'^T X', W' = W viewed as [in, out], X' = x
 * as [in, rows]; a tile of W rows [o0, o0 + m) is the block of Y' rows at y + o0 (ldc out). */
int matmul(cublasHandle_t blas, cudaStream_t s, dev_scratch *tile, float *y, const float *x,
           const dev_weight &w, int rows, int in, int out, const char *who, kv_error *err) {
    const float one = 1.0f, zero = 0.0f;
    if (w.type == KV_DT_F32) {
        MM_CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w.p, CUDA_R_32F,
                            in, x, CUDA_R_32F, in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
        return KV_OK;
    }
    if (rows <= KV_K_GEMV_ROWS) { /* decode: each weight row read once, in its type */
        size_t ab = kvcu::gemv_act_bytes(w.type, rows, in); /* Q8_0 / Q4_0: int8 activations */
        if (ab) {
            int rc = grow(tile, ab, who, err);
            if (rc) return rc;
        }
        MM_CK(kvcu::gemv(w.p, w.type, w.row_bytes, x, y, rows, in, out, ab ? tile->p : nullptr, s));
        return KV_OK;
    }
    if (w.type == KV_DT_F16 || w.type == KV_DT_BF16) { /* tensor cores, FP32 accumulation */
        cudaDataType_t dt = w.type == KV_DT_F16 ? CUDA_R_16F : CUDA_R_16BF;
        int rc = grow(tile, (size_t)rows * in * 2, who, err);
        if (rc) return rc;
        MM_CK(kvcu::to_16(x, tile->p, (size_t)rows * in, w.type, s));
        MM_CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w.p, dt, in,
                            tile->p, dt, in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
        return KV_OK;
    }
    /* block types: dequantise a tile of rows, multiply it in fp32 (the tile buffer is reused
     * in stream order: the next tile's kernel runs after this GEMM) */
    int n_tile = (int)(kTileFloats / (size_t)in);
    if (n_tile < 1) n_tile = 1;
    if (n_tile > out) n_tile = out;
    int rc = grow(tile, (size_t)n_tile * in * sizeof(float), who, err);
    if (rc) return rc;
    float *t = static_cast<float *>(tile->p);
    for (int o0 = 0; o0 < out; o0 += n_tile) {
        int m = out - o0 < n_tile ? out - o0 : n_tile;
        MM_CK(kvcu::dequant_rows(w.p, w.type, w.row_bytes, in, o0, m, t, s));
        MM_CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, rows, in, &one, t, CUDA_R_32F, in, x,
                            CUDA_R_32F, in, &zero, y + o0, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    }
    return KV_OK;
}

} // namespace kvcu
