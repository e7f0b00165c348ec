/* Flash-decoding attention (Dao, Haziza, Massa & Sizov 2023, "Flash-Decoding for long-context
 * inference"; the split-KV design of vLLM's paged_attention_v2 and llama.cpp's fattn-vec),
 * written once for the device and the host shim (kv_defs.cuh), part 1 of a decode step's
 * attention; the partitions meet in kv_kernels.cuh's kv_k_decode_merge, and tracked heads get
 * their statistics from kv_k_decode_stats_raw, both unchanged.
 *
 * Layout of the work (kv_k_flash_decode<TY, D>):
 *   - grid (tasks, partitions of KV_K_FD_PART entries), KV_K_FD_THREADS threads a block;
 *   - a row (one entry's K or V, d_h values) is split into chunks of 8 values, one lane per
 *     chunk: D / 8 lanes hold an entry, so a warp reads 256 / D entries per load instruction
 *     (d_h 128: two entries, 16 lanes each) with one 16-byte load a lane (f16; f32 two; q8
 *     four 2-byte loads, its rows being only 2-byte aligned; q4 one 4-byte load) and the row's
 *     scale read once by each lane of the entry (q8, q4: decoded once per row, not per value);
 *   - a lane loads K and V of KV_FD_UNROLL<TY> entries before it uses any of them (f16, q8, q4:
 *     4 entries, 8 independent loads in flight a lane; f32: 2 entries, 8 loads), the block
 *     table of the partition having been read into shared memory once (no global load waits
 *     on another inside the loop: one round trip per iteration);
 *   - the GQA group's scaled queries (<= KV_K_FD_GROUP heads) stay in registers, each K/V load
 *     serves the whole group, and an online softmax per head (Milakov & Gimelshein 2018:
 *     running max m, sum l, output o) is updated once per unrolled group of entries;
 *   - the entry groups of a warp merge by shuffles, the warps in shared memory in warp order,
 *     and the block writes the partition's (m, s, o) as kv_k_decode_merge reads them.
 * Entry e's slot is table[e >> log2 bs] << log2 bs | (e & (bs - 1)): the block size is a power
 * of two (shifts, no division), d_h a multiple of 8 up to D (lanes past d_h idle). */
#ifndef KVPLAN_CUDA_KV_FLASH_CUH
#define KVPLAN_CUDA_KV_FLASH_CUH

#include "kv_kernels.cuh"
#include "kv_quant.cuh" /* kv_h2f */

/* Threads of a flash-decoding block: 8 warps. */
#define KV_K_FD_THREADS 256

/* The online softmax runs in base 2 (scores scaled by log2 e with the queries, exp2 for every
 * exponential: one hardware instruction on the device, as FlashAttention-2 and llama.cpp do);
 * the partition maxima and raw scores it writes are back in natural units (x ln 2). */
#define KV_FD_LOG2E 1.4426950408889634f
#define KV_FD_LN2 0.6931471805599453f

/* Per K/V type: the words a lane loads for its chunk of 8 values of a row (W of them, plus one
 * scale word for the quantised types), how it loads them, and how it decodes them into the
 * row's values (the values kvt_decode_at gives). */
template <int TY> struct kv_fd_row;

template <> struct kv_fd_row<KV_TYPE_F32> {
    static const int W = 8, U = 2;
    KV_DEVICE void load(const unsigned char *row, int c, unsigned *w) {
        kv_load16(row + 32 * c, w);
        kv_load16(row + 32 * c + 16, w + 4);
    }
    KV_DEVICE void decode(const unsigned *w, float *x) {
        for (int k = 0; k < 8; k++) memcpy(&x[k], &w[k], sizeof(float));
    }
};

template <> struct kv_fd_row<KV_TYPE_F16> {
    static const int W = 4, U = 4;
    KV_DEVICE void load(const unsigned char *row, int c, unsigned *w) {
        kv_load16(row + 16 * c, w);
    }
    KV_DEVICE void decode(const unsigned *w, float *x) {
        for (int k = 0; k < 4; k++) {
            x[2 * k] = kv_h2f(w[k] & 0xffffu);
            x[2 * k + 1] = kv_h2f(w[k] >> 16);
        }
    }
};

/* [binary16 s][d_h int8]: rows of d_h + 2 bytes are 2-byte aligned; w[4] = the scale */
template <> struct kv_fd_row<KV_TYPE_Q8> {
    static const int W = 5, U = 4;
    KV_DEVICE void load(const unsigned char *row, int c, unsigned *w) {
        for (int k = 0; k < 4; k++) w[k] = kv_ld_u16(row + 2 + 8 * c + 2 * k);
        w[4] = kv_ld_u16(row);
    }
    KV_DEVICE void decode(const unsigned *w, float *x) {
        float s = kv_h2f(w[4]);
        for (int k = 0; k < 8; k++)
            x[k] = s * (float)(signed char)(unsigned char)(w[k / 2] >> (8 * (k & 1)));
    }
};

/* [binary16 s][binary16 m][d_h / 2 nibble bytes]: rows of d_h / 2 + 4 bytes, 4-byte aligned;
 * w[1] = s | m << 16 */
template <> struct kv_fd_row<KV_TYPE_Q4> {
    static const int W = 2, U = 4;
    KV_DEVICE void load(const unsigned char *row, int c, unsigned *w) {
        w[0] = kv_ld_u32(row + 4 + 4 * c);
        w[1] = kv_ld_u32(row);
    }
    KV_DEVICE void decode(const unsigned *w, float *x) {
        float s = kv_h2f(w[1] & 0xffffu), m = kv_h2f(w[1] >> 16);
        for (int k = 0; k < 8; k++) x[k] = m + s * (float)((w[0] >> (4 * k)) & 15u);
    }
};

/* Dynamic shared memory of kv_k_flash_decode: the warps' states, nw * g * (2 + hd) floats, the
 * group's queries, g * hd floats, then the partition's block table, (part >> bs_log2) + 2
 * ints. */
KV_HOSTDEV size_t kv_k_fd_shm(int threads, int g, int hd, int part, int bs_log2) {
    return ((size_t)(threads / KV_WARP + 1) * (size_t)g * (size_t)(2 + hd)) * sizeof(float) +
           (size_t)((part >> bs_log2) + 2) * sizeof(int);
}

/* One lane's running softmax state for the g heads of its group, D / 8 lanes per entry. */
template <int TY, int D> struct kv_fd_state {
    static const int LPE = D / 8;          /* lanes per entry */
    static const int EPW = KV_WARP / LPE;  /* entries a warp load covers */
    static const int U = kv_fd_row<TY>::U; /* entries a lane loads per iteration */
    float q[KV_K_FD_GROUP][8], m[KV_K_FD_GROUP], l[KV_K_FD_GROUP], o[KV_K_FD_GROUP][8];
};

/* The scores of a lane's U entries for query head gh (x: the decoded K chunks), summed over
 * the entry's D / 8 lanes; entries past the partition (ok[u] = 0) score -inf. */
template <int TY, int D>
KV_DEVICE void kv_fd_scores(const kv_fd_state<TY, D> &S, int gh, float (*x)[8], const bool *ok,
                            float *s) {
    typedef kv_fd_state<TY, D> St;
    KV_UNROLL
    for (int u = 0; u < St::U; u++) {
        float sp = 0.0f;
        KV_UNROLL
        for (int k = 0; k < 8; k++) sp += S.q[gh][k] * x[u][k];
        KV_UNROLL
        for (int w = St::LPE / 2; w > 0; w /= 2) sp += kv_shfl_xor(sp, w);
        s[u] = ok[u] ? sp : -INFINITY;
    }
}

/* The online softmax update of head gh by U scores s and their V chunks v. */
template <int TY, int D>
KV_DEVICE void kv_fd_update(kv_fd_state<TY, D> &S, int gh, const float *s, float (*v)[8]) {
    typedef kv_fd_state<TY, D> St;
    float mn = S.m[gh];
    KV_UNROLL
    for (int u = 0; u < St::U; u++) mn = s[u] > mn ? s[u] : mn;
    if (mn == -INFINITY) return; /* nothing seen yet and nothing new */
    float al = exp2f(S.m[gh] - mn), p[St::U], ps = 0.0f;
    KV_UNROLL
    for (int u = 0; u < St::U; u++) {
        p[u] = exp2f(s[u] - mn);
        ps += p[u];
    }
    S.l[gh] = S.l[gh] * al + ps;
    KV_UNROLL
    for (int k = 0; k < 8; k++) {
        float a = S.o[gh][k] * al;
        KV_UNROLL
        for (int u = 0; u < St::U; u++) a += p[u] * v[u][k];
        S.o[gh][k] = a;
    }
    S.m[gh] = mn;
}

/* The entries [e0, e1) of one partition, warp by warp (see the file's comment): updates S.
 * tb: the partition's block table from block e0 >> sh, as blocks of type TY (block id -
 * P.type_first[TY]); raw: the raw scores of a tracked task
 * (or NULL). */
template <int TY, int D>
KV_DEVICE void kv_fd_walk(const kv_k_pool &P, const int *tb, int sh, int e0, int e1, int g,
                          float *raw, int stride, kv_fd_state<TY, D> &S) {
    typedef kv_fd_state<TY, D> St;
    typedef kv_fd_row<TY> R;
    const kv_cache_type ty = (kv_cache_type)TY;
    int lane = kv_tid() % KV_WARP, nw = kv_bdim() / KV_WARP, c = lane % St::LPE;
    int sub = lane / St::LPE, blk0 = e0 >> sh, msk = (1 << sh) - 1;
    bool act = 8 * c < P.hd;
    size_t rb = kvt_row_bytes(ty, P.hd), vo = ((size_t)1 << sh) * rb; /* V after the K rows */
    const unsigned char *pool = P.data + P.type_offset[ty];
    const int span = St::U * St::EPW;
    for (int base = e0 + (kv_tid() / KV_WARP) * span; base < e1; base += nw * span) {
        unsigned kw[St::U][R::W], vw[St::U][R::W];
        bool ok[St::U];
        KV_UNROLL
        for (int u = 0; u < St::U; u++) { /* every load of the iteration issued first */
            int e = base + u * St::EPW + sub;
            ok[u] = e < e1;
            for (int k = 0; k < R::W; k++) kw[u][k] = vw[u][k] = 0u;
            if (!ok[u] || !act) continue;
            const unsigned char *kr =
                pool + ((size_t)tb[(e >> sh) - blk0] * 2 * ((size_t)1 << sh) + (e & msk)) * rb;
            R::load(kr, c, kw[u]);
            R::load(kr + vo, c, vw[u]);
        }
        float kx[St::U][8], vx[St::U][8];
        KV_UNROLL
        for (int u = 0; u < St::U; u++) {
            R::decode(kw[u], kx[u]);
            R::decode(vw[u], vx[u]);
        }
        KV_UNROLL
        for (int gh = 0; gh < KV_K_FD_GROUP; gh++) {
            if (gh >= g) break; /* g is uniform: every lane leaves together */
            float s[St::U];
            kv_fd_scores<TY, D>(S, gh, kx, ok, s);
            if (raw && c == 0)
                for (int u = 0; u < St::U; u++)
                    if (ok[u])
                        raw[(size_t)gh * stride + base + u * St::EPW + sub] = s[u] * KV_FD_LN2;
            kv_fd_update<TY, D>(S, gh, s, vx);
        }
    }
}

/* The warp's entry groups merged into the lanes of group 0 (shuffles, fixed order), then each
 * warp's state stored to sh [warp][gh][m, l, o[hd]]. */
template <int TY, int D>
KV_DEVICE void kv_fd_store(kv_fd_state<TY, D> &S, int g, int hd, float *sh) {
    typedef kv_fd_state<TY, D> St;
    int lane = kv_tid() % KV_WARP, warp = kv_tid() / KV_WARP, c = lane % St::LPE;
    KV_UNROLL
    for (int gh = 0; gh < KV_K_FD_GROUP; gh++) {
        if (gh >= g) break;
        KV_UNROLL
        for (int w = St::LPE; w < KV_WARP; w *= 2) {
            float mo = kv_shfl_xor(S.m[gh], w), lo = kv_shfl_xor(S.l[gh], w);
            float mn = mo > S.m[gh] ? mo : S.m[gh];
            float fa = S.m[gh] == -INFINITY ? 0.0f : exp2f(S.m[gh] - mn);
            float fb = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
            S.l[gh] = S.l[gh] * fa + lo * fb;
            KV_UNROLL
            for (int k = 0; k < 8; k++)
                S.o[gh][k] = S.o[gh][k] * fa + kv_shfl_xor(S.o[gh][k], w) * fb;
            S.m[gh] = mn;
        }
        float *st = sh + ((size_t)warp * g + gh) * (size_t)(2 + hd);
        if (lane == 0) {
            st[0] = S.m[gh];
            st[1] = S.l[gh];
        }
        if (lane < St::LPE)
            for (int k = 0; k < 8; k++)
                if (8 * c + k < hd) st[2 + 8 * c + k] = S.o[gh][k];
    }
}

/* The block's warps merged in warp order into the partition's outputs at pi0 (the layout of
 * kv_k_decode_merge): part_m, part_s [pi], part_o [pi * hd + d]. */
KV_DEVICE void kv_fd_merge_warps(const float *sh, int g, int hd, size_t pi0, float *part_m,
                                 float *part_s, float *part_o) {
    int nw = kv_bdim() / KV_WARP, ws = g * (2 + hd);
    for (int x = kv_tid(); x < g * hd; x += kv_bdim()) {
        int gh = x / hd, d = x % hd;
        float M = -INFINITY;
        for (int w = 0; w < nw; w++) {
            float mw = sh[(size_t)w * ws + gh * (2 + hd)];
            M = mw > M ? mw : M;
        }
        float Ssum = 0.0f, O = 0.0f;
        for (int w = 0; w < nw; w++) {
            const float *st = sh + (size_t)w * ws + gh * (2 + hd);
            if (st[1] == 0.0f) continue; /* a warp that saw no entry */
            float f = exp2f(st[0] - M);
            Ssum += st[1] * f;
            O += st[2 + d] * f;
        }
        part_o[(pi0 + (size_t)gh) * hd + d] = O;
        if (d == 0) {
            part_m[pi0 + gh] = M * KV_FD_LN2; /* back to natural units for the merge */
            part_s[pi0 + gh] = Ssum;
        }
    }
}

/* Decode attention, part 1, flash-decoding: grid (n_tasks, parts), block (task b, part c) takes
 * entries [c * part, min(len, (c + 1) * part)) of task b (n = 1, one query per head), for the
 * g (<= KV_K_FD_GROUP) query heads of its GQA group, and writes the partition's score maximum
 * m, sum s = sum_e exp(s_e - m) and unnormalised output o = sum_e exp(s_e - m) v_e at part
 * index pi = (b * parts + c) * g + gh (o at pi * hd), the layout kv_k_decode_merge reads; an
 * empty partition writes m = -inf, s = 0, o = 0. s_e = q . k_e / sqrt(d_h).
 * Template: TY the K/V type of the tasks served (others' blocks return at once: the launcher
 * launches once per type present), D the lanes' span of a row (a power of two, 8..256, d_h <=
 * D, d_h % 8 == 0). bs_log2: log2 of the pool's block size. Raw scores s_e go to scratch (task
 * b's g rows of stride scratch_stride) for tracked tasks only, for kv_k_decode_stats_raw.
 * Any multiple of 32 threads (the launcher: KV_K_FD_THREADS); dynamic shared memory
 * kv_k_fd_shm(threads, g, hd, part, bs_log2) bytes. */
template <int TY, int D>
KV_GLOBAL void kv_k_flash_decode(kv_k_pool P, const int *tables, const kv_k_attn_task *tasks,
                                 const float *q, int q_stride, int g, int part, int parts,
                                 int bs_log2, float *scratch, int scratch_stride, float *part_m,
                                 float *part_s, float *part_o) {
    KV_DYNAMIC_SHARED(float, sh);
    int b = kv_bid(), c = kv_bid_y(), hd = P.hd, lane = kv_tid() % KV_WARP;
    kv_k_attn_task t = tasks[b];
    const int *table = tables + t.table_off;
    if (kv_k_block_type(P, table[0]) != (kv_cache_type)TY) return; /* another launch's */
    int e0 = c * part, e1 = e0 + part < t.len ? e0 + part : t.len;
    size_t pi0 = ((size_t)b * (size_t)parts + (size_t)c) * (size_t)g;
    if (e0 >= e1) { /* past this task's end: an empty part (uniform over the block) */
        for (int x = kv_tid(); x < g * hd; x += kv_bdim()) part_o[pi0 * hd + x] = 0.0f;
        if (kv_tid() < g) {
            part_m[pi0 + kv_tid()] = -INFINITY;
            part_s[pi0 + kv_tid()] = 0.0f;
        }
        return;
    }
    /* the group's queries (coalesced, once per block) and the partition's block table */
    float *qs = sh + (size_t)(kv_bdim() / KV_WARP) * g * (2 + hd);
    int *tb = reinterpret_cast<int *>(qs + (size_t)g * (2 + hd));
    const float *qrow = q + (size_t)t.row0 * (size_t)q_stride + (size_t)t.kv_head * g * hd;
    for (int x = kv_tid(); x < g * hd; x += kv_bdim()) qs[x] = qrow[x];
    int blk0 = e0 >> bs_log2, n_tb = ((e1 - 1) >> bs_log2) - blk0 + 1;
    for (int i = kv_tid(); i < n_tb; i += kv_bdim()) tb[i] = table[blk0 + i] - P.type_first[TY];
    kv_syncthreads();
    kv_fd_state<TY, D> S;
    int ch = lane % kv_fd_state<TY, D>::LPE;
    float inv = KV_FD_LOG2E / sqrtf((float)hd); /* scores in base-2 units */
    KV_UNROLL
    for (int gh = 0; gh < KV_K_FD_GROUP; gh++) {
        KV_UNROLL
        for (int k = 0; k < 8; k++) {
            S.q[gh][k] = gh < g && 8 * ch + k < hd ? qs[gh * hd + 8 * ch + k] * inv : 0.0f;
            S.o[gh][k] = 0.0f;
        }
        S.m[gh] = -INFINITY;
        S.l[gh] = 0.0f;
    }
    float *raw = t.track ? scratch + (size_t)b * (size_t)g * (size_t)scratch_stride : nullptr;
    kv_fd_walk<TY, D>(P, tb, bs_log2, e0, e1, g, raw, scratch_stride, S);
    kv_fd_store<TY, D>(S, g, hd, sh);
    kv_syncthreads();
    kv_fd_merge_warps(sh, g, hd, pi0, part_m, part_s, part_o);
}

#endif
