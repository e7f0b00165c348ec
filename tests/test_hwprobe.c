/* Hardware probes: the least-squares fit, the linear-part choice, a quick host probe, the
 * memcpy helper for benchmarks, and the CUDA probes (run on a device, skipped otherwise). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/hwprobe.h"
#include "backend/kvcuda.h"
#include "testutil.h"

#define REL_CLOSE(a, b, tol) CU_ASSERT(fabs((a) - (b)) <= (tol)*fabs(b))

/* Sizes 4 KiB .. 1 GiB (19 powers of two). */
static int sweep(double *bytes) {
    int n = 0;
    for (double b = 4096; b <= 1073741824.0; b *= 2) bytes[n++] = b;
    return n;
}

static void test_fit_exact(void) {
    double bytes[32], t[32];
    int n = sweep(bytes);
    CU_ASSERT_EQUAL(n, 19);
    const double lat = 7.5e-6, bw = 12.5e9;
    for (int i = 0; i < n; i++) t[i] = lat + bytes[i] / bw;
    kv_hw_fit fit;
    kv_error err = {0, ""};
    CU_ASSERT_EQUAL_FATAL(kv_hw_fit_linear(bytes, t, n, &fit, &err), KV_OK);
    REL_CLOSE(fit.bandwidth, bw, 1e-9);
    CU_ASSERT(fabs(fit.latency - lat) < 1e-12); /* 1 ps on a 7.5 us latency */
    CU_ASSERT(fabs(fit.r2 - 1.0) < 1e-12);
    CU_ASSERT_EQUAL(fit.n_points, 19);
    CU_ASSERT(fit.latency_se < 1e-12 && fit.bandwidth_se < 1e-9 * bw); /* exact: no spread */
    CU_ASSERT_EQUAL(fit.fit_min_bytes, 4096.0);

    /* A PCIe-like line with a large latency, over a sub-range. */
    for (int i = 0; i < n; i++) t[i] = 2e-3 + bytes[i] / 2.5e10;
    CU_ASSERT_EQUAL_FATAL(kv_hw_fit_linear(bytes + 5, t + 5, n - 5, &fit, &err), KV_OK);
    REL_CLOSE(fit.bandwidth, 2.5e10, 1e-9);
    REL_CLOSE(fit.latency, 2e-3, 1e-9);
    CU_ASSERT_EQUAL(fit.fit_min_bytes, 4096.0 * 32);

    /* Two points: the line through them. */
    double x2[2] = {1000, 3000}, y2[2] = {1.0, 2.0};
    CU_ASSERT_EQUAL_FATAL(kv_hw_fit_linear(x2, y2, 2, &fit, &err), KV_OK);
    REL_CLOSE(fit.bandwidth, 2000.0, 1e-12);
    REL_CLOSE(fit.latency, 0.5, 1e-12);
    CU_ASSERT(fabs(fit.r2 - 1.0) < 1e-12);
    CU_ASSERT(isnan(fit.latency_se) && isnan(fit.bandwidth_se));
}

static void test_fit_noise(void) {
    double bytes[32], t[32];
    int n = sweep(bytes);
    const double lat = 1e-5, bw = 8e9;
    /* Deterministic +-1% multiplicative noise. */
    for (int i = 0; i < n; i++) t[i] = (lat + bytes[i] / bw) * (1.0 + 0.01 * ((i % 3) - 1));
    kv_hw_fit fit;
    kv_error err = {0, ""};
    CU_ASSERT_EQUAL_FATAL(kv_hw_fit_linear(bytes, t, n, &fit, &err), KV_OK);
    REL_CLOSE(fit.bandwidth, bw, 0.02);
    CU_ASSERT(fit.bandwidth_se > 0 && fit.bandwidth_se < 0.02 * bw);
    CU_ASSERT(fit.latency_se > 0 && isfinite(fit.latency_se));
    CU_ASSERT(fit.r2 > 0.999 && fit.r2 <= 1.0);

    /* R^2 of a poor line is low but inside [0, 1]. */
    double x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {1, 3, 1, 3, 1, 3.5};
    CU_ASSERT_EQUAL_FATAL(kv_hw_fit_linear(x, y, 6, &fit, &err), KV_OK);
    CU_ASSERT(fit.r2 >= 0.0 && fit.r2 < 0.3);
}

static void test_fit_errors(void) {
    kv_hw_fit fit;
    kv_error err = {0, ""};
    double x[3] = {4096, 8192, 16384}, y[3] = {3, 2, 1};
    CU_ASSERT_EQUAL(kv_hw_fit_linear(x, y, 1, &fit, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "at least 2") != NULL);
    CU_ASSERT_EQUAL(kv_hw_fit_linear(x, y, 3, &fit, &err), KV_EINPUT); /* slope < 0 */
    CU_ASSERT(strstr(err.msg, "does not grow") != NULL);
    double same[3] = {4096, 4096, 4096};
    CU_ASSERT_EQUAL(kv_hw_fit_linear(same, y, 3, &fit, &err), KV_EINPUT);
    double bad[3] = {1, NAN, 3};
    CU_ASSERT_EQUAL(kv_hw_fit_linear(x, bad, 3, &fit, &err), KV_EINPUT);
}

static void test_median(void) {
    double v[5] = {5, 1, 4, 2, 3};
    CU_ASSERT_EQUAL(kv_hw_median(v, 5, NULL), 3.0);
    CU_ASSERT_EQUAL(v[0], 5.0);                     /* input untouched */
    CU_ASSERT_EQUAL(kv_hw_median(v, 4, NULL), 3.0); /* {1,2,4,5} -> (2+4)/2 */
    CU_ASSERT_EQUAL(kv_hw_median(v, 1, NULL), 5.0);
    CU_ASSERT(isnan(kv_hw_median(v, 0, NULL)));
    double big[100], scratch[100];
    for (int i = 0; i < 100; i++) big[i] = 99 - i;
    CU_ASSERT_EQUAL(kv_hw_median(big, 100, scratch), 49.5);
    CU_ASSERT(isnan(kv_hw_median(big, 100, NULL))); /* > 64 needs scratch */
}

static void test_linear_start(void) {
    double bytes[32], t[32];
    int n = sweep(bytes); /* index 14 = 64 MiB */
    /* Cache below 64 MiB: 3x faster per byte; DRAM line from 64 MiB on. */
    for (int i = 0; i < n; i++) t[i] = 1e-7 + bytes[i] / (bytes[i] < 64.0 * 1048576 ? 30e9 : 10e9);
    int s = kv_hw_linear_start(bytes, t, n, 0.10, 3);
    CU_ASSERT_EQUAL(s, 14);
    kv_hw_fit fit;
    CU_ASSERT_EQUAL_FATAL(kv_hw_fit_linear(bytes + s, t + s, n - s, &fit, NULL), KV_OK);
    REL_CLOSE(fit.bandwidth, 10e9, 1e-9);
    REL_CLOSE(fit.latency, 1e-7, 1e-3);
    /* A pure line: every size is on it. */
    for (int i = 0; i < n; i++) t[i] = bytes[i] / 10e9;
    CU_ASSERT_EQUAL(kv_hw_linear_start(bytes, t, n, 0.10, 3), 0);
    /* Latency-dominated small sizes are left out too; at least min_points are kept. */
    for (int i = 0; i < n; i++) t[i] = 1e-3 + bytes[i] / 10e9;
    s = kv_hw_linear_start(bytes, t, n, 0.10, 3);
    CU_ASSERT(s > 10 && s <= n - 3);
    CU_ASSERT_EQUAL(kv_hw_linear_start(bytes, t, n, 1e-9, 5), n - 5);
    CU_ASSERT_EQUAL(kv_hw_linear_start(bytes, t, 2, 0.1, 3), 0);
}

static kv_config tiny_cfg(void) {
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = 64;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.head_dim = 8;
    return c;
}

static void test_quick_probe(void) {
    kv_hw_opts o;
    kv_hw_opts_default(&o, 1);
    o.no_cuda = 1;
    kv_config cfg = tiny_cfg();
    kv_hw_result r;
    memset(&r, 0, sizeof r);
    kv_error err = {0, ""};
    kv_progress p;
    kv_progress_init(&p, 1);
    int rc = kv_hw_probe(&cfg, &o, &r, &p, &err);
    if (rc) fprintf(stderr, "probe: %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    printf("\n  quick probe: %.3f s\n", r.elapsed_s);
    CU_ASSERT_STRING_EQUAL(r.kind, "cpu");
    CU_ASSERT_STRING_EQUAL(r.device_name, r.host_name);
    CU_ASSERT(r.device_mem_bytes > (1L << 28));
    CU_ASSERT_EQUAL(r.n_copy, 4);
    const char *names[4] = {"copy_host", "copy_h2d", "copy_d2h", "copy_d2d"};
    for (int i = 0; i < r.n_copy; i++) {
        kv_hw_copy *c = &r.copy[i];
        CU_ASSERT_STRING_EQUAL(c->name, names[i]);
        CU_ASSERT_EQUAL(c->n_sizes, 11); /* 4 KiB .. 4 MiB */
        CU_ASSERT_EQUAL(c->repeats, 5);
        CU_ASSERT_EQUAL(c->bytes[0], 4096.0);
        CU_ASSERT_EQUAL(c->bytes[10], 4194304.0);
        CU_ASSERT(c->fit.bandwidth > 1e8); /* > 0.1 GB/s on anything */
        CU_ASSERT(c->fit.r2 >= 0.0 && c->fit.r2 <= 1.0);
        CU_ASSERT(c->fit.n_points >= 3);
        for (int s = 0; s < c->n_sizes; s++) {
            CU_ASSERT(c->median[s] > 0);
            /* the median lies among its samples' range */
            double lo = 1e9, hi = 0;
            for (int k = 0; k < c->repeats; k++) {
                double v = c->samples[s * c->repeats + k];
                if (v < lo) lo = v;
                if (v > hi) hi = v;
            }
            CU_ASSERT(c->median[s] >= lo && c->median[s] <= hi);
            /* No step-by-step monotonicity check: the quick sweep's copies take microseconds,
             * and in CI's sanitizer stage (another suite on the other core) 4 of its 10
             * doublings came out more than 1.6x faster than the size before. Growth over the
             * sweep is checked below (1024x the bytes), the line by the fit. */
        }
        CU_ASSERT(c->median[10] > 4 * c->median[0]); /* 1024x the bytes */
        CU_ASSERT_EQUAL(c->fit.bandwidth, r.copy[0].fit.bandwidth);
    }
    printf("  memcpy fit: %.2f GB/s, latency %.3g us, R2 %.4f over %d sizes\n",
           r.copy[0].fit.bandwidth / 1e9, r.copy[0].fit.latency * 1e6, r.copy[0].fit.r2,
           r.copy[0].fit.n_points);
    CU_ASSERT_EQUAL_FATAL(r.n_gemm, 1);
    kv_hw_gemm *g = &r.gemm[0];
    CU_ASSERT_STRING_EQUAL(g->name, "gemm");
    CU_ASSERT_EQUAL(g->n_shapes, 2);
    CU_ASSERT_EQUAL(g->m[0], 16);
    CU_ASSERT_EQUAL(g->m[1], 64);
    CU_ASSERT_EQUAL(g->k[0], 64); /* h = dim */
    CU_ASSERT_EQUAL(g->n[0], 32); /* h_kv = 4 * 8 */
    double peak = 0;
    for (int s = 0; s < g->n_shapes; s++) {
        CU_ASSERT(g->median[s] > 0);
        REL_CLOSE(g->flops_per_s[s], 2.0 * g->m[s] * g->n[s] * g->k[s] / g->median[s], 1e-12);
        if (g->flops_per_s[s] > peak) peak = g->flops_per_s[s];
    }
    CU_ASSERT_EQUAL(g->peak_flops_per_s, peak);
    CU_ASSERT(peak > 1e7);
    printf("  sgemm peak %.2f GFLOP/s\n", peak / 1e9);
    CU_ASSERT(r.elapsed_s < 5.0);
    kv_hw_result_free(&r);
    CU_ASSERT_EQUAL(r.n_copy, 0);
    kv_hw_result_free(&r); /* twice is harmless */
}

static void test_bad_options(void) {
    kv_hw_opts o;
    kv_hw_opts_default(&o, 1);
    kv_hw_result r;
    memset(&r, 0, sizeof r);
    kv_error err = {0, ""};
    CU_ASSERT_EQUAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_EINPUT); /* no shape */
    CU_ASSERT(strstr(err.msg, "no model config") != NULL);
    o.h = 32;
    o.h_kv = 16;
    o.n_bl = 0;
    CU_ASSERT_EQUAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_EINPUT);
    kv_hw_opts_default(&o, 1);
    o.h = 32;
    o.h_kv = 16;
    o.max_bytes = o.min_bytes; /* a single size cannot be fitted */
    CU_ASSERT_EQUAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "at least 2") != NULL);
    kv_hw_opts_default(&o, 1);
    o.h = 32;
    o.h_kv = 16;
    o.repeats = 0;
    CU_ASSERT_EQUAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_EINPUT);
    o.repeats = 3;
    o.gemm_repeats = KV_HW_MAX_REPEATS + 1;
    CU_ASSERT_EQUAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "repeats must be 1..64") != NULL);
    CU_ASSERT_EQUAL(r.n_copy, 0);
}

static void test_fixed_fit_range(void) {
    kv_hw_opts o;
    kv_hw_opts_default(&o, 1);
    o.no_cuda = 1;
    o.h = 32;
    o.h_kv = 16;
    o.fit_min_bytes = (size_t)1 << 20; /* 1, 2, 4 MiB */
    kv_hw_result r;
    memset(&r, 0, sizeof r);
    kv_error err = {0, ""};
    CU_ASSERT_EQUAL_FATAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL(r.copy[0].fit.n_points, 3);
    CU_ASSERT_EQUAL(r.copy[0].fit.fit_min_bytes, 1048576.0);
    kv_hw_result_free(&r);
}

static void test_memcpy_bandwidth(void) {
    kv_error err = {0, ""};
    double gbps = kv_hw_memcpy_bandwidth((size_t)1 << 20, 3, &err);
    printf("\n  memcpy 1 MiB: %.2f GB/s\n", gbps);
    CU_ASSERT(gbps > 0.1 && gbps < 10000);
    CU_ASSERT_EQUAL(kv_hw_memcpy_bandwidth(0, 3, &err), 0.0);
    CU_ASSERT_EQUAL(err.code, KV_EINPUT);
    CU_ASSERT_EQUAL(kv_hw_memcpy_bandwidth(4096, 0, &err), 0.0);
}

static void test_cuda_probes(void) {
    char why[256] = "";
    int ndev = kv_cuda_device_count(why);
    size_t sizes[3] = {4096, 1 << 20, 4 << 20};
    double times[9];
    int m[2] = {16, 256}, n[2] = {256, 256}, k[2] = {512, 512};
    double gt[4];
    kv_error err = {0, ""};
    if (ndev == 0) {
        printf("\n  skipped: no CUDA device (%s)\n", why);
        /* Without a device the probes fail cleanly with a message. */
        CU_ASSERT_NOT_EQUAL(
            kv_cuda_probe_copy(0, KV_CUDA_H2D_PINNED, sizes, 3, 3, times, NULL, &err), KV_OK);
        CU_ASSERT(err.msg[0] != '\0');
        err.msg[0] = '\0';
        CU_ASSERT_NOT_EQUAL(kv_cuda_probe_gemm(0, KV_CUDA_FP16, m, n, k, 2, 2, gt, NULL, &err),
                            KV_OK);
        CU_ASSERT(err.msg[0] != '\0');
        return;
    }
    for (int kind = KV_CUDA_H2D_PINNED; kind <= KV_CUDA_D2D; kind++) {
        CU_ASSERT_EQUAL_FATAL(
            kv_cuda_probe_copy(0, (kv_cuda_copy_kind)kind, sizes, 3, 3, times, NULL, &err), KV_OK);
        for (int i = 0; i < 9; i++) CU_ASSERT(times[i] > 0 && times[i] < 1.0);
        CU_ASSERT(times[8] > times[0]);
    }
    CU_ASSERT_EQUAL_FATAL(kv_cuda_probe_gemm(0, KV_CUDA_FP32, m, n, k, 2, 2, gt, NULL, &err),
                          KV_OK);
    for (int i = 0; i < 4; i++) CU_ASSERT(gt[i] > 0);
    CU_ASSERT_EQUAL_FATAL(kv_cuda_probe_gemm(0, KV_CUDA_FP16, m, n, k, 2, 2, gt, NULL, &err),
                          KV_OK);
    CU_ASSERT_EQUAL(kv_cuda_probe_copy(0, KV_CUDA_D2D, sizes, 0, 3, times, NULL, &err), KV_EINPUT);

    kv_hw_opts o;
    kv_hw_opts_default(&o, 1);
    o.h = 512;
    o.h_kv = 128;
    kv_hw_result r;
    memset(&r, 0, sizeof r);
    CU_ASSERT_EQUAL_FATAL(kv_hw_probe(NULL, &o, &r, NULL, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(r.kind, "cuda");
    CU_ASSERT_EQUAL(r.n_copy, 6); /* copy_host + 5 device directions */
    CU_ASSERT_STRING_EQUAL(r.copy[1].name, "copy_h2d");
    CU_ASSERT_STRING_EQUAL(r.copy[5].name, "copy_d2d");
    CU_ASSERT(r.n_gemm >= 3); /* gemm, gemm_fp32, gemm_fp16 (+ bf16 on sm_80+) */
    for (int i = 0; i < r.n_copy; i++) CU_ASSERT(r.copy[i].fit.bandwidth > 0);
    printf("\n  CUDA %s: h2d %.2f GB/s, d2d %.2f GB/s\n", r.device_name,
           r.copy[1].fit.bandwidth / 1e9, r.copy[5].fit.bandwidth / 1e9);
    kv_hw_result_free(&r);
}

/* Collects dataset paths from kv_h5_list_datasets. */
typedef struct {
    char paths[64][96];
    int n;
} path_list;
static void collect(void *user, const char *path) {
    path_list *l = user;
    if (l->n < 64) snprintf(l->paths[l->n++], sizeof l->paths[0], "%s", path);
}
static int has_path(const path_list *l, const char *p) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->paths[i], p)) return 1;
    return 0;
}

static void check_units(kv_h5 *f, const char *ds, const char *units) {
    char *u = NULL;
    kv_error err = {0, ""};
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_attr_str(f, ds, "units", &u, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(u, units);
    free(u);
}

static void test_write_and_read(void) {
    kv_hw_opts o;
    kv_hw_opts_default(&o, 1);
    o.no_cuda = 1;
    kv_config cfg = tiny_cfg();
    const char *path = tu_tmp("hw_profile.h5");
    kv_error err = {0, ""};
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_write_provenance(f, "test_hwprobe", NULL, &err), KV_OK);
    int rc = kv_hw_probe_and_write(f, &cfg, &o, NULL, &err);
    if (rc) {
        fprintf(stderr, "probe_and_write: %s\n", err.msg);
        kv_h5_abort(f);
    }
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);

    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    path_list l;
    memset(&l, 0, sizeof l);
    CU_ASSERT_EQUAL(kv_h5_list_datasets(f, collect, &l, &err), KV_OK);
    const char *groups[4] = {"copy_host", "copy_h2d", "copy_d2h", "copy_d2d"};
    char p[128];
    for (int i = 0; i < 4; i++) {
        static const char *ds[3] = {"bytes", "samples", "median"};
        static const char *units[3] = {"bytes", "s", "s"};
        for (int d = 0; d < 3; d++) {
            snprintf(p, sizeof p, "/hardware/%s/%s", groups[i], ds[d]);
            CU_ASSERT(has_path(&l, p));
            check_units(f, p, units[d]);
        }
        snprintf(p, sizeof p, "/hardware/%s/samples", groups[i]);
        int rank = 0;
        long dims[KV_H5_MAX_RANK];
        double *v = NULL;
        CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, p, &rank, dims, &v, &err), KV_OK);
        CU_ASSERT_EQUAL(rank, 2);
        CU_ASSERT_EQUAL(dims[0], 11);
        CU_ASSERT_EQUAL(dims[1], 5);
        for (int k = 0; k < 55; k++) CU_ASSERT(v[k] > 0);
        free(v);
        snprintf(p, sizeof p, "/hardware/%s", groups[i]);
        double bw = 0, lat = 0, r2 = -1, fmin = 0;
        long npts = 0;
        CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, p, "bandwidth", &bw, &err), KV_OK);
        CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, p, "latency", &lat, &err), KV_OK);
        CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, p, "r2", &r2, &err), KV_OK);
        CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, p, "fit_min_bytes", &fmin, &err), KV_OK);
        CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, p, "fit_points", &npts, &err), KV_OK);
        CU_ASSERT(bw > 1e8);
        CU_ASSERT(isfinite(lat));
        CU_ASSERT(r2 >= 0 && r2 <= 1);
        CU_ASSERT(fmin >= 4096 && fmin <= 4194304);
        CU_ASSERT(npts >= 3 && npts <= 11);
        CU_ASSERT(kv_h5_attr_exists(f, p, "bandwidth_units"));
        CU_ASSERT(kv_h5_attr_exists(f, p, "latency_units"));
        CU_ASSERT(kv_h5_attr_exists(f, p, "bandwidth_stderr"));
        CU_ASSERT(kv_h5_attr_exists(f, p, "source"));
    }
    static const char *gds[6] = {"m", "n", "k", "samples", "median", "flops_per_s"};
    for (int d = 0; d < 6; d++) {
        snprintf(p, sizeof p, "/hardware/gemm/%s", gds[d]);
        CU_ASSERT(has_path(&l, p));
    }
    check_units(f, "/hardware/gemm/flops_per_s", "FLOP/s");
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    int *mm = NULL, *kk = NULL, *nn = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/hardware/gemm/m", &rank, dims, &mm, &err), KV_OK);
    CU_ASSERT_EQUAL(dims[0], 2);
    CU_ASSERT_EQUAL(mm[0], 16);
    CU_ASSERT_EQUAL(mm[1], 64);
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/hardware/gemm/k", &rank, dims, &kk, &err), KV_OK);
    CU_ASSERT_EQUAL(kk[0], 64);
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/hardware/gemm/n", &rank, dims, &nn, &err), KV_OK);
    CU_ASSERT_EQUAL(nn[1], 32);
    free(mm);
    free(kk);
    free(nn);
    double peak = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/hardware/gemm", "peak_flops_per_s", &peak, &err),
                    KV_OK);
    CU_ASSERT(peak > 1e7);
    CU_ASSERT(!kv_h5_exists(f, "/hardware/gemm_fp16"));
    CU_ASSERT(!kv_h5_exists(f, "/hardware/copy_h2d_pageable"));
    char *kind = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/hardware", "kind", &kind, &err), KV_OK);
    CU_ASSERT_STRING_EQUAL(kind ? kind : "", "cpu");
    free(kind);
    long mem = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/hardware", "device_mem_bytes", &mem, &err), KV_OK);
    CU_ASSERT(mem > (1L << 28));
    CU_ASSERT(kv_h5_attr_exists(f, "/hardware", "device_name"));

    kv_hw_rates rates;
    CU_ASSERT_EQUAL_FATAL(kv_hw_read_rates(f, &rates, &err), KV_OK);
    double h2d = 0, d2d = 0;
    kv_h5_read_attr_f64(f, "/hardware/copy_h2d", "bandwidth", &h2d, &err);
    kv_h5_read_attr_f64(f, "/hardware/copy_d2d", "bandwidth", &d2d, &err);
    CU_ASSERT_STRING_EQUAL(rates.kind, "cpu");
    CU_ASSERT_EQUAL(rates.v_com, h2d);
    CU_ASSERT_EQUAL(rates.v_gpu, peak);
    CU_ASSERT_STRING_EQUAL(rates.v_gpu_source, "gemm");
    CU_ASSERT_EQUAL(rates.copy_d2d_bandwidth, d2d);
    CU_ASSERT_EQUAL(rates.mem_bw, 2 * d2d);
    CU_ASSERT_EQUAL(rates.device_mem_bytes, mem);
    kv_h5_close(f);
}

static void test_read_without_hardware(void) {
    const char *path = tu_tmp("no_hw.h5");
    kv_error err = {0, ""};
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_write_provenance(f, "test", NULL, &err), KV_OK);
    double x[2] = {1, 2};
    long d = 2;
    CU_ASSERT_EQUAL_FATAL(kv_h5_write_f64(f, "/layers/similarity", 1, &d, x, NULL, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    kv_hw_rates rates;
    CU_ASSERT_EQUAL(kv_hw_read_rates(f, &rates, &err), KV_EINPUT);
    CU_ASSERT(strstr(err.msg, "no_hw.h5") != NULL);
    CU_ASSERT(strstr(err.msg, "--no-hw") != NULL);
    kv_h5_close(f);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"fit recovers an exact line", test_fit_exact},
        {"fit with noise, R2 in [0,1]", test_fit_noise},
        {"fit errors", test_fit_errors},
        {"median", test_median},
        {"linear part of a sweep", test_linear_start},
        {"quick host probe", test_quick_probe},
        {"bad options", test_bad_options},
        {"fixed fit range", test_fixed_fit_range},
        {"memcpy bandwidth helper", test_memcpy_bandwidth},
        {"write /hardware and read the rates back", test_write_and_read},
        {"profile without /hardware", test_read_without_hardware},
        {"CUDA probes (device only)", test_cuda_probes},
    };
    return tu_main(argc, argv, "hwprobe", tests, sizeof tests / sizeof tests[0]);
}
