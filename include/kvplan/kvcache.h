/* kvplan paged KV cache: one block pool, a block table per (layer, KV head) per sequence,
 * per-head token budgets, eviction with compaction. (KV-Compress §3: per-head block tables
 * and MoveCache; Batch-Max §3.1: eviction during prefill and decode.)
 *
 * A block holds K and V of one (layer, KV head) for `block_size` tokens, in that head's KV
 * storage type (kv_cache_type: f32, f16, q8, q4; docs/formats.md "KV storage types"):
 *   block = [K row 0 .. K row b_s-1][V row 0 .. V row b_s-1], each row kv_type_row_bytes(T, d_h)
 * bytes (scales included). The pool keeps one block range per type, so a block's type follows
 * from its id and every byte count is the stored bytes.
 * A head owns ceil(len / block_size) blocks; eviction keeps the survivors in their original
 * order, moves them to the front (MoveCache) and returns the trailing whole blocks to the
 * pool, so bytes in use follow the retained entries, not the evicted ones.
 *
 * Window ring (pools with window_ring set: the CPU backend's): a sink-policy head that evicts
 * keeps its recent window as a ring inside the blocks it holds instead of moving it. Its first
 * `wbase` entries (the sinks) stay in place; dropping the k oldest window entries advances the
 * ring's start `wrot` by k and moves no row; a new entry goes to the slot after the newest.
 * Entry e is then stored at kv_head_slot's slot, and readers visit the entries in logical
 * order (entry 0, 1, ..., len - 1), so every sum over a head's entries has the order (and the
 * bits) of the compacted layout. The head holds exactly the blocks the compacted layout would
 * (ceil(len / block_size) at the end of every step): the ring is only used when the step's
 * appends need no new block, otherwise the head is first put back in order.
 */
#ifndef KVPLAN_KVCACHE_H
#define KVPLAN_KVCACHE_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Eviction policies (docs/design.md Runtime). */
typedef enum {
    KV_POLICY_SINK = 0,    /* StreamingLLM: first KV_SINK_TOKENS positions + most recent */
    KV_POLICY_H2O = 1,     /* H2O: recent half of the budget + largest accumulated attention */
    KV_POLICY_AVGATTN = 2, /* Batch-Max §3.2: lowest sum_weights / (curr_id + 1 - kv_id) */
    KV_POLICY_L2ATTN = 3,  /* KV-Compress: lowest accumulated squared attention */
} kv_policy;

#define KV_SINK_TOKENS 4
/* KV-Compress KVC-full: queries younger than this many positions do not add to a key's
 * squared-attention metric (and such keys are protected from l2attn eviction), v = 10. */
#define KV_L2_EXCLUDED_WINDOW 10
#define KV_DEFAULT_BLOCK_SIZE 16
#define KV_DEFAULT_EVICT_BLOCK 16
#define KV_BUDGET_UNBOUNDED 0x3fffffff

/* KV storage types of one (layer, KV head) (docs/formats.md "KV storage types").
 * A stored row is one token's K (or V) of one head: d_h values. The group of a scale is the
 * whole row, which exists for every d_h (8 for stories260K, 16 for TinyStories-656K):
 *   f32: d_h float32                                      4 d_h bytes
 *   f16: d_h IEEE binary16 (round to nearest even; beyond +-65504 saturates)   2 d_h bytes
 *   q8:  binary16 scale s, then d_h int8 q: x = s q, s = max|x| / 127 rounded up  d_h + 2
 *   q4:  binary16 scale s and minimum m, then ceil(d_h / 2) bytes of 4-bit q (element 2i in
 *        the low nibble of byte i): x = m + s q, q in [0, 15], m = min x rounded down,
 *        s = (max x - m) / 15 rounded up (KIVI-style asymmetric; Liu et al. 2024)
 *                                                         ceil(d_h / 2) + 4 bytes
 * Codes (plan.h5 /budget/kv_type) are the enum values. */
typedef enum {
    KV_TYPE_F32 = 0,
    KV_TYPE_F16 = 1,
    KV_TYPE_Q8 = 2,
    KV_TYPE_Q4 = 3,
} kv_cache_type;
#define KV_CACHE_TYPES 4
/* The runtime's default KV type (as llama.cpp and vLLM): F16. */
#define KV_TYPE_DEFAULT KV_TYPE_F16

/* "f32", "f16", "q8", "q4" ("?" for anything else). */
const char *kv_type_name(kv_cache_type t);
/* Parse a type name; KV_EINPUT names the bad value and the choices. */
int kv_type_parse(const char *s, kv_cache_type *out, kv_error *err);
/* 1 for a known type code. */
int kv_type_valid(int code);
/* Bytes of one stored row of d_h values (table above); 0 for an unknown type. */
size_t kv_type_row_bytes(kv_cache_type t, int head_dim);
/* Bytes one token takes in one head: K and V rows, 2 * kv_type_row_bytes. */
size_t kv_type_token_bytes(kv_cache_type t, int head_dim);
/* Encode one row x [d_h] fp32 into dst [kv_type_row_bytes] (caller's memory). */
void kv_type_encode_row(kv_cache_type t, int head_dim, const float *x, unsigned char *dst);
/* Decode one stored row src into x [d_h] fp32 (exactly the values attention uses). */
void kv_type_decode_row(kv_cache_type t, int head_dim, const unsigned char *src, float *x);

const char *kv_policy_name(kv_policy p);
/* Parse "sink", "h2o", "avgattn", "l2attn"; KV_EINPUT names the bad value. */
int kv_policy_parse(const char *s, kv_policy *out, kv_error *err);
/* Entries a policy always keeps (sink: 4 sinks; others 0). A budget must be at least this
 * plus the eviction block p (Batch-Max Alg. 1). */
int kv_policy_fixed_tokens(kv_policy p);
/* Whether the policy needs attention statistics accumulated by the attention step. */
int kv_policy_needs_stats(kv_policy p);

/* ---- block pool ----
 * The pool is the block metadata (free lists, peak); the block *storage* belongs to a backend
 * (kvplan/backend.h): host memory for the CPU backend (`data`), device memory for CUDA. Slot
 * s = block * block_size + offset names one token's K and V inside the storage.
 * Blocks of type t are the ids [type_first[t], type_first[t + 1]) and start at byte
 * type_offset[t] of the storage; type ranges follow each other in type order (f32 first, so
 * an all-f32 pool has the layout [n_blocks][2][block_size][head_dim] floats). */
typedef struct kv_pool {
    int block_size; /* b_s tokens */
    int head_dim;   /* d_h */
    int n_blocks;
    float *data;     /* host storage, kv_pool_storage_bytes bytes (kv_pool_init), owned; NULL
                      * when a backend keeps the storage elsewhere (`storage`). Typed blocks are
                      * bytes: use kv_pool_block_ptr. */
    void *storage;   /* backend-owned storage handle (device pointer), or NULL */
    int *free_stack; /* [n_blocks] ids of free blocks, owned; type t's free ids are at
                      * [type_first[t], type_first[t] + n_free_type[t]) */
    int n_free;
    long peak_in_use; /* most blocks in use at once since init or kv_pool_reset_peak */
    int type_first[KV_CACHE_TYPES + 1];
    size_t type_offset[KV_CACHE_TYPES + 1]; /* [KV_CACHE_TYPES] = total storage bytes */
    int n_free_type[KV_CACHE_TYPES];
    size_t bytes_in_use, peak_bytes; /* stored bytes of the blocks in use (scales included) */
    int window_ring; /* 1: sink-policy heads of this pool's caches keep their window as a ring
                      * (see the top of this file; host storage only, set by the CPU backend's
                      * storage); 0: every eviction compacts (device backends, kv_pool_init) */
    int device_meta; /* 1: the storage keeps each slot's position and statistics beside its K/V
                      * (pos, acc, acc2 by slot, set by the cache write, moved by the gather;
                      * set by the CUDA backend's storage): kv_head_schedule_room records the
                      * evictions of selecting policies (not sink) for the backend's evict op
                      * instead of choosing on the host (kv_evict) */
} kv_pool;

/* One allocation of n_blocks f32 blocks of host storage. KV_EINTERNAL when memory runs out. */
int kv_pool_init(kv_pool *p, int n_blocks, int block_size, int head_dim, kv_error *err);
/* Host storage with counts[t] blocks of each type t (KV_CACHE_TYPES counts, >= 0, sum > 0). */
int kv_pool_init_typed(kv_pool *p, const int *counts, int block_size, int head_dim, kv_error *err);
/* The metadata only (no storage): a backend attaches its own (kv_backend_pool_init). */
int kv_pool_init_meta(kv_pool *p, int n_blocks, int block_size, int head_dim, kv_error *err);
int kv_pool_init_meta_typed(kv_pool *p, const int *counts, int block_size, int head_dim,
                            kv_error *err);
void kv_pool_destroy(kv_pool *p);
/* Bytes of one f32 block: 2 * block_size * head_dim * sizeof(float). */
size_t kv_pool_block_bytes(const kv_pool *p);
/* Bytes of one block of type t: 2 * block_size * kv_type_row_bytes(t, head_dim). */
size_t kv_pool_type_block_bytes(const kv_pool *p, kv_cache_type t);
/* Bytes of the whole storage (every block of every type). */
size_t kv_pool_storage_bytes(const kv_pool *p);
/* Type of block `block` (its range). */
kv_cache_type kv_pool_block_type(const kv_pool *p, int block);
/* 1 when the pool has blocks of type t. */
int kv_pool_has_type(const kv_pool *p, kv_cache_type t);
/* Host address of block `block` (host storage only). */
unsigned char *kv_pool_block_ptr(const kv_pool *p, int block);
long kv_pool_blocks_in_use(const kv_pool *p);
/* Stored bytes of the blocks in use now / at most since init or kv_pool_reset_peak. */
size_t kv_pool_bytes_in_use(const kv_pool *p);
size_t kv_pool_peak_bytes(const kv_pool *p);
void kv_pool_reset_peak(kv_pool *p);

/* ---- one (layer, KV head) of one sequence ---- */
/* What a device backend's copy of a head's block table is known to hold: the copy at task index
 * slot - 1 of the head's layer (slot 0: none) equals `table` except, at most, at entries
 * [dirty, n_blocks), which kv_head_append_slot marks as it takes blocks (no other operation
 * rewrites an entry below n_blocks). A backend that uploads the head's table sets slot and
 * dirty = n_blocks; zero-initialised: no copy, every entry dirty. */
typedef struct kv_table_mirror {
    int slot, dirty;
} kv_table_mirror;

typedef struct kv_head {
    int *table; /* block ids, [cap_blocks] */
    int n_blocks, cap_blocks;
    int last_block;   /* table[n_blocks - 1] while n_blocks > 0 (the block appends write into, read
                       * without the table's line); set where blocks are taken or released
                       * (kv_head_append_slot, eviction, kv_cache_clear): code that changes table or
                       * n_blocks by other means must set it too */
    int len;          /* retained entries */
    int budget;       /* max retained entries after a step (tokens) */
    kv_policy policy; /* how this head evicts (a plan may give each head its own) */
    kv_cache_type type;     /* storage type of its K/V rows (its blocks come from that range) */
    int track_stats;        /* accumulate acc/acc2 in attention (the policy needs them and the head
                             * can be over budget) */
    int cap;                /* capacity of the per-entry arrays */
    int *pos;               /* [cap] position id each entry came from */
    float *acc;             /* [cap] sum of attention weights (summed over the GQA group); kept
                             * only while track_stats (an untracked head's read as zeros) */
    float *acc2;            /* [cap] sum of squared attention weights (the same)
                             * On a pool with device_meta, pos, acc and acc2 of a head whose
                             * policy is not sink are NOT maintained on the host: the device
                             * holds them by slot, accumulates and compacts them (only the
                             * appended entries' pos are written here, which kv_head_drop_from
                             * reads); kv_backend_read_head_meta copies them into these arrays
                             * (one wait) for whoever needs them on the host. */
    kv_table_mirror mirror; /* a device backend's copy of `table` (its dirty entries) */
    int wbase;              /* window ring: entries [0, wbase) (the sinks) stay in place */
    int wrot;               /* window ring: window entry k at wbase + (wrot + k) mod (n_blocks *
                             * block_size - wbase); 0: plain layout, entry e at e */
} kv_head;

/* ---- one sequence's cache ---- */
struct kv_arena; /* runtime/cache/kvarena.h: where the heads' table, pos, acc, acc2 live */
typedef struct kv_cache {
    kv_pool *pool; /* shared, not owned */
    int n_layers, n_kv_heads;
    kv_head *heads;         /* [n_layers * n_kv_heads], owned */
    struct kv_arena *arena; /* owned: the heads' arrays (huge-page regions; see kvarena.h) */
    int n_past;             /* tokens processed so far (next position id) */
    int failed;             /* a step failed after changing what it cannot restore (an eviction,
                             * accumulated statistics): kv_forward refuses the sequence until
                             * kv_cache_clear */
    int step_lossy;         /* during a kv_forward step: it has evicted or accumulated statistics */
} kv_cache;

/* Initialise a sequence cache on `pool` with budgets [L * H_kv] tokens (NULL: unbounded, the
 * full cache) and one policy for every head. The budgets are copied. KV_EINPUT when a budget is
 * below 1. */
int kv_cache_init(kv_cache *c, kv_pool *pool, int n_layers, int n_kv_heads, const int *budget,
                  kv_policy policy, kv_error *err);
/* Set every head's budget [L * H_kv] (NULL: unbounded) and policy [L * H_kv] (NULL: keep) on an
 * empty or live cache; statistics are tracked for heads whose policy needs them and whose
 * budget is below `context` (a head that never evicts needs none). KV_EINPUT for a budget < 1. */
int kv_cache_set_budgets(kv_cache *c, const int *budget, const kv_policy *policy, int context,
                         kv_error *err);
/* Set every head's storage type [L * H_kv] (NULL: the pool's first type). Only on an empty
 * cache; KV_EINPUT for an unknown type, one the pool has no blocks of, or a live cache. */
int kv_cache_set_types(kv_cache *c, const kv_cache_type *types, kv_error *err);
/* Return every block to the pool and free the tables. */
void kv_cache_destroy(kv_cache *c);
/* Drop all entries (blocks back to the pool), n_past = 0, failed = 0; budgets and policy stay. */
void kv_cache_clear(kv_cache *c);

static inline kv_head *kv_cache_head(kv_cache *c, int layer, int kv_head_idx) {
    return &c->heads[(size_t)layer * (size_t)c->n_kv_heads + (size_t)kv_head_idx];
}
/* Slot of entry `i` of head `h`: table[e / b_s] * b_s + e % b_s for its stored entry e = i, or,
 * while the head's window is a ring (wrot > 0), e = wbase + (wrot + i - wbase) mod
 * (n_blocks * b_s - wbase) for i >= wbase. */
static inline int kv_head_slot(const kv_pool *p, const kv_head *h, int i) {
    int bs = p->block_size;
    if (h->wrot > 0 && i >= h->wbase) {
        int cap = h->n_blocks * bs - h->wbase, k = i - h->wbase + h->wrot;
        i = h->wbase + (k >= cap ? k - cap : k);
    }
    return h->table[i / bs] * bs + i % bs;
}
/* Host pointers to K and V of entry `i` of an f32 head `h` (host storage only; valid until the
 * next append or eviction). Any type: kv_head_read. */
float *kv_head_k(const kv_pool *p, const kv_head *h, int i);
float *kv_head_v(const kv_pool *p, const kv_head *h, int i);
/* K and V [d_h] of entry `i` of head `h` decoded to fp32 (host storage; any type; k or v may be
 * NULL). */
void kv_head_read(const kv_pool *p, const kv_head *h, int i, float *k, float *v);
/* Host address of K (which 0) or V (which 1) of slot `slot`, kv_type_row_bytes bytes. */
unsigned char *kv_pool_slot_row(const kv_pool *p, int slot, int which);

/* One K/V copy inside a pool's storage (KV-Compress MoveCache): slot src -> slot dst. A move
 * list is applied in order (a later move may overwrite an earlier move's source). */
typedef struct kv_move {
    int src, dst;
} kv_move;

/* One eviction left to a device backend (pools with device_meta): the head's `len` entries,
 * stored at its block table as it was (tab[tab_off .. tab_off + ceil(len / b_s)) of the
 * kv_moves' table list), keep the n_keep that kv_policy_select(policy, ..., curr_pos) chooses
 * from the head's device pos / acc / acc2, compacted to the front in order (K/V rows and the
 * per-slot metadata). The head's host len and blocks already say n_keep. */
typedef struct kv_evict {
    int tab_off, len, n_keep, policy, curr_pos;
} kv_evict;

/* A growing move list (owned arrays; kv_moves_free), with the evictions a device backend runs
 * before the moves (ev [n_ev], their block tables in tab [n_tab]). */
typedef struct kv_moves {
    kv_move *v;
    int n, cap;
    kv_evict *ev;
    int n_ev, cap_ev;
    int *tab;
    int n_tab, cap_tab;
} kv_moves;
void kv_moves_free(kv_moves *m);

/* Batch-Max Alg. 1 eviction schedule for head `h` before `n_new` tokens arrive at position
 * `curr_pos` (the last new token's id): when len + n_new > budget, the head's policy chooses the
 * survivors, the metadata (pos, acc, acc2) is compacted to the front, the emptied trailing
 * blocks go back to the pool, and the K/V copies the storage still owes are appended to `moves`
 * (the backend applies them with one gather). On a pool with device_meta a head whose policy
 * is not sink is not chosen for here: a kv_evict (its table as it is) is appended to `moves`
 * for the backend's evict op, len = n_keep and the same trailing blocks are released, so the
 * pool's accounting is the host path's. KV_EINPUT when budget < fixed part + n_new;
 * KV_EINTERNAL out of memory. */
int kv_head_schedule_room(kv_cache *c, kv_head *h, int n_new, int curr_pos, kv_moves *moves,
                          kv_error *err);
/* Append one entry's metadata at position `pos` and return its slot in *slot (the caller's
 * backend writes K and V there); takes a new block when the last one is full. KV_EINTERNAL
 * when the pool is exhausted. */
int kv_head_append_slot(kv_cache *c, kv_head *h, int pos, int *slot, kv_error *err);
/* Undo appends: drop the trailing entries of `h` at positions >= first_pos (the entries a failed
 * step appended; positions are ascending within a head) and return the blocks they emptied to
 * the pool. Called for the heads of a step in the reverse order of their appends, the pool's
 * free list is restored exactly (its peak counters stay). */
void kv_head_drop_from(kv_cache *c, kv_head *h, int first_pos);
/* Host storage convenience: append with K, V [d_h] encoded in the head's type. */
int kv_head_append(kv_cache *c, kv_head *h, const float *k, const float *v, int pos, kv_error *err);
/* Host storage convenience: schedule + apply the moves (make room for n_new tokens). */
int kv_head_make_room(kv_cache *c, kv_head *h, int n_new, int curr_pos, kv_error *err);
/* Return one block to the pool (for executors that empty a head by hand). */
void kv_pool_release_block(kv_pool *p, int block);
/* Apply a move list to host storage, in order. */
void kv_pool_apply_moves_host(kv_pool *p, const kv_move *moves, int n);

/* Policy selection (pure, on a head's metadata): choose `n_keep` of the head's `len` entries
 * to keep at current position `curr_pos`, written ascending into keep[]. (KV_SINK: StreamingLLM;
 * H2O: Zhang et al. 2023; AVGATTN: Batch-Max Eq. in §3.2; L2ATTN: KV-Compress §3.3.) */
void kv_policy_select(kv_policy p, const int *pos, const float *acc, const float *acc2, int len,
                      int n_keep, int curr_pos, int *keep);

/* Blocks a sequence needs at most with these budgets: per head ceil(min(budget + p, ctx) / b_s)
 * (the budget plus one eviction block p as it arrives), summed over heads. */
long kv_cache_blocks_needed(int n_layers, int n_kv_heads, const int *budget, int context,
                            int evict_block, int block_size);
/* The same per type: counts[t] (KV_CACHE_TYPES longs, overwritten) sums the heads whose type
 * [L * H_kv] is t (types NULL: all KV_TYPE_DEFAULT). */
void kv_cache_blocks_needed_typed(int n_layers, int n_kv_heads, const int *budget,
                                  const kv_cache_type *types, int context, int evict_block,
                                  int block_size, long *counts);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
