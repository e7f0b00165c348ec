/* Fake CUDA runtime and cuBLAS on the host (tests only): see cuda_fake.h for what it models.
 *
 * A stream is a queue of operations (copies, kernel grids on the host shim, GEMMs, event
 * records, waits on another stream's position). Nothing runs when queued; run_until(s, n)
 * runs stream s's first n operations, and a wait runs the other stream as far as the event it
 * waits for. An event remembers (stream, position) of its latest record: it is complete once
 * that stream has run that far. Device time is a modelled clock (copies at 25 GB/s, kernels
 * and GEMMs at a fixed cost plus their bytes at 3 TB/s) advanced as operations run, so event
 * timings are positive where work was timed and repeatable.
 *
 * All state lives in one context object (`g`), the fake device of the test process. */
#include "cuda_fake.h"

#include "include/cublas_v2.h"
#include "include/cuda_runtime.h"
#include "util/f16.h" /* binary16 / bfloat16 operands of the 16-bit GEMMs */

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <vector>

struct kvfake_stream {
    struct op {
        std::function<void()> run; /* empty for a wait */
        kvfake_stream *wait_on = nullptr;
        size_t wait_upto = 0;
        double cost = 0.0; /* modelled seconds */
    };
    std::deque<op> q;
    size_t base = 0; /* operations run so far (absolute index of q.front()) */
    bool alive = true;
    size_t queued() const {
        return base + q.size();
    }
};

struct kvfake_event {
    kvfake_stream *s = nullptr;
    size_t pos = 0;   /* complete when s->base >= pos */
    long seq = 0;     /* records so far */
    double time = -1; /* device clock when the latest record ran */
    bool timing = true, alive = true;
};

struct kvfake_blas {
    cudaStream_t s = nullptr;
    bool alive = true;
};

namespace {

enum mem_kind { DEVICE, PINNED };

struct alloc_rec {
    size_t bytes;
    mem_kind kind;
    void *owned; /* host memory behind it (nullptr in count-only mode for device memory) */
};

struct fake_ctx {
    std::map<uintptr_t, alloc_rec> mem;
    std::vector<std::unique_ptr<kvfake_stream>> streams;
    std::vector<std::unique_ptr<kvfake_event>> events;
    std::vector<std::unique_ptr<kvfake_blas>> blas;
    kvfake_stream null_stream;
    std::map<const void *, int> max_dyn; /* opted-in dynamic shared memory per kernel */
    kvfake_counters c{};
    long calls[3] = {0, 0, 0}, fail_at[3] = {0, 0, 0};
    bool count_only = false;
    size_t capacity = (size_t)80 << 30;
    uintptr_t next_fake = (uintptr_t)1 << 44; /* count-only device addresses */
    double clock = 0.0;
    const void *watch = nullptr, *watch2 = nullptr;
    cudaError_t last = cudaSuccess;
};

fake_ctx g;

constexpr double kCopyBw = 25e9, kDevBw = 3e12, kLaunch = 4e-6;

bool fault(kvfake_fault k) {
    g.calls[k]++;
    return g.fail_at[k] && g.calls[k] == g.fail_at[k];
}

kvfake_stream *stream_of(cudaStream_t s) {
    return s ? s : &g.null_stream;
}

/* The allocation holding [p, p + n), or nullptr. */
const alloc_rec *find(const void *p, size_t n, uintptr_t *start = nullptr) {
    uintptr_t a = (uintptr_t)p;
    auto it = g.mem.upper_bound(a);
    if (it == g.mem.begin()) return nullptr;
    --it;
    if (a < it->first || a + n > it->first + it->second.bytes) return nullptr;
    if (start) *start = it->first;
    return &it->second;
}

void run_until(kvfake_stream *s, size_t upto);

void run_op(kvfake_stream::op &o) {
    if (o.wait_on)
        run_until(o.wait_on, o.wait_upto);
    else if (o.run)
        o.run();
    g.clock += o.cost;
}

void run_until(kvfake_stream *s, size_t upto) {
    while (s->base < upto && !s->q.empty()) {
        kvfake_stream::op o = std::move(s->q.front());
        s->q.pop_front();
        s->base++;
        run_op(o);
    }
}

void drain(kvfake_stream *s) {
    run_until(s, s->queued());
}

void push(cudaStream_t s, std::function<void()> f, double cost) {
    kvfake_stream::op o;
    o.run = std::move(f);
    o.cost = cost;
    stream_of(s)->q.push_back(std::move(o));
}

cudaError_t set_last(cudaError_t e) {
    if (e != cudaSuccess) g.last = e;
    return e;
}

/* Check a copy's ranges; *deferred_src says whether the source may be read when the copy runs
 * (device or pinned memory) rather than at the call (pageable). */
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                       bool *pageable_src, bool *pageable_dst) {
    const alloc_rec *d = find(dst, n), *sr = find(src, n);
    bool dd = d && d->kind == DEVICE, sd = sr && sr->kind == DEVICE;
    if (kind == cudaMemcpyDefault)
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    bool ok = (kind == cudaMemcpyHostToDevice && dd && !sd) ||
              (kind == cudaMemcpyDeviceToHost && sd && !dd) ||
              (kind == cudaMemcpyDeviceToDevice && sd && dd) ||
              (kind == cudaMemcpyHostToHost && !sd && !dd);
    if (!ok) {
        std::fprintf(stderr,
                     "cuda fake: cudaMemcpy of %zu bytes %p -> %p: kind %d does not match "
                     "the allocations\n",
                     n, src, dst, (int)kind);
        return cudaErrorInvalidValue;
    }
    *pageable_src = !sr;
    *pageable_dst = !d;
    if (kind == cudaMemcpyHostToDevice) {
        g.c.h2d_bytes += (double)n;
        g.c.h2d_copies++;
    }
    if (kind == cudaMemcpyDeviceToHost) g.c.d2h_bytes += (double)n;
    return cudaSuccess;
}

/* Queue a copy on s; a pageable source is read now, a pageable destination makes the call
 * wait for the copy (as cudaMemcpyAsync does with pageable memory). */
cudaError_t queue_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s,
                       bool blocking) {
    if (!n) return cudaSuccess;
    bool psrc = false, pdst = false;
    cudaError_t e = check_copy(dst, src, n, kind, &psrc, &pdst);
    if (e) return set_last(e);
    bool run = !g.count_only;
    const alloc_rec *dr = find(dst, n), *sr = find(src, n);
    bool backed = (!dr || dr->owned) && (!sr || sr->owned);
    if (psrc && run) {
        auto copy = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                 (const unsigned char *)src + n);
        push(
            s, [dst, copy]() { std::memcpy(dst, copy->data(), copy->size()); }, n / kCopyBw);
    } else {
        push(
            s,
            [dst, src, n, run, backed]() {
                if (run && backed) std::memcpy(dst, src, n);
            },
            n / kCopyBw + 2e-6);
    }
    if (blocking || pdst) {
        drain(stream_of(s));
        g.c.syncs++;
    }
    return cudaSuccess;
}

/* C[m, n] = alpha op(A) op(B) + beta C, column-major, fp32, double accumulation. */
/* Element i of a matrix of cuBLAS type t at p: fp32, binary16 or bfloat16 widened exactly. */
double gemm_elem(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    const unsigned char *b = (const unsigned char *)p + 2 * i;
    uint16_t h = kv_load_u16le(b);
    return t == CUDA_R_16F ? kv_f16_to_f32(h) : kv_bf16_to_f32(h);
}

void naive_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const void *A, int lda,
                const void *B, int ldb, cudaDataType_t ab, float beta, float *C, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0.0;
            for (int p = 0; p < k; p++) {
                double a = gemm_elem(A, ab, ta ? (size_t)i * lda + p : (size_t)p * lda + i);
                double b = gemm_elem(B, ab, tb ? (size_t)p * ldb + j : (size_t)j * ldb + p);
                acc += a * b;
            }
            float &c = C[(size_t)j * ldc + i];
            c = beta == 0.0f ? (float)(alpha * acc) : (float)(alpha * acc + beta * c);
        }
}

} // namespace

/* ---- control (cuda_fake.h) ---- */

extern "C" void kvfake_reset(void) {
    for (auto &kv : g.mem) std::free(kv.second.owned);
    g.mem.clear();
    g.streams.clear();
    g.events.clear();
    g.blas.clear();
    g.null_stream.q.clear();
    g.null_stream.base = 0;
    g.max_dyn.clear();
    g.c = kvfake_counters{};
    for (int i = 0; i < 3; i++) g.calls[i] = g.fail_at[i] = 0;
    g.count_only = false;
    g.capacity = (size_t)80 << 30;
    g.clock = 0.0;
    g.watch = g.watch2 = nullptr;
    g.last = cudaSuccess;
}

extern "C" void kvfake_fail_nth(kvfake_fault kind, long n) {
    g.fail_at[kind] = n ? g.calls[kind] + n : 0;
}

extern "C" long kvfake_calls(kvfake_fault kind) {
    return g.calls[kind];
}

extern "C" kvfake_counters kvfake_get(void) {
    return g.c;
}

extern "C" void kvfake_zero_traffic(void) {
    g.c.syncs = g.c.launches = g.c.gemms = g.c.h2d_copies = 0;
    g.c.h2d_bytes = g.c.d2h_bytes = g.c.gemm_bytes = g.c.kernel_blocks = 0.0;
}

extern "C" void kvfake_set_count_only(int on) {
    g.count_only = on != 0;
}

extern "C" void kvfake_set_capacity(size_t bytes) {
    g.capacity = bytes;
}

extern "C" void kvfake_watch_grid(const void *func) {
    g.watch = func;
}

extern "C" void kvfake_watch_grid2(const void *func) {
    g.watch2 = func;
}

extern "C" int kvfake_sm_count(void) {
    return 132;
}

/* ---- runtime ---- */

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInitializationError:
        return "initialization error";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g.last;
    g.last = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
    return dev == 0 ? cudaSuccess : set_last(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int dev) {
    if (dev != 0) return set_last(cudaErrorInvalidDevice);
    std::memset(prop, 0, sizeof *prop);
    std::snprintf(prop->name, sizeof prop->name, "kvplan fake CUDA device (H100-shaped)");
    prop->totalGlobalMem = g.capacity;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = kvfake_sm_count();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int dev) {
    if (dev != 0) return set_last(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount:
        *value = kvfake_sm_count();
        break;
    case cudaDevAttrMemoryClockRate:
        *value = 2617000;
        break; /* kHz: 3.35 TB/s on 5120 bits */
    case cudaDevAttrGlobalMemoryBusWidth:
        *value = 5120;
        break;
    default:
        return set_last(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    drain(&g.null_stream);
    for (auto &s : g.streams) drain(s.get());
    g.c.syncs++;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = nullptr;
    g.c.mallocs++;
    if (fault(KVFAKE_MALLOC) || g.c.device_live + bytes > g.capacity)
        return set_last(cudaErrorMemoryAllocation);
    size_t n = bytes ? bytes : 1;
    void *mem = nullptr;
    uintptr_t addr;
    if (g.count_only) {
        addr = g.next_fake;
        g.next_fake += (n + 255) / 256 * 256;
    } else {
        mem = std::malloc(n);
        if (!mem) return set_last(cudaErrorMemoryAllocation);
        std::memset(mem, 0xff, n); /* NaN in every float */
        addr = (uintptr_t)mem;
    }
    g.mem[addr] = alloc_rec{n, DEVICE, mem};
    g.c.device_live += n;
    if (g.c.device_live > g.c.device_peak) g.c.device_peak = g.c.device_live;
    *p = (void *)addr;
    return cudaSuccess;
}

static cudaError_t free_kind(void *p, mem_kind kind) {
    if (!p) return cudaSuccess;
    auto it = g.mem.find((uintptr_t)p);
    if (it == g.mem.end() || it->second.kind != kind) {
        std::fprintf(stderr, "cuda fake: %s of %p, which is not a live %s allocation\n",
                     kind == DEVICE ? "cudaFree" : "cudaFreeHost", p,
                     kind == DEVICE ? "device" : "pinned");
        return set_last(cudaErrorInvalidValue);
    }
    /* the queued work that may still use it runs first (cudaFree synchronises the device) */
    drain(&g.null_stream);
    for (auto &s : g.streams) drain(s.get());
    if (kind == DEVICE)
        g.c.device_live -= it->second.bytes;
    else
        g.c.pinned_live -= it->second.bytes;
    std::free(it->second.owned);
    g.mem.erase(it);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    return free_kind(p, DEVICE);
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    *p = nullptr;
    g.c.host_allocs++;
    if (fault(KVFAKE_HOST_ALLOC)) return set_last(cudaErrorMemoryAllocation);
    size_t n = bytes ? bytes : 1;
    void *mem = std::malloc(n);
    if (!mem) return set_last(cudaErrorMemoryAllocation);
    std::memset(mem, 0xff, n);
    g.mem[(uintptr_t)mem] = alloc_rec{n, PINNED, mem};
    g.c.pinned_live += n;
    *p = mem;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p) {
    return free_kind(p, PINNED);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    drain(&g.null_stream);
    return queue_copy(dst, src, bytes, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
    return queue_copy(dst, src, bytes, kind, s, false);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    const alloc_rec *r = find(p, bytes);
    if (!r || r->kind != DEVICE) return set_last(cudaErrorInvalidValue);
    bool run = r->owned != nullptr;
    push(
        s,
        [p, value, bytes, run]() {
            if (run) std::memset(p, value, bytes);
        },
        bytes / kDevBw + kLaunch);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr);
    drain(&g.null_stream);
    g.c.syncs++;
    return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags; /* every fake stream is non-blocking: ordering only through events */
    g.streams.emplace_back(new kvfake_stream());
    *s = g.streams.back().get();
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || !s->alive) return set_last(cudaErrorInvalidResourceHandle);
    drain(s); /* queued work still completes */
    s->alive = false;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    drain(stream_of(s));
    g.c.syncs++;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags) {
    (void)flags;
    if (!ev || !ev->alive) return set_last(cudaErrorInvalidResourceHandle);
    if (!ev->s || ev->s->base >= ev->pos) return cudaSuccess; /* nothing to wait for */
    kvfake_stream::op o;
    o.wait_on = ev->s;
    o.wait_upto = ev->pos;
    stream_of(s)->q.push_back(std::move(o));
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
    g.events.emplace_back(new kvfake_event());
    g.events.back()->timing = !(flags & cudaEventDisableTiming);
    *ev = g.events.back().get();
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *ev) {
    return cudaEventCreateWithFlags(ev, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    if (!ev || !ev->alive) return set_last(cudaErrorInvalidResourceHandle);
    ev->alive = false; /* kept until kvfake_reset: queued records may still name it */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
    if (!ev || !ev->alive) return set_last(cudaErrorInvalidResourceHandle);
    kvfake_stream *st = stream_of(s);
    long seq = ++ev->seq;
    ev->s = st;
    ev->pos = st->queued() + 1;
    ev->time = -1;
    push(
        s,
        [ev, seq]() {
            if (ev->seq == seq) ev->time = g.clock;
        },
        0.0);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    if (!ev || !ev->alive) return set_last(cudaErrorInvalidResourceHandle);
    if (ev->s) run_until(ev->s, ev->pos);
    g.c.syncs++;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
    if (!ev || !ev->alive) return set_last(cudaErrorInvalidResourceHandle);
    return !ev->s || ev->s->base >= ev->pos ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b || !a->alive || !b->alive || !a->timing || !b->timing)
        return set_last(cudaErrorInvalidResourceHandle);
    if (cudaEventQuery(a) != cudaSuccess || cudaEventQuery(b) != cudaSuccess)
        return cudaErrorNotReady;
    if (a->time < 0 || b->time < 0) return set_last(cudaErrorInvalidResourceHandle);
    *ms = (float)((b->time - a->time) * 1e3);
    return cudaSuccess;
}

cudaError_t kvfake_func_set_max_dynamic_shared(const void *func, int bytes) {
    if (bytes < 0 || bytes > 227 * 1024) return set_last(cudaErrorInvalidValue);
    g.max_dyn[func] = bytes;
    return cudaSuccess;
}

cudaError_t kvfake_launch(cudaStream_t s, dim3 grid, dim3 block, size_t dyn_shared,
                          const void *func, std::function<void()> body) {
    size_t limit = 48 * 1024;
    auto it = g.max_dyn.find(func);
    if (it != g.max_dyn.end() && (size_t)it->second > limit) limit = (size_t)it->second;
    if (grid.x < 1 || grid.y < 1 || grid.z != 1 || block.x < 32 || block.x > 1024 || block.x % 32 ||
        block.y != 1 || block.z != 1 || dyn_shared > limit) {
        std::fprintf(stderr, "cuda fake: bad launch <<<(%u, %u), %u, %zu>>> (shared limit %zu)\n",
                     grid.x, grid.y, block.x, dyn_shared, limit);
        return set_last(cudaErrorInvalidConfiguration);
    }
    g.c.launches++;
    double blocks = (double)grid.x * grid.y;
    g.c.kernel_blocks += blocks;
    if (func == g.watch || func == g.watch2) g.c.last_grid = (long)blocks;
    bool run = !g.count_only;
    int gx = (int)grid.x, gy = (int)grid.y, bx = (int)block.x;
    push(
        s,
        [run, gx, gy, bx, dyn_shared, limit, body]() {
            if (run && kv_shim_launch_limited(gx, gy, bx, dyn_shared, limit, body) != 0) {
                std::fprintf(stderr, "cuda fake: the shim refused a launch\n");
                std::abort();
            }
        },
        kLaunch);
    return cudaSuccess;
}

/* ---- cuBLAS ---- */

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    g.blas.emplace_back(new kvfake_blas());
    *h = g.blas.back().get();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h || !h->alive) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->alive = false;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h || !h->alive) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    (void)mode;
    return h && h->alive ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    (void)algo;
    if (!h || !h->alive) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (fault(KVFAKE_GEMM)) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* the combinations cuBLAS has for CUBLAS_COMPUTE_32F with an fp32 C: A and B both fp32,
     * both binary16 or both bfloat16 */
    if (at != bt || (at != CUDA_R_32F && at != CUDA_R_16F && at != CUDA_R_16BF) || ct != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    /* the extent each operand spans in column-major storage: (columns - 1) * ld + rows */
    bool tA = ta == CUBLAS_OP_T, tB = tb == CUBLAS_OP_T;
    size_t es = at == CUDA_R_32F ? 4 : 2;
    auto extent = [](int rows, int cols, int ld) {
        return rows && cols ? ((size_t)cols - 1) * (size_t)ld + (size_t)rows : 0;
    };
    int a_rows = tA ? k : m, a_cols = tA ? m : k, b_rows = tB ? n : k, b_cols = tB ? k : n;
    if (lda < a_rows || ldb < b_rows || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
    size_t a_bytes = extent(a_rows, a_cols, lda) * es, b_bytes = extent(b_rows, b_cols, ldb) * es,
           c_bytes = extent(m, n, ldc) * 4;
    const alloc_rec *ra = find(A, a_bytes), *rb = find(B, b_bytes), *rc = find(C, c_bytes);
    if (!ra || !rb || !rc || ra->kind != DEVICE || rb->kind != DEVICE || rc->kind != DEVICE) {
        std::fprintf(stderr,
                     "cuda fake: cublasGemmEx %dx%dx%d on memory that is not device "
                     "memory of that size\n",
                     m, n, k);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    g.c.gemms++;
    g.c.gemm_bytes += (double)(a_bytes + b_bytes + c_bytes);
    float al = *(const float *)alpha, be = *(const float *)beta;
    bool run = !g.count_only;
    float *c = (float *)C;
    push(
        h->s,
        [=]() {
            if (run) naive_gemm(tA, tB, m, n, k, al, A, lda, B, ldb, at, be, c, ldc);
        },
        kLaunch + (double)(a_bytes + b_bytes + c_bytes) / kDevBw);
    return CUBLAS_STATUS_SUCCESS;
}
