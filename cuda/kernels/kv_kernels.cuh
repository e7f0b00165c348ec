/* kvplan's layer kernels, written once for the CUDA device (cuda/kernels.cu launches them)
 * and for the host shim the tests run them on (tests/support/cuda_shim.hpp). Each kernel
 * computes what the CPU backend computes (runtime/ops.c, runtime/backend_cpu.c,
 * runtime/kvcache.c); the tests in
 * tests/test_cuda_kernels.cpp compare them at small sizes.
 *
 * Conventions: all matrices row-major fp32; `rows` is the number of token rows of a step (the
 * new tokens of every sequence, sequence-major). Blocks are 1-D and any multiple of 32
 * threads unless a kernel says otherwise; elementwise kernels use grid-stride loops, so any
 * grid size is correct. Reductions run in a fixed order (kv_block_sum), so a kernel gives the
 * same bits on every run of the same launch configuration.
 *
 * The paged KV pool is the CPU layout (include/kvplan/kvslot.h, kv_k_pool): one block range
 * per storage type (f32, f16, q8, q4; runtime/cache/kvtype.h), a block [K|V][slot][row bytes].
 * Rows are encoded and decoded with the CPU's own codec (kvt_encode, kvt_decode_at), host+device
 * under nvcc, so both backends store the same bytes and attention reads the stored type.
 * Per-entry metadata (position id, accumulated attention weight for H2O / Batch-Max avgattn,
 * accumulated squared weight for KV-Compress L2) stays the engine's host metadata; a step
 * uploads the attending heads' entries and downloads the statistics.
 */
#ifndef KVPLAN_CUDA_KV_KERNELS_CUH
#define KVPLAN_CUDA_KV_KERNELS_CUH

#include "kv_defs.cuh"
#include "kv_tasks.h"
#include "cache/kvslot.h"
#include "cache/kvtype.h"

#include <math.h>
#include <stddef.h>

/* RMSNorm (Zhang & Sennrich 2019): out[r] = x[src] / sqrt(mean(x[src]^2) + eps) * w, with src
 * = idx[r] when idx is given (the last row of each sequence, before the logits) else r.
 * Grid: one block per output row. The sum of squares is taken in double, as on the CPU
 * (kv_op_rmsnorm). out and x may alias only when idx is NULL. */
KV_GLOBAL void kv_k_rmsnorm(float *out, const float *x, const int *idx, const float *w, int dim,
                            float eps) {
    KV_SHARED_ARRAY(double, red, 32);
    int r = kv_bid();
    const float *xr = x + (size_t)(idx ? idx[r] : r) * (size_t)dim;
    float *o = out + (size_t)r * (size_t)dim;
    double ss = 0.0;
    for (int i = kv_tid(); i < dim; i += kv_bdim()) ss += (double)xr[i] * (double)xr[i];
    ss = kv_block_sum(ss, red);
    float scale = (float)(1.0 / sqrt(ss / dim + (double)eps));
    for (int i = kv_tid(); i < dim; i += kv_bdim()) o[i] = xr[i] * scale * w[i];
}

/* RoPE (Su et al. 2021) in place on `rows` rows of n_heads heads of hd floats (row stride
 * `row_stride` floats), row r at position pos[r], from the tables cos_t/sin_t [positions,
 * hd/2] that kv_op_rope_tables computes. layout KV_K_ROPE_ADJACENT rotates (2i, 2i+1),
 * KV_K_ROPE_HALF rotates (i, i + hd/2). One thread per pair; any grid. */
KV_GLOBAL void kv_k_rope(float *x, int rows, int row_stride, int n_heads, int hd, const int *pos,
                         const float *cos_t, const float *sin_t, int layout) {
    int half = hd / 2;
    size_t n = (size_t)rows * (size_t)n_heads * (size_t)half;
    for (size_t t = (size_t)kv_bid() * kv_bdim() + kv_tid(); t < n;
         t += (size_t)kv_gdim() * kv_bdim()) {
        int i = (int)(t % (size_t)half);
        size_t rh = t / (size_t)half;
        int h = (int)(rh % (size_t)n_heads), r = (int)(rh / (size_t)n_heads);
        float *v = x + (size_t)r * (size_t)row_stride + (size_t)h * (size_t)hd;
        int a = layout == KV_K_ROPE_ADJACENT ? 2 * i : i;
        int b = layout == KV_K_ROPE_ADJACENT ? 2 * i + 1 : i + half;
        float cs = cos_t[(size_t)pos[r] * (size_t)half + (size_t)i];
        float sn = sin_t[(size_t)pos[r] * (size_t)half + (size_t)i];
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs - x1 * sn;
        v[b] = x0 * sn + x1 * cs;
    }
}

/* SwiGLU (Shazeer 2020): gate[i] = silu(gate[i]) * up[i], silu(a) = a / (1 + e^-a), n floats. */
KV_GLOBAL void kv_k_swiglu(float *gate, const float *up, size_t n) {
    for (size_t i = (size_t)kv_bid() * kv_bdim() + kv_tid(); i < n;
         i += (size_t)kv_gdim() * kv_bdim()) {
        float a = gate[i];
        gate[i] = a / (1.0f + expf(-a)) * up[i];
    }
}

/* Residual: x[i] += y[i], n floats. */
KV_GLOBAL void kv_k_add(float *x, const float *y, size_t n) {
    for (size_t i = (size_t)kv_bid() * kv_bdim() + kv_tid(); i < n;
         i += (size_t)kv_gdim() * kv_bdim())
        x[i] += y[i];
}

/* Bias: y[r, i] += b[i] for rows x n (the q/k/v biases of qwen2). */
KV_GLOBAL void kv_k_add_bias(float *y, const float *b, int rows, int n) {
    size_t total = (size_t)rows * (size_t)n;
    for (size_t i = (size_t)kv_bid() * kv_bdim() + kv_tid(); i < total;
         i += (size_t)kv_gdim() * kv_bdim())
        y[i] += b[i % (size_t)n];
}

/* Row gather: out[r] = src[idx[r]] for n_rows rows of dim floats (token embedding lookup).
 * Grid: one block per row. */
KV_GLOBAL void kv_k_gather_rows(float *out, const float *src, const int *idx, int dim) {
    int r = kv_bid();
    const float *s = src + (size_t)idx[r] * (size_t)dim;
    for (int i = kv_tid(); i < dim; i += kv_bdim()) out[(size_t)r * (size_t)dim + i] = s[i];
}

/* ---- the typed pool (kv_k_pool): block types and row addresses ---- */

/* Type of block `block` (the range it lies in). */
KV_DEVICE kv_cache_type kv_k_block_type(const kv_k_pool &P, int block) {
    int t = 0;
    while (t + 1 < KV_CACHE_TYPES && block >= P.type_first[t + 1]) t++;
    return (kv_cache_type)t;
}

/* Row `which` (0 K, 1 V) of slot id `slot`, whose block has type ty (row bytes rb). */
KV_DEVICE unsigned char *kv_k_row(const kv_k_pool &P, kv_cache_type ty, size_t rb, int slot,
                                  int which) {
    int b = slot / P.bs, s = slot % P.bs;
    return P.data + P.type_offset[ty] +
           ((size_t)(b - P.type_first[ty]) * 2 * (size_t)P.bs + (size_t)which * (size_t)P.bs +
            (size_t)s) *
               rb;
}

/* Index of entry e's pos / acc / acc2 for task t: meta_off + e, or, for meta_off < 0 (the
 * pool's per-slot metadata), its slot (block table `table`, block size bs). */
KV_DEVICE int kv_k_meta_at(const kv_k_attn_task &t, const int *table, int bs, int e) {
    return t.meta_off >= 0 ? t.meta_off + e : kv_slot_of_entry(table, e, bs);
}

/* Cache write (the engine's cache_write op): K and V of row writes[w].row, KV head
 * writes[w].kv_head (row stride kv_stride floats in k and v) are encoded into slot
 * writes[w].slot in its block's type with kvt_encode (runtime/cache/kvtype.h: the CPU's
 * codec, so the stored bytes equal the CPU backend's). With per-slot metadata (P.pos) the
 * slot's position becomes row_pos[row] and its acc / acc2 zero. One thread per (write, K|V)
 * row; any grid. */
KV_GLOBAL void kv_k_cache_write(kv_k_pool P, const kv_k_write *writes, int n, const float *k,
                                const float *v, int kv_stride, const int *row_pos) {
    size_t total = 2 * (size_t)n;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        kv_k_write w = writes[x / 2];
        int which = (int)(x % 2);
        kv_cache_type ty = kv_k_block_type(P, w.slot / P.bs);
        size_t src = (size_t)w.row * (size_t)kv_stride + (size_t)w.kv_head * (size_t)P.hd;
        kvt_encode(ty, P.hd, (which ? v : k) + src,
                   kv_k_row(P, ty, kvt_row_bytes(ty, P.hd), w.slot, which));
        if (P.pos && !which) {
            P.pos[w.slot] = row_pos[w.row];
            P.acc[w.slot] = 0.0f;
            P.acc2[w.slot] = 0.0f;
        }
    }
}

/* Scores of a task's entries [e0, e1) for the g query heads of its GQA group (the heads'
 * scaled queries qs [g][hd] in shared memory): sc[gh * stride + e] = qs[gh] . k_e, K rows read
 * in their stored type ty. One warp per entry, lanes split d_h, a butterfly sum per query
 * head: each K row is read (decoded) once for the whole group. Call with the whole block. */
KV_DEVICE void kv_k_scores(const kv_k_pool &P, kv_cache_type ty, const int *table, int e0, int e1,
                           const float *qs, int g, float *sc, int stride) {
    int hd = P.hd, lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP;
    int n_warps = kv_bdim() / KV_WARP;
    size_t rb = kvt_row_bytes(ty, hd);
    for (int e = e0 + warp; e < e1; e += n_warps) {
        const unsigned char *kk = kv_k_row(P, ty, rb, kv_slot_of_entry(table, e, P.bs), 0);
        for (int gh = 0; gh < g; gh++) {
            float part = 0.0f;
            for (int d = lane; d < hd; d += KV_WARP)
                part += qs[gh * hd + d] * kvt_decode_at(ty, kk, d);
            part = kv_warp_sum(part);
            if (lane == 0) sc[(size_t)gh * stride + e] = part;
        }
    }
}

/* The exponentials of the online softmax over s[e0, e1) (Milakov & Gimelshein 2018): every
 * thread gets the maximum *mx and the sum *sum of exp(s_e - mx), and s_e is replaced by
 * exp(s_e - mx). Fixed-order block reductions (red: blockDim.x / 32 floats of shared
 * memory), so the same launch gives the same bits. Call with the whole block. */
KV_DEVICE void kv_k_softmax_exp(float *s, int e0, int e1, float *red, float *mx, float *sum) {
    float m = -INFINITY;
    for (int e = e0 + kv_tid(); e < e1; e += kv_bdim()) m = s[e] > m ? s[e] : m;
    m = kv_block_max(m, red);
    float t = 0.0f;
    for (int e = e0 + kv_tid(); e < e1; e += kv_bdim()) {
        s[e] = expf(s[e] - m);
        t += s[e];
    }
    *mx = m;
    *sum = kv_block_sum(t, red);
}

/* out[gh * hd + d] = sum over e in [e0, e1), in order, of sc[gh * stride + e] * v_e[d] (V rows
 * in their stored type ty), for the g query heads: one thread per (query head, d). */
KV_DEVICE void kv_k_weighted_v(const kv_k_pool &P, kv_cache_type ty, const int *table, int e0,
                               int e1, const float *sc, int stride, int g, float *out) {
    int hd = P.hd;
    size_t rb = kvt_row_bytes(ty, hd);
    for (int x = kv_tid(); x < g * hd; x += kv_bdim()) {
        int gh = x / hd, d = x % hd;
        const float *s = sc + (size_t)gh * stride;
        float a = 0.0f;
        for (int e = e0; e < e1; e++)
            a += s[e] *
                 kvt_decode_at(ty, kv_k_row(P, ty, rb, kv_slot_of_entry(table, e, P.bs), 1), d);
        out[x] = a;
    }
}

/* Paged attention with statistics (PagedAttention, Kwon et al. 2023, over KV-Compress's
 * per-head block tables; the CPU twin is attend_task_hd in runtime/backend/backend_cpu.c).
 * Grid: one block per task (sequence, KV head), serving the g query heads of its group, so
 * each K/V row read from the pool serves g queries. K/V rows are read in the head's stored
 * type (the type of its blocks, P) and decoded element by element as they are used: no fp32
 * copy of the cache. For new token i of the task (query row row0 + i, position
 * pos[len - n + i]), query head j*g + gh attends entries 0 .. len - n + i:
 *   s_e = q . k_e / sqrt(hd),  w = softmax(s),  o = sum_e w_e v_e.
 * With task.track, after each query every entry e it saw gets, for gh = 0..g-1 in order,
 * acc[e] += w and, when pos(query) - pos(e) >= KV_K_L2_WINDOW, acc2[e] += w^2: each entry
 * is updated by one thread in the CPU's order (no atomics), so the statistics are
 * reproducible and equal the CPU's up to the softmax's rounding.
 * Entry e of a task: block tables[table_off + e / bs], metadata pos/acc/acc2 at
 * kv_k_meta_at (meta_off + e, or its slot in the pool's per-slot arrays)
 * (read only with task.track: a step without statistics need not upload them).
 * q and o: [rows, q_stride] with query head h at h*hd. scratch: g * scratch_stride floats per
 * task (scratch_stride >= the longest len) for the scores. Dynamic shared memory: g*hd floats
 * (the scaled queries). */
KV_GLOBAL void kv_k_paged_attention(kv_k_pool P, const int *tables, const kv_k_attn_task *tasks,
                                    const int *pos, float *acc, float *acc2, const float *q,
                                    float *o, int q_stride, int g, float *scratch,
                                    int scratch_stride) {
    KV_DYNAMIC_SHARED(float, qs);
    KV_SHARED_ARRAY(float, red, 32);
    kv_k_attn_task t = tasks[kv_bid()];
    const int *table = tables + t.table_off;
    kv_cache_type ty = kv_k_block_type(P, table[0]);
    float *sc = scratch + (size_t)kv_bid() * (size_t)g * (size_t)scratch_stride;
    int hd = P.hd, base = t.len - t.n, gw = g * hd;
    float inv = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < t.n; i++) {
        int n_ent = base + i + 1;
        /* positions are read for tracked heads only */
        int qpos = t.track ? pos[kv_k_meta_at(t, table, P.bs, base + i)] : 0;
        const float *qrow = q + (size_t)(t.row0 + i) * (size_t)q_stride + (size_t)t.kv_head * gw;
        float *orow = o + (size_t)(t.row0 + i) * (size_t)q_stride + (size_t)t.kv_head * gw;
        for (int x = kv_tid(); x < gw; x += kv_bdim()) qs[x] = qrow[x] * inv;
        kv_syncthreads();
        kv_k_scores(P, ty, table, 0, n_ent, qs, g, sc, scratch_stride);
        kv_syncthreads();
        /* softmax per query head: exponentials, then normalised */
        for (int gh = 0; gh < g; gh++) {
            float *s = sc + (size_t)gh * scratch_stride, mx, sum;
            kv_k_softmax_exp(s, 0, n_ent, red, &mx, &sum);
            float rs = 1.0f / sum;
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) s[e] *= rs;
        }
        kv_syncthreads();
        /* output: entries in order as on the CPU */
        kv_k_weighted_v(P, ty, table, 0, n_ent, sc, scratch_stride, g, orow);
        if (t.track)
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) {
                int mi = kv_k_meta_at(t, table, P.bs, e);
                int counted = qpos - pos[mi] >= KV_K_L2_WINDOW;
                float a = acc[mi], a2 = acc2[mi];
                for (int gh = 0; gh < g; gh++) {
                    float w = sc[(size_t)gh * scratch_stride + e];
                    a += w;
                    if (counted) a2 += w * w;
                }
                acc[mi] = a;
                acc2[mi] = a2;
            }
        kv_syncthreads(); /* qs and sc are rewritten by the next query */
    }
}

/* Split-sequence decode attention, part 1 (kv_k_split_plan): grid (n_tasks, chunks); block
 * (task b, chunk c) takes entries [c * chunk, min(len, (c + 1) * chunk)) of task b, which must
 * have n = 1 (one query per head, a decode step). For each query head gh of
 * the group it writes, at part index pi = (b * chunks + c) * g + gh, the chunk's score
 * maximum m[pi], the sum of exp(s_e - m) s[pi] and the unnormalised output
 * o_part[pi * hd + d] = sum_e exp(s_e - m) v_e[d]; an empty chunk writes m = -inf, s = 0.
 * K/V rows in their stored type, as kv_k_paged_attention (the same device functions).
 * Scores go to scratch as in kv_k_paged_attention (task b's rows, the chunk's columns), as
 * exp(s_e - m) of the chunk's m: kv_k_decode_stats reads them for tracked tasks.
 * Dynamic shared memory: g * hd floats. */
KV_GLOBAL void kv_k_decode_split(kv_k_pool P, const int *tables, const kv_k_attn_task *tasks,
                                 const float *q, int q_stride, int g, int chunk, int chunks,
                                 float *scratch, int scratch_stride, float *part_m, float *part_s,
                                 float *part_o) {
    KV_DYNAMIC_SHARED(float, qs);
    KV_SHARED_ARRAY(float, red, 32);
    int b = kv_bid(), c = kv_bid_y(), hd = P.hd;
    kv_k_attn_task t = tasks[b];
    const int *table = tables + t.table_off;
    float *sc = scratch + (size_t)b * (size_t)g * (size_t)scratch_stride;
    int e0 = c * chunk, e1 = e0 + chunk < t.len ? e0 + chunk : t.len;
    int gw = g * hd;
    size_t pi0 = ((size_t)b * (size_t)chunks + (size_t)c) * (size_t)g;
    if (e0 >= e1) { /* past this task's end: an empty part (uniform over the block) */
        for (int x = kv_tid(); x < gw; x += kv_bdim()) part_o[pi0 * hd + x] = 0.0f;
        if (kv_tid() < g) {
            part_m[pi0 + kv_tid()] = -INFINITY;
            part_s[pi0 + kv_tid()] = 0.0f;
        }
        return;
    }
    kv_cache_type ty = kv_k_block_type(P, table[0]);
    float inv = 1.0f / sqrtf((float)hd);
    const float *qrow = q + (size_t)t.row0 * (size_t)q_stride + (size_t)t.kv_head * gw;
    for (int x = kv_tid(); x < gw; x += kv_bdim()) qs[x] = qrow[x] * inv;
    kv_syncthreads();
    kv_k_scores(P, ty, table, e0, e1, qs, g, sc, scratch_stride);
    kv_syncthreads();
    for (int gh = 0; gh < g; gh++) {
        float mx, sum;
        kv_k_softmax_exp(sc + (size_t)gh * scratch_stride, e0, e1, red, &mx, &sum);
        if (kv_tid() == 0) {
            part_m[pi0 + gh] = mx;
            part_s[pi0 + gh] = sum;
        }
    }
    kv_syncthreads();
    kv_k_weighted_v(P, ty, table, e0, e1, sc, scratch_stride, g, part_o + pi0 * hd);
}

/* Split-sequence decode attention, part 2: grid n_tasks; for each (query head, d) of task b,
 * M = max_c m, S = sum_c s e^(m - M), o = sum_c o_part e^(m - M) / S, written to o at the
 * task's row (the log-sum-exp merge of flash-decoding), chunks in order. */
KV_GLOBAL void kv_k_decode_merge(const kv_k_attn_task *tasks, int g, int hd, int chunks,
                                 const float *part_m, const float *part_s, const float *part_o,
                                 float *o, int q_stride) {
    int b = kv_bid();
    kv_k_attn_task t = tasks[b];
    int gw = g * hd;
    float *orow = o + (size_t)t.row0 * (size_t)q_stride + (size_t)t.kv_head * gw;
    for (int x = kv_tid(); x < gw; x += kv_bdim()) {
        int gh = x / hd;
        size_t base = (size_t)b * (size_t)chunks * (size_t)g + (size_t)gh;
        float M = -INFINITY;
        for (int c = 0; c < chunks; c++) {
            float m = part_m[base + (size_t)c * g];
            M = m > M ? m : M;
        }
        float S = 0.0f, a = 0.0f;
        for (int c = 0; c < chunks; c++) {
            size_t pi = base + (size_t)c * g;
            if (part_s[pi] == 0.0f) continue; /* an empty chunk */
            float w = expf(part_m[pi] - M);
            S += part_s[pi] * w;
            a += part_o[pi * hd + (size_t)(x % hd)] * w;
        }
        orow[x] = a / S;
    }
}

/* The merged maximum *M and sum *S of query head gh of task b over its chunks, in chunk
 * order (kv_k_decode_merge and kv_k_decode_stats compute them alike). */
KV_DEVICE void kv_k_merged_ms(int b, int gh, int g, int chunks, const float *part_m,
                              const float *part_s, float *M, float *S) {
    size_t base = (size_t)b * (size_t)chunks * (size_t)g + (size_t)gh;
    float m = -INFINITY, s = 0.0f;
    for (int c = 0; c < chunks; c++) {
        float x = part_m[base + (size_t)c * g];
        m = x > m ? x : m;
    }
    for (int c = 0; c < chunks; c++) {
        size_t pi = base + (size_t)c * g;
        if (part_s[pi] == 0.0f) continue; /* an empty chunk */
        s += part_s[pi] * expf(part_m[pi] - m);
    }
    *M = m;
    *S = s;
}

/* Split-sequence decode attention, part 3, for tasks with statistics (task.track): grid
 * (n_tasks, chunks), after kv_k_decode_split. The softmax weight of entry e in chunk c for
 * query head gh is w = exp(s_e - m_c) * exp(m_c - M) / S with the merged M and S of the task
 * (the log-sum-exp merge applied to the chunk's stored exponentials: the weights of the
 * one-block kernel up to rounding); then, as kv_k_paged_attention does after its query,
 * acc[e] += w and, when pos(query) - pos(e) >= KV_K_L2_WINDOW, acc2[e] += w^2, for gh = 0..g-1
 * in order, one thread per entry (no atomics). Untracked tasks and empty chunks do nothing.
 * pos, acc, acc2: the metadata arrays of kv_k_paged_attention. Dynamic shared memory: g
 * floats. */
KV_GLOBAL void kv_k_decode_stats(const kv_k_attn_task *tasks, int g, int chunk, int chunks,
                                 const float *scratch, int scratch_stride, const float *part_m,
                                 const float *part_s, const int *tables, int bs, const int *pos,
                                 float *acc, float *acc2) {
    KV_DYNAMIC_SHARED(float, fac); /* [g]: exp(m_c - M) / S per query head */
    int b = kv_bid(), c = kv_bid_y();
    kv_k_attn_task t = tasks[b];
    int e0 = c * chunk, e1 = e0 + chunk < t.len ? e0 + chunk : t.len;
    if (!t.track || e0 >= e1) return; /* uniform over the block: no barrier is skipped */
    for (int gh = kv_tid(); gh < g; gh += kv_bdim()) {
        float M, S;
        kv_k_merged_ms(b, gh, g, chunks, part_m, part_s, &M, &S);
        size_t pi = ((size_t)b * (size_t)chunks + (size_t)c) * (size_t)g + (size_t)gh;
        fac[gh] = expf(part_m[pi] - M) / S;
    }
    kv_syncthreads();
    const float *sc = scratch + (size_t)b * (size_t)g * (size_t)scratch_stride;
    const int *table = tables + t.table_off;
    int qpos = pos[kv_k_meta_at(t, table, bs, t.len - 1)];
    for (int e = e0 + kv_tid(); e < e1; e += kv_bdim()) {
        int mi = kv_k_meta_at(t, table, bs, e);
        int counted = qpos - pos[mi] >= KV_K_L2_WINDOW;
        float a = acc[mi], a2 = acc2[mi];
        for (int gh = 0; gh < g; gh++) {
            float w = sc[(size_t)gh * scratch_stride + e] * fac[gh];
            a += w;
            if (counted) a2 += w * w;
        }
        acc[mi] = a;
        acc2[mi] = a2;
    }
}

/* ---- flash-decoding (Dao et al. 2023): part 1, kv_k_flash_decode, is in kv_flash.cuh ---- */

/* Decode attention, part 3 after kv_k_flash_decode, for tracked tasks: grid (n_tasks, parts);
 * the weight of entry e of partition c for query head gh is w = exp(s_e - M) / S from its raw
 * score and the merged M and S of the task (kv_k_merged_ms); then, as kv_k_decode_stats,
 * acc[e] += w and, when pos(query) - pos(e) >= KV_K_L2_WINDOW, acc2[e] += w^2, for gh = 0..g-1
 * in order, one thread per entry. */
KV_GLOBAL void kv_k_decode_stats_raw(const kv_k_attn_task *tasks, int g, int part, int parts,
                                     const float *scratch, int scratch_stride, const float *part_m,
                                     const float *part_s, const int *tables, int bs, const int *pos,
                                     float *acc, float *acc2) {
    KV_DYNAMIC_SHARED(float, ms); /* [g][M, S] */
    int b = kv_bid(), c = kv_bid_y();
    kv_k_attn_task t = tasks[b];
    int e0 = c * part, e1 = e0 + part < t.len ? e0 + part : t.len;
    if (!t.track || e0 >= e1) return; /* uniform over the block: no barrier is skipped */
    for (int gh = kv_tid(); gh < g; gh += kv_bdim())
        kv_k_merged_ms(b, gh, g, parts, part_m, part_s, &ms[2 * gh], &ms[2 * gh + 1]);
    kv_syncthreads();
    const float *sc = scratch + (size_t)b * (size_t)g * (size_t)scratch_stride;
    const int *table = tables + t.table_off;
    int qpos = pos[kv_k_meta_at(t, table, bs, t.len - 1)];
    for (int e = e0 + kv_tid(); e < e1; e += kv_bdim()) {
        int mi = kv_k_meta_at(t, table, bs, e);
        int counted = qpos - pos[mi] >= KV_K_L2_WINDOW;
        float a = acc[mi], a2 = acc2[mi];
        for (int gh = 0; gh < g; gh++) {
            float w = expf(sc[(size_t)gh * scratch_stride + e] - ms[2 * gh]) / ms[2 * gh + 1];
            a += w;
            if (counted) a2 += w * w;
        }
        acc[mi] = a;
        acc2[mi] = a2;
    }
}

/* Resident block tables (cuda/kernels/kv_pack.h kv_k_meta_pack_resident): for k < n,
 * tables[patch[2k]] = patch[2k + 1]. One thread per pair; any grid. */
KV_GLOBAL void kv_k_table_patch(int *tables, const int *patch, long n) {
    for (long k = (long)kv_bid() * kv_bdim() + kv_tid(); k < n; k += (long)kv_gdim() * kv_bdim())
        tables[patch[2 * k]] = patch[2 * k + 1];
}

/* Gather (the engine's gather op, KV-Compress MoveCache), one pass of kv_k_split_moves:
 * kv_k_gather_read copies the K and V rows of every move's source slot (their stored bytes:
 * a move stays inside one head, so source and destination have one type) into scratch
 * [n][K|V][4 hd] bytes, then kv_k_gather_write (launched after it on the same stream) copies
 * scratch to the destinations. Within a pass no move reads or rewrites a slot an earlier one
 * wrote, so this equals applying the moves in order (kv_pool_apply_moves_host). One thread
 * per byte of the widest (f32) row; bytes past a row's own size are skipped; any grid. With
 * per-slot metadata (P.pos) each move's pos / acc / acc2 travel too, through scratch after the
 * rows (16-byte aligned; kv_k_gather_scratch_bytes). */
struct kv_k_gather_meta {
    int pos;
    float acc, acc2;
};
KV_GLOBAL void kv_k_gather_read(kv_k_pool P, const kv_k_move *moves, int n,
                                unsigned char *scratch) {
    size_t row = 4 * (size_t)P.hd, total = (size_t)n * 2 * row;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        int m = (int)(x / (2 * row)), which = (int)(x / row % 2);
        size_t byte = x % row;
        int slot = moves[m].src;
        kv_cache_type ty = kv_k_block_type(P, slot / P.bs);
        size_t rb = kvt_row_bytes(ty, P.hd);
        if (byte < rb) scratch[x] = kv_k_row(P, ty, rb, slot, which)[byte];
    }
    if (!P.pos) return;
    kv_k_gather_meta *meta = reinterpret_cast<kv_k_gather_meta *>(scratch + (total + 15) / 16 * 16);
    for (int m = kv_bid() * kv_bdim() + kv_tid(); m < n; m += kv_gdim() * kv_bdim())
        meta[m] = {P.pos[moves[m].src], P.acc[moves[m].src], P.acc2[moves[m].src]};
}

KV_GLOBAL void kv_k_gather_write(kv_k_pool P, const kv_k_move *moves, int n,
                                 const unsigned char *scratch) {
    size_t row = 4 * (size_t)P.hd, total = (size_t)n * 2 * row;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        int m = (int)(x / (2 * row)), which = (int)(x / row % 2);
        size_t byte = x % row;
        int slot = moves[m].dst;
        kv_cache_type ty = kv_k_block_type(P, slot / P.bs);
        size_t rb = kvt_row_bytes(ty, P.hd);
        if (byte < rb) kv_k_row(P, ty, rb, slot, which)[byte] = scratch[x];
    }
    if (!P.pos) return;
    const kv_k_gather_meta *meta =
        reinterpret_cast<const kv_k_gather_meta *>(scratch + (total + 15) / 16 * 16);
    for (int m = kv_bid() * kv_bdim() + kv_tid(); m < n; m += kv_gdim() * kv_bdim()) {
        P.pos[moves[m].dst] = meta[m].pos;
        P.acc[moves[m].dst] = meta[m].acc;
        P.acc2[moves[m].dst] = meta[m].acc2;
    }
}

#endif
