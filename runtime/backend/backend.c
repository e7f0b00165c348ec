/* kvplan backends: the parts every backend shares (device names, the base object, pools). See
 * include/kvplan/backend.h. Which backend a run gets is decided in registry.c. */
#include "backend/backend_impl.h"

#include <stdlib.h>
#include <string.h>

const char *kv_device_name(kv_device d) {
    switch (d) {
    case KV_DEVICE_AUTO:
        return "auto";
    case KV_DEVICE_CPU:
        return "cpu";
    case KV_DEVICE_CUDA:
        return "cuda";
    }
    return "?";
}

int kv_device_parse(const char *s, kv_device *out, kv_error *err) {
    static const kv_device all[] = {KV_DEVICE_AUTO, KV_DEVICE_CPU, KV_DEVICE_CUDA};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (s && !strcmp(s, kv_device_name(all[i]))) {
            *out = all[i];
            return KV_OK;
        }
    return kv_fail(err, KV_EINPUT, "--device %s: choose auto, cpu or cuda", s ? s : "");
}

int kv_backend_base_init(kv_backend *b, const kv_backend_ops *ops, const kv_model *m, kv_device dev,
                         int max_rows, int max_ctx, kv_error *err) {
    if (max_rows < 1 || max_ctx < 1)
        return kv_fail(err, KV_EINPUT, "backend needs at least one row and one position");
    b->ops = ops;
    b->model = m;
    b->device = dev;
    b->max_rows = max_rows;
    b->max_ctx = max_ctx;
    size_t tasks = (size_t)max_rows * (size_t)m->cfg.n_kv_heads;
    b->row_pos = kv_malloc((size_t)max_rows * sizeof *b->row_pos, "driver positions", err);
    b->tasks = kv_malloc(tasks * sizeof *b->tasks, "driver attention tasks", err);
    b->writes = kv_malloc(tasks * sizeof *b->writes, "driver cache writes", err);
    if (!b->row_pos || !b->tasks || !b->writes) {
        kv_backend_base_free(b);
        return KV_EINTERNAL;
    }
    return KV_OK;
}

void kv_backend_base_free(kv_backend *b) {
    free(b->row_pos);
    free(b->tasks);
    free(b->writes);
    kv_moves_free(&b->moves);
    b->row_pos = NULL;
    b->tasks = NULL;
    b->writes = NULL;
}

unsigned long long kv_backend_attended(const kv_backend *b) {
    return b ? b->attended : 0;
}

void kv_backend_free(kv_backend *b) {
    if (!b) return;
    kv_backend_base_free(b);
    if (b->ops && b->ops->destroy) b->ops->destroy(b);
}

int kv_backend_pool_init(kv_backend *b, kv_pool *p, int n_blocks, int block_size, int head_dim,
                         kv_error *err) {
    int counts[KV_CACHE_TYPES] = {n_blocks, 0, 0, 0};
    return kv_backend_pool_init_typed(b, p, counts, block_size, head_dim, err);
}

int kv_backend_pool_init_typed(kv_backend *b, kv_pool *p, const int *counts, int block_size,
                               int head_dim, kv_error *err) {
    memset(p, 0, sizeof *p);
    int rc = kv_pool_init_meta_typed(p, counts, block_size, head_dim, err);
    if (!rc) rc = b->ops->storage_alloc(b, p, err);
    if (rc) kv_pool_destroy(p);
    return rc;
}

int kv_backend_read_head_meta(kv_backend *b, const kv_pool *p, kv_head *h, kv_error *err) {
    if (!p->device_meta || !b->ops->read_meta || h->len <= 0) return KV_OK;
    return b->ops->read_meta(b, p, h, err);
}

void kv_backend_pool_destroy(kv_backend *b, kv_pool *p) {
    if (b && b->ops->storage_free) b->ops->storage_free(b, p);
    kv_pool_destroy(p);
}
