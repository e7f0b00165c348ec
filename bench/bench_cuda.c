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
 * Usage: bench_cuda [--context N (2048)] [--decode N (64)]
 *
 * bench_cuda_fake, the same file linked with the real cuda/ sources on the fake CUDA runtime
 * (tests/cuda_fake/, count-only: device memory is address space, nothing runs), counts instead
 * of timing, on Llama-2-7B-shaped models (32 layers, 4096 wide, 32 query heads, FFN 11008,
 * vocabulary 32000; 8 KV heads, GQA-8, and 32, Llama-2-7B itself) whose weights are zero pages
 * of the file's type (F16, Q4_K): what the backend uploads per file byte, and per decode step
 * (the last of 3 after the first after the prefills) at batch 1 and 32, context 1k and 4k, the host
 * synchronisations, kernel launches and GEMMs, host-to-device bytes and copies, the attention
 * kernel's grid, the host's CPU time for a step (the least of the 3, measured here: the fake
 * device runs nothing, so this is the backend's and engine's own host work) and the pinned bytes
 * live; before them, the performance model's figures per kernel (tests/cuda_model/kmodel.h: the
 * decode GEMVs and flash-decoding traced on the host shim, their compiled code, an H100 SXM;
 * modelled, not measured), and per step the attention kernel's modelled fraction of HBM and the
 * modelled tokens/s (the kernels' modelled times + 3 us per launch + 10 us per host wait; GEMMs
 * at batch 32 at the roofline) next to the bandwidth limit (the weights as uploaded + the F16 K/V
 * read once per step at 3.35 TB/s); the same for R = 1/4 h2o plans (tracked heads, evicting
 * each step). Usage: bench_cuda_fake [--profile HKV B CTX sink|h2o STEPS] (one row, STEPS
 * steps: for perf record).
 */
#include "kvplan/engine.h"
#include "backend/kvcuda.h"
#include "kvplan/plan.h"
#include "synthetic.h" /* tests/support/synthetic.c, shared with the tests */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVPLAN_FAKE_CUDA
#include "cuda_fake.h"
#include "kmodel.h" /* tests/cuda_model: the kernels' performance model */
#include "kvplan/backend.h"
#include "kvplan/quant.h"

#include <sys/mman.h>
#include <time.h>

static int fail(const char *what, kv_error *err);

/* The flash-decoding kernel the model rows probe: F16 K/V, d_h 128. */
#define KM_FLASH_DECODE "kv_k_flash_decode<1, 128>"

/* Llama-2-7B's shape with n_kv KV heads (32: Llama-2-7B itself; 8: a GQA-8 7B); every matrix
 * of type t reading the zero pages at `zero` (never written, so never backed), norms `ones`.
 * Owned: the struct and its layers. */
static kv_model *fake_7b(kv_dtype t, int n_kv, const void *zero, const float *ones) {
    kv_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    kv_config *c = &m->cfg;
    c->dim = 4096, c->hidden_dim = 11008, c->n_layers = 32, c->n_heads = 32, c->n_kv_heads = n_kv;
    c->head_dim = 128, c->vocab_size = 32000, c->seq_len = 4096, c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f, c->rope_layout = KV_ROPE_HALF, c->bos_id = 1, c->eos_id = 2;
    snprintf(c->arch, sizeof c->arch, "llama");
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        return NULL;
    }
    kv_weight w = {zero, t};
    for (int l = 0; l < c->n_layers; l++) {
        kv_layer_weights *L = &m->layers[l];
        L->attn_norm = L->ffn_norm = ones;
        L->wq = L->wk = L->wv = L->wo = L->w_gate = L->w_down = L->w_up = w;
    }
    m->tok_emb = m->classifier = w; /* tied */
    c->tied_embeddings = 1;
    m->final_norm = ones;
    snprintf(m->format, sizeof m->format, "synthetic");
    return m;
}

/* The matrices' bytes in type t (what a GGUF file of this model holds for them; the
 * classifier is the embedding, as fake_7b ties them). */
static double file_bytes(const kv_config *c, kv_dtype t) {
    size_t r_dim = 0, r_hid = 0;
    kv_error err = {0};
    kv_dtype_row_bytes(t, c->dim, "bench", &r_dim, &err);
    kv_dtype_row_bytes(t, c->hidden_dim, "bench", &r_hid, &err);
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double per_layer = (qd + 2 * kvd + qd /* wo: dim rows of qd */) * r_dim +
                       2.0 * c->hidden_dim * r_dim + (double)c->dim * r_hid;
    return c->n_layers * per_layer + (double)c->vocab_size * r_dim; /* tied embedding */
}

/* CPU seconds of the calling thread: the host's own work in a step, not the time it spends
 * descheduled on a shared machine (the fake device runs nothing and never waits). */
static double thread_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Kernel `name` probed at shape s and modelled on the H100 SXM (tests/cuda_model/kmodel.h);
 * *t and *r filled. Returns 0, or 1 with the message on stderr. */
static int model_kernel(const char *name, km_shape s, km_trace *t, km_result *r) {
    kv_error err = {0};
    km_device d = km_h100_sxm();
    const km_code *c = km_code_find(name, &err);
    if (!c || km_probe(name, &s, t, &err) || km_predict(&d, c, t, r, &err))
        return fail("model", &err);
    return 0;
}

/* Modelled seconds of one layer's (and the logits') decode GEMVs at batch 1 with F16 weights
 * (kv_k_gemv_f16<1>: wq, wk, wv, wo, gate, up, down; the classifier), or, at larger batches,
 * the GEMMs at the roofline (cuBLAS is not modelled: max(F16 weight bytes / HBM, FLOPs /
 * tensor peak), optimistic). *logits: the classifier's. Returns 0, or 1 (message printed). */
static int model_matmuls(const kv_config *c, int B, double *layer, double *logits) {
    km_device d = km_h100_sxm();
    int kvd = c->n_kv_heads * c->head_dim, qd = c->n_heads * c->head_dim;
    const int shapes[5][2] = {{c->dim, qd},
                              {c->dim, kvd},
                              {qd, c->dim},
                              {c->dim, c->hidden_dim},
                              {c->hidden_dim, c->dim}};
    const int count[5] = {1, 2, 1, 2, 1};
    *layer = 0.0;
    for (int i = 0; i < 5; i++) {
        double in = shapes[i][0], out = shapes[i][1];
        double roof = fmax(2.0 * in * out / d.hbm_bw, 2.0 * B * in * out / d.tensor_f16);
        km_trace t;
        km_result r;
        if (B == 1 && model_kernel("kv_k_gemv_f16<1>",
                                   (km_shape){.in = shapes[i][0], .out = shapes[i][1]}, &t, &r))
            return 1;
        *layer += count[i] * (B == 1 ? r.t : roof);
    }
    double in = c->dim, out = c->vocab_size;
    *logits = fmax(2.0 * in * out / d.hbm_bw, 2.0 * B * in * out / d.tensor_f16);
    km_trace t;
    km_result r;
    if (B == 1) {
        if (model_kernel("kv_k_gemv_f16<1>", (km_shape){.in = c->dim, .out = c->vocab_size}, &t,
                         &r))
            return 1;
        *logits = r.t;
    }
    return 0;
}

/* Modelled seconds of a decode step at batch B, context ctx: the layers' GEMVs / GEMMs and
 * flash-decoding (kv_k_flash_decode<F16, 4>, B x H_kv tasks), the logits, and per launch and
 * host wait the step overheads of km_h100_sxm (the small kernels — norms, RoPE, SwiGLU, adds,
 * cache writes, the partition merge — are charged only their launch). *attn_frac: the attention
 * kernel's modelled fraction of HBM. *rc: 0, or 1 when the model failed (message printed). */
static double model_step(const kv_config *c, int B, int ctx, long launches, long syncs,
                         double *attn_frac, int *rc) {
    km_device d = km_h100_sxm();
    double layer = 0.0, logits = 0.0;
    km_trace t;
    km_result r;
    km_shape s = {
        .ctx = ctx, .g = c->n_heads / c->n_kv_heads, .hd = c->head_dim, .tasks = B * c->n_kv_heads};
    *rc = model_matmuls(c, B, &layer, &logits) || model_kernel(KM_FLASH_DECODE, s, &t, &r);
    if (*rc) return 0.0;
    *attn_frac = r.hbm_frac;
    return c->n_layers * (layer + r.t) + logits + launches * d.launch_s + syncs * d.sync_s;
}

/* Untimed decode steps before the timed ones: the first after the separate prefills uploads
 * the batch's whole block tables (resident from then on; h2o: the first two fill the budget),
 * and the next few run with the host caches and TLB the prefills left (at Llama-2-7B batch 32,
 * 4k about 5, 4, 3 ms, then ~1.8 ms from the fifth step on): a decode step in steady state. */
#define WARM_STEPS 5

/* The plan of a decode row at context ctx: the full cache (sink, nothing tracked) when h2o is
 * 0, else uniform R = 1/4 under h2o (every head tracks statistics and, at its budget, evicts
 * by them each step). *prompt: the prefill's tokens (ctx - 1 - WARM_STEPS - steps, so that
 * the last of `steps` timed steps after the warm ones reaches the context; for h2o the budget
 * - 2, so the prefill evicts nothing and the timed steps all evict). */
static int row_plan(const kv_config *c, int ctx, int h2o, int steps, kv_plan *plan, int *prompt,
                    kv_error *err) {
    int rc = h2o ? kv_plan_uniform(c, 0.25, ctx, 16, 16, KV_POLICY_H2O, plan, err)
                 : kv_plan_full(c, ctx, 16, 16, KV_POLICY_SINK, plan, err);
    if (rc) return fail("plan", err);
    *prompt = h2o ? plan->budget[0] - 2 : ctx - 1 - WARM_STEPS - steps;
    return 0;
}

/* One decode step's counters at batch B, context ctx on model m (count-only), printed as a row;
 * wratio: the weights' device bytes per file byte; h2o: row_plan's. Host ms: the thread CPU
 * time of the counted step on this machine (nothing runs on the fake device, so it is the
 * host's own work: packing, staging, the engine's bookkeeping), the least of `steps` (3 in the
 * table; --profile runs more) after WARM_STEPS; pinned MB: pinned host memory live after it. */
static int decode_row(const kv_model *m, int B, int ctx, int h2o, int steps, double wratio,
                      const int *tok, float *logits, kv_error *err) {
    const kv_config *c = &m->cfg;
    kv_plan plan;
    int prompt = 0;
    if (row_plan(c, ctx, h2o, steps, &plan, &prompt, err)) return 1;
    int kvlen = h2o ? plan.budget[0] : ctx; /* the entries each head attends */
    kvfake_reset();
    kvfake_set_count_only(1);
    kvfake_watch_grid(kvfake_paged_attention_kernel(0));
    kvfake_watch_grid2(kvfake_flash_decode_kernel(KV_TYPE_F16, c->head_dim));
    kv_engine_opts o = {0};
    o.device = KV_DEVICE_CUDA;
    o.max_seqs = B;
    o.max_step = ctx;
    kv_engine *e = NULL;
    if (kv_engine_new(m, &plan, &o, &e, err)) return fail("engine", err);
    int seqs[32];
    /* the engine's logits buffer: the backend copies into it from the device (no host copy
     * of the batch's logits, as a serving loop would use it); the caller's otherwise */
    float *out = kv_engine_logits_buffer(e, B, err);
    if (!out) out = logits;
    for (int q = 0; q < B; q++)
        if (kv_engine_seq_open(e, NULL, NULL, &seqs[q], err) ||
            kv_engine_prefill(e, seqs[q], tok, prompt, KV_LOGITS_NONE, NULL, NULL, err))
            return fail("prefill", err);
    /* the steps after WARM_STEPS are counted; host time: the least thread CPU time of the
     * counted steps (this machine's 2 cores are shared), counters: the last */
    for (int r = 0; r < WARM_STEPS; r++)
        if (kv_engine_decode(e, seqs, B, tok, out, err)) return fail("decode", err);
    double host = 1e30;
    for (int r = 0; r < steps; r++) {
        kvfake_zero_traffic();
        double t0 = thread_cpu_seconds();
        if (kv_engine_decode(e, seqs, B, tok, out, err)) return fail("decode", err);
        double dt = thread_cpu_seconds() - t0;
        host = dt < host ? dt : host;
    }
    kvfake_counters k = kvfake_get();
    double kv = (double)B * kvlen * c->n_layers * c->n_kv_heads * 2.0 * c->head_dim;
    double f16 = file_bytes(c, KV_DT_F16);
    double limit = (wratio * f16 + kv * 2.0) / 3.35e12; /* F16 weights, F16 K/V at 3.35 TB/s */
    double attn = 0.0;
    int rc = 0;
    double t = model_step(c, B, kvlen, k.launches + k.gemms, k.syncs, &attn, &rc);
    if (rc) return 1;
    printf("%-4d %-5d %5d %-4s %6ld %8ld %6ld %6ld %11.0f %9ld %8.2f %9.2f %9.1f %7.0f%% %9.1f "
           "%9.1f\n",
           c->n_kv_heads, B, ctx, h2o ? "h2o" : "sink", k.syncs, k.launches, k.gemms, k.h2d_copies,
           k.h2d_bytes, k.last_grid, (double)k.syncs / c->n_layers, host * 1e3,
           (double)k.pinned_live / 1e6, 100 * attn, B / t, B / limit);
    kv_engine_free(e);
    kv_plan_free(&plan);
    return 0;
}

/* One modelled kernel row: bytes, sectors per request, the four bounds and the fraction of
 * HBM. Returns 0, or 1 (message printed). */
static int kernel_row(const char *label, const char *name, km_shape s) {
    km_trace t;
    km_result r;
    if (model_kernel(name, s, &t, &r)) return 1;
    printf("%-28s %9.2f %7.1f %5.2f %6.0f %8.1f %8.1f %8.1f %8.1f %8.1f %-9s %5.0f%%\n", label,
           t.dram_bytes / 1e6, r.sectors_req, r.sector_eff, r.warps_sm, r.t_bw * 1e6,
           r.t_issue * 1e6, r.t_lat * 1e6, r.t_l1 * 1e6, r.t * 1e6, r.bound, 100 * r.hbm_frac);
    return 0;
}

/* The tiled prefill attention (kv_k_prefill_tiled<128>, F16 K/V) of one layer over a first
 * prefill of 4096 tokens, both model shapes, modelled: its DRAM bytes, the five bounds, the
 * modelled time, its tensor-core FLOP/s and fraction of the tensor peak. Returns 0, or 1. */
static int prefill_rows(void) {
    printf("%-28s %9s %7s %6s %8s %8s %8s %8s %9s %9s %-9s %8s %6s\n", "prefill attention, 1 layer",
           "DRAM MB", "sec/req", "warp/SM", "bw us", "issue us", "lat us", "L1 us", "tensor us",
           "model ms", "bound", "TFLOP/s", "tensor");
    const int hkv[2] = {32, 8};
    for (int i = 0; i < 2; i++) {
        km_shape s = {.ctx = 4096, .g = 32 / hkv[i], .hd = 128, .tasks = hkv[i]};
        km_trace t;
        km_result r;
        char label[64];
        snprintf(label, sizeof label, "prefill 4k Hkv %-2d B 1", hkv[i]);
        if (model_kernel("kv_k_prefill_tiled<128>", s, &t, &r)) return 1;
        printf("%-28s %9.2f %7.1f %6.0f %8.1f %8.1f %8.1f %8.1f %9.1f %9.3f %-9s %8.1f %5.0f%%\n",
               label, t.dram_bytes / 1e6, r.sectors_req, r.warps_sm, r.t_bw * 1e6, r.t_issue * 1e6,
               r.t_lat * 1e6, r.t_l1 * 1e6, r.t_tensor * 1e6, r.t * 1e3, r.bound,
               t.mma_flops / r.t / 1e12, 100 * r.tensor_frac);
    }
    return 0;
}

/* The decode GEMV rows of kernel_rows: every typed kernel at batch 1 at Llama-2-7B's shapes
 * (q/k/v/o 4096 -> 4096, gate/up 4096 -> 11008, down 11008 -> 4096) and the GQA-8 7B's k/v
 * (4096 -> 1024), then at batch 8 and 32 (the R = 8, 32 kernels) at 4096 -> 4096; Q4_K on the
 * generic kernel for comparison. Returns 0, or 1 (message printed). */
static int gemv_rows(void) {
    const char *kern[5] = {"kv_k_gemv_f16<%d>", "kv_k_gemv_q<kv_q8_0_dot, %d>",
                           "kv_k_gemv_q<kv_q4_0_dot, %d>", "kv_k_gemv_q4k<%d>",
                           "kv_k_gemv_qk<kv_q6k_lane, %d>"};
    const char *tn[5] = {"F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"};
    const int shapes[4][2] = {{4096, 4096}, {4096, 11008}, {11008, 4096}, {4096, 1024}};
    const int batch[3] = {1, 8, 32};
    char label[64], name[64];
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 3; b++)
            for (int j = 0; j < (b ? 1 : 4); j++) {
                snprintf(label, sizeof label, "GEMV %-5s %5dx%-5d%s", tn[i], shapes[j][1],
                         shapes[j][0], b ? (b == 1 ? " B8" : " B32") : "");
                snprintf(name, sizeof name, kern[i], batch[b]);
                km_shape s = {.in = shapes[j][0], .out = shapes[j][1]};
                if (kernel_row(label, name, s)) return 1;
            }
    km_shape s = {.in = 4096, .out = 4096, .wtype = KV_DT_Q4_K};
    return kernel_row("GEMV Q4_K*  4096x4096", "kv_k_gemv", s);
}

/* The performance model's figures per kernel (tests/cuda_model/kmodel.h): the decode GEMVs at
 * Llama-2-7B's shapes (batch 1) and flash-decoding at 4k for both model shapes. */
static int kernel_rows(void) {
    printf("== kernels, modelled for the %s (docs/cuda-kernels.md; nothing measured) ==\n",
           km_h100_sxm().name);
    printf("%-28s %9s %7s %5s %6s %8s %8s %8s %8s %8s %-9s %6s\n", "kernel (batch 1 unless noted)",
           "DRAM MB", "sec/req", "eff", "warp/SM", "bw us", "issue us", "lat us", "L1 us",
           "model us", "bound", "HBM");
    if (gemv_rows()) return 1;
    char label[64];
    const int hkv[2] = {32, 8}, batch[2] = {1, 32}, ctx[2] = {1024, 4096};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++) {
                snprintf(label, sizeof label, "flash-decode %dk Hkv %-2d B %-2d", ctx[k] / 1024,
                         hkv[i], batch[j]);
                km_shape s = {
                    .ctx = ctx[k], .g = 32 / hkv[i], .hd = 128, .tasks = batch[j] * hkv[i]};
                if (kernel_row(label, KM_FLASH_DECODE, s)) return 1;
            }
    if (prefill_rows()) return 1;
    printf("(* Q4_K on the generic kv_k_gemv, a type switch per element, for comparison; its issue "
           "counts every type's decoder, an upper bound. eff: bytes asked / sectors x 32)\n");
    return 0;
}

/* --profile HKV B CTX sink|h2o STEPS: one decode row of `steps` timed steps (e.g. under perf
 * record: the host's work per step without the table's other rows). Returns the exit code. */
static int profile_row(char **argv) {
    int hkv = atoi(argv[0]), B = atoi(argv[1]), ctx = atoi(argv[2]), steps = atoi(argv[4]);
    int h2o = !strcmp(argv[3], "h2o");
    if ((hkv != 8 && hkv != 32) || B < 1 || B > 32 || ctx < 64 || ctx > 4096 || steps < 1 ||
        steps > ctx / 2 || (!h2o && strcmp(argv[3], "sink")))
        return fprintf(stderr, "bench_cuda_fake: --profile HKV (8|32) B (1-32) CTX (64-4096) "
                               "sink|h2o STEPS (1 .. CTX / 2)\n"),
               2;
    size_t zbytes = (size_t)32000 * 4096 * 4;
    void *zero = mmap(NULL, zbytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    float *ones = malloc(sizeof(float) * 11008), *logits = malloc(sizeof(float) * 32 * 32000);
    int *tok = malloc(sizeof(int) * 4096);
    if (zero == MAP_FAILED || !ones || !logits || !tok)
        return fprintf(stderr, "bench_cuda_fake: out of memory\n"), 2;
    for (int i = 0; i < 11008; i++) ones[i] = 1.0f;
    uint64_t s = 11;
    for (int i = 0; i < 4096; i++) tok[i] = 3 + (int)(synth_next(&s) % 31000);
    kv_model *m = fake_7b(KV_DT_F16, hkv, zero, ones);
    kv_error err = {0};
    int rc = !m || decode_row(m, B, ctx, h2o, steps, 1.0, tok, logits, &err);
    if (m) free(m->layers);
    free(m);
    free(tok);
    free(logits);
    free(ones);
    munmap(zero, zbytes);
    kvfake_reset();
    return rc;
}

static int fake_rows(void) {
    printf("== fake CUDA runtime, count-only (the real cuda/ backend, nothing executed) ==\n");
    size_t zbytes = (size_t)32000 * 4096 * 4;
    void *zero = mmap(NULL, zbytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    float *ones = malloc(sizeof(float) * 11008);
    if (zero == MAP_FAILED || !ones) return fprintf(stderr, "bench_cuda_fake: out of memory\n"), 2;
    for (int i = 0; i < 11008; i++) ones[i] = 1.0f;
    kv_error err = {0};
    const kv_dtype types[2] = {KV_DT_F16, KV_DT_Q4_K};
    const char *tnames[2] = {"F16", "Q4_K"};
    double wratio = 0.0;
    for (int i = 0; i < 2; i++) {
        kv_model *m = fake_7b(types[i], 8, zero, ones);
        kvfake_reset();
        kvfake_set_count_only(1);
        kv_backend *b = NULL;
        if (!m || kv_backend_cuda_new(m, 1, 4096, &b, &err)) return fail("backend", &err);
        kvfake_counters k = kvfake_get();
        double fb = file_bytes(&m->cfg, types[i]);
        /* what creation uploaded, less the RoPE tables (2 x 4096 x 64 floats) and the norms:
         * the matrices, each into a device allocation of its upload's size */
        double up = k.h2d_bytes - 2.0 * 4096 * 64 * 4 - (2.0 * 32 + 1) * 4096 * 4;
        printf("weights %-5s file %6.2f GB, on the device %6.2f GB: %.3f x the file (device "
               "bytes live after creation %.2f GB)\n",
               tnames[i], fb / 1e9, up / 1e9, up / fb, (double)k.device_live / 1e9);
        if (i == 0) wratio = up / fb;
        kv_backend_free(b);
        free(m->layers);
        free(m);
    }
    if (kernel_rows()) return 1;
    printf("== decode steps: counted on the fake runtime; host ms measured here; attn %%HBM and "
           "model tok/s modelled for the %s ==\n",
           km_h100_sxm().name);
    printf("%-4s %-5s %5s %-4s %6s %8s %6s %6s %11s %9s %8s %9s %9s %8s %9s %9s\n", "Hkv", "batch",
           "ctx", "plan", "syncs", "launches", "gemms", "H2D n", "H2D bytes", "attn grid",
           "syncs/L", "host ms", "pinned MB", "attn HBM", "model t/s", "lim tok/s");
    int *tok = malloc(sizeof(int) * 4096);
    uint64_t s = 11;
    for (int i = 0; i < 4096; i++) tok[i] = 3 + (int)(synth_next(&s) % 31000);
    float *logits = malloc(sizeof(float) * 32 * 32000);
    const int kvs[2] = {8, 32}, batches[2] = {1, 32}, ctxs[2] = {1024, 4096};
    for (int hi = 0; hi < 2; hi++) {
        kv_model *m = fake_7b(KV_DT_F16, kvs[hi], zero, ones);
        if (!m || !tok || !logits) return fprintf(stderr, "bench_cuda_fake: out of memory\n"), 2;
        for (int bi = 0; bi < 2; bi++)
            for (int ci = 0; ci < 2; ci++)
                if (decode_row(m, batches[bi], ctxs[ci], 0, 3, wratio, tok, logits, &err)) return 1;
        for (int bi = 0; bi < 2; bi++)
            if (decode_row(m, batches[bi], 4096, 1, 3, wratio, tok, logits, &err)) return 1;
        free(m->layers);
        free(m);
    }
    printf("(device: %d SMs; attention grid: blocks of the decode step's attention kernel; "
           "sink: the full cache; h2o: uniform R = 1/4 of the context, every head tracked and "
           "evicting each step, its model and limit at the budget's length)\n",
           kvfake_sm_count());
    free(tok);
    free(logits);
    free(ones);
    munmap(zero, zbytes);
    kvfake_reset();
    return 0;
}
#endif

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
#ifdef KVPLAN_FAKE_CUDA
    if (argc == 7 && !strcmp(argv[1], "--profile")) return profile_row(argv + 2);
    if (argc > 1) {
        fprintf(stderr, "usage: bench_cuda_fake [--profile HKV B CTX sink|h2o STEPS]\n");
        return 2;
    }
    return fake_rows();
#endif
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
