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

/* Shares of the context a head kept by attention holds in the second round (C/2, 7C/16, 3C/8),
 * and the most heads kept so. */
static const double kept_shares[] = {0.5, 0.4375, 0.375};
#define N_KEPT ((int)(sizeof kept_shares / sizeof kept_shares[0]))
#define KV_RETRIEVAL_MAX_KEPT 2

/* The cheapest KV type the curves allow (bytes a token), and its index among the curves'. */
static int cheapest_type(const kv_sens_curves *c) {
    int best = 0;
    for (int ty = 1; ty < c->n_types; ty++)
        if (kv_type_token_bytes(c->types[ty], c->head_dim) <
            kv_type_token_bytes(c->types[best], c->head_dim))
            best = ty;
    return best;
}

/* Pin the heads ranked below `n_kept` in curves cv to their lowest measured level of the
 * cheapest type and the first policy (value 0, every other point NaN), so the knapsack gives
 * them no more than that; returns those tokens (-1: no such level). */
static int pin_kept(const stage *s, const int *rank, int n_kept, kv_sens_curves *cv) {
    const int TQ = cv->n_types * cv->n_policies, K = cv->n_levels,
              tq0 = cheapest_type(cv) * cv->n_policies;
    int tokens = -1;
    for (int h = 0; h < cv->n_heads; h++) {
        if (rank[h] >= n_kept) continue;
        int k0 = -1;
        for (int k = 0; k < K && k0 < 0; k++)
            if (isfinite(cv->kl[((size_t)h * TQ + tq0) * K + k])) k0 = k;
        if (k0 < 0) return -1;
        for (int tq = 0; tq < TQ; tq++)
            for (int k = 0; k < K; k++) {
                size_t x = ((size_t)h * TQ + tq) * K + k;
                cv->delta_nll[x] = cv->kl[x] = tq == tq0 && k == k0 ? 0.0 : NAN;
            }
        tokens = level_tokens(s, cv->levels[k0]);
    }
    return tokens;
}

/* The other heads of a second-round candidate as DuoAttention's streaming heads: each the
 * same sink + recent window of type t, the largest multiple of b_s that the bytes left after
 * the n_kept heads allow; KV_EINPUT when that is below the policy's floor. */
static int uniform_others(stage *s, int n_kept, int kept, kv_cache_type cheap, kv_cache_type t,
                          int k, kv_error *err) {
    const int nh = s->nh, hd = s->m->cfg.head_dim, bs = s->o->block_size;
    double left = s->o->ratio * nh * s->C * (double)kv_type_token_bytes(KV_TYPE_F16, hd) -
                  (double)n_kept * kept * (double)kv_type_token_bytes(cheap, hd);
    long tok = (long)floor(left / ((double)(nh - n_kept) * kv_type_token_bytes(t, hd)) / bs) * bs;
    if (tok < kv_policy_fixed_tokens(s->o->policy) + s->o->evict_block || nh == n_kept)
        return kv_fail(err, KV_EINPUT, "retrieval: no room for the other heads");
    for (int h = 0; h < nh; h++) {
        const size_t x = (size_t)k * nh + h;
        s->budget[x] = (int)(tok < s->C ? tok : s->C);
        s->policy[x] = s->o->policy;
        s->type[x] = t;
    }
    return KV_OK;
}

/* One candidate of the second round: the n_kept costliest heads keep `kept` tokens of the
 * cheapest type by attention (l2attn); the other heads share the rest of the bytes by the
 * knapsack (others < 0: retrieval weight 1, solved with those heads pinned to their floor
 * and the ratio less their extra bytes) or all alike in KV type `others`. Row k of
 * s->budget/policy/type; KV_EINPUT when nothing fits. */
static int kept_candidate(stage *s, const double *rise, const int *rank, int n_kept, int kept,
                          int others, int k, kv_error *err) {
    const int nh = s->nh;
    kv_sens_curves cv;
    int rc = penalised(s, rise, rank, 1.0, 0, &cv, err);
    if (rc) return rc;
    const kv_cache_type cheap = cv.types[cheapest_type(&cv)];
    int floor_tok = pin_kept(s, rank, n_kept, &cv);
    kv_sens_opts so = s->so;
    double full = (double)nh * s->C * (double)kv_type_token_bytes(KV_TYPE_F16, s->m->cfg.head_dim);
    so.ratio -= n_kept * (double)(kept - floor_tok) *
                (double)kv_type_token_bytes(cheap, s->m->cfg.head_dim) / full;
    int *b = s->budget + (size_t)k * nh;
    kv_policy *p = s->policy + (size_t)k * nh;
    kv_cache_type *t = s->type + (size_t)k * nh;
    if (floor_tok < 0 || floor_tok > kept || so.ratio <= 0)
        rc = kv_fail(err, KV_EINPUT, "retrieval: %d heads of %d tokens do not fit", n_kept, kept);
    if (!rc && others < 0) rc = kv_sens_allocate_typed(&cv, &so, b, p, t, NULL, err);
    if (!rc && others >= 0)
        rc = uniform_others(s, n_kept, kept, cheap, (kv_cache_type)others, k, err);
    kv_sens_curves_free(&cv);
    for (int h = 0; h < nh && !rc; h++)
        if (rank[h] < n_kept) b[h] = kept, p[h] = KV_POLICY_L2ATTN, t[h] = cheap;
    return rc;
}

/* Whether row k repeats one of rows 0..k-1. */
static int is_dup(const stage *s, int k) {
    const int nh = s->nh;
    const size_t at = (size_t)k * nh;
    for (int j = 0; j < k; j++) {
        const size_t o = (size_t)j * nh;
        if (!memcmp(s->budget + at, s->budget + o, (size_t)nh * sizeof *s->budget) &&
            !memcmp(s->type + at, s->type + o, (size_t)nh * sizeof *s->type) &&
            !memcmp(s->policy + at, s->policy + o, (size_t)nh * sizeof *s->policy))
            return 1;
    }
    return 0;
}

/* The second round's candidates, appended after rr->n_cand. */
static int make_kept_candidates(stage *s, const double *rise, kv_retrieval_result *rr,
                                kv_error *err) {
    int *rank = kv_malloc((size_t)s->nh * sizeof *rank, "ranks", err);
    if (!rank) return KV_EINTERNAL;
    rank_heads(rise, s->nh, rank);
    int rc = KV_OK;
    const int per_n = N_KEPT * (1 + KV_CACHE_TYPES);
    for (int c = 0; c < KV_RETRIEVAL_MAX_KEPT * per_n && !rc; c++) {
        const int n = 1 + c / per_n, i = c / (1 + KV_CACHE_TYPES) % N_KEPT;
        const int others = c % (1 + KV_CACHE_TYPES) - 1; /* -1: the knapsack, else a type */
        if (n >= s->nh || rr->n_cand >= KV_RETRIEVAL_MAX_CAND) break;
        if (others >= 0 && !(s->so.types_mask & (1 << others)) && others != (int)s->o->kv_type)
            continue;
        const int k = rr->n_cand;
        int kept = (int)floor(kept_shares[i] * s->C / s->o->block_size) * s->o->block_size;
        kv_error e2 = {0};
        int arc = kept_candidate(s, rise, rank, n, kept, others, k, &e2);
        if (arc == KV_EINTERNAL) rc = kv_fail(err, arc, "%s", e2.msg);
        if (arc || is_dup(s, k)) continue;
        int whole = 0;
        for (int h = 0; h < s->nh; h++) whole += s->budget[(size_t)k * s->nh + h] >= s->C;
        rr->weight[k] = NAN, rr->forced[k] = n, rr->whole[k] = whole, rr->kept[k] = kept;
        rr->others[k] = others;
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

/* Candidates [first, rr->n_cand) on the search chunks and the probes. */
static int score_candidates(stage *s, const int *ids, int n_chunks, int first,
                            kv_retrieval_result *rr, kv_error *err) {
    int rc = KV_OK;
    if (rr->n_cand > first)
        rc = sets_ppl(s, ids, n_chunks, first, rr->n_cand - first, rr->cand_ppl + first, err);
    for (int k = first; k < rr->n_cand && !rc; k++) {
        rc = kv_probes_eval(s->e, s->m, s->probes, 0, s->n_probes, s->budget + (size_t)k * s->nh,
                            s->policy + (size_t)k * s->nh, s->type + (size_t)k * s->nh,
                            &rr->cand[k], err);
        if (!rc && s->o->progress)
            kv_progress_print(s->o->progress, 1,
                              "retrieval: candidate %d/%d (%d whole, %d kept by l2attn): accuracy "
                              "%.1f%%, answer NLL %.3f, search perplexity %.4f",
                              k + 1, rr->n_cand, rr->whole[k], rr->kept[k] ? rr->forced[k] : 0,
                              100 * rr->cand[k].accuracy, rr->cand[k].nll, rr->cand_ppl[k]);
    }
    return rc;
}

/* Whether a candidate's accuracy is within the tolerance of the full cache's. */
static int any_within(const kv_retrieval_result *rr) {
    for (int k = 0; k < rr->n_cand; k++)
        if (rr->cand[k].accuracy >= rr->full.accuracy - rr->tolerance - 1e-9) return 1;
    return 0;
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
    if (rr->kept[k])
        snprintf(rr->decision, sizeof rr->decision,
                 "retrieval heads kept by attention: the %d costliest heads hold %d tokens under "
                 "l2attn, the others %s%s",
                 rr->forced[k], rr->kept[k], rr->others[k] < 0 ? "by the knapsack" : "alike in ",
                 rr->others[k] < 0 ? "" : kv_type_name((kv_cache_type)rr->others[k]));
    else if (rr->forced[k])
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
        if (!rc) rc = score_candidates(&s, ids, n_chunks, 0, rr, err);
        if (!rc && !any_within(rr)) {
            int first = rr->n_cand;
            rc = make_kept_candidates(&s, rr->heads.nll_rise, rr, err);
            if (!rc) rc = score_candidates(&s, ids, n_chunks, first, rr, err);
        }
    }
    if (!rc) rc = choose(&s, rr, err);
    if (!rc && rr->chosen >= 0) adopt(&s, rr->chosen, res);
    stage_close(&s);
    if (rc) kv_retrieval_result_free(rr);
    return rc;
}
