/* Probes of the performance model (kmodel.h km_probe): each runs one kernel of the CUDA backend
 * (cuda/kernels/kv_kernels.cuh, kv_quant.cuh) or a micro-kernel (kmodel_micro.cuh) on the host shim
 * with its global buffers registered with a tracer (ktrace.hpp), at a small shape that keeps the
 * full shape's row lengths (a few blocks), and scales the counts to the full grid.
 *
 * This file is compiled by clang with -fsanitize-coverage=trace-pc-guard,trace-loads,
 * trace-stores and without vectorisation (a lane's loads stay the ones the source wrote); see
 * CMakeLists.txt. Without that (KM_NO_TRACE) km_probe says the tracer is not in the build.
 *
 * A new kernel plugs in with a row of k_probes below (a function that sets up its buffers and
 * launches it) and its instantiation in kmodel_kernels.cu (its compiled-code row, written by
 * scripts/kernel-table.py). */
#include "cuda_shim.hpp"

#include "kernels/kv_kernels.cuh"
#include "kernels/kv_flash.cuh"
#include "kernels/kv_prefill.cuh"
#include "kernels/kv_quant.cuh"
#include "kmodel.h"
#include "kmodel_micro.cuh"
#include "ktrace.hpp"
#include "kvplan/quant.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

typedef int (*probe_fn)(const km_shape *s, km_trace *t, kv_error *err);

/* A device buffer as cudaMalloc gives one: 256-byte aligned (the sector counts depend on it),
 * n elements of T, each v. Owns its memory; throws std::bad_alloc. */
template <typename T> class dbuf {
  public:
    dbuf(size_t n, T v) : n_(n) {
        size_t bytes = (n * sizeof(T) + 255) / 256 * 256;
        p_ = static_cast<T *>(std::aligned_alloc(256, bytes ? bytes : 256));
        if (!p_) throw std::bad_alloc();
        for (size_t i = 0; i < n; i++) p_[i] = v;
    }
    ~dbuf() {
        std::free(p_);
    }
    dbuf(const dbuf &) = delete;
    dbuf &operator=(const dbuf &) = delete;
    T *data() {
        return p_;
    }
    T &operator[](size_t i) {
        return p_[i];
    }
    size_t size() const {
        return n_;
    }
    size_t bytes() const {
        return n_ * sizeof(T);
    }

  private:
    T *p_;
    size_t n_;
};

/* Run body as <<<(gx, gy), block, shm>>> with tr tracing it. */
template <typename F>
int traced(km_tracer &tr, int gx, int gy, int block, size_t shm, const F &body, kv_error *err) {
    tr.begin();
    int rc = kv_shim_launch(gx, gy, block, shm, body);
    tr.end();
    return rc ? kv_fail(err, KV_EINPUT, "km_probe: the shim refused the launch") : KV_OK;
}

const int kGemvBlocks = 8; /* thread blocks traced (one output row each; Q4_K: 8 rows each) */

/* The share of a typed GEMV's loop iterations that take both chunks (the loop body's second
 * half): thread tid starts at chunk tid and steps 2 x threads chunks; n chunks per row. */
double two_chunk_share(int n, int threads) {
    double all = 0, two = 0;
    for (int tid = 0; tid < threads; tid++)
        for (int c = tid; c < n; c += 2 * threads) {
            all += 1;
            two += c + threads < n;
        }
    return all > 0 ? two / all : 0.0;
}

/* kv_k_gemv_f16<R>: F16 weights [out, in], R rows of x. */
template <int R> int gemv_f16(const km_shape *s, km_trace *t, kv_error *err) {
    if (s->in < 8 || s->in % 8 || s->out < 1)
        return kv_fail(err, KV_EINPUT, "km_probe: kv_k_gemv_f16 needs in %% 8 == 0, out >= 1");
    int rows = s->out < kGemvBlocks ? s->out : kGemvBlocks;
    dbuf<uint16_t> w((size_t)rows * s->in, 0x3c00); /* 1.0 */
    dbuf<float> x((size_t)R * s->in, 0.5f), y((size_t)R * rows, 0.0f);
    km_tracer tr;
    tr.buffer(w.data(), w.bytes(), km_tracer::STREAM);
    tr.buffer(x.data(), x.bytes(), km_tracer::SHARED);
    tr.buffer(y.data(), y.bytes(), km_tracer::STREAM);
    const unsigned char *W = reinterpret_cast<const unsigned char *>(w.data());
    int rc = traced(
        tr, rows, 1, KV_K_GEMV_THREADS, 0,
        [&] { kv_k_gemv_f16<R>(W, x.data(), y.data(), R, s->in, rows); }, err);
    if (!rc) *t = tr.result(s->out, rows, KV_K_GEMV_THREADS, 0);
    t->path = two_chunk_share(s->in / 8, KV_K_GEMV_THREADS);
    return rc;
}

/* The block-type GEMV kernels for the probe below, one traits struct each: the weight block
 * (elements, bytes), the activation layout (elements per block: 32 with an int sum, or 256 with
 * 16 int16 sums), threads and output rows per thread block, the launch of the kernel at R, and
 * the share of its loop iterations that take both weight loads (km_trace path). */
template <typename Dot> struct gq_q32 { /* kv_k_gemv_q<Dot, R>: Q8_0, Q4_0 */
    typedef int sum_t;
    static const int qk = 32, sums = 1, bytes = Dot::bytes, threads = KV_K_GEMV_THREADS, per = 1;
    template <int R>
    static void run(const unsigned char *w, size_t rb, const signed char *q, const float *d,
                    const sum_t *s, float *y, int in, int out) {
        kv_k_gemv_q<Dot, R>(w, rb, q, d, s, y, R, in, out);
    }
    static double path(int nb) {
        return two_chunk_share(nb, threads / Dot::lanes); /* Dot::lanes lanes per block */
    }
};
struct gq_q4k { /* kv_k_gemv_q4k<R>: a lane per super-block, 8 lanes per output row */
    typedef short sum_t;
    static const int qk = 256, sums = 16, bytes = 144, threads = KV_K_GEMV_Q4K_THREADS;
    static const int per = KV_K_GEMV_Q4K_THREADS / 8;
    template <int R>
    static void run(const unsigned char *w, size_t rb, const signed char *q, const float *d,
                    const sum_t *s, float *y, int in, int out) {
        kv_k_gemv_q4k<R>(w, rb, q, d, s, y, R, in, out);
    }
    static double path(int nb) {
        return two_chunk_share(nb, 8); /* lane j: super-blocks j, j + 8 per iteration */
    }
};
struct gq_q6k { /* kv_k_gemv_qk<kv_q6k_lane, R>: 16 lanes per super-block */
    typedef short sum_t;
    static const int qk = 256, sums = 16, bytes = 210, threads = KV_K_GEMV_THREADS, per = 1;
    template <int R>
    static void run(const unsigned char *w, size_t rb, const signed char *q, const float *d,
                    const sum_t *s, float *y, int in, int out) {
        kv_k_gemv_qk<kv_q6k_lane, R>(w, rb, q, d, s, y, R, in, out);
    }
    static double path(int nb) {
        return two_chunk_share(nb, 8); /* group j: super-blocks j, j + 8 per iteration */
    }
};

/* A block-type GEMV (G: gq_q32<Dot>, gq_q4k, gq_q6k) at R rows of x against activations
 * quantised once (the quantiser's launch before it is not part of this probe): kGemvBlocks
 * thread blocks traced, scaled to the full grid. */
template <typename G, int R> int gemv_block(const km_shape *s, km_trace *t, kv_error *err) {
    if (s->in < G::qk || s->in % G::qk || s->out < 1)
        return kv_fail(err, KV_EINPUT, "km_probe: this GEMV needs in %% %d == 0, out >= 1", G::qk);
    int want = kGemvBlocks * G::per, rows = s->out < want ? s->out : want, nb = s->in / G::qk;
    int blocks = (rows + G::per - 1) / G::per;
    size_t rb = (size_t)nb * G::bytes;
    dbuf<unsigned char> w((size_t)rows * rb, 0);
    dbuf<signed char> aq((size_t)R * s->in, 1);
    dbuf<float> ad((size_t)R * nb, 0.01f), y((size_t)R * rows, 0.0f);
    dbuf<typename G::sum_t> as((size_t)R * nb * G::sums, 16);
    km_tracer tr;
    tr.buffer(w.data(), w.bytes(), km_tracer::STREAM);
    tr.buffer(aq.data(), aq.bytes(), km_tracer::SHARED);
    tr.buffer(ad.data(), ad.bytes(), km_tracer::SHARED);
    tr.buffer(as.data(), as.bytes(), km_tracer::SHARED);
    tr.buffer(y.data(), y.bytes(), km_tracer::STREAM);
    int rc = traced(
        tr, blocks, 1, G::threads, 0,
        [&] {
            G::template run<R>(w.data(), rb, aq.data(), ad.data(), as.data(), y.data(), s->in,
                               rows);
        },
        err);
    double full = ((double)s->out + G::per - 1) / G::per;
    if (!rc) *t = tr.result(std::floor(full), blocks, G::threads, 0);
    t->path = G::path(nb);
    return rc;
}

/* kv_k_gemv (any weight type, a warp per output row), one row of x, weights of type s->wtype
 * (any type; the K-quants have the typed kv_k_gemv_qk above). */
int gemv_generic(const km_shape *s, km_trace *t, kv_error *err) {
    size_t rb = 0;
    if (s->out < 1 || kv_dtype_row_bytes((kv_dtype)s->wtype, s->in, "km_probe", &rb, err))
        return kv_fail(err, KV_EINPUT, "km_probe: kv_k_gemv: bad type or row length");
    const int threads = 128, rows = kGemvBlocks, blocks = rows / (threads / 32);
    dbuf<unsigned char> w((size_t)rows * rb, 0);
    dbuf<float> x((size_t)s->in, 0.5f), y((size_t)rows, 0.0f);
    km_tracer tr;
    tr.buffer(w.data(), w.bytes(), km_tracer::STREAM);
    tr.buffer(x.data(), x.bytes(), km_tracer::SHARED);
    tr.buffer(y.data(), y.bytes(), km_tracer::STREAM);
    int rc = traced(
        tr, blocks, 1, threads, 0,
        [&] { kv_k_gemv(w.data(), s->wtype, rb, x.data(), y.data(), 1, s->in, rows); }, err);
    double full = (double)((s->out + threads / 32 - 1) / (threads / 32));
    if (!rc) *t = tr.result(full, blocks, threads, 0);
    t->path = 1.0; /* every type's decoder counted: an upper bound of the issue */
    return rc;
}

/* The buffers of one flash-decoding task: an F16 pool of ctx entries (block size 16, blocks in
 * table order), its table, the task, g queries of hd and the partition outputs. */
struct fd_task {
    static const int bs = 16;
    int nb, parts;
    dbuf<unsigned char> pool;
    dbuf<int> table;
    dbuf<kv_k_attn_task> task;
    dbuf<float> q, part, scratch;
    kv_k_pool P;
    explicit fd_task(const km_shape *s)
        : nb((s->ctx + bs - 1) / bs), parts((s->ctx + KV_K_FD_PART - 1) / KV_K_FD_PART),
          pool((size_t)nb * 2 * bs * kvt_row_bytes(KV_TYPE_F16, s->hd), 0), table((size_t)nb, 0),
          task(1, kv_k_attn_task{0, 1, 0, s->ctx, 0, 0, 0}), q((size_t)s->g * s->hd, 0.1f),
          part((size_t)parts * s->g * (s->hd + 2), 0.0f), scratch(1, 0.0f) {
        for (int b = 0; b < nb; b++) table[(size_t)b] = b;
        std::memset(&P, 0, sizeof P);
        P.data = pool.data();
        P.bs = bs;
        P.hd = s->hd;
        for (int t = 0; t <= KV_CACHE_TYPES; t++) {
            P.type_first[t] = t <= KV_TYPE_F16 ? 0 : nb;
            P.type_offset[t] = t <= KV_TYPE_F16 ? 0 : pool.bytes();
        }
    }
};

/* kv_k_flash_decode<F16, 128> (d_h 65..128, block size 16): one task traced, scaled to s->tasks
 * tasks. */
int flash_decode_f16(const km_shape *s, km_trace *t, kv_error *err) {
    if (s->hd <= 64 || s->hd > 128 || s->hd % 8 || s->g < 1 || s->g > KV_K_FD_GROUP || s->ctx < 1 ||
        s->tasks < 1)
        return kv_fail(err, KV_EINPUT,
                       "km_probe: kv_k_flash_decode<1, 128> needs 64 < hd <= 128, hd %% 8 == 0, "
                       "1 <= g <= %d",
                       KV_K_FD_GROUP);
    fd_task f(s);
    const int threads = KV_K_FD_THREADS, g = s->g, hd = s->hd, sh = 4; /* bs 16 */
    size_t shm = kv_k_fd_shm(threads, g, hd, KV_K_FD_PART, sh);
    size_t np = (size_t)f.parts * g;
    float *pm = f.part.data(), *ps = pm + np, *po = ps + np;
    km_tracer tr;
    tr.buffer(f.pool.data(), f.pool.bytes(), km_tracer::STREAM);
    tr.buffer(f.table.data(), f.table.bytes(), km_tracer::STREAM);
    tr.buffer(f.task.data(), f.task.bytes(), km_tracer::STREAM);
    tr.buffer(f.q.data(), f.q.bytes(), km_tracer::STREAM);
    tr.buffer(f.part.data(), f.part.bytes(), km_tracer::STREAM);
    int rc = traced(
        tr, 1, f.parts, threads, shm,
        [&] {
            kv_k_flash_decode<KV_TYPE_F16, 128>(f.P, f.table.data(), f.task.data(), f.q.data(),
                                                g * hd, g, KV_K_FD_PART, f.parts, sh,
                                                f.scratch.data(), 0, pm, ps, po);
        },
        err);
    if (!rc) *t = tr.result((double)s->tasks * f.parts, f.parts, threads, shm);
    t->path = (double)g / KV_K_FD_GROUP; /* the group loop, unrolled, left after g heads */
    return rc;
}

/* One tiled-prefill task traced: an F16 head of `len` entries (block size 16), whose last 64 /
 * g tokens are the new ones (one query tile of g heads x 64 / g tokens, which reads every KV
 * tile of the head), a GQA group of g, d_h 128. Fills *t unscaled (one block), *kv the distinct
 * bytes of the pool and table (read by every block of a task, fetched once). */
int prefill_block(int len, int g, km_trace *t, double *kv, kv_error *err) {
    const int bs = 16, hd = 128, n = KV_K_PT_BQ / g, nb = (len + bs - 1) / bs;
    size_t rb = kvt_row_bytes(KV_TYPE_F16, hd);
    dbuf<unsigned char> pool((size_t)nb * 2 * bs * rb, 0x3c); /* small positive halves */
    dbuf<int> table((size_t)nb, 0);
    for (int b = 0; b < nb; b++) table[(size_t)b] = b;
    dbuf<kv_k_attn_task> task(1, kv_k_attn_task{0, n, 0, len, 0, 0, 0});
    dbuf<float> q((size_t)n * g * hd, 0.1f), o((size_t)n * g * hd, 0.0f), ml(2 * (size_t)n * g, 0);
    kv_k_pool P;
    std::memset(&P, 0, sizeof P);
    P.data = pool.data();
    P.bs = bs;
    P.hd = hd;
    for (int k = 0; k <= KV_CACHE_TYPES; k++) {
        P.type_first[k] = k <= KV_TYPE_F16 ? 0 : nb;
        P.type_offset[k] = k <= KV_TYPE_F16 ? 0 : pool.bytes();
    }
    km_tracer tr;
    tr.buffer(pool.data(), pool.bytes(), km_tracer::SHARED);
    tr.buffer(table.data(), table.bytes(), km_tracer::SHARED);
    tr.buffer(task.data(), task.bytes(), km_tracer::STREAM);
    tr.buffer(q.data(), q.bytes(), km_tracer::STREAM);
    tr.buffer(o.data(), o.bytes(), km_tracer::STREAM);
    tr.buffer(ml.data(), ml.bytes(), km_tracer::STREAM);
    int rc = traced(
        tr, 1, 1, KV_K_PT_THREADS, KV_K_PT_SHM(hd),
        [&] {
            kv_k_prefill_tiled<128>(P, table.data(), task.data(), q.data(), o.data(), g * hd, g,
                                    ml.data(), n * g);
        },
        err);
    if (rc) return rc;
    *t = tr.result(1, 1, KV_K_PT_THREADS, KV_K_PT_SHM(hd));
    *kv = tr.distinct_bytes(km_tracer::SHARED);
    return KV_OK;
}

/* kv_k_prefill_tiled<128> (F16 K/V, d_h 128) over a first prefill of s->ctx tokens of s->tasks
 * (sequence, KV head) tasks with GQA group s->g (grid: tasks x ceil(ctx g / 64) query tiles;
 * the query tile y reads the KV tiles up to its last token: causal skipping). Two query tiles
 * are traced, reading 16 and 32 KV tiles: their difference is the per-KV-tile part of every
 * count (loads, sectors, MMAs), the rest the per-block part; the launch's counts are blocks x
 * per block + (the grid's KV tiles) x per KV tile. DRAM: every block's own queries, outputs
 * and row statistics, plus each task's K/V and table once (L2 serves the other query tiles:
 * at 4k a task's K/V are 2 MiB). */
int prefill_tiled_f16(const km_shape *s, km_trace *t, kv_error *err) {
    if (s->hd != 128 || s->g < 1 || KV_K_PT_BQ % s->g || s->ctx < 64 || s->tasks < 1)
        return kv_fail(err, KV_EINPUT,
                       "km_probe: kv_k_prefill_tiled<128> needs hd 128, g dividing %d, ctx >= 64",
                       KV_K_PT_BQ);
    const int la = 16 * KV_K_PT_BK, lb = 32 * KV_K_PT_BK;
    km_trace a, b;
    double kva = 0, kvb = 0;
    int rc = prefill_block(la, s->g, &a, &kva, err);
    if (!rc) rc = prefill_block(lb, s->g, &b, &kvb, err);
    if (rc) return rc;
    long rows = (long)s->ctx * s->g, tiles = 0, blocks = (rows + KV_K_PT_BQ - 1) / KV_K_PT_BQ;
    for (long y = 0; y < blocks; y++) {
        long last = (y + 1) * KV_K_PT_BQ < rows ? (y + 1) * KV_K_PT_BQ - 1 : rows - 1;
        tiles += (last / s->g + 1 + KV_K_PT_BK - 1) / KV_K_PT_BK;
    }
    double nb = (double)blocks * s->tasks, nt = (double)tiles * s->tasks;
    auto mix = [&](double va, double vb) {
        double per_tile = (vb - va) / 16.0, per_block = va - 16.0 * per_tile;
        return nb * per_block + nt * per_tile;
    };
    *t = a;
    t->blocks = nb;
    t->requests = mix(a.requests, b.requests);
    t->sectors = mix(a.sectors, b.sectors);
    t->req_bytes = mix(a.req_bytes, b.req_bytes);
    t->store_requests = mix(a.store_requests, b.store_requests);
    t->mma_flops = mix(a.mma_flops, b.mma_flops);
    t->dram_bytes = nb * (a.dram_bytes - kva) + s->tasks * kvb / lb * s->ctx;
    t->path = 1.0;
    return KV_OK;
}

/* km_copy: s->n floats with stride s->stride, one element per thread. */
int copy(const km_shape *s, km_trace *t, kv_error *err) {
    if (s->n < 128 || s->n % 128 || s->stride < 1)
        return kv_fail(err, KV_EINPUT, "km_probe: km_copy needs n a multiple of 128, stride >= 1");
    dbuf<float> x((size_t)s->n * s->stride, 1.0f), y((size_t)s->n, 0.0f);
    km_tracer tr;
    tr.buffer(x.data(), x.bytes(), km_tracer::STREAM);
    tr.buffer(y.data(), y.bytes(), km_tracer::STREAM);
    int blocks = s->n / 128;
    int rc = traced(
        tr, blocks, 1, 128, 0, [&] { km_copy(x.data(), y.data(), s->n, s->stride); }, err);
    if (!rc) *t = tr.result(blocks, blocks, 128, 0);
    return rc;
}

/* km_chase: s->n threads (warps of one block each) following next[i] = (i + 32) mod n for
 * s->stride hops: every request is coalesced, every load waits for the one before. */
int chase(const km_shape *s, km_trace *t, kv_error *err) {
    if (s->n < 64 || s->n % 32 || s->stride < 1)
        return kv_fail(err, KV_EINPUT, "km_probe: km_chase needs n a multiple of 32, hops >= 1");
    dbuf<int> next((size_t)s->n, 0), out((size_t)s->n, 0);
    for (int i = 0; i < s->n; i++) next[(size_t)i] = (i + 32) % s->n;
    km_tracer tr;
    tr.buffer(next.data(), next.bytes(), km_tracer::STREAM);
    tr.buffer(out.data(), out.bytes(), km_tracer::STREAM);
    int blocks = s->n / 32;
    int rc = traced(
        tr, blocks, 1, 32, 0, [&] { km_chase(next.data(), out.data(), s->stride); }, err);
    if (!rc) *t = tr.result(blocks, blocks, 32, 0);
    return rc;
}

struct probe {
    const char *name;
    probe_fn run;
};

const probe k_probes[] = {
    /* the typed GEMVs at R = 1, 8, 32 rows of x */
    {"kv_k_gemv_f16<1>", gemv_f16<1>},
    {"kv_k_gemv_q<kv_q8_0_dot, 1>", gemv_block<gq_q32<kv_q8_0_dot>, 1>},
    {"kv_k_gemv_q<kv_q4_0_dot, 1>", gemv_block<gq_q32<kv_q4_0_dot>, 1>},
    {"kv_k_gemv_q4k<1>", gemv_block<gq_q4k, 1>},
    {"kv_k_gemv_qk<kv_q6k_lane, 1>", gemv_block<gq_q6k, 1>},
    {"kv_k_gemv_f16<8>", gemv_f16<8>},
    {"kv_k_gemv_q<kv_q8_0_dot, 8>", gemv_block<gq_q32<kv_q8_0_dot>, 8>},
    {"kv_k_gemv_q<kv_q4_0_dot, 8>", gemv_block<gq_q32<kv_q4_0_dot>, 8>},
    {"kv_k_gemv_q4k<8>", gemv_block<gq_q4k, 8>},
    {"kv_k_gemv_qk<kv_q6k_lane, 8>", gemv_block<gq_q6k, 8>},
    {"kv_k_gemv_f16<32>", gemv_f16<32>},
    {"kv_k_gemv_q<kv_q8_0_dot, 32>", gemv_block<gq_q32<kv_q8_0_dot>, 32>},
    {"kv_k_gemv_q<kv_q4_0_dot, 32>", gemv_block<gq_q32<kv_q4_0_dot>, 32>},
    {"kv_k_gemv_q4k<32>", gemv_block<gq_q4k, 32>},
    {"kv_k_gemv_qk<kv_q6k_lane, 32>", gemv_block<gq_q6k, 32>},
    {"kv_k_gemv", gemv_generic},
    {"kv_k_flash_decode<1, 128>", flash_decode_f16},
    {"kv_k_prefill_tiled<128>", prefill_tiled_f16},
    {"km_copy", copy},
    {"km_chase", chase},
};

} // namespace

extern "C" int km_probe(const char *name, const km_shape *s, km_trace *t, kv_error *err) {
    std::memset(t, 0, sizeof *t);
#if defined(KM_NO_TRACE)
    (void)s;
    return kv_fail(err, KV_EINPUT,
                   "km_probe: %s: this build has no load tracer (tests/cuda_model/kprobe.cpp needs "
                   "clang++; scripts/install-deps.sh installs it)",
                   name ? name : "(null)");
#else
    for (const probe &p : k_probes)
        if (name && !std::strcmp(p.name, name)) try {
                return p.run(s, t, err);
            } catch (const std::bad_alloc &) {
                return kv_fail(err, KV_EINTERNAL, "km_probe: %s: out of memory", name);
            }
    return kv_fail(err, KV_EINPUT,
                   "km_probe: no probe for kernel '%s' (tests/cuda_model/kprobe.cpp)",
                   name ? name : "(null)");
#endif
}
