/* Plain data shared by the layer kernels (kv_kernels.cuh), their launchers (cuda/kernels.h)
 * and the tests: task descriptors, constants, and the host-side split of a move list into
 * passes the gather kernels can run in parallel. C and C++; no CUDA needed. */
#ifndef KVPLAN_CUDA_KV_TASKS_H
#define KVPLAN_CUDA_KV_TASKS_H

/* Queries younger than this many positions do not add to an entry's squared-attention sum
 * (KV-Compress "KVC-full", excluded window v = 10; KV_L2_EXCLUDED_WINDOW of the CPU). */
#define KV_K_L2_WINDOW 10

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
    int meta_off;  /* offset of its entries' pos / acc / acc2 in those arrays */
    int track;     /* accumulate acc / acc2 for this head */
} kv_k_attn_task;

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

#endif
