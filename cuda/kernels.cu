/* Launchers of the layer kernels (cuda/kernels.h). The kernel bodies are in
 * cuda/kernels/kv_kernels.cuh, shared with the tests' host shim. */
#include "kernels.h"
#include "kernels/kv_kernels.cuh"
#include "kernels/kv_flash.cuh"
#include "kernels/kv_quant.cuh"
#include "kernels/kv_prefill.cuh"
#include "kernels/kv_evict.cuh"

#include <type_traits>

namespace kvcu {

namespace {

/* Static shared memory of any kernel here is at most this (the 32-element reduction arrays). */
constexpr size_t kStaticShared = 1024;

/* Dynamic shared memory above the 48 KiB every kernel gets by default (static + dynamic) must be
 * opted into per kernel (cudaFuncAttributeMaxDynamicSharedMemorySize; up to 227 KiB on sm_90):
 * `bytes` of dynamic memory plus the kernel's static arrays. A no-op when the default covers
 * them; the attribute's error otherwise. */
template <typename F> cudaError_t allow_shared(F *kernel, size_t bytes) {
    if (bytes + kStaticShared <= (size_t)48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(bytes + kStaticShared));
}

/* Blocks for a grid-stride loop over n items: enough to fill a large device, never 0. */
unsigned grid_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    if (b > 4096) b = 4096;
    return b ? (unsigned)b : 1u;
}

} // namespace

cudaError_t rmsnorm(float *out, const float *x, const int *idx, const float *w, int rows, int dim,
                    float eps, cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    KV_LAUNCH(kv_k_rmsnorm, rows, kThreads, 0, s)(out, x, idx, w, dim, eps);
    return cudaGetLastError();
}

cudaError_t rope(float *x, int rows, int row_stride, int n_heads, int hd, const int *pos,
                 const float *cos_t, const float *sin_t, int layout, cudaStream_t s) {
    size_t n = (size_t)rows * (size_t)n_heads * (size_t)(hd / 2);
    if (!n) return cudaSuccess;
    KV_LAUNCH(kv_k_rope, grid_for(n), kThreads, 0, s)
    (x, rows, row_stride, n_heads, hd, pos, cos_t, sin_t, layout);
    return cudaGetLastError();
}

cudaError_t swiglu(float *gate, const float *up, size_t n, cudaStream_t s) {
    if (!n) return cudaSuccess;
    KV_LAUNCH(kv_k_swiglu, grid_for(n), kThreads, 0, s)(gate, up, n);
    return cudaGetLastError();
}

cudaError_t add(float *x, const float *y, size_t n, cudaStream_t s) {
    if (!n) return cudaSuccess;
    KV_LAUNCH(kv_k_add, grid_for(n), kThreads, 0, s)(x, y, n);
    return cudaGetLastError();
}

cudaError_t add_bias(float *y, const float *b, int rows, int n, cudaStream_t s) {
    if (!b || rows <= 0 || n <= 0) return cudaSuccess;
    KV_LAUNCH(kv_k_add_bias, grid_for((size_t)rows * n), kThreads, 0, s)(y, b, rows, n);
    return cudaGetLastError();
}

cudaError_t gather_rows(float *out, const float *src, const int *idx, int rows, int dim,
                        cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    KV_LAUNCH(kv_k_gather_rows, rows, kThreads, 0, s)(out, src, idx, dim);
    return cudaGetLastError();
}

cudaError_t cache_write(const kv_k_pool &pool, const kv_k_write *writes, int n, const float *k,
                        const float *v, int kv_stride, const int *row_pos, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    KV_LAUNCH(kv_k_cache_write, grid_for(2 * (size_t)n), kThreads, 0, s)
    (pool, writes, n, k, v, kv_stride, row_pos);
    return cudaGetLastError();
}

cudaError_t paged_attention(const kv_k_pool &pool, const int *tables, const kv_k_attn_task *tasks,
                            int n_tasks, const int *pos, float *acc, float *acc2, const float *q,
                            float *o, int q_stride, int g, float *scratch, int scratch_stride,
                            cudaStream_t s) {
    if (n_tasks <= 0) return cudaSuccess;
    size_t shm = (size_t)g * (size_t)pool.hd * sizeof(float);
    cudaError_t e = allow_shared(kv_k_paged_attention, shm);
    if (e != cudaSuccess) return e;
    KV_LAUNCH(kv_k_paged_attention, n_tasks, kThreads, shm, s)
    (pool, tables, tasks, pos, acc, acc2, q, o, q_stride, g, scratch, scratch_stride);
    return cudaGetLastError();
}

cudaError_t decode_attention_split(const kv_k_pool &pool, const int *tables,
                                   const kv_k_attn_task *tasks, int n_tasks, const float *q,
                                   float *o, int q_stride, int g, int chunk, int chunks,
                                   float *scratch, int scratch_stride, float *part, const int *pos,
                                   float *acc, float *acc2, cudaStream_t s) {
    if (n_tasks <= 0) return cudaSuccess;
    int hd = pool.hd;
    size_t n_parts = (size_t)n_tasks * (size_t)chunks * (size_t)g;
    float *pm = part, *ps = part + n_parts, *po = part + 2 * n_parts;
    size_t shm = (size_t)g * (size_t)hd * sizeof(float);
    cudaError_t e = allow_shared(kv_k_decode_split, shm);
    if (e == cudaSuccess) e = allow_shared(kv_k_decode_stats, (size_t)g * sizeof(float));
    if (e != cudaSuccess) return e;
    KV_LAUNCH(kv_k_decode_split, dim3((unsigned)n_tasks, (unsigned)chunks), kThreads, shm, s)
    (pool, tables, tasks, q, q_stride, g, chunk, chunks, scratch, scratch_stride, pm, ps, po);
    KV_LAUNCH(kv_k_decode_merge, n_tasks, kThreads, 0, s)
    (tasks, g, hd, chunks, pm, ps, po, o, q_stride);
    if (acc) { /* the statistics of the tracked tasks */
        KV_LAUNCH(kv_k_decode_stats, dim3((unsigned)n_tasks, (unsigned)chunks), kThreads,
                  (size_t)g * sizeof(float), s)
        (tasks, g, chunk, chunks, scratch, scratch_stride, pm, ps, tables, pool.bs, pos, acc, acc2);
    }
    return cudaGetLastError();
}

bool flash_decode_fits(int g, int hd, int bs) {
    return g >= 1 && g <= KV_K_FD_GROUP && hd >= 8 && hd <= 256 && hd % 8 == 0 && bs >= 1 &&
           (bs & (bs - 1)) == 0;
}

namespace {

/* kv_k_flash_decode<TY, D> with D the power of two from 8 to 256 at or above d_h. */
template <int TY>
cudaError_t flash_type(const kv_k_pool &P, const int *tables, const kv_k_attn_task *tasks,
                       int n_tasks, const float *q, int q_stride, int g, int part, int parts,
                       float *scratch, int stride, float *pm, float *ps, float *po,
                       cudaStream_t s) {
    dim3 grid((unsigned)n_tasks, (unsigned)parts);
    int sh = 0;
    while ((1 << sh) < P.bs) sh++;
    size_t shm = kv_k_fd_shm(KV_K_FD_THREADS, g, P.hd, part, sh);
    int d = 8;
    while (d < P.hd) d *= 2;
#define KV_FD(D)                                                                                   \
    do {                                                                                           \
        auto *k_ = &kv_k_flash_decode<TY, D>;                                                      \
        cudaError_t e_ = allow_shared(k_, shm);                                                    \
        if (e_ != cudaSuccess) return e_;                                                          \
        KV_LAUNCH(k_, grid, KV_K_FD_THREADS, shm, s)                                               \
        (P, tables, tasks, q, q_stride, g, part, parts, sh, scratch, stride, pm, ps, po);          \
    } while (0)
    switch (d) {
    case 8:
        KV_FD(8);
        break;
    case 16:
        KV_FD(16);
        break;
    case 32:
        KV_FD(32);
        break;
    case 64:
        KV_FD(64);
        break;
    case 128:
        KV_FD(128);
        break;
    default:
        KV_FD(256);
        break;
    }
#undef KV_FD
    return cudaGetLastError();
}

} // namespace

cudaError_t flash_decode(const kv_k_pool &pool, const int *tables, const kv_k_attn_task *tasks,
                         int n_tasks, const float *q, float *o, int q_stride, int g, int part,
                         int parts, unsigned types, float *scratch, int scratch_stride,
                         float *part_buf, const int *pos, float *acc, float *acc2, cudaStream_t s) {
    if (n_tasks <= 0) return cudaSuccess;
    int hd = pool.hd;
    size_t n_parts = (size_t)n_tasks * (size_t)parts * (size_t)g;
    float *pm = part_buf, *ps = part_buf + n_parts, *po = part_buf + 2 * n_parts;
    cudaError_t e = cudaSuccess;
    if (types & 1u)
        e = flash_type<KV_TYPE_F32>(pool, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                    scratch, scratch_stride, pm, ps, po, s);
    if (!e && (types & 2u))
        e = flash_type<KV_TYPE_F16>(pool, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                    scratch, scratch_stride, pm, ps, po, s);
    if (!e && (types & 4u))
        e = flash_type<KV_TYPE_Q8>(pool, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                   scratch, scratch_stride, pm, ps, po, s);
    if (!e && (types & 8u))
        e = flash_type<KV_TYPE_Q4>(pool, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                   scratch, scratch_stride, pm, ps, po, s);
    if (e) return e;
    KV_LAUNCH(kv_k_decode_merge, n_tasks, kThreads, 0, s)
    (tasks, g, hd, parts, pm, ps, po, o, q_stride);
    if (acc) {
        KV_LAUNCH(kv_k_decode_stats_raw, dim3((unsigned)n_tasks, (unsigned)parts), kThreads,
                  2 * (size_t)g * sizeof(float), s)
        (tasks, g, part, parts, scratch, scratch_stride, pm, ps, tables, pool.bs, pos, acc, acc2);
    }
    return cudaGetLastError();
}

bool prefill_tiled_fits(int hd) {
    return hd == 16 || hd == 32 || hd == 64 || hd == 128;
}

cudaError_t prefill_tiled(const kv_k_pool &pool, const int *tables, const kv_k_attn_task *tasks,
                          int n_tasks, int max_rows, int longest, const float *q, float *o,
                          int q_stride, int g, float *ml, const int *pos, float *acc, float *acc2,
                          cudaStream_t s) {
    if (n_tasks <= 0 || max_rows <= 0) return cudaSuccess;
    dim3 grid((unsigned)n_tasks, (unsigned)((max_rows + KV_K_PT_BQ - 1) / KV_K_PT_BQ));
    dim3 sgrid((unsigned)n_tasks, (unsigned)((longest + KV_K_PT_BK - 1) / KV_K_PT_BK));
#define KV_PT(D)                                                                                   \
    do {                                                                                           \
        KV_LAUNCH(kv_k_prefill_tiled<D>, grid, KV_K_PT_THREADS, KV_K_PT_SHM(D), s)                 \
        (pool, tables, tasks, q, o, q_stride, g, ml, max_rows);                                    \
        if (acc) KV_LAUNCH(kv_k_prefill_stats<D>, sgrid, KV_K_PT_THREADS, KV_K_PT_STATS_SHM(D), s) \
        (pool, tables, tasks, q, q_stride, g, ml, max_rows, pos, acc, acc2);                       \
    } while (0)
    switch (pool.hd) {
    case 16:
        KV_PT(16);
        break;
    case 32:
        KV_PT(32);
        break;
    case 64:
        KV_PT(64);
        break;
    default:
        KV_PT(128);
        break;
    }
#undef KV_PT
    return cudaGetLastError();
}

cudaError_t gather_pass(const kv_k_pool &pool, const kv_k_move *moves, int n, void *scratch,
                        cudaStream_t s) {
    size_t total = (size_t)n * 8 * (size_t)pool.hd;
    if (!total) return cudaSuccess;
    if (pool.pos) total += (size_t)n * sizeof(kv_k_gather_meta); /* the metadata threads */
    unsigned char *sc = static_cast<unsigned char *>(scratch);
    KV_LAUNCH(kv_k_gather_read, grid_for(total), kThreads, 0, s)(pool, moves, n, sc);
    KV_LAUNCH(kv_k_gather_write, grid_for(total), kThreads, 0, s)(pool, moves, n, sc);
    return cudaGetLastError();
}

size_t gather_scratch_bytes(int n, int hd) {
    size_t rows = (size_t)n * 8 * (size_t)hd;
    return (rows + 15) / 16 * 16 + (size_t)n * sizeof(kv_k_gather_meta);
}

cudaError_t evict(const kv_k_pool &pool, const kv_evict *ev, int n, const int *tab, float *score,
                  unsigned char *mask, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    size_t shm = evict_shared_bytes(pool.hd);
    cudaError_t e = allow_shared(kv_k_evict, shm);
    if (e != cudaSuccess) return e;
    KV_LAUNCH(kv_k_evict, n, KV_K_EV_THREADS, shm, s)(pool, ev, tab, score, mask);
    return cudaGetLastError();
}

cudaError_t table_patch(int *tables, const int *patch, long n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    KV_LAUNCH(kv_k_table_patch, grid_for((size_t)n), kThreads, 0, s)(tables, patch, n);
    return cudaGetLastError();
}

namespace {

/* f(std::integral_constant<int, R>()) for the GEMV kernel R that serves the step's rows (1 ..
 * KV_K_GEMV_ROWS): R = rows up to 8, then the next of 16, 24, 32 (the kernels take the rows at
 * run time and keep R accumulators). One dispatch for every typed GEMV. */
template <typename F> void for_rows(int rows, F &&f) {
    switch (rows) {
    case 1:
        f(std::integral_constant<int, 1>());
        break;
    case 2:
        f(std::integral_constant<int, 2>());
        break;
    case 3:
        f(std::integral_constant<int, 3>());
        break;
    case 4:
        f(std::integral_constant<int, 4>());
        break;
    case 5:
        f(std::integral_constant<int, 5>());
        break;
    case 6:
        f(std::integral_constant<int, 6>());
        break;
    case 7:
        f(std::integral_constant<int, 7>());
        break;
    case 8:
        f(std::integral_constant<int, 8>());
        break;
    default:
        if (rows <= 16)
            f(std::integral_constant<int, 16>());
        else if (rows <= 24)
            f(std::integral_constant<int, 24>());
        else
            f(std::integral_constant<int, 32>());
        break;
    }
}

static_assert(KV_K_GEMV_ROWS == 32, "for_rows instantiates rows up to 32");

/* Elements per quantised activation block of a typed block GEMV: 256 for the K-quants (the
 * CPU's layout "K"), 32 for Q8_0 and Q4_0 (layout "A"). */
int act_block(int t) {
    return t == KV_DT_Q4_K || t == KV_DT_Q6_K ? 256 : 32;
}

/* Byte offset in `act` of the per-block sums (after q and the scales, 16-byte aligned: the
 * K-quant kernels load 16 sums at a time). */
size_t act_sums_at(int t, int rows, int in) {
    size_t nb = (size_t)rows * (size_t)(in / act_block(t));
    return nb * (size_t)act_block(t) + (4 * nb + 15) / 16 * 16;
}

/* The block types' GEMV: x quantised once into act (kv_k_quantize_q8 or _q8k), then the typed
 * kernel for t (Q8_0, Q4_0, Q4_K, Q6_K) at R = for_rows(rows). */
cudaError_t gemv_quant(int t, const unsigned char *W, size_t rb, const float *x, float *y, int rows,
                       int in, int out, void *act, cudaStream_t s) {
    size_t nb = (size_t)rows * (size_t)(in / act_block(t));
    signed char *q = static_cast<signed char *>(act);
    float *d = reinterpret_cast<float *>(q + nb * (size_t)act_block(t));
    void *sums = q + act_sums_at(t, rows, in);
    unsigned qblocks = nb / 4 > 4096 ? 4096u : (unsigned)(nb / 4 + 1);
    if (act_block(t) == 32)
        KV_LAUNCH(kv_k_quantize_q8, qblocks, kThreads, 0, s)(x, rows, in, q, d, (int *)sums);
    else
        KV_LAUNCH(kv_k_quantize_q8k, qblocks, kThreads, 0, s)(x, rows, in, q, d, (short *)sums);
    int per = KV_K_GEMV_Q4K_THREADS / 8; /* Q4_K: output rows per block */
    size_t qkb = ((size_t)out + per - 1) / per;
    unsigned blocks = out > 65535 ? 65535u : (unsigned)out, q4kb = qkb > 65535 ? 65535u : qkb;
    const int *si = static_cast<const int *>(sums);
    const short *ss = static_cast<const short *>(sums);
    for_rows(rows, [&](auto rc) {
        constexpr int R = decltype(rc)::value;
        if (t == KV_DT_Q8_0) {
            auto *k = &kv_k_gemv_q<kv_q8_0_dot, R>;
            KV_LAUNCH(k, blocks, KV_K_GEMV_THREADS, 0, s)(W, rb, q, d, si, y, rows, in, out);
        } else if (t == KV_DT_Q4_0) {
            auto *k = &kv_k_gemv_q<kv_q4_0_dot, R>;
            KV_LAUNCH(k, blocks, KV_K_GEMV_THREADS, 0, s)(W, rb, q, d, si, y, rows, in, out);
        } else if (t == KV_DT_Q4_K) {
            KV_LAUNCH(kv_k_gemv_q4k<R>, q4kb, KV_K_GEMV_Q4K_THREADS, 0, s)
            (W, rb, q, d, ss, y, rows, in, out);
        } else {
            auto *k = &kv_k_gemv_qk<kv_q6k_lane, R>;
            KV_LAUNCH(k, blocks, KV_K_GEMV_THREADS, 0, s)(W, rb, q, d, ss, y, rows, in, out);
        }
    });
    return cudaGetLastError();
}

} // namespace

size_t gemv_act_bytes(int t, int rows, int in) {
    int k = t == KV_DT_Q4_K || t == KV_DT_Q6_K || t == KV_DT_Q8_0 || t == KV_DT_Q4_0;
    if (!k || in % act_block(t)) return 0;
    /* q, the scales, then an int sum per 32 (layout A) or an int16 sum per 16 (layout K) */
    return act_sums_at(t, rows, in) + (size_t)rows * (size_t)in / 8;
}

cudaError_t gemv(const void *W, int t, size_t row_bytes, const float *x, float *y, int rows, int in,
                 int out, void *act, cudaStream_t s) {
    if (rows <= 0 || out <= 0) return cudaSuccess;
    const unsigned char *w = static_cast<const unsigned char *>(W);
    unsigned blocks = out > 65535 ? 65535u : (unsigned)out;
    if (t == KV_DT_F16 && in % 8 == 0 && rows <= KV_K_GEMV_ROWS) {
        for_rows(rows, [&](auto rc) {
            KV_LAUNCH(kv_k_gemv_f16<decltype(rc)::value>, blocks, KV_K_GEMV_THREADS, 0, s)
            (w, x, y, rows, in, out);
        });
        return cudaGetLastError();
    }
    if (act && gemv_act_bytes(t, rows, in) && rows <= KV_K_GEMV_ROWS)
        return gemv_quant(t, w, row_bytes, x, y, rows, in, out, act, s);
    size_t wb = ((size_t)out + kThreads / 32 - 1) / (kThreads / 32); /* a warp per output */
    if (wb > 65535) wb = 65535;
    KV_LAUNCH(kv_k_gemv, (unsigned)wb, kThreads, 0, s)(w, t, row_bytes, x, y, rows, in, out);
    return cudaGetLastError();
}

cudaError_t dequant_rows(const void *W, int t, size_t row_bytes, int in, int r0, int n_rows,
                         float *dst, cudaStream_t s) {
    size_t n = (size_t)n_rows * (size_t)in;
    if (!n) return cudaSuccess;
    KV_LAUNCH(kv_k_dequant_rows, grid_for(n), kThreads, 0, s)
    (static_cast<const unsigned char *>(W), t, row_bytes, in, r0, n_rows, dst);
    return cudaGetLastError();
}

cudaError_t to_16(const float *x, void *dst, size_t n, int t, cudaStream_t s) {
    if (!n) return cudaSuccess;
    KV_LAUNCH(kv_k_to_16, grid_for(n), kThreads, 0, s)(x, static_cast<uint16_t *>(dst), n, t);
    return cudaGetLastError();
}

cudaError_t gather_rows_typed(float *out, const void *W, int t, size_t row_bytes, const int *idx,
                              int rows, int dim, cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    KV_LAUNCH(kv_k_gather_rows_typed, rows, kThreads, 0, s)
    (out, static_cast<const unsigned char *>(W), t, row_bytes, idx, dim);
    return cudaGetLastError();
}

} // namespace kvcu
