/* kvplan hardware probes: the `/hardware` part of profile.h5 (docs/design.md "Profiling",
 * docs/hardware-schema.md).
 *
 * On every machine: host memcpy time at sizes from 4 KiB to 1 GiB and CBLAS sgemm throughput
 * at the KV-recomputation shapes C[b*l, h_kv] = X[b*l, h] x W[h, h_kv]; each sample the median
 * of several repeats. With a CUDA device (cuda/, see kvcuda.h): host->device and device->host
 * copies (pinned and pageable), device->device copies, cuBLAS GEMM in FP32/FP16/BF16, and the
 * device's name and memory. Each copy sweep is fitted with `time = latency + bytes / bandwidth`
 * by ordinary least squares (GSL gsl_fit_linear) on its linear part (kv_hw_linear_start).
 *
 * Units everywhere: bytes, seconds, bytes/s, FLOP/s (1 FLOP = one multiply or one add, so a
 * GEMM costs 2*m*n*k).
 *
 * Typical use by `kvplan profile`:
 *     kv_hw_opts o; kv_hw_opts_default(&o, 0);
 *     o.no_cuda = ...;
 *     kv_hw_probe_and_write(h5file, &model->cfg, &o, &progress, &err);
 * and by the planner:
 *     kv_hw_rates r; kv_hw_read_rates(h5file, &r, &err);   // v_com, v_gpu, mem_bw
 */
#ifndef KVPLAN_HWPROBE_H
#define KVPLAN_HWPROBE_H

#include <stddef.h>

#include "kvplan/common.h"
#include "kvplan/h5io.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

#define KV_HW_MAX_SIZES 48   /* copy sizes per sweep */
#define KV_HW_MAX_SHAPES 16  /* GEMM shapes (b*l values) */
#define KV_HW_MAX_COPY 6     /* copy groups in one result */
#define KV_HW_MAX_GEMM 4     /* GEMM groups in one result */
#define KV_HW_MAX_REPEATS 64 /* samples per size or shape */

/* Probe options. Fill with kv_hw_opts_default, then adjust. Sizes are powers of two from
 * min_bytes to max_bytes (both rounded to powers of two). */
typedef struct kv_hw_opts {
    size_t min_bytes;         /* smallest copy, bytes (default 4 KiB) */
    size_t max_bytes;         /* largest copy, bytes (default 1 GiB; quick: 4 MiB) */
    int repeats;              /* samples per copy size, 1..64 (default 9; quick: 5) */
    int gemm_repeats;         /* samples per GEMM shape, 1..64 (default 5; quick: 3) */
    int n_bl;                 /* number of b*l values (GEMM row counts m) */
    int bl[KV_HW_MAX_SHAPES]; /* b*l values: default 16, 64, 256, 1024, 2048; quick: 16, 64 */
    int h, h_kv;              /* GEMM k and n; 0 = take h = dim and h_kv = n_kv_heads*head_dim
                                 from the model config given to kv_hw_probe */
    double min_sample_s;      /* a host sample repeats the operation until it lasts at least this
                                 long and reports the time per operation (default 200 us; quick
                                 20 us) */
    size_t fit_min_bytes;     /* 0 = choose the linear part automatically (kv_hw_linear_start);
                                 else fit the sizes >= this */
    double fit_tol;           /* knee tolerance of kv_hw_linear_start (default 0.10) */
    int no_cuda;              /* 1 = host probes only even when a CUDA device exists */
    int device;               /* CUDA device index (default 0) */
    int quick;                /* set by kv_hw_opts_default(o, 1): small sizes, for tests (< 1 s) */
} kv_hw_opts;

/* Fill `o` with the defaults (quick = 0: 4 KiB..1 GiB, < ~20 s on a 2-core host without GPU;
 * quick = 1: 4 KiB..4 MiB, fewer repeats, < 1 s). Never fails. */
void kv_hw_opts_default(kv_hw_opts *o, int quick);

/* A least-squares line time = latency + bytes / bandwidth. */
typedef struct kv_hw_fit {
    double bandwidth;     /* bytes/s = 1 / slope */
    double latency;       /* s = intercept (may come out slightly negative on noisy data) */
    double r2;            /* coefficient of determination in [0, 1] */
    double bandwidth_se;  /* bytes/s, standard error of bandwidth (from GSL's covariance of the
                             slope, delta method); NaN with 2 points */
    double latency_se;    /* s, standard error of latency; NaN with 2 points. Large when the
                             linear part starts at sizes whose timing jitter exceeds the fixed
                             cost (host memcpy: the line starts beyond the last-level cache) */
    double fit_min_bytes; /* smallest size used by the fit, bytes */
    int n_points;         /* sizes used by the fit */
} kv_hw_fit;

/* One copy sweep, a group /hardware/<name>. Arrays owned by the result. */
typedef struct kv_hw_copy {
    char name[32];   /* group name: copy_host, copy_h2d, copy_h2d_pageable, ... */
    char source[96]; /* what was timed, e.g. "memcpy (host)", "cudaMemcpyAsync pinned" */
    char timer[32];  /* "clock_gettime" or "cudaEvent" */
    int n_sizes, repeats;
    double *bytes;   /* [n_sizes] bytes per copy, ascending */
    double *samples; /* [n_sizes * repeats] seconds, row-major [size][repeat] */
    double *median;  /* [n_sizes] seconds */
    kv_hw_fit fit;
} kv_hw_copy;

/* One GEMM sweep, a group /hardware/<name>: C[m,n] = A[m,k] B[k,n]. Arrays owned. */
typedef struct kv_hw_gemm {
    char name[32];   /* gemm (CBLAS sgemm), gemm_fp32, gemm_fp16, gemm_bf16 (cuBLAS) */
    char source[64]; /* "cblas_sgemm" or "cublasGemmEx" */
    char dtype[8];   /* "fp32", "fp16", "bf16" (inputs and output; fp32 accumulation) */
    int n_shapes, repeats;
    int *m, *n, *k;          /* [n_shapes] */
    double *samples;         /* [n_shapes * repeats] seconds */
    double *median;          /* [n_shapes] seconds */
    double *flops_per_s;     /* [n_shapes] 2*m*n*k / median */
    double peak_flops_per_s; /* max of flops_per_s */
} kv_hw_gemm;

/* Everything /hardware holds. Zero-initialise before kv_hw_probe; free with
 * kv_hw_result_free. */
typedef struct kv_hw_result {
    char kind[8];          /* "cuda" or "cpu" */
    char device_name[256]; /* CUDA device name, or the host CPU model */
    long device_mem_bytes; /* device memory, or host RAM on cpu */
    char host_name[256];   /* host CPU model (both kinds) */
    long host_mem_bytes;   /* host RAM */
    int n_copy;
    kv_hw_copy copy[KV_HW_MAX_COPY];
    int n_gemm;
    kv_hw_gemm gemm[KV_HW_MAX_GEMM];
    double elapsed_s; /* wall time of the whole probe */
} kv_hw_result;

/* Release the arrays of `r` and zero it. Safe on a zeroed or partly filled result. */
void kv_hw_result_free(kv_hw_result *r);

/* Median of v[0..n-1] (n >= 1) without modifying v (copies into `scratch`, n doubles, which
 * may be NULL for n <= 64). Mean of the two middle values when n is even. Returns NaN for
 * n < 1. */
double kv_hw_median(const double *v, int n, double *scratch);

/* Least-squares fit time = latency + bytes / bandwidth over the n points (x = bytes[i],
 * y = seconds[i]) with GSL gsl_fit_linear (unweighted). r2 = 1 - SS_res / SS_tot (1 when the
 * points lie exactly on the line). Errors: KV_EINPUT when n < 2, a value is not finite, all
 * bytes are equal, or the slope is not positive (time does not grow with size, so there is
 * no bandwidth). out->fit_min_bytes = smallest x, out->n_points = n. */
int kv_hw_fit_linear(const double *bytes, const double *seconds, int n, kv_hw_fit *out,
                     kv_error *err);

/* The start of the linear part of a copy sweep: the smallest index s such that every size
 * from s on has a per-byte time median[i] / bytes[i] within `tol` (relative) of the largest
 * size's per-byte time. Below it the copy either runs from a cache (faster per byte: host
 * memcpy under the last-level cache, device copies under L2) or is dominated by a fixed
 * cost; the bandwidth that matters for the planner is the streaming one. At least
 * `min_points` (>= 2) sizes are kept: the result is at most n - min_points (0 when n is
 * smaller). bytes ascending. */
int kv_hw_linear_start(const double *bytes, const double *median, int n, double tol,
                       int min_points);

/* Fill r->copy[...]/gemm[...] by measuring. Host: memcpy sweep (copy_host; on cpu also
 * copy_h2d, copy_d2h, copy_d2d holding the same samples), CBLAS sgemm (gemm). CUDA, when
 * kv_cuda_device_count() > 0 and !o->no_cuda: copy_h2d, copy_h2d_pageable, copy_d2h,
 * copy_d2h_pageable, copy_d2d (device sizes capped at a quarter of device memory), gemm_fp32,
 * gemm_fp16, gemm_bf16 (a type the device cannot run is left out with a warning). Host sizes
 * are capped at a quarter of host RAM (two buffers of the largest size are allocated).
 * `cfg` gives h and h_kv unless o->h/o->h_kv are set (may be NULL then); `o` NULL = defaults.
 * `p` (may be NULL) gets progress lines on stderr. `r` is overwritten (any previous contents
 * are not freed); on error it is left freed and zeroed. Errors: KV_EINPUT for bad options,
 * KV_EINTERNAL for allocation or CUDA failures (the message names the probe). */
int kv_hw_probe(const kv_config *cfg, const kv_hw_opts *o, kv_hw_result *r, kv_progress *p,
                kv_error *err);

/* Write `r` as group /hardware of the open file `f` (docs/hardware-schema.md): group
 * attributes kind, device_name, device_mem_bytes, host_name, host_mem_bytes, elapsed_s; copy
 * groups with bytes, samples, median and fit attributes; GEMM groups with m, n, k, samples,
 * median, flops_per_s and peak_flops_per_s. Errors from h5io are passed on with context. */
int kv_hw_write(kv_h5 *f, const kv_hw_result *r, kv_error *err);

/* kv_hw_probe + kv_hw_write + kv_hw_result_free: what `kvplan profile` calls. */
int kv_hw_probe_and_write(kv_h5 *f, const kv_config *cfg, const kv_hw_opts *o, kv_progress *p,
                          kv_error *err);

/* What the planner needs from /hardware (docs/design.md "Planning" 5 and 6). */
typedef struct kv_hw_rates {
    char kind[8]; /* "cuda" or "cpu" */
    char device_name[256];
    long device_mem_bytes;
    double v_com;              /* bytes/s: copy_h2d@bandwidth (host->device, pinned) */
    double com_latency;        /* s: copy_h2d@latency */
    double v_gpu;              /* FLOP/s: gemm_fp16@peak_flops_per_s, else gemm@peak */
    char v_gpu_source[32];     /* the group v_gpu came from */
    double copy_d2d_bandwidth; /* bytes/s: copy_d2d@bandwidth (bytes copied per second) */
    double mem_bw;             /* bytes/s of memory traffic = 2 * copy_d2d_bandwidth (a copy reads
                                  and writes every byte), for decode-throughput estimates */
} kv_hw_rates;

/* Read the rates from an open profile (kv_h5_open_read). KV_EINPUT names the file and the
 * missing group or attribute (e.g. a profile made with --no-hw has no /hardware). */
int kv_hw_read_rates(kv_h5 *f, kv_hw_rates *out, kv_error *err);

/* Host memcpy bandwidth in GB/s (1e9 bytes copied per second; the memory traffic is twice
 * that) for copies of `bytes` bytes: the median over `repeats` (>= 1) samples, each at least
 * 1 ms long. For benchmarks to compare against. Returns a value > 0, or 0 with `err` filled
 * (KV_EINPUT for bytes == 0 or repeats < 1, KV_EINTERNAL when out of memory). */
double kv_hw_memcpy_bandwidth(size_t bytes, int repeats, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
