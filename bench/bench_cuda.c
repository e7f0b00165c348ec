/* Device rows of scripts/bench.sh: the engine on the CUDA backend against the device's own
 * limits, on a synthetic model of realistic shape (768d, 12 layers, 12 query / 4 KV heads,
 * FFN 2048, vocabulary 32000; seeded random weights built in memory, never written).
 *   - decode: bytes per decoded token (weights read once + the K/V bytes in use) x tokens/s,
 *     against the device-to-device copy bandwidth measured by the profiler's probe
 *     (kv_cuda_probe_copy, traffic = 2 x bytes copied) and the bus's theoretical bandwidth;
 *   - prefill: 2 x (matrix parameters) x tokens FLOP/s (the GEMMs; attention adds less than
 *     5% at this context) against the cuBLAS FP32 GEMM probe at the prefill's largest shape;
 * at R = 1, 1/4 and 1/16 (uniform plans, sink policy so no statistics are copied back).
 * Without a CUDA build or device it prints one line saying the rows were skipped, exit 0.
 * Usage: bench_cuda [--context N (2048)] [--decode N (64)] */
#include "kvplan/engine.h"
#include "kvplan/kvcuda.h"
#include "kvplan/plan.h"
#include "synthetic.h" /* tests/support/synthetic.c, shared with the tests */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The benchmark's model: tests/support/synthetic.c at the shape above, embedding tied to the
 * classifier, BOS 1 / EOS 2. */
static kv_model *synthetic(kv_error *err) {
    kv_model *m = synth_model((synth_shape){768, 12, 12, 4, 2048, 32000, 4096}, 1, 7, err);
    if (m) m->cfg.bos_id = 1, m->cfg.eos_id = 2;
    return m;
}

static int fail(const char *what, kv_error *err) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    int context = 2048, decode = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--context") && i + 1 < argc)
            context = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            decode = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cuda [--context N] [--decode N]\n");
            return 2;
        }
    }
    printf("== device rows (CUDA backend) ==\n");
    char why[256] = "";
    if (!kv_cuda_built() || kv_cuda_device_count(why) <= 0) {
        printf("skipped: %s\n", kv_cuda_built() ? why : "kvplan was built without a CUDA toolkit");
        return 0;
    }
    if (context < 64 || context > 4096 || decode < 1) {
        fprintf(stderr, "bench_cuda: --context must be in [64, 4096] and --decode >= 1\n");
        return 2;
    }
    kv_error err = {0};
    kv_cuda_device info;
    if (kv_cuda_device_info(0, &info, &err)) return fail("device", &err);
    /* bandwidth: device-to-device copies of 256 MiB, best of 5 */
    size_t bytes = (size_t)256 << 20;
    double t[5], best = 1e30;
    if (kv_cuda_probe_copy(0, KV_CUDA_D2D, &bytes, 1, 5, t, NULL, &err))
        return fail("copy probe", &err);
    for (int i = 0; i < 5; i++) best = t[i] < best ? t[i] : best;
    double bw = 2.0 * (double)bytes / best;
    kv_model *m = synthetic(&err);
    if (!m) return fail("synthetic model", &err);
    const kv_config *c = &m->cfg;
    int prefill = context - decode;
    /* GEMM probe at the prefill's largest shape: [prefill, dim] x [dim, hidden] */
    int gm = prefill, gn = c->hidden_dim, gk = c->dim;
    double gt[3], gbest = 1e30;
    if (kv_cuda_probe_gemm(0, KV_CUDA_FP32, &gm, &gn, &gk, 1, 3, gt, NULL, &err))
        return fail("GEMM probe", &err);
    for (int i = 0; i < 3; i++) gbest = gt[i] < gbest ? gt[i] : gbest;
    double peak = 2.0 * gm * (double)gn * gk / gbest;
    size_t wbytes = kv_model_weight_bytes(m);
    double mat_params = 0.0;
    for (int l = 0; l < c->n_layers; l++)
        mat_params += (double)c->dim *
                      (2.0 * c->dim + 2.0 * c->n_kv_heads * c->head_dim + 3.0 * c->hidden_dim);
    mat_params += (double)c->dim * c->vocab_size / (double)prefill; /* logits: last row only */
    printf("device %s (sm_%d%d): copy %.1f GB/s measured (bus %.1f GB/s), FP32 GEMM %.2f "
           "TFLOP/s at %dx%dx%d\n",
           info.name, info.cc_major, info.cc_minor, bw / 1e9, info.mem_bus_bw / 1e9, peak / 1e12,
           gm, gn, gk);
    printf("%-6s %10s %12s %10s %12s %12s %10s\n", "R", "prefill", "TFLOP/s", "of GEMM",
           "decode tok/s", "GB/s", "of copy");
    int *tok = malloc(sizeof(int) * (size_t)context);
    uint64_t s = 11;
    for (int i = 0; i < context; i++) tok[i] = 3 + (int)(synth_next(&s) % 31000);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    const double ratios[3] = {1.0, 0.25, 1.0 / 16};
    const char *names[3] = {"1", "1/4", "1/16"};
    for (int r = 0; r < 3; r++) {
        kv_plan plan;
        int rc = ratios[r] == 1.0
                     ? kv_plan_full(c, context, 16, 16, KV_POLICY_SINK, &plan, &err)
                     : kv_plan_uniform(c, ratios[r], context, 16, 16, KV_POLICY_SINK, &plan, &err);
        if (rc) return fail("plan", &err);
        kv_engine_opts o = {0};
        o.device = KV_DEVICE_CUDA;
        kv_engine *e = NULL;
        int seq = 0;
        if (kv_engine_new(m, &plan, &o, &e, &err) || kv_engine_seq_open(e, NULL, NULL, &seq, &err))
            return fail("engine", &err);
        double t0 = kv_now();
        if (kv_engine_prefill(e, seq, tok, prefill, KV_LOGITS_LAST, logits, NULL, &err))
            return fail("prefill", &err);
        double t1 = kv_now();
        double kv_bytes = 0.0;
        for (int i = 0; i < decode; i++) {
            kv_bytes += (double)kv_engine_bytes_in_use(e);
            if (kv_engine_decode(e, &seq, 1, &tok[prefill + i], logits, &err))
                return fail("decode", &err);
        }
        double t2 = kv_now();
        double flops = 2.0 * mat_params * prefill;
        double dec_bytes = (double)wbytes * decode + kv_bytes;
        printf("%-6s %10d %12.3f %9.0f%% %12.1f %12.1f %9.0f%%\n", names[r], prefill,
               flops / (t1 - t0) / 1e12, 100.0 * flops / (t1 - t0) / peak, decode / (t2 - t1),
               dec_bytes / (t2 - t1) / 1e9, 100.0 * dec_bytes / (t2 - t1) / bw);
        kv_engine_free(e);
        kv_plan_free(&plan);
    }
    free(tok);
    free(logits);
    kv_model_free(m);
    return 0;
}
