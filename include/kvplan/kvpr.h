/* kvplan KVPR split: how much of an offloaded KV cache to recompute from activations on the
 * device instead of transferring it, and the hardware figures (profiled or published presets)
 * the cost model needs. Part of the planner module (planner/kvpr.c, planner/hwpresets.c);
 * batch sizing and the KV memory arithmetic are in kvplan/batch.h.
 *
 * Cost model (KVPR, Jiang et al., Eq. 6-11), generalised to grouped-query attention (GQA)
 * as in docs/design.md Planning 5. For batch b, current length s' (tokens whose K and V live in
 * host memory), hidden size h, KV width h_kv = H_kv * d_h and element bytes p, with split
 * point l (the first l tokens are recomputed, 0 <= l <= s'):
 *   M_X(l)  = b * l * h * p              bytes of activations X[0:l] sent     (Eq. 6)
 *   M_KV(l) = 2 * b * (s' - l) * h_kv * p bytes of K, V [l:s'] sent           (Eq. 6, GQA)
 *   N(l)    = 4 * b * l * h * h_kv       FLOPs of K = X W_K, V = X W_V        (Eq. 7-8, GQA)
 *   column-by-column:  t(l) = M_X / v_com + max(N / v_gpu, M_KV / v_com)     (Eq. 9-10)
 *   row-by-row:        t(l) = max(N / v_gpu, M_KV / v_com)  (Eq. 10 without its first term)
 * and l minimises t over the integers 0..s' (Eq. 11). With MHA h_kv = h, so sending a
 * token's activation (h*p bytes) is cheaper than sending its K and V (2*h*p); with GQA
 * h_kv = h / g, and once g >= 2 sending X costs at least as much as sending K and V, so in
 * the column-by-column schedule recomputation never pays and l = 0 is the honest answer.
 *
 * Units: bytes, seconds, bytes/s, FLOP/s throughout. Times are per decoder layer.
 */
#ifndef KVPLAN_KVPR_H
#define KVPLAN_KVPR_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* KVPR §3.2 schedules. Column-by-column sends the activations X[0:l] over the link before
 * recomputation (full Eq. 10); row-by-row keeps them on the device (first term dropped). */
typedef enum { KV_SCHED_COLUMN = 0, KV_SCHED_ROW = 1 } kv_schedule;

/* "column" / "row". */
const char *kv_schedule_name(kv_schedule s);
/* Parse "column", "col", "column-by-column", "row", "row-by-row"; KV_EINPUT names the value. */
int kv_schedule_parse(const char *s, kv_schedule *out, kv_error *err);

/* The shape of one layer's offloaded cache at one decode step. */
typedef struct kv_kvpr_shape {
    long batch;         /* b, sequences, >= 1 */
    long seq;           /* s', tokens held in host memory, >= 1 */
    long hidden;        /* h, model width (size of one activation row), >= 1 */
    long kv_width;      /* h_kv = H_kv * d_h, >= 1 */
    double dtype_bytes; /* p, bytes per element of X, K and V (2 for fp16), > 0 */
    double kv_bytes;    /* bytes per K/V element as the cache stores them, scales included
                         * (the plan's stored bytes per token / (2 L H_kv d_h));
                         * 0 = dtype_bytes */
} kv_kvpr_shape;

/* Which resource bounds t(l): the larger of the two overlapped terms inside the max. */
typedef enum {
    KV_BOUND_TRANSFER = 0, /* M_KV / v_com >= N / v_gpu: the link (PCIe) */
    KV_BOUND_COMPUTE = 1,  /* N / v_gpu > M_KV / v_com: device recomputation */
} kv_kvpr_bound;

/* The answer for one shape. All times in seconds per layer. */
typedef struct kv_kvpr_result {
    long split;               /* l, tokens recomputed from activations (0..s') */
    double time;              /* t(l) */
    double time_no_recompute; /* t(0) = 2 b s' h_kv p / v_com (transfer everything) */
    double t_activations;     /* M_X(l) / v_com (0 in the row-by-row schedule) */
    double t_recompute;       /* N(l) / v_gpu */
    double t_transfer;        /* M_KV(l) / v_com */
    double bytes_activations; /* M_X(l) */
    double bytes_kv;          /* M_KV(l) */
    double flops;             /* N(l) */
    kv_kvpr_bound bound;      /* which term of the max is larger at l */
    int activations_dearer;   /* 1 when (column schedule) sending one token's activation
                                 costs at least as much as sending its K and V: h >= 2 h_kv */
    int glpk_status;          /* glp_mip_status of the solve (GLP_OPT), 0 for closed form */
    char note[256];           /* one human sentence explaining l = 0 or the bound */
} kv_kvpr_result;

/* Check a shape and the two speeds: every size >= 1, p > 0, v_com and v_gpu finite and > 0.
 * KV_EINPUT with a message naming the bad value (e.g. "s' = 0: nothing is offloaded"). */
int kv_kvpr_check(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_error *err);

/* t(l) of Eq. 10 (or its row-by-row form) for a given integer l in 0..s', filling every field
 * of *out except glpk_status (and note, left empty). Pure arithmetic, no solver.
 * KV_EINPUT when the inputs fail kv_kvpr_check or l is outside 0..s'. */
int kv_kvpr_eval(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched, long l,
                 kv_kvpr_result *out, kv_error *err);

/* The split point by GLPK's MIP solver (glp_intopt, presolver on): variables l (integer,
 * 0 <= l <= s') and T (the overlapped part of the step time, continuous); the max of Eq. 10
 * becomes two constraints T >= N(l)/v_gpu and T >= M_KV(l)/v_com, the objective is
 * M_X(l)/v_com + T (column) or T (row). Times are scaled by the per-token KV transfer time
 * before they reach GLPK so that its tolerances act on O(1) numbers; the reported times are
 * re-evaluated exactly with kv_kvpr_eval. Fills *out including glpk_status and note.
 * Errors: KV_EINPUT for bad inputs (kv_kvpr_check); KV_EINTERNAL when GLPK fails, with
 * glp_intopt's return code and glp_mip_status named in the message. */
int kv_kvpr_solve(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched,
                  kv_kvpr_result *out, kv_error *err);

/* The error kv_kvpr_solve reports when GLPK fails: KV_EINTERNAL with glp_intopt's return code
 * (e.g. "GLP_ENOPFS (no primal feasible solution)") and glp_mip_status (e.g. "GLP_NOFEAS")
 * spelled out, and `what` naming the solve stage. Returns KV_EINTERNAL. */
int kv_kvpr_glpk_fail(int intopt_ret, int mip_status, const char *what, kv_error *err);

/* The same optimum in closed form, used as a cross-check of the solver. With per-token costs
 * a = b h p / v_com (0 for row), c = 4 b h h_kv / v_gpu, k = 2 b h_kv p / v_com, t(l) =
 * a l + max(c l, k (s' - l)) is piecewise linear and convex: if a >= k it never decreases and
 * l = 0; otherwise the continuous minimum is at l0 = k s' / (c + k), where recomputation and
 * transfer take equal time, and the integer optimum is floor(l0) or ceil(l0), whichever gives
 * the smaller t (the smaller l on a tie). Fills *out (glpk_status = 0) and note. */
int kv_kvpr_closed_form(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched,
                        kv_kvpr_result *out, kv_error *err);

/* ---- hardware figures ---- */

/* What the KVPR split and Batch-Max sizing need to know about a machine. A figure that is
 * unknown is 0. */
typedef struct kv_hw {
    char name[64];     /* preset key, device name from the profile, or "user" */
    double v_com;      /* host->device bandwidth, bytes/s (KVPR v_com) */
    double v_gpu;      /* dense FLOP/s for the recomputation GEMMs (KVPR v_gpu) */
    double mem_bw;     /* device memory bandwidth, bytes/s (decode throughput) */
    double device_mem; /* device memory, bytes */
    char source[160];  /* where the figures come from (datasheet, profile path) */
} kv_hw;

/* Published figures of one accelerator (see planner/hwpresets.c for the table and sources). */
typedef struct kv_hw_preset {
    const char *key;         /* "h100-sxm", "h200", "a100-40g-pcie4", "l4" */
    const char *description; /* full product name and link */
    double device_mem;       /* bytes */
    double mem_bw;           /* bytes/s */
    double v_com;            /* bytes/s, host->device, one direction of the PCIe link */
    double v_gpu;            /* dense FP16/BF16 tensor-core FLOP/s (no sparsity) */
    const char *source;      /* datasheet the numbers come from */
} kv_hw_preset;

/* The preset table: *n receives its length. Static, read-only storage. */
const kv_hw_preset *kv_hw_presets(int *n);
/* Fill *out from the preset named `key`. KV_EINPUT lists the known keys when it is unknown. */
int kv_hw_from_preset(const char *key, kv_hw *out, kv_error *err);
/* Read the planner's figures from a profile's /hardware group through the profiler's
 * kv_hw_read_rates (docs/hardware-schema.md): v_com = /hardware/copy_h2d@bandwidth, v_gpu =
 * peak_flops_per_s of /hardware/gemm_fp16 when present else /hardware/gemm, mem_bw = the memory
 * traffic rate 2 x /hardware/copy_d2d@bandwidth (a copy reads and writes every byte),
 * device_mem = /hardware@device_mem_bytes, name = device_name (kind). KV_EINPUT names the file
 * when it is not a kvplan file, has no /hardware group or lacks a figure. */
int kv_hw_from_profile(const char *profile_path, kv_hw *out, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
