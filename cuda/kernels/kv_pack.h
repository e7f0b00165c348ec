/* Host side of one attention step of a device backend: the engine's tasks (host block tables,
 * and, for a pool without per-slot device metadata, positions and statistics,
 * include/kvplan/backend.h) packed into one contiguous buffer that is mirrored to the device
 * with a single copy. The CUDA backend's pools keep positions and statistics by slot on the
 * device (slot_meta): its buffer is the tasks and the table patches only. Used by the CUDA
 * backend (cuda/backend_cuda.cu), which the tests run on the fake CUDA runtime
 * (tests/cuda_fake/), so the packing the GPU relies on runs there too.
 * C and C++; no CUDA needed.
 *
 * Buffer layout, each section 16-byte aligned:
 *   kv_k_attn_task [n] | block tables (ceil(len / b_s) ints per task) | pos (len ints per
 *   tracked task) | acc (len floats per tracked task) | acc2 (same)
 * Only tasks whose head tracks statistics (acc != NULL) have entries in the pos / acc / acc2
 * sections (at their meta_off): a step of untracked heads stages no per-entry metadata.
 *
 * Resident block tables (kv_k_meta_plan_resident / kv_k_meta_pack_resident): the device keeps
 * each task's table at tables[i * stride] of its layer's array between steps, and the buffer's
 * table section holds only the entries the engine marked dirty since that copy was made (the
 * head's kv_table_mirror), as (index, block id) pairs, which kv_k_table_patch scatters there.
 * A decode step that fills no new block uploads no table entry, and finding the entries costs
 * O(tasks), not O(entries): neither grows with the context.
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
    int slot_meta; /* 1: the pool keeps pos / acc / acc2 by slot (device_meta): no entry is staged,
                    * every task's meta_off is -1 (kv_k_meta_at reads them at the entry's slot) */
} kv_k_meta_layout;

static inline size_t kv_k_align16(size_t b) {
    return (b + 15) / 16 * 16;
}

/* Sizes and offsets for n tasks at block size bs, with `table_ints` ints in the table section
 * (-1: every task's whole table). The pos / acc / acc2 sections hold the tracked tasks'
 * entries only: the kernels read no other task's (RoPE's positions are the step's rows); with
 * slot_meta (a pool with device_meta) they are empty. */
static inline void kv_k_meta_plan_ints(const kv_attn_task *t, int n, int bs, long table_ints,
                                       int slot_meta, kv_k_meta_layout *L) {
    size_t n_table = 0, n_meta = 0;
    L->longest = 0;
    L->tracked = 0;
    L->slot_meta = slot_meta;
    for (int i = 0; i < n; i++) {
        if (table_ints < 0) n_table += (size_t)kv_blocks_for(t[i].len, bs);
        if (t[i].acc && !slot_meta) n_meta += (size_t)t[i].len;
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
static inline void kv_k_meta_plan(const kv_attn_task *t, int n, int bs, int slot_meta,
                                  kv_k_meta_layout *L) {
    kv_k_meta_plan_ints(t, n, bs, -1, slot_meta, L);
}

/* The first table entry of task i that the device copy at task index i may lack: the head's
 * dirty mark when that copy is the head's (owner[i] is its mirror and the mirror names index
 * i), else 0 (the whole table). */
static inline int kv_k_table_from(const kv_attn_task *t, int i, int nb,
                                  kv_table_mirror *const *owner) {
    const kv_table_mirror *m = t[i].mirror;
    if (!m || owner[i] != m || m->slot != i + 1) return 0;
    return m->dirty < nb ? m->dirty : nb;
}

/* Resident tables: how many table entries of the n tasks the device copies (task i at
 * i * stride of the layer's array, owner[i] the mirror it was last uploaded for) may lack, from
 * the heads' dirty marks: O(tasks), no entry is compared. -1 when a task's table is longer
 * than stride (the caller then uploads whole tables). */
static inline long kv_k_table_dirty(const kv_attn_task *t, int n, int bs, int stride,
                                    kv_table_mirror *const *owner) {
    long dirty = 0;
    for (int i = 0; i < n; i++) {
        int nb = kv_blocks_for(t[i].len, bs);
        if (nb > stride) return -1;
        dirty += nb - kv_k_table_from(t, i, nb, owner);
    }
    return dirty;
}

/* Sizes and offsets with `dirty` (kv_k_table_dirty) patches of 2 ints. */
static inline void kv_k_meta_plan_resident(const kv_attn_task *t, int n, int bs, long dirty,
                                           int slot_meta, kv_k_meta_layout *L) {
    kv_k_meta_plan_ints(t, n, bs, 2 * dirty, slot_meta, L);
}

/* The tracked tasks' positions and statistics into their sections, meta_off set in ht (-1
 * for every task with slot_meta: nothing is copied). */
static inline void kv_k_meta_pack_stats(const kv_attn_task *t, int n, const kv_k_meta_layout *L,
                                        char *h, kv_k_attn_task *ht) {
    int *pos = (int *)(h + L->o_pos);
    float *acc = (float *)(h + L->o_acc), *acc2 = (float *)(h + L->o_acc2);
    int mi = 0;
    if (L->slot_meta) {
        for (int i = 0; i < n; i++) ht[i].meta_off = -1;
        return;
    }
    for (int i = 0; i < n; i++) {
        ht[i].meta_off = mi;
        if (!t[i].acc) continue;
        memcpy(pos + mi, t[i].pos, (size_t)t[i].len * sizeof(int));
        memcpy(acc + mi, t[i].acc, (size_t)t[i].len * sizeof(float));
        memcpy(acc2 + mi, t[i].acc2, (size_t)t[i].len * sizeof(float));
        mi += t[i].len;
    }
}

/* Fill buf (L->total bytes): the tasks with table_off = i * stride, the entries the device
 * copies may lack (kv_k_table_from) as (index into the layer's device array, block id) pairs,
 * then the tracked tasks' positions and statistics. Marks each copy as the task's head's:
 * owner[i] = its mirror, mirror->slot = i + 1, mirror->dirty = its block count. Returns the
 * number of pairs. */
static inline long kv_k_meta_pack_resident(const kv_attn_task *t, int n, int bs, int stride,
                                           kv_table_mirror **owner, const kv_k_meta_layout *L,
                                           void *buf) {
    char *h = (char *)buf;
    kv_k_attn_task *ht = (kv_k_attn_task *)h;
    int *patch = (int *)(h + L->o_tab);
    long np = 0;
    for (int i = 0; i < n; i++) {
        int nb = kv_blocks_for(t[i].len, bs), to = i * stride;
        kv_k_attn_task d = {t[i].row0, t[i].n, t[i].kv_head, t[i].len, to, 0, t[i].acc != NULL};
        ht[i] = d;
        for (int b = kv_k_table_from(t, i, nb, owner); b < nb; b++) {
            patch[2 * np] = to + b;
            patch[2 * np + 1] = t[i].table[b];
            np++;
        }
        owner[i] = t[i].mirror;
        if (t[i].mirror) {
            t[i].mirror->slot = i + 1;
            t[i].mirror->dirty = nb;
        }
    }
    kv_k_meta_pack_stats(t, n, L, h, ht);
    return np;
}

/* Fill buf (L->total bytes) from the tasks (whole tables). */
static inline void kv_k_meta_pack(const kv_attn_task *t, int n, int bs, const kv_k_meta_layout *L,
                                  void *buf) {
    char *h = (char *)buf;
    kv_k_attn_task *ht = (kv_k_attn_task *)h;
    int *tab = (int *)(h + L->o_tab);
    int ti = 0;
    for (int i = 0; i < n; i++) {
        int nb = kv_blocks_for(t[i].len, bs);
        kv_k_attn_task d = {t[i].row0, t[i].n, t[i].kv_head, t[i].len, ti, 0, t[i].acc != NULL};
        ht[i] = d;
        memcpy(tab + ti, t[i].table, (size_t)nb * sizeof(int));
        ti += nb;
    }
    kv_k_meta_pack_stats(t, n, L, h, ht);
}

#endif
