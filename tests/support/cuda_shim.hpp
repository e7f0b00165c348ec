/* Test-only host shim for kvplan's CUDA kernel bodies (cuda/kernels/): runs a kernel's grid on
 * the CPU so that every kernel can be checked against the CPU backend on a machine without a
 * GPU.
 *
 * Model (CUDA C++ Programming Guide, "Thread Hierarchy", "Shared Memory", "Warp Shuffle
 * Functions"): the blocks of a grid run one after another; the threads of one block are host
 * fibers (each with its own stack, scheduled cooperatively on the calling thread, see
 * cuda_shim.cpp) that share
 *   - static shared memory (KV_SHARED_ARRAY: each thread makes the same declarations in the
 *     same order, so the same offset in the block's 48 KiB area names the same array),
 *   - dynamic shared memory (the launch's `dyn_shared` bytes),
 *   - a barrier of all the block's threads (__syncthreads),
 *   - per warp of 32 threads, an exchange buffer and a barrier of the warp (shuffles: each
 *     lane publishes its value, the warp waits, each lane reads its source lane; consecutive
 *     shuffles alternate between two buffers so one barrier per shuffle suffices).
 * A kernel that breaks CUDA's rules (a barrier or shuffle not reached by all threads) is
 * reported as a deadlock and aborts the test.
 *
 * Include this before cuda/kernels/kv_kernels.cuh. One launch at a time, from one host thread.
 */
#ifndef KVPLAN_TESTS_CUDA_SHIM_HPP
#define KVPLAN_TESTS_CUDA_SHIM_HPP

#define KV_HOST_SHIM 1

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

/* What threadIdx/blockIdx/blockDim/gridDim say to the calling shim thread. */
struct kv_shim_thread_ctx {
    int tid, bid, bid_y, bdim, gdim;
};

const kv_shim_thread_ctx &kv_shim_self();
void kv_shim_syncthreads();
/* `bytes` of the block's static shared area (16-byte aligned), at the calling thread's next
 * offset. Aborts with a message when the 48 KiB of static shared memory are exceeded. */
void *kv_shim_static_shared(size_t bytes);
/* The launch's dynamic shared memory of the calling thread's block. */
void *kv_shim_dynamic_shared();
/* Publish `bits` for the caller's lane and return the bits lane `src` published. */
uint64_t kv_shim_warp_exchange(uint64_t bits, int src);

template <typename T> T kv_shim_shfl_from(T v, int src) {
    static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable<T>::value,
                  "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    bits = kv_shim_warp_exchange(bits, src);
    T r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}

/* __shfl_xor_sync(0xffffffff, v, m): the value of lane (lane ^ m). */
template <typename T> T kv_shim_shfl_xor(T v, int m) {
    int lane = kv_shim_self().tid & 31;
    return kv_shim_shfl_from(v, (lane ^ m) & 31);
}

/* __shfl_down_sync(0xffffffff, v, d): the value of lane + d, or the caller's own value when
 * lane + d is past the warp. */
template <typename T> T kv_shim_shfl_down(T v, int d) {
    int lane = kv_shim_self().tid & 31;
    return kv_shim_shfl_from(v, lane + d < 32 ? lane + d : lane);
}

/* Run `body` as the kernel <<<dim3(grid_x, grid_y), block, dyn_shared>>>: for each block,
 * `block` host threads call body() with their own thread context. Blocks run one after
 * another in a shuffled order (CUDA promises no order; a kernel that depends on one gives a
 * wrong result here), and every block starts with its static and dynamic shared memory
 * filled with 0xFF bytes (NaN floats), as nothing in CUDA initialises it. block must be a
 * positive multiple of 32, at most 1024; grid_x, grid_y >= 1; static + dynamic shared memory
 * at most 48 KiB, CUDA's limit for a kernel that did not opt in (kv_shim_launch_limited takes
 * the opted-in limit, cudaFuncAttributeMaxDynamicSharedMemorySize). Returns 0, or -1 (with a
 * message on stderr) for a bad configuration; nothing runs then. A kernel whose static shared
 * arrays exceed the limit at run time aborts with a message. */
int kv_shim_launch(int grid_x, int grid_y, int block, size_t dyn_shared,
                   const std::function<void()> &body);
int kv_shim_launch_limited(int grid_x, int grid_y, int block, size_t dyn_shared,
                           size_t shared_limit, const std::function<void()> &body);

#endif
