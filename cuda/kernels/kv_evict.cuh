/* Eviction on the device: the selection of kv_policy_select (runtime/cache/kvcache.c) for h2o,
 * avgattn and l2attn run on the per-slot positions and statistics of a device pool
 * (kv_k_pool pos / acc / acc2), then the kept entries' K/V rows and metadata compacted to the
 * front of the head in order (KV-Compress's MoveCache, done where the rows live). Sources: H2O
 * (Zhang et al. 2023: the recent half of the budget plus the heaviest accumulated attention),
 * Batch-Max §3.2 (average attention acc / (curr_pos + 1 - pos)), KV-Compress §3.3 (squared
 * attention, the last KV_K_L2_WINDOW positions protected). Included after kv_kernels.cuh. */
#ifndef KVPLAN_CUDA_KV_EVICT_CUH
#define KVPLAN_CUDA_KV_EVICT_CUH

#include "kv_kernels.cuh"

/* (a, ia) ranks above (b, ib) in the total order the host's keep_top uses: the larger score,
 * ties the larger index (the more recent entry). Index -1: no entry, ranks below all. */
KV_DEVICE int kv_ev_above(float a, int ia, float b, int ib) {
    if (ia < 0) return 0;
    if (ib < 0) return 1;
    return a > b || (a == b && ia > ib);
}

/* The best (best = 1: highest, else lowest) candidate of [lo, hi) with mask 0 under
 * kv_ev_above, for the whole block (every thread gets it); -1 when there is none. rs, ri:
 * shared [KV_K_EV_THREADS]. */
KV_DEVICE int kv_ev_arg(const float *score, const unsigned char *mask, int lo, int hi, int best,
                        float *rs, int *ri) {
    float s = 0.0f;
    int at = -1;
    for (int i = lo + kv_tid(); i < hi; i += kv_bdim()) {
        if (mask[i]) continue;
        int wins =
            at < 0 || (best ? kv_ev_above(score[i], i, s, at) : kv_ev_above(s, at, score[i], i));
        if (wins) {
            s = score[i];
            at = i;
        }
    }
    rs[kv_tid()] = s;
    ri[kv_tid()] = at;
    kv_syncthreads();
    for (int w = kv_bdim() / 2; w > 0; w /= 2) {
        if (kv_tid() < w) {
            float s2 = rs[kv_tid() + w];
            int i2 = ri[kv_tid() + w];
            int wins = i2 >= 0 && (ri[kv_tid()] < 0 ||
                                   (best ? kv_ev_above(s2, i2, rs[kv_tid()], ri[kv_tid()])
                                         : kv_ev_above(rs[kv_tid()], ri[kv_tid()], s2, i2)));
            if (wins) {
                rs[kv_tid()] = s2;
                ri[kv_tid()] = i2;
            }
        }
        kv_syncthreads();
    }
    int r = ri[0];
    kv_syncthreads(); /* rs / ri are reused by the next call */
    return r;
}

/* keep_top of the host (kvcache.c) for the block: keep the n best of the candidates [lo, hi)
 * whose mask is 0 (avail of them), marking them 1; the rest get 0. Rounds of kv_ev_arg: the
 * avail - n worst dropped when more than half are kept, else the n best picked, so the cost
 * is O((hi - lo) * min(n, avail - n) / threads). */
KV_DEVICE void kv_ev_keep_top(const float *score, unsigned char *mask, int lo, int hi, int n,
                              int avail, float *rs, int *ri) {
    int drop = 2 * n > avail;
    if (n >= avail) {
        for (int i = lo + kv_tid(); i < hi; i += kv_bdim()) mask[i] = 1;
    } else if (drop) {
        for (int k = 0; k < avail - n; k++) {
            int w = kv_ev_arg(score, mask, lo, hi, 0, rs, ri);
            if (kv_tid() == 0) mask[w] = 2;
            kv_syncthreads();
        }
        for (int i = lo + kv_tid(); i < hi; i += kv_bdim()) mask[i] = mask[i] != 2;
    } else {
        for (int k = 0; k < n; k++) {
            int w = kv_ev_arg(score, mask, lo, hi, 1, rs, ri);
            if (kv_tid() == 0 && w >= 0) mask[w] = 1;
            kv_syncthreads();
        }
    }
    kv_syncthreads();
}

/* The selection of one record r into mask [len] (1: kept), scores in score [len]; entries at
 * table (block ids), their metadata at P.pos / acc / acc2 by slot. Exactly kv_policy_select:
 * h2o keeps the last n_keep / 2 and the best acc of the rest; avgattn the best acc / (float)
 * (curr_pos + 1 - pos) (an IEEE division); l2attn the entries with curr_pos - pos <
 * KV_K_L2_WINDOW (the most recent n_keep of them), then the best acc2. n is the whole block's. */
KV_DEVICE void kv_ev_select(const kv_k_pool &P, const kv_evict &r, const int *table, float *score,
                            unsigned char *mask, float *rs, int *ri) {
    int len = r.len, recent = r.policy == KV_POLICY_H2O ? r.n_keep / 2 : 0, prot = 0;
    for (int i = kv_tid(); i < len; i += kv_bdim()) {
        int slot = kv_slot_of_entry(table, i, P.bs);
        float s = P.acc[slot];
        unsigned char m = 0;
        if (r.policy == KV_POLICY_H2O) {
            m = i >= len - recent;
        } else if (r.policy == KV_POLICY_AVGATTN) {
            s = kv_fdiv_rn(s, (float)(r.curr_pos + 1 - P.pos[slot]));
        } else {
            s = P.acc2[slot];
            m = r.curr_pos - P.pos[slot] < KV_K_L2_WINDOW;
            prot += m;
        }
        score[i] = s;
        mask[i] = m;
    }
    if (r.policy == KV_POLICY_L2ATTN) {
        prot = kv_block_sum(prot, ri);
        if (prot > r.n_keep) { /* only the most recent n_keep protected entries are kept */
            if (kv_tid() == 0)
                for (int i = len - 1, kept = 0; i >= 0; i--)
                    if (mask[i]) mask[i] = kept++ < r.n_keep;
            prot = r.n_keep;
        }
    }
    kv_syncthreads();
    int hi = len - recent, n = r.n_keep - recent - prot;
    kv_ev_keep_top(score, mask, 0, hi, n, hi - prot, rs, ri);
}

/* Compaction of one record after kv_ev_select: kept entry i goes to entry k (the kept entries
 * before it), K and V rows (rb bytes each) and pos / acc / acc2, KV_K_EV_CHUNK entries a round:
 * every moved row of the round read into shared memory, then written (k <= i, and a later
 * round's sources lie above this round's destinations, so nothing is read after it is
 * overwritten). rows: shared KV_K_EV_CHUNK * 2 * rb bytes; sh: shared 3 * KV_K_EV_CHUNK + 1
 * ints, macc 2 * KV_K_EV_CHUNK floats. */
KV_DEVICE void kv_ev_compact(const kv_k_pool &P, kv_cache_type ty, size_t rb, const int *table,
                             int len, const unsigned char *mask, unsigned char *rows, int *sh,
                             float *macc) {
    int *src = sh, *dst = sh + KV_K_EV_CHUNK, *mpos = sh + 2 * KV_K_EV_CHUNK;
    int *cnt = sh + 3 * KV_K_EV_CHUNK, base = 0;
    for (int c0 = 0; c0 < len; c0 += KV_K_EV_CHUNK) {
        int t = kv_tid(), i = c0 + t;
        if (t < KV_K_EV_CHUNK) {
            int before = 0;
            for (int j = c0; j < i && j < len; j++) before += mask[j] != 0;
            int moved = i < len && mask[i] && base + before != i;
            src[t] = moved ? kv_slot_of_entry(table, i, P.bs) : -1;
            dst[t] = moved ? kv_slot_of_entry(table, base + before, P.bs) : -1;
            if (t == KV_K_EV_CHUNK - 1 || i == len - 1) *cnt = before + (i < len && mask[i]);
        }
        kv_syncthreads();
        size_t bytes = KV_K_EV_CHUNK * 2 * rb;
        for (size_t x = (size_t)kv_tid(); x < bytes; x += (size_t)kv_bdim()) {
            int e = (int)(x / (2 * rb)), which = (int)(x / rb % 2);
            if (src[e] >= 0) rows[x] = kv_k_row(P, ty, rb, src[e], which)[x % rb];
        }
        if (t < KV_K_EV_CHUNK && src[t] >= 0) {
            mpos[t] = P.pos[src[t]];
            macc[2 * t] = P.acc[src[t]];
            macc[2 * t + 1] = P.acc2[src[t]];
        }
        kv_syncthreads();
        for (size_t x = (size_t)kv_tid(); x < bytes; x += (size_t)kv_bdim()) {
            int e = (int)(x / (2 * rb)), which = (int)(x / rb % 2);
            if (dst[e] >= 0) kv_k_row(P, ty, rb, dst[e], which)[x % rb] = rows[x];
        }
        if (t < KV_K_EV_CHUNK && dst[t] >= 0) {
            P.pos[dst[t]] = mpos[t];
            P.acc[dst[t]] = macc[2 * t];
            P.acc2[dst[t]] = macc[2 * t + 1];
        }
        base += *cnt;
        kv_syncthreads(); /* src / dst / rows / cnt are rewritten by the next round */
    }
}

/* The evictions of one layer (the backend's evict op): block b takes record ev[b] (a head of
 * ev[b].len entries at block table tab + ev[b].tab_off, include/kvplan/kvcache.h kv_evict),
 * selects the n_keep entries kv_policy_select keeps (kv_ev_select) and compacts them with
 * their metadata to the front (kv_ev_compact). score / mask: device scratch, record b's at
 * tab_off * bs (its table covers len entries). Block: KV_K_EV_THREADS threads; dynamic shared
 * memory KV_K_EV_CHUNK * 2 * (the widest row: 4 d_h) bytes. P must have pos / acc / acc2. */
KV_GLOBAL void kv_k_evict(kv_k_pool P, const kv_evict *ev, const int *tab, float *score_buf,
                          unsigned char *mask_buf) {
    KV_DYNAMIC_SHARED(unsigned char, rows);
    KV_SHARED_ARRAY(float, rs, KV_K_EV_THREADS);
    KV_SHARED_ARRAY(int, ri, KV_K_EV_THREADS);
    KV_SHARED_ARRAY(int, sh, 3 * KV_K_EV_CHUNK + 1);
    KV_SHARED_ARRAY(float, macc, 2 * KV_K_EV_CHUNK);
    kv_evict r = ev[kv_bid()];
    if (r.n_keep >= r.len || r.n_keep <= 0) return; /* uniform over the block */
    const int *table = tab + r.tab_off;
    size_t off = (size_t)r.tab_off * (size_t)P.bs;
    kv_ev_select(P, r, table, score_buf + off, mask_buf + off, rs, ri);
    kv_cache_type ty = kv_k_block_type(P, table[0]);
    kv_ev_compact(P, ty, kvt_row_bytes(ty, P.hd), table, r.len, mask_buf + off, rows, sh, macc);
}

#endif
