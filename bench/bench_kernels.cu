/* Kernel rows of bench/device.sh: each CUDA kernel of the decode and prefill paths timed on the
 * device with CUDA events (the best of several launches after a warm-up), its achieved GB/s (or
 * TFLOP/s) printed next to the performance model's prediction for the H100 SXM
 * (tests/cuda_model/kmodel.h: the kernel traced on the host shim, its compiled code from
 * tests/cuda_model/kernel_code.inc). Measured: "meas" columns; modelled: "model" columns.
 *   - GEMV at batch 1 (kvcu::gemv), F16 / Q8_0 / Q4_0 / Q4_K weights, Llama-2-7B's shapes
 *     4096x4096 and 11008x4096 (out x in); bytes = the weights + x;
 *   - decode attention (kvcu::flash_decode, F16 K/V, d_h 128, one new token per sequence) at
 *     context 1k and 4k, batch 1 and 32, for 32 KV heads (Llama-2-7B, g 1) and 8 (GQA-8,
 *     g 4); bytes = the K and V rows read;
 *   - prefill attention at 4k (kvcu::paged_attention, every query of a 4096-token prompt,
 *     causal), GQA-8; FLOP = 2 x 2 x d_h x heads x ctx^2 / 2 (QK^T and PV, causal half).
 * The weights and caches hold constant bytes (the times do not depend on the values).
 * Without a CUDA device it prints one line and exits 2. Usage: bench_kernels */
#include "kernels.h"

#include "cache/kvtype.h"
#include "kmodel.h"
#include "kvplan/kvcache.h"
#include "kvplan/quant.h"

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

#define BK_CK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "bench_kernels: %s: %s\n", #x, cudaGetErrorString(e_));           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Device allocations of one benchmark, freed together. */
struct dev_mem {
    std::vector<void *> p;
    ~dev_mem() {
        for (void *q : p) cudaFree(q);
    }
    /* bytes of device memory filled with `fill`, or NULL (message printed). */
    void *get(size_t bytes, int fill) {
        void *q = nullptr;
        if (cudaMalloc(&q, bytes ? bytes : 16) != cudaSuccess) {
            std::fprintf(stderr, "bench_kernels: cudaMalloc of %zu bytes failed\n", bytes);
            return nullptr;
        }
        p.push_back(q);
        return cudaMemset(q, fill, bytes ? bytes : 16) == cudaSuccess ? q : nullptr;
    }
};

/* The least time of `reps` launches of f on stream s, after one warm-up, in seconds (events
 * around each launch). */
template <typename F> int time_best(F f, int reps, cudaStream_t s, double *best) {
    cudaEvent_t a, b;
    BK_CK(cudaEventCreate(&a));
    BK_CK(cudaEventCreate(&b));
    BK_CK(f());
    BK_CK(cudaStreamSynchronize(s));
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        BK_CK(cudaEventRecord(a, s));
        BK_CK(f());
        BK_CK(cudaEventRecord(b, s));
        BK_CK(cudaEventSynchronize(b));
        float ms = 0.0f;
        BK_CK(cudaEventElapsedTime(&ms, a, b));
        *best = ms * 1e-3 < *best ? ms * 1e-3 : *best;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 0;
}

/* One row: measured time, GB/s, TFLOP/s (when flops > 0) and % of 3.35 TB/s; then the model's
 * time, GB/s and bound for kernel `kname` at shape ks (or "-" when it has no probe). */
void row(const char *label, double bytes, double flops, double secs, const char *kname,
         km_shape ks) {
    km_device d = km_h100_sxm();
    std::printf("%-34s %10.1f %9.1f %8.3f %5.0f%%", label, secs * 1e6, bytes / secs / 1e9,
                flops > 0 ? flops / secs / 1e12 : 0.0, 100.0 * bytes / secs / d.hbm_bw);
    km_trace t;
    km_result r;
    kv_error err = {};
    const km_code *c = kname ? km_code_find(kname, &err) : nullptr;
    if (c && !km_probe(kname, &ks, &t, &err) && !km_predict(&d, c, &t, &r, &err))
        std::printf(" %10.1f %9.1f %5.0f%% %s\n", r.t * 1e6, t.dram_bytes / r.t / 1e9,
                    100 * r.hbm_frac, r.bound);
    else
        std::printf(" %10s %9s %6s %s\n", "-", "-", "-", kname ? "(no model)" : "");
}

int bench_gemv(kv_dtype t, const char *tname, const char *kname, int in, int out, cudaStream_t s) {
    size_t rb = 0;
    kv_error err = {};
    if (kv_dtype_row_bytes(t, in, "bench_kernels", &rb, &err)) {
        std::fprintf(stderr, "bench_kernels: %s\n", err.msg);
        return 1;
    }
    dev_mem m;
    void *W = m.get((size_t)out * rb, 0);
    float *x = static_cast<float *>(m.get((size_t)in * 4, 0));
    float *y = static_cast<float *>(m.get((size_t)out * 4, 0));
    size_t ab = kvcu::gemv_act_bytes(t, 1, in);
    void *act = ab ? m.get(ab, 0) : nullptr;
    if (!W || !x || !y || (ab && !act)) return 1;
    double secs = 0.0;
    if (time_best([&] { return kvcu::gemv(W, t, rb, x, y, 1, in, out, act, s); }, 20, s, &secs))
        return 1;
    char label[64];
    std::snprintf(label, sizeof label, "GEMV %-5s %5dx%-5d", tname, out, in);
    km_shape ks = {};
    ks.in = in, ks.out = out, ks.wtype = t;
    row(label, (double)out * rb + in * 4.0, 2.0 * in * out, secs, kname, ks);
    return 0;
}

/* The F16 pool, tables and tasks of n_tasks heads of ctx entries each (d_h 128, block size
 * 16), one new token each; q/o rows of q_stride floats. */
struct attn_setup {
    kv_k_pool P = {};
    int *tables;
    kv_k_attn_task *tasks;
    float *q, *o, *scratch;
    double kv_bytes;
};

int attn_make(dev_mem &m, int n_tasks, int ctx, int n_new, int hkv, int g, attn_setup *a) {
    const int bs = 16, hd = 128, nb = (ctx + bs - 1) / bs;
    size_t rb = kvt_row_bytes(KV_TYPE_F16, hd), bytes = (size_t)n_tasks * nb * 2 * bs * rb;
    std::memset(&a->P, 0, sizeof a->P);
    a->P.data = static_cast<unsigned char *>(m.get(bytes, 0x3c)); /* f16 0x3c3c = 1.06 */
    a->P.bs = bs, a->P.hd = hd;
    for (int t = 0; t <= KV_CACHE_TYPES; t++) {
        a->P.type_first[t] = t <= KV_TYPE_F16 ? 0 : n_tasks * nb;
        a->P.type_offset[t] = t <= KV_TYPE_F16 ? 0 : bytes;
    }
    std::vector<int> tab((size_t)n_tasks * nb);
    std::vector<kv_k_attn_task> tk((size_t)n_tasks);
    for (size_t i = 0; i < tab.size(); i++) tab[i] = (int)i;
    for (int i = 0; i < n_tasks; i++)
        tk[(size_t)i] = kv_k_attn_task{i / hkv * n_new, n_new, i % hkv, ctx, i * nb, 0, 0};
    size_t rows = (size_t)(n_tasks / hkv) * n_new, qs = (size_t)hkv * g * hd;
    a->tables = static_cast<int *>(m.get(tab.size() * 4, 0));
    a->tasks = static_cast<kv_k_attn_task *>(m.get(tk.size() * sizeof tk[0], 0));
    a->q = static_cast<float *>(m.get(rows * qs * 4, 0));
    a->o = static_cast<float *>(m.get(rows * qs * 4, 0));
    a->scratch = static_cast<float *>(m.get((size_t)n_tasks * g * (size_t)ctx * 4, 0));
    a->kv_bytes = (double)n_tasks * ctx * 2.0 * (double)rb;
    if (!a->P.data || !a->tables || !a->tasks || !a->q || !a->o || !a->scratch) return 1;
    BK_CK(cudaMemcpy(a->tables, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
    BK_CK(cudaMemcpy(a->tasks, tk.data(), tk.size() * sizeof tk[0], cudaMemcpyHostToDevice));
    return 0;
}

int bench_decode(int hkv, int B, int ctx, cudaStream_t s) {
    const int g = 32 / hkv, hd = 128, n_tasks = B * hkv;
    const int parts = (ctx + KV_K_FD_PART - 1) / KV_K_FD_PART;
    dev_mem m;
    attn_setup a;
    if (attn_make(m, n_tasks, ctx, 1, hkv, g, &a)) return 1;
    float *part = static_cast<float *>(m.get((size_t)n_tasks * parts * g * (hd + 2) * 4, 0));
    if (!part) return 1;
    double secs = 0.0;
    int qs = hkv * g * hd;
    if (time_best(
            [&] {
                return kvcu::flash_decode(a.P, a.tables, a.tasks, n_tasks, a.q, a.o, qs, g,
                                          KV_K_FD_PART, parts, 1u << KV_TYPE_F16, a.scratch, ctx,
                                          part, nullptr, nullptr, nullptr, s);
            },
            20, s, &secs))
        return 1;
    char label[64];
    std::snprintf(label, sizeof label, "decode attn %dk Hkv %-2d B %-2d", ctx / 1024, hkv, B);
    km_shape ks = {};
    ks.ctx = ctx, ks.g = g, ks.hd = hd, ks.tasks = n_tasks;
    row(label, a.kv_bytes, 4.0 * hd * 32.0 * B * ctx, secs, "kv_k_flash_decode<1, 128>", ks);
    return 0;
}

int bench_prefill(int hkv, int ctx, cudaStream_t s) {
    const int g = 32 / hkv, hd = 128;
    dev_mem m;
    attn_setup a;
    if (attn_make(m, hkv, ctx, ctx, hkv, g, &a)) return 1;
    double secs = 0.0;
    int qs = hkv * g * hd;
    if (time_best(
            [&] {
                return kvcu::paged_attention(a.P, a.tables, a.tasks, hkv, nullptr, nullptr, nullptr,
                                             a.q, a.o, qs, g, a.scratch, ctx, s);
            },
            1, s, &secs))
        return 1;
    char label[64];
    std::snprintf(label, sizeof label, "prefill attn %dk Hkv %-2d (1 layer)", ctx / 1024, hkv);
    row(label, a.kv_bytes, 2.0 * 2.0 * hd * 32.0 * (double)ctx * ctx, secs, nullptr, km_shape{});
    return 0;
}

} // namespace

int main() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        std::fprintf(stderr, "bench_kernels: no CUDA device (%s); run it on a GPU machine\n",
                     e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return 2;
    }
    cudaDeviceProp p;
    BK_CK(cudaGetDeviceProperties(&p, 0));
    cudaStream_t s;
    BK_CK(cudaStreamCreate(&s));
    std::printf("== kernels on %s (sm_%d%d, %d SMs): measured with CUDA events (best of 20) vs "
                "modelled for the %s ==\n",
                p.name, p.major, p.minor, p.multiProcessorCount, km_h100_sxm().name);
    std::printf("%-34s %10s %9s %8s %6s %10s %9s %6s %s\n", "kernel", "meas us", "meas GB/s",
                "TFLOP/s", "HBM", "model us", "mod GB/s", "HBM", "bound");
    const kv_dtype ts[4] = {KV_DT_F16, KV_DT_Q8_0, KV_DT_Q4_0, KV_DT_Q4_K};
    const char *tn[4] = {"F16", "Q8_0", "Q4_0", "Q4_K"};
    const char *kn[4] = {"kv_k_gemv_f16<1>", "kv_k_gemv_q<kv_q8_0_dot, 1>",
                         "kv_k_gemv_q<kv_q4_0_dot, 1>", "kv_k_gemv"};
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++)
        rc = bench_gemv(ts[i], tn[i], kn[i], 4096, 4096, s) ||
             bench_gemv(ts[i], tn[i], kn[i], 4096, 11008, s);
    const int hkv[2] = {32, 8}, batch[2] = {1, 32}, ctxs[2] = {1024, 4096};
    for (int h = 0; h < 2 && !rc; h++)
        for (int b = 0; b < 2 && !rc; b++)
            for (int c = 0; c < 2 && !rc; c++) rc = bench_decode(hkv[h], batch[b], ctxs[c], s);
    if (!rc) rc = bench_prefill(8, 4096, s);
    cudaStreamDestroy(s);
    return rc;
}
