/* kvplan search --estimate's calibration: real forwards of the model at the shape of each
 * stage of the search (single sequences or batches, eviction block, KV types, budgets), timed in
 * CPU seconds. See include/kvplan/estimate.h and docs/search-estimate.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/estimate.h"
#include "kvplan/kvcache.h"
#include "kvplan/plan.h"
#include "planner/search_impl.h"
#include "planner/sensitivity.h"

/* CPU seconds a single-sequence probe is timed for at least; batched probes time one pass.
 * On stories260K (C 512, batches of 32) the whole calibration takes about 2 CPU seconds. */
#define PROBE_MIN_CPU 0.03
#define MAX_SEQS 64

/* The base sets of a probe: what every head holds before any perturbation. */
typedef enum probe_base {
    BASE_UNIFORM = 0, /* uniform budgets in the search's KV type at the plan's bytes */
    BASE_FULL,        /* the full cache: every head C tokens */
    BASE_MIXED,       /* uniform budgets in the mixed-plan stand-in type at the plan's bytes */
    BASE_TYPE         /* uniform in the probe's own engine type (the per-type caches) */
} probe_base;

/* One calibration shape: passes of `seqs` sets on an engine of its own. */
typedef struct probe {
    probe_base base;
    kv_cache_type type; /* the engine's KV type */
    int bs, p, seqs;    /* block size, eviction block, sets a pass */
    int mask;           /* the engine's further KV types (kv_engine_opts.type_mask) */
    int perturb;        /* 1: set s perturbs one head as a curve point does, scored for KL */
    double cpu_tok;     /* result: CPU seconds per token evaluation */
} probe;

typedef struct calib {
    const kv_model *m;
    const kv_search_opts *o;
    const int *ids;
    int n_chunks, nh, C;
    kv_cache_type mixed; /* the stand-in for a plan of mixed types */
    double wall, cpu;    /* the calibration's totals */
    kv_error *err;
} calib;

/* The stand-in for the knapsack's mixed-type plans: the middle of the candidate types in bytes
 * per token (q8 among f16, q8, q4; the types' code order is the bytes' order), else the
 * search's type. */
static kv_cache_type mixed_type(const kv_search_opts *o) {
    kv_cache_type cand[KV_CACHE_TYPES];
    int nt = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++)
        if (o->sensitivity && (o->kv_types_mask >> t) & 1) cand[nt++] = (kv_cache_type)t;
    return nt > 0 ? cand[nt / 2] : o->kv_type;
}

/* Uniform budgets of type t at the plan's bytes (R in the search's type over the full F16
 * cache), block size bs, as the per-type caches of the search get them. */
static int type_budgets(const calib *c, kv_cache_type t, int bs, int *bud) {
    int hd = c->m->cfg.head_dim;
    double Rb = c->o->ratio * (double)kv_type_token_bytes(c->o->kv_type, hd) /
                (double)kv_type_token_bytes(KV_TYPE_F16, hd);
    double tr = kv_type_token_ratio(Rb, t, hd);
    return kv_uniform_budgets(c->nh, tr > 1.0 ? 1.0 : tr, c->C, bs, bud, NULL, c->err);
}

/* The sets of probe pr: bud, typ [seqs * nh]. Perturbed sets move head s % nh to the
 * (s % K)-th of the curves' K levels in the search's type (the reference curve), or with
 * BASE_UNIFORM to the (s % T)-th candidate type as round 0's curves do. */
static int probe_sets(const calib *c, const probe *pr, int *bud, kv_cache_type *typ) {
    const int nh = c->nh;
    kv_cache_type bt = pr->base == BASE_MIXED  ? c->mixed
                       : pr->base == BASE_TYPE ? pr->type
                                               : c->o->kv_type;
    int rc = KV_OK;
    if (pr->base == BASE_FULL)
        for (int h = 0; h < nh; h++) bud[h] = c->C;
    else
        rc = type_budgets(c, bt, pr->bs, bud);
    for (int i = 0; i < pr->seqs * nh; i++) typ[i] = bt, bud[i] = bud[i % nh];
    if (rc || !pr->perturb) return rc;
    kv_search_opts o = *c->o;
    o.block_size = pr->bs;
    kv_sens_opts so = kv_search_sens_opts(&o);
    int *lv = NULL, K = 0;
    kv_cache_type cand[KV_CACHE_TYPES];
    int nt = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++)
        if (pr->base == BASE_UNIFORM && (pr->mask >> t) & 1) cand[nt++] = (kv_cache_type)t;
    rc = kv_sens_default_levels(&so, &lv, &K, c->err);
    for (int s = 0; s < pr->seqs && !rc; s++) {
        long tok = (long)lv[s % K] * pr->bs;
        bud[s * nh + s % nh] = tok < c->C ? (int)tok : c->C;
        typ[s * nh + s % nh] = nt > 0 ? cand[s % nt] : c->o->kv_type;
    }
    free(lv);
    return rc;
}

/* Time probe pr over the search chunks in turn: a single sequence from its first pass (the
 * search's stages pay their engines' first passes too) until PROBE_MIN_CPU; a batch, one pass
 * after an untimed single-sequence pass (the batch's first pass then allocates as the later
 * ones do). */
static int probe_time(calib *c, kv_engine *e, probe *pr, const int *const *b,
                      const kv_cache_type *const *ty, const float *ref) {
    double nll[MAX_SEQS], kl[MAX_SEQS], c0 = kv_cpu_now(), cpu = 0;
    const int warm = pr->seqs > 1;
    long timed = 0;
    int rc = KV_OK;
    for (long ch = 0; !rc && (warm ? ch <= 1 : cpu < PROBE_MIN_CPU); ch++) {
        int seqs = warm && ch == 0 ? 1 : pr->seqs;
        if (warm && ch == 1) c0 = kv_cpu_now();
        rc = kv_engine_chunk_score_typed(e, c->ids + (ch % c->n_chunks) * c->C, c->C, seqs, b, NULL,
                                         ty, ref, nll, ref ? kl : NULL, NULL, c->err);
        if (!warm || ch >= 1) timed += seqs, cpu = kv_cpu_now() - c0;
    }
    if (!rc) pr->cpu_tok = cpu / ((double)timed * c->C);
    return rc;
}

/* Build the probe's engine and sets, time it, free them. */
static int probe_run(calib *c, probe *pr) {
    const int nh = c->nh, V = c->m->cfg.vocab_size;
    if (pr->seqs < 1 || pr->seqs > MAX_SEQS) pr->seqs = 1;
    int *bud = kv_malloc((size_t)pr->seqs * nh * sizeof *bud, "calibration budgets", c->err);
    kv_cache_type *typ =
        kv_malloc((size_t)pr->seqs * nh * sizeof *typ, "calibration types", c->err);
    /* the curves score KL against the full cache's log-probabilities: a uniform stand-in */
    float *ref =
        pr->perturb ? kv_malloc((size_t)c->C * V * sizeof *ref, "calibration ref", c->err) : NULL;
    kv_engine *e = NULL;
    double w0 = kv_now(), c0 = kv_cpu_now();
    int rc = bud && typ && (!pr->perturb || ref) ? KV_OK : KV_EINTERNAL;
    if (!rc) rc = probe_sets(c, pr, bud, typ);
    if (!rc)
        rc = kv_search_engine(c->m, c->o, pr->type, pr->bs, pr->p, pr->seqs, pr->mask, &e, c->err);
    const int *b[MAX_SEQS];
    const kv_cache_type *ty[MAX_SEQS];
    for (int i = 0; i < pr->seqs; i++) b[i] = bud + (size_t)i * nh, ty[i] = typ + (size_t)i * nh;
    for (long i = 0; ref && i < (long)c->C * V; i++) ref[i] = (float)-log((double)V);
    if (!rc) rc = probe_time(c, e, pr, b, ty, ref);
    kv_engine_free(e);
    free(bud);
    free(typ);
    free(ref);
    c->wall += kv_now() - w0, c->cpu += kv_cpu_now() - c0;
    return rc;
}

/* The guard's pass over one chunk as the guard runs it: the full cache and the batch of blends
 * on one engine (sets of probe bl), the uniform cache (probe un) on another, both held; one
 * chunk untimed, one timed. *cpu_tok: CPU seconds per token evaluation of the three passes. */
static int guard_probe(calib *c, const probe *un, const probe *bl, double *cpu_tok) {
    const int nh = c->nh, n = bl->seqs;
    int *bud = kv_malloc((size_t)(n + 1) * nh * sizeof *bud, "calibration budgets", c->err);
    kv_cache_type *typ = kv_malloc((size_t)(n + 1) * nh * sizeof *typ, "calibration types", c->err);
    kv_engine *ep = NULL, *eu = NULL;
    double w0 = kv_now(), c0 = kv_cpu_now(), t1 = 0, nll[MAX_SEQS];
    int rc = bud && typ ? KV_OK : KV_EINTERNAL;
    if (!rc) rc = probe_sets(c, bl, bud, typ);
    if (!rc) rc = probe_sets(c, un, bud + (size_t)n * nh, typ + (size_t)n * nh);
    if (!rc) rc = kv_search_engine(c->m, c->o, bl->type, bl->bs, bl->p, n, bl->mask, &ep, c->err);
    if (!rc) rc = kv_search_engine(c->m, c->o, un->type, un->bs, un->p, 1, un->mask, &eu, c->err);
    const int *b[MAX_SEQS];
    const kv_cache_type *ty[MAX_SEQS];
    for (int i = 0; i <= n; i++) b[i] = bud + (size_t)i * nh, ty[i] = typ + (size_t)i * nh;
    for (int ch = 0; ch < 2 && !rc; ch++) {
        const int *tk = c->ids + (ch % c->n_chunks) * c->C;
        if (ch == 1) t1 = kv_cpu_now();
        rc = kv_engine_chunk_nll(ep, tk, c->C, 1, NULL, NULL, nll, NULL, c->err);
        if (!rc)
            rc = kv_engine_chunk_score_typed(eu, tk, c->C, 1, b + n, NULL, ty + n, NULL, nll, NULL,
                                             NULL, c->err);
        if (!rc)
            rc = kv_engine_chunk_score_typed(ep, tk, c->C, n, b, NULL, ty, NULL, nll, NULL, NULL,
                                             c->err);
    }
    if (!rc) *cpu_tok = (kv_cpu_now() - t1) / ((double)(n + 2) * c->C);
    kv_engine_free(ep);
    kv_engine_free(eu);
    free(bud);
    free(typ);
    c->wall += kv_now() - w0, c->cpu += kv_cpu_now() - c0;
    return rc;
}

/* Probe indices of the fixed shapes (the ladder's and the per-type caches' follow). */
enum { PR_U, PR_F, PR_X, PR_U11, PR_GUARD, PR_CURVES, PR_REFINE, PR_FIXED };
#define MAX_PROBES (PR_FIXED + 2 * 8 + KV_CACHE_TYPES)

/* The probes of a search with options o: n_ladder pairs (uniform, mixed) at p/2 .. 1 from
 * PR_FIXED on, then one per --kv-types type. The stages after the ladder (held-out, per-type
 * caches, guard) run at the p it chose: the guard and the per-type caches are probed at the
 * least the ladder can choose (1 with the eviction-block search), the most they cost. */
static int probe_list(const kv_search_opts *o, probe *pr, int *n_ladder) {
    const int bs = o->block_size, p = o->evict_block, pl = o->evict_block_search ? 1 : p;
    const int mask = kv_search_sens_opts(o).types_mask, B = o->sens.batch > 1 ? o->sens.batch : 1;
    const kv_cache_type t = o->kv_type;
    pr[PR_U] = (probe){BASE_UNIFORM, t, bs, p, 1, mask, 0, 0};
    pr[PR_F] = (probe){BASE_FULL, t, bs, p, 1, mask, 0, 0};
    pr[PR_X] = (probe){BASE_MIXED, t, bs, p, 1, mask, 0, 0};
    /* the guard's uniform cache: b_s = p = 1 unless p was fixed; its candidates: 4 blends */
    int gb = o->evict_block_search ? 1 : bs, gp = o->evict_block_search ? 1 : p;
    pr[PR_U11] = (probe){BASE_UNIFORM, t, gb, gp, 1, mask, 0, 0};
    pr[PR_GUARD] = (probe){BASE_MIXED, t, bs, pl, KV_ROBUST_N_LAMBDA, mask, 0, 0};
    pr[PR_CURVES] = (probe){BASE_UNIFORM, t, bs, p, B, mask, 1, 0};
    pr[PR_REFINE] = (probe){BASE_MIXED, t, bs, p, B, mask, 1, 0};
    int n = PR_FIXED;
    *n_ladder = 0;
    for (int q = o->evict_block_search ? p / 2 : 0; q >= 1 && *n_ladder < 8;
         q /= 2, (*n_ladder)++) {
        pr[n++] = (probe){BASE_UNIFORM, t, bs, q, 1, mask, 0, 0};
        pr[n++] = (probe){BASE_MIXED, t, bs, q, 1, mask, 0, 0};
    }
    for (int k = 0; k < KV_CACHE_TYPES; k++)
        if ((o->kv_types_mask >> k) & 1)
            pr[n++] = (probe){BASE_TYPE, (kv_cache_type)k, bs, pl, 1, 0, 0, 0};
    return n;
}

/* Each stage's CPU seconds per token from the probes, the mix of sets the stage runs: lo at
 * the search's p, hi at the least p the ladder may choose (held-out, per-type caches, guard;
 * the per-type caches and the guard measured at hi, scaled by the uniform cache's p : 1 ratio
 * for lo). The guard's tokens are its batched passes (G sets a chunk) and its single-sequence
 * passes alone (guard_choose), 1.5 a chunk as its projection counts them: one blended cost. */
static void stage_costs(const probe *pr, int n, int n_ladder, const kv_search_opts *o, double *lo,
                        double *hi) {
    const double U = pr[PR_U].cpu_tok, F = pr[PR_F].cpu_tok, X = pr[PR_X].cpu_tok;
    const int l1 = PR_FIXED + 2 * (n_ladder - 1); /* the ladder's p = 1 pair */
    const double U1 = n_ladder > 0 ? pr[l1].cpu_tok : U, X1 = n_ladder > 0 ? pr[l1 + 1].cpu_tok : X;
    const double sc = U1 > 0 ? U / U1 : 1, G = 2 + KV_ROBUST_N_LAMBDA;
    double lad = 0, typ = 0;
    for (int i = 0; i < n_ladder; i++)
        lad += (pr[PR_FIXED + 2 * i].cpu_tok + pr[PR_FIXED + 2 * i + 1].cpu_tok) / 2 / n_ladder;
    int nt = n - PR_FIXED - 2 * n_ladder;
    for (int i = PR_FIXED + 2 * n_ladder; i < n; i++) typ += pr[i].cpu_tok / nt;
    lo[KV_EST_GRID] = U;
    lo[KV_EST_BASELINES] = (F + 2 * U) / 3; /* full, uniform, squeeze */
    lo[KV_EST_CURVES] = o->sensitivity ? pr[PR_CURVES].cpu_tok : U;
    lo[KV_EST_REFINE] = o->sensitivity ? pr[PR_REFINE].cpu_tok : U;
    lo[KV_EST_VERIFY] = X;                        /* the knapsack's solutions */
    lo[KV_EST_LADDER] = n_ladder > 0 ? lad : U;   /* plan candidate, uniform */
    lo[KV_EST_HELDOUT] = (F + 2 * U + 2 * X) / 5; /* + the other allocation */
    lo[KV_EST_TYPES] = nt > 0 ? typ * sc : U;
    lo[KV_EST_GUARD] = (G * pr[PR_GUARD].cpu_tok * sc + 1.5 * X) / (G + 1.5); /* + alone */
    lo[KV_EST_RETRIEVAL] = U;
    memcpy(hi, lo, KV_EST_STAGES * sizeof *hi);
    hi[KV_EST_HELDOUT] = (F + 2 * U1 + 2 * X1) / 5;
    hi[KV_EST_TYPES] = nt > 0 ? typ : U;
    hi[KV_EST_GUARD] = (G * pr[PR_GUARD].cpu_tok + 1.5 * X1) / (G + 1.5);
}

int kv_estimate_calibrate(const kv_model *m, const kv_search_opts *o, const int *ids, int n_chunks,
                          kv_est_rates *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    if (n_chunks < 1) return kv_fail(err, KV_EINPUT, "calibration: no search chunk");
    calib c = {.m = m, .o = o, .ids = ids, .n_chunks = n_chunks, .C = o->context, .err = err};
    c.nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    c.mixed = mixed_type(o);
    probe pr[MAX_PROBES];
    int n_ladder = 0, n = probe_list(o, pr, &n_ladder), rc = KV_OK;
    for (int i = 0; i < n && !rc; i++) {
        if ((i == PR_CURVES || i == PR_REFINE) && !o->sensitivity) continue;
        if (i == PR_U11) continue; /* the guard's, below */
        rc = i == PR_GUARD ? guard_probe(&c, &pr[PR_U11], &pr[PR_GUARD], &pr[PR_GUARD].cpu_tok)
                           : probe_run(&c, &pr[i]);
        out->probes++;
    }
    if (rc) return rc;
    stage_costs(pr, n, n_ladder, o, out->cpu_per_token, out->cpu_per_token_max);
    out->seconds = c.wall;
    out->cpu_seconds = c.cpu;
    out->cpu_share = c.wall > 0 && c.cpu > 0 ? c.cpu / c.wall : 1.0;
    out->mixed_type = c.mixed;
    return KV_OK;
}
