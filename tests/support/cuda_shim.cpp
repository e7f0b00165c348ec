/* Host shim for CUDA kernel bodies (tests only): see cuda_shim.hpp.
 *
 * Each CUDA thread of a block is a host fiber (its own stack, switched in user space) on the
 * calling thread. A scheduler resumes every runnable fiber in thread order; a fiber runs until
 * it reaches a barrier (__syncthreads or a warp shuffle's warp barrier) or returns. A block
 * barrier releases when every thread of the block waits at it, a warp barrier when the warp's
 * 32 threads wait at it. When nothing can run and some thread has not returned, the kernel
 * broke CUDA's rules (a barrier not reached by all threads): the shim says so and aborts.
 * Fibers rather than OS threads make the cost of a barrier a few context switches in user
 * space, independent of how loaded the machine is, and the schedule deterministic (each thread
 * runs as far as it can before the next starts, which exposes a missing barrier as a wrong
 * result).
 *
 * The switch. On x86-64 (ELF) a fiber switch is kv_shim_ctx_switch below: it saves the
 * callee-saved registers of the System V ABI (rbx, rbp, r12-r15, the MXCSR and x87 control
 * words) on the current stack, stores the stack pointer, loads the other fiber's and restores
 * its registers: about 20 instructions, no system call. Elsewhere (or with -DKV_SHIM_UCONTEXT)
 * a fiber starts with makecontext/setcontext and later switches use _setjmp/_longjmp.
 *
 * AddressSanitizer. Every switch is announced with __sanitizer_start_switch_fiber /
 * __sanitizer_finish_switch_fiber, so ASan knows which stack is running (its reports, stack
 * traces and fake stacks stay right inside kernel bodies). The assembler switch is not
 * intercepted by ASan. The ucontext fallback under ASan switches with swapcontext, whose
 * interceptor clears the shadow of the whole target stack on every switch: with 512 KiB stacks
 * that is an mmap + madvise of 64 KiB of shadow per switch (47-60 us per switch measured on a
 * 2-core x86-64 VM with 128-thread blocks, against under a microsecond for the assembler
 * switch with its annotations). Fiber stacks are mapped once per process (a pool that grows
 * to the largest block launched, one PROT_NONE guard page below each stack so an overflow
 * faults instead of writing over the next stack) and reused by every launch: a fiber that
 * returned has left its stack's shadow clean, as every instrumented frame unpoisons itself
 * on return. */
#include "cuda_shim.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KV_SHIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_SHIM_ASAN 1
#endif
#endif
#if defined(KV_SHIM_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && defined(__ELF__) && !defined(KV_SHIM_UCONTEXT)
#define KV_SHIM_ASM 1
#else
#include <setjmp.h>
#include <ucontext.h>
#endif

#if defined(KV_SHIM_ASM)
/* kv_shim_ctx_switch(save, to): push the callee-saved registers and the MXCSR / x87 control
 * words on the current stack, store the stack pointer in *save, switch to the stack pointer
 * `to` (saved by an earlier switch, or laid out by fiber_prepare) and pop the same set from
 * it; `ret` continues where that stack's owner called kv_shim_ctx_switch (or, for a fresh
 * fiber, enters kv_shim_fiber_entry). */
asm(R"(
    .text
    .p2align 4
    .globl kv_shim_ctx_switch
    .hidden kv_shim_ctx_switch
    .type kv_shim_ctx_switch, @function
kv_shim_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kv_shim_ctx_switch, .-kv_shim_ctx_switch
    .section .note.GNU-stack, "", @progbits
    .text
)");
extern "C" void kv_shim_ctx_switch(void **save, void *to);
extern "C" [[noreturn]] void kv_shim_fiber_entry();
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
#if defined(KV_SHIM_ASM)
    void *sp; /* saved stack pointer while the fiber is not running */
#else
    ucontext_t ctx;
    jmp_buf jb;
    bool started;
#endif
    unsigned char *stack; /* kStack bytes from the pool, lowest address */
    fiber_state state;
    kv_shim_thread_ctx self;
    size_t static_off;
    int parity;
};

/* The launch being run (one at a time; tests launch from one thread). */
struct shim_launch {
#if defined(KV_SHIM_ASM)
    void *sched_sp;
#else
    ucontext_t sched;
    jmp_buf sched_jb;
#endif
#if defined(KV_SHIM_ASAN)
    const void *sched_bottom; /* the scheduler's (calling thread's) stack, for ASan */
    size_t sched_size;
#endif
    std::vector<fiber> fibers;
    std::vector<uint64_t> xchg; /* [2][threads] shuffle exchange slots */
    std::unique_ptr<std::max_align_t[]> static_mem, dyn_mem;
    const std::function<void()> *body;
    fiber *cur;
    size_t dyn_bytes, limit; /* dynamic shared bytes; static + dynamic limit */
};

shim_launch *g_run; /* the launch in progress, NULL outside kv_shim_launch */

[[noreturn]] void shim_die(const char *what) {
    std::fprintf(stderr, "cuda shim: %s\n", what);
    std::abort();
}

/* The fiber stacks: mapped on first use, kept for the process (fibers of every launch reuse
 * them; the kernel unmaps them at exit). Each is a guard page followed by kStack bytes. */
struct stack_pool {
    std::vector<unsigned char *> stacks;
    unsigned char *get(size_t i) {
        while (stacks.size() <= i) {
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            void *m = mmap(nullptr, page + kStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED) shim_die("out of memory for fiber stacks");
            if (mprotect(m, page, PROT_NONE)) shim_die("mprotect of a stack guard page failed");
            stacks.push_back(static_cast<unsigned char *>(m) + page);
        }
        return stacks[i];
    }
};

stack_pool &pool() {
    static stack_pool p;
    return p;
}

/* ASan: announce a switch to the stack [bottom, bottom + size); *fake_save keeps the fake
 * stack of the stack being left (nullptr: that stack is finished). */
inline void asan_leave(void **fake_save, const void *bottom, size_t size) {
#if defined(KV_SHIM_ASAN)
    __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
    (void)fake_save, (void)bottom, (void)size;
#endif
}

inline void asan_arrive(void *fake) {
#if defined(KV_SHIM_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    (void)fake;
#endif
}

inline const void *sched_bottom() {
#if defined(KV_SHIM_ASAN)
    return g_run->sched_bottom;
#else
    return nullptr;
#endif
}

inline size_t sched_size() {
#if defined(KV_SHIM_ASAN)
    return g_run->sched_size;
#else
    return 0;
#endif
}

/* Switch from the current fiber back to the scheduler. */
void yield_to_scheduler() {
    fiber *f = g_run->cur;
    void *fake = nullptr;
    asan_leave(&fake, sched_bottom(), sched_size());
#if defined(KV_SHIM_ASM)
    kv_shim_ctx_switch(&f->sp, g_run->sched_sp);
#elif defined(KV_SHIM_ASAN)
    swapcontext(&f->ctx, &g_run->sched);
#else
    if (!_setjmp(f->jb)) _longjmp(g_run->sched_jb, 1);
#endif
    asan_arrive(fake);
}

/* A fiber's first code: run the body, then hand the stack back for good. */
[[noreturn]] void fiber_run() {
#if defined(KV_SHIM_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &g_run->sched_bottom, &g_run->sched_size);
#endif
    (*g_run->body)();
    fiber *f = g_run->cur;
    f->state = DONE;
    asan_leave(nullptr, sched_bottom(), sched_size()); /* this fiber's stack is finished */
#if defined(KV_SHIM_ASM)
    kv_shim_ctx_switch(&f->sp, g_run->sched_sp);
#elif defined(KV_SHIM_ASAN)
    setcontext(&g_run->sched);
#else
    _longjmp(g_run->sched_jb, 1);
#endif
    shim_die("a finished fiber was resumed");
}

#if !defined(KV_SHIM_ASM)
void fiber_main() {
    fiber_run();
}
#endif

/* Make fiber f start at fiber_run on its stack when it is next resumed. */
void fiber_prepare(fiber &f) {
#if defined(KV_SHIM_ASM)
    /* the frame kv_shim_ctx_switch pops, from the saved stack pointer up: MXCSR and x87
     * control word (the caller's), r15, r14, r13, r12, rbx, rbp (0: the end of the frame
     * chain for unwinders), the return address (the entry), and a 0 where the entry's own
     * return address would be: at the entry the stack pointer is 8 mod 16, as after a call */
    uint64_t *top = reinterpret_cast<uint64_t *>(f.stack + kStack); /* 16-byte aligned */
    uint64_t *sp = top - 10;
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
    sp[1] = 0;
    for (int r = 2; r < 8; r++) sp[r] = 0; /* r15 .. rbp */
    sp[8] = (uint64_t)(uintptr_t)&kv_shim_fiber_entry;
    sp[9] = 0;
    f.sp = sp;
#else
    f.started = false;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}

/* Resume fiber f until it waits or returns. */
void resume(fiber *f) {
    g_run->cur = f;
    void *fake = nullptr;
    asan_leave(&fake, f->stack, kStack);
#if defined(KV_SHIM_ASM)
    kv_shim_ctx_switch(&g_run->sched_sp, f->sp);
#elif defined(KV_SHIM_ASAN)
    swapcontext(&g_run->sched, &f->ctx);
#else
    if (!_setjmp(g_run->sched_jb)) {
        if (!f->started) {
            f->started = true;
            setcontext(&f->ctx);
        }
        _longjmp(f->jb, 1);
    }
#endif
    asan_arrive(fake);
    g_run->cur = nullptr;
}

} // namespace

#if defined(KV_SHIM_ASM)
extern "C" void kv_shim_fiber_entry() {
    fiber_run();
}
#endif

namespace {

/* Run one block to completion. */
void run_block(shim_launch &L, int bx, int by, int gx) {
    int n = (int)L.fibers.size();
    for (int t = 0; t < n; t++) {
        fiber &f = L.fibers[(size_t)t];
        f.state = RUN;
        f.self = kv_shim_thread_ctx{t, bx, by, n, gx};
        f.static_off = 0;
        f.parity = 0;
        fiber_prepare(f);
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
    for (size_t t = 0; t < (size_t)block; t++) L.fibers[t].stack = pool().get(t);
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
