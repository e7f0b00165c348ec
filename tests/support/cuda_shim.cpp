/* Host shim for CUDA kernel bodies (tests only): see cuda_shim.hpp.
 *
 * Each CUDA thread of a block is a host fiber (POSIX ucontext: its own stack, switched by
 * swapcontext) on the calling thread. A scheduler resumes every runnable fiber in thread
 * order; a fiber runs until it reaches a barrier (__syncthreads or a warp shuffle's warp
 * barrier) or returns. A block barrier releases when every thread of the block waits at it,
 * a warp barrier when the warp's 32 threads wait at it. When nothing can run and some thread
 * has not returned, the kernel broke CUDA's rules (a barrier not reached by all threads):
 * the shim says so and aborts. Fibers rather than OS threads make the cost of a barrier a
 * few context switches in user space, independent of how loaded the machine is, and the
 * schedule deterministic (each thread runs as far as it can before the next starts, which
 * exposes a missing barrier as a wrong result). A fiber starts with setcontext on its own
 * stack; later switches use _setjmp/_longjmp, which (unlike swapcontext) do not save the
 * signal mask with a system call. Under AddressSanitizer every switch is swapcontext, annotated
 * with ASan's fiber-switch calls. */
#include "cuda_shim.hpp"

#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define KV_SHIM_ASAN 1
#endif

namespace {

constexpr size_t kStaticShared = 48 * 1024; /* CUDA's static + dynamic limit without opt-in */
constexpr size_t kMaxShared = 227 * 1024;   /* the most a kernel can opt into (sm_90) */
#if defined(KV_SHIM_ASAN)
constexpr size_t kStack = 512 * 1024; /* ASan's redzones need room */
#else
constexpr size_t kStack = 128 * 1024;
#endif

enum fiber_state { RUN, WAIT_BLOCK, WAIT_WARP, DONE };

struct fiber {
    ucontext_t ctx;
    jmp_buf jb;
    bool started;
    std::unique_ptr<unsigned char[]> stack;
    fiber_state state;
    kv_shim_thread_ctx self;
    size_t static_off;
    int parity;
};

/* The launch being run (one at a time; tests launch from one thread). */
struct shim_launch {
    ucontext_t sched;
    jmp_buf sched_jb;
    std::vector<fiber> fibers;
    std::vector<uint64_t> xchg; /* [2][threads] shuffle exchange slots */
    std::unique_ptr<std::max_align_t[]> static_mem, dyn_mem;
    const std::function<void()> *body;
    fiber *cur;
    size_t dyn_bytes, limit; /* dynamic shared bytes; static + dynamic limit */
#if defined(KV_SHIM_ASAN)
    void *fake_stack;
#endif
};

shim_launch *g_run; /* the launch in progress, NULL outside kv_shim_launch */

[[noreturn]] void shim_die(const char *what) {
    std::fprintf(stderr, "cuda shim: %s\n", what);
    std::abort();
}

/* Switch from the current fiber back to the scheduler. */
void yield_to_scheduler() {
    fiber *f = g_run->cur;
#if defined(KV_SHIM_ASAN)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, nullptr, 0);
    swapcontext(&f->ctx, &g_run->sched);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    if (!_setjmp(f->jb)) _longjmp(g_run->sched_jb, 1);
#endif
}

void fiber_main() {
#if defined(KV_SHIM_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    (*g_run->body)();
    g_run->cur->state = DONE;
#if defined(KV_SHIM_ASAN)
    __sanitizer_start_switch_fiber(nullptr, nullptr, 0); /* this fiber's stack is finished */
    setcontext(&g_run->sched);
#else
    _longjmp(g_run->sched_jb, 1);
#endif
}

/* Resume fiber f until it waits or returns. */
void resume(fiber *f) {
    g_run->cur = f;
#if defined(KV_SHIM_ASAN)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack.get(), kStack);
    swapcontext(&g_run->sched, &f->ctx);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    if (!_setjmp(g_run->sched_jb)) {
        if (!f->started) {
            f->started = true;
            setcontext(&f->ctx);
        }
        _longjmp(f->jb, 1);
    }
#endif
    g_run->cur = nullptr;
}

/* Run one block to completion. */
void run_block(shim_launch &L, int bx, int by, int gx) {
    int n = (int)L.fibers.size();
    for (int t = 0; t < n; t++) {
        fiber &f = L.fibers[(size_t)t];
        f.state = RUN;
        f.self = kv_shim_thread_ctx{t, bx, by, n, gx};
        f.static_off = 0;
        f.parity = 0;
        f.started = false;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.get();
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
    }
    for (;;) {
        int ran = 0, done = 0, at_block = 0;
        for (fiber &f : L.fibers)
            if (f.state == RUN) {
                resume(&f);
                ran = 1;
            }
        for (fiber &f : L.fibers) {
            done += f.state == DONE;
            at_block += f.state == WAIT_BLOCK;
        }
        if (done == n) return;
        int released = 0;
        if (at_block == n) {
            for (fiber &f : L.fibers) f.state = RUN;
            released = 1;
        }
        for (int w = 0; w < n / 32; w++) {
            int waiting = 0;
            for (int l = 0; l < 32; l++)
                waiting += L.fibers[(size_t)(w * 32 + l)].state == WAIT_WARP;
            if (waiting == 32) {
                for (int l = 0; l < 32; l++) L.fibers[(size_t)(w * 32 + l)].state = RUN;
                released = 1;
            }
        }
        if (!released && !ran)
            shim_die("deadlock: a barrier or shuffle was not reached by every thread it needs");
        if (!released && ran) {
            /* everything that could run did, and no barrier opened */
            int runnable = 0;
            for (fiber &f : L.fibers) runnable += f.state == RUN;
            if (!runnable)
                shim_die("deadlock: a barrier or shuffle was not reached by every thread it "
                         "needs");
        }
    }
}

} // namespace

const kv_shim_thread_ctx &kv_shim_self() {
    return g_run->cur->self;
}

void kv_shim_syncthreads() {
    g_run->cur->state = WAIT_BLOCK;
    yield_to_scheduler();
}

void *kv_shim_static_shared(size_t bytes) {
    fiber *f = g_run->cur;
    size_t off = (f->static_off + 15) / 16 * 16;
    if (off + bytes + g_run->dyn_bytes > g_run->limit)
        shim_die("static + dynamic shared memory beyond the kernel's limit (48 KiB unless the "
                 "launcher opted in)");
    f->static_off = off + bytes;
    unsigned char *p = reinterpret_cast<unsigned char *>(g_run->static_mem.get()) + off;
    /* thread 0 runs first in every block: it poisons the array before anyone writes it */
    if (f->self.tid == 0) std::memset(p, 0xff, bytes);
    return p;
}

void *kv_shim_dynamic_shared() {
    return g_run->dyn_mem.get();
}

/* One barrier per shuffle: shuffles alternate between two halves of the exchange buffer.
 * A lane writes half h for shuffle k only after the barrier of shuffle k-1, which every lane
 * passes only after it has read half h for shuffle k-2. */
uint64_t kv_shim_warp_exchange(uint64_t bits, int src) {
    fiber *f = g_run->cur;
    int tid = f->self.tid, w = tid / 32;
    uint64_t *half = g_run->xchg.data() + (size_t)f->parity * (size_t)f->self.bdim;
    f->parity ^= 1;
    half[tid] = bits;
    f->state = WAIT_WARP;
    yield_to_scheduler();
    return half[w * 32 + src];
}

int kv_shim_launch(int grid_x, int grid_y, int block, size_t dyn_shared,
                   const std::function<void()> &body) {
    return kv_shim_launch_limited(grid_x, grid_y, block, dyn_shared, kStaticShared, body);
}

int kv_shim_launch_limited(int grid_x, int grid_y, int block, size_t dyn_shared,
                           size_t shared_limit, const std::function<void()> &body) {
    if (grid_x < 1 || grid_y < 1 || block < 32 || block > 1024 || block % 32 ||
        shared_limit > kMaxShared || dyn_shared > shared_limit) {
        std::fprintf(stderr, "cuda shim: bad launch <<<(%d, %d), %d, %zu>>> (shared limit %zu)\n",
                     grid_x, grid_y, block, dyn_shared, shared_limit);
        return -1;
    }
    if (g_run) shim_die("nested launch");
    size_t words = (dyn_shared + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
    shim_launch L;
    L.fibers.resize((size_t)block);
    for (fiber &f : L.fibers) f.stack.reset(new unsigned char[kStack]);
    L.xchg.assign(2 * (size_t)block, 0);
    L.static_mem.reset(new std::max_align_t[kMaxShared / sizeof(std::max_align_t)]);
    L.dyn_mem.reset(new std::max_align_t[words ? words : 1]);
    L.body = &body;
    L.cur = nullptr;
    L.dyn_bytes = dyn_shared;
    L.limit = shared_limit;
    g_run = &L;
    /* blocks one after another in a shuffled order (Fisher-Yates with a fixed-seed xorshift, so
     * a failure reproduces), shared memory poisoned before each */
    size_t n_blocks = (size_t)grid_x * (size_t)grid_y;
    std::vector<size_t> order(n_blocks);
    for (size_t i = 0; i < n_blocks; i++) order[i] = i;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)n_blocks;
    for (size_t i = n_blocks; i > 1; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::swap(order[i - 1], order[(size_t)(x % i)]);
    }
    for (size_t i : order) {
        std::memset(L.dyn_mem.get(), 0xff, dyn_shared); /* static arrays: kv_shim_static_shared */
        run_block(L, (int)(i % (size_t)grid_x), (int)(i / (size_t)grid_x), grid_x);
    }
    g_run = nullptr;
    return 0;
}
