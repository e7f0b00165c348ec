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
 * The paged KV pool is the CPU layout (include/kvplan/kvslot.h): data[block][K|V][slot][d_h].
 * Per-entry metadata (position id, accumulated attention weight for H2O / Batch-Max avgattn,
 * accumulated squared weight for KV-Compress L2) stays the engine's host metadata; a step
 * uploads the attending heads' entries and downloads the statistics.
 */
#ifndef KVPLAN_CUDA_KV_KERNELS_CUH
#define KVPLAN_CUDA_KV_KERNELS_CUH

#include "kv_defs.cuh"
#include "kv_tasks.h"
#include "cache/kvslot.h"

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

/* Cache write (the engine's cache_write op): for write w and d < hd, K and V of row
 * writes[w].row, KV head writes[w].kv_head (row stride kv_stride floats in k and v) go to slot
 * writes[w].slot of the pool. One thread per float; any grid. */
KV_GLOBAL void kv_k_cache_write(float *pool, const kv_k_write *writes, int n, const float *k,
                                const float *v, int kv_stride, int hd, int bs) {
    size_t total = (size_t)n * (size_t)hd;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        kv_k_write w = writes[x / (size_t)hd];
        int d = (int)(x % (size_t)hd);
        size_t src = (size_t)w.row * (size_t)kv_stride + (size_t)w.kv_head * hd + d;
        pool[kv_slot_k_offset(w.slot, bs, hd) + d] = k[src];
        pool[kv_slot_v_offset(w.slot, bs, hd) + d] = v[src];
    }
}

/* Paged attention with statistics (PagedAttention, Kwon et al. 2023, over KV-Compress's
 * per-head block tables; the CPU twin is attend_task_hd in runtime/backend_cpu.c).
 * Grid: one block per task (sequence, KV head), serving the g query heads of its group, so
 * each K/V row read from the pool serves g queries. For new token i of the task (query row
 * row0 + i, position pos[len - n + i]), query head j*g + gh attends entries 0 .. len - n + i:
 *   s_e = q . k_e / sqrt(hd),  w = softmax(s),  o = sum_e w_e v_e.
 * With task.track, after each query every entry e it saw gets, for gh = 0..g-1 in order,
 * acc[e] += w and, when pos(query) - pos(e) >= KV_K_L2_WINDOW, acc2[e] += w^2: each entry
 * is updated by one thread in the CPU's order (no atomics), so the statistics are
 * reproducible and equal the CPU's up to the softmax's rounding.
 * Entry e of a task: block tables[table_off + e / bs], metadata pos/acc/acc2[meta_off + e]
 * (read only with task.track: a step without statistics need not upload them).
 * q and o: [rows, q_stride] with query head h at h*hd. scratch: g * scratch_stride floats per
 * task (scratch_stride >= the longest len) for the scores. Dynamic shared memory: g*hd floats
 * (the scaled queries). */
KV_GLOBAL void kv_k_paged_attention(const float *pool, const int *tables,
                                    const kv_k_attn_task *tasks, const int *pos, float *acc,
                                    float *acc2, const float *q, float *o, int q_stride, int g,
                                    int hd, int bs, float *scratch, int scratch_stride) {
    KV_DYNAMIC_SHARED(float, qs);
    KV_SHARED_ARRAY(float, red, 32);
    kv_k_attn_task t = tasks[kv_bid()];
    const int *table = tables + t.table_off;
    const int *tpos = pos + t.meta_off;
    float *sc = scratch + (size_t)kv_bid() * (size_t)g * (size_t)scratch_stride;
    int base = t.len - t.n, gw = g * hd;
    int lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP, n_warps = kv_bdim() / KV_WARP;
    float inv = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < t.n; i++) {
        int n_ent = base + i + 1;
        int qpos = t.track ? tpos[base + i] : 0; /* positions are uploaded for tracked heads */
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
            float a = 0.0f;
            for (int e = 0; e < n_ent; e++)
                a += s[e] * pool[kv_slot_v_offset(kv_slot_of_entry(table, e, bs), bs, hd) + d];
            orow[x] = a;
        }
        if (t.track)
            for (int e = kv_tid(); e < n_ent; e += kv_bdim()) {
                int counted = qpos - tpos[e] >= KV_K_L2_WINDOW;
                float a = acc[t.meta_off + e], a2 = acc2[t.meta_off + e];
                for (int gh = 0; gh < g; gh++) {
                    float w = sc[(size_t)gh * scratch_stride + e];
                    a += w;
                    if (counted) a2 += w * w;
                }
                acc[t.meta_off + e] = a;
                acc2[t.meta_off + e] = a2;
            }
        kv_syncthreads(); /* qs and sc are rewritten by the next query */
    }
}

/* Split-sequence decode attention, part 1 (kv_k_split_plan): grid (n_tasks, chunks); block
 * (task b, chunk c) takes entries [c * chunk, min(len, (c + 1) * chunk)) of task b, which must
 * have n = 1 (one query per head, a decode step) and no statistics. For each query head gh of
 * the group it writes, at part index pi = (b * chunks + c) * g + gh, the chunk's score
 * maximum m[pi], the sum of exp(s_e - m) s[pi] and the unnormalised output
 * o_part[pi * hd + d] = sum_e exp(s_e - m) v_e[d]; an empty chunk writes m = -inf, s = 0.
 * Scores go to scratch as in kv_k_paged_attention (task b's rows, the chunk's columns).
 * Dynamic shared memory: g * hd floats. */
KV_GLOBAL void kv_k_decode_split(const float *pool, const int *tables, const kv_k_attn_task *tasks,
                                 const float *q, int q_stride, int g, int hd, int bs, int chunk,
                                 int chunks, float *scratch, int scratch_stride, float *part_m,
                                 float *part_s, float *part_o) {
    KV_DYNAMIC_SHARED(float, qs);
    KV_SHARED_ARRAY(float, red, 32);
    int b = kv_bid(), c = kv_bid_y();
    kv_k_attn_task t = tasks[b];
    const int *table = tables + t.table_off;
    float *sc = scratch + (size_t)b * (size_t)g * (size_t)scratch_stride;
    int e0 = c * chunk, e1 = e0 + chunk < t.len ? e0 + chunk : t.len;
    int lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP, n_warps = kv_bdim() / KV_WARP;
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
    float inv = 1.0f / sqrtf((float)hd);
    const float *qrow = q + (size_t)t.row0 * (size_t)q_stride + (size_t)t.kv_head * gw;
    for (int x = kv_tid(); x < gw; x += kv_bdim()) qs[x] = qrow[x] * inv;
    kv_syncthreads();
    /* scores: one warp per entry; each K row read once serves the g query heads */
    for (int e = e0 + warp; e < e1; e += n_warps) {
        const float *kk = pool + kv_slot_k_offset(kv_slot_of_entry(table, e, bs), bs, hd);
        for (int gh = 0; gh < g; gh++) {
            float part = 0.0f;
            for (int d = lane; d < hd; d += KV_WARP) part += qs[gh * hd + d] * kk[d];
            part = kv_warp_sum(part);
            if (lane == 0) sc[(size_t)gh * scratch_stride + e] = part;
        }
    }
    kv_syncthreads();
    for (int gh = 0; gh < g; gh++) {
        float *s = sc + (size_t)gh * scratch_stride;
        float mx = -INFINITY;
        for (int e = e0 + kv_tid(); e < e1; e += kv_bdim()) mx = s[e] > mx ? s[e] : mx;
        mx = kv_block_max(mx, red);
        float sum = 0.0f;
        for (int e = e0 + kv_tid(); e < e1; e += kv_bdim()) {
            s[e] = expf(s[e] - mx);
            sum += s[e];
        }
        sum = kv_block_sum(sum, red);
        if (kv_tid() == 0) {
            part_m[pi0 + gh] = mx;
            part_s[pi0 + gh] = sum;
        }
    }
    kv_syncthreads();
    for (int x = kv_tid(); x < gw; x += kv_bdim()) {
        int gh = x / hd, d = x % hd;
        const float *s = sc + (size_t)gh * scratch_stride;
        float a = 0.0f;
        for (int e = e0; e < e1; e++)
            a += s[e] * pool[kv_slot_v_offset(kv_slot_of_entry(table, e, bs), bs, hd) + d];
        part_o[pi0 * hd + x] = a;
    }
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

/* Gather (the engine's gather op, KV-Compress MoveCache), one pass of kv_k_split_moves:
 * kv_k_gather_read copies K and V of every move's source slot into scratch [n][2][hd], then
 * kv_k_gather_write (launched after it on the same stream) copies scratch to the
 * destinations. Within a pass no move reads or rewrites a slot an earlier one wrote, so this
 * equals applying the moves in order. One thread per float; any grid. */
KV_GLOBAL void kv_k_gather_read(const float *pool, const kv_k_move *moves, int n, float *scratch,
                                int hd, int bs) {
    size_t row = 2 * (size_t)hd, total = (size_t)n * row;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        int m = (int)(x / row), r = (int)(x % row), slot = moves[m].src;
        scratch[x] = pool[r < hd ? kv_slot_k_offset(slot, bs, hd) + r
                                 : kv_slot_v_offset(slot, bs, hd) + (r - hd)];
    }
}

KV_GLOBAL void kv_k_gather_write(float *pool, const kv_k_move *moves, int n, const float *scratch,
                                 int hd, int bs) {
    size_t row = 2 * (size_t)hd, total = (size_t)n * row;
    for (size_t x = (size_t)kv_bid() * kv_bdim() + kv_tid(); x < total;
         x += (size_t)kv_gdim() * kv_bdim()) {
        int m = (int)(x / row), r = (int)(x % row), slot = moves[m].dst;
        pool[r < hd ? kv_slot_k_offset(slot, bs, hd) + r
                    : kv_slot_v_offset(slot, bs, hd) + (r - hd)] = scratch[x];
    }
}

#endif
