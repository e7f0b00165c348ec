/* Fake cuBLAS (tests only): the cuBLAS entry points kvplan's CUDA code calls (cuBLAS library
 * reference, "cublasGemmEx"), with cuBLAS's names and signatures. GEMMs are queued on the
 * handle's stream and run there as a naive loop with double accumulation (FP32, binary16 or
 * bfloat16 inputs widened exactly, FP32 output); see tests/cuda_fake/cuda_fake.h for fault
 * injection and counters. */
#ifndef KVPLAN_FAKE_CUBLAS_V2_H
#define KVPLAN_FAKE_CUBLAS_V2_H

#include "cuda_runtime.h"

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
};
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_PEDANTIC = 69 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;

struct kvfake_blas;
typedef kvfake_blas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
const char *cublasGetStatusString(cublasStatus_t s);
/* C = alpha op(A) op(B) + beta C, column-major; A and B both CUDA_R_32F, both CUDA_R_16F or
 * both CUDA_R_16BF, C CUDA_R_32F, alpha/beta float, CUBLAS_COMPUTE_32F(_PEDANTIC) (what cuBLAS
 * supports for an fp32 C); each operand must lie in one live device allocation. */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);

#endif
