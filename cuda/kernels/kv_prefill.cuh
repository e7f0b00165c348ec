/* Tiled prefill attention (FlashAttention-2, Dao 2023, "FlashAttention-2: Faster Attention
 * with Better Parallelism and Work Partitioning", Algorithm 1, forward pass): query tiles x
 * KV tiles over the paged block tables, S = Q K^T and O += P V on tensor cores (16 x 16 x 16
 * binary16 inputs, fp32 accumulation), an online softmax per query row (running max and sum
 * in fp32), causal tile skipping; and, for heads that track attention statistics (h2o,
 * avgattn, l2attn), a second pass that recomputes each KV tile's scores against every query
 * tile and adds the exact normalised weights exp(s - M) / L to acc / acc2, one thread per
 * entry in the CPU's (query, head) order, as kv_k_paged_attention does.
 *
 * Written once for the device (WMMA, <mma.h>) and the host shim (an emulation below: every
 * lane holds the whole 16 x 16 tile, the product summed in fp32 in k order; the tensor core's
 * own accumulation order and rounding inside one 16-wide k step may differ from it by an fp32
 * rounding, not more).
 *
 * Precision (the bits policy of this kernel, unlike the CPU's fp32 attention): the scaled
 * queries q / sqrt(d_h) and the softmax numerators p are rounded to binary16 for the MMAs;
 * K and V are read from f16 heads, exactly. Scores therefore carry a relative error of about
 * 2^-11 of sum |q_d k_d|, and the outputs about 2^-11 of the largest |v| (measured against the
 * one-block kernel on the shim: tests/test_cuda_kernels.cpp). The engine uses it only for
 * prefill steps whose heads are all f16 (cuda/backend_cuda.cu); other types keep
 * kv_k_paged_attention. */
#ifndef KVPLAN_CUDA_KV_PREFILL_CUH
#define KVPLAN_CUDA_KV_PREFILL_CUH

#include "kv_kernels.cuh"
#include "kv_quant.cuh" /* kv_h2f */

#include <stdint.h>

/* ---- 16 x 16 x 16 tiles: a = [16 rows][16 k] row-major, bt = B given as its transpose's rows
 * ([16 n][16 k], i.e. col-major B: K rows), b = [16 k][16 n] row-major (V rows), c fp32
 * [16][16]; f16 operands as binary16 bits in shared memory, ld in elements ---- */
#if defined(__CUDACC__)
#include <mma.h>
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major>
    kv_mma_a;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major>
    kv_mma_bt;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::row_major>
    kv_mma_b;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> kv_mma_c;
KV_DEVICE void kv_mma_load_a(kv_mma_a &f, const unsigned short *p, int ld) {
    nvcuda::wmma::load_matrix_sync(f, reinterpret_cast<const __half *>(p), ld);
}
KV_DEVICE void kv_mma_load_bt(kv_mma_bt &f, const unsigned short *p, int ld) {
    nvcuda::wmma::load_matrix_sync(f, reinterpret_cast<const __half *>(p), ld);
}
KV_DEVICE void kv_mma_load_b(kv_mma_b &f, const unsigned short *p, int ld) {
    nvcuda::wmma::load_matrix_sync(f, reinterpret_cast<const __half *>(p), ld);
}
KV_DEVICE void kv_mma_zero(kv_mma_c &c) {
    nvcuda::wmma::fill_fragment(c, 0.0f);
}
template <typename B> KV_DEVICE void kv_mma(kv_mma_c &c, const kv_mma_a &a, const B &b) {
    nvcuda::wmma::mma_sync(c, a, b, c);
}
KV_DEVICE void kv_mma_store(float *p, const kv_mma_c &c, int ld) {
    nvcuda::wmma::store_matrix_sync(p, c, ld, nvcuda::wmma::mem_row_major);
}
#define kv_syncwarp() __syncwarp()
#else
struct kv_mma_tile {
    float v[16][16];
};
typedef kv_mma_tile kv_mma_a;  /* v[row][k] */
typedef kv_mma_tile kv_mma_bt; /* v[k][n] */
typedef kv_mma_tile kv_mma_b;  /* v[k][n] */
typedef kv_mma_tile kv_mma_c;  /* v[row][n] */
KV_DEVICE void kv_mma_load_a(kv_mma_a &f, const unsigned short *p, int ld) {
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) f.v[i][k] = kv_h2f(p[i * ld + k]);
}
KV_DEVICE void kv_mma_load_bt(kv_mma_bt &f, const unsigned short *p, int ld) {
    for (int n = 0; n < 16; n++)
        for (int k = 0; k < 16; k++) f.v[k][n] = kv_h2f(p[n * ld + k]);
}
KV_DEVICE void kv_mma_load_b(kv_mma_b &f, const unsigned short *p, int ld) {
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.v[k][n] = kv_h2f(p[k * ld + n]);
}
KV_DEVICE void kv_mma_zero(kv_mma_c &c) {
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 16; n++) c.v[i][n] = 0.0f;
}
/* Called once per lane per emulated MMA when defined: the CUDA performance model's tracer
 * (tests/cuda_model/ktrace.cpp) counts the tensor-core work this way; a weak reference, so
 * other shim builds need not define it. */
extern "C" void kv_shim_mma_hook(void) __attribute__((weak));
KV_DEVICE void kv_mma(kv_mma_c &c, const kv_mma_tile &a, const kv_mma_tile &b) {
    if (kv_shim_mma_hook) kv_shim_mma_hook();
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 16; n++) {
            float s = c.v[i][n];
            for (int k = 0; k < 16; k++) s += a.v[i][k] * b.v[k][n];
            c.v[i][n] = s;
        }
}
/* every lane writes the same tile: the caller's kv_syncwarp orders it before the reads */
KV_DEVICE void kv_mma_store(float *p, const kv_mma_c &c, int ld) {
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 16; n++) p[i * ld + n] = c.v[i][n];
}
/* a warp barrier: the shim's shuffle waits for every lane of the warp */
#define kv_syncwarp() ((void)kv_shfl_xor(0, 0))
#endif

/* Query rows of a block (4 warps x 16) and entries of a KV tile. A query row is a (new token
 * i, query head gh) pair of a task, row = i * g + gh: the GQA group's heads share each K/V
 * tile. */
#define KV_K_PT_BQ 64
#define KV_K_PT_BK 32
#define KV_K_PT_THREADS 128

/* Dynamic shared memory of kv_k_prefill_tiled at head dimension d (<= 128: 45 056 bytes, no
 * opt-in above 48 KiB needed) and of kv_k_prefill_stats. */
#define KV_K_PT_SHM(d)                                                                             \
    ((size_t)(KV_K_PT_BQ + 2 * KV_K_PT_BK) * (size_t)(d)*2 + (size_t)KV_K_PT_BQ * KV_K_PT_BK * 6)
#define KV_K_PT_STATS_SHM(d)                                                                       \
    ((size_t)(KV_K_PT_BQ + KV_K_PT_BK) * (size_t)(d)*2 + (size_t)KV_K_PT_BQ * KV_K_PT_BK * 4)

/* Rows r0 .. r0 + BQ - 1 of task t's queries, scaled by 1/sqrt(D) and rounded to binary16,
 * into qs [BQ][D] (rows past the task's n * g: zeros). Whole block. */
template <int D>
KV_DEVICE void kv_pt_load_q(const kv_k_attn_task &t, int g, int r0, const float *q, int q_stride,
                            unsigned short *qs) {
    float inv = 1.0f / sqrtf((float)D);
    for (int x = kv_tid(); x < KV_K_PT_BQ * D; x += kv_bdim()) {
        int r = r0 + x / D, d = x % D, i = r / g, gh = r % g;
        float v = 0.0f;
        if (r < t.n * g)
            v = q[(size_t)(t.row0 + i) * (size_t)q_stride + (size_t)(t.kv_head * g + gh) * D + d] *
                inv;
        qs[x] = kv_f32_to_f16(v);
    }
}

/* Entries k0 .. k0 + BK - 1 of an f16 head (rows past n_ent: zeros) into ks [BK][D] (which = 0,
 * K) or V: 16-byte loads, 8 halves each. Whole block. */
template <int D>
KV_DEVICE void kv_pt_load_kv(const kv_k_pool &P, const int *table, int k0, int n_ent, int which,
                             unsigned short *ks) {
    size_t rb = kvt_row_bytes(KV_TYPE_F16, D);
    for (int x = kv_tid(); x < KV_K_PT_BK * D / 8; x += kv_bdim()) {
        int e = k0 + x / (D / 8), c = x % (D / 8);
        unsigned w[4] = {0u, 0u, 0u, 0u};
        if (e < n_ent)
            kv_load16(
                kv_k_row(P, KV_TYPE_F16, rb, kv_slot_of_entry(table, e, P.bs), which) + 16 * c, w);
        for (int k = 0; k < 4; k++) {
            ks[(x / (D / 8)) * D + 8 * c + 2 * k] = (unsigned short)(w[k] & 0xffffu);
            ks[(x / (D / 8)) * D + 8 * c + 2 * k + 1] = (unsigned short)(w[k] >> 16);
        }
    }
}

/* sw [16][BK] = the warp's 16 query rows of qs . ks^T (fp32). Whole warp. */
template <int D>
KV_DEVICE void kv_pt_scores(const unsigned short *qw, const unsigned short *ks, float *sw) {
    for (int nt = 0; nt < KV_K_PT_BK / 16; nt++) {
        kv_mma_c c;
        kv_mma_zero(c);
        KV_UNROLL
        for (int kk = 0; kk < D / 16; kk++) {
            kv_mma_a a;
            kv_mma_bt b;
            kv_mma_load_a(a, qw + 16 * kk, D);
            kv_mma_load_bt(b, ks + nt * 16 * D + 16 * kk, D);
            kv_mma(c, a, b);
        }
        kv_mma_store(sw + 16 * nt, c, KV_K_PT_BK);
    }
}

/* The online-softmax state of one lane: query row (warp row lane / 2), half h = lane % 2 of
 * each KV tile's columns and of each 16-column output tile (8 columns per output tile). */
template <int D> struct kv_pt_row { float m, l, o[D / 2]; };

/* One KV tile's softmax update of a lane's row from sw (the tile's scores): entries past
 * `last` (causal) or of an invalid row masked, running max / sum rescaled, the lane's output
 * columns rescaled, p = exp(s - m) written to pw as binary16. Whole warp. */
template <int D>
KV_DEVICE void kv_pt_softmax(kv_pt_row<D> &st, const float *sw, unsigned short *pw, int k0,
                             int last) {
    int lane = kv_tid() % KV_WARP, row = lane / 2, h = lane % 2;
    float s[16], mx = -INFINITY;
    for (int j = 0; j < 16; j++) {
        int c = 16 * h + j;
        s[j] = k0 + c <= last ? sw[row * KV_K_PT_BK + c] : -INFINITY;
        mx = s[j] > mx ? s[j] : mx;
    }
    float other = kv_shfl_xor(mx, 1);
    mx = other > mx ? other : mx;
    float mn = mx > st.m ? mx : st.m;
    float alpha = mn == -INFINITY ? 1.0f : expf(st.m - mn), sum = 0.0f;
    for (int j = 0; j < 16; j++) {
        float p = mn == -INFINITY ? 0.0f : expf(s[j] - mn);
        unsigned short hb = kv_f32_to_f16(p);
        pw[row * KV_K_PT_BK + 16 * h + j] = hb;
        sum += p;
    }
    sum += kv_shfl_xor(sum, 1);
    st.l = st.l * alpha + sum;
    st.m = mn;
    for (int k = 0; k < D / 2; k++) st.o[k] *= alpha;
}

/* The lane's output columns += (pw . vs) (16 x BK times BK x D), through sw as a 16 x 16
 * bounce tile per output tile. Whole warp. */
template <int D>
KV_DEVICE void kv_pt_pv(kv_pt_row<D> &st, const unsigned short *pw, const unsigned short *vs,
                        float *sw) {
    int lane = kv_tid() % KV_WARP, row = lane / 2, h = lane % 2;
    KV_UNROLL
    for (int dt = 0; dt < D / 16; dt++) {
        kv_mma_c c;
        kv_mma_zero(c);
        for (int kk = 0; kk < KV_K_PT_BK / 16; kk++) {
            kv_mma_a a;
            kv_mma_b b;
            kv_mma_load_a(a, pw + 16 * kk, KV_K_PT_BK);
            kv_mma_load_b(b, vs + 16 * kk * D + 16 * dt, D);
            kv_mma(c, a, b);
        }
        kv_mma_store(sw, c, 16);
        kv_syncwarp();
        for (int j = 0; j < 8; j++) st.o[8 * dt + j] += sw[row * 16 + 8 * h + j];
        kv_syncwarp();
    }
}

/* Tiled prefill attention, pass 1. Grid (n_tasks, query tiles): block (b, y) takes query rows
 * y * BQ .. y * BQ + BQ - 1 of task b (row = i * g + gh; blocks past the task's n * g rows
 * return). Every task's heads are f16 (KV_TYPE_F16) with d_h = D (16, 32, 64 or 128). For new
 * token i (query row row0 + i) and query head kv_head * g + gh, entries 0 .. len - n + i:
 *   s_e = q . k_e / sqrt(D), o = sum_e softmax(s)_e v_e   (as kv_k_paged_attention)
 * KV tiles of BK entries in order up to the tile's last query's last entry (causal skipping),
 * each loaded once for the block's 64 rows. ml: per task 2 * ml_stride floats (ml_stride >=
 * the longest n * g): the row's final max M and sum L (for kv_k_prefill_stats). q, o: [rows,
 * q_stride]. Block: KV_K_PT_THREADS (128, required); dynamic shared memory KV_K_PT_SHM(D). */
template <int D>
KV_GLOBAL void kv_k_prefill_tiled(kv_k_pool P, const int *tables, const kv_k_attn_task *tasks,
                                  const float *q, float *o, int q_stride, int g, float *ml,
                                  int ml_stride) {
    KV_DYNAMIC_SHARED(unsigned short, qs);
    kv_k_attn_task t = tasks[kv_bid()];
    int r0 = kv_bid_y() * KV_K_PT_BQ, rows = t.n * g, base = t.len - t.n;
    if (r0 >= rows) return; /* uniform over the block */
    unsigned short *ks = qs + KV_K_PT_BQ * D, *vs = ks + KV_K_PT_BK * D;
    float *sw_all = reinterpret_cast<float *>(vs + KV_K_PT_BK * D);
    unsigned short *pw_all = reinterpret_cast<unsigned short *>(sw_all + KV_K_PT_BQ * KV_K_PT_BK);
    int warp = kv_tid() / KV_WARP, lane = kv_tid() % KV_WARP;
    float *sw = sw_all + warp * 16 * KV_K_PT_BK;
    unsigned short *pw = pw_all + warp * 16 * KV_K_PT_BK;
    const int *table = tables + t.table_off;
    int last_row = (r0 + KV_K_PT_BQ < rows ? r0 + KV_K_PT_BQ : rows) - 1;
    int n_ent = base + last_row / g + 1; /* entries any row of the tile sees */
    int row = r0 + warp * 16 + lane / 2;
    int last = row < rows ? base + row / g : -1; /* this row's last entry */
    kv_pt_load_q<D>(t, g, r0, q, q_stride, qs);
    kv_pt_row<D> st;
    st.m = -INFINITY;
    st.l = 0.0f;
    for (int k = 0; k < D / 2; k++) st.o[k] = 0.0f;
    for (int k0 = 0; k0 < n_ent; k0 += KV_K_PT_BK) {
        kv_syncthreads(); /* the previous tile's K/V are read */
        kv_pt_load_kv<D>(P, table, k0, n_ent, 0, ks);
        kv_pt_load_kv<D>(P, table, k0, n_ent, 1, vs);
        kv_syncthreads();
        kv_pt_scores<D>(qs + warp * 16 * D, ks, sw);
        kv_syncwarp();
        kv_pt_softmax<D>(st, sw, pw, k0, last);
        kv_syncwarp();
        kv_pt_pv<D>(st, pw, vs, sw);
    }
    if (row >= rows) return; /* no barrier follows */
    int i = row / g, gh = row % g, h = lane % 2;
    float *orow = o + (size_t)(t.row0 + i) * (size_t)q_stride + (size_t)(t.kv_head * g + gh) * D;
    float rl = 1.0f / st.l;
    for (int dt = 0; dt < D / 16; dt++)
        for (int j = 0; j < 8; j++) orow[16 * dt + 8 * h + j] = st.o[8 * dt + j] * rl;
    if (h == 0) {
        float *mlt = ml + (size_t)kv_bid() * 2 * (size_t)ml_stride;
        mlt[row] = st.m;
        mlt[ml_stride + row] = st.l;
    }
}

/* Tiled prefill attention, pass 2 (tracked tasks only; others return): grid (n_tasks, KV
 * tiles); block (b, y) takes entries k0 = y * BK .. k0 + BK - 1 of task b, recomputes their
 * scores against every query tile that sees them (the same MMAs as pass 1) and, one thread per
 * entry, for the rows in order (token i, then head gh: the CPU's order) adds w = exp(s - M) *
 * (1 / L) to acc at kv_k_meta_at(e) and, when pos(query) - pos(e) >= KV_K_L2_WINDOW, w^2 to acc2,
 * where the row sees the entry (e <= len - n + i). M, L: ml from pass 1. Block:
 * KV_K_PT_THREADS; dynamic shared memory KV_K_PT_STATS_SHM(D). */
template <int D>
KV_GLOBAL void kv_k_prefill_stats(kv_k_pool P, const int *tables, const kv_k_attn_task *tasks,
                                  const float *q, int q_stride, int g, const float *ml,
                                  int ml_stride, const int *pos, float *acc, float *acc2) {
    KV_DYNAMIC_SHARED(unsigned short, qs);
    kv_k_attn_task t = tasks[kv_bid()];
    int k0 = kv_bid_y() * KV_K_PT_BK, rows = t.n * g, base = t.len - t.n;
    if (!t.track || k0 >= t.len) return; /* uniform over the block */
    unsigned short *ks = qs + KV_K_PT_BQ * D;
    float *s_all = reinterpret_cast<float *>(ks + KV_K_PT_BK * D);
    int warp = kv_tid() / KV_WARP, e = k0 + kv_tid();
    const int *table = tables + t.table_off;
    const float *mt = ml + (size_t)kv_bid() * 2 * (size_t)ml_stride, *lt = mt + ml_stride;
    kv_pt_load_kv<D>(P, table, k0, t.len, 0, ks);
    int mine = kv_tid() < KV_K_PT_BK && e < t.len;
    int mi = mine ? kv_k_meta_at(t, table, P.bs, e) : 0;
    float a = mine ? acc[mi] : 0.0f, a2 = mine ? acc2[mi] : 0.0f;
    int epos = mine ? pos[mi] : 0;
    /* the first row that sees entry k0: token k0 - base (or 0) */
    int first = k0 > base ? (k0 - base) * g : 0;
    for (int r0 = first / KV_K_PT_BQ * KV_K_PT_BQ; r0 < rows; r0 += KV_K_PT_BQ) {
        kv_syncthreads(); /* qs and s_all are free */
        kv_pt_load_q<D>(t, g, r0, q, q_stride, qs);
        kv_syncthreads();
        kv_pt_scores<D>(qs + warp * 16 * D, ks, s_all + warp * 16 * KV_K_PT_BK);
        kv_syncthreads();
        for (int r = r0; mine && r < r0 + KV_K_PT_BQ && r < rows; r++) {
            int i = r / g;
            if (e > base + i) continue;
            float w = expf(s_all[(r - r0) * KV_K_PT_BK + kv_tid()] - mt[r]) * (1.0f / lt[r]);
            a += w;
            if (pos[kv_k_meta_at(t, table, P.bs, base + i)] - epos >= KV_K_L2_WINDOW) a2 += w * w;
        }
    }
    if (mine) {
        acc[mi] = a;
        acc2[mi] = a2;
    }
}

#endif
