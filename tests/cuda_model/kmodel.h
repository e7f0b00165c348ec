/* A performance model of kvplan's CUDA kernels that runs without a device (tests and
 * bench_cuda_fake only; not part of the library).
 *
 * Inputs per kernel, from two places:
 *   - what the kernel executes (km_probe, tests/cuda_model/kprobe.cpp): the kernel body runs on
 *     the host shim (tests/support/cuda_shim.hpp) compiled with clang's
 *     -fsanitize-coverage=trace-loads,trace-stores, and every load and store of the kernel's
 *     global buffers is recorded per load site, warp and lane (tests/cuda_model/ktrace.cpp):
 *     the k-th execution of one site by the lanes of one warp is one request; its 32-byte
 *     sectors, the bytes the lanes asked for, and the distinct sectors of the whole launch (the
 *     DRAM traffic, every byte fetched once) are counted, at a small shape, then scaled to
 *     the full grid;
 *   - the compiled code (km_code_find, tests/cuda_model/kernel_code.inc, written by
 *     scripts/kernel-table.py from nvcc -ptx / ptxas -v for sm_90): registers, shared and
 *     stack bytes, the instructions (all paths and the shortest) and global loads of the
 *     kernel's main loop and the chain of dependent loads an iteration waits for (round
 *     trips). PTX, not SASS (no cuobjdump in this toolkit install): virtual instructions.
 * Output (km_predict): modelled time = max(DRAM bytes / HBM bandwidth, warp instructions /
 * issue rate, latency-bound time from the loads in flight (Little's law: each warp waits one
 * DRAM latency per round trip of each loop iteration, the resident warps overlapping), load
 * sectors / L1 throughput), with the H100 SXM constants of km_h100_sxm. Everything here is
 * modelled: nothing was measured on a GPU. */
#ifndef KVPLAN_TESTS_KMODEL_H
#define KVPLAN_TESTS_KMODEL_H

#include "kvplan/common.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A device's constants (each with its source in km_h100_sxm). */
typedef struct km_device {
    const char *name;
    double hbm_bw;       /* DRAM bandwidth, bytes/s */
    double clock_hz;     /* SM clock, Hz */
    double latency_s;    /* DRAM load latency seen by a warp, s */
    double tensor_f16;   /* dense F16/BF16 tensor-core peak with FP32 accumulation, FLOP/s */
    int sms;             /* streaming multiprocessors */
    int schedulers;      /* warp schedulers per SM, each one warp instruction per clock */
    int max_warps_sm;    /* resident warps per SM */
    int max_blocks_sm;   /* resident thread blocks per SM */
    int regs_sm;         /* 32-bit registers per SM */
    int l1_sectors;      /* 32-byte sectors the L1 / texture path moves per clock per SM */
    int reg_unit;        /* registers are allocated per warp in units of this many */
    size_t smem_sm;      /* shared memory per SM for blocks, bytes */
    size_t smem_reserve; /* shared memory the system reserves per block, bytes */
    double launch_s;     /* per kernel launch in a step (no CUDA graph), s */
    double sync_s;       /* per host synchronisation in a step, s */
} km_device;

/* The H100 SXM5 (80 GB) constants; sources in kmodel.c next to each value. */
km_device km_h100_sxm(void);

/* One kernel's compiled code for sm_90 (a row of kernel_code.inc). */
typedef struct km_code {
    const char *name; /* as c++filt prints it, without parameters: "kv_k_gemv_f16<1>" */
    int regs;         /* registers per thread */
    int smem;         /* static shared memory per block, bytes */
    int stack;        /* stack frame per thread, bytes (local memory) */
    int loop_instrs;  /* PTX instructions of the main loop's body (all its paths) */
    int loop_min;     /* of them, on the shortest path through the body */
    int loop_loads;   /* global loads in that body */
    int trips;        /* dependent round trips to memory per iteration */
} km_code;

/* The row for kernel `name`, or NULL (with a message naming the table and the script that
 * regenerates it) when the table has none. The row is static: not owned by the caller. */
const km_code *km_code_find(const char *name, kv_error *err);

/* What a launch executes, scaled to its full grid (km_probe). */
typedef struct km_trace {
    double blocks;         /* thread blocks of the grid */
    int threads;           /* threads per block */
    size_t dyn_smem;       /* dynamic shared memory per block, bytes */
    double requests;       /* warp-wide global load instructions executed */
    double sectors;        /* sum over those requests of the distinct 32-byte sectors touched */
    double req_bytes;      /* bytes the lanes of those requests asked for */
    double store_requests; /* warp-wide global stores executed */
    double dram_bytes;     /* distinct sectors loaded or stored over the launch x 32 */
    double mma_flops;      /* tensor-core FLOPs (16 x 16 x 16 MMAs x 2 x 4096) */
    double path;           /* the share of the loop body's optional code the run executes, in
                            * [0, 1] (the probe knows the branches its shape takes): an
                            * iteration issues loop_min + path x (loop_instrs - loop_min) */
} km_trace;

/* The model's answer for one launch. Times in seconds. */
typedef struct km_result {
    double t_bw;        /* dram_bytes / hbm_bw */
    double t_issue;     /* warp instructions / (SMs in use x schedulers x clock) */
    double t_lat;       /* waves x loop iterations per warp x round trips x latency */
    double t_l1;        /* load sectors / (SMs in use x l1_sectors x clock) */
    double t_tensor;    /* mma_flops / (tensor_f16 x SMs in use / SMs) */
    double t;           /* the largest of the five */
    double tensor_frac; /* t_tensor / t: the modelled fraction of the tensor-core peak */
    double hbm_frac;    /* t_bw / t: the modelled fraction of HBM bandwidth */
    double sectors_req; /* sectors per load request */
    double sector_eff;  /* bytes requested / (sectors x 32): 1 when every fetched byte is used */
    double warps_sm;    /* resident warps per SM (occupancy x 64) */
    double warp_instrs; /* modelled warp instructions of the launch */
    const char *bound;  /* "bandwidth", "issue", "latency", "L1" or "tensor" */
} km_result;

/* Model one launch of kernel `c` that executed `t` on device `d` (formulas in kmodel.c).
 * Returns KV_OK, or KV_EINPUT with a message when the launch cannot be resident (too many
 * registers or shared bytes for one block) or the trace is empty. */
int km_predict(const km_device *d, const km_code *c, const km_trace *t, km_result *r,
               kv_error *err);

/* The shape a probe is scaled to. Fields a kernel does not use are ignored. */
typedef struct km_shape {
    int in, out;    /* GEMV: row length and output rows */
    int wtype;      /* GEMV weights' kv_dtype for the generic kernel kv_k_gemv */
    int ctx, g, hd; /* decode attention: entries per head, GQA group, head dimension */
    int tasks;      /* decode attention: (sequence, KV head) pairs */
    int n, stride;  /* km_copy: elements, stride; km_chase: threads (n), hops (stride) */
} km_shape;

/* Run kernel `name` (a row of the probe table in kprobe.cpp: the typed GEMVs at R = 1, 8 or 32
 * rows of x, "kv_k_gemv_f16<R>", "kv_k_gemv_q<kv_q8_0_dot, R>", "kv_k_gemv_q<kv_q4_0_dot, R>",
 * "kv_k_gemv_q4k<R>", "kv_k_gemv_qk<kv_q6k_lane, R>"; "kv_k_gemv", "kv_k_flash_decode<1, 128>",
 * "kv_k_prefill_tiled<128>", "km_copy", "km_chase") on the host shim with its loads and stores
 * traced, at a small shape with the full shape's row lengths (a few blocks), and fill *t with
 * its counts scaled to shape *s's grid. Returns KV_OK; KV_EINPUT when the kernel has no probe,
 * the shape is out of the probe's range, or the tracer is not in this build (compiled without
 * clang); KV_EINTERNAL when out of memory. */
int km_probe(const char *name, const km_shape *s, km_trace *t, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
