/* Plain data shared by the layer kernels (kv_kernels.cuh), their launchers (cuda/kernels.h)
 * and the tests: task descriptors, constants, and the host-side split of a move list into
 * passes the gather kernels can run in parallel. C and C++; no CUDA needed. */
#ifndef KVPLAN_CUDA_KV_TASKS_H
#define KVPLAN_CUDA_KV_TASKS_H

#include "kvplan/kvcache.h" /* kv_cache_type, KV_CACHE_TYPES */

#include <stddef.h>

/* Queries younger than this many positions do not add to an entry's squared-attention sum
 * (KV-Compress "KVC-full", excluded window v = 10; KV_L2_EXCLUDED_WINDOW of the CPU). */
#define KV_K_L2_WINDOW 10

/* Rows of x at or below which the CUDA backend multiplies by the typed GEMV kernels (decode
 * and batches up to 32: each weight row is read once in its type, never widened to an fp32
 * tile; kernels/kv_quant.cuh, whose threads keep one accumulator per row); above, prefill's
 * 16-bit GEMM or dequantised tile + GEMM. */
#define KV_K_GEMV_ROWS 32

/* Query heads of a GQA group the flash-decoding kernel (kv_kernels.cuh kv_k_flash_decode)
 * keeps in registers (larger groups take kv_k_decode_split). */
#define KV_K_FD_GROUP 8
/* Entries per partition of flash-decoding: a fixed size, not a fraction of the device. */
#define KV_K_FD_PART 256

/* Threads of the eviction kernel (kv_evict.cuh; a power of two: its argmin / argmax is a tree
 * over them) and the entries it moves per round of its compaction (their K and V rows staged
 * in shared memory). */
#define KV_K_EV_THREADS 128
#define KV_K_EV_CHUNK 32

/* Layouts of RoPE pairs (include/kvplan/model.h kv_rope_layout). */
#define KV_K_ROPE_ADJACENT 0
#define KV_K_ROPE_HALF 1

/* One (sequence, KV head) of an attention step: a thread block's work. The device form of
 * the engine's kv_attn_task (include/kvplan/backend.h), with the host pointers replaced by
 * offsets into flat arrays uploaded once per step. */
typedef struct kv_k_attn_task {
    int row0;      /* row of the first new token in q and o */
    int n;         /* new tokens this step: the head's last n entries, also its queries */
    int kv_head;   /* j; its GQA group is query heads j*g .. j*g + g-1 */
    int len;       /* entries after this step's append (retained + new) */
    int table_off; /* offset of the head's block table in tables[] */
    int meta_off;  /* offset of its entries' pos / acc / acc2 in those arrays; -1: they are
                    * indexed by slot (the pool's per-slot metadata, kv_k_pool pos / acc /
                    * acc2, passed as those arrays): entry e's at its slot */
    int track;     /* accumulate acc / acc2 for this head */
} kv_k_attn_task;

/* The kernels' view of the typed block pool (include/kvplan/kvcache.h kv_pool; docs/formats.md
 * "KV storage types"): block ids [type_first[t], type_first[t + 1]) hold type t, stored from
 * byte type_offset[t] of `data` as [block][K|V][slot][row_bytes(t)]. The same ranges and
 * offsets as the engine's host pool, so the device stores exactly the CPU's bytes. */
typedef struct kv_k_pool {
    unsigned char *data; /* device storage: type_offset[KV_CACHE_TYPES] bytes */
    int bs, hd;          /* block size (tokens), head dimension */
    int type_first[KV_CACHE_TYPES + 1];
    size_t type_offset[KV_CACHE_TYPES + 1];
    /* per-slot metadata [bs * blocks] (a pool with device_meta) or all NULL: the position of
     * the token a slot holds (set by kv_k_cache_write) and its attention sums (zeroed there,
     * accumulated by the attention kernels of tracked heads); moved with the rows by the
     * gather and the eviction (kv_evict.cuh) */
    int *pos;
    float *acc, *acc2;
} kv_k_pool;

/* One new K/V row: (row, KV head) of the step's k / v goes to `slot` of the pool (the
 * engine's kv_slot_write). */
typedef struct kv_k_write {
    int row, kv_head, slot;
} kv_k_write;

/* One K/V copy inside the pool, slot src -> slot dst (the engine's kv_move). */
typedef struct kv_k_move {
    int src, dst;
} kv_k_move;

/* Split a move list, which is defined as applied in order, into passes [start[i], start[i+1])
 * that each can run as "read every source, then write every destination" with the same
 * result: a pass ends before a move that reads or writes a slot an earlier move of the same
 * pass wrote. Compaction (survivors moved forward in order) needs one pass.
 * stamp: caller-owned [n_slots] ints, every entry < *gen on entry (e.g. zero-filled with
 * *gen = 1); *gen grows by the number of passes, so the array is reused without clearing.
 * start: caller-owned [n + 1]. Returns the number of passes (0 for n = 0); start[passes] = n. */
static inline int kv_k_split_moves(const kv_k_move *moves, int n, int *stamp, int *gen,
                                   int *start) {
    int passes = 0;
    if (n <= 0) return 0;
    start[passes++] = 0;
    for (int i = 0; i < n; i++) {
        if (stamp[moves[i].src] == *gen || stamp[moves[i].dst] == *gen) {
            (*gen)++;
            start[passes++] = i;
        }
        stamp[moves[i].dst] = *gen;
    }
    (*gen)++;
    start[passes] = n;
    return passes;
}

/* Launch plan of split-sequence decode attention (flash-decoding, Dao et al. 2023; vLLM's
 * paged_attention_v2 partitions the same way): each task's entries are cut into chunks of
 * `chunk` entries (a multiple of the block size bs, so a chunk is whole blocks), one thread
 * block per (task, chunk), so that even one sequence fills the device. Given n_tasks tasks
 * (> 0), the longest task's len (> 0), bs (> 0) and the device's SM count (> 0): chunk is the
 * largest multiple of bs (at least bs) with n_tasks * ceil(longest / chunk) >= 2 * sm_count
 * blocks, or longest rounded up to bs when n_tasks alone reaches that; chunks =
 * ceil(longest / chunk) (1: no split, the plain kernel serves), grid = n_tasks * chunks.
 * A task shorter than the longest leaves its last blocks empty (they write an empty part). */
typedef struct kv_k_split {
    int chunk;  /* entries per chunk, a multiple of bs */
    int chunks; /* chunks of the longest task: the grid's y extent */
    long grid;  /* thread blocks: n_tasks * chunks */
} kv_k_split;

static inline kv_k_split kv_k_split_plan(int n_tasks, int longest, int bs, int sm_count) {
    kv_k_split p;
    long target = 2L * sm_count;
    long per_task = (target + n_tasks - 1) / n_tasks; /* chunks each task needs */
    int chunk = per_task > 1 ? (int)(longest / per_task) / bs * bs : (longest + bs - 1) / bs * bs;
    if (chunk < bs) chunk = bs;
    p.chunk = chunk;
    p.chunks = (longest + chunk - 1) / chunk;
    p.grid = (long)n_tasks * p.chunks;
    return p;
}

#endif
