/* Host side of one attention step of a device backend: the engine's tasks (host block tables,
 * positions and statistics, include/kvplan/backend.h) packed into one contiguous buffer that
 * is mirrored to the device with a single copy, and the statistics written back after the
 * kernel. Used by the CUDA backend (cuda/backend_cuda.cu), which the tests run on the fake
 * CUDA runtime (tests/cuda_fake/), so the packing the GPU relies on runs there too.
 * C and C++; no CUDA needed.
 *
 * Buffer layout, each section 16-byte aligned:
 *   kv_k_attn_task [n] | block tables (ceil(len / b_s) ints per task) | pos (len ints per task)
 *   | acc (len floats per task) | acc2 (same)
 * Only tasks whose head tracks statistics (acc != NULL) have meaningful acc / acc2 sections.
 *
 * Resident block tables (kv_k_meta_plan_resident / kv_k_meta_pack_resident): the device keeps
 * each task's table at tables[i * stride] of its layer's array between steps, and the buffer's
 * table section holds only the entries that changed since the last step, as (index, block id)
 * pairs, which kv_k_table_patch scatters there. A decode step that fills no new block and
 * evicts nothing uploads no table entry: its bytes do not grow with the context.
 */
#ifndef KVPLAN_CUDA_KV_PACK_H
#define KVPLAN_CUDA_KV_PACK_H

#include "kv_tasks.h"
#include "backend/backend_impl.h"
#include "cache/kvslot.h"

#include <stddef.h>
#include <string.h>

typedef struct kv_k_meta_layout {
    size_t o_tab, o_pos, o_acc, o_acc2, total; /* byte offsets and size of the buffer */
    int longest;                               /* the longest task's len (score rows) */
    int tracked;                               /* some task accumulates statistics */
} kv_k_meta_layout;

static inline size_t kv_k_align16(size_t b) {
    return (b + 15) / 16 * 16;
}

/* Sizes and offsets for n tasks at block size bs, with `table_ints` ints in the table section
 * (-1: every task's whole table). */
static inline void kv_k_meta_plan_ints(const kv_attn_task *t, int n, int bs, long table_ints,
                                       kv_k_meta_layout *L) {
    size_t n_table = 0, n_meta = 0;
    L->longest = 0;
    L->tracked = 0;
    for (int i = 0; i < n; i++) {
        if (table_ints < 0) n_table += (size_t)kv_blocks_for(t[i].len, bs);
        n_meta += (size_t)t[i].len;
        L->longest = t[i].len > L->longest ? t[i].len : L->longest;
        L->tracked |= t[i].acc != NULL;
    }
    if (table_ints >= 0) n_table = (size_t)table_ints;
    L->o_tab = kv_k_align16((size_t)n * sizeof(kv_k_attn_task));
    L->o_pos = L->o_tab + kv_k_align16(n_table * sizeof(int));
    L->o_acc = L->o_pos + kv_k_align16(n_meta * sizeof(int));
    L->o_acc2 = L->o_acc + kv_k_align16(n_meta * sizeof(float));
    L->total = L->o_acc2 + kv_k_align16(n_meta * sizeof(float));
}

/* Sizes and offsets for n tasks at block size bs (whole tables uploaded). */
static inline void kv_k_meta_plan(const kv_attn_task *t, int n, int bs, kv_k_meta_layout *L) {
    kv_k_meta_plan_ints(t, n, bs, -1, L);
}

/* Resident tables: the table entries of the n tasks that differ from `shadow` (the host copy
 * of the device array, [n * stride] ints, task i at i * stride). -1 when a task's table is
 * longer than stride (the caller then uploads whole tables). */
static inline long kv_k_table_changes(const kv_attn_task *t, int n, int bs, int stride,
                                      const int *shadow) {
    long changed = 0;
    for (int i = 0; i < n; i++) {
        int nb = kv_blocks_for(t[i].len, bs);
        if (nb > stride) return -1;
        const int *sh = shadow + (size_t)i * (size_t)stride;
        for (int b = 0; b < nb; b++) changed += sh[b] != t[i].table[b];
    }
    return changed;
}

/* Sizes and offsets with `changes` (kv_k_table_changes) patches of 2 ints. */
static inline void kv_k_meta_plan_resident(const kv_attn_task *t, int n, int bs, long changes,
                                           kv_k_meta_layout *L) {
    kv_k_meta_plan_ints(t, n, bs, 2 * changes, L);
}

/* Fill buf (L->total bytes): the tasks with table_off = i * stride, the changed entries as
 * (index into the layer's device array, block id) pairs (shadow updated to the tables), the
 * positions and statistics as kv_k_meta_pack. Returns the number of pairs. */
static inline long kv_k_meta_pack_resident(const kv_attn_task *t, int n, int bs, int stride,
                                           int *shadow, const kv_k_meta_layout *L, void *buf) {
    char *h = (char *)buf;
    kv_k_attn_task *ht = (kv_k_attn_task *)h;
    int *patch = (int *)(h + L->o_tab), *pos = (int *)(h + L->o_pos);
    float *acc = (float *)(h + L->o_acc), *acc2 = (float *)(h + L->o_acc2);
    long np = 0;
    int mi = 0;
    for (int i = 0; i < n; i++) {
        int nb = kv_blocks_for(t[i].len, bs), to = i * stride;
        kv_k_attn_task d = {t[i].row0, t[i].n, t[i].kv_head, t[i].len, to, mi, t[i].acc != NULL};
        ht[i] = d;
        for (int b = 0; b < nb; b++)
            if (shadow[to + b] != t[i].table[b]) {
                shadow[to + b] = t[i].table[b];
                patch[2 * np] = to + b;
                patch[2 * np + 1] = t[i].table[b];
                np++;
            }
        memcpy(pos + mi, t[i].pos, (size_t)t[i].len * sizeof(int));
        if (t[i].acc) {
            memcpy(acc + mi, t[i].acc, (size_t)t[i].len * sizeof(float));
            memcpy(acc2 + mi, t[i].acc2, (size_t)t[i].len * sizeof(float));
        }
        mi += t[i].len;
    }
    return np;
}

/* Fill buf (L->total bytes) from the tasks. */
static inline void kv_k_meta_pack(const kv_attn_task *t, int n, int bs, const kv_k_meta_layout *L,
                                  void *buf) {
    char *h = (char *)buf;
    kv_k_attn_task *ht = (kv_k_attn_task *)h;
    int *tab = (int *)(h + L->o_tab), *pos = (int *)(h + L->o_pos);
    float *acc = (float *)(h + L->o_acc), *acc2 = (float *)(h + L->o_acc2);
    int ti = 0, mi = 0;
    for (int i = 0; i < n; i++) {
        int nb = kv_blocks_for(t[i].len, bs);
        kv_k_attn_task d = {t[i].row0, t[i].n, t[i].kv_head, t[i].len, ti, mi, t[i].acc != NULL};
        ht[i] = d;
        memcpy(tab + ti, t[i].table, (size_t)nb * sizeof(int));
        memcpy(pos + mi, t[i].pos, (size_t)t[i].len * sizeof(int));
        if (t[i].acc) {
            memcpy(acc + mi, t[i].acc, (size_t)t[i].len * sizeof(float));
            memcpy(acc2 + mi, t[i].acc2, (size_t)t[i].len * sizeof(float));
        }
        ti += nb;
        mi += t[i].len;
    }
}

/* Write the statistics sections of buf back into the tracked tasks' host arrays. */
static inline void kv_k_meta_unpack_stats(const kv_attn_task *t, int n, const kv_k_meta_layout *L,
                                          const void *buf) {
    const char *h = (const char *)buf;
    const kv_k_attn_task *ht = (const kv_k_attn_task *)h;
    const float *acc = (const float *)(h + L->o_acc), *acc2 = (const float *)(h + L->o_acc2);
    for (int i = 0; i < n; i++) {
        if (!t[i].acc) continue;
        memcpy(t[i].acc, acc + ht[i].meta_off, (size_t)t[i].len * sizeof(float));
        memcpy(t[i].acc2, acc2 + ht[i].meta_off, (size_t)t[i].len * sizeof(float));
    }
}

#endif
