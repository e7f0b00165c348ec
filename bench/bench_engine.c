/* bench_engine: engine and budgeted-runtime throughput in one run, one table.
 *
 *   bench_engine [--shared DIR] [--long-context N] [--kv-mib M] [--max-batch B] [--quick]
 *
 * Rows (issue 2, engine):
 *   - stories260K (../shared/models/stories260K/stories260K.bin): prefill and decode tokens/s;
 *   - a synthetic model of realistic shape built in memory here (random weights from a seeded
 *     generator, never written to disk): dim 768, 12 layers, 12 query heads / 4 KV heads
 *     (GQA), hidden 2048, vocab 32000, seq_len 4096: prefill and decode tokens/s.
 *   Decode rows give the bytes read per decoded token (every weight matrix once, plus the
 *   K/V entries attended) and the achieved GB/s against memcpy measured in the same run.
 * Rows (issue 22, KV storage types; --part 4): on the synthetic model, prefill of 1024 tokens
 * and decode 1024 -> 1087 with the full cache stored in f32, f16 (the default), q8 and q4:
 * decode attention reads the stored rows and dequantises one row at a time, so the column
 * "MB/token" shows what it reads and decode/s what the extra arithmetic costs.
 * Rows (issue 5, runtime under budgets), on the synthetic model at context >= 2048:
 *   - decode tokens/s after a prompt of N tokens for R = 1, 1/4, 1/16 (uniform budgets; the
 *     budgeted prompts are prefilled by Batch-Max Alg. 1 with p = 16, the full one in blocks
 *     of 512);
 *   Decode tokens/s is 1 / the median time of one decode step (per-token medians resist
 *   preemption on a shared machine); prefill tokens/s is the prompt over its wall time.
 *   - the largest batch whose KV blocks fit in M MiB at each ratio (the cache's own block
 *     arithmetic, kv_cache_blocks_needed), and the aggregate decode tokens/s of that batch
 *     (capped at --max-batch), every sequence a copy of the prefilled prompt.
 * memcpy bandwidth counts bytes copied per second (each byte read once and written once); the
 * decode GB/s counts bytes read per second, so "of memcpy" compares read traffic with copy
 * throughput. Timings are wall-clock medians/minima as stated in the columns.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvplan/engine.h"
#include "kvplan/eval.h"
#include "engine/forward.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "synthetic.h" /* tests/support/synthetic.c, shared with the tests */

/* ---- memcpy bandwidth: best of `reps` copies of `bytes`, with 1 and with all threads */
static double memcpy_gbps(size_t bytes, int threads, int reps) {
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a), free(b);
        return 0.0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = kv_now();
#pragma omp parallel num_threads(threads)
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t part = bytes / (size_t)nt, off = part * (size_t)id;
            if (id == nt - 1) part = bytes - off;
            memcpy(b + off, a + off, part);
        }
        double t = kv_now() - t0;
        if (t < best) best = t;
        a[r % bytes] = b[(r * 7919) % bytes]; /* keep the copies observable */
    }
    free(a), free(b);
    return (double)bytes / best / 1e9;
}

/* ---- runs */
static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* Median of n values (sorts them). Per-token medians resist preemption on a shared machine. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct run_stat {
    double prefill_tps, decode_tps;
    double kv_read_per_tok; /* mean K/V bytes attended per decoded token */
    size_t kv_peak;
} run_stat;

static int check(int rc, kv_error *err) {
    if (rc) {
        fprintf(stderr, "bench_engine: %s\n", err->msg);
        exit(2);
    }
    return rc;
}

/* Stored K/V bytes a decode step reads: every retained entry of every head at its type's
 * bytes per token (scales included; issue 22). */
static double cache_bytes(const kv_cache *c) {
    double b = 0;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        b += (double)c->heads[i].len *
             (double)kv_type_token_bytes(c->heads[i].type, c->pool->head_dim);
    return b;
}

/* An engine for plan `plan` with `max_seqs` sequences of up to `ctx` positions, prefill steps
 * of at most `step` rows and `seq_blocks` blocks per sequence (0: what the plan needs). */
static kv_engine *make_engine(const kv_model *m, const kv_plan *plan, int max_seqs, int ctx,
                              int step, long seq_blocks) {
    kv_error err = {0};
    kv_engine *e = NULL;
    kv_engine_opts o = {.device = KV_DEVICE_CPU,
                        .max_seqs = max_seqs,
                        .max_ctx = ctx,
                        .max_step = step,
                        .seq_blocks = seq_blocks};
    check(kv_engine_new(m, plan, &o, &e, &err), &err);
    return e;
}

/* Prefill `T` tokens (steps of p when budgeted, else the engine's max_step), then decode `D`
 * tokens (greedy on the returned logits); returns the sequence, left open on the engine. */
static int prefill_decode(kv_engine *e, const kv_model *m, const int *tokens, int T, int D,
                          run_stat *st) {
    kv_error err = {0};
    int V = m->cfg.vocab_size, seq = -1;
    check(kv_engine_seq_open(e, NULL, NULL, &seq, &err), &err);
    float *logits = malloc((size_t)V * sizeof *logits);
    kv_engine_reset_peak(e);
    double t0 = kv_now();
    check(kv_engine_prefill(e, seq, tokens, T, KV_LOGITS_LAST, logits, NULL, &err), &err);
    double t1 = kv_now();
    double kv_read = 0, *dt = malloc((size_t)(D > 0 ? D : 1) * sizeof *dt);
    for (int d = 0; d < D; d++) {
        int best = 0;
        for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
        double a = kv_now();
        check(kv_engine_decode(e, &seq, 1, &best, logits, &err), &err);
        dt[d] = kv_now() - a;
        kv_read += cache_bytes(kv_engine_cache(e, seq));
    }
    st->prefill_tps = T / (t1 - t0);
    st->decode_tps = D > 0 ? 1.0 / median(dt, D) : 0.0;
    free(dt);
    st->kv_read_per_tok = D > 0 ? kv_read / D : 0.0;
    st->kv_peak = kv_engine_bytes_peak(e);
    free(logits);
    return seq;
}

/* Aggregate decode tokens/s of B sequences forked from one prefilled prompt of T tokens,
 * decoding `steps` tokens together, in a pool of B * seq_blocks blocks. */
static double batch_decode(const kv_model *m, const kv_plan *plan, const int *tokens, int T,
                           int ctx, int B, long seq_blocks, int steps, size_t *peak) {
    kv_error err = {0};
    kv_engine *e = make_engine(m, plan, B, ctx, 512, seq_blocks);
    int *seqs = calloc((size_t)B, sizeof *seqs);
    int *tok = calloc((size_t)B, sizeof *tok);
    float *logits = malloc((size_t)B * m->cfg.vocab_size * sizeof *logits);
    check(kv_engine_seq_open(e, NULL, NULL, &seqs[0], &err), &err);
    check(kv_engine_prefill(e, seqs[0], tokens, T, KV_LOGITS_NONE, NULL, NULL, &err), &err);
    for (int b = 1; b < B; b++) check(kv_engine_seq_fork(e, seqs[0], &seqs[b], &err), &err);
    for (int b = 0; b < B; b++) tok[b] = (b * 31 + 7) % m->cfg.vocab_size;
    kv_engine_reset_peak(e);
    double *dt = malloc((size_t)steps * sizeof *dt);
    for (int s = 0; s < steps; s++) {
        double t0 = kv_now();
        check(kv_engine_decode(e, seqs, B, tok, logits, &err), &err);
        dt[s] = kv_now() - t0;
        for (int b = 0; b < B; b++) {
            const float *l = logits + (size_t)b * m->cfg.vocab_size;
            int best = 0;
            for (int v = 1; v < m->cfg.vocab_size; v++) best = l[v] > l[best] ? v : best;
            tok[b] = best;
        }
    }
    double t = median(dt, steps);
    free(dt);
    *peak = kv_engine_bytes_peak(e);
    kv_engine_free(e);
    free(seqs), free(tok), free(logits);
    return (double)B / t;
}

static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(out, cap, "%s", c);
            }
            break;
        }
    fclose(f);
}

static void loadavg(char *out, size_t cap) {
    snprintf(out, cap, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(out, cap, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

#define HDR "%-34s %6s %7s %4s %10s %10s %10s %8s %8s %10s  %s\n"
#define ROW "%-34s %6d %7.4g %4d %10.1f %10.2f %10.2f %8.2f %8.2f %10.2f  %s\n"

int main(int argc, char **argv) {
    const char *shared = NULL;
    int long_ctx = 2048, kv_mib = 256, max_batch = 64, quick = 0, part = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shared") && i + 1 < argc)
            shared = argv[++i];
        else if (!strcmp(argv[i], "--long-context") && i + 1 < argc)
            long_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-mib") && i + 1 < argc)
            kv_mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-batch") && i + 1 < argc)
            max_batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--part") && i + 1 < argc)
            part = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_engine [--shared DIR] [--long-context N (>= 2048)] "
                            "[--kv-mib M] [--max-batch B] [--quick] [--part 1|2|3|4]\n");
            return 1;
        }
    }
    if (long_ctx < 16 || long_ctx > 4000 || kv_mib < 1 || max_batch < 1) {
        fprintf(stderr, "bench_engine: --long-context must be in [16, 4000], --kv-mib and "
                        "--max-batch positive\n");
        return 1;
    }
    char cpu[256], load0[64], load1[64], path[4096];
    cpu_model(cpu, sizeof cpu);
    loadavg(load0, sizeof load0);
    int threads = omp_get_max_threads();
    printf("kvplan bench_engine: nproc %ld, CPU \"%s\", OpenMP threads %d, OPENBLAS_NUM_THREADS "
           "%s, load average at start %s\n",
           sysconf(_SC_NPROCESSORS_ONLN), cpu, threads,
           getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "(unset)", load0);
    size_t mc_bytes = (size_t)256 << 20;
    double mc1 = memcpy_gbps(mc_bytes, 1, quick ? 3 : 8);
    double mcn = memcpy_gbps(mc_bytes, threads, quick ? 3 : 8);
    double mc = mc1 > mcn ? mc1 : mcn;
    printf("memcpy 256 MiB, best of %d: %.2f GB/s (1 thread), %.2f GB/s (%d threads); wall = "
           "%.2f GB/s\n\n",
           quick ? 3 : 8, mc1, mcn, threads, mc);
    printf(HDR, "workload", "ctx", "R", "B", "prefill/s", "decode/s", "MB/token", "GB/s", "of mcpy",
           "KV MiB", "notes");
    kv_error err = {0};
    kv_model *m = NULL;
    double eng_decode = 0, eng_prefill = 0, eng_frac = 0;

    /* ---- stories260K ---- */
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin",
             shared ? shared : kv_shared_dir());
    if ((part == 0 || part == 1) && kv_model_load(path, &m, &err) == KV_OK) {
        int T = 256, D = 255, V = m->cfg.vocab_size;
        int *tok = malloc(512 * sizeof *tok);
        uint64_t s = 1;
        for (int i = 0; i < 512; i++) tok[i] = i ? (int)(synth_next(&s) % (uint64_t)V) : 1;
        kv_plan full;
        check(kv_plan_full(&m->cfg, 512, 16, 16, KV_POLICY_SINK, &full, &err), &err);
        kv_engine *e = make_engine(m, &full, 1, 512, 512, 0);
        /* prefill: a full 512-token chunk in one call (best of 3) */
        double best_pf = 0;
        run_stat st;
        for (int r = 0; r < 3; r++) {
            kv_engine_seq_close(e, prefill_decode(e, m, tok, 512, 0, &st));
            best_pf = st.prefill_tps > best_pf ? st.prefill_tps : best_pf;
        }
        kv_engine_seq_close(e, prefill_decode(e, m, tok, T, D, &st));
        kv_engine_free(e);
        kv_plan_free(&full);
        double bpt = (double)kv_model_weight_bytes(m) + st.kv_read_per_tok;
        printf(ROW, "stories260K (llama2.c, fp32)", 512, 1.0, 1, best_pf, st.decode_tps, bpt / 1e6,
               bpt * st.decode_tps / 1e9, bpt * st.decode_tps / 1e9 / mc,
               (double)st.kv_peak / 1048576.0, "prefill 512 in 1 call; decode 256->511");
        free(tok);
        kv_model_free(m);
        m = NULL;
    } else if (part == 0 || part == 1) {
        printf("%-34s skipped: %s\n", "stories260K", err.msg);
    }

    /* ---- synthetic model of realistic shape ---- */
    double t0 = kv_now();
    m = synth_model((synth_shape){768, 12, 12, 4, 2048, 32000, 4096}, 0, 42, &err);
    if (!m) check(KV_EINTERNAL, &err);
    double build_s = kv_now() - t0;
    int V = m->cfg.vocab_size, L = m->cfg.n_layers, Hkv = m->cfg.n_kv_heads;
    int maxT = long_ctx > 512 ? long_ctx : 512;
    int *tok = malloc((size_t)maxT * sizeof *tok);
    uint64_t s = 7;
    for (int i = 0; i < maxT; i++) tok[i] = (int)(synth_next(&s) % (uint64_t)V);
    const char *syn = "synthetic 768d 12L 12H/4KV 2048f 32k";
    double type_decode[KV_CACHE_TYPES] = {0};
    if (part == 0 || part == 4) {
        /* KV storage types: full cache at context 1024, every head in type t */
        int T4 = 1024, D4 = quick ? 16 : 64;
        for (int t = 0; t < KV_CACHE_TYPES; t++) {
            kv_plan plan;
            check(kv_plan_full(&m->cfg, T4 + D4, 16, 16, KV_POLICY_SINK, &plan, &err), &err);
            kv_plan_set_kv_type(&plan, (kv_cache_type)t);
            kv_engine *e = make_engine(m, &plan, 1, T4 + D4, 512, 0);
            run_stat st;
            kv_engine_seq_close(e, prefill_decode(e, m, tok, T4, D4, &st));
            kv_engine_free(e);
            type_decode[t] = st.decode_tps;
            double bpt = (double)kv_model_weight_bytes(m) + st.kv_read_per_tok;
            char label[64], note[96];
            snprintf(label, sizeof label, "%s KV %s", "synthetic", kv_type_name((kv_cache_type)t));
            snprintf(note, sizeof note, "full cache; KV read %.2f MB/token; decode %d->%d",
                     st.kv_read_per_tok / 1e6, T4, T4 + D4 - 1);
            printf(ROW, label, T4 + D4, plan.ratio, 1, st.prefill_tps, st.decode_tps, bpt / 1e6,
                   bpt * st.decode_tps / 1e9, bpt * st.decode_tps / 1e9 / mc,
                   (double)st.kv_peak / 1048576.0, note);
            kv_plan_free(&plan);
        }
    }
    if (part == 0 || part == 2) {
        int D = quick ? 8 : 32;
        kv_plan full;
        check(kv_plan_full(&m->cfg, 1024, 16, 16, KV_POLICY_SINK, &full, &err), &err);
        kv_engine *e = make_engine(m, &full, 1, 1024, 512, 0);
        run_stat st;
        prefill_decode(e, m, tok, 512, D, &st);
        kv_engine_free(e);
        kv_plan_free(&full);
        double bpt = (double)kv_model_weight_bytes(m) + st.kv_read_per_tok;
        eng_decode = st.decode_tps;
        eng_prefill = st.prefill_tps;
        eng_frac = bpt * st.decode_tps / 1e9 / mc;
        char note[128];
        snprintf(note, sizeof note, "prefill 512 in 1 call; decode %d after 512; %.0f MB weights",
                 D, (double)kv_model_weight_bytes(m) / 1e6);
        printf(ROW, syn, 512, 1.0, 1, st.prefill_tps, st.decode_tps, bpt / 1e6,
               bpt * st.decode_tps / 1e9, eng_frac, (double)st.kv_peak / 1048576.0, note);
    }

    /* ---- long context under budgets, and the largest batch in kv_mib ---- */
    const double ratios[3] = {1.0, 0.25, 0.0625};
    int D = quick ? 8 : 32, steps = quick ? 3 : 6;
    double long_decode[3] = {0};
    int fits[3] = {0};
    double batch_tps[3] = {0};
    int ran[3] = {0};
    size_t bpeak[3] = {0};
    int ctx_all = long_ctx + D + steps + 1;
    for (int ri = 0; ri < 3 && (part == 0 || part == 3); ri++) {
        int p = 512;
        kv_policy pol = KV_POLICY_SINK;
        kv_plan plan;
        if (ratios[ri] < 1.0) {
            p = 16;
            pol = KV_POLICY_AVGATTN;
            check(kv_plan_uniform(&m->cfg, ratios[ri], long_ctx, 16, p, pol, &plan, &err), &err);
        } else {
            check(kv_plan_full(&m->cfg, ctx_all, 16, 16, pol, &plan, &err), &err);
        }
        const int *bud = plan.full ? NULL : plan.budget;
        kv_engine *e = make_engine(m, &plan, 1, ctx_all, 512, 0);
        run_stat st;
        prefill_decode(e, m, tok, long_ctx, D, &st);
        long_decode[ri] = st.decode_tps;
        double bpt = (double)kv_model_weight_bytes(m) + st.kv_read_per_tok;
        char note[160];
        snprintf(note, sizeof note, "%s, prefill p=%d; decode %d after %d; KV read %.1f MB/token",
                 bud ? kv_policy_name(pol) : "full cache", p, D, long_ctx,
                 st.kv_read_per_tok / 1e6);
        printf(ROW, syn, long_ctx, ratios[ri], 1, st.prefill_tps, st.decode_tps, bpt / 1e6,
               bpt * st.decode_tps / 1e9, bpt * st.decode_tps / 1e9 / mc,
               (double)st.kv_peak / 1048576.0, note);
        /* batch: per-sequence blocks for prompt + decode; decoding evicts before it appends,
         * so a head never holds more than its budget (no extra p block) */
        long seq_blocks = kv_cache_blocks_needed(L, Hkv, bud, ctx_all, 0, 16);
        size_t seq_bytes = (size_t)seq_blocks * kv_engine_bytes_full(e, 16) / ((size_t)L * Hkv);
        fits[ri] = (int)(((size_t)kv_mib << 20) / seq_bytes);
        ran[ri] = fits[ri] < max_batch ? fits[ri] : max_batch;
        kv_engine_free(e);
        /* the prompt's prefill needs its eviction block p on top of the budgets once */
        long first_extra =
            bud ? kv_cache_blocks_needed(L, Hkv, bud, ctx_all, p, 16) - seq_blocks : 0;
        if (ran[ri] >= 1)
            batch_tps[ri] =
                batch_decode(m, &plan, tok, long_ctx, ctx_all, ran[ri],
                             seq_blocks + (first_extra + ran[ri] - 1) / ran[ri], steps, &bpeak[ri]);
        kv_plan_free(&plan);
    }
    for (int ri = 0; ri < 3 && (part == 0 || part == 3); ri++) {
        char note[200];
        snprintf(note, sizeof note,
                 "largest batch in %d MiB of KV: %d%s; aggregate decode, median "
                 "of %d steps",
                 kv_mib, fits[ri], ran[ri] < fits[ri] ? " (ran the --max-batch cap)" : "", steps);
        printf("%-34s %6d %7.4g %4d %10s %10.2f %10s %8s %8s %10.2f  %s\n", syn, long_ctx,
               ratios[ri], ran[ri], "-", batch_tps[ri], "-", "-", "-",
               (double)bpeak[ri] / 1048576.0, note);
    }
    loadavg(load1, sizeof load1);
    printf("\nsynthetic model built in %.1f s (seed 42, never written to disk); load average at "
           "end %s\n",
           build_s, load1);
    if (part == 0 || part == 2)
        printf("targets (synthetic, context 512): decode %.2f of memcpy GB/s (target >= 0.80): %s; "
               "prefill/decode %.1fx (target >= 4x): %s\n",
               eng_frac, eng_frac >= 0.8 ? "met" : "NOT met", eng_prefill / eng_decode,
               eng_prefill >= 4 * eng_decode ? "met" : "NOT met");
    if (part == 0 || part == 4)
        printf("KV types (synthetic, context 1024, full cache): decode tokens/s f32 %.2f, f16 "
               "%.2f, q8 %.2f, q4 %.2f\n",
               type_decode[0], type_decode[1], type_decode[2], type_decode[3]);
    if (part == 0 || part == 3)
        printf("long context %d: decode tokens/s R=1 %.2f, R=1/4 %.2f, R=1/16 %.2f; batch x "
               "tokens/s at the largest batch: %.1f, %.1f, %.1f\n",
               long_ctx, long_decode[0], long_decode[1], long_decode[2], batch_tps[0], batch_tps[1],
               batch_tps[2]);
    free(tok);
    kv_model_free(m);
    return 0;
}
