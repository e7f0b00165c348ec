/* Plain data shared by the layer kernels (kv_kernels.cuh), their launchers (cuda/kernels.h)
 * and the tests: task descriptors and constants. C and C++; no CUDA needed. */
#ifndef KVPLAN_CUDA_KV_TASKS_H
#define KVPLAN_CUDA_KV_TASKS_H

/* Queries younger than this many positions do not add to an entry's squared-attention sum
 * (KV-Compress "KVC-full", excluded window v = 10); the CPU value is in runtime/forward.c. */
#define KV_K_L2_WINDOW 10

/* Layouts of RoPE pairs (include/kvplan/model.h kv_rope_layout). */
#define KV_K_ROPE_ADJACENT 0
#define KV_K_ROPE_HALF 1

/* One (sequence, KV head) of an attention step: a thread block's work. */
typedef struct kv_attn_task {
    int table_off; /* offset of the head's block table in tables[] */
    int len;       /* entries after this step's append (retained + new) */
    int n_new;     /* new tokens this step: the head's last n_new entries, also its queries */
    int kv_head;   /* j; its GQA group is query heads j*g .. j*g + g-1 */
    int row0;      /* row of the first new token in q, o, k, v and row_pos */
} kv_attn_task;

/* One head's compaction: n_moves (src entry, dst entry) pairs at moves[2*move_off ...]. */
typedef struct kv_move_task {
    int table_off;
    int move_off;
    int n_moves;
} kv_move_task;

#endif
