/* The CUDA kernels' performance model: device constants, the compiled-code table and the
 * time formula (kmodel.h). */
#include "kmodel.h"

#include <math.h>
#include <string.h>

km_device km_h100_sxm(void) {
    km_device d;
    d.name = "H100 SXM5 80GB";
    /* NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: GPU memory bandwidth 3.35 TB/s. */
    d.hbm_bw = 3.35e12;
    /* NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): the H100 SXM5 has 132 SMs;
     * each SM has four partitions, each with one warp scheduler that issues one warp
     * instruction per clock. */
    d.sms = 132;
    d.schedulers = 4;
    /* The clock at which the datasheet's dense FP16 tensor peak, 989.4 TFLOP/s, is 132 SMs x
     * 2048 dense FP16 FMA per clock per SM (twice A100's 1024, whitepaper) x 2 FLOP per FMA:
     * 989.4e12 / (132 x 2048 x 2) = 1.83 GHz. The datasheet's 67 TFLOP/s FP32 implies the
     * 1.98 GHz maximum boost; the lower clock is taken (the issue bound is conservative). */
    d.clock_hz = 1.83e9;
    /* NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: FP16 / BF16 Tensor Core 1,979 TFLOP/s
     * "with sparsity", i.e. 989.4 TFLOP/s dense; Hopper's SXM part runs F16 inputs with FP32
     * accumulation at that full rate (Hopper whitepaper, table of peak throughputs). */
    d.tensor_f16 = 989.4e12;
    /* Assumed, not measured: pointer-chasing microbenchmarks of Hopper (Chips and Cheese,
     * "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023; Luo et al., "Benchmarking and
     * Dissecting the Nvidia Hopper GPU Architecture", arXiv:2402.13499) put an HBM load at
     * several hundred ns unloaded, more under load; 700 ns is taken, the middle of 600-800 ns. */
    d.latency_s = 700e-9;
    /* CUDA C++ Programming Guide, "Technical Specifications per Compute Capability", 9.0:
     * 64 resident warps, 32 resident blocks, 64 K 32-bit registers and 228 KB of shared memory
     * per SM (227 KB usable by one block, 1 KB reserved per block by the system); registers
     * are allocated per warp in units of 256. */
    d.max_warps_sm = 64;
    d.max_blocks_sm = 32;
    d.regs_sm = 65536;
    d.reg_unit = 256;
    d.smem_sm = (size_t)228 * 1024;
    /* Assumed, not measured: 128 bytes (4 sectors) per clock per SM through L1, the data-path
     * width of NVIDIA's SMs since Volta; at 1.98 GHz x 132 SMs that is the ~33 TB/s of L1
     * bandwidth microbenchmarks report for H100. A request touching n sectors takes n / 4
     * clocks of its SM's L1. */
    d.l1_sectors = 4;
    d.smem_reserve = 1024;
    /* Step overheads, as bench_cuda_fake's count-based estimate has always charged them
     * (assumed: a launch every 3 us when no CUDA graph is used, 10 us per host wait). */
    d.launch_s = 3e-6;
    d.sync_s = 10e-6;
    return d;
}

static const km_code k_table[] = {
#include "kernel_code.inc"
};

const km_code *km_code_find(const char *name, kv_error *err) {
    for (size_t i = 0; i < sizeof k_table / sizeof k_table[0]; i++)
        if (!strcmp(k_table[i].name, name)) return &k_table[i];
    kv_fail(err, KV_EINPUT,
            "tests/cuda_model/kernel_code.inc has no kernel '%s'; add it to "
            "tests/cuda_model/kmodel_kernels.cu and rerun scripts/kernel-table.py",
            name ? name : "(null)");
    return NULL;
}

/* Resident blocks per SM of a launch of c with t's block: the least of the register, warp,
 * block and shared-memory limits (CUDA occupancy rules for compute capability 9.0). */
static int blocks_per_sm(const km_device *d, const km_code *c, const km_trace *t) {
    int warps = (t->threads + 31) / 32;
    int regs_warp = (c->regs * 32 + d->reg_unit - 1) / d->reg_unit * d->reg_unit;
    int by_regs = regs_warp ? d->regs_sm / (regs_warp * warps) : d->max_blocks_sm;
    int by_warps = d->max_warps_sm / warps;
    size_t smem = (size_t)c->smem + t->dyn_smem + d->smem_reserve;
    int by_smem = (int)(d->smem_sm / smem);
    int b = d->max_blocks_sm;
    b = by_regs < b ? by_regs : b;
    b = by_warps < b ? by_warps : b;
    return by_smem < b ? by_smem : b;
}

/* The formula (all counts of the whole launch):
 *   t_bw    = dram_bytes / hbm_bw
 *   t_issue = warp instructions / (SMs in use x min(schedulers, warps per SM) x clock), warp
 *             instructions = requests / loop_loads x (loop_min + path x (loop_instrs -
 *             loop_min)): the loop's body, on the run's path, per its loads
 *   t_lat   = waves x (requests per warp / loop_loads) x trips x latency: each iteration waits
 *             `trips` DRAM latencies, and a wave of resident warps overlaps its waits (Little's
 *             law: bytes in flight = resident warps x bytes per iteration)
 *   t_l1    = load sectors / (SMs in use x l1_sectors x clock)
 *   t_tensor = tensor-core FLOPs / (tensor_f16 x SMs in use / SMs)
 *   t       = max of the five. */
int km_predict(const km_device *d, const km_code *c, const km_trace *t, km_result *r,
               kv_error *err) {
    memset(r, 0, sizeof *r);
    if (!c || !t || t->blocks < 1 || t->threads < 32 || t->requests <= 0 || c->loop_loads <= 0)
        return kv_fail(err, KV_EINPUT, "km_predict: an empty trace or a kernel without loads (%s)",
                       c ? c->name : "(no code)");
    int bps = blocks_per_sm(d, c, t);
    if (bps < 1)
        return kv_fail(err, KV_EINPUT,
                       "km_predict: one block of %s (%d threads, %d registers, %zu shared bytes) "
                       "does not fit an SM of the %s",
                       c->name, t->threads, c->regs, (size_t)c->smem + t->dyn_smem, d->name);
    double warps_block = (double)((t->threads + 31) / 32), warps = t->blocks * warps_block;
    double sms_used = t->blocks < d->sms ? t->blocks : (double)d->sms;
    double resident = bps * warps_block, per_sm = warps / sms_used;
    r->warps_sm = per_sm < resident ? per_sm : resident;
    double waves = ceil(t->blocks / ((double)d->sms * bps));
    double iters = t->requests / warps / c->loop_loads;
    double path = t->path < 0 ? 0 : t->path > 1 ? 1 : t->path;
    double body = c->loop_min + path * (c->loop_instrs - c->loop_min);
    r->warp_instrs = t->requests / c->loop_loads * body;
    double sched = r->warps_sm < d->schedulers ? r->warps_sm : (double)d->schedulers;
    r->t_bw = t->dram_bytes / d->hbm_bw;
    r->t_issue = r->warp_instrs / (sms_used * sched * d->clock_hz);
    r->t_lat = waves * iters * c->trips * d->latency_s;
    r->t_l1 = t->sectors / (sms_used * d->l1_sectors * d->clock_hz);
    r->t = r->t_bw, r->bound = "bandwidth";
    if (r->t_issue > r->t) r->t = r->t_issue, r->bound = "issue";
    if (r->t_lat > r->t) r->t = r->t_lat, r->bound = "latency";
    if (r->t_l1 > r->t) r->t = r->t_l1, r->bound = "L1";
    r->t_tensor = t->mma_flops / (d->tensor_f16 * sms_used / d->sms);
    if (r->t_tensor > r->t) r->t = r->t_tensor, r->bound = "tensor";
    r->hbm_frac = r->t > 0 ? r->t_bw / r->t : 0.0;
    r->tensor_frac = r->t > 0 ? r->t_tensor / r->t : 0.0;
    r->sectors_req = t->sectors / t->requests;
    r->sector_eff = t->sectors > 0 ? t->req_bytes / (t->sectors * 32.0) : 0.0;
    return KV_OK;
}
