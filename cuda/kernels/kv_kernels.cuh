/* kvplan's layer kernels, written once for the CUDA device (cuda/kernels.cu launches them)
 * and for the host shim the tests run them on (tests/cuda_shim.hpp). Each kernel computes what
 * the CPU backend computes (runtime/ops.c, runtime/forward.c, runtime/kvcache.c); the tests in
 * tests/test_cuda_kernels.cpp compare them at small sizes.
 *
 * Conventions: all matrices row-major fp32; `rows` is the number of token rows of a step (the
 * new tokens of every sequence, sequence-major). Blocks are 1-D and any multiple of 32
 * threads unless a kernel says otherwise; elementwise kernels use grid-stride loops, so any
 * grid size is correct. Reductions run in a fixed order (kv_block_sum), so a kernel gives the
 * same bits on every run of the same launch configuration.
 *
 * The paged KV pool is the CPU layout (include/kvplan/kvslot.h): data[block][K|V][slot][d_h];
 * per-slot metadata arrays of n_blocks * block_size entries hold each entry's position id
 * (slot_pos), its accumulated attention weight (slot_acc, H2O / Batch-Max avgattn) and its
 * accumulated squared weight (slot_acc2, KV-Compress L2).
 */
#ifndef KVPLAN_CUDA_KV_KERNELS_CUH
#define KVPLAN_CUDA_KV_KERNELS_CUH

#include "kv_defs.cuh"
#include "kv_tasks.h"
#include "kvplan/kvslot.h"

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

/* Append this step's K/V rows to the pool (kv_head_append): for task t and new token i, entry
 * len - n_new + i of its head gets K = k[row0 + i, kv_head*hd ...], V likewise (row stride
 * kv_stride floats), position row_pos[row0 + i] and zeroed statistics. The head's block table
 * must already list the blocks. Grid: one block per task. */
KV_GLOBAL void kv_k_append(float *pool, int *slot_pos, float *slot_acc, float *slot_acc2,
                           const int *tables, const kv_attn_task *tasks, const float *k,
                           const float *v, int kv_stride, const int *row_pos, int hd, int bs) {
    kv_attn_task t = tasks[kv_bid()];
    const int *table = tables + t.table_off;
    int base = t.len - t.n_new;
    for (int x = kv_tid(); x < t.n_new * hd; x += kv_bdim()) {
        int i = x / hd, d = x % hd;
        int slot = kv_slot_of_entry(table, base + i, bs);
        size_t src = (size_t)(t.row0 + i) * (size_t)kv_stride + (size_t)t.kv_head * hd + d;
        pool[kv_slot_k_offset(slot, bs, hd) + d] = k[src];
        pool[kv_slot_v_offset(slot, bs, hd) + d] = v[src];
        if (d == 0) {
            slot_pos[slot] = row_pos[t.row0 + i];
            slot_acc[slot] = 0.0f;
            slot_acc2[slot] = 0.0f;
        }
    }
}

/* Paged attention with statistics (PagedAttention, Kwon et al. 2023, over KV-Compress's
 * per-head block tables; the CPU twin is attend_head_hd in runtime/forward.c).
 * Grid: one block per task (sequence, KV head), serving the g query heads of its group, so
 * each K/V row read from the pool serves g queries. For new token i of the task (query row
 * row0 + i, position slot_pos of entry len - n_new + i), query head j*g + gh attends entries
 * 0 .. len - n_new + i of the head:
 *   s_e = q . k_e / sqrt(hd),  w = softmax(s),  o = sum_e w_e v_e.
 * With track_stats, after each query every entry e it saw gets, for gh = 0..g-1 in order,
 * acc[e] += w and, when position(query) - position(e) >= KV_K_L2_WINDOW, acc2[e] += w^2:
 * each entry is updated by one thread in the CPU's order (no atomics), so the statistics are
 * reproducible and equal the CPU's up to the softmax's rounding.
 * q and o: [rows, q_stride] with query head h at h*hd. scratch: g * scratch_stride floats per
 * task (scratch_stride >= the longest len) for the scores. Dynamic shared memory: g*hd floats
 * (the scaled queries). */
KV_GLOBAL void kv_k_paged_attention(const float *pool, const int *tables, const kv_attn_task *tasks,
                                    const int *slot_pos, float *slot_acc, float *slot_acc2,
                                    int track_stats, const float *q, float *o, int q_stride, int g,
                                    int hd, int bs, float *scratch, int scratch_stride) {
    KV_DYNAMIC_SHARED(float, qs);
    KV_SHARED_ARRAY(float, red, 32);
    kv_attn_task t = tasks[kv_bid()];
    const int *table = tables + t.table_off;
    float *sc = scratch + (size_t)kv_bid() * (size_t)g * (size_t)scratch_stride;
    int base = t.len - t.n_new, gw = g * hd;
    int lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP, n_warps = kv_bdim() / KV_WARP;
    float inv = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < t.n_new; i++) {
        int n_ent = base + i + 1;
        int qpos = slot_pos[kv_slot_of_entry(table, base + i, bs)];
        const float *qrow = q + (size_t)(t.row0 + i) * (size_t)q_stride + (size_t)t.kv_head * gw;
        float *orow = o + (size_t)(t.row0 + i) * (size_t)q_stride + (size_t)t.kv_head * gw;
        for (int x = kv_tid(); x < gw; x += kv_bdim()) qs[x] = qrow[x] * inv;
        kv_syncthreads();
        /* scores: one warp per entry, lanes split d_h, a butterfly sum per query head */
        for (int e = warp; e < n_ent; e += n_warps) {
            const float *kk = pool + kv_slot_k_offset(kv_slot_of_entry(table, e, bs), bs, hd);
            for (int gh = 0; gh < g; gh++) {
                float part = 0.0f;
                for (int d = lane; d < hd; d += KV_WARP) part += qs[gh * hd + d] * kk[d];
                part = kv_warp_sum(part);
                if (lane == 0) sc[(size_t)gh * scratch_stride + e] = part;
            }
        }
        kv_syncthreads();
        /* softmax per query head: block max, exponentials, block sum, normalise */
        for (int gh = 0; gh < g; gh++) {
            float *s = sc + (size_t)gh * scratch_stride;
            float mx = -INFINITY;
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) mx = s[e] > mx ? s[e] : mx;
            mx = kv_block_max(mx, red);
            float sum = 0.0f;
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) {
                s[e] = expf(s[e] - mx);
                sum += s[e];
            }
            sum = kv_block_sum(sum, red);
            float rs = 1.0f / sum;
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) s[e] *= rs;
        }
        kv_syncthreads();
        /* output: one thread per (query head, d), entries in order as on the CPU */
        for (int x = kv_tid(); x < gw; x += kv_bdim()) {
            int gh = x / hd, d = x % hd;
            const float *s = sc + (size_t)gh * scratch_stride;
            float acc = 0.0f;
            for (int e = 0; e < n_ent; e++)
                acc += s[e] * pool[kv_slot_v_offset(kv_slot_of_entry(table, e, bs), bs, hd) + d];
            orow[x] = acc;
        }
        if (track_stats)
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) {
                int slot = kv_slot_of_entry(table, e, bs);
                int counted = qpos - slot_pos[slot] >= KV_K_L2_WINDOW;
                float a = slot_acc[slot], a2 = slot_acc2[slot];
                for (int gh = 0; gh < g; gh++) {
                    float w = sc[(size_t)gh * scratch_stride + e];
                    a += w;
                    if (counted) a2 += w * w;
                }
                slot_acc[slot] = a;
                slot_acc2[slot] = a2;
            }
        kv_syncthreads(); /* qs and sc are rewritten by the next query */
    }
}

/* Compaction as a gather (KV-Compress MoveCache; the CPU twin is kv_head_compact): for each
 * task (one head), move entry src -> entry dst for its n_moves pairs (K, V, position,
 * statistics). The pairs must have strictly ascending dst and src >= dst, as eviction that
 * keeps survivors in order produces; then every slot is read before it is overwritten and the
 * result equals copying the pairs one by one in order. Moves go in chunks of `chunk` pairs:
 * the whole chunk is read into shared memory, the block synchronises, then writes.
 * Dynamic shared memory: chunk * (2*hd + 3) * 4 bytes. Grid: one block per task. slot_acc and
 * slot_acc2 may be NULL (no statistics kept). */
KV_GLOBAL void kv_k_compact(float *pool, int *slot_pos, float *slot_acc, float *slot_acc2,
                            const int *tables, const kv_move_task *tasks, const int *moves, int hd,
                            int bs, int chunk) {
    KV_DYNAMIC_SHARED(float, buf);
    float *meta_acc = buf + (size_t)chunk * 2 * hd;
    float *meta_acc2 = meta_acc + chunk;
    int *meta_pos = (int *)(meta_acc2 + chunk);
    kv_move_task t = tasks[kv_bid()];
    const int *table = tables + t.table_off;
    const int *mv = moves + 2 * (size_t)t.move_off;
    int row = 2 * hd;
    for (int c0 = 0; c0 < t.n_moves; c0 += chunk) {
        int cnt = t.n_moves - c0 < chunk ? t.n_moves - c0 : chunk;
        for (int x = kv_tid(); x < cnt * row; x += kv_bdim()) {
            int m = x / row, r = x % row;
            int slot = kv_slot_of_entry(table, mv[2 * (c0 + m)], bs);
            buf[x] = pool[(r < hd ? kv_slot_k_offset(slot, bs, hd) + r
                                  : kv_slot_v_offset(slot, bs, hd) + (r - hd))];
        }
        for (int m = kv_tid(); m < cnt; m += kv_bdim()) {
            int slot = kv_slot_of_entry(table, mv[2 * (c0 + m)], bs);
            meta_pos[m] = slot_pos[slot];
            meta_acc[m] = slot_acc ? slot_acc[slot] : 0.0f;
            meta_acc2[m] = slot_acc2 ? slot_acc2[slot] : 0.0f;
        }
        kv_syncthreads();
        for (int x = kv_tid(); x < cnt * row; x += kv_bdim()) {
            int m = x / row, r = x % row;
            int slot = kv_slot_of_entry(table, mv[2 * (c0 + m) + 1], bs);
            pool[(r < hd ? kv_slot_k_offset(slot, bs, hd) + r
                         : kv_slot_v_offset(slot, bs, hd) + (r - hd))] = buf[x];
        }
        for (int m = kv_tid(); m < cnt; m += kv_bdim()) {
            int slot = kv_slot_of_entry(table, mv[2 * (c0 + m) + 1], bs);
            slot_pos[slot] = meta_pos[m];
            if (slot_acc) slot_acc[slot] = meta_acc[m];
            if (slot_acc2) slot_acc2[slot] = meta_acc2[m];
        }
        kv_syncthreads(); /* the next chunk reuses the buffer */
    }
}

#endif
