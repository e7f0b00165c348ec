/* kvplan robust planning: the layout of several calibration texts, per-text figures and the
 * guard against a plan worse than uniform. See include/kvplan/robust.h. */
#include "kvplan/robust.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/eval.h"
#include "kvplan/plan.h"
#include "planner/search_impl.h"
#include "planner/sensitivity.h"

const char *kv_robust_decision(const kv_robust_result *r) {
    int k = r->chosen;
    if (k == 0) return "plan";
    if (r->source[k] < 0) return "uniform";
    if (r->source[k] >= 1) {
        static const char *const name[4][2] = {
            {"mean knapsack", "mean knapsack blend"},
            {"worst knapsack", "worst knapsack blend"},
            {"text knapsack", "text knapsack blend"},
            {"sensitivity knapsack", "sensitivity knapsack blend"}};
        int s = r->source[k] == KV_ROBUST_SRC_SENS ? 3 : r->source[k] < 3 ? r->source[k] - 1 : 2;
        return name[s][r->lambda[k] != 1.0];
    }
    return "blend";
}

static const double cand_lambda[KV_ROBUST_N_LAMBDA] = {1.0, 0.75, 0.5, 0.25};
#define N_SRC KV_ROBUST_N_SRC
#define MAX_SETS (KV_ROBUST_MAX_CAND - 1) /* the candidates run on the plan's engine */
_Static_assert(KV_ROBUST_SRC_SENS == 7, "the source codes written in /search/texts/candidates");
#define PASS_TOL 1e-6 /* relative: rounding differences between engines are not losses */

int kv_robust_objective_parse(const char *s, kv_robust_objective *out, kv_error *err) {
    if (!strcmp(s, "mean"))
        *out = KV_ROBUST_MEAN;
    else if (!strcmp(s, "worst"))
        *out = KV_ROBUST_WORST;
    else if (!strcmp(s, "both"))
        *out = KV_ROBUST_BOTH;
    else
        return kv_fail(err, KV_EINPUT, "--text-objective '%s': expected mean, worst or both", s);
    return KV_OK;
}

const char *kv_robust_objective_name(kv_robust_objective o) {
    return o == KV_ROBUST_WORST ? "worst" : o == KV_ROBUST_BOTH ? "both" : "mean";
}

int kv_robust_lay_out(int n_texts, const char *const *names, const int *const *ids, const long *n,
                      int C, long eval_tokens, long heldout_tokens, int **out_ids, int *S, int *HC,
                      int **chunk_text, kv_error *err) {
    *out_ids = NULL;
    *chunk_text = NULL;
    *S = *HC = 0;
    if (n_texts < 1 || n_texts > KV_ROBUST_MAX_TEXTS)
        return kv_fail(err, KV_EINPUT, "%d texts: give between 1 and %d", n_texts,
                       KV_ROBUST_MAX_TEXTS);
    if (C < 2) return kv_fail(err, KV_EINPUT, "context %d is too small", C);
    long per_e = eval_tokens / n_texts, per_h = heldout_tokens / n_texts;
    if (per_e < C) per_e = C;
    if (heldout_tokens > 0 && per_h < C) per_h = C;
    int s[KV_ROBUST_MAX_TEXTS], h[KV_ROBUST_MAX_TEXTS], max_s = 0, max_h = 0;
    for (int t = 0; t < n_texts; t++) {
        long e = per_e < n[t] ? per_e : n[t];
        s[t] = (int)(e / C);
        if (s[t] < 1)
            return kv_fail(err, KV_EINPUT,
                           "%s: the text has %ld tokens, fewer than one chunk of %d; use a longer "
                           "text or a smaller --context",
                           names[t], n[t], C);
        long left = n[t] - (long)s[t] * C;
        long ho = heldout_tokens > 0 ? (per_h < left ? per_h : left) : 0;
        h[t] = (int)(ho / C);
        *S += s[t];
        *HC += h[t];
        if (s[t] > max_s) max_s = s[t];
        if (h[t] > max_h) max_h = h[t];
    }
    if (heldout_tokens > 0 && *HC < 1)
        return kv_fail(err, KV_EINPUT,
                       "no text has tokens left for a held-out chunk of %d after its search "
                       "chunks (%s has %ld tokens); use longer texts, fewer --eval-tokens or "
                       "--heldout-tokens 0",
                       C, names[0], n[0]);
    int total = *S + *HC;
    int *out = kv_malloc((size_t)total * C * sizeof *out, "text layout", err);
    int *ct = kv_malloc((size_t)total * sizeof *ct, "text layout", err);
    if (!out || !ct) {
        free(out);
        free(ct);
        return KV_EINTERNAL;
    }
    int k = 0;
    for (int part = 0; part < 2; part++) {
        const int *cnt = part ? h : s;
        int rounds = part ? max_h : max_s;
        for (int r = 0; r < rounds; r++)
            for (int t = 0; t < n_texts; t++) {
                if (r >= cnt[t]) continue;
                long start = ((part ? (long)s[t] : 0) + r) * C;
                memcpy(out + (long)k * C, ids[t] + start, (size_t)C * sizeof *out);
                ct[k++] = t;
            }
    }
    *out_ids = out;
    *chunk_text = ct;
    return KV_OK;
}

void kv_robust_result_free(kv_robust_result *r) {
    if (!r) return;
    for (int t = 0; r->names && t < r->n_texts; t++) free(r->names[t]);
    free(r->names);
    free(r->text_tokens);
    free(r->chunks);
    free(r->full);
    free(r->uniform);
    free(r->plan);
    free(r->cand);
    memset(r, 0, sizeof *r);
}

static int result_alloc(kv_robust_result *r, const kv_robust_layout *lay, kv_error *err) {
    int N = lay->n_texts;
    r->n_texts = N;
    r->names = kv_calloc((size_t)N, sizeof *r->names, "text names", err);
    r->text_tokens = kv_malloc((size_t)N * sizeof *r->text_tokens, "text figures", err);
    r->chunks = kv_calloc((size_t)N * 2, sizeof *r->chunks, "text figures", err);
    r->full = kv_malloc((size_t)N * 2 * sizeof *r->full, "text figures", err);
    r->uniform = kv_malloc((size_t)N * 2 * sizeof *r->uniform, "text figures", err);
    r->plan = kv_malloc((size_t)N * 2 * sizeof *r->plan, "text figures", err);
    r->cand = kv_malloc((size_t)KV_ROBUST_MAX_CAND * N * 2 * sizeof *r->cand, "text figures", err);
    if (!r->names || !r->text_tokens || !r->chunks || !r->full || !r->uniform || !r->plan ||
        !r->cand)
        return KV_EINTERNAL;
    for (int t = 0; t < N; t++) {
        size_t l = strlen(lay->names[t]) + 1;
        r->names[t] = kv_malloc(l, "text names", err);
        if (!r->names[t]) return KV_EINTERNAL;
        memcpy(r->names[t], lay->names[t], l);
        r->text_tokens[t] = lay->text_tokens[t];
    }
    return KV_OK;
}

/* An engine reserving the full cache at b_s, p with `sets` sequences. */
static int engine_for(const kv_model *m, const struct kv_search_opts *o, int bs, int p, int sets,
                      kv_engine **out, kv_error *err) {
    /* the plan's heads may store other types (the sensitivity knapsack's) */
    return kv_search_engine(m, o, o->kv_type, bs, p, sets, kv_search_sens_opts(o).types_mask, out,
                            err);
}

/* Per-(text, part) perplexity from per-chunk NLL sums nll[S + HC] into ppl[N * 2]. */
static void text_ppl(const kv_robust_layout *lay, int C, const double *nll, double *ppl) {
    int N = lay->n_texts;
    for (int i = 0; i < N * 2; i++) {
        double s = 0.0;
        long k = 0;
        for (int ch = 0; ch < lay->S + lay->HC; ch++) {
            int part = ch >= lay->S;
            if (lay->chunk_text[ch] * 2 + part != i) continue;
            s += nll[ch];
            k++;
        }
        ppl[i] = k ? kv_perplexity_from_nll(s, k * (C - 1)) : NAN;
    }
}

/* Text t's per-token NLL differences per chunk, (a[c] - b[c]) / (C - 1) over its chunks c (chunk
 * NLL sums of C - 1 scored tokens): their count (returned), mean *m and sample variance *var
 * (0 with fewer than two chunks). */
static int text_diff_stats(const kv_robust_layout *lay, int C, const double *a, const double *b,
                           int t, double *m, double *var) {
    double s1 = 0.0, s2 = 0.0;
    int n = 0;
    for (int ch = 0; ch < lay->S + lay->HC; ch++) {
        if (lay->chunk_text[ch] != t) continue;
        double d = (a[ch] - b[ch]) / (C - 1);
        s1 += d, s2 += d * d, n++;
    }
    *m = n ? s1 / n : 0.0;
    double v = n > 1 ? (s2 - n * *m * *m) / (n - 1) : 0.0;
    *var = v > 0.0 ? v : 0.0;
    return n;
}

/* Text t's prediction bound m + z s sqrt(1/n + 1/n_new) of the per-token NLL change per chunk
 * against uniform (text_diff_stats of cand and uni), with the constants KV_ROBUST_PRED_*
 * (robust.h); a text with one chunk counts its mean, one with none -inf. */
static double text_bound(const kv_robust_layout *lay, int C, const double *cand, const double *uni,
                         int t) {
    double m, var;
    int n = text_diff_stats(lay, C, cand, uni, t, &m, &var);
    if (!n) return -HUGE_VAL;
    double b = m;
    if (n > 1) b += KV_ROBUST_PRED_Z * sqrt(var) * sqrt(1.0 / n + 1.0 / KV_ROBUST_PRED_CHUNKS);
    return b;
}

/* The largest over texts of text_bound (NaN when any is NaN). */
static double pred_bound(const kv_robust_layout *lay, int C, const double *cand,
                         const double *uni) {
    double worst = -HUGE_VAL;
    for (int t = 0; t < lay->n_texts; t++) {
        double b = text_bound(lay, C, cand, uni, t);
        if (!(b <= worst)) worst = b; /* NaN stays */
    }
    return worst;
}

/* Whether candidate figures ppl[N * 2] (NLL sums nll per chunk) hold on text t: at most the
 * uniform cache's perplexity on both of its parts and its prediction bound within
 * log(1 + KV_ROBUST_PRED_TOL): the per-text form of cand_objective's pass. */
static int holds_on_text(const kv_robust_result *r, const kv_robust_layout *lay, int C,
                         const double *ppl, const double *nll, const double *uni_nll, int t) {
    for (int part = 0; part < 2; part++) {
        int i = t * 2 + part;
        if (r->chunks[i] && !(ppl[i] <= r->uniform[i] * (1.0 + PASS_TOL))) return 0;
    }
    return text_bound(lay, C, nll, uni_nll, t) <= log1p(KV_ROBUST_PRED_TOL);
}

/* The standard error of the difference of the `mean` objective between two candidates with
 * per-chunk NLL sums a and b: per text the variance s_t^2 of its chunks' per-token differences
 * over its n_t chunks (text_diff_stats); the objective averages the texts' mean differences,
 * so SE = sqrt(sum_t s_t^2 / n_t) / N (used for `worst` and `both` as well). */
static double objective_diff_se(const kv_robust_layout *lay, int C, const double *a,
                                const double *b) {
    double v = 0.0;
    for (int t = 0; t < lay->n_texts; t++) {
        double m, var;
        int n = text_diff_stats(lay, C, a, b, t, &m, &var);
        if (n > 1) v += var / n;
    }
    return sqrt(v) / lay->n_texts;
}

/* Objective and pass/fail of candidate figures ppl[N * 2] against uniform u[N * 2], with the
 * per-text all-chunk log ratio from the NLL sums (chunk counts weigh the parts), and its
 * prediction bound `bound` (pred_bound) within log(1 + KV_ROBUST_PRED_TOL). */
static double cand_objective(const kv_robust_result *r, const double *ppl, double bound,
                             kv_robust_objective obj, int *passed) {
    int N = r->n_texts;
    double mean = 0.0, worst = -HUGE_VAL;
    *passed = bound <= log1p(KV_ROBUST_PRED_TOL);
    for (int t = 0; t < N; t++) {
        double lc = 0.0, lu = 0.0;
        int k = 0;
        for (int part = 0; part < 2; part++) {
            int i = t * 2 + part, c = r->chunks[i];
            if (!c) continue;
            if (!(ppl[i] <= r->uniform[i] * (1.0 + PASS_TOL))) *passed = 0;
            lc += c * log(ppl[i]);
            lu += c * log(r->uniform[i]);
            k += c;
        }
        double d = k ? (lc - lu) / k : 0.0;
        mean += d / N;
        if (d > worst) worst = d;
    }
    return obj == KV_ROBUST_WORST ? worst : obj == KV_ROBUST_BOTH ? mean + worst : mean;
}

/* The sensitivity options the search ran with (its ratio, C, b_s, grid p, policy, base KV
 * type and the knapsack's KV types: the per-text curves are typed as the search's), no
 * progress or task farm of their own. */
static kv_sens_opts sens_opts(const struct kv_search_opts *o) {
    kv_sens_opts so = kv_search_sens_opts(o);
    so.progress = NULL;
    so.tasks = NULL;
    return so;
}

/* Per-text knapsacks (sources 1 and 2): every head's NLL curve measured on each text's first
 * calibration chunk alone (kv_sens_measure, at the search's levels, around uniform), then
 * combined over the texts per head, KV type, policy and level as the mean (1: the pooled
 * knapsack, every text weighing the same) and as the largest change (2: a head's move counts
 * with its worst text; summed over heads that bounds every text's predicted change from
 * above, so minimising it is a max-regret knapsack on that bound), each solved by
 * kv_sens_allocate_typed with the NLL objective (over the search's --kv-types, in stored
 * bytes, as the search's own knapsack). budget, policy, type: [2 + texts, nh].
 * Needs the search's sensitivity curves (their levels); *n_out 0 otherwise. */
static int text_knapsacks(const kv_model *m, const int *ids, const kv_robust_layout *lay,
                          const struct kv_search_opts *o, const struct kv_search_result *res,
                          int nh, int *budget, kv_policy *policy, kv_cache_type *type, int *n_out,
                          long *evals, kv_error *err) {
    *n_out = 0;
    const kv_sens_curves *sc = &res->sens.curves;
    if (!res->have_sens || !sc->n_levels || lay->n_texts < 2) return KV_OK;
    kv_sens_opts so = sens_opts(o);
    so.objective = KV_SENS_OBJ_NLL;
    int N = lay->n_texts, rc = KV_OK;
    kv_sens_curves cv[KV_ROBUST_MAX_TEXTS];
    memset(cv, 0, sizeof cv);
    kv_engine *e = NULL;
    rc = kv_search_engine(m, o, o->kv_type, o->block_size, o->evict_block,
                          so.batch > 1 ? so.batch : 1, so.types_mask, &e, err);
    for (int t = 0; t < N && !rc; t++) {
        int ch = 0; /* the text's first calibration chunk */
        while (ch < lay->S && lay->chunk_text[ch] != t) ch++;
        if (ch == lay->S) continue;
        if (o->progress && !o->progress->quiet)
            kv_progress_print(o->progress, 0, "search: loss curves of text %d of %d", t + 1, N);
        rc = kv_sens_measure(e, m, ids + (long)ch * o->context, 1, NULL, NULL, sc->levels,
                             sc->n_levels, &so, &cv[t], err);
        *evals += cv[t].token_evals;
    }
    kv_engine_free(e);
    if (!rc) {
        long n = (long)cv[0].n_heads * cv[0].n_types * cv[0].n_policies * cv[0].n_levels;
        double *keep = cv[0].delta_nll;
        double *comb = kv_malloc((size_t)(n > 0 ? n : 1) * sizeof *comb, "curves", err);
        for (int kind = 0; kind < 2 && comb && !rc; kind++) {
            for (long i = 0; i < n; i++) {
                double mean = 0.0, worst = -HUGE_VAL;
                for (int t = 0; t < N; t++) {
                    double v = cv[t].delta_nll[i];
                    mean += v / N;
                    worst = isnan(v) || isnan(worst) ? NAN : v > worst ? v : worst; /* NaN: floor */
                }
                comb[i] = kind ? worst : mean;
            }
            cv[0].delta_nll = comb;
            rc =
                kv_sens_allocate_typed(&cv[0], &so, budget + (long)kind * nh,
                                       policy + (long)kind * nh, type + (long)kind * nh, NULL, err);
            cv[0].delta_nll = keep;
        }
        if (!comb) rc = KV_EINTERNAL;
        free(comb);
        /* and each text's own curves (a plan for that text, which the guard then holds to
         * the others), for up to KV_ROBUST_TEXT_SOURCES texts */
        for (int t = 0; t < N && t < KV_ROBUST_TEXT_SOURCES && !rc; t++)
            rc = kv_sens_allocate_typed(&cv[t], &so, budget + (long)(2 + t) * nh,
                                        policy + (long)(2 + t) * nh, type + (long)(2 + t) * nh,
                                        NULL, err);
        if (!rc) *n_out = 2 + (N < KV_ROBUST_TEXT_SOURCES ? N : KV_ROBUST_TEXT_SOURCES);
    }
    for (int t = 0; t < N; t++) kv_sens_curves_free(&cv[t]);
    if (rc) kv_fail_context(err, "per-text loss curves");
    return rc;
}

/* A blend lam of the way from the uniform cache (u tokens in the search's base type) to a
 * candidate head (p tokens stored in type t), in stored bytes: the tokens of type t that
 * u * bytes(base) + lam * (p * bytes(t) - u * bytes(base)) bytes hold, rounded down, clamped
 * to [min(p, u), C]. With t the base type this is floor(u + lam * (p - u)). */
static int blend_tokens(int p, kv_cache_type t, int u, const struct kv_search_opts *o,
                        const kv_model *m, double lam) {
    double tb = (double)kv_type_token_bytes(t, m->cfg.head_dim);
    double ub = (double)kv_type_token_bytes(o->kv_type, m->cfg.head_dim);
    double bytes = u * ub + lam * (p * tb - u * ub);
    int n = (int)floor(bytes / tb + 1e-9), lo = p < u ? p : u;
    if (n < lo) n = lo;
    if (n > o->context) n = o->context;
    return n;
}

/* The guard's state: its inputs, the budgets it compares (uniform at b_s = p = 1 and at the
 * plan's b_s, the sources and their blends) and the chunk losses of every candidate. */
typedef struct guard {
    const kv_model *m;
    const int *ids;
    const kv_robust_layout *lay;
    const struct kv_search_opts *o;
    kv_robust_objective obj;
    struct kv_search_result *res;
    kv_robust_result *rr;
    kv_error *err;
    int C, nh, nc, bs, p, ubsz, up;
    int *ub1, *ubs, *src, *cb;     /* [nh], [nh], [N_SRC * nh], [MAX_SETS * nh] */
    kv_policy *spol, *upol;        /* [N_SRC * nh], [nh] */
    kv_cache_type *styp;           /* [N_SRC * nh] */
    double *nll;                   /* [(2 + MAX_SETS) * nc]: full, uniform, candidates */
    kv_engine *ep, *eu;            /* the plan's b_s and p; the uniform's */
    int n_src, scode[N_SRC], sets; /* sources, their codes, candidate budget sets */
    int alone[KV_ROBUST_MAX_CAND]; /* measured alone */
} guard;

/* The sources: the plan, the per-text knapsacks' solutions and the sensitivity knapsack's
 * solution when the search kept another plan (its types too). */
static int guard_sources(guard *g) {
    const struct kv_search_opts *o = g->o;
    struct kv_search_result *res = g->res;
    const int nh = g->nh;
    int n_knap = 0;
    int rc = kv_uniform_budgets(nh, o->ratio, g->C, g->ubsz, g->ub1, NULL, g->err);
    if (!rc) rc = kv_uniform_budgets(nh, o->ratio, g->C, g->bs, g->ubs, NULL, g->err);
    if (!rc) {
        memcpy(g->src, res->tokens, (size_t)nh * sizeof *g->src);
        memcpy(g->spol, res->policy, (size_t)nh * sizeof *g->spol);
        /* the plan's heads keep their types; the per-text knapsacks choose theirs (over the
         * search's --kv-types) */
        for (int i = 0; i < N_SRC * nh; i++)
            g->styp[i] = i < nh && res->kv_types ? res->kv_types[i] : o->kv_type;
        rc = text_knapsacks(g->m, g->ids, g->lay, o, res, nh, g->src + nh, g->spol + nh,
                            g->styp + nh, &n_knap, &g->rr->token_evals, g->err);
        g->n_src += n_knap;
    }
    if (!rc && res->have_sens && res->sens.budget && res->sens.policy &&
        res->sens.best_round >= 0 &&
        (memcmp(res->sens.budget, res->tokens, (size_t)nh * sizeof *res->tokens) ||
         (res->sens.type && res->kv_types &&
          memcmp(res->sens.type, res->kv_types, (size_t)nh * sizeof *res->kv_types)))) {
        memcpy(g->src + g->n_src * nh, res->sens.budget, (size_t)nh * sizeof *g->src);
        memcpy(g->spol + g->n_src * nh, res->sens.policy, (size_t)nh * sizeof *g->spol);
        for (int h = 0; h < nh; h++)
            g->styp[g->n_src * nh + h] = res->sens.type ? res->sens.type[h] : o->kv_type;
        g->scode[g->n_src++] = KV_ROBUST_SRC_SENS;
    }
    return rc;
}

/* The candidates: every source at every blend lambda (then uniform, last), and the engines. */
static int guard_candidates(guard *g, int rc) {
    kv_robust_result *rr = g->rr;
    const int nh = g->nh;
    g->sets = g->n_src * KV_ROBUST_N_LAMBDA;
    rr->n_cand = g->sets + 1;
    for (int k = 0; k < g->sets && !rc; k++) {
        const int *P = g->src + (k / KV_ROBUST_N_LAMBDA) * nh;
        double lam = cand_lambda[k % KV_ROBUST_N_LAMBDA];
        rr->lambda[k] = lam;
        rr->source[k] = g->scode[k / KV_ROBUST_N_LAMBDA];
        const kv_cache_type *T = g->styp + (k / KV_ROBUST_N_LAMBDA) * nh;
        for (int h = 0; h < nh; h++)
            g->cb[k * nh + h] =
                lam == 1.0 ? P[h] : blend_tokens(P[h], T[h], g->ubs[h], g->o, g->m, lam);
    }
    rr->lambda[g->sets] = 0.0;
    rr->source[g->sets] = -1;
    for (int h = 0; h < nh && g->upol; h++) g->upol[h] = g->o->policy;
    if (!rc) rc = engine_for(g->m, g->o, g->bs, g->p, g->sets, &g->ep, g->err);
    if (!rc) rc = engine_for(g->m, g->o, g->ubsz, g->up, 1, &g->eu, g->err);
    return rc;
}

/* Every chunk: full, uniform (b_s = p = 1), the candidates as one batch. */
static int guard_measure(guard *g, int rc) {
    const int C = g->C, nc = g->nc, nh = g->nh, sets = g->sets;
    double *nf = g->nll, *nu = g->nll + nc, *ncand = g->nll + 2 * nc;
    for (int ch = 0; ch < nc && !rc; ch++) {
        const int *tk = g->ids + (long)ch * C;
        const int *b1[1] = {g->ub1};
        const kv_policy *p1[1] = {g->upol};
        const int *bc[MAX_SETS];
        const kv_policy *pc[MAX_SETS];
        const kv_cache_type *tc[MAX_SETS];
        double cn[MAX_SETS];
        for (int k = 0; k < sets; k++) {
            bc[k] = g->cb + k * nh;
            pc[k] = g->spol + (k / KV_ROBUST_N_LAMBDA) * nh;
            tc[k] = g->styp + (k / KV_ROBUST_N_LAMBDA) * nh;
        }
        rc = kv_engine_chunk_nll(g->ep, tk, C, 1, NULL, NULL, &nf[ch], NULL, g->err);
        if (!rc) rc = kv_engine_chunk_nll(g->eu, tk, C, 1, b1, p1, &nu[ch], NULL, g->err);
        if (!rc)
            rc = kv_engine_chunk_score_typed(g->ep, tk, C, sets, bc, pc, tc, NULL, cn, NULL, NULL,
                                             g->err);
        for (int k = 0; k < sets && !rc; k++) ncand[k * nc + ch] = cn[k];
        g->rr->token_evals += (2L + sets) * C;
        if (!rc && g->o->progress && !g->o->progress->quiet)
            kv_progress_print(g->o->progress, 0, "search: per-text check %d/%d chunks", ch + 1, nc);
    }
    if (g->o->progress && !g->o->progress->quiet) kv_progress_done(g->o->progress);
    return rc;
}

/* Per-text perplexities, the transfer check (leave one text out): a knapsack fitted on every
 * text's curves (mean, worst, the sensitivity knapsack's pooled one) at blend lambda qualifies
 * only when every text's own knapsack at that lambda holds on each text it was not fitted on;
 * with two texts that is the knapsack fitted without a text, tested on it. Then the bounds and
 * objectives of every candidate. */
static void guard_screen(guard *g) {
    kv_robust_result *rr = g->rr;
    const int C = g->C, nc = g->nc, sets = g->sets, N = rr->n_texts;
    double *nf = g->nll, *nu = g->nll + nc, *ncand = g->nll + 2 * nc;
    text_ppl(g->lay, C, nf, rr->full);
    text_ppl(g->lay, C, nu, rr->uniform);
    for (int k = 0; k < sets; k++) text_ppl(g->lay, C, ncand + k * nc, rr->cand + k * N * 2);
    memcpy(rr->cand + sets * N * 2, rr->uniform, (size_t)N * 2 * sizeof *rr->uniform);
    int n_own = 0;
    for (int s = 0; s < g->n_src; s++)
        n_own += g->scode[s] >= 3 && g->scode[s] < KV_ROBUST_SRC_SENS;
    for (int k = 0; k < rr->n_cand; k++) {
        int code = rr->source[k];
        rr->transfer[k] = -1;
        if (k >= sets || n_own < 2 || !(code == 1 || code == 2 || code == KV_ROBUST_SRC_SENS))
            continue;
        rr->transfer[k] = 1;
        for (int s = 0; s < g->n_src; s++) {
            if (g->scode[s] < 3 || g->scode[s] >= KV_ROBUST_SRC_SENS) continue;
            int ks = s * KV_ROBUST_N_LAMBDA + k % KV_ROBUST_N_LAMBDA, own = g->scode[s] - 3;
            for (int t = 0; t < N && rr->transfer[k]; t++)
                if (t != own &&
                    !holds_on_text(rr, g->lay, C, rr->cand + ks * N * 2, ncand + ks * nc, nu, t))
                    rr->transfer[k] = 0;
        }
    }
    for (int k = 0; k < rr->n_cand; k++) {
        rr->bound[k] = k < sets ? pred_bound(g->lay, C, ncand + k * nc, nu) : 0.0;
        double v = cand_objective(rr, rr->cand + k * N * 2, rr->bound[k], g->obj, &rr->passed[k]);
        rr->objective[k] = rr->passed[k] && rr->transfer[k] ? v : HUGE_VAL;
    }
}

/* The lowest objective among the passing (uniform, last, always passes); ties go to the
 * earlier candidate: the plan before the knapsacks, the larger lambda first. The batch of
 * candidates is screening: the search's own plan and the chosen one are measured again alone,
 * as `kvplan eval` runs them (one sequence; a batched pass differs in the last digits), and
 * those figures decide; a chosen candidate that then loses somewhere is dropped and the next
 * best measured. se_margin records the standard error of the difference between the chosen
 * candidate and the search's own plan (information: it does not veto the choice). */
static int guard_choose(guard *g) {
    kv_robust_result *rr = g->rr;
    const int C = g->C, nc = g->nc, nh = g->nh, sets = g->sets, N = rr->n_texts;
    double *nu = g->nll + nc, *ncand = g->nll + 2 * nc;
    int rc = KV_OK, first = 1;
    for (;;) {
        rr->chosen = sets;
        for (int k = sets - 1; k >= 0; k--)
            if (rr->objective[k] <= rr->objective[rr->chosen]) rr->chosen = k;
        int k = first ? 0 : rr->chosen;
        first = 0;
        if (k == sets || (g->alone[k] && rr->passed[k])) break;
        g->alone[k] = 1;
        double *row = rr->cand + k * N * 2, *cn = ncand + k * nc;
        const int *bk[1] = {g->cb + k * nh};
        const kv_policy *pk[1] = {g->spol + (k / KV_ROBUST_N_LAMBDA) * nh};
        const kv_cache_type *tk[1] = {g->styp + (k / KV_ROBUST_N_LAMBDA) * nh};
        for (int ch = 0; ch < nc && !rc; ch++) {
            rc = kv_engine_chunk_score_typed(g->ep, g->ids + (long)ch * C, C, 1, bk, pk, tk, NULL,
                                             &cn[ch], NULL, NULL, g->err);
            if (!rc) rr->token_evals += C; /* the guard's count holds its passes alone too */
        }
        if (rc) break;
        text_ppl(g->lay, C, cn, row);
        rr->bound[k] = pred_bound(g->lay, C, cn, nu);
        double v = cand_objective(rr, row, rr->bound[k], g->obj, &rr->passed[k]);
        rr->objective[k] = rr->passed[k] && rr->transfer[k] ? v : HUGE_VAL;
    }
    int k = rr->chosen;
    if (!rc && k > 0 && k < sets && rr->passed[0] && g->alone[0]) {
        rr->se_margin = objective_diff_se(g->lay, C, ncand + k * nc, ncand);
    }
    return rc;
}

/* The chosen candidate's figures and why the plan itself was not kept: the first text and
 * part it lost on, the standard-error rule, or the noise bound. */
static void guard_reason(kv_robust_result *rr) {
    int N = rr->n_texts;
    memcpy(rr->plan, rr->cand + rr->chosen * N * 2, (size_t)N * 2 * sizeof *rr->plan);
    for (int i = 0; i < N * 2 && !rr->passed[0] && !rr->reason[0]; i++)
        if (rr->chunks[i] && !(rr->cand[i] <= rr->uniform[i] * (1.0 + PASS_TOL)))
            snprintf(rr->reason, sizeof rr->reason,
                     "the plan's perplexity %.4f is above the uniform cache's %.4f on %s "
                     "(%s, %d chunks)",
                     rr->cand[i], rr->uniform[i], rr->names[i / 2],
                     i % 2 ? "held-out" : "calibration", rr->chunks[i]);
    if (!rr->passed[0] && !rr->reason[0])
        snprintf(rr->reason, sizeof rr->reason,
                 "the plan's gain is within chunk-to-chunk noise: on some text a new %d-chunk "
                 "sample is predicted up to %.2f%% above the uniform cache (95%% bound; at "
                 "most %.1f%% passes)",
                 KV_ROBUST_PRED_CHUNKS, 100.0 * expm1(rr->bound[0]), 100.0 * KV_ROBUST_PRED_TOL);
}

/* The chosen candidate becomes the search's plan (res): uniform at b_s = p = 1, or a source at
 * its blend. Nothing changes when the plan itself is kept. */
static void guard_adopt(guard *g) {
    const struct kv_search_opts *o = g->o;
    struct kv_search_result *res = g->res;
    const int nh = g->nh, k = g->rr->chosen;
    if (g->rr->source[k] < 0) { /* uniform at b_s = p = 1 */
        memcpy(res->tokens, g->ub1, (size_t)nh * sizeof *g->ub1);
        for (int h = 0; h < nh; h++)
            res->blocks[h] = (g->ub1[h] + g->ubsz - 1) / g->ubsz, res->policy[h] = o->policy;
        res->evict_block = g->up;
        res->winner_sens = 0;
        res->winner_kind = KV_ALLOC_UNIFORM;
        res->best_t = res->best_r = res->best_p = NAN;
        res->identical_to_uniform = 1;
        res->winner_type_uniform = -1;
        if (res->kv_types)
            for (int h = 0; h < nh; h++) res->kv_types[h] = o->kv_type;
    } else if (k > 0) {
        memcpy(res->tokens, g->cb + k * nh, (size_t)nh * sizeof *res->tokens);
        const int s = k / KV_ROBUST_N_LAMBDA; /* the source's row in src, spol, styp */
        memcpy(res->policy, g->spol + s * nh, (size_t)nh * sizeof *res->policy);
        for (int h = 0; h < nh; h++) res->blocks[h] = (res->tokens[h] + g->bs - 1) / g->bs;
        if (g->rr->source[k] >= 1) {
            res->winner_sens = 1;
            res->winner_type_uniform = -1;
            res->best_t = res->best_r = res->best_p = NAN;
        }
        if (res->kv_types) memcpy(res->kv_types, g->styp + s * nh, (size_t)nh * sizeof *g->styp);
        res->identical_to_uniform = !memcmp(res->tokens, g->ubs, (size_t)nh * sizeof *g->ubs);
        for (int h = 0; h < nh; h++)
            if (res->policy[h] != o->policy || (res->kv_types && res->kv_types[h] != o->kv_type))
                res->identical_to_uniform = 0;
    }
}

int kv_robust_guard_count(const kv_model *m, const struct kv_search_opts *o, int n_texts, int nc,
                          kv_search_guard_count *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    long curve = 0, curve_max = 0;
    /* the per-text knapsacks (text_knapsacks): two texts or more and sensitivity planning */
    int knap = n_texts >= 2 && o->sensitivity;
    if (knap) {
        kv_sens_opts so = sens_opts(o);
        int rc = kv_sens_count(m, &so, 1, 0, &curve, &curve_max, NULL, err);
        if (rc) return rc;
    }
    out->curve_evals = curve * n_texts;
    out->curve_evals_max = curve_max * n_texts;
    /* sources (guard_sources): the plan, the mean and worst knapsacks and up to
     * KV_ROBUST_TEXT_SOURCES texts' own, and at most the sensitivity solution */
    int n_src =
        1 + (knap ? 2 + (n_texts < KV_ROBUST_TEXT_SOURCES ? n_texts : KV_ROBUST_TEXT_SOURCES) : 0);
    int n_src_max = n_src + (o->sensitivity ? 1 : 0);
    /* guard_measure: every chunk under the full cache, the uniform one and the candidates */
    out->evals = (long)nc * (2 + KV_ROBUST_N_LAMBDA * n_src) * o->context;
    out->evals_max = (long)nc * (2 + KV_ROBUST_N_LAMBDA * n_src_max) * o->context;
    /* guard_choose: the plan alone on every chunk, then the chosen candidate when it is
     * another; each candidate at most once */
    out->alone_evals = (long)nc * o->context;
    out->alone_evals_max = (long)nc * KV_ROBUST_N_LAMBDA * n_src_max * o->context;
    out->sequences_max = KV_ROBUST_N_LAMBDA * n_src_max;
    return KV_OK;
}

int kv_robust_guard(const kv_model *m, const int *ids, const kv_robust_layout *lay,
                    const struct kv_search_opts *o, kv_robust_objective obj,
                    struct kv_search_result *res, kv_robust_result *rr, kv_error *err) {
    memset(rr, 0, sizeof *rr);
    guard g = {
        .m = m, .ids = ids, .lay = lay, .o = o, .obj = obj, .res = res, .rr = rr, .err = err};
    g.C = o->context, g.nh = m->cfg.n_layers * m->cfg.n_kv_heads, g.nc = lay->S + lay->HC;
    g.bs = o->block_size, g.p = res->evict_block > 0 ? res->evict_block : o->evict_block;
    if (lay->S != res->search_chunks || lay->HC != res->heldout_chunks)
        return kv_fail(err, KV_EINPUT,
                       "the text layout (%d + %d chunks) does not match the search's (%d + %d)",
                       lay->S, lay->HC, res->search_chunks, res->heldout_chunks);
    int rc = result_alloc(rr, lay, err);
    rr->obj = obj;
    /* the uniform cache compared with: b_s = p = 1 (the strongest) unless the caller fixed p
     * (no eviction-block search), then the search's own b_s and p */
    g.ubsz = o->evict_block_search ? 1 : g.bs, g.up = o->evict_block_search ? 1 : g.p;
    rr->uniform_block_size = g.ubsz;
    rr->uniform_evict_block = g.up;
    for (int ch = 0; ch < g.nc && !rc; ch++) rr->chunks[lay->chunk_text[ch] * 2 + (ch >= lay->S)]++;
    const int nh = g.nh, nc = g.nc;
    g.ub1 = kv_malloc((size_t)nh * sizeof *g.ub1, "uniform budgets", err);
    g.ubs = kv_malloc((size_t)nh * sizeof *g.ubs, "uniform budgets", err);
    g.src = kv_malloc((size_t)N_SRC * nh * sizeof *g.src, "candidate budgets", err);
    g.spol = kv_malloc((size_t)N_SRC * nh * sizeof *g.spol, "candidate policies", err);
    g.styp = kv_malloc((size_t)N_SRC * nh * sizeof *g.styp, "candidate types", err);
    g.cb = kv_malloc((size_t)MAX_SETS * nh * sizeof *g.cb, "candidate budgets", err);
    g.upol = kv_malloc((size_t)nh * sizeof *g.upol, "uniform policies", err);
    g.nll = kv_malloc((size_t)(2 + MAX_SETS) * nc * sizeof *g.nll, "chunk losses", err);
    g.n_src = 1;
    for (int s = 0; s < N_SRC; s++) g.scode[s] = s; /* 0 the plan, 1 mean, 2 worst, 3 + t */
    if (!rc && (!g.ub1 || !g.ubs || !g.src || !g.spol || !g.styp || !g.cb || !g.upol || !g.nll))
        rc = KV_EINTERNAL;
    if (!rc) rc = guard_sources(&g);
    rc = guard_candidates(&g, rc);
    rc = guard_measure(&g, rc);
    if (!rc) {
        guard_screen(&g);
        rc = guard_choose(&g);
    }
    if (!rc) {
        guard_reason(rr);
        guard_adopt(&g);
    }
    kv_engine_free(g.ep);
    kv_engine_free(g.eu);
    free(g.ub1), free(g.ubs), free(g.src), free(g.spol), free(g.styp), free(g.cb), free(g.upol);
    free(g.nll);
    if (rc) kv_robust_result_free(rr);
    return rc;
}

int kv_robust_write(kv_h5 *f, const kv_robust_result *r, kv_error *err) {
    const int N = r->n_texts;
    long d1 = N, d2[2] = {N, 2}, dk = r->n_cand, d3[3] = {r->n_cand, N, 2};
    int tok[KV_ROBUST_MAX_TEXTS], passed[KV_ROBUST_MAX_CAND];
    size_t nlen = 1;
    for (int t = 0; t < N; t++) {
        tok[t] = r->text_tokens[t] > 0x7fffffffL ? 0x7fffffff : (int)r->text_tokens[t];
        nlen += strlen(r->names[t]) + 1;
    }
    for (int k = 0; k < r->n_cand; k++) passed[k] = r->passed[k];
    char *names = kv_malloc(nlen, "text names", err);
    if (!names) return KV_EINTERNAL;
    names[0] = '\0';
    for (int t = 0; t < N; t++) {
        if (t) strcat(names, "\n");
        strcat(names, r->names[t]);
    }
    const char *g = "/search/texts";
    int rc = kv_h5_write_i32(f, "/search/texts/tokens", 1, &d1, tok, "tokens", err);
    if (!rc) rc = kv_h5_write_i32(f, "/search/texts/chunks", 2, d2, r->chunks, "chunks", err);
    if (!rc) rc = kv_h5_write_f64(f, "/search/texts/full", 2, d2, r->full, "perplexity", err);
    if (!rc) rc = kv_h5_write_f64(f, "/search/texts/uniform", 2, d2, r->uniform, "perplexity", err);
    if (!rc) rc = kv_h5_write_f64(f, "/search/texts/plan", 2, d2, r->plan, "perplexity", err);
    if (!rc)
        rc = kv_h5_write_f64(f, "/search/texts/candidates/lambda", 1, &dk, r->lambda, "fraction",
                             err);
    if (!rc)
        rc = kv_h5_write_f64(f, "/search/texts/candidates/perplexity", 3, d3, r->cand, "perplexity",
                             err);
    if (!rc)
        rc = kv_h5_write_f64(f, "/search/texts/candidates/objective", 1, &dk, r->objective,
                             "log ratio", err);
    if (!rc) rc = kv_h5_write_i32(f, "/search/texts/candidates/passed", 1, &dk, passed, "-", err);
    if (!rc)
        rc = kv_h5_write_i32(f, "/search/texts/candidates/transfer", 1, &dk, r->transfer, "-", err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/search/texts/candidates/transfer", "definition",
                            "leave one text out: 1 when every text's own knapsack at the "
                            "candidate's lambda holds (perplexity and prediction bound against "
                            "uniform) on each text it was not fitted on, 0 when one does not (the "
                            "candidate is then not chosen), -1 where the check does not apply "
                            "(candidates not fitted on every text's curves, or fewer than two "
                            "texts with their own knapsack)",
                            err);
    if (!rc)
        rc = kv_h5_write_f64(f, "/search/texts/candidates/bound", 1, &dk, r->bound, "log ratio",
                             err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/search/texts/candidates/bound", "definition",
                            "largest over texts of m + z s sqrt(1/n + 1/n_new), the one-sided "
                            "prediction bound of the per-token NLL change against uniform on a "
                            "new sample of n_new chunks of the text (m, s: mean and deviation "
                            "over its n chunks); a candidate passes only with bound <= "
                            "log(1 + tol)",
                            err);
    if (!rc) rc = kv_h5_attr_f64(f, "/search/texts/candidates/bound", "z", KV_ROBUST_PRED_Z, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search/texts/candidates/bound", "n_new", KV_ROBUST_PRED_CHUNKS,
                            err);
    if (!rc)
        rc = kv_h5_attr_f64(f, "/search/texts/candidates/bound", "tol", KV_ROBUST_PRED_TOL, err);
    if (!rc)
        rc = kv_h5_write_i32(f, "/search/texts/candidates/source", 1, &dk, r->source, "-", err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/search/texts/candidates/source", "codes",
                            "0 the search's plan, 1 the knapsack on the per-text NLL curves' mean, "
                            "2 the knapsack on their per-head maximum, 3 + t the knapsack on text "
                            "t's curves alone, 7 the sensitivity knapsack's own solution (when the "
                            "search kept another plan), -1 the uniform cache",
                            err);
    if (!rc) rc = kv_h5_attr_str(f, g, "names", names, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "columns", "calibration,heldout", err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "n_texts", N, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "token_evals", r->token_evals, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "objective", kv_robust_objective_name(r->obj), err);
    const char *dec = kv_robust_decision(r);
    if (!rc) rc = kv_h5_attr_str(f, g, "decision", dec, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "lambda", r->lambda[r->chosen], err);
    if (!rc) rc = kv_h5_attr_str(f, g, "reason", r->reason, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "se_margin", r->se_margin, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "uniform_block_size", r->uniform_block_size, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "uniform_evict_block", r->uniform_evict_block, err);
    if (!rc)
        rc = kv_h5_attr_str(f, g, "definition",
                            "per text: perplexity on its calibration (search) chunks and on its "
                            "held-out chunks of the full cache, the uniform cache (b_s = p = 1) "
                            "and the plan; candidates blend the search's plan towards uniform "
                            "(lambda 1 = the search's plan, 0 = the uniform cache)",
                            err);
    free(names);
    return rc;
}
