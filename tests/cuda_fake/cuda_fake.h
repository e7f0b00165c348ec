/* Control face of the fake CUDA runtime (tests/cuda_fake/include/cuda_runtime.h,
 * cublas_v2.h; implemented in fake_runtime.cpp). Tests only: the fake lets the real
 * cuda/backend_cuda.cu and cuda/kvpr_cuda.cu run on a machine without a GPU, with the
 * semantics that make their bugs visible:
 *   - streams are deferred queues: nothing queued runs until the host forces it
 *     (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaMemcpy, a
 *     cudaMemcpyAsync to pageable host memory, a blocking cudaEventElapsedTime), and then
 *     only as far as needed;
 *   - cudaStreamWaitEvent orders a stream after the event's record on another stream (the
 *     only cross-stream ordering; streams are non-blocking);
 *   - a copy from pinned host memory reads it when the copy runs (so rewriting a pinned
 *     buffer before its copy ran is visible); a copy from pageable memory reads it at the call;
 *   - device and pinned allocations start filled with NaN (0xFF bytes), so a read of
 *     something never written poisons the result;
 *   - copies must stay inside live allocations of the right kind, else cudaErrorInvalidValue;
 *   - the Nth cudaMalloc / cudaHostAlloc / GEMM can be made to fail;
 *   - counters of what the host asked for.
 * In count-only mode (kvfake_set_count_only) device memory is address space only and no copy,
 * kernel or GEMM runs: the counters of a model too large for this machine.
 * The fake's state is one context (one fake process-wide device), reset by kvfake_reset. */
#ifndef KVPLAN_TESTS_CUDA_FAKE_H
#define KVPLAN_TESTS_CUDA_FAKE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvfake_counters {
    long syncs;           /* host waits: stream/event/device syncs, blocking copies */
    long launches;        /* kernel launches */
    long gemms;           /* cublasGemmEx calls */
    long h2d_copies;      /* host-to-device copies */
    double h2d_bytes;     /* bytes host -> device */
    double d2h_bytes;     /* bytes device -> host */
    double gemm_bytes;    /* A, B and C bytes the GEMMs read and write (a lower bound of traffic) */
    double kernel_blocks; /* blocks over all launches */
    long mallocs;         /* cudaMalloc calls (successful or not) */
    long host_allocs;     /* cudaHostAlloc / cudaMallocHost calls */
    size_t device_live;   /* device bytes allocated now */
    size_t device_peak;   /* the most device bytes allocated at once */
    size_t pinned_live;   /* pinned host bytes allocated now */
    long last_grid;       /* blocks of the most recent launch named by kvfake_watch_grid */
} kvfake_counters;

typedef enum kvfake_fault {
    KVFAKE_MALLOC = 0,     /* cudaMalloc -> cudaErrorMemoryAllocation */
    KVFAKE_HOST_ALLOC = 1, /* cudaHostAlloc / cudaMallocHost -> cudaErrorMemoryAllocation */
    KVFAKE_GEMM = 2,       /* cublasGemmEx -> CUBLAS_STATUS_EXECUTION_FAILED */
} kvfake_fault;

/* Forget every allocation record, stream and event, zero the counters and faults; count-only
 * off. Call between tests, after everything made on the fake was freed. */
void kvfake_reset(void);
/* Make the nth call (1-based, counted from now) of `kind` fail; n = 0 disarms it. */
void kvfake_fail_nth(kvfake_fault kind, long n);
/* Calls of `kind` since the last kvfake_reset (successful or not). */
long kvfake_calls(kvfake_fault kind);
/* The counters so far (a copy). */
kvfake_counters kvfake_get(void);
/* Zero the traffic counters (syncs .. kernel_blocks); allocation state stays. */
void kvfake_zero_traffic(void);
/* Count-only mode on (1) or off (0); see above. Only at reset state. */
void kvfake_set_count_only(int on);
/* Device memory capacity in bytes (default 80 GiB): a cudaMalloc beyond it fails. */
void kvfake_set_capacity(size_t bytes);
/* The grid of launches of kernels whose host function is `func` is kept in last_grid. */
void kvfake_watch_grid(const void *func);
/* Watch a second kernel too (its grid also lands in last_grid). */
void kvfake_watch_grid2(const void *func);
/* The attention kernel (cuda/kernels/kv_kernels.cuh) as the fake sees its launches:
 * kv_k_paged_attention (split 0) or the split decode kernel kv_k_decode_split (split 1). */
const void *kvfake_paged_attention_kernel(int split);
/* The flash-decoding kernel (kv_k_flash_decode) a decode step launches for K/V type kv_type
 * (kv_cache_type) and head dimension hd, for kvfake_watch_grid. */
const void *kvfake_flash_decode_kernel(int kv_type, int hd);
/* The tiled prefill kernel (kv_k_prefill_tiled) a prefill of f16 heads launches at head
 * dimension hd (16, 32, 64, 128), for kvfake_watch_grid. */
const void *kvfake_prefill_tiled_kernel(int hd);
/* Its statistics pass (kv_k_prefill_stats) at head dimension hd, for kvfake_watch_grid. */
const void *kvfake_prefill_stats_kernel(int hd);
/* Attention of one task (one entry, f32 pool, block size 16) for a GQA group of g query heads
 * of hd dims through the launchers (cuda/kernels.h paged_attention, or with split
 * decode_attention_split with one chunk); *max_err = max |o - v| over the group (an exact 0
 * when right). Returns the launch's cudaError_t as an int (0: success). */
int kvfake_probe_wide_group(int g, int hd, int split, double *max_err);
/* The fake device's SM count (cudaDeviceProp.multiProcessorCount): 132, an H100 SXM. */
int kvfake_sm_count(void);

#ifdef __cplusplus
}
#endif
#endif
