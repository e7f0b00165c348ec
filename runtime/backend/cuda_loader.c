/* kvplan's CUDA entry points (runtime/backend/kvcuda.h) in a binary that links no CUDA library:
 * each call finds the plugin libkvplan-cuda.so, opens it with dlopen and forwards to its table
 * (runtime/backend/cuda_plugin.h). Without an NVIDIA driver the plugin is not even opened, so a
 * CPU run never maps libcudart or libcublas.
 *
 * Where the plugin is looked for, in order: $KVPLAN_CUDA_PLUGIN (a file; it is then opened even
 * without a driver, which is how a fake CUDA runtime is loaded), the running program's folder
 * (the build tree), ../lib/kvplan beside it (an installed tree, wherever it was moved) and
 * KVPLAN_PLUGIN_DIR (the configured install prefix's lib/kvplan). dlopen keeps one copy per
 * process however often it is called; the plugin stays loaded for the life of the process
 * because the backends it creates point into it. No state is kept here. */
#include "backend/kvcuda.h"

#include "backend/cuda_plugin.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KVPLAN_PLUGIN_DIR
#define KVPLAN_PLUGIN_DIR "/usr/local/lib/kvplan"
#endif

#define WHY_CAP 256 /* kv_cuda_device_count's why: at least 256 bytes, as kvcuda.h says */

/* The plugin file to open, into path[cap]: 1 found, 0 not (why says where it looked). */
static int plugin_path(char *path, size_t cap, char *why) {
    const char *env = getenv("KVPLAN_CUDA_PLUGIN");
    if (env && env[0]) {
        snprintf(path, cap, "%s", env);
        return 1;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(path, cap, "%s/%s", exe, KV_CUDA_PLUGIN_FILE);
        if (access(path, R_OK) == 0) return 1;
        snprintf(path, cap, "%s/../lib/kvplan/%s", exe, KV_CUDA_PLUGIN_FILE); /* installed */
        if (access(path, R_OK) == 0) return 1;
    }
    snprintf(path, cap, "%s/%s", KVPLAN_PLUGIN_DIR, KV_CUDA_PLUGIN_FILE);
    if (access(path, R_OK) == 0) return 1;
    if (why)
        snprintf(why, WHY_CAP,
                 "the CUDA plugin %s is not installed (looked beside the program and in %s; "
                 "build kvplan with a CUDA toolkit or set KVPLAN_CUDA_PLUGIN)",
                 KV_CUDA_PLUGIN_FILE, KVPLAN_PLUGIN_DIR);
    return 0;
}

/* 1 when an NVIDIA kernel driver is present (or a plugin is named by $KVPLAN_CUDA_PLUGIN). */
static int driver_present(char *why) {
    const char *env = getenv("KVPLAN_CUDA_PLUGIN");
    if ((env && env[0]) || access("/dev/nvidiactl", F_OK) == 0 ||
        access("/proc/driver/nvidia/version", F_OK) == 0)
        return 1;
    if (why) snprintf(why, WHY_CAP, "no NVIDIA driver on this machine (no /dev/nvidiactl)");
    return 0;
}

/* The plugin's table, or NULL with the reason in why[WHY_CAP]. */
static const kv_cuda_plugin *plugin_get(char *why) {
    char path[4352];
    if (!plugin_path(path, sizeof path, why)) return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        if (why) snprintf(why, WHY_CAP, "cannot load the CUDA plugin: %s", dlerror());
        return NULL;
    }
    kv_cuda_plugin_fn fn;
    void *sym = dlsym(h, KV_CUDA_PLUGIN_SYMBOL);
    memcpy(&fn, &sym, sizeof fn); /* object pointer -> function pointer, as POSIX allows */
    const kv_cuda_plugin *t = fn ? fn() : NULL;
    if (!t || t->abi != KV_CUDA_PLUGIN_ABI || t->table_size != sizeof *t) {
        if (why)
            snprintf(why, WHY_CAP,
                     "%.160s is a CUDA plugin of another kvplan build (ABI %d, "
                     "want %d)",
                     path, t ? t->abi : -1, KV_CUDA_PLUGIN_ABI);
        return NULL;
    }
    return t;
}

/* The table when a driver is present, else NULL and why; err gets "what: why" on failure. */
static const kv_cuda_plugin *need(const char *what, kv_error *err) {
    char why[WHY_CAP] = "";
    const kv_cuda_plugin *t = driver_present(why) ? plugin_get(why) : NULL;
    if (!t) kv_fail(err, KV_EINPUT, "%s: %s; use --device cpu", what, why);
    return t;
}

int kv_cuda_built(void) {
    char path[4352];
    return plugin_path(path, sizeof path, NULL);
}

int kv_cuda_device_count(char *why) {
    if (!driver_present(why)) return 0;
    const kv_cuda_plugin *t = plugin_get(why);
    return t ? t->device_count(why) : 0;
}

int kv_cuda_device_info(int dev, kv_cuda_device *out, kv_error *err) {
    const kv_cuda_plugin *t = need("CUDA device query", err);
    return t ? t->device_info(dev, out, err) : KV_EINPUT;
}

int kv_cuda_probe_copy(int dev, kv_cuda_copy_kind kind, const size_t *bytes, int n_sizes,
                       int repeats, double *times, kv_progress *p, kv_error *err) {
    const kv_cuda_plugin *t = need("CUDA copy probe", err);
    return t ? t->probe_copy(dev, kind, bytes, n_sizes, repeats, times, p, err) : KV_EINPUT;
}

int kv_cuda_probe_gemm(int dev, kv_cuda_dtype dtype, const int *m, const int *n, const int *k,
                       int n_shapes, int repeats, double *times, kv_progress *p, kv_error *err) {
    const kv_cuda_plugin *t = need("CUDA GEMM probe", err);
    return t ? t->probe_gemm(dev, dtype, m, n, k, n_shapes, repeats, times, p, err) : KV_EINPUT;
}

int kv_backend_cuda_new(const struct kv_model *m, int max_rows, int max_ctx,
                        struct kv_backend **out, kv_error *err) {
    *out = NULL;
    const kv_cuda_plugin *t = need("--device cuda", err);
    return t ? t->backend_new(m, max_rows, max_ctx, out, err) : KV_EINPUT;
}

int kv_cuda_kvpr_new(const struct kv_model *m, int max_ctx, kv_cuda_kvpr **out, kv_error *err) {
    *out = NULL;
    const kv_cuda_plugin *t = need("CUDA KVPR", err);
    return t ? t->kvpr_new(m, max_ctx, out, err) : KV_EINPUT;
}

void kv_cuda_kvpr_free(kv_cuda_kvpr *e) {
    if (!e) return;
    /* e was made by the plugin, so the plugin is loaded: this only takes its table again */
    const kv_cuda_plugin *t = plugin_get(NULL);
    if (t) t->kvpr_free(e);
}

int kv_cuda_kvpr_rebuild(kv_cuda_kvpr *e, const struct kv_kvpr_layer *layers, int n,
                         float *const *k_out, float *const *v_out, struct kv_kvpr_timing *t,
                         kv_error *err) {
    const kv_cuda_plugin *p = plugin_get(NULL);
    if (!p) return kv_fail(err, KV_EINTERNAL, "CUDA KVPR: the plugin is no longer loadable");
    return p->kvpr_rebuild(e, layers, n, k_out, v_out, t, err);
}
