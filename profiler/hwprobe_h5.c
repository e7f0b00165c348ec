/* The /hardware group of profile.h5: writer and the planner's reader
 * (include/kvplan/hwprobe.h, docs/hardware-schema.md). All HDF5 access goes through h5io. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/hwprobe.h"

#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) return kv_fail_context(err, "writing /hardware to %s", kv_h5_path(f));            \
    } while (0)

static int write_copy(kv_h5 *f, const kv_hw_copy *c, kv_error *err) {
    char g[96], d[128];
    snprintf(g, sizeof g, "/hardware/%s", c->name);
    long dims[2] = {c->n_sizes, c->repeats};
    snprintf(d, sizeof d, "%s/bytes", g);
    TRY(kv_h5_write_f64(f, d, 1, dims, c->bytes, "bytes", err));
    snprintf(d, sizeof d, "%s/samples", g);
    TRY(kv_h5_write_f64(f, d, 2, dims, c->samples, "s", err));
    snprintf(d, sizeof d, "%s/median", g);
    TRY(kv_h5_write_f64(f, d, 1, dims, c->median, "s", err));
    TRY(kv_h5_attr_f64(f, g, "bandwidth", c->fit.bandwidth, err));
    TRY(kv_h5_attr_str(f, g, "bandwidth_units", "bytes/s", err));
    TRY(kv_h5_attr_f64(f, g, "latency", c->fit.latency, err));
    TRY(kv_h5_attr_str(f, g, "latency_units", "s", err));
    TRY(kv_h5_attr_f64(f, g, "r2", c->fit.r2, err));
    TRY(kv_h5_attr_f64(f, g, "bandwidth_stderr", c->fit.bandwidth_se, err));
    TRY(kv_h5_attr_f64(f, g, "latency_stderr", c->fit.latency_se, err));
    TRY(kv_h5_attr_f64(f, g, "fit_min_bytes", c->fit.fit_min_bytes, err));
    TRY(kv_h5_attr_i64(f, g, "fit_points", c->fit.n_points, err));
    TRY(kv_h5_attr_str(f, g, "fit",
                       "time = latency + bytes / bandwidth, ordinary least squares "
                       "(GSL gsl_fit_linear) of median vs bytes over bytes >= fit_min_bytes",
                       err));
    TRY(kv_h5_attr_str(f, g, "source", c->source, err));
    TRY(kv_h5_attr_str(f, g, "timer", c->timer, err));
    return KV_OK;
}

static int write_gemm(kv_h5 *f, const kv_hw_gemm *m, kv_error *err) {
    char g[96], d[128];
    snprintf(g, sizeof g, "/hardware/%s", m->name);
    long dims[2] = {m->n_shapes, m->repeats};
    snprintf(d, sizeof d, "%s/m", g);
    TRY(kv_h5_write_i32(f, d, 1, dims, m->m, NULL, err));
    snprintf(d, sizeof d, "%s/n", g);
    TRY(kv_h5_write_i32(f, d, 1, dims, m->n, NULL, err));
    snprintf(d, sizeof d, "%s/k", g);
    TRY(kv_h5_write_i32(f, d, 1, dims, m->k, NULL, err));
    snprintf(d, sizeof d, "%s/samples", g);
    TRY(kv_h5_write_f64(f, d, 2, dims, m->samples, "s", err));
    snprintf(d, sizeof d, "%s/median", g);
    TRY(kv_h5_write_f64(f, d, 1, dims, m->median, "s", err));
    snprintf(d, sizeof d, "%s/flops_per_s", g);
    TRY(kv_h5_write_f64(f, d, 1, dims, m->flops_per_s, "FLOP/s", err));
    TRY(kv_h5_attr_f64(f, g, "peak_flops_per_s", m->peak_flops_per_s, err));
    TRY(kv_h5_attr_str(f, g, "peak_flops_per_s_units", "FLOP/s", err));
    TRY(kv_h5_attr_str(f, g, "shape",
                       "C[m,n] = A[m,k] B[k,n]: m = b*l, k = h, n = h_kv; FLOPs = 2*m*n*k", err));
    TRY(kv_h5_attr_str(f, g, "dtype", m->dtype, err));
    TRY(kv_h5_attr_str(f, g, "source", m->source, err));
    return KV_OK;
}

int kv_hw_write(kv_h5 *f, const kv_hw_result *r, kv_error *err) {
    if (r->n_copy < 1 || r->n_gemm < 1)
        return kv_fail(err, KV_EINTERNAL, "writing /hardware to %s: the probe result is empty",
                       kv_h5_path(f));
    for (int i = 0; i < r->n_copy; i++) {
        int rc = write_copy(f, &r->copy[i], err);
        if (rc) return rc;
    }
    for (int i = 0; i < r->n_gemm; i++) {
        int rc = write_gemm(f, &r->gemm[i], err);
        if (rc) return rc;
    }
    const char *g = "/hardware";
    TRY(kv_h5_attr_str(f, g, "kind", r->kind, err));
    TRY(kv_h5_attr_str(f, g, "device_name", r->device_name, err));
    TRY(kv_h5_attr_i64(f, g, "device_mem_bytes", r->device_mem_bytes, err));
    TRY(kv_h5_attr_str(f, g, "host_name", r->host_name, err));
    TRY(kv_h5_attr_i64(f, g, "host_mem_bytes", r->host_mem_bytes, err));
    TRY(kv_h5_attr_f64(f, g, "elapsed_s", r->elapsed_s, err));
    return KV_OK;
}

int kv_hw_probe_and_write(kv_h5 *f, const kv_config *cfg, const kv_hw_opts *o, kv_progress *p,
                          kv_error *err) {
    kv_hw_result r;
    memset(&r, 0, sizeof r);
    int rc = kv_hw_probe(cfg, o, &r, p, err);
    if (rc) return rc;
    rc = kv_hw_write(f, &r, err);
    kv_hw_result_free(&r);
    return rc;
}

/* Read attribute `name` of `obj`; KV_EINPUT naming the file when missing. */
static int read_f64(kv_h5 *f, const char *obj, const char *name, double *v, kv_error *err) {
    if (!kv_h5_exists(f, obj) || !kv_h5_attr_exists(f, obj, name))
        return kv_fail(err, KV_EINPUT,
                       "%s: %s has no attribute %s (a profile without hardware "
                       "measurements? re-run kvplan profile without --no-hw)",
                       kv_h5_path(f), obj, name);
    int rc = kv_h5_read_attr_f64(f, obj, name, v, err);
    if (rc) return kv_fail_context(err, "%s: reading %s@%s", kv_h5_path(f), obj, name);
    return KV_OK;
}

int kv_hw_read_rates(kv_h5 *f, kv_hw_rates *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    if (!kv_h5_exists(f, "/hardware"))
        return kv_fail(err, KV_EINPUT,
                       "%s: no /hardware group (the profile was made with "
                       "--no-hw; re-run kvplan profile without it)",
                       kv_h5_path(f));
    char *s = NULL;
    if (kv_h5_read_attr_str(f, "/hardware", "kind", &s, err))
        return kv_fail_context(err, "%s: reading /hardware@kind", kv_h5_path(f));
    if (strcmp(s, "cuda") != 0 && strcmp(s, "cpu") != 0) {
        int rc = kv_fail(err, KV_EINPUT, "%s: /hardware@kind is \"%s\", expected cuda or cpu",
                         kv_h5_path(f), s);
        free(s);
        return rc;
    }
    snprintf(out->kind, sizeof out->kind, "%s", s);
    free(s);
    s = NULL;
    if (kv_h5_read_attr_str(f, "/hardware", "device_name", &s, err))
        return kv_fail_context(err, "%s: reading /hardware@device_name", kv_h5_path(f));
    snprintf(out->device_name, sizeof out->device_name, "%s", s);
    free(s);
    if (kv_h5_read_attr_i64(f, "/hardware", "device_mem_bytes", &out->device_mem_bytes, err))
        return kv_fail_context(err, "%s: reading /hardware@device_mem_bytes", kv_h5_path(f));
    int rc = read_f64(f, "/hardware/copy_h2d", "bandwidth", &out->v_com, err);
    if (!rc) rc = read_f64(f, "/hardware/copy_h2d", "latency", &out->com_latency, err);
    if (!rc) rc = read_f64(f, "/hardware/copy_d2d", "bandwidth", &out->copy_d2d_bandwidth, err);
    if (rc) return rc;
    const char *gemm = kv_h5_exists(f, "/hardware/gemm_fp16") ? "gemm_fp16" : "gemm";
    char obj[64];
    snprintf(obj, sizeof obj, "/hardware/%s", gemm);
    rc = read_f64(f, obj, "peak_flops_per_s", &out->v_gpu, err);
    if (rc) return rc;
    snprintf(out->v_gpu_source, sizeof out->v_gpu_source, "%s", gemm);
    out->mem_bw = 2.0 * out->copy_d2d_bandwidth;
    if (!(out->v_com > 0) || !(out->v_gpu > 0) || !(out->mem_bw > 0))
        return kv_fail(err, KV_EINPUT,
                       "%s: /hardware holds non-positive rates (v_com %g B/s, "
                       "v_gpu %g FLOP/s, memory %g B/s)",
                       kv_h5_path(f), out->v_com, out->v_gpu, out->mem_bw);
    return KV_OK;
}
