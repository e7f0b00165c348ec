/* kvplan per-cache arena for the heads' per-entry arrays: see runtime/cache/kvarena.h. */
#include "cache/kvarena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define KV_ARENA_PER_BLOCK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_ARENA_PER_BLOCK 1
#endif
#endif
#ifndef KV_ARENA_PER_BLOCK
#define KV_ARENA_PER_BLOCK 0
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#if defined(MAP_ANONYMOUS)
#define KV_ARENA_MMAP 1
#endif
#endif
#ifndef KV_ARENA_MMAP
#define KV_ARENA_MMAP 0
#endif

#define ARENA_MIN_SHIFT 6 /* 64-byte blocks at least: one cache line */
#define ARENA_CLASSES 56  /* block sizes 2^6 .. 2^61 */
#define ARENA_HUGE ((size_t)2 << 20)
#define ARENA_FIRST ((size_t)64 << 10) /* the first region of a space */
#define ARENA_MAX ((size_t)64 << 20)   /* regions grow up to this (larger blocks: their size) */

typedef struct {
    unsigned char *base;
    size_t size;
    int mapped; /* 1: munmap; 0: free */
} arena_region;

typedef struct {
    void **v;
    size_t n, cap;
} arena_list;

typedef struct {
    arena_region *regions;
    size_t n_regions, cap_regions;
    size_t used;     /* bytes cut from the last region */
    size_t reserved; /* bytes of all regions */
    arena_list free_[ARENA_CLASSES];
} arena_space;

struct kv_arena {
    arena_space space[KV_ARENA_SPACES];
};

int kv_arena_pooled(void) {
    return !KV_ARENA_PER_BLOCK;
}

int kv_arena_new(kv_arena **out, kv_error *err) {
    *out = kv_calloc(1, sizeof **out, "KV cache arena", err);
    return *out ? KV_OK : KV_EINTERNAL;
}

static void region_release(arena_region *r) {
#if KV_ARENA_MMAP
    if (r->mapped) {
        munmap(r->base, r->size);
        return;
    }
#endif
    free(r->base);
}

void kv_arena_free(kv_arena *a) {
    if (!a) return;
    for (int s = 0; s < KV_ARENA_SPACES; s++) {
        arena_space *sp = &a->space[s];
        for (size_t i = 0; i < sp->n_regions; i++) region_release(&sp->regions[i]);
        free(sp->regions);
        for (int k = 0; k < ARENA_CLASSES; k++) free(sp->free_[k].v);
    }
    free(a);
}

size_t kv_arena_reserved(const kv_arena *a) {
    size_t n = 0;
    for (int s = 0; a && s < KV_ARENA_SPACES; s++) n += a->space[s].reserved;
    return n;
}

/* The class of a block of `bytes`: k with 2^k >= bytes, at least ARENA_MIN_SHIFT; -1 when no
 * class holds it. */
static int arena_class(size_t bytes) {
    int k = ARENA_MIN_SHIFT;
    while (k < ARENA_CLASSES && ((size_t)1 << k) < bytes) k++;
    return k < ARENA_CLASSES ? k : -1;
}

static int list_push(arena_list *l, void *p) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 64;
        void **nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return KV_EINTERNAL;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = p;
    return KV_OK;
}

/* `size` bytes (a multiple of 64 KiB) of fresh, 64-byte aligned memory in *r: an anonymous
 * mapping, 2 MiB aligned and advised for huge pages when size >= 2 MiB (the mapping is made
 * 2 MiB longer and trimmed); aligned_alloc where mmap is unavailable or fails. A failed madvise
 * leaves small pages. KV_EINTERNAL when neither gives memory. */
static int region_map(arena_region *r, size_t size) {
    r->size = size;
#if KV_ARENA_MMAP
    size_t extra = size >= ARENA_HUGE ? ARENA_HUGE : 0;
    void *m = mmap(NULL, size + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
        uintptr_t lo = (uintptr_t)m, al = extra ? (lo + extra - 1) & ~(uintptr_t)(extra - 1) : lo;
        if (al > lo) munmap(m, al - lo);
        if (lo + extra > al) munmap((void *)(al + size), lo + extra - al);
        r->base = (unsigned char *)al;
        r->mapped = 1;
#if defined(MADV_HUGEPAGE)
        if (extra) (void)madvise(r->base, size, MADV_HUGEPAGE); /* a hint: small pages else */
#endif
        return KV_OK;
    }
#endif
    r->base = aligned_alloc(64, size);
    r->mapped = 0;
    return r->base ? KV_OK : KV_EINTERNAL;
}

/* The rest of the space's last region (bytes [used, size)) to the free lists, as the largest
 * aligned power-of-two pieces, so a new region wastes nothing of the old one. */
static int space_retire_tail(arena_space *sp) {
    if (!sp->n_regions) return KV_OK;
    arena_region *r = &sp->regions[sp->n_regions - 1];
    while (r->size - sp->used >= ((size_t)1 << ARENA_MIN_SHIFT)) {
        int k = ARENA_MIN_SHIFT;
        while (k + 1 < ARENA_CLASSES && ((size_t)1 << (k + 1)) <= r->size - sp->used &&
               sp->used % ((size_t)1 << (k + 1)) == 0)
            k++;
        if (list_push(&sp->free_[k], r->base + sp->used)) return KV_EINTERNAL;
        sp->used += (size_t)1 << k;
    }
    return KV_OK;
}

/* A new last region for a block of `size` bytes: as large as all the space's regions so far
 * (ARENA_FIRST .. ARENA_MAX), at least `size`, rounded to 64 KiB (2 MiB from 2 MiB up). */
static int space_grow(arena_space *sp, size_t size) {
    if (space_retire_tail(sp)) return KV_EINTERNAL;
    if (sp->n_regions == sp->cap_regions) {
        size_t nc = sp->cap_regions ? 2 * sp->cap_regions : 8;
        arena_region *nv = realloc(sp->regions, nc * sizeof *nv);
        if (!nv) return KV_EINTERNAL;
        sp->regions = nv;
        sp->cap_regions = nc;
    }
    size_t want = sp->reserved < ARENA_FIRST ? ARENA_FIRST
                  : sp->reserved > ARENA_MAX ? ARENA_MAX
                                             : sp->reserved;
    if (want < size) want = size;
    size_t unit = want >= ARENA_HUGE ? ARENA_HUGE : ARENA_FIRST;
    if (want > SIZE_MAX - unit) return KV_EINTERNAL;
    want = (want + unit - 1) / unit * unit;
    arena_region *r = &sp->regions[sp->n_regions];
    if (region_map(r, want)) return KV_EINTERNAL;
    sp->n_regions++;
    sp->reserved += want;
    sp->used = 0;
    return KV_OK;
}

void *kv_arena_take(kv_arena *a, int space, size_t bytes, size_t *got, const char *what,
                    kv_error *err) {
    int k = arena_class(bytes ? bytes : 1);
    if (!a || space < 0 || space >= KV_ARENA_SPACES || k < 0) {
        kv_fail(err, KV_EINTERNAL, "out of memory: %s (%zu bytes)", what, bytes);
        return NULL;
    }
    size_t size = (size_t)1 << k;
    void *p = NULL;
    if (KV_ARENA_PER_BLOCK) {
        p = malloc(size);
    } else {
        arena_space *sp = &a->space[space];
        if (sp->free_[k].n) {
            p = sp->free_[k].v[--sp->free_[k].n];
        } else if ((sp->n_regions && sp->regions[sp->n_regions - 1].size - sp->used >= size) ||
                   !space_grow(sp, size)) {
            /* bump: `used` is a multiple of 64 (every block is) */
            p = sp->regions[sp->n_regions - 1].base + sp->used;
            sp->used += size;
        }
    }
    if (!p) {
        kv_fail(err, KV_EINTERNAL, "out of memory: %s (%zu bytes)", what, size);
        return NULL;
    }
    *got = size;
    return p;
}

int kv_arena_give(kv_arena *a, int space, void *p, size_t got, kv_error *err) {
    if (!p) return KV_OK;
    if (KV_ARENA_PER_BLOCK) {
        free(p);
        return KV_OK;
    }
    int k = arena_class(got);
    if (!a || space < 0 || space >= KV_ARENA_SPACES || k < 0)
        return kv_fail(err, KV_EINTERNAL, "KV cache arena: a block of %zu bytes is not its own",
                       got);
    if (list_push(&a->space[space].free_[k], p))
        return kv_fail(err, KV_EINTERNAL, "out of memory: KV cache arena free list");
    return KV_OK;
}
