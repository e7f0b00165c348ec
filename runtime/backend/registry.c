/* kvplan backend registry: which backend a run gets (include/kvplan/backend.h: kv_device_resolve,
 * kv_backend_new). One row per backend {device, available, new}; the backends live in their own
 * files (backend_cpu.c; the CUDA plugin through cuda_loader.c) and never call back into this one.
 */
#include "backend/backend_impl.h"

#include "backend/kvcuda.h"

#include <stdio.h>

typedef struct kv_backend_entry {
    kv_device device;
    /* 1 when this backend can run here; else 0 and why[256] says what is missing */
    int (*available)(char *why);
    int (*create)(const kv_model *m, int max_rows, int max_ctx, int n_threads, kv_backend **out,
                  kv_error *err);
} kv_backend_entry;

static int cpu_available(char *why) {
    (void)why;
    return 1;
}

static int cuda_available(char *why) {
    return kv_cuda_device_count(why) > 0;
}

static int cuda_create(const kv_model *m, int max_rows, int max_ctx, int n_threads,
                       kv_backend **out, kv_error *err) {
    (void)n_threads; /* the device's own parallelism */
    return kv_backend_cuda_new((const struct kv_model *)m, max_rows, max_ctx,
                               (struct kv_backend **)out, err);
}

/* In the order --device auto tries them: the first available wins. */
static const kv_backend_entry kv_backends[] = {
    {KV_DEVICE_CUDA, cuda_available, cuda_create},
    {KV_DEVICE_CPU, cpu_available, kv_backend_cpu_new},
};
#define N_BACKENDS (sizeof kv_backends / sizeof kv_backends[0])

static const kv_backend_entry *entry(kv_device d) {
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (kv_backends[i].device == d) return &kv_backends[i];
    return NULL;
}

int kv_device_resolve(kv_device d, kv_device *out, kv_error *err) {
    char why[256] = "";
    if (d != KV_DEVICE_AUTO) {
        const kv_backend_entry *e = entry(d);
        if (!e) return kv_fail(err, KV_EINPUT, "--device %d: no such backend", (int)d);
        if (!e->available(why))
            return kv_fail(err, KV_EINPUT, "--device %s: %s; use --device cpu", kv_device_name(d),
                           why[0] ? why : "not available here");
        *out = d;
        return KV_OK;
    }
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (kv_backends[i].available(why)) {
            *out = kv_backends[i].device;
            return KV_OK;
        }
    return kv_fail(err, KV_EINTERNAL, "no backend is available");
}

int kv_backend_new(const kv_model *m, kv_device dev, int max_rows, int max_ctx, kv_backend **out,
                   kv_error *err) {
    return kv_backend_new_threads(m, dev, max_rows, max_ctx, 0, out, err);
}

int kv_backend_new_threads(const kv_model *m, kv_device dev, int max_rows, int max_ctx,
                           int n_threads, kv_backend **out, kv_error *err) {
    *out = NULL;
    kv_device d = KV_DEVICE_CPU;
    int rc = kv_device_resolve(dev, &d, err);
    if (rc) return rc;
    rc = entry(d)->create(m, max_rows, max_ctx, n_threads, out, err);
    /* auto: a device was found but its backend could not be made (e.g. out of device memory):
     * the CPU runs instead, and stderr says why */
    if (rc != KV_OK && dev == KV_DEVICE_AUTO && d != KV_DEVICE_CPU) {
        fprintf(stderr, "kvplan: --device auto: the %s backend failed (%s); running on the CPU\n",
                kv_device_name(d), err ? err->msg : "unknown error");
        rc = kv_backend_cpu_new(m, max_rows, max_ctx, n_threads, out, err);
    }
    return rc;
}
