/* The search stage that keeps retrieval (include/kvplan/retrieval.h, kv_retrieval_search):
 * candidates from the sensitivity curves with the heads' retrieval cost added, and the choice
 * among them by probe accuracy and search perplexity. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/eval.h"
#include "kvplan/retrieval.h"
#include "planner/search_impl.h"
#include "planner/sensitivity.h"

/* Retrieval weights of the weighted candidates (nats of curve objective per nat of answer
 * NLL), then the forced candidates: the 1..KV_RETRIEVAL_MAX_FORCED costliest heads whole. */
static const double weights[] = {0.003, 0.01, 0.03, 0.1, 0.3, 1.0};
#define N_WEIGHTS ((int)(sizeof weights / sizeof weights[0]))
#define KV_RETRIEVAL_MAX_FORCED 4

typedef struct stage {
    const kv_model *m;
    const struct kv_search_opts *o;
    kv_sens_opts so;
    const kv_probes *probes;
    int n_probes, nh, C, window;
    kv_engine *e;
    kv_sens_curves own; /* curves measured here when the search has none */
    const kv_sens_curves *cv;
    int *budget;       /* [(MAX_CAND + 2) * nh]: candidates, then full, uniform */
    kv_policy *policy; /* same layout */
    kv_cache_type *type;
} stage;

/* Curves for the candidates: tokens of level k of curve point x. */
static int level_tokens(const stage *s, int k) {
    long t = (long)k * s->o->block_size;
    return t > s->C ? s->C : (int)t;
}

/* The curves with head h's retrieval cost: w * rise_h * (C - B) / (C - W) (clamped to
 * [0, 1] in the share) added to every point, or, for the `forced` costliest heads, every point
 * below the whole context not allowed (NaN). The base point of the knapsack (value 0 at each
 * head's base level) is detached by marking the base type as one without a curve, so the cost
 * applies there too (the measured base level carries its own value). */
static int penalised(const stage *s, const double *rise, const int *rank, double w, int forced,
                     kv_sens_curves *out, kv_error *err) {
    const kv_sens_curves *c = s->cv;
    const int nh = c->n_heads, TQ = c->n_types * c->n_policies, K = c->n_levels;
    *out = *c;
    size_t pts = (size_t)nh * TQ * K;
    out->levels = kv_malloc((size_t)K * sizeof *out->levels, "curves", err);
    out->base = kv_malloc((size_t)nh * sizeof *out->base, "curves", err);
    out->base_policy = kv_malloc((size_t)nh * sizeof *out->base_policy, "curves", err);
    out->base_type = kv_malloc((size_t)nh * sizeof *out->base_type, "curves", err);
    out->delta_nll = kv_malloc(pts * sizeof *out->delta_nll, "curves", err);
    out->kl = kv_malloc(pts * sizeof *out->kl, "curves", err);
    if (!out->levels || !out->base || !out->base_policy || !out->base_type || !out->delta_nll ||
        !out->kl) {
        kv_sens_curves_free(out);
        return KV_EINTERNAL;
    }
    memcpy(out->levels, c->levels, (size_t)K * sizeof *out->levels);
    memcpy(out->base, c->base, (size_t)nh * sizeof *out->base);
    memcpy(out->base_policy, c->base_policy, (size_t)nh * sizeof *out->base_policy);
    int spare = -1; /* a KV type without a curve */
    for (int t = KV_CACHE_TYPES - 1; t >= 0 && spare < 0; t--) {
        int used = 0;
        for (int ty = 0; ty < c->n_types; ty++) used |= c->types[ty] == (kv_cache_type)t;
        if (!used) spare = t;
    }
    for (int h = 0; h < nh; h++)
        out->base_type[h] = spare >= 0 ? (kv_cache_type)spare : c->base_type[h];
    const double W = (double)(s->C - s->window);
    for (int h = 0; h < nh; h++) {
        int is_forced = rank[h] < forced;
        double r = rise[h] > 0 ? rise[h] : 0;
        for (int tq = 0; tq < TQ; tq++)
            for (int k = 0; k < K; k++) {
                size_t x = ((size_t)h * TQ + tq) * K + k;
                int tok = level_tokens(s, c->levels[k]);
                double share = (double)(s->C - tok) / W;
                share = share < 0 ? 0 : share > 1 ? 1 : share;
                double add = is_forced ? (tok < s->C ? NAN : 0.0) : w * r * share;
                out->delta_nll[x] = c->delta_nll[x] + add;
                out->kl[x] = c->kl[x] + add;
            }
    }
    return KV_OK;
}

/* Rank of each head by retrieval cost (0 = costliest). */
static void rank_heads(const double *rise, int nh, int *rank) {
    for (int h = 0; h < nh; h++) {
        rank[h] = 0;
        for (int g = 0; g < nh; g++)
            if (rise[g] > rise[h] || (rise[g] == rise[h] && g < h)) rank[h]++;
    }
}

/* Solve the candidates' knapsacks into s->budget/policy/type rows; duplicates dropped. */
static int make_candidates(stage *s, const double *rise, kv_retrieval_result *rr, kv_error *err) {
    const int nh = s->nh;
    int *rank = kv_malloc((size_t)nh * sizeof *rank, "ranks", err);
    if (!rank) return KV_EINTERNAL;
    rank_heads(rise, nh, rank);
    int rc = KV_OK;
    rr->n_cand = 0;
    for (int c = 0; c < N_WEIGHTS + KV_RETRIEVAL_MAX_FORCED && !rc; c++) {
        int forced = c < N_WEIGHTS ? 0 : c - N_WEIGHTS + 1;
        double w = c < N_WEIGHTS ? weights[c] : NAN;
        if (forced > nh) break;
        kv_sens_curves cv;
        rc = penalised(s, rise, rank, forced ? 0.0 : w, forced, &cv, err);
        if (rc) break;
        const int k = rr->n_cand;
        int *b = s->budget + (size_t)k * nh;
        kv_policy *p = s->policy + (size_t)k * nh;
        kv_cache_type *t = s->type + (size_t)k * nh;
        kv_error e2 = {0};
        int arc = kv_sens_allocate_typed(&cv, &s->so, b, p, t, NULL, &e2);
        kv_sens_curves_free(&cv);
        if (arc == KV_EINTERNAL) rc = kv_fail(err, arc, "%s", e2.msg);
        if (arc) continue; /* no solution at this ratio (e.g. too many heads forced) */
        int dup = 0, whole = 0;
        for (int j = 0; j < k && !dup; j++)
            dup = !memcmp(b, s->budget + (size_t)j * nh, (size_t)nh * sizeof *b) &&
                  !memcmp(t, s->type + (size_t)j * nh, (size_t)nh * sizeof *t) &&
                  !memcmp(p, s->policy + (size_t)j * nh, (size_t)nh * sizeof *p);
        for (int h = 0; h < nh; h++) whole += b[h] >= s->C;
        if (dup || (forced && whole < forced)) continue;
        rr->weight[k] = w, rr->forced[k] = forced, rr->whole[k] = whole;
        rr->n_cand++;
    }
    free(rank);
    return rc;
}

/* Search perplexity of n sets (rows of s->budget/policy/type from `first`) on the first
 * n_chunks chunks at ids, one batched pass per chunk. */
static int sets_ppl(stage *s, const int *ids, int n_chunks, int first, int n, double *ppl,
                    kv_error *err) {
    const int *b[KV_RETRIEVAL_MAX_CAND + 2];
    const kv_policy *p[KV_RETRIEVAL_MAX_CAND + 2];
    const kv_cache_type *t[KV_RETRIEVAL_MAX_CAND + 2];
    double nll[KV_RETRIEVAL_MAX_CAND + 2], sum[KV_RETRIEVAL_MAX_CAND + 2] = {0};
    for (int i = 0; i < n; i++) {
        b[i] = s->budget + (size_t)(first + i) * s->nh;
        p[i] = s->policy + (size_t)(first + i) * s->nh;
        t[i] = s->type + (size_t)(first + i) * s->nh;
    }
    int rc = KV_OK;
    for (int ch = 0; ch < n_chunks && !rc; ch++) {
        rc = kv_engine_chunk_score_typed(s->e, ids + (long)ch * s->C, s->C, n, b, p, t, NULL, nll,
                                         NULL, NULL, err);
        for (int i = 0; i < n && !rc; i++) sum[i] += nll[i];
    }
    for (int i = 0; i < n && !rc; i++)
        ppl[i] = kv_perplexity_from_nll(sum[i], (long)n_chunks * (s->C - 1));
    return rc;
}

/* The engine, the rows and the curves of the stage. */
static int stage_open(stage *s, const kv_model *m, const struct kv_search_opts *o,
                      const kv_probes *probes, const kv_retrieval_opts *ro, int evict_block,
                      const struct kv_search_result *res, const int *ids, kv_error *err) {
    memset(s, 0, sizeof *s);
    s->m = m, s->o = o, s->probes = probes;
    s->so = kv_search_sens_opts(o);
    s->so.progress = NULL;
    s->so.tasks = NULL;
    s->nh = m->cfg.n_layers * m->cfg.n_kv_heads, s->C = o->context;
    s->n_probes = ro->max_probes > 0 && ro->max_probes < probes->n ? ro->max_probes : probes->n;
    size_t rows = (size_t)(KV_RETRIEVAL_MAX_CAND + 2) * s->nh;
    s->budget = kv_malloc(rows * sizeof *s->budget, "retrieval candidates", err);
    s->policy = kv_malloc(rows * sizeof *s->policy, "retrieval candidates", err);
    s->type = kv_malloc(rows * sizeof *s->type, "retrieval candidates", err);
    if (!s->budget || !s->policy || !s->type) return KV_EINTERNAL;
    int rc = kv_search_engine(m, o, o->kv_type, o->block_size, evict_block,
                              KV_RETRIEVAL_MAX_CAND + 2, o->kv_types_mask, &s->e, err);
    if (rc) return rc;
    if (res->have_sens) {
        s->cv = &res->sens.curves;
        return KV_OK;
    }
    /* no sensitivity run (a grid-only search): measure the curves around uniform here */
    kv_sens_opts so = s->so;
    so.types_mask = o->kv_types_mask;
    s->so.types_mask = o->kv_types_mask;
    if (so.batch > KV_RETRIEVAL_MAX_CAND + 2) so.batch = KV_RETRIEVAL_MAX_CAND + 2;
    int calib = so.calib_chunks > 0 ? so.calib_chunks : 1;
    rc = kv_sens_measure_typed(s->e, m, ids, calib, NULL, NULL, NULL, NULL, 0, &so, &s->own, err);
    s->cv = &s->own;
    return rc;
}

static void stage_close(stage *s) {
    kv_engine_free(s->e);
    kv_sens_curves_free(&s->own);
    free(s->budget);
    free(s->policy);
    free(s->type);
}

/* Full and uniform rows (after the candidates) and their probe scores and perplexities. */
static int score_baselines(stage *s, const int *ids, int n_chunks, kv_retrieval_result *rr,
                           kv_error *err) {
    const int nh = s->nh, F = KV_RETRIEVAL_MAX_CAND, U = F + 1;
    for (int h = 0; h < nh; h++) {
        s->budget[(size_t)F * nh + h] = s->C;
        s->policy[(size_t)F * nh + h] = s->policy[(size_t)U * nh + h] = s->o->policy;
        s->type[(size_t)F * nh + h] = s->type[(size_t)U * nh + h] = s->o->kv_type;
    }
    int rc = kv_uniform_budgets(nh, s->o->ratio, s->C, s->o->block_size, s->budget + (size_t)U * nh,
                                NULL, err);
    double ppl[2];
    if (!rc) rc = sets_ppl(s, ids, n_chunks, F, 2, ppl, err);
    if (!rc) rr->full_ppl = ppl[0], rr->uniform_ppl = ppl[1];
    for (int i = 0; i < 2 && !rc; i++)
        rc = kv_probes_eval(s->e, s->m, s->probes, 0, s->n_probes, s->budget + (size_t)(F + i) * nh,
                            s->policy + (size_t)(F + i) * nh, s->type + (size_t)(F + i) * nh,
                            i ? &rr->uniform : &rr->full, err);
    return rc;
}

/* The search's plan (after the guard) on the probes and the search chunks: on the stage's
 * engine, or on one of the guard's uniform b_s and p when it fell back to uniform. */
static int score_guard(stage *s, const int *ids, int n_chunks, int guard_bs,
                       const struct kv_search_result *res, kv_retrieval_result *rr, kv_error *err) {
    kv_engine *e = s->e;
    int own = guard_bs != s->o->block_size, rc = KV_OK;
    if (own)
        rc = kv_search_engine(s->m, s->o, s->o->kv_type, guard_bs, res->evict_block, 1, 0, &e, err);
    const kv_cache_type *types = own ? NULL : res->kv_types;
    if (!rc)
        rc = kv_probes_eval(e, s->m, s->probes, 0, s->n_probes, res->tokens, res->policy, types,
                            &rr->guard, err);
    double sum = 0, nll = 0;
    for (int ch = 0; ch < n_chunks && !rc; ch++) {
        const int *b[1] = {res->tokens};
        const kv_policy *p[1] = {res->policy};
        const kv_cache_type *t[1] = {types};
        rc = kv_engine_chunk_score_typed(e, ids + (long)ch * s->C, s->C, 1, b, p, t, NULL, &nll,
                                         NULL, NULL, err);
        sum += nll;
    }
    if (!rc) rr->guard_ppl = kv_perplexity_from_nll(sum, (long)n_chunks * (s->C - 1));
    if (own) kv_engine_free(e);
    return rc;
}

/* The head costs: the profile's, or measured here at window W. */
static int stage_heads(stage *s, const kv_retrieval_opts *ro, kv_retrieval_result *rr,
                       kv_error *err) {
    if (ro->heads) {
        kv_retrieval_heads *h = &rr->heads;
        *h = *ro->heads;
        snprintf(h->probes, sizeof h->probes, "%s", s->probes->path);
        h->nll_rise = kv_malloc((size_t)s->nh * sizeof *h->nll_rise, "retrieval heads", err);
        h->accuracy = kv_malloc((size_t)s->nh * sizeof *h->accuracy, "retrieval heads", err);
        if (!h->nll_rise || !h->accuracy) return KV_EINTERNAL;
        memcpy(h->nll_rise, ro->heads->nll_rise, (size_t)s->nh * sizeof *h->nll_rise);
        memcpy(h->accuracy, ro->heads->accuracy, (size_t)s->nh * sizeof *h->accuracy);
        s->window = h->window;
        return KV_OK;
    }
    int w = ro->window;
    if (w <= 0) w = (int)floor(s->o->ratio * s->C);
    if (w < KV_SINK_TOKENS + s->o->evict_block) w = KV_SINK_TOKENS + s->o->evict_block;
    if (w >= s->C) w = s->C - 1;
    s->window = w;
    rr->heads_measured = 1;
    return kv_retrieval_heads_measure(s->e, s->m, s->probes, s->n_probes, w, s->o->progress,
                                      &rr->heads, err);
}

/* Keep the guard's plan when it is within the tolerance, else the candidate with the lowest
 * search perplexity among those within it; KV_EINPUT when there is none. */
static int choose(const stage *s, kv_retrieval_result *rr, kv_error *err) {
    const double floor_acc = rr->full.accuracy - rr->tolerance - 1e-9;
    rr->chosen = -1;
    if (rr->guard.accuracy >= floor_acc) {
        rr->plan = rr->guard, rr->plan_ppl = rr->guard_ppl;
        snprintf(rr->decision, sizeof rr->decision,
                 "the perplexity plan keeps retrieval (accuracy %.1f%%, full %.1f%%)",
                 100 * rr->guard.accuracy, 100 * rr->full.accuracy);
        return KV_OK;
    }
    for (int k = 0; k < rr->n_cand; k++)
        if (rr->cand[k].accuracy >= floor_acc &&
            (rr->chosen < 0 || rr->cand_ppl[k] < rr->cand_ppl[rr->chosen]))
            rr->chosen = k;
    if (rr->chosen < 0)
        return kv_fail(err, KV_EINPUT,
                       "retrieval: no plan at ratio %.4g keeps the probes' accuracy within %.0f "
                       "points of the full cache's %.1f%% (the perplexity plan %.1f%%, the best "
                       "candidate less); pass a larger --ratio or --retrieval-tolerance",
                       s->o->ratio, 100 * rr->tolerance, 100 * rr->full.accuracy,
                       100 * rr->guard.accuracy);
    const int k = rr->chosen;
    rr->plan = rr->cand[k], rr->plan_ppl = rr->cand_ppl[k];
    if (rr->forced[k])
        snprintf(rr->decision, sizeof rr->decision,
                 "retrieval heads whole: the %d costliest heads forced whole, the others by the "
                 "knapsack (%d whole)",
                 rr->forced[k], rr->whole[k]);
    else
        snprintf(rr->decision, sizeof rr->decision,
                 "retrieval knapsack: weight %g on the heads' answer NLL (%d heads whole)",
                 rr->weight[k], rr->whole[k]);
    return KV_OK;
}

/* The chosen candidate becomes the plan in res. */
static void adopt(const stage *s, int k, struct kv_search_result *res) {
    const int nh = s->nh;
    memcpy(res->tokens, s->budget + (size_t)k * nh, (size_t)nh * sizeof *res->tokens);
    memcpy(res->policy, s->policy + (size_t)k * nh, (size_t)nh * sizeof *res->policy);
    if (res->kv_types)
        memcpy(res->kv_types, s->type + (size_t)k * nh, (size_t)nh * sizeof *res->kv_types);
    for (int h = 0; h < nh; h++)
        res->blocks[h] = (res->tokens[h] + s->o->block_size - 1) / s->o->block_size;
    res->winner_sens = 1;
    res->winner_type_uniform = -1;
    res->identical_to_uniform = 0;
}

int kv_retrieval_count(const kv_model *m, const kv_search_opts *o, const kv_probes *p,
                       const kv_retrieval_opts *ro, int S, int have_heads,
                       kv_search_retrieval_count *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    const int C = o->context, nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    if (!o->sensitivity) { /* stage_open: curves around uniform, batch capped */
        kv_sens_opts so = kv_search_sens_opts(o);
        so.types_mask = o->kv_types_mask;
        if (so.batch > KV_RETRIEVAL_MAX_CAND + 2) so.batch = KV_RETRIEVAL_MAX_CAND + 2;
        int rc = kv_sens_count(m, &so, so.calib_chunks > 0 ? so.calib_chunks : 1, 0,
                               &out->curve_evals, &out->curve_evals_max, NULL, err);
        if (rc) return rc;
    }
    int n = ro->max_probes > 0 && ro->max_probes < p->n ? ro->max_probes : p->n;
    long pass = 0; /* one pass over the probes: prefill the prompt, decode all answers but one */
    for (int i = 0; i < n; i++) pass += p->off[i + 1] - p->off[i] - 1;
    out->chunk_evals = 3L * S * C; /* score_baselines (full, uniform), score_guard */
    out->probe_evals = 3 * pass;
    out->chunk_evals_max = out->chunk_evals + (long)KV_RETRIEVAL_MAX_CAND * S * C;
    out->probe_evals_max =
        out->probe_evals + (have_heads ? 0 : (1L + nh) * pass) + KV_RETRIEVAL_MAX_CAND * pass;
    return KV_OK;
}

int kv_retrieval_search(const kv_model *m, const int *ids, int n_chunks,
                        const struct kv_search_opts *o, const kv_probes *probes,
                        const kv_retrieval_opts *ro, int guard_block_size,
                        struct kv_search_result *res, kv_retrieval_result *rr, kv_error *err) {
    memset(rr, 0, sizeof *rr);
    rr->tolerance = ro->tolerance;
    rr->chosen = -1;
    snprintf(rr->heads.probes, sizeof rr->heads.probes, "%s", probes->path);
    if (!res->kv_types)
        return kv_fail(err, KV_EINPUT, "retrieval: the search result has no per-head KV types");
    stage s;
    kv_progress *pg = o->progress;
    int rc = stage_open(&s, m, o, probes, ro, res->evict_block, res, ids, err);
    if (!rc) rc = score_baselines(&s, ids, n_chunks, rr, err);
    if (!rc) rc = score_guard(&s, ids, n_chunks, guard_block_size, res, rr, err);
    if (!rc && pg)
        kv_progress_print(pg, 1,
                          "retrieval: probe accuracy full %.1f%%, uniform %.1f%%, the perplexity "
                          "plan %.1f%%",
                          100 * rr->full.accuracy, 100 * rr->uniform.accuracy,
                          100 * rr->guard.accuracy);
    if (!rc && rr->guard.accuracy < rr->full.accuracy - rr->tolerance - 1e-9) {
        rc = stage_heads(&s, ro, rr, err);
        if (!rc) rc = make_candidates(&s, rr->heads.nll_rise, rr, err);
        if (!rc && rr->n_cand) rc = sets_ppl(&s, ids, n_chunks, 0, rr->n_cand, rr->cand_ppl, err);
        for (int k = 0; k < rr->n_cand && !rc; k++) {
            rc = kv_probes_eval(s.e, m, probes, 0, s.n_probes, s.budget + (size_t)k * s.nh,
                                s.policy + (size_t)k * s.nh, s.type + (size_t)k * s.nh,
                                &rr->cand[k], err);
            if (!rc && pg)
                kv_progress_print(pg, 1,
                                  "retrieval: candidate %d/%d (%d whole): accuracy %.1f%%, answer "
                                  "NLL %.3f, search perplexity %.4f",
                                  k + 1, rr->n_cand, rr->whole[k], 100 * rr->cand[k].accuracy,
                                  rr->cand[k].nll, rr->cand_ppl[k]);
        }
    }
    if (!rc) rc = choose(&s, rr, err);
    if (!rc && rr->chosen >= 0) adopt(&s, rr->chosen, res);
    stage_close(&s);
    if (rc) kv_retrieval_result_free(rr);
    return rc;
}
