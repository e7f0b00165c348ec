/* kvplan block-pool index arithmetic, one definition for C, C++ and CUDA.
 *
 * The paged KV cache (include/kvplan/kvcache.h; KV-Compress §3, vLLM's PagedAttention) stores
 * K and V of one (layer, KV head) for `block_size` tokens in one block:
 *   data[block][0][slot][d_h] = K, data[block][1][slot][d_h] = V, fp32,
 * and each (sequence, layer, KV head) lists its blocks in a block table. Entry e of a head
 * lives in block table[e / block_size] at slot e % block_size.
 *
 * A "slot id" names one token slot of the whole pool: block * block_size + slot. Per-slot
 * metadata (position id, accumulated attention statistics) can be stored in arrays of
 * n_blocks * block_size indexed by slot id, so it moves with the data and is paged with it.
 *
 * Every function is static inline, pure, and marked host+device under nvcc, so the CPU cache,
 * the CUDA kernels (cuda/kernels/) and the host shim used by the tests compute the same
 * offsets. Nothing here allocates or fails; callers check their indices.
 */
#ifndef KVPLAN_KVSLOT_H
#define KVPLAN_KVSLOT_H

#include <stddef.h>

#if defined(__CUDACC__)
#define KV_HOSTDEV static __host__ __device__ __forceinline__
#else
#define KV_HOSTDEV static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Slot id of entry `e` of a head whose block table is `table` (block ids), block_size bs. */
KV_HOSTDEV int kv_slot_of_entry(const int *table, int e, int bs) {
    return table[e / bs] * bs + e % bs;
}

/* Offset in floats of K of slot id `slot` from the start of the pool data (bs tokens per
 * block, hd floats per token). V follows at + bs * hd (kv_slot_v_offset). */
KV_HOSTDEV size_t kv_slot_k_offset(int slot, int bs, int hd) {
    size_t b = (size_t)(slot / bs), s = (size_t)(slot % bs);
    return (b * 2 * (size_t)bs + s) * (size_t)hd;
}

KV_HOSTDEV size_t kv_slot_v_offset(int slot, int bs, int hd) {
    return kv_slot_k_offset(slot, bs, hd) + (size_t)bs * (size_t)hd;
}

/* The window ring of a head (include/kvplan/kvcache.h, kv_head.wbase / wrot): entries below
 * `wbase` (the sink tokens) sit at their own index; the window's entry k = e - wbase sits at
 * wbase + (wrot + k) mod cap, where cap = blocks held x bs - wbase. wrot = 0 is the plain
 * layout (entry e at e). Returns the physical entry of logical entry e < wbase + cap. */
KV_HOSTDEV int kv_ring_entry(int e, int wbase, int wrot, int cap) {
    if (wrot == 0 || e < wbase) return e;
    int k = e - wbase + wrot;
    return wbase + (k >= cap ? k - cap : k);
}

/* Entries [0, n) of a head in logical order as at most 3 runs stored one after another: run r
 * is logical entries [first[r], first[r] + count[r]) at physical entries [phys[r], ...). The
 * arrays hold 3 ints; returns the number of runs (0 for n = 0). */
KV_HOSTDEV int kv_ring_runs(int n, int wbase, int wrot, int cap, int *first, int *phys,
                            int *count) {
    if (n <= 0) return 0;
    if (wrot == 0 || n <= wbase) {
        first[0] = phys[0] = 0;
        count[0] = n;
        return 1;
    }
    int r = 0, w = n - wbase, tail = cap - wrot; /* window entries; those before the wrap */
    if (wbase > 0) {
        first[r] = phys[r] = 0;
        count[r++] = wbase;
    }
    first[r] = wbase;
    phys[r] = wbase + wrot;
    count[r++] = w < tail ? w : tail;
    if (w > tail) {
        first[r] = wbase + tail;
        phys[r] = wbase;
        count[r++] = w - tail;
    }
    return r;
}

/* Blocks holding n entries: ceil(n / bs). */
KV_HOSTDEV int kv_blocks_for(int n, int bs) {
    return (n + bs - 1) / bs;
}

#ifdef __cplusplus
}
#endif
#endif
