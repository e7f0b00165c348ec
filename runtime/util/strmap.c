/* Open-addressing string hash map (FNV-1a, linear probing); see strmap.h. */
#include "util/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

int kv_strmap_init(kv_strmap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap <<= 1;
    m->cap = cap;
    m->count = 0;
    m->keys = calloc(cap, sizeof *m->keys);
    m->lens = calloc(cap, sizeof *m->lens);
    m->vals = calloc(cap, sizeof *m->vals);
    if (!m->keys || !m->lens || !m->vals) {
        kv_strmap_free(m);
        return -1;
    }
    return 0;
}

void kv_strmap_free(kv_strmap *m) {
    if (m->keys)
        for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->lens);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t find_slot(const kv_strmap *m, const char *key, size_t len) {
    size_t mask = m->cap - 1, i = (size_t)hash_bytes(key, len) & mask;
    while (m->keys[i] && !(m->lens[i] == len && memcmp(m->keys[i], key, len) == 0))
        i = (i + 1) & mask;
    return i;
}

static int grow(kv_strmap *m) {
    kv_strmap n;
    if (kv_strmap_init(&n, m->cap) != 0) return -1; /* doubles capacity */
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = find_slot(&n, m->keys[i], m->lens[i]);
        n.keys[j] = m->keys[i];
        n.lens[j] = m->lens[i];
        n.vals[j] = m->vals[i];
        n.count++;
        m->keys[i] = NULL;
    }
    kv_strmap_free(m);
    *m = n;
    return 0;
}

int kv_strmap_put(kv_strmap *m, const char *key, size_t len, int val) {
    if ((m->count + 1) * 2 > m->cap && grow(m) != 0) return -1;
    size_t i = find_slot(m, key, len);
    if (!m->keys[i]) {
        char *k = malloc(len + 1);
        if (!k) return -1;
        memcpy(k, key, len);
        k[len] = '\0';
        m->keys[i] = k;
        m->lens[i] = len;
        m->count++;
    }
    m->vals[i] = val;
    return 0;
}

int kv_strmap_get(const kv_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t i = find_slot(m, key, len);
    return m->keys[i] ? m->vals[i] : -1;
}
