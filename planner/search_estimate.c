/* kvplan search --estimate: every stage's token evaluations, counted by the functions the
 * search runs, and a projected wall time. See include/kvplan/estimate.h. */
#include "kvplan/estimate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/h5io.h"
#include "kvplan/kvpr.h"
#include "kvplan/plan.h"
#include "planner/search_impl.h"
#include "planner/sensitivity.h"

static const char *const stage_names[KV_EST_STAGES] = {"grid",   "baselines", "curves",  "refine",
                                                       "verify", "ladder",    "heldout", "kv_types",
                                                       "guard",  "retrieval"};

const char *kv_est_stage_name(int stage) {
    return stage >= 0 && stage < KV_EST_STAGES ? stage_names[stage] : NULL;
}

/* ---------------------------------------------------------------- device presets ---- */

/* The roofline's constants, in one place (docs/search-estimate.md repeats them).
 *
 * Peak FLOP/s and memory bandwidth per preset:
 *  - h100: 989.4e12 FLOP/s, 3.35e12 B/s: planner/hwpresets.c's h100-sxm row (NVIDIA H100
 *    Tensor Core GPU datasheet, SXM column, dense FP16);
 *  - a100: 312e12 FLOP/s, 1.555e12 B/s: hwpresets.c's a100-40g-pcie4 row (NVIDIA A100
 *    datasheet, 40GB PCIe column);
 *  - cpu: 100e9 FLOP/s, 11.2e9 B/s: this project's 2-core AMD EPYC Zen 4 VM, as
 *    docs/benchmarks.md measured it: sgemm of W [2048, 2048] x 512 rows (4.3 GFLOP) in 49-78 ms
 *    on one thread with dequantised tiles, so about 50 GFLOP/s a thread, and the F16 GEMV read
 *    bandwidth 11.2 GB/s.
 *
 * Fractions of peak assumed reached by a prefill of C-token chunks: FLOPs 0.5 on a GPU (the
 * model FLOP utilisation good prefill kernels reach: FlashAttention-2 reports 50-73% of peak
 * for attention, dense GEMMs sit near 70%, the rest of a layer lower) and 0.5 on the CPU
 * (OpenBLAS sgemm at these shapes against the figure above); bandwidth 0.8 (STREAM-like
 * reads reach about 80% of the datasheet figure). */
#define GPU_FLOP_EFF 0.5
#define CPU_FLOP_EFF 0.5
#define BW_EFF 0.8
#define CPU_PEAK_FLOPS 100e9
#define CPU_MEM_BW 11.2e9
/* query rows per tile of a fused attention kernel (FlashAttention-2's block size, Dao 2023) */
#define ATTN_Q_TILE 128.0

typedef struct est_preset {
    const char *key, *hw_key; /* --device-preset, planner/hwpresets.c row (NULL: cpu here) */
} est_preset;

static const est_preset presets[] = {
    {"h100", "h100-sxm"}, {"a100", "a100-40g-pcie4"}, {"cpu", NULL}};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

static int preset_figures(const char *key, kv_roofline *r, kv_error *err) {
    for (int i = 0; i < N_PRESETS; i++) {
        if (!key || strcmp(key, presets[i].key)) continue;
        if (!presets[i].hw_key) {
            r->peak_flops = CPU_PEAK_FLOPS;
            r->mem_bw = CPU_MEM_BW;
            r->flop_eff = CPU_FLOP_EFF;
            snprintf(r->source, sizeof r->source,
                     "preset cpu: 2-core AMD EPYC Zen 4 VM, %.0f GFLOP/s sgemm, %.1f GB/s "
                     "(docs/benchmarks.md)",
                     CPU_PEAK_FLOPS / 1e9, CPU_MEM_BW / 1e9);
        } else {
            kv_hw hw;
            int rc = kv_hw_from_preset(presets[i].hw_key, &hw, err);
            if (rc) return rc;
            r->peak_flops = hw.v_gpu;
            r->mem_bw = hw.mem_bw;
            r->flop_eff = GPU_FLOP_EFF;
            snprintf(r->source, sizeof r->source, "%s", hw.source);
        }
        r->bw_eff = BW_EFF;
        return KV_OK;
    }
    return kv_fail(err, KV_EINPUT, "--device-preset '%s': unknown (known: h100, a100, cpu)",
                   key ? key : "");
}

int kv_estimate_roofline(const kv_config *cfg, int context, int seq_per_pass, const char *preset,
                         kv_roofline *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    int rc = preset_figures(preset, out, err);
    if (rc) return rc;
    const double L = cfg->n_layers, H = cfg->n_heads, KVH = cfg->n_kv_heads, dh = cfg->head_dim;
    const double dim = cfg->dim > 0 ? cfg->dim : H * dh, ffn = cfg->hidden_dim;
    const double V = cfg->vocab_size, C = context, seqs = seq_per_pass > 0 ? seq_per_pass : 1;
    /* weights: q, k, v, o; gate, up, down (SwiGLU); the classifier (the embedding is a row
     * lookup, no FLOPs) */
    const double layer = dim * H * dh + 2 * dim * KVH * dh + H * dh * dim + 3 * dim * ffn;
    const double matmul = L * layer + dim * V;
    out->flops = 2 * matmul + L * 4 * H * dh * (C / 2); /* QK^T and PV over C/2 keys */
    out->weight_bytes = 2 * (matmul + V * dim) / (C * seqs);
    /* K and V in F16: each token's written once and, in a fused attention kernel, the keys
     * before it read once per query tile of ATTN_Q_TILE rows (C / 2 on average) */
    out->kv_bytes = L * 2 * KVH * dh * 2 * (1 + (C / 2) / ATTN_Q_TILE);
    double tc = out->flops / (out->peak_flops * out->flop_eff);
    double tm = (out->weight_bytes + out->kv_bytes) / (out->mem_bw * out->bw_eff);
    out->compute_bound = tc >= tm;
    out->tokens_per_s = 1.0 / (tc > tm ? tc : tm);
    return KV_OK;
}

int kv_estimate_parse_shape(const char *s, int context, kv_config *cfg, kv_error *err) {
    static const char *const names[6] = {"L", "H", "KVH", "DH", "FFN", "VOCAB"};
    long v[6];
    const char *p = s ? s : "";
    for (int i = 0; i < 6; i++) {
        char *end = NULL;
        v[i] = strtol(p, &end, 10);
        if (end != p && !*end && i < 5)
            return kv_fail(err, KV_EINPUT,
                           "--shape '%s': %d fields; expected 6, L,H,KVH,DH,FFN,VOCAB, e.g. "
                           "32,32,8,128,14336,128256",
                           s, i + 1);
        if (end == p || v[i] < 1 || v[i] > (1L << 24) || (i < 5 && *end != ',') || (i == 5 && *end))
            return kv_fail(err, KV_EINPUT,
                           "--shape '%s': field %d (%s) is not a positive integer; expected "
                           "L,H,KVH,DH,FFN,VOCAB, e.g. 32,32,8,128,14336,128256",
                           s ? s : "", i + 1, names[i]);
        p = end + 1;
    }
    if (v[1] % v[2])
        return kv_fail(err, KV_EINPUT,
                       "--shape '%s': H %ld is not a multiple of KVH %ld (grouped-query heads)", s,
                       v[1], v[2]);
    memset(cfg, 0, sizeof *cfg);
    cfg->n_layers = (int)v[0], cfg->n_heads = (int)v[1], cfg->n_kv_heads = (int)v[2];
    cfg->head_dim = (int)v[3], cfg->hidden_dim = (int)v[4], cfg->vocab_size = (int)v[5];
    cfg->dim = cfg->n_heads * cfg->head_dim;
    cfg->seq_len = context;
    cfg->norm_eps = 1e-5f, cfg->rope_theta = 10000.0f;
    cfg->bos_id = cfg->eos_id = -1;
    snprintf(cfg->arch, sizeof cfg->arch, "llama");
    return KV_OK;
}

/* ---------------------------------------------------------------- rates ---- */

int kv_estimate_rate_profile(const char *path, double *tokens_per_s, kv_error *err) {
    kv_h5 *f = NULL;
    int rc = kv_h5_open_read(path, &f, err);
    if (rc) return rc;
    *tokens_per_s = 0;
    if (!kv_h5_attr_exists(f, "/prompts", "profile_tokens_per_s"))
        rc = kv_fail(err, KV_EINPUT,
                     "%s: no /prompts@profile_tokens_per_s (profile it again with this kvplan)",
                     path);
    else
        rc = kv_h5_read_attr_f64(f, "/prompts", "profile_tokens_per_s", tokens_per_s, err);
    kv_h5_close(f);
    if (!rc && !(*tokens_per_s > 0))
        rc =
            kv_fail(err, KV_EINPUT, "%s: /prompts@profile_tokens_per_s is %g", path, *tokens_per_s);
    return rc;
}

/* ---------------------------------------------------------------- counts ---- */

static void row(kv_search_estimate *e, int s, long lo, long hi) {
    e->stage[s].token_evals = lo;
    e->stage[s].token_evals_max = hi > lo ? hi : lo;
    e->stage[s].exact = hi <= lo;
    e->stage[s].token_evals_proj = e->stage[s].token_evals_max;
}

/* The grid, the baselines, the ladder, the held-out figures and the per-type caches. */
static int count_search(const kv_model *m, const kv_profile_inputs *prof, const kv_search_opts *o,
                        int S, int HC, kv_search_estimate *e, kv_error *err) {
    const long C = o->context;
    kv_search_arms a;
    memset(&a, 0, sizeof a);
    int rc = KV_OK;
    if (prof || o->allocation == KV_ALLOC_UNIFORM) {
        rc = kv_search_count_budgets(m, prof, o, &a, err);
        e->distinct = a.distinct;
    } else { /* no profile: every grid point counts as distinct, every baseline as new */
        a.points = a.distinct = (o->allocation == KV_ALLOC_BAKLAVA ? o->n_t * o->n_r : 1) * o->n_p;
        a.base = a.base_distinct = a.base_new = KV_SEARCH_N_BASE;
        e->distinct = -1;
    }
    if (rc) return rc;
    e->points = a.points;
    kv_search_chunks w;
    kv_search_chunk_plan(o, &a, S, HC, &w);
    row(e, KV_EST_GRID, w.grid * C, w.grid * C);
    e->stage[KV_EST_GRID].exact = prof || o->allocation == KV_ALLOC_UNIFORM;
    row(e, KV_EST_BASELINES, w.baselines * C, w.baselines_max * C);
    row(e, KV_EST_LADDER, w.ladder_max / 2 * C, w.ladder_max * C);
    row(e, KV_EST_HELDOUT, w.heldout * C, w.heldout * C);
    long lo = 0, hi = 0;
    rc = kv_search_type_chunks(m, o, o->evict_block, S, HC, &lo, err);
    if (!rc)
        rc = kv_search_type_chunks(m, o, o->evict_block_search ? 1 : o->evict_block, S, HC, &hi,
                                   err);
    if (!rc) row(e, KV_EST_TYPES, lo * C, hi * C);
    return rc;
}

/* Sensitivity planning (kv_sens_search, kv_search_sens_count): round 0's curves (exact with
 * full curves; sparse, the second pass depends on the curves), the refinement rounds' (0 ..
 * max_rounds - 1 of them, each between a round's least and most) and each round's
 * verification on the S search chunks (none when a solution repeats the kept one). */
static int count_sens(const kv_model *m, const kv_search_opts *o, int S, kv_search_estimate *e,
                      kv_error *err) {
    kv_search_sens_work w;
    int rc = kv_search_sens_count(m, o, S, &w, err);
    if (rc || !o->sensitivity) return rc;
    e->curve_passes = w.passes;
    e->sens_rounds = w.rounds;
    row(e, KV_EST_CURVES, w.curves, w.curves_max);
    row(e, KV_EST_REFINE, 0, (long)(w.rounds - 1) * w.round_max);
    row(e, KV_EST_VERIFY, 0, w.verify_max);
    return KV_OK;
}

int kv_search_estimate_count(const kv_model *m, const kv_profile_inputs *prof,
                             const kv_search_opts *o, int n_texts, int S, int HC,
                             const kv_probes *probes, const kv_retrieval_opts *ro, int have_heads,
                             kv_search_estimate *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    for (int s = 0; s < KV_EST_STAGES; s++) out->stage[s].exact = 1;
    out->search_chunks = S, out->heldout_chunks = HC, out->context = o->context;
    if (S < 1) return kv_fail(err, KV_EINPUT, "the estimate needs at least one search chunk");
    int rc = count_search(m, prof, o, S, HC, out, err);
    if (!rc) rc = count_sens(m, o, S, out, err);
    kv_search_guard_count g;
    if (!rc) rc = kv_robust_guard_count(m, o, n_texts, S + HC, &g, err);
    if (!rc)
        row(out, KV_EST_GUARD, g.curve_evals + g.evals + g.alone_evals,
            g.curve_evals_max + g.evals_max + g.alone_evals_max);
    /* the projection: the guard's further source (the sensitivity solution, a candidate only
     * when another plan beat it) midway, and 1.5 passes alone (the plan; its chosen candidate
     * when another is chosen, as often as not) */
    if (!rc)
        out->stage[KV_EST_GUARD].token_evals_proj =
            g.curve_evals_max + (g.evals + g.evals_max) / 2 + g.alone_evals * 3 / 2;
    if (!rc && probes) {
        kv_search_retrieval_count r;
        rc = kv_retrieval_count(m, o, probes, ro, S, have_heads, &r, err);
        if (!rc)
            row(out, KV_EST_RETRIEVAL, r.curve_evals + r.chunk_evals + r.probe_evals,
                r.curve_evals_max + r.chunk_evals_max + r.probe_evals_max);
    }
    for (int s = 0; s < KV_EST_STAGES && !rc; s++) {
        out->token_evals += out->stage[s].token_evals;
        out->token_evals_max += out->stage[s].token_evals_max;
    }
    return rc;
}

/* The stages whose passes are batches of perturbations or candidates. */
static int batched_stage(int s) {
    return s == KV_EST_CURVES || s == KV_EST_REFINE || s == KV_EST_GUARD;
}

void kv_search_estimate_time(kv_search_estimate *e, double tokens_per_s, double batch_tokens_per_s,
                             const char *source) {
    if (!(batch_tokens_per_s > 0)) batch_tokens_per_s = tokens_per_s;
    e->tokens_per_s = tokens_per_s;
    e->batch_tokens_per_s = batch_tokens_per_s;
    snprintf(e->rate_source, sizeof e->rate_source, "%s", source ? source : "");
    e->seconds = e->seconds_max = e->cpu_seconds = e->cpu_seconds_max = e->cpu_share = 0;
    e->seconds_proj = e->cpu_seconds_proj = 0;
    for (int s = 0; s < KV_EST_STAGES; s++) {
        kv_est_row *r = &e->stage[s];
        double rate = batched_stage(s) ? batch_tokens_per_s : tokens_per_s;
        r->seconds = rate > 0 ? (double)r->token_evals / rate : NAN;
        r->seconds_max = rate > 0 ? (double)r->token_evals_max / rate : NAN;
        r->cpu_seconds = r->cpu_seconds_max = r->cpu_seconds_proj = 0;
        r->seconds_proj = rate > 0 ? (double)r->token_evals_proj / rate : NAN;
        r->tokens_per_s = rate;
        e->seconds_proj += r->seconds_proj;
        e->seconds += r->seconds;
        e->seconds_max += r->seconds_max;
    }
}

void kv_search_estimate_time_calibrated(kv_search_estimate *e, const kv_est_rates *r,
                                        const char *source) {
    double share = r->cpu_share > 0 ? r->cpu_share : 1.0;
    e->cpu_share = share;
    snprintf(e->rate_source, sizeof e->rate_source, "%s", source ? source : "");
    e->seconds = e->seconds_max = e->cpu_seconds = e->cpu_seconds_max = 0;
    e->seconds_proj = e->cpu_seconds_proj = 0;
    for (int s = 0; s < KV_EST_STAGES; s++) {
        kv_est_row *w = &e->stage[s];
        double c = r->cpu_per_token[s],
               ch = r->cpu_per_token_max[s] > c ? r->cpu_per_token_max[s] : c;
        w->cpu_seconds = (double)w->token_evals * c;
        w->cpu_seconds_max = (double)w->token_evals_max * ch;
        /* the ladder's p is not known before it runs: the stages after it (the only ones
         * whose costs differ) projected midway between the search's p and the least */
        w->cpu_seconds_proj = (double)w->token_evals_proj * (c + ch) / 2;
        w->seconds_proj = w->cpu_seconds_proj / share;
        w->seconds = w->cpu_seconds / share;
        w->seconds_max = w->cpu_seconds_max / share;
        w->tokens_per_s = ch > 0 ? share / ch : NAN;
        e->cpu_seconds += w->cpu_seconds;
        e->cpu_seconds_max += w->cpu_seconds_max;
        e->cpu_seconds_proj += w->cpu_seconds_proj;
        e->seconds_proj += w->seconds_proj;
        e->seconds += w->seconds;
        e->seconds_max += w->seconds_max;
    }
    e->tokens_per_s = e->stage[KV_EST_GRID].tokens_per_s;
    e->batch_tokens_per_s = e->stage[KV_EST_CURVES].tokens_per_s;
}
