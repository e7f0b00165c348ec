/* Internal to cuda/: launchers of the layer kernels (cuda/kernels/kv_kernels.cuh) on a
 * stream. Pointers are device pointers; shapes and semantics are those of the kernels. Each
 * returns the launch's cudaError_t (cudaGetLastError after the launch), never exits.
 * C++ only (nvcc); the C face of the CUDA backend is runtime/backend/kvcuda.h. */
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
/* K/V rows encoded in their block's stored type (pool: the typed pool's device view); with
 * per-slot metadata (pool.pos) each slot's position from row_pos [rows] and zero sums. */
cudaError_t cache_write(const kv_k_pool &pool, const kv_k_write *writes, int n, const float *k,
                        const float *v, int kv_stride, const int *row_pos, cudaStream_t s);
/* scratch: n_tasks * g * scratch_stride floats. K/V read in their stored type. */
cudaError_t paged_attention(const kv_k_pool &pool, const int *tables, const kv_k_attn_task *tasks,
                            int n_tasks, const int *pos, float *acc, float *acc2, const float *q,
                            float *o, int q_stride, int g, float *scratch, int scratch_stride,
                            cudaStream_t s);
/* Split-sequence decode attention (kv_k_split_plan): kv_k_decode_split over (n_tasks,
 * chunks) blocks, then kv_k_decode_merge into o, and, when acc is not NULL, kv_k_decode_stats
 * (the statistics of the tracked tasks; pos, acc, acc2 as for paged_attention). Every task
 * must have n = 1. part: n_tasks * chunks * g * (hd + 2) floats of device scratch. */
cudaError_t decode_attention_split(const kv_k_pool &pool, const int *tables,
                                   const kv_k_attn_task *tasks, int n_tasks, const float *q,
                                   float *o, int q_stride, int g, int chunk, int chunks,
                                   float *scratch, int scratch_stride, float *part, const int *pos,
                                   float *acc, float *acc2, cudaStream_t s);
/* Flash-decoding (kernels/kv_flash.cuh kv_k_flash_decode): usable when g <= KV_K_FD_GROUP,
 * d_h is a multiple of 8 up to 256 and the block size bs a power of two. Every task must have n =
 * 1; partitions of `part` entries, `parts` of them (the longest task's); types: bit t set when some
 * task's K/V type is t (one launch per type). Then kv_k_decode_merge into o and, when acc is not
 * NULL, kv_k_decode_stats_raw (raw scores in scratch: n_tasks * g * scratch_stride floats).
 * part_buf: n_tasks * parts * g * (hd + 2) floats. */
bool flash_decode_fits(int g, int hd, int bs);
cudaError_t flash_decode(const kv_k_pool &pool, const int *tables, const kv_k_attn_task *tasks,
                         int n_tasks, const float *q, float *o, int q_stride, int g, int part,
                         int parts, unsigned types, float *scratch, int scratch_stride,
                         float *part_buf, const int *pos, float *acc, float *acc2, cudaStream_t s);
/* Tiled prefill attention (kernels/kv_prefill.cuh): usable when d_h is 16, 32, 64 or 128 and
 * every task's heads are f16. kv_k_prefill_tiled over (n_tasks, ceil(max_rows / 64)) blocks
 * (max_rows: the largest n * g of the tasks) into o, and, when acc is not NULL,
 * kv_k_prefill_stats over (n_tasks, ceil(longest / 32)) blocks (longest: the largest len)
 * for the tracked tasks (pos, acc, acc2 as for paged_attention). ml: n_tasks * 2 * max_rows
 * floats of device scratch. Queries and P in binary16 (kv_prefill.cuh: the precision). */
bool prefill_tiled_fits(int hd);
cudaError_t prefill_tiled(const kv_k_pool &pool, const int *tables, const kv_k_attn_task *tasks,
                          int n_tasks, int max_rows, int longest, const float *q, float *o,
                          int q_stride, int g, float *ml, const int *pos, float *acc, float *acc2,
                          cudaStream_t s);
/* Weights in their type (kernels/kv_quant.cuh; W device bytes, rows of row_bytes bytes in
 * ggml type t). gemv: y [rows, out] = x [rows, in] W^T, rows <= KV_K_GEMV_ROWS. dequant_rows:
 * dst [n_rows, in] fp32 = rows r0 .. r0 + n_rows of W. to_16: dst [n] = x in binary16 (t F16)
 * or bfloat16 (t BF16). gather_rows_typed: out [rows, dim] = W rows idx[rows], dequantised. */
cudaError_t gemv(const void *W, int t, size_t row_bytes, const float *x, float *y, int rows, int in,
                 int out, void *act, cudaStream_t s);
/* Device scratch `act` that gemv needs for weights of type t at rows x in (0: none): the
 * activations quantised to 8 bits once per call for Q8_0 and Q4_0 (kv_k_quantize_q8, blocks of
 * 32) and Q4_K, Q6_K (kv_k_quantize_q8k, blocks of 256, in % 256 == 0). gemv's kernels: F16
 * (in % 8 == 0) kv_k_gemv_f16; Q8_0, Q4_0 kv_k_gemv_q and Q4_K, Q6_K kv_k_gemv_qk with dp4a
 * (given act);
 * every other type (and the block types without act) the generic kv_k_gemv. */
size_t gemv_act_bytes(int t, int rows, int in);
cudaError_t dequant_rows(const void *W, int t, size_t row_bytes, int in, int r0, int n_rows,
                         float *dst, cudaStream_t s);
cudaError_t to_16(const float *x, void *dst, size_t n, int t, cudaStream_t s);
cudaError_t gather_rows_typed(float *out, const void *W, int t, size_t row_bytes, const int *idx,
                              int rows, int dim, cudaStream_t s);
/* Resident block tables: tables[patch[2k]] = patch[2k + 1], k < n (device pointers). */
cudaError_t table_patch(int *tables, const int *patch, long n, cudaStream_t s);
/* One pass of kv_k_split_moves: moves [n] (device), scratch gather_scratch_bytes(n, hd) (two
 * rows of the widest type per move, then each move's pos / acc / acc2 when pool.pos). */
size_t gather_scratch_bytes(int n, int hd);
/* The evictions of one layer (kernels/kv_evict.cuh kv_k_evict, one block per record): ev [n]
 * and their block tables tab (device), score / mask scratch of (the records' table entries) *
 * bs floats / bytes. pool must carry per-slot metadata. */
constexpr size_t evict_shared_bytes(int hd) {
    return (size_t)KV_K_EV_CHUNK * 2 * 4 * (size_t)hd; /* K and V rows, f32 at most */
}
cudaError_t evict(const kv_k_pool &pool, const kv_evict *ev, int n, const int *tab, float *score,
                  unsigned char *mask, cudaStream_t s);
cudaError_t gather_pass(const kv_k_pool &pool, const kv_k_move *moves, int n, void *scratch,
                        cudaStream_t s);
} // namespace kvcu

#endif
