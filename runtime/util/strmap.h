/* Internal to runtime/: an open-addressing hash map from byte strings to int ids, used by the
 * tokenizers for vocabulary and merge lookups. Keys are copied into the map's own arena. */
#ifndef KVPLAN_RUNTIME_STRMAP_H
#define KVPLAN_RUNTIME_STRMAP_H

#include <stddef.h>

typedef struct kv_strmap {
    size_t cap; /* slots, a power of two */
    size_t count;
    char **keys;  /* [cap], NULL = empty, owned */
    size_t *lens; /* [cap] */
    int *vals;    /* [cap] */
} kv_strmap;

/* 0 on success, -1 when out of memory. */
int kv_strmap_init(kv_strmap *m, size_t expected);
void kv_strmap_free(kv_strmap *m);
/* Insert or overwrite. 0 on success, -1 when out of memory. */
int kv_strmap_put(kv_strmap *m, const char *key, size_t len, int val);
/* The value, or -1 when absent. */
int kv_strmap_get(const kv_strmap *m, const char *key, size_t len);

#endif
