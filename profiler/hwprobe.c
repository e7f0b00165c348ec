/* Hardware probes: host memcpy and CBLAS sgemm sweeps, CUDA sweeps through cuda/ (kvcuda.h),
 * medians and the least-squares line time = latency + bytes / bandwidth (GSL).
 * See include/kvplan/hwprobe.h and docs/hardware-schema.md. The HDF5 side is in
 * profiler/hwprobe_h5.c. */
#include "kvplan/hwprobe.h"

#include <cblas.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_fit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/kvcuda.h"

void kv_hw_opts_default(kv_hw_opts *o, int quick) {
    memset(o, 0, sizeof *o);
    o->quick = quick ? 1 : 0;
    o->min_bytes = (size_t)4 << 10;
    o->max_bytes = quick ? (size_t)4 << 20 : (size_t)1 << 30;
    o->repeats = quick ? 5 : 9;
    o->gemm_repeats = quick ? 3 : 5;
    static const int bl_full[] = {16, 64, 256, 1024, 2048};
    static const int bl_quick[] = {16, 64};
    const int *bl = quick ? bl_quick : bl_full;
    o->n_bl = quick ? 2 : 5;
    for (int i = 0; i < o->n_bl; i++) o->bl[i] = bl[i];
    o->min_sample_s = quick ? 20e-6 : 200e-6;
    o->fit_tol = 0.10;
    o->device = 0;
}

static void copy_free(kv_hw_copy *c) {
    free(c->bytes);
    free(c->samples);
    free(c->median);
    memset(c, 0, sizeof *c);
}

static void gemm_free(kv_hw_gemm *g) {
    free(g->m);
    free(g->n);
    free(g->k);
    free(g->samples);
    free(g->median);
    free(g->flops_per_s);
    memset(g, 0, sizeof *g);
}

void kv_hw_result_free(kv_hw_result *r) {
    if (!r) return;
    for (int i = 0; i < KV_HW_MAX_COPY; i++) copy_free(&r->copy[i]);
    for (int i = 0; i < KV_HW_MAX_GEMM; i++) gemm_free(&r->gemm[i]);
    memset(r, 0, sizeof *r);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kv_hw_median(const double *v, int n, double *scratch) {
    double local[64];
    if (n < 1) return NAN;
    double *w = scratch;
    if (!w) {
        if (n > 64) return NAN;
        w = local;
    }
    memcpy(w, v, (size_t)n * sizeof *w);
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    return (n % 2) ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

int kv_hw_fit_linear(const double *bytes, const double *seconds, int n, kv_hw_fit *out,
                     kv_error *err) {
    memset(out, 0, sizeof *out);
    if (n < 2) return kv_fail(err, KV_EINPUT, "bandwidth fit: need at least 2 sizes, got %d", n);
    double xmin = bytes[0], xmax = bytes[0], ymean = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(bytes[i]) || !isfinite(seconds[i]))
            return kv_fail(err, KV_EINPUT, "bandwidth fit: point %d is not finite", i);
        if (bytes[i] < xmin) xmin = bytes[i];
        if (bytes[i] > xmax) xmax = bytes[i];
        ymean += seconds[i];
    }
    if (xmin == xmax)
        return kv_fail(err, KV_EINPUT, "bandwidth fit: all %d points have the same size", n);
    ymean /= n;
    double c0, c1, cov00, cov01, cov11, sumsq;
    /* gsl_fit_linear only returns GSL_SUCCESS (it never calls the GSL error handler). */
    int rc =
        gsl_fit_linear(bytes, 1, seconds, 1, (size_t)n, &c0, &c1, &cov00, &cov01, &cov11, &sumsq);
    if (rc != GSL_SUCCESS)
        return kv_fail(err, KV_EINTERNAL, "bandwidth fit: gsl_fit_linear: %s", gsl_strerror(rc));
    if (!(c1 > 0) || !isfinite(c1))
        return kv_fail(err, KV_EINPUT,
                       "bandwidth fit: time does not grow with size (slope %g s/byte over %d "
                       "sizes from %.0f to %.0f bytes)",
                       c1, n, xmin, xmax);
    double sstot = 0;
    for (int i = 0; i < n; i++) sstot += (seconds[i] - ymean) * (seconds[i] - ymean);
    double r2 = sstot > 0 ? 1.0 - sumsq / sstot : 1.0;
    if (r2 < 0) r2 = 0;
    if (r2 > 1) r2 = 1;
    out->bandwidth = 1.0 / c1;
    out->latency = c0;
    out->r2 = r2;
    out->bandwidth_se = n > 2 ? sqrt(cov11) / (c1 * c1) : NAN;
    out->latency_se = n > 2 ? sqrt(cov00) : NAN;
    out->fit_min_bytes = xmin;
    out->n_points = n;
    return KV_OK;
}

int kv_hw_linear_start(const double *bytes, const double *median, int n, double tol,
                       int min_points) {
    if (min_points < 2) min_points = 2;
    if (n <= min_points) return 0;
    double ref = median[n - 1] / bytes[n - 1];
    int s = n - 1;
    while (s > 0 && fabs(median[s - 1] / bytes[s - 1] - ref) <= tol * ref) s--;
    if (s > n - min_points) s = n - min_points;
    return s;
}

/* ---- host measurements ---- */

/* Host CPU model from /proc/cpuinfo ("model name"), else "unknown CPU". */
static void host_cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *c = strchr(line, ':');
        if (!c) continue;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        size_t len = strcspn(c, "\n");
        snprintf(out, cap, "%.*s", (int)len, c);
        break;
    }
    fclose(f);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t used = strlen(out);
    if (ncpu > 0 && used + 24 < cap) snprintf(out + used, cap - used, " (%ld CPUs)", ncpu);
}

static long host_mem_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return (pages > 0 && psz > 0) ? pages * psz : 0;
}

/* Copy sizes: powers of two from min_bytes (rounded up) to max_bytes (rounded down). */
static int copy_sizes(size_t min_b, size_t max_b, size_t *sizes, int *n_out, kv_error *err) {
    size_t lo = 1;
    while (lo < min_b) lo <<= 1;
    int n = 0;
    *n_out = 0;
    for (size_t b = lo; b <= max_b && b != 0; b <<= 1) {
        if (n == KV_HW_MAX_SIZES)
            return kv_fail(err, KV_EINPUT,
                           "hardware probe: more than %d copy sizes from %zu to "
                           "%zu bytes",
                           KV_HW_MAX_SIZES, min_b, max_b);
        sizes[n++] = b;
        if (b > ((size_t)-1 >> 1)) break;
    }
    if (n < 2)
        return kv_fail(err, KV_EINPUT,
                       "hardware probe: copy sizes %zu..%zu bytes give %d "
                       "power-of-two sizes; need at least 2",
                       min_b, max_b, n);
    *n_out = n;
    return KV_OK;
}

static int copy_alloc(kv_hw_copy *c, const char *name, int n, int repeats, kv_error *err) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->n_sizes = n;
    c->repeats = repeats;
    c->bytes = kv_calloc((size_t)n, sizeof(double), "copy sizes", err);
    c->median = kv_calloc((size_t)n, sizeof(double), "copy medians", err);
    c->samples = kv_calloc((size_t)n * repeats, sizeof(double), "copy samples", err);
    if (!c->bytes || !c->median || !c->samples) {
        copy_free(c);
        return KV_EINTERNAL;
    }
    return KV_OK;
}

/* Medians of every size, then the fit over the linear part (o->fit_min_bytes, else
 * kv_hw_linear_start when `knee`, else all sizes). */
static int copy_finish(kv_hw_copy *c, const kv_hw_opts *o, int knee, kv_error *err) {
    double scratch[KV_HW_MAX_REPEATS];
    for (int s = 0; s < c->n_sizes; s++)
        c->median[s] = kv_hw_median(c->samples + (size_t)s * c->repeats, c->repeats, scratch);
    int start = 0;
    if (o->fit_min_bytes > 0) {
        while (start < c->n_sizes - 2 && c->bytes[start] < (double)o->fit_min_bytes) start++;
    } else if (knee) {
        start = kv_hw_linear_start(c->bytes, c->median, c->n_sizes, o->fit_tol, 3);
    }
    int rc =
        kv_hw_fit_linear(c->bytes + start, c->median + start, c->n_sizes - start, &c->fit, err);
    if (rc) return kv_fail_context(err, "hardware probe %s", c->name);
    return KV_OK;
}

static int copy_clone(kv_hw_copy *dst, const kv_hw_copy *src, const char *name, kv_error *err) {
    int rc = copy_alloc(dst, name, src->n_sizes, src->repeats, err);
    if (rc) return rc;
    memcpy(dst->bytes, src->bytes, (size_t)src->n_sizes * sizeof(double));
    memcpy(dst->median, src->median, (size_t)src->n_sizes * sizeof(double));
    memcpy(dst->samples, src->samples, (size_t)src->n_sizes * src->repeats * sizeof(double));
    dst->fit = src->fit;
    snprintf(dst->timer, sizeof dst->timer, "%s", src->timer);
    snprintf(dst->source, sizeof dst->source, "memcpy (host); no CUDA device: copy_host's samples");
    return KV_OK;
}

/* Number of operations per sample so that one sample lasts about `target` seconds, from one
 * timed operation of t1 seconds. */
static long reps_for(double t1, double target) {
    if (!(t1 > 0)) t1 = 1e-9;
    double k = ceil(target / t1);
    if (k < 1) k = 1;
    if (k > 1e6) k = 1e6;
    return (long)k;
}

typedef void *(*kv_copy_fn)(void *, const void *, size_t);

/* Sweeps of the host memcpy before a non-increasing fit is reported as an error. */
enum { KV_HW_SWEEP_ATTEMPTS = 3 };

/* Host memcpy sweep into c (allocated here). */
static int probe_memcpy(const size_t *sizes, int n, const kv_hw_opts *o, kv_hw_copy *c,
                        kv_progress *p, kv_error *err) {
    int rc = copy_alloc(c, "copy_host", n, o->repeats, err);
    if (rc) return rc;
    snprintf(c->source, sizeof c->source, "memcpy (host)");
    snprintf(c->timer, sizeof c->timer, "clock_gettime");
    size_t maxb = sizes[n - 1];
    char *src = kv_malloc(maxb, "memcpy probe source", err);
    char *dst = src ? kv_malloc(maxb, "memcpy probe destination", err) : NULL;
    long *reps = kv_calloc((size_t)n, sizeof(long), "memcpy probe counts", err);
    if (!src || !dst || !reps) {
        free(src);
        free(dst);
        free(reps);
        return kv_fail_context(err, "hardware probe copy_host (%zu bytes)", maxb);
    }
    /* Through a volatile pointer so the compiler cannot merge or drop repeated copies. */
    kv_copy_fn volatile cp = memcpy;
    kv_progress_print(p, 1, "hardware: host memcpy, %d sizes %zu..%zu bytes, %d repeats", n,
                      sizes[0], maxb, o->repeats);
    memset(src, 1, maxb); /* fault every page in before timing */
    memset(dst, 0, maxb);
    for (int s = 0; s < n; s++) {
        c->bytes[s] = (double)sizes[s];
        cp(dst, src, sizes[s]); /* warm-up */
        double t0 = kv_now();
        cp(dst, src, sizes[s]);
        reps[s] = reps_for(kv_now() - t0, o->min_sample_s);
    }
    /* On a loaded machine (other processes sharing the cores) the medians of the largest sizes
     * can come out out of order, and the fit has no positive slope; the sweep is then measured
     * again, up to KV_HW_SWEEP_ATTEMPTS times, before the probe gives up with the fit's error. */
    for (int attempt = 1;; attempt++) {
        for (int r = 0; r < o->repeats; r++) {
            for (int s = 0; s < n; s++) {
                double t0 = kv_now();
                for (long i = 0; i < reps[s]; i++) cp(dst, src, sizes[s]);
                c->samples[(size_t)s * o->repeats + r] = (kv_now() - t0) / (double)reps[s];
            }
            kv_progress_print(p, 0, "hardware: host memcpy, repeat %d/%d", r + 1, o->repeats);
        }
        rc = copy_finish(c, o, 1, err);
        if (rc != KV_EINPUT || attempt == KV_HW_SWEEP_ATTEMPTS) break;
        kv_progress_print(p, 1, "hardware: host memcpy fit failed (%s); measuring again (%d/%d)",
                          err->msg, attempt + 1, KV_HW_SWEEP_ATTEMPTS);
    }
    free(src);
    free(dst);
    free(reps);
    return rc;
}

static int gemm_alloc(kv_hw_gemm *g, const char *name, const kv_hw_opts *o, int h, int h_kv,
                      int repeats, kv_error *err) {
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    int ns = o->n_bl;
    g->n_shapes = ns;
    g->repeats = repeats;
    g->m = kv_calloc((size_t)ns, sizeof(int), "GEMM m", err);
    g->n = kv_calloc((size_t)ns, sizeof(int), "GEMM n", err);
    g->k = kv_calloc((size_t)ns, sizeof(int), "GEMM k", err);
    g->median = kv_calloc((size_t)ns, sizeof(double), "GEMM medians", err);
    g->flops_per_s = kv_calloc((size_t)ns, sizeof(double), "GEMM FLOP/s", err);
    g->samples = kv_calloc((size_t)ns * repeats, sizeof(double), "GEMM samples", err);
    if (!g->m || !g->n || !g->k || !g->median || !g->flops_per_s || !g->samples) {
        gemm_free(g);
        return KV_EINTERNAL;
    }
    for (int i = 0; i < ns; i++) {
        g->m[i] = o->bl[i]; /* b*l rows of X */
        g->k[i] = h;        /* X[b*l, h] */
        g->n[i] = h_kv;     /* W[h, h_kv] */
    }
    return KV_OK;
}

static void gemm_finish(kv_hw_gemm *g) {
    double scratch[KV_HW_MAX_REPEATS];
    g->peak_flops_per_s = 0;
    for (int s = 0; s < g->n_shapes; s++) {
        g->median[s] = kv_hw_median(g->samples + (size_t)s * g->repeats, g->repeats, scratch);
        double flops = 2.0 * g->m[s] * (double)g->n[s] * g->k[s];
        g->flops_per_s[s] = g->median[s] > 0 ? flops / g->median[s] : 0;
        if (g->flops_per_s[s] > g->peak_flops_per_s) g->peak_flops_per_s = g->flops_per_s[s];
    }
}

/* CBLAS sgemm sweep C[m,n] = A[m,k] B[k,n], row-major, into g (allocated here). */
static int probe_sgemm(const kv_hw_opts *o, int h, int h_kv, kv_hw_gemm *g, kv_progress *p,
                       kv_error *err) {
    int rc = gemm_alloc(g, "gemm", o, h, h_kv, o->gemm_repeats, err);
    if (rc) return rc;
    snprintf(g->source, sizeof g->source, "cblas_sgemm");
    snprintf(g->dtype, sizeof g->dtype, "fp32");
    int maxm = 0;
    for (int i = 0; i < g->n_shapes; i++)
        if (g->m[i] > maxm) maxm = g->m[i];
    size_t na = (size_t)maxm * h, nb = (size_t)h * h_kv, nc = (size_t)maxm * h_kv;
    float *a = kv_malloc(na * sizeof(float), "GEMM probe A", err);
    float *b = a ? kv_malloc(nb * sizeof(float), "GEMM probe B", err) : NULL;
    float *c = b ? kv_malloc(nc * sizeof(float), "GEMM probe C", err) : NULL;
    if (!c) {
        free(a);
        free(b);
        return kv_fail_context(err, "hardware probe gemm (%dx%dx%d)", maxm, h_kv, h);
    }
    for (size_t i = 0; i < na; i++) a[i] = (float)((int)(i % 13) - 6) * 0.01f;
    for (size_t i = 0; i < nb; i++) b[i] = (float)((int)(i % 11) - 5) * 0.01f;
    memset(c, 0, nc * sizeof(float));
    for (int s = 0; s < g->n_shapes; s++) {
        int m = g->m[s], n = g->n[s], k = g->k[s];
        kv_progress_print(p, 0, "hardware: CBLAS sgemm %dx%dx%d (%d/%d)", m, n, k, s + 1,
                          g->n_shapes);
        /* warm-up (thread pool start, caches); a second, timed call sets the count per sample
         * unless the warm-up alone already lasted a whole sample (large shapes) */
        double t0 = kv_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c,
                    n);
        double t1 = kv_now() - t0;
        if (t1 < o->min_sample_s) {
            t0 = kv_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f,
                        c, n);
            t1 = kv_now() - t0;
        }
        long reps = reps_for(t1, o->min_sample_s);
        for (int r = 0; r < g->repeats; r++) {
            t0 = kv_now();
            for (long i = 0; i < reps; i++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n,
                            0.0f, c, n);
            g->samples[(size_t)s * g->repeats + r] = (kv_now() - t0) / (double)reps;
        }
    }
    free(a);
    free(b);
    free(c);
    gemm_finish(g);
    return KV_OK;
}

/* ---- CUDA measurements (cuda/hwprobe.cu) ---- */

static int probe_cuda(const kv_hw_opts *o, int h, int h_kv, kv_hw_result *r, kv_progress *p,
                      kv_error *err) {
    kv_cuda_device dev;
    int rc = kv_cuda_device_info(o->device, &dev, err);
    if (rc) return kv_fail_context(err, "hardware probe");
    snprintf(r->kind, sizeof r->kind, "cuda");
    snprintf(r->device_name, sizeof r->device_name, "%s", dev.name);
    r->device_mem_bytes = (long)dev.total_mem;
    /* Device buffers: at most a quarter of device memory each (D2D needs two). */
    size_t cap = o->max_bytes;
    while (cap > o->min_bytes && cap > dev.total_mem / 4) cap >>= 1;
    size_t sizes[KV_HW_MAX_SIZES];
    int n = 0;
    rc = copy_sizes(o->min_bytes, cap, sizes, &n, err);
    if (rc) return rc;
    static const struct {
        kv_cuda_copy_kind kind;
        const char *name, *source;
        int knee;
    } kinds[] = {
        {KV_CUDA_H2D_PINNED, "copy_h2d", "cudaMemcpyAsync host->device, pinned host memory", 0},
        {KV_CUDA_H2D_PAGEABLE, "copy_h2d_pageable",
         "cudaMemcpyAsync host->device, pageable host memory", 0},
        {KV_CUDA_D2H_PINNED, "copy_d2h", "cudaMemcpyAsync device->host, pinned host memory", 0},
        {KV_CUDA_D2H_PAGEABLE, "copy_d2h_pageable",
         "cudaMemcpyAsync device->host, pageable host memory", 0},
        {KV_CUDA_D2D, "copy_d2d", "cudaMemcpyAsync device->device", 1},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        kv_hw_copy *c = &r->copy[r->n_copy];
        rc = copy_alloc(c, kinds[i].name, n, o->repeats, err);
        if (rc) return rc;
        r->n_copy++;
        snprintf(c->source, sizeof c->source, "%s", kinds[i].source);
        snprintf(c->timer, sizeof c->timer, "cudaEvent");
        for (int s = 0; s < n; s++) c->bytes[s] = (double)sizes[s];
        kv_progress_print(p, 1, "hardware: CUDA %s, %d sizes %zu..%zu bytes", kinds[i].name, n,
                          sizes[0], sizes[n - 1]);
        rc = kv_cuda_probe_copy(o->device, kinds[i].kind, sizes, n, o->repeats, c->samples, p, err);
        if (rc) return rc;
        rc = copy_finish(c, o, kinds[i].knee, err);
        if (rc) return rc;
    }
    static const struct {
        kv_cuda_dtype dt;
        const char *name, *dtype;
    } types[] = {
        {KV_CUDA_FP32, "gemm_fp32", "fp32"},
        {KV_CUDA_FP16, "gemm_fp16", "fp16"},
        {KV_CUDA_BF16, "gemm_bf16", "bf16"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        kv_hw_gemm *g = &r->gemm[r->n_gemm];
        rc = gemm_alloc(g, types[i].name, o, h, h_kv, o->gemm_repeats, err);
        if (rc) return rc;
        snprintf(g->source, sizeof g->source, "cublasGemmEx, CUBLAS_COMPUTE_32F");
        snprintf(g->dtype, sizeof g->dtype, "%s", types[i].dtype);
        kv_error gerr = {0, ""};
        kv_progress_print(p, 1, "hardware: cuBLAS %s GEMM, %d shapes", types[i].dtype, g->n_shapes);
        rc = kv_cuda_probe_gemm(o->device, types[i].dt, g->m, g->n, g->k, g->n_shapes, g->repeats,
                                g->samples, p, &gerr);
        if (rc && types[i].dt != KV_CUDA_FP32) {
            /* A type this device cannot run (BF16 before sm_80): leave the group out. */
            kv_progress_print(p, 1, "hardware: warning: %s left out: %s", types[i].name, gerr.msg);
            gemm_free(g);
            continue;
        }
        if (rc) {
            gemm_free(g);
            if (err) *err = gerr;
            return rc;
        }
        gemm_finish(g);
        r->n_gemm++;
    }
    return KV_OK;
}

int kv_hw_probe(const kv_config *cfg, const kv_hw_opts *o_in, kv_hw_result *r, kv_progress *p,
                kv_error *err) {
    kv_hw_opts o;
    if (o_in)
        o = *o_in;
    else
        kv_hw_opts_default(&o, 0);
    memset(r, 0, sizeof *r);
    double t_start = kv_now();
    int h = o.h, h_kv = o.h_kv;
    if (h <= 0 || h_kv <= 0) {
        if (!cfg)
            return kv_fail(err, KV_EINPUT,
                           "hardware probe: no model config and no GEMM shape (h, h_kv) given");
        if (h <= 0) h = cfg->dim;
        if (h_kv <= 0) h_kv = cfg->n_kv_heads * cfg->head_dim;
    }
    if (h <= 0 || h_kv <= 0)
        return kv_fail(err, KV_EINPUT, "hardware probe: bad GEMM shape h = %d, h_kv = %d", h, h_kv);
    if (o.repeats < 1 || o.repeats > KV_HW_MAX_REPEATS || o.gemm_repeats < 1 ||
        o.gemm_repeats > KV_HW_MAX_REPEATS)
        return kv_fail(err, KV_EINPUT, "hardware probe: repeats must be 1..%d (got %d, %d)",
                       KV_HW_MAX_REPEATS, o.repeats, o.gemm_repeats);
    if (o.n_bl < 1 || o.n_bl > KV_HW_MAX_SHAPES)
        return kv_fail(err, KV_EINPUT, "hardware probe: %d b*l values; need 1..%d", o.n_bl,
                       KV_HW_MAX_SHAPES);
    for (int i = 0; i < o.n_bl; i++)
        if (o.bl[i] < 1)
            return kv_fail(err, KV_EINPUT, "hardware probe: b*l value %d is %d", i, o.bl[i]);
    if (!(o.fit_tol > 0)) o.fit_tol = 0.10;
    if (!(o.min_sample_s >= 0)) o.min_sample_s = 0;
    if (o.min_bytes == 0) o.min_bytes = 1;

    size_t sizes[KV_HW_MAX_SIZES];
    int n = 0, rc = copy_sizes(o.min_bytes, o.max_bytes, sizes, &n, err);
    if (rc) return rc;
    char why[256] = "";
    int use_cuda = 0;

    host_cpu_name(r->host_name, sizeof r->host_name);
    r->host_mem_bytes = host_mem_bytes();
    /* Two host buffers of the largest size: keep them within half of the RAM. */
    while (n > 2 && r->host_mem_bytes > 0 && (double)sizes[n - 1] > r->host_mem_bytes / 4.0) {
        n--;
        o.max_bytes = sizes[n - 1];
    }

    rc = probe_memcpy(sizes, n, &o, &r->copy[0], p, err);
    if (rc) goto fail;
    r->n_copy = 1;
    rc = probe_sgemm(&o, h, h_kv, &r->gemm[0], p, err);
    if (rc) goto fail;
    r->n_gemm = 1;

    use_cuda = !o.no_cuda && kv_cuda_device_count(why) > o.device;
    if (use_cuda) {
        rc = probe_cuda(&o, h, h_kv, r, p, err);
        if (rc) goto fail;
    } else {
        snprintf(r->kind, sizeof r->kind, "cpu");
        snprintf(r->device_name, sizeof r->device_name, "%s", r->host_name);
        r->device_mem_bytes = r->host_mem_bytes;
        static const char *names[] = {"copy_h2d", "copy_d2h", "copy_d2d"};
        for (int i = 0; i < 3; i++) {
            rc = copy_clone(&r->copy[r->n_copy], &r->copy[0], names[i], err);
            if (rc) goto fail;
            r->n_copy++;
        }
    }
    r->elapsed_s = kv_now() - t_start;
    kv_progress_print(p, 1, "hardware: done in %.1f s (%s: %s)", r->elapsed_s, r->kind,
                      use_cuda ? r->device_name : (o.no_cuda ? "--no-cuda" : why));
    return KV_OK;
fail:
    kv_hw_result_free(r);
    return rc;
}

double kv_hw_memcpy_bandwidth(size_t bytes, int repeats, kv_error *err) {
    if (bytes == 0 || repeats < 1) {
        kv_fail(err, KV_EINPUT, "memcpy bandwidth: need bytes > 0 and repeats >= 1 (got %zu, %d)",
                bytes, repeats);
        return 0;
    }
    char *src = kv_malloc(bytes, "memcpy bandwidth source", err);
    char *dst = src ? kv_malloc(bytes, "memcpy bandwidth destination", err) : NULL;
    double *t = dst ? kv_malloc(2 * (size_t)repeats * sizeof(double), "memcpy samples", err) : NULL;
    if (!t) {
        free(src);
        free(dst);
        return 0;
    }
    kv_copy_fn volatile cp = memcpy;
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    cp(dst, src, bytes);
    double t0 = kv_now();
    cp(dst, src, bytes);
    long reps = reps_for(kv_now() - t0, 1e-3);
    for (int r = 0; r < repeats; r++) {
        t0 = kv_now();
        for (long i = 0; i < reps; i++) cp(dst, src, bytes);
        t[r] = (kv_now() - t0) / (double)reps;
    }
    double med = kv_hw_median(t, repeats, t + repeats);
    free(src);
    free(dst);
    free(t);
    if (!(med > 0)) {
        kv_fail(err, KV_EINTERNAL, "memcpy bandwidth: timer resolution too coarse for %zu bytes",
                bytes);
        return 0;
    }
    return (double)bytes / med / 1e9;
}
