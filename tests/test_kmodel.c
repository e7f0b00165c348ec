/* The CUDA kernels' performance model (tests/cuda_model/kmodel.h) on kernels whose answer is
 * known: a coalesced copy fetches one 32-byte sector per 32 bytes requested, a copy with a
 * stride of 8 floats eight times as many, a pointer chase (one load in flight per warp) is
 * latency-bound at hops x latency; then the backend's own kernels (cuda/kernels/) at
 * Llama-2-7B's shapes (Touvron et al. 2023: d 4096, FFN 11008, d_h 128), whose DRAM bytes are
 * the weights / the K/V rows they read; and the compiled-code table against the kernels. */
#include "kmodel.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static km_trace probe(const char *name, km_shape s) {
    km_trace t;
    kv_error err = {0};
    int rc = km_probe(name, &s, &t, &err);
    if (rc) printf("\n    %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
    return t;
}

static km_result predict(const char *name, const km_trace *t) {
    kv_error err = {0};
    km_device d = km_h100_sxm();
    const km_code *c = km_code_find(name, &err);
    CU_ASSERT_FATAL(c != NULL);
    km_result r;
    int rc = km_predict(&d, c, t, &r, &err);
    if (rc) printf("\n    %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
    return r;
}

/* 4-byte lanes, 32 lanes: 128 consecutive bytes per request = 4 sectors; every byte fetched
 * once; one store request per warp. */
static void test_copy_coalesced(void) {
    const int n = 1 << 14;
    km_trace t = probe("km_copy", (km_shape){.n = n, .stride = 1});
    km_result r = predict("km_copy", &t);
    CU_ASSERT_EQUAL(t.requests, n / 32);
    CU_ASSERT_EQUAL(r.sectors_req, 4.0);
    CU_ASSERT_EQUAL(r.sector_eff, 1.0); /* one sector per 32 B requested */
    CU_ASSERT_EQUAL(t.dram_bytes, 2.0 * n * 4);
    CU_ASSERT_EQUAL(t.store_requests, n / 32);
    printf("\n    coalesced copy: %.2f sectors/request, %.2f sectors per 32 B asked, %s-bound",
           r.sectors_req, 1.0 / r.sector_eff, r.bound);
}

/* Stride 8 floats: each lane's 4 bytes in its own sector, 32 per request; 8x the DRAM reads. */
static void test_copy_strided(void) {
    const int n = 1 << 14;
    km_trace c = probe("km_copy", (km_shape){.n = n, .stride = 1});
    km_trace s = probe("km_copy", (km_shape){.n = n, .stride = 8});
    km_result rc = predict("km_copy", &c), rs = predict("km_copy", &s);
    CU_ASSERT_EQUAL(rs.sectors_req, 32.0);
    CU_ASSERT_EQUAL(rs.sectors_req / rc.sectors_req, 8.0);
    CU_ASSERT_EQUAL(rs.sector_eff, 1.0 / 8);
    CU_ASSERT_EQUAL(s.dram_bytes - n * 4.0, 8.0 * (c.dram_bytes - n * 4.0)); /* reads 8x */
    CU_ASSERT(rs.t_bw > 4.0 * rc.t_bw);
    printf("\n    strided copy: %.0f sectors/request (%.0fx), modelled %.3g us vs %.3g us",
           rs.sectors_req, rs.sectors_req / rc.sectors_req, rs.t * 1e6, rc.t * 1e6);
}

/* One warp per block, each load's address the previous load's value: latency-bound, hops
 * latencies (one wave: 64 warps fit the device at once). */
static void test_chase_latency_bound(void) {
    const int warps = 64, hops = 100;
    km_trace t = probe("km_chase", (km_shape){.n = 32 * warps, .stride = hops});
    kv_error err = {0};
    const km_code *c = km_code_find("km_chase", &err);
    CU_ASSERT_FATAL(c != NULL);
    CU_ASSERT_EQUAL(c->trips, c->loop_loads); /* the table sees one load in flight */
    km_result r = predict("km_chase", &t);
    km_device d = km_h100_sxm();
    CU_ASSERT_STRING_EQUAL(r.bound, "latency");
    CU_ASSERT_EQUAL(t.requests, (double)warps * hops);
    CU_ASSERT(fabs(r.t - hops * d.latency_s) <= 1e-9 * r.t);
    CU_ASSERT(r.t > 100.0 * r.t_bw);
    printf("\n    pointer chase: %s-bound, %.1f us = %d x %.0f ns", r.bound, r.t * 1e6, hops,
           d.latency_s * 1e9);
}

/* The typed F16 GEMV at d x d: the DRAM bytes are the weights, x and y, each once; the weight
 * loads are 16 B per lane, so the request count follows from the row: in x 2 / 512 weight
 * requests + 2 x-loads per 16 B of weights. */
static void test_gemv_f16(void) {
    const int in = 4096, out = 4096;
    km_trace t = probe("kv_k_gemv_f16<1>", (km_shape){.in = in, .out = out});
    km_result r = predict("kv_k_gemv_f16<1>", &t);
    CU_ASSERT_EQUAL(t.dram_bytes, (double)out * in * 2 + in * 4.0 + out * 4.0);
    CU_ASSERT_EQUAL(t.requests, 3.0 * out * in * 2 / 512);
    CU_ASSERT_EQUAL(t.blocks, out);
    CU_ASSERT(r.hbm_frac > 0.0 && r.hbm_frac <= 1.0);
    printf("\n    F16 GEMV 4096x4096: %.1f MB, %.1f sectors/request, %.0f%% of HBM (%s-bound)",
           t.dram_bytes / 1e6, r.sectors_req, 100 * r.hbm_frac, r.bound);
}

/* Q8_0 and Q4_0 (typed, dp4a), Q4_K on the generic kernel (a type switch per element) and on
 * its typed kernel (kv_k_gemv_q4k: a lane per super-block), Q6_K on the typed K-quant kernel:
 * the weights' bytes are the file's (34 / 18 / 144 / 210 bytes per 32 / 32 / 256 / 256
 * weights), each once, whatever the rows of x; the generic kernel issues more instructions per
 * weight byte than the typed ones; the typed Q8_0 and Q4_K kernels are modelled at >= 70 % of
 * HBM at batch 1. */
static void test_gemv_block_types(void) {
    const int in = 4096, out = 4096;
    km_trace q8 = probe("kv_k_gemv_q<kv_q8_0_dot, 1>", (km_shape){.in = in, .out = out});
    km_trace q4 = probe("kv_k_gemv_q<kv_q4_0_dot, 1>", (km_shape){.in = in, .out = out});
    km_trace qk = probe("kv_k_gemv", (km_shape){.in = in, .out = out, .wtype = KV_DT_Q4_K});
    double w8 = (double)out * in / 32 * 34, w4 = (double)out * in / 32 * 18;
    double wk = (double)out * in / 256 * 144;
    /* + the int8 activations, their scales (and for Q4_0 their sums: Q8_0's finish ignores
     * them, so the compiled kernel never loads them), y */
    CU_ASSERT_EQUAL(q8.dram_bytes, w8 + in + in / 32 * 4.0 + out * 4.0);
    CU_ASSERT_EQUAL(q4.dram_bytes, w4 + in + in / 32 * 8.0 + out * 4.0);
    CU_ASSERT_EQUAL(qk.dram_bytes, wk + in * 4.0 + out * 4.0);
    km_result r8 = predict("kv_k_gemv_q<kv_q8_0_dot, 1>", &q8);
    km_result r4 = predict("kv_k_gemv_q<kv_q4_0_dot, 1>", &q4);
    km_result rk = predict("kv_k_gemv", &qk);
    CU_ASSERT(rk.warp_instrs / wk > r4.warp_instrs / w4);
    CU_ASSERT(rk.hbm_frac < r4.hbm_frac);
    /* the typed K-quant kernel: the file's 144 / 210 bytes per 256 weights, the int8
     * activations, one scale per 256 and sixteen int16 sums per 256, y; fewer instructions per
     * weight byte than the generic kernel */
    km_trace tk = probe("kv_k_gemv_q4k<1>", (km_shape){.in = in, .out = out});
    km_trace tk32 = probe("kv_k_gemv_q4k<32>", (km_shape){.in = in, .out = out});
    km_trace q832 = probe("kv_k_gemv_q<kv_q8_0_dot, 32>", (km_shape){.in = in, .out = out});
    km_trace t6 = probe("kv_k_gemv_qk<kv_q6k_lane, 1>", (km_shape){.in = in, .out = out});
    double act = in + in / 256 * 4.0 + in / 16 * 2.0 + out * 4.0;
    CU_ASSERT_EQUAL(tk.dram_bytes, wk + act);
    CU_ASSERT_EQUAL(t6.dram_bytes, (double)out * in / 256 * 210 + act);
    /* 32 rows of x: the weights once, 32 x the activations and y */
    CU_ASSERT_EQUAL(tk32.dram_bytes, wk + 32 * act);
    CU_ASSERT_EQUAL(q832.dram_bytes, w8 + 32 * (in + in / 32 * 4.0 + out * 4.0));
    km_result rt = predict("kv_k_gemv_q4k<1>", &tk);
    km_result r6 = predict("kv_k_gemv_qk<kv_q6k_lane, 1>", &t6);
    CU_ASSERT(rt.warp_instrs < rk.warp_instrs);
    CU_ASSERT(rt.hbm_frac > rk.hbm_frac);
    CU_ASSERT(rt.hbm_frac >= 0.7 && r8.hbm_frac >= 0.7);
    printf("\n    4096x4096 GEMV, modelled %% of HBM: Q8_0 %.0f%% (%s), Q4_0 %.0f%% (%s), Q4_K "
           "generic %.0f%% (%s), Q4_K typed %.0f%% (%s, %.1f sectors/request), Q6_K typed %.0f%% "
           "(%s)",
           100 * r8.hbm_frac, r8.bound, 100 * r4.hbm_frac, r4.bound, 100 * rk.hbm_frac, rk.bound,
           100 * rt.hbm_frac, rt.bound, rt.sectors_req, 100 * r6.hbm_frac, r6.bound);
}

/* Flash-decoding of one 4096-entry F16 head (d_h 128, a GQA group of 4): it reads each K and V
 * row once (2 x 4096 x 256 bytes), its block table (256 ids), the group's queries (4 x 128
 * floats) and its task descriptor (one sector), and writes the 16 partitions' m, s and o
 * (16 x 4 x 130 floats): exactly those bytes; 32 tasks scale it 32x. */
static void test_flash_decode(void) {
    km_shape s = {.ctx = 4096, .g = 4, .hd = 128, .tasks = 1};
    km_trace one = probe("kv_k_flash_decode<1, 128>", s);
    s.tasks = 32;
    km_trace many = probe("kv_k_flash_decode<1, 128>", s);
    double kv = 2.0 * 4096 * 128 * 2, extra = 4096 / 16 * 4 + 4 * 128 * 4 + 32 + 16 * 4 * 130 * 4;
    CU_ASSERT_EQUAL(one.dram_bytes, kv + extra);
    CU_ASSERT_EQUAL(many.dram_bytes, 32 * one.dram_bytes);
    CU_ASSERT_EQUAL(one.blocks, 16); /* 256-entry partitions */
    km_result r = predict("kv_k_flash_decode<1, 128>", &many);
    CU_ASSERT(r.sectors_req >= 1.0);
    /* the target: >= 60 % of HBM at 4k, batch 1 and 32, Llama-2-7B (32 KV heads, g 1) and a
     * GQA-8 7B (8 KV heads, g 4) (modelled) */
    const int shapes[4][2] = {{1, 32}, {1, 32 * 32}, {4, 8}, {4, 32 * 8}}; /* g, tasks */
    for (int i = 0; i < 4; i++) {
        km_shape si = {.ctx = 4096, .g = shapes[i][0], .hd = 128, .tasks = shapes[i][1]};
        km_trace ti = probe("kv_k_flash_decode<1, 128>", si);
        km_result ri = predict("kv_k_flash_decode<1, 128>", &ti);
        CU_ASSERT(ri.hbm_frac >= 0.6);
        printf("\n    flash-decode 4k, g %d, %d tasks: %.0f%% of HBM (%s-bound)", si.g, si.tasks,
               100 * ri.hbm_frac, ri.bound);
    }
    printf("\n    flash-decode 4k, g 4, 32 tasks: %.1f MB, %.2f sectors/request, %.0f%% of HBM "
           "(%s-bound)",
           many.dram_bytes / 1e6, r.sectors_req, 100 * r.hbm_frac, r.bound);
}

/* Tiled prefill attention of a 4096-token first prefill, GQA group 4, 8 tasks: the tensor-core
 * work the probe counts is exactly 128 warp MMAs (S and PV, 4 warps x 32) per (query tile, KV
 * tile) the causal loop visits, and the DRAM bytes exactly the queries, outputs and row
 * statistics once per block plus each task's K/V and table once. */
static void test_prefill(void) {
    km_shape s = {.ctx = 4096, .g = 4, .hd = 128, .tasks = 8};
    km_trace t = probe("kv_k_prefill_tiled<128>", s);
    double tiles = 0.0; /* query tile y (64 rows = 16 tokens) sees 16 (y + 1) entries */
    for (int y = 0; y < 4096 * 4 / 64; y++) tiles += (16 * (y + 1) + 31) / 32;
    CU_ASSERT_EQUAL(t.blocks, 8 * 256);
    CU_ASSERT_EQUAL(t.mma_flops, 8 * tiles * 128 * 2.0 * 16 * 16 * 16);
    double qo = 2.0 * 64 * 128 * 4, ml = 2 * 64 * 4, task = 32; /* per block */
    double kv = 8 * (4096.0 * 2 * 256 + 4096 / 16 * 4);
    CU_ASSERT_EQUAL(t.dram_bytes, 8 * 256 * (qo + ml + task) + kv);
    km_result r = predict("kv_k_prefill_tiled<128>", &t);
    CU_ASSERT(r.t > 0 && r.t < 50e-3); /* the target: <= 50 ms per layer (modelled) */
    CU_ASSERT(r.t_tensor <= r.t);
    printf("\n    prefill 4k, g 4, 8 tasks: %.1f GFLOP, %.1f MB, %.3f ms (%s-bound), %.0f%% of "
           "the tensor peak",
           t.mma_flops / 1e9, t.dram_bytes / 1e6, r.t * 1e3, r.bound, 100 * r.tensor_frac);
}

static void test_errors(void) {
    kv_error err = {0};
    CU_ASSERT(km_code_find("no_such_kernel", &err) == NULL);
    CU_ASSERT(strstr(err.msg, "kernel-table.py") != NULL);
    km_trace t;
    km_shape s = {.in = 4096, .out = 4096};
    CU_ASSERT_EQUAL(km_probe("no_such_kernel", &s, &t, &err), KV_EINPUT);
    s.in = 100; /* not a multiple of 8 */
    CU_ASSERT_EQUAL(km_probe("kv_k_gemv_f16<1>", &s, &t, &err), KV_EINPUT);
    km_device d = km_h100_sxm();
    km_code big = {"big", 255, 0, 0, 10, 10, 1, 1};
    km_trace tb = {.blocks = 1, .threads = 1024, .requests = 1, .dram_bytes = 128};
    km_result r;
    CU_ASSERT_EQUAL(km_predict(&d, &big, &tb, &r, &err), KV_EINPUT); /* 261 K registers */
    CU_ASSERT(strstr(err.msg, "does not fit") != NULL);
}

/* The checked-in table is what the kernels compile to now (when a CUDA toolkit is here). */
static void test_table_current(void) {
    if (access("/usr/local/cuda/bin/nvcc", X_OK) != 0) {
        printf("\n    no CUDA toolkit: table not rechecked");
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s/scripts/kernel-table.py --check 2>&1", KVPLAN_SOURCE_DIR);
    char *out = NULL;
    int rc = tu_run_sh(cmd, &out);
    if (rc) printf("\n    %s", out ? out : "");
    CU_ASSERT_EQUAL(rc, 0);
    free(out);
}

int main(int argc, char **argv) {
    km_trace t;
    kv_error err = {0};
    km_shape s = {.n = 128, .stride = 1};
    if (km_probe("km_copy", &s, &t, &err) && strstr(err.msg, "no load tracer")) {
        printf("test_kmodel: skipped: %s\n", err.msg);
        return 77;
    }
    const tu_test tests[] = {
        {"coalesced copy: one sector per 32 B", test_copy_coalesced},
        {"strided copy: 8x the sectors", test_copy_strided},
        {"pointer chase: latency-bound", test_chase_latency_bound},
        {"F16 GEMV at 4096x4096", test_gemv_f16},
        {"Q8_0 / Q4_0 / Q4_K GEMV", test_gemv_block_types},
        {"flash-decoding at 4k", test_flash_decode},
        {"tiled prefill at 4k", test_prefill},
        {"errors", test_errors},
        {"compiled-code table is current", test_table_current},
    };
    return tu_main(argc, argv, "kmodel", tests, sizeof tests / sizeof tests[0]);
}
