/* kvplan sensitivity planning: loss curves by batched perturbation, the multiple-choice
 * knapsack (GLPK MIP and an exact DP), and the refinement loop. See
 * planner/sensitivity.h and docs/design.md "Sensitivity planning". */
#include "planner/sensitivity.h"

#include <glpk.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/eval.h"
#include "kvplan/plan.h"

void kv_sens_opts_default(kv_sens_opts *o, const kv_model *m) {
    memset(o, 0, sizeof *o);
    o->ratio = 0.5;
    o->context = m ? m->cfg.seq_len : 256;
    o->block_size = KV_DEFAULT_BLOCK_SIZE;
    o->evict_block = KV_DEFAULT_EVICT_BLOCK;
    o->policy = KV_POLICY_SINK;
    o->max_levels = 16;
    o->batch = 32;
    o->calib_chunks = 2;
    o->max_rounds = 3;
    o->refine_chunks = 1;
    o->objective = KV_SENS_OBJ_KL;
    o->kv_type = KV_TYPE_DEFAULT;
    o->types_mask = 0;
}

void kv_sens_curves_free(kv_sens_curves *c) {
    if (!c) return;
    free(c->levels);
    free(c->base);
    free(c->base_policy);
    free(c->base_type);
    free(c->delta_nll);
    free(c->kl);
    memset(c, 0, sizeof *c);
}

void kv_sens_result_free(kv_sens_result *r) {
    if (!r) return;
    kv_sens_curves_free(&r->curves);
    free(r->round_ppl);
    free(r->round_pred);
    free(r->round_obj);
    free(r->budget);
    free(r->policy);
    free(r->type);
    memset(r, 0, sizeof *r);
}

static int n_pol(const kv_sens_opts *o) {
    return o->n_policies > 0 ? o->n_policies : 1;
}
static kv_policy pol_at(const kv_sens_opts *o, int q) {
    return o->n_policies > 0 ? o->policies[q] : o->policy;
}
/* The KV types a head may be stored in: those of o->types_mask in code order, or the base type
 * alone (0). */
static int n_typ(const kv_sens_opts *o) {
    int n = 0;
    for (int t = 0; t < KV_CACHE_TYPES; t++) n += (o->types_mask >> t) & 1;
    return n > 0 ? n : 1;
}
static kv_cache_type typ_at(const kv_sens_opts *o, int ty) {
    for (int t = 0; t < KV_CACHE_TYPES; t++)
        if (((o->types_mask >> t) & 1) && ty-- == 0) return (kv_cache_type)t;
    return o->kv_type;
}
/* The lowest block level a head with policy q may have (fixed part + p), in blocks. */
static int floor_blocks(const kv_sens_opts *o, kv_policy q) {
    int t = kv_policy_fixed_tokens(q) + o->evict_block;
    return (t + o->block_size - 1) / o->block_size;
}
static int level_tokens(const kv_sens_opts *o, int k) {
    long t = (long)k * o->block_size;
    return t > o->context ? o->context : (int)t;
}
static int full_blocks(const kv_sens_opts *o) {
    return (o->context + o->block_size - 1) / o->block_size;
}

static int check_opts(const kv_sens_opts *o, kv_error *err) {
    if (!(o->ratio > 0 && o->ratio <= 1))
        return kv_fail(err, KV_EINPUT, "sensitivity: ratio %g outside (0, 1]", o->ratio);
    if (o->context < 2 || o->block_size < 1 || o->evict_block < 1 || o->evict_block > o->context)
        return kv_fail(err, KV_EINPUT, "sensitivity: C %d, b_s %d, p %d are not usable", o->context,
                       o->block_size, o->evict_block);
    if (o->n_policies < 0 || o->n_policies > KV_SENS_MAX_POLICIES)
        return kv_fail(err, KV_EINPUT, "sensitivity: %d candidate policies (at most %d)",
                       o->n_policies, KV_SENS_MAX_POLICIES);
    if (!kv_type_valid((int)o->kv_type) || o->types_mask < 0 ||
        o->types_mask >= (1 << KV_CACHE_TYPES))
        return kv_fail(err, KV_EINPUT, "sensitivity: KV type %d or type set %#x is not known",
                       (int)o->kv_type, (unsigned)o->types_mask);
    if (o->batch < 1 || o->calib_chunks < 1 || o->max_rounds < 1 || o->max_levels < 2)
        return kv_fail(err, KV_EINPUT,
                       "sensitivity: batch, calibration chunks and rounds must be >= 1 and "
                       "levels >= 2");
    return KV_OK;
}

int kv_sens_default_levels(const kv_sens_opts *o, int **levels, int *n_levels, kv_error *err) {
    *levels = NULL;
    *n_levels = 0;
    int rc = check_opts(o, err);
    if (rc) return rc;
    int lo = floor_blocks(o, pol_at(o, 0));
    for (int q = 1; q < n_pol(o); q++) {
        int f = floor_blocks(o, pol_at(o, q));
        if (f < lo) lo = f;
    }
    int hi = full_blocks(o);
    if (lo > hi) lo = hi;
    int all = hi - lo + 1;
    int cap = all < o->max_levels ? all : o->max_levels;
    int *v = kv_malloc((size_t)(cap + 1) * sizeof *v, "levels", err);
    if (!v) return KV_EINTERNAL;
    int n = 0;
    if (all <= o->max_levels) {
        for (int k = lo; k <= hi; k++) v[n++] = k;
    } else {
        /* geometric ladder lo .. hi, plus the uniform level, deduplicated and sorted */
        int uni = (int)floor(o->ratio * o->context / o->block_size);
        if (uni < lo) uni = lo;
        int m = o->max_levels - 1;
        for (int i = 0; i < m; i++) {
            int k = (int)lround(lo * pow((double)hi / lo, (double)i / (m - 1)));
            if (n == 0 || k > v[n - 1]) v[n++] = k;
        }
        int pos = 0;
        while (pos < n && v[pos] < uni) pos++;
        if (pos == n || v[pos] != uni) {
            memmove(v + pos + 1, v + pos, (size_t)(n - pos) * sizeof *v);
            v[pos] = uni;
            n++;
        }
    }
    *levels = v;
    *n_levels = n;
    return KV_OK;
}

/* log-softmax of every row of x [n, V] in place */
static void log_softmax_rows(float *x, int n, int V) {
    for (int i = 0; i < n; i++) {
        float *r = x + (size_t)i * V;
        float mx = r[0];
        for (int v = 1; v < V; v++)
            if (r[v] > mx) mx = r[v];
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)(r[v] - mx));
        float lse = (float)(log(s) + mx);
        for (int v = 0; v < V; v++) r[v] -= lse;
    }
}

/* The batched passes of kv_sens_measure as tasks: task ch * per_chunk is the base budgets on
 * chunk ch, task ch * per_chunk + 1 + b the perturbation batch b on chunk ch. A result is the
 * batch's NLL sums [B] then its KL sums [B] (the base: slots 0 and B). */
typedef struct sens_tasks {
    kv_engine *e;
    const int *ids;
    int C, V, B;
    const kv_sens_curves *cv; /* levels, base, base_policy */
    const kv_sens_opts *o;
    const int *pert; /* [n_pert] curve points perturbed, in batch order */
    int n_pert, per_chunk, n_chunks;
    int *set_budget;         /* [B, n_heads] scratch */
    kv_policy *set_policy;   /* [B, n_heads] scratch */
    kv_cache_type *set_type; /* [B, n_heads] scratch */
    float *ref;              /* [C, V] full-cache log-probabilities of chunk ref_chunk */
    int ref_chunk;
    double t0;
    double nll_lo, nll_hi; /* kv_nll_sum_range of one chunk: the check of logged results */
} sens_tasks;

static int sens_task(void *user, long task, double *out, kv_error *err) {
    sens_tasks *t = user;
    const kv_sens_curves *cv = t->cv;
    const kv_sens_opts *o = t->o;
    const int ch = (int)(task / t->per_chunk), j = (int)(task % t->per_chunk), C = t->C;
    const int nh = cv->n_heads, T = cv->n_types, Q = cv->n_policies, K = cv->n_levels, B = t->B;
    const int *tk = t->ids + (long)ch * C;
    int rc = KV_OK;
    if (t->ref_chunk != ch) { /* the full cache's next-token distribution at every position */
        int seq = -1;
        t->ref_chunk = -1;
        rc = kv_engine_seq_open(t->e, NULL, NULL, &seq, err);
        if (!rc) rc = kv_engine_prefill(t->e, seq, tk, C, KV_LOGITS_ALL, t->ref, NULL, err);
        if (seq >= 0) kv_engine_seq_close(t->e, seq);
        if (rc) return rc;
        log_softmax_rows(t->ref, C, t->V);
        t->ref_chunk = ch;
    }
    /* slots a task leaves unused hold values the range check accepts */
    for (int k = 0; k < 2 * B; k++) out[k] = k < B ? t->nll_lo : 0.0;
    if (j == 0) {
        const int *bb[1] = {cv->base};
        const kv_policy *bp[1] = {cv->base_policy};
        const kv_cache_type *bt[1] = {cv->base_type};
        return kv_engine_chunk_score_typed(t->e, tk, C, 1, bb, bp, bt, t->ref, out, out + B, NULL,
                                           err);
    }
    const int b0 = (j - 1) * B, ns = t->n_pert - b0 < B ? t->n_pert - b0 : B;
    const int *bptr[64];
    const kv_policy *pptr[64];
    const kv_cache_type *tptr[64];
    for (int s = 0; s < ns; s++) {
        int i = t->pert[b0 + s], h = i / (T * Q * K), ty = (i / (Q * K)) % T, q = (i / K) % Q,
            k = i % K;
        int *bs = t->set_budget + (size_t)s * nh;
        kv_policy *ps = t->set_policy + (size_t)s * nh;
        kv_cache_type *ts = t->set_type + (size_t)s * nh;
        memcpy(bs, cv->base, (size_t)nh * sizeof *bs);
        memcpy(ps, cv->base_policy, (size_t)nh * sizeof *ps);
        memcpy(ts, cv->base_type, (size_t)nh * sizeof *ts);
        bs[h] = level_tokens(o, cv->levels[k]);
        ps[h] = pol_at(o, q);
        ts[h] = cv->types[ty];
        bptr[s] = bs;
        pptr[s] = ps;
        tptr[s] = ts;
    }
    rc = kv_engine_chunk_score_typed(t->e, tk, C, ns, bptr, pptr, tptr, t->ref, out, out + B, NULL,
                                     err);
    if (!rc && o->progress && !o->progress->quiet)
        kv_progress_print(o->progress, 0, "sensitivity: chunk %d/%d, perturbations %d/%d, %.0fs",
                          ch + 1, t->n_chunks, b0 + ns, t->n_pert, kv_now() - t->t0);
    return rc;
}

/* Stage 1 of kv_sens_measure: the curves' shape (heads, policies, levels: the given block
 * levels or the defaults) and their arrays. */
static int sens_curves_init(const kv_model *m, const int *levels_blocks, int n_levels,
                            const kv_sens_opts *o, kv_sens_curves *out, kv_error *err) {
    const int nh = m->cfg.n_layers * m->cfg.n_kv_heads, Q = n_pol(o), T = n_typ(o);
    out->n_heads = nh;
    out->n_policies = Q;
    out->n_types = T;
    out->head_dim = m->cfg.head_dim;
    for (int q = 0; q < Q; q++) out->policies[q] = pol_at(o, q);
    for (int ty = 0; ty < T; ty++) out->types[ty] = typ_at(o, ty);
    if (levels_blocks) {
        out->levels = kv_malloc((size_t)n_levels * sizeof *out->levels, "levels", err);
        if (!out->levels) return KV_EINTERNAL;
        memcpy(out->levels, levels_blocks, (size_t)n_levels * sizeof *out->levels);
        out->n_levels = n_levels;
    } else {
        int rc = kv_sens_default_levels(o, &out->levels, &out->n_levels, err);
        if (rc) return rc;
    }
    const int K = out->n_levels;
    out->base = kv_malloc((size_t)nh * sizeof *out->base, "base budgets", err);
    out->base_policy = kv_malloc((size_t)nh * sizeof *out->base_policy, "base policies", err);
    out->base_type = kv_malloc((size_t)nh * sizeof *out->base_type, "base types", err);
    out->delta_nll = kv_malloc((size_t)nh * T * Q * K * sizeof *out->delta_nll, "curves", err);
    out->kl = kv_malloc((size_t)nh * T * Q * K * sizeof *out->kl, "curves", err);
    return out->base && out->base_policy && out->base_type && out->delta_nll && out->kl
               ? KV_OK
               : KV_EINTERNAL;
}

/* Stage 2: the base budgets and policies (given, or uniform at the ratio), each head at least
 * its policy's floor (fixed part + p) unless it keeps the whole context. */
static int sens_set_base(const kv_model *m, const int *base, const kv_policy *base_policy,
                         const kv_cache_type *base_type, const kv_sens_opts *o, kv_sens_curves *out,
                         kv_error *err) {
    const int nh = out->n_heads, C = o->context;
    int rc = KV_OK;
    if (base)
        memcpy(out->base, base, (size_t)nh * sizeof *out->base);
    else if ((rc = kv_uniform_budgets(nh, o->ratio, C, o->block_size, out->base, NULL, err)))
        return rc;
    for (int h = 0; h < nh; h++) {
        out->base_policy[h] = base_policy ? base_policy[h] : o->policy;
        out->base_type[h] = base_type ? base_type[h] : o->kv_type;
        int fl = kv_policy_fixed_tokens(out->base_policy[h]) + o->evict_block;
        if (out->base[h] < C && out->base[h] < fl)
            return kv_fail(err, KV_EINPUT,
                           "sensitivity: head %d (layer %d) starts at %d tokens, below the %s "
                           "floor %d (fixed part + p); pass a larger --ratio or a smaller "
                           "--evict-block",
                           h, h / m->cfg.n_kv_heads, out->base[h],
                           kv_policy_name(out->base_policy[h]), fl);
    }
    return KV_OK;
}

/* Stage 3: which curve points (head, type, policy, level) a pass runs, into pert (their
 * index); returns their count. want (NULL = every point) selects them among those not known
 * yet; each one listed is marked in known. */
static int sens_list_perturbations(kv_sens_curves *out, const unsigned char *want,
                                   unsigned char *known, int *pert) {
    const long n = (long)out->n_heads * out->n_types * out->n_policies * out->n_levels;
    int n_pert = 0;
    for (long i = 0; i < n; i++) {
        if (known[i] || (want && !want[i])) continue;
        known[i] = 1;
        pert[n_pert++] = (int)i;
    }
    return n_pert;
}

/* The points no pass runs: below a floor (NaN) or the base run (delta 0), known from the
 * start. */
static void sens_settle_free_points(const kv_sens_opts *o, kv_sens_curves *out,
                                    unsigned char *known) {
    const int nh = out->n_heads, T = out->n_types, Q = out->n_policies, K = out->n_levels;
    for (int h = 0; h < nh; h++)
        for (int ty = 0; ty < T; ty++)
            for (int q = 0; q < Q; q++)
                for (int k = 0; k < K; k++) {
                    int i = ((h * T + ty) * Q + q) * K + k, tok = level_tokens(o, out->levels[k]);
                    kv_policy pq = pol_at(o, q);
                    int fl = kv_policy_fixed_tokens(pq) + o->evict_block;
                    out->delta_nll[i] = out->kl[i] = NAN;
                    if (tok < o->context && tok < fl) {
                        known[i] = 1;
                    } else if (tok == out->base[h] && pq == out->base_policy[h] &&
                               out->types[ty] == out->base_type[h]) {
                        out->delta_nll[i] = 0.0;
                        known[i] = 1;
                    }
                }
}

/* Stage 5: the tasks' results res (per chunk: the base, then each perturbation batch; NLL sums
 * [B] then KL sums [B]) summed in chunk order, as one process running the chunks one after
 * another, into mean ΔNLL and KL per token. */
/* The sensitivity passes as tasks: results [n_tasks, 2B], per task B NLL sums of chunks
 * (kv_nll_sum_range) then B KL sums, checked when read from a log. A KL divergence is >= 0;
 * its sum of C - 1 float-rounded terms may end a little below, so its floor is -1e-4 per
 * token; its ceiling the NLL bound's. */
static int sens_run(sens_tasks *st, long n_tasks, double *res, kv_error *err) {
    const int B = st->B;
    kv_nll_sum_range(st->C - 1, st->V, &st->nll_lo, &st->nll_hi);
    double *lo = kv_malloc((size_t)4 * B * sizeof *lo, "task ranges", err);
    if (!lo) return KV_EINTERNAL;
    double *hi = lo + 2 * B;
    for (int k = 0; k < 2 * B; k++) {
        lo[k] = k < B ? st->nll_lo : -1e-4 * (st->C - 1);
        hi[k] = st->nll_hi;
    }
    int rc = kv_tasks_run_ranges(st->o->tasks, n_tasks, 2 * B, lo, hi, sens_task, st, res, err);
    free(lo);
    return rc;
}

/* Token evaluations of one calibration chunk with n_pert perturbations: the full cache's
 * reference prefill, the base budgets and one sequence per perturbation, C tokens each. */
static long chunk_evals(int n_pert, int C) {
    return (2L + n_pert) * C;
}

static void sens_reduce(const sens_tasks *st, const double *res, kv_sens_curves *out) {
    const int B = st->B, C = st->C, n_pert = st->n_pert, n_batch = st->per_chunk - 1;
    const int n = out->n_heads * out->n_types * out->n_policies * out->n_levels;
    double base_nll_sum = 0, base_kl_sum = 0;
    for (int j = 0; j < n_pert; j++) out->delta_nll[st->pert[j]] = out->kl[st->pert[j]] = 0.0;
    for (int ch = 0; ch < st->n_chunks; ch++) {
        const double *r0 = res + (size_t)ch * st->per_chunk * 2 * B;
        base_nll_sum += r0[0];
        base_kl_sum += r0[B];
        for (int b = 0; b < n_batch; b++) {
            const double *rb = r0 + (size_t)(1 + b) * 2 * B;
            int b0 = b * B, ns = n_pert - b0 < B ? n_pert - b0 : B;
            for (int s = 0; s < ns; s++) {
                out->delta_nll[st->pert[b0 + s]] += rb[s];
                out->kl[st->pert[b0 + s]] += rb[B + s];
            }
        }
    }
    out->token_evals += st->n_chunks * chunk_evals(n_pert, C);
    double denom = (double)st->n_chunks * (C - 1);
    out->base_nll = base_nll_sum / denom;
    out->base_kl = base_kl_sum / denom;
    for (int j = 0; j < n_pert; j++) {
        int i = st->pert[j];
        out->delta_nll[i] = (out->delta_nll[i] - base_nll_sum) / denom;
        out->kl[i] = out->kl[i] / denom;
    }
    for (int i = 0; i < n; i++)
        if (out->delta_nll[i] == 0.0 && isnan(out->kl[i])) out->kl[i] = out->base_kl;
    out->tokens = (long)st->n_chunks * C;
}

int kv_sens_measure(kv_engine *e, const kv_model *m, const int *ids, int n_chunks, const int *base,
                    const kv_policy *base_policy, const int *levels_blocks, int n_levels,
                    const kv_sens_opts *o, kv_sens_curves *out, kv_error *err) {
    return kv_sens_measure_typed(e, m, ids, n_chunks, base, base_policy, NULL, levels_blocks,
                                 n_levels, o, out, err);
}

/* Stage 4 for one pass: the points of want (NULL = all not known) as batched tasks
 * (kvplan/tasks.h): per chunk, task 0 scores the base budgets and task 1 + b the perturbation
 * batch b; every rank computes the reference of a chunk once (tasks come in index order). */
static int sens_pass(sens_tasks *st, kv_sens_curves *out, const unsigned char *want,
                     unsigned char *known, int *pert, kv_error *err) {
    st->n_pert = sens_list_perturbations(out, want, known, pert);
    if (st->n_pert == 0) return KV_OK;
    st->per_chunk = 1 + (st->n_pert + st->B - 1) / st->B;
    st->ref_chunk = -1;
    const long n_tasks = (long)st->n_chunks * st->per_chunk;
    double *res = kv_malloc((size_t)n_tasks * 2 * st->B * sizeof *res, "batch losses", err);
    int rc = res ? sens_run(st, n_tasks, res, err) : KV_EINTERNAL;
    if (!rc) sens_reduce(st, res, out);
    free(res);
    return rc;
}

/* Every point (full curves) or the sparse passes and the filled rest (planner/sensitivity.h
 * "Sparse curves"); prev: a refinement round's previous curves. */
static int sens_passes(sens_tasks *st, kv_sens_curves *out, const kv_sens_curves *prev,
                       unsigned char *known, unsigned char *want, int *pert, kv_error *err) {
    const kv_sens_opts *o = st->o;
    sens_settle_free_points(o, out, known);
    if (o->full_curves) return sens_pass(st, out, NULL, known, pert, err);
    int rc = KV_OK;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        int n = kv_sens_pick_points(out, o, pass, prev, known, want);
        if (o->progress && !o->progress->quiet)
            kv_progress_print(o->progress, 1, "sensitivity: pass %d measures %d curve points", pass,
                              n);
        rc = sens_pass(st, out, want, known, pert, err);
    }
    if (!rc) rc = kv_sens_fill_points(out, known, prev, err);
    return rc;
}

static int sens_measure(kv_engine *e, const kv_model *m, const int *ids, int n_chunks,
                        const int *base, const kv_policy *base_policy,
                        const kv_cache_type *base_type, const int *levels_blocks, int n_levels,
                        const kv_sens_curves *prev, const kv_sens_opts *o, kv_sens_curves *out,
                        kv_error *err) {
    memset(out, 0, sizeof *out);
    int rc = check_opts(o, err);
    if (rc) return rc;
    if (n_chunks < 1) return kv_fail(err, KV_EINPUT, "sensitivity: no calibration chunk");
    if (o->batch > 64)
        return kv_fail(err, KV_EINPUT, "sensitivity: batch %d is more than 64 sequences", o->batch);
    double t0 = kv_now(), cpu0 = kv_cpu_now();
    rc = sens_curves_init(m, levels_blocks, n_levels, o, out, err);
    if (!rc) rc = sens_set_base(m, base, base_policy, base_type, o, out, err);
    const int nh = out->n_heads, C = o->context, B = o->batch;
    const size_t n = (size_t)nh * out->n_types * out->n_policies * out->n_levels;
    int *set_budget = kv_malloc((size_t)B * nh * sizeof *set_budget, "batch budgets", err);
    kv_policy *set_policy = kv_malloc((size_t)B * nh * sizeof *set_policy, "batch policies", err);
    kv_cache_type *set_type = kv_malloc((size_t)B * nh * sizeof *set_type, "batch types", err);
    int *pert = kv_malloc(n * sizeof *pert + 1, "perturbations", err);
    unsigned char *known = kv_calloc(n + 1, 1, "curve points", err);
    unsigned char *want = kv_calloc(n + 1, 1, "curve points", err);
    float *ref =
        kv_malloc((size_t)C * m->cfg.vocab_size * sizeof *ref, "reference log-probabilities", err);
    if (!rc && (!set_budget || !set_policy || !set_type || !pert || !known || !want || !ref))
        rc = KV_EINTERNAL;
    sens_tasks st = {.e = e,
                     .ids = ids,
                     .C = C,
                     .V = m->cfg.vocab_size,
                     .B = B,
                     .cv = out,
                     .o = o,
                     .pert = pert,
                     .n_chunks = n_chunks,
                     .set_budget = set_budget,
                     .set_policy = set_policy,
                     .set_type = set_type,
                     .ref = ref,
                     .ref_chunk = -1,
                     .t0 = t0};
    if (!rc) rc = sens_passes(&st, out, prev, known, want, pert, err);
    free(set_budget);
    free(set_policy);
    free(set_type);
    free(pert);
    free(known);
    free(want);
    free(ref);
    out->seconds = kv_now() - t0;
    out->cpu_seconds = kv_cpu_now() - cpu0;
    if (rc) kv_sens_curves_free(out);
    return rc;
}

int kv_sens_measure_typed(kv_engine *e, const kv_model *m, const int *ids, int n_chunks,
                          const int *base, const kv_policy *base_policy,
                          const kv_cache_type *base_type, const int *levels_blocks, int n_levels,
                          const kv_sens_opts *o, kv_sens_curves *out, kv_error *err) {
    return sens_measure(e, m, ids, n_chunks, base, base_policy, base_type, levels_blocks, n_levels,
                        NULL, o, out, err);
}

int kv_sens_measure_around(kv_engine *e, const kv_model *m, const int *ids, int n_chunks,
                           const int *base, const kv_policy *base_policy,
                           const kv_cache_type *base_type, const kv_sens_curves *prev,
                           const kv_sens_opts *o, kv_sens_curves *out, kv_error *err) {
    return sens_measure(e, m, ids, n_chunks, base, base_policy, base_type, prev->levels,
                        prev->n_levels, o->full_curves ? NULL : prev, o, out, err);
}

/* Per chunk, the tokens of a pass of n points (none: it does not run) and its forward passes. */
static long pass_evals(long n, int C) {
    return n > 0 ? chunk_evals((int)n, C) : 0;
}

/* The points of one measurement around cv's base (settled in known): *lo0 the first pass's
 * least, *hi0 its most, *hi1 the second pass's most (none with full curves). around: the base
 * is a solution not known yet (cv's base is none: no base point is known, each head may skip
 * one). */
static void count_points(const kv_sens_opts *o, kv_sens_curves *cv, int around,
                         unsigned char *known, unsigned char *want, long *lo0, long *hi0,
                         long *hi1) {
    const long n = (long)cv->n_heads * cv->n_types * cv->n_policies * cv->n_levels;
    *lo0 = *hi0 = *hi1 = 0;
    if (o->full_curves) {
        for (long i = 0; i < n; i++) *hi0 += !known[i];
    } else {
        *hi0 = kv_sens_pick_points(cv, o, 0, around ? cv : NULL, known, want);
        for (long i = 0; i < n; i++) known[i] |= want[i];
        /* the values are not measured (NaN): pass 1 wants every point it could */
        *hi1 = kv_sens_pick_points(cv, o, 1, around ? cv : NULL, known, want);
    }
    *lo0 = around ? *hi0 - cv->n_heads : *hi0;
    if (*lo0 < 0) *lo0 = 0;
}

int kv_sens_count(const kv_model *m, const kv_sens_opts *o, int n_chunks, int around, long *least,
                  long *most, long *passes, kv_error *err) {
    kv_sens_curves cv;
    memset(&cv, 0, sizeof cv);
    *least = *most = 0;
    if (passes) *passes = 0;
    int rc = check_opts(o, err);
    if (!rc) rc = sens_curves_init(m, NULL, 0, o, &cv, err);
    if (!rc) rc = sens_set_base(m, NULL, NULL, NULL, o, &cv, err);
    const size_t n = (size_t)cv.n_heads * cv.n_types * cv.n_policies * cv.n_levels;
    unsigned char *known = rc ? NULL : kv_calloc(n + 1, 1, "curve points", err);
    unsigned char *want = rc ? NULL : kv_calloc(n + 1, 1, "curve points", err);
    if (!rc && (!known || !want)) rc = KV_EINTERNAL;
    if (!rc) {
        /* around a solution: its base points are not known here (no budget is -1 tokens) */
        for (int h = 0; around && h < cv.n_heads; h++) cv.base[h] = -1;
        sens_settle_free_points(o, &cv, known);
        long lo0, hi0, hi1;
        count_points(o, &cv, around, known, want, &lo0, &hi0, &hi1);
        const int C = o->context;
        *least = (long)n_chunks * pass_evals(lo0, C);
        *most = (long)n_chunks * (pass_evals(hi0, C) + pass_evals(hi1, C));
        if (passes && lo0 > 0) *passes = (long)n_chunks * (2 + (lo0 + o->batch - 1) / o->batch);
    }
    free(known);
    free(want);
    kv_sens_curves_free(&cv);
    return rc;
}

/* ---------------------------------------------------------------- knapsack ---- */

/* The DP of kv_mckp_solve_dp (sizes sum to total = min_total) and kv_mckp_solve_dp_range (a
 * sum in [min_total, total], the cheapest). */
static int mckp_dp(int n_items, int n_opts, const double *cost, const int *size, long min_total,
                   long total, int *choice, double *objective, kv_error *err) {
    if (min_total < 0) min_total = 0;
    if (n_items < 1 || n_opts < 1 || total < 0 || min_total > total)
        return kv_fail(err, KV_EINPUT, "knapsack: %d groups of %d options, total %ld", n_items,
                       n_opts, total);
    size_t W = (size_t)total + 1;
    double *dp = kv_malloc((size_t)(n_items + 1) * W * sizeof *dp, "knapsack table", err);
    int *arg = kv_malloc((size_t)n_items * W * sizeof *arg, "knapsack table", err);
    if (!dp || !arg) {
        free(dp);
        free(arg);
        return KV_EINTERNAL;
    }
    for (size_t w = 0; w < W; w++) dp[w] = w == 0 ? 0.0 : HUGE_VAL;
    for (int i = 0; i < n_items; i++) {
        double *prev = dp + (size_t)i * W, *cur = dp + (size_t)(i + 1) * W;
        int *a = arg + (size_t)i * W;
        for (size_t w = 0; w < W; w++) {
            cur[w] = HUGE_VAL;
            a[w] = -1;
            for (int k = 0; k < n_opts; k++) {
                double c = cost[(size_t)i * n_opts + k];
                int s = size[(size_t)i * n_opts + k];
                if (!isfinite(c) || s < 0 || (size_t)s > w || !isfinite(prev[w - s])) continue;
                if (prev[w - s] + c < cur[w]) {
                    cur[w] = prev[w - s] + c;
                    a[w] = k;
                }
            }
        }
    }
    int rc = KV_OK;
    long wb = total;
    double best = dp[(size_t)n_items * W + (size_t)total];
    for (long w = min_total; w < total; w++)
        if (dp[(size_t)n_items * W + (size_t)w] < best) {
            best = dp[(size_t)n_items * W + (size_t)w];
            wb = w;
        }
    if (!isfinite(best)) {
        rc = kv_fail(err, KV_EINPUT,
                     "knapsack: no choice of one option per group sums to %ld .. %ld; the floors "
                     "are too high or the caps too low for this total",
                     min_total, total);
    } else {
        long w = wb;
        for (int i = n_items - 1; i >= 0; i--) {
            int k = arg[(size_t)i * W + (size_t)w];
            choice[i] = k;
            w -= size[(size_t)i * n_opts + k];
        }
        if (objective) *objective = best;
    }
    free(dp);
    free(arg);
    return rc;
}

int kv_mckp_solve_mip(int n_items, int n_opts, const double *cost, const int *size, long total,
                      int *choice, double *objective, kv_error *err) {
    if (n_items < 1 || n_opts < 1 || total < 0)
        return kv_fail(err, KV_EINPUT, "knapsack: %d groups of %d options, total %ld", n_items,
                       n_opts, total);
    /* scale the costs so the largest magnitude is 1000: GLPK's tolerances are absolute */
    double scale = 0.0;
    int n_col = 0;
    for (long i = 0; i < (long)n_items * n_opts; i++)
        if (isfinite(cost[i])) {
            if (fabs(cost[i]) > scale) scale = fabs(cost[i]);
            n_col++;
        }
    scale = scale > 0 ? 1000.0 / scale : 1.0;
    int *col_of = kv_malloc((size_t)n_items * n_opts * sizeof *col_of, "knapsack", err);
    int *ia = kv_malloc((size_t)(2 * n_col + 1) * sizeof *ia, "knapsack", err);
    int *ja = kv_malloc((size_t)(2 * n_col + 1) * sizeof *ja, "knapsack", err);
    double *ar = kv_malloc((size_t)(2 * n_col + 1) * sizeof *ar, "knapsack", err);
    if (!col_of || !ia || !ja || !ar) {
        free(col_of);
        free(ia);
        free(ja);
        free(ar);
        return KV_EINTERNAL;
    }
    int old_term = glp_term_out(GLP_OFF);
    glp_prob *P = glp_create_prob();
    glp_set_obj_dir(P, GLP_MIN);
    if (n_col > 0) glp_add_cols(P, n_col);
    glp_add_rows(P, n_items + 1);
    for (int i = 0; i < n_items; i++) glp_set_row_bnds(P, 1 + i, GLP_FX, 1.0, 1.0);
    glp_set_row_bnds(P, n_items + 1, GLP_FX, (double)total, (double)total);
    int col = 0, ne = 0;
    for (int i = 0; i < n_items; i++)
        for (int k = 0; k < n_opts; k++) {
            long x = (long)i * n_opts + k;
            col_of[x] = 0;
            if (!isfinite(cost[x])) continue;
            col_of[x] = ++col;
            glp_set_col_kind(P, col, GLP_BV);
            glp_set_obj_coef(P, col, cost[x] * scale);
            ++ne, ia[ne] = 1 + i, ja[ne] = col, ar[ne] = 1.0;
            ++ne, ia[ne] = n_items + 1, ja[ne] = col, ar[ne] = (double)size[x];
        }
    glp_load_matrix(P, ne, ia, ja, ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.mip_gap = 0.0;
    parm.tm_lim = 120000;
    int ret = n_col > 0 ? glp_intopt(P, &parm) : GLP_ENOPFS;
    int rc = KV_OK;
    int st = ret == 0 ? glp_mip_status(P) : GLP_UNDEF;
    if (ret == GLP_ENOPFS || st == GLP_NOFEAS) {
        rc = kv_fail(err, KV_EINPUT,
                     "knapsack: no choice of one option per group sums to %ld; the floors are "
                     "too high or the caps too low for this total",
                     total);
    } else if (ret != 0 || st != GLP_OPT) {
        rc =
            kv_fail(err, KV_EINTERNAL, "knapsack: GLPK glp_intopt returned %d, status %d", ret, st);
    } else {
        double obj = 0.0;
        long sum = 0;
        for (int i = 0; i < n_items && !rc; i++) {
            choice[i] = -1;
            for (int k = 0; k < n_opts; k++) {
                long x = (long)i * n_opts + k;
                if (col_of[x] && glp_mip_col_val(P, col_of[x]) > 0.5) {
                    choice[i] = k;
                    obj += cost[x];
                    sum += size[x];
                    break;
                }
            }
            if (choice[i] < 0)
                rc = kv_fail(err, KV_EINTERNAL, "knapsack: GLPK chose nothing for group %d", i);
        }
        if (!rc && sum != total)
            rc = kv_fail(err, KV_EINTERNAL, "knapsack: GLPK's choice sums to %ld, not %ld", sum,
                         total);
        if (!rc && objective) *objective = obj;
    }
    glp_delete_prob(P);
    glp_term_out(old_term);
    free(col_of);
    free(ia);
    free(ja);
    free(ar);
    return rc;
}

int kv_mckp_solve_dp(int n_items, int n_opts, const double *cost, const int *size, long total,
                     int *choice, double *objective, kv_error *err) {
    return mckp_dp(n_items, n_opts, cost, size, total, total, choice, objective, err);
}

int kv_mckp_solve_dp_range(int n_items, int n_opts, const double *cost, const int *size,
                           long min_total, long capacity, int *choice, double *objective,
                           kv_error *err) {
    return mckp_dp(n_items, n_opts, cost, size, min_total, capacity, choice, objective, err);
}

/* Objective value of curve point i (NaN when not measured). */
static double curve_value(const kv_sens_curves *c, kv_sens_objective obj, long i) {
    if (obj == KV_SENS_OBJ_NLL) return c->delta_nll[i];
    return isfinite(c->kl[i]) ? c->kl[i] - c->base_kl : NAN;
}

static long gcd_l(long a, long b) {
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The knapsack's options of head h: for each (type, policy) curve and block level lo + kk
 * (kk < nk), the size (blocks, or stored bytes in `unit` when typed) and the cost: the curve
 * interpolated linearly in blocks between its measured points (NaN outside them). px, py:
 * scratch of K + 2 points. */
static void head_options(const kv_sens_curves *c, const kv_sens_opts *o, int h, int typed,
                         const long *blk_bytes, long unit, int lo, int nk, double *px, double *py,
                         double *cost, int *size) {
    const int Q = c->n_policies, K = c->n_levels, T = c->n_types, n_opts = T * Q * nk;
    int base_k = (c->base[h] + o->block_size - 1) / o->block_size;
    for (int tq = 0; tq < T * Q; tq++) {
        const int ty = tq / Q, q = tq % Q;
        /* the measured points of this curve (levels ascending), and the base point
         * (value 0 by definition) when this is the head's base policy and type */
        int np = 0,
            base_in = c->base_policy[h] == c->policies[q] && c->base_type[h] == c->types[ty];
        for (int k = 0; k < K; k++) {
            double v = curve_value(c, o->objective, ((long)h * T * Q + tq) * K + k);
            if (!isfinite(v) || (base_in && c->levels[k] == base_k)) continue;
            if (base_in && c->levels[k] > base_k && (np == 0 || px[np - 1] < base_k))
                px[np] = base_k, py[np] = 0.0, np++;
            px[np] = c->levels[k], py[np] = v, np++;
        }
        if (base_in && (np == 0 || px[np - 1] < base_k)) px[np] = base_k, py[np] = 0.0, np++;
        for (int kk = 0; kk < nk; kk++) {
            int k = lo + kk;
            long x = (long)h * n_opts + tq * nk + kk;
            size[x] = typed ? (int)(((long)k * blk_bytes[ty] + unit - 1) / unit) : k;
            cost[x] = NAN;
            if (np == 0 || k < px[0] || k > px[np - 1]) continue;
            int j = 0;
            while (j + 1 < np && px[j + 1] < k) j++;
            if (px[j] == k || j + 1 >= np)
                cost[x] = py[j];
            else
                cost[x] = py[j] + (py[j + 1] - py[j]) * (k - px[j]) / (px[j + 1] - px[j]);
        }
    }
}

int kv_sens_allocate(const kv_sens_curves *c, const kv_sens_opts *o, int *budget, kv_policy *policy,
                     double *predicted, kv_error *err) {
    if (c->n_types > 1 || (c->n_types == 1 && c->types[0] != o->kv_type))
        return kv_fail(err, KV_EINPUT,
                       "sensitivity: curves over KV types need kv_sens_allocate_typed");
    return kv_sens_allocate_typed(c, o, budget, policy, NULL, predicted, err);
}

int kv_sens_allocate_typed(const kv_sens_curves *c, const kv_sens_opts *o, int *budget,
                           kv_policy *policy, kv_cache_type *type, double *predicted,
                           kv_error *err) {
    int rc = check_opts(o, err);
    if (rc) return rc;
    const int nh = c->n_heads, Q = c->n_policies, K = c->n_levels, T = c->n_types;
    /* tokens only (one type, the base's): sizes are blocks and sum to the uniform plan's
     * blocks exactly (GLPK); over types: sizes are stored bytes (in a common unit) and sum to at
     * most the uniform plan's bytes (DP) */
    const int typed = T > 1 || c->types[0] != o->kv_type;
    const int hi = full_blocks(o);
    int lo = hi;
    for (int q = 0; q < Q; q++) {
        int f = floor_blocks(o, c->policies[q]);
        if (f < lo) lo = f;
    }
    const int nk = hi - lo + 1, n_opts = T * Q * nk;
    long total = (long)floor(o->ratio * (double)nh * o->context / o->block_size + 1e-9);
    long blk_bytes[KV_CACHE_TYPES], unit = 0;
    for (int ty = 0; ty < T; ty++) {
        blk_bytes[ty] = (long)o->block_size * (long)kv_type_token_bytes(c->types[ty], c->head_dim);
        unit = gcd_l(unit, blk_bytes[ty]);
    }
    long cap = total, cap_lo = total;
    if (typed) {
        long base_blk = (long)o->block_size * (long)kv_type_token_bytes(o->kv_type, c->head_dim);
        long min_blk = base_blk;
        for (int ty = 0; ty < T; ty++)
            if (blk_bytes[ty] < min_blk) min_blk = blk_bytes[ty];
        long cap_bytes = total * base_blk;
        /* at least this many bytes, so the plan's bytes stay within one block per head of
         * R * full (plan validation): the uniform plan is within one base block of it */
        long lo_bytes = cap_bytes - (long)nh * min_blk + base_blk;
        /* a coarser unit (sizes rounded up, so the byte sum stays within the capacity) when
         * the table would be large */
        while ((double)nh * (double)(cap_bytes / unit) * n_opts > 3e8) unit *= 2;
        cap = cap_bytes / unit;
        cap_lo = lo_bytes > 0 ? (lo_bytes + unit - 1) / unit : 0;
        if (cap_lo > cap) cap_lo = cap;
    }
    double *cost = kv_malloc((size_t)nh * n_opts * sizeof *cost, "knapsack costs", err);
    int *size = kv_malloc((size_t)nh * n_opts * sizeof *size, "knapsack sizes", err);
    int *choice = kv_malloc((size_t)nh * sizeof *choice, "knapsack choice", err);
    double *px = kv_malloc((size_t)(K + 2) * sizeof *px, "curve", err);
    double *py = kv_malloc((size_t)(K + 2) * sizeof *py, "curve", err);
    if (!cost || !size || !choice || !px || !py) {
        rc = KV_EINTERNAL;
        goto done;
    }
    for (int h = 0; h < nh; h++)
        head_options(c, o, h, typed, blk_bytes, unit, lo, nk, px, py, cost, size);
    double obj = 0;
    rc = typed ? kv_mckp_solve_dp_range(nh, n_opts, cost, size, cap_lo, cap, choice, &obj, err)
               : kv_mckp_solve_mip(nh, n_opts, cost, size, total, choice, &obj, err);
    if (rc) {
        kv_fail_context(err, "sensitivity allocation of %ld blocks of %d tokens", total,
                        o->block_size);
        goto done;
    }
    for (int h = 0; h < nh; h++) {
        int tq = choice[h] / nk, k = lo + choice[h] % nk;
        budget[h] = level_tokens(o, k);
        policy[h] = c->policies[tq % Q];
        if (type) type[h] = c->types[tq / Q];
    }
    if (predicted) *predicted = obj;
done:
    free(cost);
    free(size);
    free(choice);
    free(px);
    free(py);
    return rc;
}

/* ---------------------------------------------------------------- search ---- */

/* Verification chunks as tasks: task ch is search chunk ch under (budget, policy). */
typedef struct ppl_tasks {
    kv_engine *e;
    const int *ids;
    int C;
    const int *budget;
    const kv_policy *policy;
    const kv_cache_type *type;
} ppl_tasks;

static int ppl_task(void *user, long task, double *out, kv_error *err) {
    const ppl_tasks *t = user;
    const int *b[1] = {t->budget};
    const kv_policy *p[1] = {t->policy};
    const kv_cache_type *ty[1] = {t->type};
    return kv_engine_chunk_score_typed(t->e, t->ids + task * t->C, t->C, 1, b, p, ty, NULL, out,
                                       NULL, NULL, err);
}

int kv_sens_refine_chunks(const kv_sens_opts *o, int calib) {
    if (o->full_curves || o->refine_chunks <= 0 || o->refine_chunks > calib) return calib;
    return o->refine_chunks;
}

long kv_sens_verify_evals(const kv_sens_opts *o, int n_search) {
    return (long)n_search * o->context;
}

/* Budgeted perplexity on the n_search search chunks (summed in chunk order). */
static int search_ppl(kv_engine *e, int vocab, const int *ids, int n_search, const kv_sens_opts *o,
                      const int *budget, const kv_policy *policy, const kv_cache_type *type,
                      double *ppl, long *evals, kv_error *err) {
    const int C = o->context;
    double *v = kv_malloc((size_t)n_search * sizeof *v, "chunk losses", err);
    if (!v) return KV_EINTERNAL;
    ppl_tasks t = {e, ids, C, budget, policy, type};
    double lo, hi;
    kv_nll_sum_range(C - 1, vocab, &lo, &hi);
    int rc = kv_tasks_run_range(o->tasks, n_search, 1, lo, hi, ppl_task, &t, v, err);
    double s = 0;
    for (int ch = 0; ch < n_search && !rc; ch++) s += v[ch];
    free(v);
    if (rc) return rc;
    *evals += kv_sens_verify_evals(o, n_search);
    *ppl = kv_perplexity_from_nll(s, (long)n_search * (C - 1));
    return KV_OK;
}

/* The candidate solutions of one refinement round and the round's scratch. */
typedef struct sens_cands {
    int *cand, *cand2;
    kv_policy *cpol, *cpol2;
    kv_cache_type *ctyp, *ctyp2;
} sens_cands;

/* One round's knapsacks over curves cv: one per objective (KL and NLL for `both`); each
 * distinct solution is verified on the search chunks (unless it is r's kept one) and the round
 * keeps the better in sc->cand, cpol, ctyp, with its search perplexity *ppl, predicted change
 * *pred, objective *obj_used and *same = 1 when it equals r's kept solution. */
static int round_solve(kv_engine *e, int vocab, const int *ids, int n_search, const kv_sens_opts *o,
                       int nh, const kv_sens_curves *cv, kv_sens_result *r, sens_cands *sc,
                       double *ppl, double *pred, int *obj_used, int *same, kv_error *err) {
    int rc = KV_OK;
    const int n_obj = o->objective == KV_SENS_OBJ_BOTH ? 2 : 1;
    for (int oi = 0; oi < n_obj && !rc; oi++) {
        kv_sens_opts oo = *o;
        oo.objective = n_obj == 2 ? (oi == 0 ? KV_SENS_OBJ_KL : KV_SENS_OBJ_NLL) : o->objective;
        double pr = 0, pp = NAN;
        rc = kv_sens_allocate_typed(cv, &oo, sc->cand2, sc->cpol2, sc->ctyp2, &pr, err);
        if (rc) break;
        if (oi > 0 && !memcmp(sc->cand2, sc->cand, (size_t)nh * sizeof *sc->cand) &&
            !memcmp(sc->cpol2, sc->cpol, (size_t)nh * sizeof *sc->cpol) &&
            !memcmp(sc->ctyp2, sc->ctyp, (size_t)nh * sizeof *sc->ctyp))
            continue; /* the same solution as the first objective's */
        int unchanged = !memcmp(sc->cand2, r->budget, (size_t)nh * sizeof *sc->cand) &&
                        !memcmp(sc->cpol2, r->policy, (size_t)nh * sizeof *sc->cpol) &&
                        !memcmp(sc->ctyp2, r->type, (size_t)nh * sizeof *sc->ctyp);
        if (unchanged)
            pp = r->ppl;
        else
            rc = search_ppl(e, vocab, ids, n_search, o, sc->cand2, sc->cpol2, sc->ctyp2, &pp,
                            &r->token_evals, err);
        if (rc) break;
        if (oi == 0 || pp < *ppl) {
            *ppl = pp;
            *pred = pr;
            *obj_used = oo.objective;
            *same = unchanged;
            memcpy(sc->cand, sc->cand2, (size_t)nh * sizeof *sc->cand);
            memcpy(sc->cpol, sc->cpol2, (size_t)nh * sizeof *sc->cpol);
            memcpy(sc->ctyp, sc->ctyp2, (size_t)nh * sizeof *sc->ctyp);
        }
    }
    return rc;
}

int kv_sens_search(kv_engine *e, const kv_model *m, const int *ids, int n_search,
                   double uniform_ppl, const kv_sens_opts *o, kv_sens_result *r, kv_error *err) {
    memset(r, 0, sizeof *r);
    int rc = check_opts(o, err);
    if (rc) return rc;
    if (n_search < 1) return kv_fail(err, KV_EINPUT, "sensitivity: no search chunk");
    double t0 = kv_now();
    const int nh = m->cfg.n_layers * m->cfg.n_kv_heads, C = o->context;
    int calib = o->calib_chunks < n_search ? o->calib_chunks : n_search;
    r->round_ppl = kv_malloc((size_t)o->max_rounds * sizeof *r->round_ppl, "rounds", err);
    r->round_pred = kv_malloc((size_t)o->max_rounds * sizeof *r->round_pred, "rounds", err);
    r->budget = kv_malloc((size_t)nh * sizeof *r->budget, "budgets", err);
    r->policy = kv_malloc((size_t)nh * sizeof *r->policy, "policies", err);
    r->round_obj = kv_malloc((size_t)o->max_rounds * sizeof *r->round_obj, "rounds", err);
    r->type = kv_malloc((size_t)nh * sizeof *r->type, "types", err);
    sens_cands sc;
    kv_cache_type *ctyp = sc.ctyp = kv_malloc((size_t)nh * sizeof *ctyp, "types", err);
    kv_cache_type *ctyp2 = sc.ctyp2 = kv_malloc((size_t)nh * sizeof *ctyp2, "types", err);
    int *cand = sc.cand = kv_malloc((size_t)nh * sizeof *cand, "budgets", err);
    kv_policy *cpol = sc.cpol = kv_malloc((size_t)nh * sizeof *cpol, "policies", err);
    int *cand2 = sc.cand2 = kv_malloc((size_t)nh * sizeof *cand2, "budgets", err);
    kv_policy *cpol2 = sc.cpol2 = kv_malloc((size_t)nh * sizeof *cpol2, "policies", err);
    if (!r->round_ppl || !r->round_pred || !r->round_obj || !r->budget || !r->policy || !cand ||
        !cpol || !cand2 || !cpol2 || !r->type || !ctyp || !ctyp2) {
        rc = KV_EINTERNAL;
        goto done;
    }
    rc = kv_uniform_budgets(nh, o->ratio, C, o->block_size, r->budget, NULL, err);
    for (int h = 0; h < nh; h++) {
        r->policy[h] = o->policy;
        r->type[h] = o->kv_type;
    }
    if (!rc && !isfinite(uniform_ppl))
        rc = search_ppl(e, m->cfg.vocab_size, ids, n_search, o, r->budget, r->policy, r->type,
                        &uniform_ppl, &r->token_evals, err);
    if (rc) goto done;
    r->uniform_ppl = uniform_ppl;
    r->ppl = uniform_ppl;
    r->best_round = -1;
    for (int round = 0; round < o->max_rounds && !rc; round++) {
        kv_sens_curves cur, *cv = &r->curves;
        if (round == 0) {
            rc = kv_sens_measure_typed(e, m, ids, calib, NULL, NULL, NULL, NULL, 0, o, &r->curves,
                                       err);
        } else {
            rc = kv_sens_measure_around(e, m, ids, kv_sens_refine_chunks(o, calib), r->budget,
                                        r->policy, r->type, &r->curves, o, &cur, err);
            cv = &cur;
        }
        if (rc) break;
        r->token_evals += cv->token_evals;
        /* one knapsack per objective (KL and NLL for `both`); each distinct solution is
         * verified on the search chunks and the round keeps the better */
        double pred = 0, ppl = HUGE_VAL;
        int obj_used = -1, same = 1;
        rc = round_solve(e, m->cfg.vocab_size, ids, n_search, o, nh, cv, r, &sc, &ppl, &pred,
                         &obj_used, &same, err);
        if (cv != &r->curves) kv_sens_curves_free(cv);
        if (rc) break;
        r->round_ppl[round] = ppl;
        r->round_pred[round] = pred;
        r->round_obj[round] = obj_used;
        r->rounds = round + 1;
        if (o->progress && !o->progress->quiet)
            kv_progress_print(o->progress, 1,
                              "sensitivity: round %d: search perplexity %.4f (uniform %.4f, "
                              "kept %.4f)",
                              round + 1, ppl, uniform_ppl, r->ppl);
        if (same || !(ppl < r->ppl)) break;
        r->ppl = ppl;
        r->best_round = round;
        memcpy(r->budget, cand, (size_t)nh * sizeof *cand);
        memcpy(r->policy, cpol, (size_t)nh * sizeof *cpol);
        memcpy(r->type, ctyp, (size_t)nh * sizeof *ctyp);
    }
done:
    free(ctyp);
    free(ctyp2);
    free(cand);
    free(cpol);
    free(cand2);
    free(cpol2);
    r->seconds = kv_now() - t0;
    if (rc) kv_sens_result_free(r);
    return rc;
}

/* ---------------------------------------------------------------- writing ---- */

int kv_sens_write(kv_h5 *f, int n_layers, int n_kv_heads, const kv_sens_opts *o,
                  const kv_sens_result *r, kv_error *err) {
    const kv_sens_curves *c = &r->curves;
    const int Q = c->n_policies, K = c->n_levels, T = c->n_types;
    long dk = K, d2[2] = {n_layers, n_kv_heads};
    /* [L, H_kv, (T,) (Q,) K]: the type axis when the curves span several types, the policy
     * axis when they span several policies */
    long dc[5] = {n_layers, n_kv_heads};
    int rank = 2;
    if (T > 1) dc[rank++] = T;
    if (Q > 1) dc[rank++] = Q;
    dc[rank++] = K;
    int rc = kv_h5_write_i32(f, "/sensitivity/levels", 1, &dk, c->levels, "blocks", err);
    int *tok = kv_malloc((size_t)(K > 0 ? K : 1) * sizeof *tok, "levels", err);
    int *pol = kv_malloc((size_t)c->n_heads * sizeof *pol, "policies", err);
    if (!tok || !pol) rc = KV_EINTERNAL;
    for (int k = 0; !rc && k < K; k++) tok[k] = level_tokens(o, c->levels[k]);
    if (!rc) rc = kv_h5_write_i32(f, "/sensitivity/level_tokens", 1, &dk, tok, "tokens", err);
    if (!rc)
        rc =
            kv_h5_write_f64(f, "/sensitivity/delta_nll", rank, dc, c->delta_nll, "nats/token", err);
    if (!rc) rc = kv_h5_write_f64(f, "/sensitivity/kl", rank, dc, c->kl, "nats/token", err);
    if (!rc) rc = kv_h5_write_i32(f, "/sensitivity/base", 2, d2, c->base, "tokens", err);
    if (!rc) rc = kv_h5_write_i32(f, "/sensitivity/budget", 2, d2, r->budget, "tokens", err);
    for (int h = 0; !rc && h < c->n_heads; h++) pol[h] = (int)r->policy[h];
    if (!rc) rc = kv_h5_write_i32(f, "/sensitivity/policy", 2, d2, pol, "policy code", err);
    for (int h = 0; !rc && h < c->n_heads; h++) pol[h] = (int)r->type[h];
    if (!rc) rc = kv_h5_write_i32(f, "/sensitivity/kv_type", 2, d2, pol, "KV type code", err);
    long dr = r->rounds > 0 ? r->rounds : 0;
    if (!rc && dr > 0)
        rc = kv_h5_write_f64(f, "/sensitivity/rounds/perplexity", 1, &dr, r->round_ppl,
                             "perplexity", err);
    if (!rc && dr > 0)
        rc = kv_h5_write_f64(f, "/sensitivity/rounds/predicted", 1, &dr, r->round_pred,
                             "nats/token (KL or NLL, see objective)", err);
    if (!rc && dr > 0)
        rc = kv_h5_write_i32(f, "/sensitivity/rounds/objective", 1, &dr, r->round_obj,
                             "0 kl, 1 nll", err);
    char pols[128] = "";
    for (int q = 0; q < Q; q++) {
        size_t l = strlen(pols);
        snprintf(pols + l, sizeof pols - l, "%s%s", q ? "," : "", kv_policy_name(c->policies[q]));
    }
    char typs[128] = "";
    for (int ty = 0; ty < T; ty++) {
        size_t l = strlen(typs);
        snprintf(typs + l, sizeof typs - l, "%s%s", ty ? "," : "", kv_type_name(c->types[ty]));
    }
    const char *g = "/sensitivity";
    if (!rc) rc = kv_h5_attr_f64(f, g, "ratio", o->ratio, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "policy", kv_policy_name(o->policy), err);
    if (!rc) rc = kv_h5_attr_str(f, g, "policies", pols, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "kv_types", typs, err);
    if (!rc) rc = kv_h5_attr_str(f, g, "kv_type", kv_type_name(o->kv_type), err);
    if (!rc)
        rc = kv_h5_attr_str(f, g, "objective",
                            o->objective == KV_SENS_OBJ_KL    ? "kl"
                            : o->objective == KV_SENS_OBJ_NLL ? "nll"
                                                              : "both",
                            err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "block_size", o->block_size, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "evict_block", o->evict_block, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "context_length", o->context, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "calibration_tokens", c->tokens, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "curve_token_evals", c->token_evals, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "curve_seconds", c->seconds, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "token_evals", r->token_evals, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "seconds", r->seconds, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "base_nll", c->base_nll, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "base_kl", c->base_kl, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "rounds", r->rounds, err);
    if (!rc) rc = kv_h5_attr_i64(f, g, "best_round", r->best_round, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "perplexity", r->ppl, err);
    if (!rc) rc = kv_h5_attr_f64(f, g, "uniform_perplexity", r->uniform_ppl, err);
    free(tok);
    free(pol);
    return rc;
}
