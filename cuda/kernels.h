/* Internal to cuda/: launchers of the layer kernels (cuda/kernels/kv_kernels.cuh) on a
 * stream. Pointers are device pointers; shapes and semantics are those of the kernels. Each
 * returns the launch's cudaError_t (cudaGetLastError after the launch), never exits.
 * C++ only (nvcc); the C face of the CUDA backend is include/kvplan/kvcuda.h. */
#ifndef KVPLAN_CUDA_KERNELS_H
#define KVPLAN_CUDA_KERNELS_H

#include "kernels/kv_tasks.h"

#include <cuda_runtime.h>

namespace kvcu {

/* Threads per block of every kernel; a multiple of 32 as the kernels require. */
constexpr int kThreads = 128;

cudaError_t rmsnorm(float *out, const float *x, const int *idx, const float *w, int rows, int dim,
                    float eps, cudaStream_t s);
cudaError_t rope(float *x, int rows, int row_stride, int n_heads, int hd, const int *pos,
                 const float *cos_t, const float *sin_t, int layout, cudaStream_t s);
cudaError_t swiglu(float *gate, const float *up, size_t n, cudaStream_t s);
cudaError_t add(float *x, const float *y, size_t n, cudaStream_t s);
cudaError_t add_bias(float *y, const float *b, int rows, int n, cudaStream_t s);
cudaError_t gather_rows(float *out, const float *src, const int *idx, int rows, int dim,
                        cudaStream_t s);
cudaError_t append(float *pool, int *slot_pos, float *slot_acc, float *slot_acc2, const int *tables,
                   const kv_attn_task *tasks, int n_tasks, const float *k, const float *v,
                   int kv_stride, const int *row_pos, int hd, int bs, cudaStream_t s);
/* scratch: n_tasks * g * scratch_stride floats. */
cudaError_t paged_attention(const float *pool, const int *tables, const kv_attn_task *tasks,
                            int n_tasks, const int *slot_pos, float *slot_acc, float *slot_acc2,
                            int track_stats, const float *q, float *o, int q_stride, int g, int hd,
                            int bs, float *scratch, int scratch_stride, cudaStream_t s);
cudaError_t compact(float *pool, int *slot_pos, float *slot_acc, float *slot_acc2,
                    const int *tables, const kv_move_task *tasks, int n_tasks, const int *moves,
                    int hd, int bs, cudaStream_t s);
/* dst[i] = (float)src[i] for F16 / BF16 weights (uploaded as they are, widened where an op
 * needs fp32, e.g. the token embedding rows). */
cudaError_t widen_f16(float *dst, const void *src, size_t n, cudaStream_t s);
cudaError_t widen_bf16(float *dst, const void *src, size_t n, cudaStream_t s);

} // namespace kvcu

#endif
