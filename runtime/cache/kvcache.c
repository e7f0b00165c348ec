/* kvplan paged KV cache and eviction policies: see include/kvplan/kvcache.h.
 * Sources: KV-Compress (paged blocks per (layer, KV head), MoveCache compaction, squared
 * attention metric with an excluded query window), Batch-Max (Alg. 1 eviction before each
 * block of p tokens; average-attention rule §3.2), H2O (heavy hitters + recent window),
 * StreamingLLM (attention sinks + recent window). */
#include "kvplan/kvcache.h"

#include "cache/kvarena.h"
#include "cache/kvtype.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *kv_policy_name(kv_policy p) {
    switch (p) {
    case KV_POLICY_SINK:
        return "sink";
    case KV_POLICY_H2O:
        return "h2o";
    case KV_POLICY_AVGATTN:
        return "avgattn";
    case KV_POLICY_L2ATTN:
        return "l2attn";
    }
    return "?";
}

int kv_policy_parse(const char *s, kv_policy *out, kv_error *err) {
    static const kv_policy all[] = {KV_POLICY_SINK, KV_POLICY_H2O, KV_POLICY_AVGATTN,
                                    KV_POLICY_L2ATTN};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (s && !strcmp(s, kv_policy_name(all[i]))) {
            *out = all[i];
            return KV_OK;
        }
    return kv_fail(err, KV_EINPUT, "unknown policy '%s' (choose sink, h2o, avgattn or l2attn)",
                   s ? s : "");
}

int kv_policy_fixed_tokens(kv_policy p) {
    return p == KV_POLICY_SINK ? KV_SINK_TOKENS : 0;
}

int kv_policy_needs_stats(kv_policy p) {
    return p != KV_POLICY_SINK;
}

/* ---- KV storage types ---- */
const char *kv_type_name(kv_cache_type t) {
    switch (t) {
    case KV_TYPE_F32:
        return "f32";
    case KV_TYPE_F16:
        return "f16";
    case KV_TYPE_Q8:
        return "q8";
    case KV_TYPE_Q4:
        return "q4";
    }
    return "?";
}

int kv_type_valid(int code) {
    return code >= 0 && code < KV_CACHE_TYPES;
}

int kv_type_parse(const char *s, kv_cache_type *out, kv_error *err) {
    for (int t = 0; t < KV_CACHE_TYPES; t++)
        if (s && !strcmp(s, kv_type_name((kv_cache_type)t))) {
            *out = (kv_cache_type)t;
            return KV_OK;
        }
    return kv_fail(err, KV_EINPUT, "unknown KV type '%s' (choose f32, f16, q8 or q4)", s ? s : "");
}

size_t kv_type_row_bytes(kv_cache_type t, int head_dim) {
    return kvt_row_bytes(t, head_dim);
}
size_t kv_type_token_bytes(kv_cache_type t, int head_dim) {
    return 2u * kvt_row_bytes(t, head_dim);
}
void kv_type_encode_row(kv_cache_type t, int head_dim, const float *x, unsigned char *dst) {
    kvt_encode(t, head_dim, x, dst);
}
void kv_type_decode_row(kv_cache_type t, int head_dim, const unsigned char *src, float *x) {
    kvt_decode(t, head_dim, src, x);
}

/* ---- pool ---- */
int kv_pool_init_meta_typed(kv_pool *p, const int *counts, int block_size, int head_dim,
                            kv_error *err) {
    memset(p, 0, sizeof *p);
    long n_blocks = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++) {
        if (counts[t] < 0)
            return kv_fail(err, KV_EINPUT, "KV pool: %d blocks of type %s", counts[t],
                           kv_type_name((kv_cache_type)t));
        n_blocks += counts[t];
    }
    if (n_blocks <= 0 || n_blocks > 0x7fffffffL || block_size <= 0 || head_dim <= 0)
        return kv_fail(err, KV_EINPUT, "KV pool: %ld blocks of %d tokens x %d dims is empty",
                       n_blocks, block_size, head_dim);
    /* slot ids (block * block_size + offset) are ints on both devices: they must fit */
    if ((long long)n_blocks * block_size > 0x7fffffffLL)
        return kv_fail(err, KV_EINPUT,
                       "KV pool: %ld blocks of %d tokens make %lld slots, beyond the 2^31 - 1 "
                       "slot ids a pool can address; use fewer blocks (a smaller batch, budget "
                       "or context) or split the work",
                       n_blocks, block_size, (long long)n_blocks * block_size);
    p->free_stack = kv_malloc((size_t)n_blocks * sizeof(int), "KV block pool free list", err);
    if (!p->free_stack) return KV_EINTERNAL;
    p->n_blocks = (int)n_blocks;
    p->block_size = block_size;
    p->head_dim = head_dim;
    int first = 0;
    size_t off = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++) {
        p->type_first[t] = first;
        p->type_offset[t] = off;
        /* pop order inside a range: its lowest block first */
        for (int i = 0; i < counts[t]; i++) p->free_stack[first + i] = first + counts[t] - 1 - i;
        p->n_free_type[t] = counts[t];
        first += counts[t];
        off += (size_t)counts[t] * kv_pool_type_block_bytes(p, (kv_cache_type)t);
    }
    p->type_first[KV_CACHE_TYPES] = first;
    p->type_offset[KV_CACHE_TYPES] = off;
    p->n_free = p->n_blocks;
    return KV_OK;
}

int kv_pool_init_meta(kv_pool *p, int n_blocks, int block_size, int head_dim, kv_error *err) {
    int counts[KV_CACHE_TYPES] = {n_blocks, 0, 0, 0};
    return kv_pool_init_meta_typed(p, counts, block_size, head_dim, err);
}

int kv_pool_init_typed(kv_pool *p, const int *counts, int block_size, int head_dim, kv_error *err) {
    int rc = kv_pool_init_meta_typed(p, counts, block_size, head_dim, err);
    if (rc) return rc;
    p->data = kv_malloc(kv_pool_storage_bytes(p), "KV block pool", err);
    if (!p->data) {
        kv_pool_destroy(p);
        return KV_EINTERNAL;
    }
    return KV_OK;
}

int kv_pool_init(kv_pool *p, int n_blocks, int block_size, int head_dim, kv_error *err) {
    int counts[KV_CACHE_TYPES] = {n_blocks, 0, 0, 0};
    return kv_pool_init_typed(p, counts, block_size, head_dim, err);
}

void kv_pool_destroy(kv_pool *p) {
    free(p->data);
    free(p->free_stack);
    memset(p, 0, sizeof *p);
}

size_t kv_pool_block_bytes(const kv_pool *p) {
    return 2 * (size_t)p->block_size * (size_t)p->head_dim * sizeof(float);
}
size_t kv_pool_type_block_bytes(const kv_pool *p, kv_cache_type t) {
    return 2 * (size_t)p->block_size * kvt_row_bytes(t, p->head_dim);
}
size_t kv_pool_storage_bytes(const kv_pool *p) {
    return p->type_offset[KV_CACHE_TYPES];
}
kv_cache_type kv_pool_block_type(const kv_pool *p, int block) {
    int t = 0;
    while (t + 1 < KV_CACHE_TYPES && block >= p->type_first[t + 1]) t++;
    return (kv_cache_type)t;
}
int kv_pool_has_type(const kv_pool *p, kv_cache_type t) {
    return kv_type_valid((int)t) && p->type_first[t + 1] > p->type_first[t];
}
unsigned char *kv_pool_block_ptr(const kv_pool *p, int block) {
    kv_cache_type t = kv_pool_block_type(p, block);
    return (unsigned char *)p->data + p->type_offset[t] +
           (size_t)(block - p->type_first[t]) * kv_pool_type_block_bytes(p, t);
}
unsigned char *kv_pool_slot_row(const kv_pool *p, int slot, int which) {
    int b = slot / p->block_size, o = slot % p->block_size;
    size_t row = kvt_row_bytes(kv_pool_block_type(p, b), p->head_dim);
    return kv_pool_block_ptr(p, b) + ((size_t)which * (size_t)p->block_size + (size_t)o) * row;
}
long kv_pool_blocks_in_use(const kv_pool *p) {
    return (long)p->n_blocks - p->n_free;
}
size_t kv_pool_bytes_in_use(const kv_pool *p) {
    return p->bytes_in_use;
}
size_t kv_pool_peak_bytes(const kv_pool *p) {
    return p->peak_bytes;
}
void kv_pool_reset_peak(kv_pool *p) {
    p->peak_in_use = kv_pool_blocks_in_use(p);
    p->peak_bytes = p->bytes_in_use;
}

static int pool_take(kv_pool *p, kv_cache_type t) {
    if (!kv_type_valid((int)t) || p->n_free_type[t] == 0) return -1;
    int id = p->free_stack[p->type_first[t] + --p->n_free_type[t]];
    p->n_free--;
    p->bytes_in_use += kv_pool_type_block_bytes(p, t);
    long used = kv_pool_blocks_in_use(p);
    if (used > p->peak_in_use) p->peak_in_use = used;
    if (p->bytes_in_use > p->peak_bytes) p->peak_bytes = p->bytes_in_use;
    return id;
}

static void pool_give(kv_pool *p, int id) {
    kv_cache_type t = kv_pool_block_type(p, id);
    p->free_stack[p->type_first[t] + p->n_free_type[t]++] = id;
    p->n_free++;
    p->bytes_in_use -= kv_pool_type_block_bytes(p, t);
}

void kv_pool_release_block(kv_pool *p, int block) {
    pool_give(p, block);
}

/* ---- cache ---- */

/* acc = acc2 = 0 over the head's entries. Appends write the sums only for tracked heads (an
 * untracked head's are never read by attention), so they are zeroed where they start to be
 * read: when tracking starts, and before an untracked head's policy selects by them. */
static void head_zero_stats(kv_head *h) {
    if (h->len <= 0) return;
    memset(h->acc, 0, (size_t)h->len * sizeof *h->acc);
    memset(h->acc2, 0, (size_t)h->len * sizeof *h->acc2);
}
int kv_cache_init(kv_cache *c, kv_pool *pool, int n_layers, int n_kv_heads, const int *budget,
                  kv_policy policy, kv_error *err) {
    memset(c, 0, sizeof *c);
    size_t nh = (size_t)n_layers * (size_t)n_kv_heads;
    if (kv_arena_new(&c->arena, err)) return KV_EINTERNAL;
    /* the heads themselves from the arena's hot space too: the append loop reads them all */
    size_t got = 0;
    c->heads =
        kv_arena_take(c->arena, KV_ARENA_HOT, nh * sizeof *c->heads, &got, "KV cache heads", err);
    if (c->heads) memset(c->heads, 0, nh * sizeof *c->heads);
    if (!c->heads) {
        kv_arena_free(c->arena);
        c->arena = NULL;
        return KV_EINTERNAL;
    }
    c->pool = pool;
    c->n_layers = n_layers;
    c->n_kv_heads = n_kv_heads;
    kv_cache_type t0 = KV_TYPE_F32;
    while (t0 + 1 < KV_CACHE_TYPES && !kv_pool_has_type(pool, t0)) t0++;
    for (size_t i = 0; i < nh; i++) {
        c->heads[i].policy = policy;
        c->heads[i].type = t0;
    }
    /* the old rule: statistics whenever there are budgets and the policy needs them */
    int rc = kv_cache_set_budgets(c, budget, NULL, budget ? KV_BUDGET_UNBOUNDED : 0, err);
    if (rc) {
        kv_arena_give(c->arena, KV_ARENA_HOT, c->heads, nh * sizeof *c->heads, NULL);
        c->heads = NULL;
        kv_arena_free(c->arena);
        c->arena = NULL;
    }
    return rc;
}

int kv_cache_set_budgets(kv_cache *c, const int *budget, const kv_policy *policy, int context,
                         kv_error *err) {
    size_t nh = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    for (size_t i = 0; i < nh; i++) {
        int b = budget ? budget[i] : KV_BUDGET_UNBOUNDED;
        if (b < 1)
            return kv_fail(err, KV_EINPUT,
                           "budget of layer %zu KV head %zu is %d tokens; it must be at least 1",
                           i / (size_t)c->n_kv_heads, i % (size_t)c->n_kv_heads, b);
    }
    for (size_t i = 0; i < nh; i++) {
        kv_head *h = &c->heads[i];
        h->budget = budget ? budget[i] : KV_BUDGET_UNBOUNDED;
        if (policy) h->policy = policy[i];
        int track = kv_policy_needs_stats(h->policy) && h->budget < context;
        if (track && !h->track_stats) head_zero_stats(h); /* untracked entries hold no sums */
        h->track_stats = track;
    }
    return KV_OK;
}

int kv_cache_set_types(kv_cache *c, const kv_cache_type *types, kv_error *err) {
    size_t nh = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    kv_cache_type t0 = KV_TYPE_F32;
    while (t0 + 1 < KV_CACHE_TYPES && !kv_pool_has_type(c->pool, t0)) t0++;
    for (size_t i = 0; i < nh; i++) {
        kv_cache_type t = types ? types[i] : t0;
        if (!kv_pool_has_type(c->pool, t))
            return kv_fail(err, KV_EINPUT,
                           "layer %zu KV head %zu has KV type %s (code %d), which the block pool "
                           "does not hold",
                           i / (size_t)c->n_kv_heads, i % (size_t)c->n_kv_heads, kv_type_name(t),
                           (int)t);
        if (c->heads[i].len > 0 && c->heads[i].type != t)
            return kv_fail(err, KV_EINPUT, "the KV type of a live head cannot change");
    }
    for (size_t i = 0; i < nh; i++) c->heads[i].type = types ? types[i] : t0;
    return KV_OK;
}

static void head_release_blocks(kv_pool *p, kv_head *h, int keep_blocks) {
    while (h->n_blocks > keep_blocks) pool_give(p, h->table[--h->n_blocks]);
    if (h->n_blocks > 0) h->last_block = h->table[h->n_blocks - 1];
}

void kv_cache_clear(kv_cache *c) {
    if (!c->heads) return;
    size_t nh = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    for (size_t i = 0; i < nh; i++) {
        head_release_blocks(c->pool, &c->heads[i], 0);
        c->heads[i].len = 0;
        c->heads[i].wbase = c->heads[i].wrot = 0;
    }
    c->n_past = 0;
    c->failed = 0;
    c->step_lossy = 0;
}

/* The head's arrays back to the cache's arena (under ASan each is freed; otherwise they join
 * the arena's free lists, which kv_arena_free drops with the regions). */
static void head_free_arrays(kv_cache *c, kv_head *h) {
    kv_arena_give(c->arena, KV_ARENA_HOT, h->table, (size_t)h->cap_blocks * sizeof *h->table, NULL);
    kv_arena_give(c->arena, KV_ARENA_HOT, h->pos, (size_t)h->cap * sizeof *h->pos, NULL);
    kv_arena_give(c->arena, KV_ARENA_STATS, h->acc, (size_t)h->cap * sizeof *h->acc, NULL);
    kv_arena_give(c->arena, KV_ARENA_STATS, h->acc2, (size_t)h->cap * sizeof *h->acc2, NULL);
    h->table = h->pos = NULL;
    h->acc = h->acc2 = NULL;
    h->cap = h->cap_blocks = 0;
}

void kv_cache_destroy(kv_cache *c) {
    if (!c->heads) return;
    kv_cache_clear(c);
    size_t nh = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    for (size_t i = 0; i < nh; i++) head_free_arrays(c, &c->heads[i]);
    kv_arena_give(c->arena, KV_ARENA_HOT, c->heads, nh * sizeof *c->heads, NULL);
    kv_arena_free(c->arena);
    memset(c, 0, sizeof *c);
}

float *kv_head_k(const kv_pool *p, const kv_head *h, int i) {
    int slot = kv_head_slot(p, h, i), b = slot / p->block_size, s = slot % p->block_size;
    return p->data + ((size_t)b * 2 * (size_t)p->block_size + (size_t)s) * (size_t)p->head_dim;
}

float *kv_head_v(const kv_pool *p, const kv_head *h, int i) {
    int slot = kv_head_slot(p, h, i), b = slot / p->block_size, s = slot % p->block_size;
    return p->data + ((size_t)b * 2 * (size_t)p->block_size + (size_t)p->block_size + (size_t)s) *
                         (size_t)p->head_dim;
}

/* Put a head whose window is a ring (wrot > 0) back in the plain layout, entry e stored at e:
 * the window's K and V rows copied out in logical order and back, in host storage (a ring
 * exists only on host pools). Rare: only when the head must take or give back a block. */
static int head_unrotate(kv_cache *c, kv_head *h, kv_error *err) {
    if (h->wrot == 0) return KV_OK;
    kv_pool *p = c->pool;
    if (!p->data)
        return kv_fail(err, KV_EINTERNAL, "KV window ring on a pool without host storage");
    int w = h->len - h->wbase;
    size_t rb = kvt_row_bytes(h->type, p->head_dim);
    unsigned char *tmp = malloc(2 * rb * (size_t)(w > 0 ? w : 1));
    if (!tmp) return kv_fail(err, KV_EINTERNAL, "out of memory (KV window ring)");
    for (int k = 0; k < w; k++)
        for (int which = 0; which < 2; which++)
            memcpy(tmp + (2 * (size_t)k + (size_t)which) * rb,
                   kv_pool_slot_row(p, kv_head_slot(p, h, h->wbase + k), which), rb);
    h->wrot = 0;
    for (int k = 0; k < w; k++)
        for (int which = 0; which < 2; which++)
            memcpy(kv_pool_slot_row(p, kv_head_slot(p, h, h->wbase + k), which),
                   tmp + (2 * (size_t)k + (size_t)which) * rb, rb);
    free(tmp);
    return KV_OK;
}

/* Capacity a head's arrays grow to for `need` entries: doubling from 64 as realloc growth did,
 * or, on the first growth of a head with a budget of at most 2^16 entries, the power of two
 * holding the budget at once (kv_head_schedule_room keeps len <= budget), so a budgeted head
 * takes one block instead of a chain of doublings. */
static int head_cap_for(const kv_head *h, int need) {
    int cap = h->cap ? h->cap : 64;
    if (!h->cap && h->budget > need && h->budget <= (1 << 16)) need = h->budget;
    while (cap < need) cap *= 2;
    return cap;
}

/* Per-entry arrays (pos, acc, acc2) of at least `need` entries, from the cache's arena
 * (runtime/cache/kvarena.h): entries [0, len) of pos are copied, and of acc / acc2 only while
 * the head tracks statistics (an untracked head's sums are never read before head_zero_stats
 * zeroes them, so their pages need not be touched). KV_EINTERNAL when memory runs out; the head
 * is then unchanged. */
static int head_grow(kv_cache *c, kv_head *h, int need, kv_error *err) {
    if (need <= h->cap) return KV_OK;
    int cap = head_cap_for(h, need);
    size_t bytes = (size_t)cap * sizeof(int), got[3] = {0, 0, 0};
    int *pos = kv_arena_take(c->arena, KV_ARENA_HOT, bytes, &got[0], "KV metadata", err);
    float *acc =
        pos ? kv_arena_take(c->arena, KV_ARENA_STATS, bytes, &got[1], "KV metadata", err) : NULL;
    float *acc2 =
        acc ? kv_arena_take(c->arena, KV_ARENA_STATS, bytes, &got[2], "KV metadata", err) : NULL;
    if (!acc2) {
        kv_arena_give(c->arena, KV_ARENA_HOT, pos, got[0], NULL);
        kv_arena_give(c->arena, KV_ARENA_STATS, acc, got[1], NULL);
        return KV_EINTERNAL;
    }
    size_t live = (size_t)h->len;
    if (live) memcpy(pos, h->pos, live * sizeof *pos);
    if (live && h->track_stats) {
        memcpy(acc, h->acc, live * sizeof *acc);
        memcpy(acc2, h->acc2, live * sizeof *acc2);
    }
    size_t old = (size_t)h->cap * sizeof(int);
    kv_arena_give(c->arena, KV_ARENA_HOT, h->pos, old, NULL);
    kv_arena_give(c->arena, KV_ARENA_STATS, h->acc, old, NULL);
    kv_arena_give(c->arena, KV_ARENA_STATS, h->acc2, old, NULL);
    h->pos = pos;
    h->acc = acc;
    h->acc2 = acc2;
    h->cap = (int)(got[0] / sizeof(int));
    return KV_OK;
}

/* Room in the block table for one more block: doubling from 16 entries (one 64-byte arena
 * block), or on the first growth of a budgeted head at once the blocks of its budget (the
 * most it holds after kv_head_schedule_room). Entries [0, n_blocks) are copied, so a device
 * mirror's clean entries stay equal. KV_EINTERNAL when memory runs out (head unchanged). */
static int head_grow_table(kv_cache *c, kv_head *h, kv_error *err) {
    if (h->n_blocks < h->cap_blocks) return KV_OK;
    int bs = c->pool->block_size, nc = h->cap_blocks ? 2 * h->cap_blocks : 16;
    if (!h->cap_blocks && h->budget <= (1 << 16))
        while (nc < (h->budget + bs - 1) / bs) nc *= 2;
    size_t got = 0;
    int *t =
        kv_arena_take(c->arena, KV_ARENA_HOT, (size_t)nc * sizeof *t, &got, "block table", err);
    if (!t) return KV_EINTERNAL;
    if (h->n_blocks) memcpy(t, h->table, (size_t)h->n_blocks * sizeof *t);
    kv_arena_give(c->arena, KV_ARENA_HOT, h->table, (size_t)h->cap_blocks * sizeof *t, NULL);
    h->table = t;
    h->cap_blocks = (int)(got / sizeof *t);
    return KV_OK;
}

int kv_head_append_slot(kv_cache *c, kv_head *h, int pos, int *slot, kv_error *err) {
    kv_pool *p = c->pool;
    int rc = head_grow(c, h, h->len + 1, err);
    if (rc) return rc;
    if (h->len == h->n_blocks * p->block_size) {
        /* a full ring grows in the plain layout (kv_head_schedule_room avoids this in a step) */
        if ((rc = head_unrotate(c, h, err))) return rc;
        if ((rc = head_grow_table(c, h, err))) return rc;
        int b = pool_take(p, h->type);
        if (b < 0)
            return kv_fail(err, KV_EINTERNAL,
                           "KV block pool exhausted (%d blocks of %d tokens, %d of type %s): the "
                           "budgets need more blocks than were reserved",
                           p->n_blocks, p->block_size,
                           kv_type_valid((int)h->type)
                               ? p->type_first[h->type + 1] - p->type_first[h->type]
                               : 0,
                           kv_type_name(h->type));
        h->table[h->n_blocks++] = b;
        h->last_block = b;
        if (h->mirror.dirty > h->n_blocks - 1) h->mirror.dirty = h->n_blocks - 1;
    }
    int i = h->len++, last = (h->n_blocks - 1) * p->block_size; /* first entry of the last block */
    h->pos[i] = pos;
    if (h->track_stats) { /* untracked: head_zero_stats where they are read */
        h->acc[i] = 0.0f;
        h->acc2[i] = 0.0f;
    }
    /* kv_head_slot's slot; an entry of the last block of a plain head from last_block, without
     * a load of the table's line (one per head per step: a third of a decode step's lines) */
    assert(h->table[h->n_blocks - 1] == h->last_block);
    *slot = h->wrot == 0 && i >= last ? h->last_block * p->block_size + (i - last)
                                      : kv_head_slot(p, h, i);
    return KV_OK;
}

void kv_head_drop_from(kv_cache *c, kv_head *h, int first_pos) {
    while (h->len > 0 && h->pos[h->len - 1] >= first_pos) h->len--;
    int bs = c->pool->block_size, keep = (h->len + bs - 1) / bs;
    /* a ring gives back blocks in the plain layout; out of memory: it keeps them */
    if (keep < h->n_blocks && head_unrotate(c, h, NULL)) return;
    head_release_blocks(c->pool, h, keep);
}

void kv_head_read(const kv_pool *p, const kv_head *h, int i, float *k, float *v) {
    int slot = kv_head_slot(p, h, i);
    kv_cache_type t = kv_pool_block_type(p, slot / p->block_size);
    if (k) kvt_decode(t, p->head_dim, kv_pool_slot_row(p, slot, 0), k);
    if (v) kvt_decode(t, p->head_dim, kv_pool_slot_row(p, slot, 1), v);
}

/* Moves i .. i + r - 1 that form one run: consecutive sources and destinations, each side
 * inside one block, the destination below the source (so no move of the run overwrites a
 * later move's source, and one memmove of the run gives the bytes of the moves one by one).
 * Returns r >= 1. */
static int move_run(const kv_pool *p, const kv_move *moves, int i, int n) {
    int bs = p->block_size, src = moves[i].src, dst = moves[i].dst, r = 1;
    if (dst >= src) return 1;
    while (i + r < n && moves[i + r].src == src + r && moves[i + r].dst == dst + r &&
           (src + r) % bs != 0 && (dst + r) % bs != 0)
        r++;
    return r;
}

/* Copy n bytes from src down to dst < src (the ranges may overlap): 32-byte pieces, 8-byte
 * words, then bytes, in ascending order, each piece read whole before it is written, so no byte
 * is written before it is read (a piece's store ends at or below the next piece's start). The
 * runs of a compaction are a few rows of a few bytes each, where a memmove call costs more than
 * the copy. */
static void copy_down(unsigned char *dst, const unsigned char *src, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        unsigned char piece[32];
        memcpy(piece, src + i, 32);
        memcpy(dst + i, piece, 32);
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        memcpy(dst + i, &w, 8);
    }
    for (; i < n; i++) dst[i] = src[i];
}

void kv_pool_apply_moves_host(kv_pool *p, const kv_move *moves, int n) {
    for (int i = 0; i < n;) {
        /* a move stays inside one head, so source and destination have one type; runs of
         * moves (a compaction shifting a block's rows) are copied at once */
        int r = move_run(p, moves, i, n);
        size_t row =
            kvt_row_bytes(kv_pool_block_type(p, moves[i].src / p->block_size), p->head_dim);
        for (int which = 0; which < 2; which++) {
            unsigned char *d = kv_pool_slot_row(p, moves[i].dst, which);
            const unsigned char *s = kv_pool_slot_row(p, moves[i].src, which);
            if (d < s) /* also any disjoint pair */
                copy_down(d, s, (size_t)r * row);
            else
                memmove(d, s, (size_t)r * row);
        }
        i += r;
    }
}

int kv_head_append(kv_cache *c, kv_head *h, const float *k, const float *v, int pos,
                   kv_error *err) {
    int slot = 0, rc = kv_head_append_slot(c, h, pos, &slot, err);
    if (rc) return rc;
    kv_pool *p = c->pool;
    kvt_encode(h->type, p->head_dim, k, kv_pool_slot_row(p, slot, 0));
    kvt_encode(h->type, p->head_dim, v, kv_pool_slot_row(p, slot, 1));
    return KV_OK;
}

void kv_moves_free(kv_moves *m) {
    free(m->v);
    free(m->ev);
    free(m->tab);
    memset(m, 0, sizeof *m);
}

/* A grown copy of array v (*cap elements of elem bytes) holding at least need > *cap: the
 * capacity doubles from `first`. NULL (v untouched) when memory runs out; else *cap is set. */
static void *grow_buf(void *v, int *cap, int need, size_t elem, int first) {
    int nc = *cap ? 2 * *cap : first;
    while (nc < need) nc *= 2;
    void *nv = realloc(v, (size_t)nc * elem);
    if (nv) *cap = nc;
    return nv;
}

/* Record head h's eviction to n_keep entries for the backend (pool with device_meta): its
 * table as it is, len, n_keep, policy, curr_pos appended to m; then len = n_keep and the
 * emptied trailing blocks released, as head_compact would. KV_EINTERNAL out of memory. */
static int head_record_evict(kv_cache *c, kv_head *h, int n_keep, int curr_pos, kv_moves *m,
                             kv_error *err) {
    int bs = c->pool->block_size, nb = (h->len + bs - 1) / bs;
    if (m->n_ev == m->cap_ev) {
        kv_evict *nv = grow_buf(m->ev, &m->cap_ev, m->n_ev + 1, sizeof *nv, 64);
        if (!nv) return kv_fail(err, KV_EINTERNAL, "out of memory (eviction records)");
        m->ev = nv;
    }
    if (m->n_tab + nb > m->cap_tab) {
        int *nt = grow_buf(m->tab, &m->cap_tab, m->n_tab + nb, sizeof *nt, 1024);
        if (!nt) return kv_fail(err, KV_EINTERNAL, "out of memory (eviction records)");
        m->tab = nt;
    }
    memcpy(m->tab + m->n_tab, h->table, (size_t)nb * sizeof *m->tab);
    m->ev[m->n_ev++] = (kv_evict){m->n_tab, h->len, n_keep, (int)h->policy, curr_pos};
    m->n_tab += nb;
    h->len = n_keep;
    head_release_blocks(c->pool, h, (n_keep + bs - 1) / bs);
    return KV_OK;
}

static int moves_push(kv_moves *m, int src, int dst, kv_error *err) {
    if (m->n == m->cap) {
        kv_move *nv = grow_buf(m->v, &m->cap, m->n + 1, sizeof *nv, 256);
        if (!nv) return kv_fail(err, KV_EINTERNAL, "out of memory (eviction move list)");
        m->v = nv;
    }
    m->v[m->n++] = (kv_move){src, dst};
    return KV_OK;
}

/* Keep exactly the entries listed in `keep` (ascending indices): metadata compacted to the
 * front now, K/V copies owed to the storage appended to `moves` (MoveCache), the emptied
 * trailing blocks released. Sources are read before any later move overwrites them because
 * dst <= src and the moves run in ascending dst order. */
static int head_compact(kv_cache *c, kv_head *h, const int *keep, int n_keep, kv_moves *moves,
                        kv_error *err) {
    kv_pool *p = c->pool;
    for (int dst = 0; dst < n_keep; dst++) {
        int src = keep[dst];
        if (src == dst) continue;
        int rc = moves_push(moves, kv_head_slot(p, h, src), kv_head_slot(p, h, dst), err);
        if (rc) return rc;
        h->pos[dst] = h->pos[src];
        h->acc[dst] = h->acc[src];
        h->acc2[dst] = h->acc2[src];
    }
    h->len = n_keep;
    head_release_blocks(p, h, (n_keep + p->block_size - 1) / p->block_size);
    return KV_OK;
}

/* ---- policies ---- */

/* Keep the n best entries by score (higher is better; ties: the more recent entry), among
 * candidates [lo, hi), marking keep_mask. Each selection scans the candidates, so the cost is
 * O(len x picks): when more than half are kept (the usual case: a head over budget by one
 * eviction block p), the complement is selected instead — the (available - n) worst entries
 * (ties: the older entry) are dropped — which keeps exactly the same set. Without this a
 * batch of 21 sequences at budget 512 spent ~1 s per decode step in eviction. */
static void keep_top(const float *score, int lo, int hi, int n, unsigned char *mask) {
    int avail = 0;
    for (int i = lo; i < hi; i++) avail += !mask[i];
    if (n >= avail) {
        for (int i = lo; i < hi; i++) mask[i] = 1;
        return;
    }
    if (2 * n > avail) {
        for (int dropped = 0; dropped < avail - n; dropped++) {
            int worst = -1;
            for (int i = lo; i < hi; i++) {
                if (mask[i]) continue;
                if (worst < 0 || score[i] < score[worst]) worst = i;
            }
            mask[worst] = 2; /* dropped */
        }
        for (int i = lo; i < hi; i++) mask[i] = mask[i] != 2;
        return;
    }
    for (int picked = 0; picked < n; picked++) {
        int best = -1;
        for (int i = hi - 1; i >= lo; i--) {
            if (mask[i]) continue;
            if (best < 0 || score[i] > score[best]) best = i;
        }
        if (best < 0) return;
        mask[best] = 1;
    }
}

void kv_policy_select(kv_policy p, const int *pos, const float *acc, const float *acc2, int len,
                      int n_keep, int curr_pos, int *keep) {
    if (n_keep >= len) {
        for (int i = 0; i < len; i++) keep[i] = i;
        return;
    }
    if (n_keep <= 0) return;
    unsigned char *mask = calloc((size_t)len, 1);
    float *score = calloc((size_t)len, sizeof *score);
    if (!mask || !score) { /* fall back to the most recent entries */
        for (int i = 0; i < n_keep; i++) keep[i] = len - n_keep + i;
        free(mask);
        free(score);
        return;
    }
    switch (p) {
    case KV_POLICY_SINK: {
        int sinks = 0;
        for (int i = 0; i < len && sinks < n_keep && pos[i] < KV_SINK_TOKENS; i++, sinks++)
            mask[i] = 1;
        for (int i = len - 1, left = n_keep - sinks; i >= 0 && left > 0; i--)
            if (!mask[i]) {
                mask[i] = 1;
                left--;
            }
        break;
    }
    case KV_POLICY_H2O: {
        int recent = n_keep / 2;
        for (int i = len - recent; i < len; i++) mask[i] = 1;
        keep_top(acc, 0, len - recent, n_keep - recent, mask);
        break;
    }
    case KV_POLICY_AVGATTN:
        for (int i = 0; i < len; i++) score[i] = acc[i] / (float)(curr_pos + 1 - pos[i]);
        keep_top(score, 0, len, n_keep, mask);
        break;
    case KV_POLICY_L2ATTN: {
        /* keys younger than the excluded query window have no metric yet: protected */
        int kept = 0;
        for (int i = len - 1; i >= 0 && kept < n_keep; i--)
            if (curr_pos - pos[i] < KV_L2_EXCLUDED_WINDOW) {
                mask[i] = 1;
                kept++;
            }
        keep_top(acc2, 0, len, n_keep - kept, mask);
        break;
    }
    }
    for (int i = 0, k = 0; i < len; i++)
        if (mask[i]) keep[k++] = i;
    free(mask);
    free(score);
}

/* The sink policy's metadata after dropping window entries [sinks, sinks + gap): pos (and the
 * tracked sums) of the kept window slid down by memmove; len = n_keep. An untracked head's
 * sums are left as they are: nothing reads them (head_zero_stats zeroes them where reading
 * starts). */
static void sink_slide_meta(kv_head *h, int sinks, int gap, int n_keep) {
    int slide = n_keep > sinks ? n_keep - sinks : 0;
    memmove(h->pos + sinks, h->pos + sinks + gap, (size_t)slide * sizeof *h->pos);
    if (h->track_stats) {
        memmove(h->acc + sinks, h->acc + sinks + gap, (size_t)slide * sizeof *h->acc);
        memmove(h->acc2 + sinks, h->acc2 + sinks + gap, (size_t)slide * sizeof *h->acc2);
    }
    h->len = n_keep;
}

/* The sink policy's eviction without a selection pass: it keeps entries [0, sinks) (positions
 * below KV_SINK_TOKENS, at most n_keep) and the most recent n_keep - sinks, the set
 * kv_policy_select(KV_POLICY_SINK) chooses. On a window-ring pool, when the step's n_new
 * appends need exactly the blocks the head holds, the ring's start advances by gap = len -
 * n_keep and no row moves. Otherwise the kept entries slide down by gap in one sweep: the
 * moves appended as head_compact would append them, the emptied blocks released. Either way
 * the metadata is sink_slide_meta's and each entry reads the rows of the compacted layout. */
static int head_evict_sink(kv_cache *c, kv_head *h, int n_keep, int n_new, kv_moves *moves,
                           kv_error *err) {
    kv_pool *p = c->pool;
    int sinks = 0, gap = h->len - n_keep, bs = p->block_size;
    while (sinks < h->len && sinks < n_keep && h->pos[sinks] < KV_SINK_TOKENS) sinks++;
    if (p->window_ring && (h->wrot == 0 || h->wbase == sinks) &&
        (n_keep + n_new + bs - 1) / bs == h->n_blocks) {
        int cap = h->n_blocks * bs - sinks;
        if (h->wrot == 0) h->wbase = sinks;
        h->wrot = (int)(((long)h->wrot + gap) % cap);
        sink_slide_meta(h, sinks, gap, n_keep);
        return KV_OK;
    }
    int rc = head_unrotate(c, h, err);
    if (rc) return rc;
    int slide = n_keep > sinks ? n_keep - sinks : 0;
    if (moves->n + slide > moves->cap) {
        kv_move *nv = grow_buf(moves->v, &moves->cap, moves->n + slide, sizeof *nv, 256);
        if (!nv) return kv_fail(err, KV_EINTERNAL, "out of memory (eviction move list)");
        moves->v = nv;
    }
    int src = sinks + gap;
    int db = sinks / bs, dof = sinks % bs, sb = src / bs, sof = src % bs; /* block, offset */
    for (int dst = sinks; dst < n_keep; dst++) {
        moves->v[moves->n++] =
            (kv_move){h->table[sb] * bs + sof, h->table[db] * bs + dof}; /* kv_head_slot's */
        if (++dof == bs) {
            dof = 0;
            db++;
        }
        if (++sof == bs) {
            sof = 0;
            sb++;
        }
    }
    sink_slide_meta(h, sinks, gap, n_keep);
    head_release_blocks(p, h, (n_keep + bs - 1) / bs);
    return KV_OK;
}

int kv_head_schedule_room(kv_cache *c, kv_head *h, int n_new, int curr_pos, kv_moves *moves,
                          kv_error *err) {
    if (h->len + n_new <= h->budget) {
        /* appends that take a block find a ring put back in order (rows are written after) */
        int bs = c->pool->block_size;
        if (h->wrot && (h->len + n_new + bs - 1) / bs > h->n_blocks)
            return head_unrotate(c, h, err);
        return KV_OK;
    }
    int fixed = kv_policy_fixed_tokens(h->policy);
    if (h->budget < n_new || (curr_pos >= fixed && h->budget < fixed + n_new))
        return kv_fail(err, KV_EINPUT,
                       "a budget of %d tokens cannot hold the policy's fixed part (%d for %s) "
                       "plus a block of %d new tokens; raise the budget or lower --evict-block",
                       h->budget, fixed, kv_policy_name(h->policy), n_new);
    int n_keep = h->budget - n_new;
    if (h->policy == KV_POLICY_SINK) return head_evict_sink(c, h, n_keep, n_new, moves, err);
    if (c->pool->device_meta) return head_record_evict(c, h, n_keep, curr_pos, moves, err);
    int rc = head_unrotate(c, h, err); /* a policy changed on a live head */
    if (rc) return rc;
    int *keep = malloc((size_t)(n_keep > 0 ? n_keep : 1) * sizeof *keep);
    if (!keep) return kv_fail(err, KV_EINTERNAL, "out of memory (eviction)");
    if (!h->track_stats) head_zero_stats(h); /* the sums an untracked head never took */
    kv_policy_select(h->policy, h->pos, h->acc, h->acc2, h->len, n_keep, curr_pos, keep);
    rc = head_compact(c, h, keep, n_keep, moves, err);
    free(keep);
    return rc;
}

int kv_head_make_room(kv_cache *c, kv_head *h, int n_new, int curr_pos, kv_error *err) {
    kv_moves mv = {0};
    int rc = kv_head_schedule_room(c, h, n_new, curr_pos, &mv, err);
    if (!rc) kv_pool_apply_moves_host(c->pool, mv.v, mv.n);
    kv_moves_free(&mv);
    return rc;
}

void kv_cache_blocks_needed_typed(int n_layers, int n_kv_heads, const int *budget,
                                  const kv_cache_type *types, int context, int evict_block,
                                  int block_size, long *counts) {
    for (int t = 0; t < KV_CACHE_TYPES; t++) counts[t] = 0;
    for (int i = 0; i < n_layers * n_kv_heads; i++) {
        long t = budget ? (long)budget[i] + evict_block : context;
        if (t > context) t = context;
        int ty = types ? (int)types[i] : (int)KV_TYPE_DEFAULT;
        if (kv_type_valid(ty)) counts[ty] += (t + block_size - 1) / block_size;
    }
}

long kv_cache_blocks_needed(int n_layers, int n_kv_heads, const int *budget, int context,
                            int evict_block, int block_size) {
    long total = 0;
    for (int i = 0; i < n_layers * n_kv_heads; i++) {
        long t = budget ? (long)budget[i] + evict_block : context;
        if (t > context) t = context;
        total += (t + block_size - 1) / block_size;
    }
    return total;
}
