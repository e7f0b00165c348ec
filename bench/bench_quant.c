/* bench_quant: weights in their own type (issue 14 part 6), one run, one table.
 *
 *   bench_quant [--prompt T] [--decode D] [--types F32,F16,BF16,Q8_0,Q4_K] [--quick]
 *               [--threads N]   (the engine's pool; default: the CPUs available)
 *
 * The synthetic model of bench_engine (dim 768, 12 layers, 12 query / 4 KV heads of 64, FFN
 * 2048, vocab 32000; uniform(-1/sqrt(in), 1/sqrt(in)) weights from a seeded splitmix64,
 * built in memory, never written to disk) is run with its matrices in each type: the F32
 * weights are quantised in memory by kv_quantize_row (runtime/quant/quant.c) and the model's
 * matrices point at the typed copies, as a GGUF file of that type would load. Per type, on the
 * engine's CPU backend with a full cache:
 *   - prefill tokens/s of a T-token prompt in one step (the tiled dequantise + sgemm path),
 *     the best of two prompts,
 *   - decode tokens/s = 1 / the median time of one decode step over D steps after the prompt
 *     (the typed dot path; medians resist preemption on a shared machine),
 *   - bytes read per decoded token: every weight matrix once in its type, one embedding row,
 *     the norms, plus the K/V entries attended (fp32), and the GB/s that makes,
 *   - each rate relative to F32. Targets (issue 14): decode F16 >= 1.5x, Q8_0 >= 2x F32 (decode
 *     is bound by the bytes it reads), prefill >= 0.8x F32.
 * Also the memcpy bandwidth of the same run for scale (bytes copied per second) and the
 * single-thread read bandwidth (a sum over 256 MiB), against which the decode GB/s is set
 * (issue 23 item 4: decode at >= 0.8 of the read bandwidth).
 *
 *   bench_quant --write-gguf DIR [--types LIST]
 * writes the synthetic model in each type to DIR/syn-<TYPE>.gguf (the tests' GGUF writer, with
 * a placeholder vocabulary so that llama.cpp loads it too: the peer benchmark,
 * bench/peer_llamacpp.sh).
 *
 *   bench_quant --peer MODEL.gguf [--threads N] [--prompt T] [--decode D] [--kv f16|f32]
 *               [--ppl TOKENS]
 * kvplan's side of the peer benchmark, the measurements and output line of
 * bench/peer_llamacpp.c: one prefill of the T-token prompt after a 16-token warm-up, D greedy
 * decode steps, or the mean next-token NLL over chunks of 512 tokens (--ppl).
 *
 *   bench_quant --kernels [--types LIST]
 * times the kernels alone on one thread (issue 23): the decode GEMV (one row of x times ~96 MiB
 * of W [out, 2048] in its type, kv_qmatmul's integer dots against the fp32-activation dots
 * kvplan used before) in GB/s and as a fraction of the read bandwidth measured in the same run,
 * and for quantised types the two prefill paths (integer dots vs dequantised F32 tiles +
 * sgemm) on W [2048, 2048] for 5, 8, 16, 32 and 512 rows.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "model/model_impl.h"
#include "peer_workload.h"
#include "kvplan/plan.h"
#include "kvplan/quant.h"
#include "quant/quant_dot.h"
#include "quant/quant_gemm.h"
#include "gguf_writer.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 40) / 8388608.0 - 1.0);
}

static void die(kv_error *err) {
    fprintf(stderr, "bench_quant: %s\n", err->msg);
    exit(2);
}

static float *rand_f32(kv_model *m, size_t n, float scale, uint64_t *s, kv_error *err) {
    float *p = kv_malloc(n * sizeof *p, "synthetic tensor", err);
    if (!p) die(err);
    for (size_t i = 0; i < n; i++) p[i] = scale < 0 ? 1.0f : scale * rng_uniform(s);
    if (kv_model_adopt(m, p, err)) die(err);
    return p;
}

/* The F32 synthetic model of bench_engine's shape. */
static kv_model *synthetic(uint64_t seed, kv_error *err) {
    int dim = 768, layers = 12, heads = 12, kvh = 4, hid = 2048, vocab = 32000;
    kv_model *m = kv_model_alloc(layers, err);
    if (!m) die(err);
    kv_config *c = &m->cfg;
    c->dim = dim, c->hidden_dim = hid, c->n_layers = layers, c->n_heads = heads;
    c->n_kv_heads = kvh, c->head_dim = dim / heads, c->vocab_size = vocab, c->seq_len = 4096;
    c->norm_eps = 1e-5f, c->rope_theta = 10000.0f, c->rope_layout = KV_ROPE_ADJACENT;
    snprintf(c->arch, sizeof c->arch, "llama");
    snprintf(m->format, sizeof m->format, "synthetic");
    if (kv_config_check(c, "synthetic model", err)) die(err);
    uint64_t s = seed;
    size_t D = (size_t)dim, Q = D, KV = (size_t)kvh * c->head_dim, F = (size_t)hid;
    float sd = 1.0f / sqrtf((float)dim), sf = 1.0f / sqrtf((float)hid);
    m->tok_emb = kv_weight_f32(rand_f32(m, (size_t)vocab * D, 1.0f, &s, err));
    m->classifier = kv_weight_f32(rand_f32(m, (size_t)vocab * D, sd, &s, err));
    m->final_norm = rand_f32(m, D, -1.0f, &s, err);
    for (int l = 0; l < layers; l++) {
        kv_layer_weights *w = &m->layers[l];
        w->attn_norm = rand_f32(m, D, -1.0f, &s, err);
        w->ffn_norm = rand_f32(m, D, -1.0f, &s, err);
        w->wq = kv_weight_f32(rand_f32(m, Q * D, sd, &s, err));
        w->wk = kv_weight_f32(rand_f32(m, KV * D, sd, &s, err));
        w->wv = kv_weight_f32(rand_f32(m, KV * D, sd, &s, err));
        w->wo = kv_weight_f32(rand_f32(m, D * Q, sd, &s, err));
        w->w_gate = kv_weight_f32(rand_f32(m, F * D, sd, &s, err));
        w->w_up = kv_weight_f32(rand_f32(m, F * D, sd, &s, err));
        w->w_down = kv_weight_f32(rand_f32(m, D * F, sf, &s, err));
    }
    return m;
}

/* w [rows, cols] F32 quantised to type t into a buffer `owner` adopts. */
static kv_weight typed(kv_model *owner, kv_weight w, int rows, int cols, kv_dtype t,
                       kv_error *err) {
    if (t == KV_DT_F32) return w;
    size_t rb;
    if (kv_dtype_row_bytes(t, cols, "synthetic weight", &rb, err)) die(err);
    unsigned char *p = kv_malloc(rb * (size_t)rows, "typed weight", err);
    if (!p) die(err);
    const float *src = w.data;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        kv_quantize_row(t, src + (size_t)r * cols, p + rb * (size_t)r, cols, NULL);
    if (kv_model_adopt(owner, p, err)) die(err);
    kv_weight out = {p, t};
    return out;
}

/* A model sharing f32's config and norms with its matrices in type t (owned by the result). */
static kv_model *as_type(const kv_model *f32, kv_dtype t, kv_error *err) {
    const kv_config *c = &f32->cfg;
    kv_model *m = kv_model_alloc(c->n_layers, err);
    if (!m) die(err);
    m->cfg = *c;
    snprintf(m->format, sizeof m->format, "synthetic");
    int d = c->dim, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim,
        hid = c->hidden_dim, V = c->vocab_size;
    m->tok_emb = typed(m, f32->tok_emb, V, d, t, err);
    m->classifier = typed(m, f32->classifier, V, d, t, err);
    m->final_norm = f32->final_norm;
    for (int l = 0; l < c->n_layers; l++) {
        const kv_layer_weights *a = &f32->layers[l];
        kv_layer_weights *w = &m->layers[l];
        *w = *a;
        w->wq = typed(m, a->wq, q, d, t, err);
        w->wk = typed(m, a->wk, kv, d, t, err);
        w->wv = typed(m, a->wv, kv, d, t, err);
        w->wo = typed(m, a->wo, d, q, t, err);
        w->w_gate = typed(m, a->w_gate, hid, d, t, err);
        w->w_up = typed(m, a->w_up, hid, d, t, err);
        w->w_down = typed(m, a->w_down, d, hid, t, err);
    }
    return m;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double memcpy_gbps(size_t bytes, int reps) {
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a), free(b);
        return 0.0;
    }
    memset(a, 1, bytes), memset(b, 2, bytes);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = kv_now();
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t part = bytes / (size_t)nt, off = part * (size_t)id;
            if (id == nt - 1) part = bytes - off;
            memcpy(b + off, a + off, part);
        }
        double t = kv_now() - t0;
        best = t < best ? t : best;
        a[r % bytes] = b[(r * 7919) % bytes];
    }
    free(a), free(b);
    return (double)bytes / best / 1e9;
}

typedef struct row {
    kv_dtype t;
    double prefill_tps, decode_tps, bytes_per_tok, resident;
} row;

static void run(const kv_model *m, const int *tokens, int T, int D, int threads, row *r,
                kv_error *err) {
    kv_plan full;
    if (kv_plan_full(&m->cfg, T + D + 1, 16, 16, KV_POLICY_SINK, &full, err)) die(err);
    kv_engine_opts o = {.device = KV_DEVICE_CPU,
                        .max_seqs = 1,
                        .max_ctx = T + D + 1,
                        .max_step = T,
                        .n_threads = threads};
    kv_engine *e = NULL;
    if (kv_engine_new(m, &full, &o, &e, err)) die(err);
    int seq = -1, V = m->cfg.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    double best_pf = 1e30;
    for (int rep = 0; rep < 2; rep++) { /* best of 2 prompts: resists preemption */
        if (rep) kv_engine_seq_close(e, seq);
        if (kv_engine_seq_open(e, NULL, NULL, &seq, err)) die(err);
        double t0 = kv_now();
        if (kv_engine_prefill(e, seq, tokens, T, KV_LOGITS_LAST, logits, NULL, err)) die(err);
        double t = kv_now() - t0;
        best_pf = t < best_pf ? t : best_pf;
    }
    r->prefill_tps = T / best_pf;
    double *dt = malloc((size_t)D * sizeof *dt), kv_read = 0;
    size_t kvd = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    for (int d = 0; d < D; d++) {
        int best = 0;
        for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
        double a = kv_now();
        if (kv_engine_decode(e, &seq, 1, &best, logits, err)) die(err);
        dt[d] = kv_now() - a;
        /* K and V of every position so far, every layer, fp32 */
        kv_read += (double)(T + d + 1) * 2.0 * (double)kvd * m->cfg.n_layers * sizeof(float);
    }
    qsort(dt, (size_t)D, sizeof *dt, cmp_dbl);
    double med = D % 2 ? dt[D / 2] : 0.5 * (dt[D / 2 - 1] + dt[D / 2]);
    r->decode_tps = 1.0 / med;
    r->bytes_per_tok = (double)kv_model_weight_bytes(m) + kv_read / D;
    r->resident = (double)kv_model_resident_bytes(m);
    free(dt);
    free(logits);
    kv_engine_free(e);
    kv_plan_free(&full);
}

/* ---- kernels alone (issue 23): decode GEMV against the machine's read bandwidth, and the
 * two prefill paths for quantised weights ---- */

/* Single-thread read bandwidth: sum of a `bytes` buffer of floats, best of `reps` (GB/s). */
static double read_gbps(size_t bytes, int reps, double *sink) {
    size_t n = bytes / sizeof(float);
    float *a = malloc(n * sizeof *a);
    if (!a) return 0.0;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = kv_now();
        float acc[16] = {0};
        for (size_t i = 0; i + 16 <= n; i += 16)
            for (int k = 0; k < 16; k++) acc[k] += a[i + k];
        double t = kv_now() - t0;
        for (int k = 0; k < 16; k++) *sink += acc[k];
        best = t < best ? t : best;
    }
    free(a);
    return (double)bytes / best / 1e9;
}

/* The fp32-activation GEMV kvplan ran before issue 23: one kv_dot_row per output. */
static void gemv_fp32_dots(float *y, const float *x, const unsigned char *w, kv_dtype t, int in,
                           int out, size_t rb) {
    for (int o = 0; o < out; o++) y[o] = kv_dot_row(t, w + rb * (size_t)o, x, in);
}

static void kernels(const char *types) {
    kv_error err = {0};
    double sink = 0;
    const int in = 2048, reps = 15;
    const size_t target = (size_t)96 << 20; /* bytes of weights per type: well past the caches */
    double rd = read_gbps((size_t)256 << 20, 9, &sink);
    printf("bench_quant --kernels: 1 thread, isa %s, single-thread read bandwidth %.2f GB/s "
           "(sum of 256 MiB, best of 9; the machine is shared with other jobs)\n",
           kv_isa_name(kv_isa_best()), rd);
    printf("decode GEMV y[out] = W[out, %d] x, W of ~%zu MiB in its type, best of %d:\n", in,
           target >> 20, reps);
    printf("%-5s %8s %12s %12s %10s %10s %9s\n", "type", "out", "int ms", "fp32-dot ms", "int GB/s",
           "GB/s/read", "speedup");
    uint64_t seed = 99;
    float *x = malloc((size_t)512 * in * sizeof *x);
    for (size_t i = 0; i < (size_t)512 * in; i++) x[i] = rng_uniform(&seed);
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        kv_dtype t;
        if (kv_dtype_parse(tok, &t, &err)) die(&err);
        size_t rb;
        if (kv_dtype_row_bytes(t, in, "bench", &rb, &err)) die(&err);
        int out = (int)(target / rb);
        unsigned char *w = malloc(rb * (size_t)out);
        float *src = malloc((size_t)in * sizeof *src);
        float *y = malloc((size_t)512 * out * sizeof *y);
        if (!w || !src || !y) {
            fprintf(stderr, "bench_quant: out of memory\n");
            exit(2);
        }
        for (int o = 0; o < out; o++) {
            for (int i = 0; i < in; i++) src[i] = rng_uniform(&seed) / 45.0f;
            kv_quantize_row(t, src, w + rb * (size_t)o, in, NULL);
        }
        size_t sf = kv_qmatmul_scratch_floats(t, 512, in, out);
        size_t tf = (size_t)(1 << 20) + (size_t)in; /* one dequantised tile */
        float *scratch = malloc((sf > tf ? sf : tf) * sizeof *scratch);
        double ti[15], tf32[15];
        for (int r = 0; r < reps; r++) {
            double t0 = kv_now();
            kv_qmatmul(y, x, w, t, 1, in, out, scratch, sf);
            ti[r] = kv_now() - t0;
            t0 = kv_now();
            if (t == KV_DT_F32)
                kv_qmatmul(y, x, w, t, 1, in, out, NULL, 0);
            else
                gemv_fp32_dots(y, x, w, t, in, out, rb);
            tf32[r] = kv_now() - t0;
        }
        /* the best of 15: a 10-30 ms call is often preempted on the shared machine */
        qsort(ti, (size_t)reps, sizeof *ti, cmp_dbl);
        qsort(tf32, (size_t)reps, sizeof *tf32, cmp_dbl);
        double mi = ti[0], mf = tf32[0];
        double gb = (double)rb * out / mi / 1e9;
        printf("%-5s %8d %12.2f %12.2f %10.2f %10.2f %9.2f\n", kv_dtype_name(t), out, mi * 1e3,
               mf * 1e3, gb, gb / rd, mf / mi);
        if (kv_qdot_act_kind(t)) {
            /* prefill paths on an FFN-sized [2048, in] slice of W */
            int po = 2048;
            int rows_list[] = {5, 8, 16, 17, 24, 32, 512};
            int gemm = kv_qgemm_covers(t);
            printf(
                "      prefill W[%d, %d]: rows, integer-dot ms, F32-tile+sgemm ms, tile/int, "
                "integer-GEMM ms (chunks of 256 W rows), tile/GEMM, GEMM int8 Gop/s; best of 5\n",
                po, in);
            void *gact = gemm ? malloc(kv_qgemm_act_bytes(512, in)) : NULL;
            void *gpan = gemm ? malloc(kv_qgemm_panel_bytes(256, in)) : NULL;
            for (int k = 0; k < 7; k++) {
                int R = rows_list[k];
                double a[5], b[5], g[5] = {1, 1, 1, 1, 1};
                for (int r = 0; r < 5; r++) {
                    double t0 = kv_now();
                    kv_qmatmul_int(y, x, w, t, R, in, po, scratch);
                    a[r] = kv_now() - t0;
                    t0 = kv_now();
                    kv_qmatmul_tiles(y, x, w, t, R, in, po, scratch);
                    b[r] = kv_now() - t0;
                    if (!gemm || !gact || !gpan) continue;
                    t0 = kv_now();
                    kv_qgemm_quantize(t, x, R, in, gact);
                    for (int o0 = 0; o0 < po; o0 += 256)
                        kv_qgemm_range(y, gact, w, t, R, in, po, o0, o0 + 256 < po ? o0 + 256 : po,
                                       gpan, kv_isa_best());
                    g[r] = kv_now() - t0;
                }
                /* the best of 5 (the machine is shared) */
                qsort(a, 5, sizeof *a, cmp_dbl);
                qsort(b, 5, sizeof *b, cmp_dbl);
                qsort(g, 5, sizeof *g, cmp_dbl);
                double ma = a[0], mb = b[0], mg = g[0];
                printf("      %5d %10.3f %10.3f %8.2f %10.3f %8.2f %8.1f\n", R, ma * 1e3, mb * 1e3,
                       mb / ma, mg * 1e3, mb / mg, 2.0 * R * po * in / mg / 1e9);
            }
            free(gact);
            free(gpan);
        }
        fflush(stdout);
        sink += y[0];
        free(scratch);
        free(y);
        free(src);
        free(w);
    }
    free(x);
    printf("read bandwidth again after the kernels: %.2f GB/s\n",
           read_gbps((size_t)256 << 20, 9, &sink));
    if (sink == 12345.678) printf("%g\n", sink);
}

/* ---- the peer benchmark's kvplan side (bench/peer_llamacpp.sh) ---- */

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static int peer(const char *path, int threads, int T, int D, int kv_f32, long ppl) {
    kv_error err = {0};
    kv_model *m = NULL;
    if (kv_model_load(path, &m, &err)) die(&err);
    int V = m->cfg.vocab_size, C = 1024;
    kv_plan full;
    if (kv_plan_full(&m->cfg, C, 16, 16, KV_POLICY_SINK, &full, &err)) die(&err);
    kv_plan_set_kv_type(&full, kv_f32 ? KV_TYPE_F32 : KV_TYPE_F16);
    kv_engine_opts o = {.device = KV_DEVICE_CPU,
                        .max_seqs = 1,
                        .max_ctx = C,
                        .max_step = 512,
                        .n_threads = threads};
    kv_engine *e = NULL;
    if (kv_engine_new(m, &full, &o, &e, &err)) die(&err);
    int seq = -1;
    int *tok = malloc(512 * sizeof *tok);
    float *logits = malloc((size_t)512 * V * sizeof *logits);
    if (ppl > 0) {
        double nll = 0.0;
        long scored = 0;
        for (long c0 = 0; c0 + PEER_PPL_CHUNK <= ppl; c0 += PEER_PPL_CHUNK) {
            for (int i = 0; i < PEER_PPL_CHUNK; i++) tok[i] = peer_token(c0 + i, V);
            if (kv_engine_seq_open(e, NULL, NULL, &seq, &err) ||
                kv_engine_prefill(e, seq, tok, PEER_PPL_CHUNK, KV_LOGITS_ALL, logits, NULL, &err))
                die(&err);
            kv_engine_seq_close(e, seq);
            for (int i = 0; i + 1 < PEER_PPL_CHUNK; i++, scored++)
                nll += peer_token_nll(logits + (size_t)i * V, V, tok[i + 1]);
        }
        printf("engine kvplan nll %.9f scored %ld kv %s\n", scored ? nll / scored : 0.0, scored,
               kv_f32 ? "f32" : "f16");
    } else {
        for (int i = 0; i < T; i++) tok[i] = peer_token(i, V);
        /* warm-up: pages, the pool's threads */
        if (kv_engine_seq_open(e, NULL, NULL, &seq, &err) ||
            kv_engine_prefill(e, seq, tok, 16, KV_LOGITS_LAST, logits, NULL, &err))
            die(&err);
        kv_engine_seq_close(e, seq);
        if (kv_engine_seq_open(e, NULL, NULL, &seq, &err)) die(&err);
        double t0 = kv_now();
        if (kv_engine_prefill(e, seq, tok, T, KV_LOGITS_LAST, logits, NULL, &err)) die(&err);
        double t_pf = kv_now() - t0;
        int next = argmax(logits, V);
        t0 = kv_now();
        for (int d = 0; d < D; d++) {
            if (kv_engine_decode(e, &seq, 1, &next, logits, &err)) die(&err);
            next = argmax(logits, V);
        }
        double t_dec = kv_now() - t0;
        printf("engine kvplan prefill_s %.6f decode_s %.6f prefill_tps %.2f decode_tps %.3f "
               "last %d\n",
               t_pf, t_dec, T / t_pf, D / t_dec, next);
    }
    free(tok);
    free(logits);
    kv_engine_free(e);
    kv_plan_free(&full);
    kv_model_free(m);
    return 0;
}

static int write_ggufs(const char *dir, const char *types) {
    kv_error err = {0};
    kv_model *f32 = synthetic(768, &err);
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        kv_dtype t;
        if (kv_dtype_parse(tok, &t, &err)) {
            fprintf(stderr, "bench_quant: %s\n", err.msg);
            return 1;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/syn-%s.gguf", dir, kv_dtype_name(t));
        size_t bytes = 0;
        if (tw_write_gguf_vocab(path, f32, t, &bytes, &err)) die(&err);
        printf("%s %.1f MB\n", path, bytes / 1e6);
    }
    kv_model_free(f32);
    return 0;
}

int main(int argc, char **argv) {
    int T = 512, D = 32;
    const char *types = "F32,F16,BF16,Q8_0,Q4_K";
    int kernels_only = 0, threads = 0, kv_f32 = 0, D_given = 0;
    const char *peer_model = NULL, *gguf_dir = NULL;
    long ppl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            D = atoi(argv[++i]), D_given = 1;
        else if (!strcmp(argv[i], "--peer") && i + 1 < argc)
            peer_model = argv[++i];
        else if (!strcmp(argv[i], "--write-gguf") && i + 1 < argc)
            gguf_dir = argv[++i];
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc)
            kv_f32 = !strcmp(argv[++i], "f32");
        else if (!strcmp(argv[i], "--ppl") && i + 1 < argc)
            ppl = atol(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc)
            types = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            T = 128, D = 8;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kernels"))
            kernels_only = 1;
        else {
            fprintf(stderr, "usage: bench_quant [--prompt T] [--decode D] [--types LIST] [--quick] "
                            "[--kernels] [--threads N]\n"
                            "       bench_quant --write-gguf DIR [--types LIST]\n"
                            "       bench_quant --peer MODEL.gguf [--threads N] [--prompt T] "
                            "[--decode D] [--kv f16|f32] [--ppl TOKENS]\n");
            return 1;
        }
    }
    if (T < 5 || D < 1) {
        fprintf(stderr, "bench_quant: --prompt must be >= 5 (the GEMM path) and --decode >= 1\n");
        return 1;
    }
    if (gguf_dir) return write_ggufs(gguf_dir, types);
    if (peer_model) {
        if (T > 512) T = 512;
        return peer(peer_model, threads, T, D_given ? D : 128, kv_f32, ppl);
    }
    if (kernels_only) {
        kernels(types);
        return 0;
    }
    kv_error err = {0};
    kv_model *f32 = synthetic(768, &err);
    int *tokens = malloc((size_t)(T + 1) * sizeof *tokens);
    for (int i = 0; i < T; i++) tokens[i] = (int)((i * 7919u + 13u) % 32000u);
    row rows[KV_DT_COUNT];
    int n = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *tok = strtok(list, ","); tok && n < KV_DT_COUNT; tok = strtok(NULL, ",")) {
        kv_dtype t;
        if (kv_dtype_parse(tok, &t, &err)) {
            fprintf(stderr, "bench_quant: %s\n", err.msg);
            return 1;
        }
        kv_model *m = as_type(f32, t, &err);
        rows[n].t = t;
        run(m, tokens, T, D, threads, &rows[n], &err);
        fprintf(stderr, "  %s done\n", kv_dtype_name(t));
        kv_model_free(m);
        n++;
    }
    double mc = memcpy_gbps((size_t)256 << 20, 5), sink = 0;
    double rd = read_gbps((size_t)256 << 20, 9, &sink);
    printf("bench_quant: synthetic 768-dim model (12 layers, 12/4 heads, FFN 2048, vocab 32000), "
           "prompt %d, %d decode steps, %d threads, isa %s; memcpy %.1f GB/s, single-thread read "
           "%.1f GB/s (machine shared with other jobs)\n",
           T, D, threads > 0 ? threads : kv_cpus_available(), kv_isa_name(kv_isa_best()), mc, rd);
    printf("%-5s %11s %12s %12s %10s %8s %9s %12s %12s\n", "type", "weights MB", "prefill t/s",
           "decode t/s", "MB/token", "GB/s", "GB/s/read", "prefill/F32", "decode/F32");
    double pf = 0, df = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].t == KV_DT_F32) pf = rows[i].prefill_tps, df = rows[i].decode_tps;
    for (int i = 0; i < n; i++) {
        row *r = &rows[i];
        printf("%-5s %11.1f %12.1f %12.2f %10.1f %8.2f %9.2f", kv_dtype_name(r->t),
               r->resident / 1e6, r->prefill_tps, r->decode_tps, r->bytes_per_tok / 1e6,
               r->bytes_per_tok * r->decode_tps / 1e9, r->bytes_per_tok * r->decode_tps / 1e9 / rd);
        if (pf > 0)
            printf(" %12.2f %12.2f\n", r->prefill_tps / pf, r->decode_tps / df);
        else
            printf(" %12s %12s\n", "-", "-");
    }
    free(tokens);
    kv_model_free(f32);
    return sink == 12345.678;
}
