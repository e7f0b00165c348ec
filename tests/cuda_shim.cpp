/* Host shim for CUDA kernel bodies (tests only): see cuda_shim.hpp. */
#include "cuda_shim.hpp"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace {

constexpr size_t kStaticShared = 48 * 1024; /* CUDA's static __shared__ limit per block */

/* One block's shared state. */
struct shim_block {
    pthread_barrier_t all;
    std::vector<pthread_barrier_t> warp; /* one per warp of 32 threads */
    std::vector<uint64_t> xchg;          /* [2][threads] shuffle exchange slots */
    std::unique_ptr<std::max_align_t[]> static_mem, dyn_mem;
};

thread_local kv_shim_thread_ctx t_ctx;
thread_local shim_block *t_blk;
thread_local size_t t_static_off;
thread_local int t_parity; /* which half of xchg the caller's next shuffle uses */

[[noreturn]] void shim_die(const char *what) {
    std::fprintf(stderr, "cuda shim: %s\n", what);
    std::abort();
}

} // namespace

const kv_shim_thread_ctx &kv_shim_self() {
    return t_ctx;
}

void kv_shim_syncthreads() {
    pthread_barrier_wait(&t_blk->all);
}

void *kv_shim_static_shared(size_t bytes) {
    size_t off = (t_static_off + 15) / 16 * 16;
    if (off + bytes > kStaticShared) shim_die("static shared memory beyond 48 KiB");
    t_static_off = off + bytes;
    return reinterpret_cast<unsigned char *>(t_blk->static_mem.get()) + off;
}

void *kv_shim_dynamic_shared() {
    return t_blk->dyn_mem.get();
}

/* One barrier per shuffle: shuffles alternate between two halves of the exchange buffer.
 * A lane writes half h for shuffle k only after the barrier of shuffle k-1, which every lane
 * passes only after it has read half h for shuffle k-2. */
uint64_t kv_shim_warp_exchange(uint64_t bits, int src) {
    int tid = t_ctx.tid, w = tid / 32;
    uint64_t *half = t_blk->xchg.data() + (size_t)t_parity * (size_t)t_ctx.bdim;
    t_parity ^= 1;
    half[tid] = bits;
    pthread_barrier_wait(&t_blk->warp[(size_t)w]);
    return half[w * 32 + src];
}

int kv_shim_launch(int grid_x, int grid_y, int block, size_t dyn_shared,
                   const std::function<void()> &body) {
    if (grid_x < 1 || grid_y < 1 || block < 32 || block > 1024 || block % 32) {
        std::fprintf(stderr, "cuda shim: bad launch <<<(%d, %d), %d>>>\n", grid_x, grid_y, block);
        return -1;
    }
    size_t words = (dyn_shared + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
    shim_block b;
    pthread_barrier_init(&b.all, nullptr, (unsigned)block);
    b.warp.resize((size_t)block / 32);
    for (auto &wb : b.warp) pthread_barrier_init(&wb, nullptr, 32);
    b.xchg.assign(2 * (size_t)block, 0);
    b.static_mem.reset(new std::max_align_t[kStaticShared / sizeof(std::max_align_t)]);
    b.dyn_mem.reset(new std::max_align_t[words ? words : 1]);
    /* One host thread per CUDA thread for the whole launch; they run the blocks in order and
     * meet at a barrier after each, so no block starts while another still uses the shared
     * state (blocks never run concurrently, which CUDA allows). */
    std::vector<std::thread> threads;
    threads.reserve((size_t)block);
    for (int t = 0; t < block; t++)
        threads.emplace_back([&, t] {
            t_blk = &b;
            for (int by = 0; by < grid_y; by++)
                for (int bx = 0; bx < grid_x; bx++) {
                    t_ctx = kv_shim_thread_ctx{t, bx, by, block, grid_x};
                    t_static_off = 0;
                    t_parity = 0;
                    body();
                    pthread_barrier_wait(&b.all);
                }
            t_blk = nullptr;
        });
    for (auto &th : threads) th.join();
    for (auto &wb : b.warp) pthread_barrier_destroy(&wb);
    pthread_barrier_destroy(&b.all);
    return 0;
}
