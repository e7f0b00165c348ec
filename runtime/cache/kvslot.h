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

/* Blocks holding n entries: ceil(n / bs). */
KV_HOSTDEV int kv_blocks_for(int n, int bs) {
    return (n + bs - 1) / bs;
}

#ifdef __cplusplus
}
#endif
#endif
