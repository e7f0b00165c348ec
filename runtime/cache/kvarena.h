/* kvplan per-cache arena for the heads' per-entry arrays (internal to runtime/cache).
 *
 * A decode step appends one entry to every (layer, sequence, KV head): at Llama-2-7B batch 32
 * that is 32 768 heads, each writing pos[len] and reading table[len / b_s]. With one malloc'd
 * array per head these lie in ~65 000 different 4 KiB pages, more than the TLB holds, and the
 * page walks were most of the step's host time (docs/cuda-kernels.md, "Host time of the
 * untracked step"). The arena hands out the arrays of one sequence's cache from a few large
 * regions instead, mapped with mmap and advised with madvise(MADV_HUGEPAGE) (2 MiB aligned)
 * once they are 2 MiB or larger, so a layer's heads share a few huge pages.
 *
 * Blocks are powers of two of at least 64 bytes (64-byte aligned). A block given back goes to
 * its size's free list and is handed out again before new space is cut; the arena never
 * writes into a block (a given-back block keeps its bytes, a new one from mmap is zero), so the
 * pages of an array nobody writes stay unbacked. Spaces: the arrays the append loop touches
 * every step (block tables, positions) are cut from KV_ARENA_HOT, the attention sums (written
 * only for heads that track statistics) from KV_ARENA_STATS, so the hot arrays stay dense.
 * Regions grow geometrically: each new one is as large as all before it (64 KiB to 64 MiB), so
 * the space reserved is at most about twice the blocks in use; every region is unmapped by
 * kv_arena_free.
 *
 * Fallbacks: where mmap or MADV_HUGEPAGE does not exist, regions come from aligned_alloc (4 KiB
 * pages, the same layout); where the mmap of a region fails, that region is malloc'd; where
 * madvise fails, the region stays mapped with small pages. Under AddressSanitizer
 * (__SANITIZE_ADDRESS__ or __has_feature(address_sanitizer)) every block is its own malloc
 * and a given-back block is freed: ASan then sees an overflow past any array and any use of an
 * array after its growth, which one shared region would hide.
 *
 * One arena belongs to one cache and is used by one thread at a time; no global state.
 */
#ifndef KVPLAN_KVARENA_H
#define KVPLAN_KVARENA_H

#include "kvplan/common.h"

#include <stddef.h>

enum { KV_ARENA_HOT = 0, KV_ARENA_STATS = 1, KV_ARENA_SPACES = 2 };

typedef struct kv_arena kv_arena;

/* A new empty arena in *out (owned; kv_arena_free). Maps nothing yet. KV_EINTERNAL when the
 * arena's own struct cannot be allocated. */
int kv_arena_new(kv_arena **out, kv_error *err);

/* Unmap or free every region (and, under ASan, nothing else: blocks were freed as given back).
 * Every block of the arena is invalid afterwards. NULL: no-op. */
void kv_arena_free(kv_arena *a);

/* A block of at least `bytes` (> 0) bytes from space `space` (KV_ARENA_HOT or KV_ARENA_STATS),
 * 64-byte aligned; *got receives its size, a power of two >= max(64, bytes). Contents are
 * unspecified (zero when newly mapped). NULL with KV_EINTERNAL ("out of memory: <what>") when
 * no memory is left. */
void *kv_arena_take(kv_arena *a, int space, size_t bytes, size_t *got, const char *what,
                    kv_error *err);

/* Give back a block taken from the same space; `got` is its size or the bytes asked for (the
 * same class). NULL: no-op. Its bytes are not touched. KV_EINTERNAL only when the free list cannot
 * grow (the block is then lost until kv_arena_free, never unsafe). */
int kv_arena_give(kv_arena *a, int space, void *p, size_t got, kv_error *err);

/* Bytes of regions the arena holds now (0 under ASan), for tests and reports. */
size_t kv_arena_reserved(const kv_arena *a);

/* 1 when blocks come from shared regions, 0 when each is its own malloc (ASan builds). */
int kv_arena_pooled(void);

#endif
