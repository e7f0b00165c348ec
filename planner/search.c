/* kvplan search: BaKlaVa Alg. 3 over a (t, r[, p]) grid, exhaustive or by successive halving,
 * with baselines, held-out checks, sensitivity planning, per-type baselines and the eviction
 * block. The inputs are planner/search_inputs.c's, the plan file planner/search_write.c's.
 * See include/kvplan/search.h. */
#include "planner/search_impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/eval.h"
#include "kvplan/plan.h"

const char *const kv_search_base_names[KV_SEARCH_N_BASE] = {"full", "uniform", "squeeze"};

/* ---------------------------------------------------------------- search state ---- */

void kv_search_result_free(kv_search_result *r) {
    if (!r) return;
    free(r->perplexity);
    free(r->chunks);
    free(r->tokens);
    free(r->blocks);
    free(r->policy);
    free(r->kv_types);
    kv_sens_result_free(&r->sens);
    memset(r, 0, sizeof *r);
}

/* One distinct budget matrix ("arm") and its per-chunk NLL sums on the search tokens. */
typedef struct arm {
    int *tokens; /* [L*H] or NULL for the full cache, owned */
    int *blocks; /* [L*H] or NULL, owned */
    double *nll; /* [search chunks] NLL sum of each chunk, valid for chunk < done */
    int done;
    int first_config; /* lowest grid index using it, -1 for baselines only */
} arm;

typedef struct search_ctx {
    const kv_model *m;
    const kv_search_opts *o;
    const kv_profile_inputs *prof;
    const int *ids;
    kv_engine *eng; /* runs every budget set (full plan as its reservation) */
    arm *arms;
    int n_arms, cap_arms;
    int nh, S, HC; /* heads, search chunks, held-out chunks */
    long grid_chunk_evals;
    long work_done, work_total; /* chunk evaluations, for the progress ETA */
    double t0, best_seen;
    kv_error *err;
    kv_search_result *res;
    int n_cfg;    /* grid points */
    int *cfg_arm; /* [n_cfg] grid point -> arm */
    int *uniq;    /* [n_uniq] distinct grid arms, in grid order */
    int n_uniq;
    int base_arm[KV_SEARCH_N_BASE]; /* full, uniform, squeeze (-1: none) */
    int win_arm;
} search_ctx;

/* The plausible range of one search chunk's NLL sum (kv_nll_sum_range) for task-log checks. */
static void chunk_nll_range(const search_ctx *c, double *lo, double *hi) {
    kv_nll_sum_range(c->o->context - 1, c->m->cfg.vocab_size, lo, hi);
}

/* Find or add the arm with these budgets (NULL = full cache). Takes ownership of tokens and
 * blocks (freed when an equal arm exists). Returns the arm index or -1 on error. */
static int arm_get(search_ctx *c, int *tokens, int *blocks) {
    for (int a = 0; a < c->n_arms; a++) {
        const arm *x = &c->arms[a];
        if ((!x->tokens && !tokens) ||
            (x->tokens && tokens && !memcmp(x->tokens, tokens, (size_t)c->nh * sizeof *tokens))) {
            free(tokens);
            free(blocks);
            return a;
        }
    }
    if (c->n_arms == c->cap_arms) {
        int nc = c->cap_arms ? 2 * c->cap_arms : 16;
        arm *na = realloc(c->arms, (size_t)nc * sizeof *na);
        if (!na) {
            free(tokens);
            free(blocks);
            kv_fail(c->err, KV_EINTERNAL, "out of memory: search arms");
            return -1;
        }
        c->arms = na;
        c->cap_arms = nc;
    }
    arm *x = &c->arms[c->n_arms];
    memset(x, 0, sizeof *x);
    x->tokens = tokens;
    x->blocks = blocks;
    x->first_config = -1;
    x->nll = kv_calloc((size_t)(c->S > 0 ? c->S : 1), sizeof *x->nll, "chunk losses", c->err);
    if (!x->nll) {
        free(tokens);
        free(blocks);
        return -1;
    }
    return c->n_arms++;
}

static void progress(search_ctx *c, const char *what) {
    kv_progress *p = c->o->progress;
    if (!p || p->quiet) return;
    double el = kv_now() - c->t0;
    double eta =
        c->work_done > 0 ? el / (double)c->work_done * (double)(c->work_total - c->work_done) : 0.0;
    if (eta < 0) eta = 0;
    char best[32] = "-";
    if (isfinite(c->best_seen)) snprintf(best, sizeof best, "%.4f", c->best_seen);
    kv_progress_print(p, 0,
                      "search: %s %ld/%ld chunk evals, best ppl %s, %.0fs elapsed, "
                      "ETA %.0fs",
                      what, c->work_done, c->work_total, best, el, eta);
}

/* Chunk `chunk` of the text starting at token `start` (chunks of C) under `budget` and
 * per-head `policy` (NULL: the search's policy). */
static int eval_one(search_ctx *c, const int *budget, const kv_policy *policy, long start,
                    int chunk, double *nll) {
    int C = c->o->context;
    const int *b[1] = {budget};
    const kv_policy *pp[1] = {policy};
    int rc = kv_engine_chunk_nll(c->eng, c->ids + start + (long)chunk * C, C, 1, budget ? b : NULL,
                                 budget && policy ? pp : NULL, nll, NULL, c->err);
    c->work_done++;
    return rc;
}

/* Perplexity of arm `a` on the first n search chunks, evaluating only the missing chunks. */
static int arm_ppl(search_ctx *c, int a, int n, double *ppl, int grid) {
    arm *x = &c->arms[a];
    for (int ch = x->done; ch < n; ch++) {
        int rc = eval_one(c, x->tokens, NULL, 0, ch, &x->nll[ch]);
        if (rc) return rc;
        x->done = ch + 1;
        if (grid) c->grid_chunk_evals++;
    }
    double s = 0.0;
    for (int ch = 0; ch < n; ch++) s += x->nll[ch];
    *ppl = kv_perplexity_from_nll(s, (long)n * (c->o->context - 1));
    if (grid && n == c->S && *ppl < c->best_seen) c->best_seen = *ppl;
    return KV_OK;
}

/* Held-out evaluations as tasks: task i is held-out chunk i % HC under budget[i / HC] (NULL =
 * full) and policy[i / HC] (NULL = the search's). */
typedef struct heldout_tasks {
    search_ctx *c;
    const int *const *budget;
    const kv_policy *const *policy;
    const kv_cache_type *const *type; /* [n] per-head types or NULL (the engine plan's) */
} heldout_tasks;

static int heldout_task(void *user, long task, double *out, kv_error *err) {
    heldout_tasks *t = user;
    search_ctx *c = t->c;
    const int C = c->o->context, *b[1] = {t->budget[task / c->HC]};
    const kv_policy *p[1] = {t->policy[task / c->HC]};
    const kv_cache_type *ty[1] = {t->type[task / c->HC]};
    const int *tk = c->ids + (long)(c->S + task % c->HC) * C;
    int rc = kv_engine_chunk_score_typed(c->eng, tk, C, 1, b[0] ? b : NULL, b[0] && p[0] ? p : NULL,
                                         ty, NULL, out, NULL, NULL, err);
    c->work_done++;
    if (!rc) progress(c, "held-out");
    return rc;
}

/* Held-out perplexities ppl[n] of n budgets and policies (as heldout_task) on the HC chunks
 * after the search tokens, as one task list; each summed in chunk order. */
static int heldout_ppls(search_ctx *c, int n, const int *const *budget,
                        const kv_policy *const *policy, const kv_cache_type *const *type,
                        double *ppl) {
    long nt = (long)n * c->HC;
    double *nll = kv_malloc((size_t)(nt > 0 ? nt : 1) * sizeof *nll, "chunk losses", c->err);
    if (!nll) return KV_EINTERNAL;
    heldout_tasks t = {c, budget, policy, type};
    long before = c->work_done;
    double lo, hi;
    chunk_nll_range(c, &lo, &hi);
    int rc = kv_tasks_run_range(c->o->tasks, nt, 1, lo, hi, heldout_task, &t, nll, c->err);
    c->work_done = before + nt; /* on rank 0 the task callback counted its own tasks only */
    c->res->heldout_token_evals += nt * c->o->context;
    for (int i = 0; i < n && !rc; i++) {
        double s = 0.0;
        for (int ch = 0; ch < c->HC; ch++) s += nll[(long)i * c->HC + ch];
        ppl[i] = kv_perplexity_from_nll(s, (long)c->HC * (c->o->context - 1));
    }
    free(nll);
    return rc;
}

/* ---- chunk evaluations as tasks (kvplan/tasks.h): one process or MPI ranks ---- */

typedef struct chunk_tasks {
    search_ctx *c;
    const int *arm;   /* [n] arm of each task */
    const int *chunk; /* [n] search chunk of each task */
    const char *what; /* progress label */
} chunk_tasks;

static int chunk_task(void *user, long task, double *out, kv_error *err) {
    chunk_tasks *t = user;
    search_ctx *c = t->c;
    const int *budget = c->arms[t->arm[task]].tokens;
    const int *b[1] = {budget};
    int C = c->o->context;
    int rc = kv_engine_chunk_nll(c->eng, c->ids + (long)t->chunk[task] * C, C, 1, budget ? b : NULL,
                                 NULL, out, NULL, err);
    c->work_done++;
    if (!rc) progress(c, t->what);
    return rc;
}

/* Evaluate, as one task list, the missing search chunks [done, n) of the arms arms[0..n_arms)
 * (negative entries and repeats skipped); afterwards each has done >= n, so arm_ppl only sums. */
static int eval_chunks(search_ctx *c, const int *arms, int n_arms, int n, int grid,
                       const char *what) {
    long cap = 0;
    for (int i = 0; i < n_arms; i++) cap += n > 0 ? n : 0;
    int *ta = kv_malloc((size_t)(cap > 0 ? cap : 1) * sizeof *ta, "chunk tasks", c->err);
    int *tc = kv_malloc((size_t)(cap > 0 ? cap : 1) * sizeof *tc, "chunk tasks", c->err);
    double *nll = kv_malloc((size_t)(cap > 0 ? cap : 1) * sizeof *nll, "chunk losses", c->err);
    if (!ta || !tc || !nll) {
        free(ta);
        free(tc);
        free(nll);
        return KV_EINTERNAL;
    }
    long nt = 0;
    for (int i = 0; i < n_arms; i++) {
        int a = arms[i], rep = 0;
        for (int j = 0; j < i; j++) rep |= arms[j] == a;
        if (a < 0 || rep) continue;
        for (int ch = c->arms[a].done; ch < n; ch++) ta[nt] = a, tc[nt++] = ch;
    }
    chunk_tasks t = {c, ta, tc, what};
    long before = c->work_done;
    double lo, hi;
    chunk_nll_range(c, &lo, &hi);
    int rc = kv_tasks_run_range(c->o->tasks, nt, 1, lo, hi, chunk_task, &t, nll, c->err);
    c->work_done = before + nt; /* on rank 0 the task callback counted its own tasks only */
    for (long k = 0; k < nt && !rc; k++) c->arms[ta[k]].nll[tc[k]] = nll[k];
    for (int i = 0; i < n_arms && !rc; i++)
        if (arms[i] >= 0 && c->arms[arms[i]].done < n) {
            if (grid) c->grid_chunk_evals += n - c->arms[arms[i]].done;
            c->arms[arms[i]].done = n;
        }
    free(ta);
    free(tc);
    free(nll);
    return rc;
}

static int halving_round(void *user, const int *configs, int n, int n_chunks, kv_error *err);

typedef struct halving_user {
    search_ctx *c;
    const int *arm_of_unique; /* unique grid arm -> arm index */
} halving_user;

static int halving_eval(void *user, int config, int n_chunks, double *ppl, kv_error *err) {
    halving_user *h = user;
    (void)err;
    int rc = arm_ppl(h->c, h->arm_of_unique[config], n_chunks, ppl, 1);
    if (!rc) progress(h->c, "halving");
    return rc;
}

static int halving_round(void *user, const int *configs, int n, int n_chunks, kv_error *err) {
    halving_user *h = user;
    (void)err;
    int *arms = kv_malloc((size_t)n * sizeof *arms, "halving round", h->c->err);
    if (!arms) return KV_EINTERNAL;
    for (int i = 0; i < n; i++) arms[i] = h->arm_of_unique[configs[i]];
    int rc = eval_chunks(h->c, arms, n, n_chunks, 1, "halving");
    free(arms);
    return rc;
}

long kv_search_halving_chunk_evals(int n, int eta, int c0, int cmax, int *last) {
    long total = 0;
    int prev = 0, c = c0 < cmax ? c0 : cmax;
    if (last) *last = 0;
    if (n < 1 || c < 1) return 0;
    for (;;) {
        total += (long)n * (c - prev);
        int keep = (n + eta - 1) / eta;
        if (n == 1 || keep == 1 || c == cmax) break;
        n = keep;
        prev = c;
        c = (long)c * eta > cmax ? cmax : c * eta;
    }
    if (last) *last = c;
    return total;
}

long kv_search_chunk_plan(const kv_search_opts *o, const kv_search_arms *a, int S, int HC,
                          kv_search_chunks *w) {
    kv_search_chunks z;
    if (!w) w = &z;
    memset(w, 0, sizeof *w);
    int halving = o->halving_eta >= 2 && a->distinct > 1, last = S;
    if (halving) {
        int c0 = o->halving_min_chunks > 0 ? o->halving_min_chunks : 1;
        w->grid = kv_search_halving_chunk_evals(a->distinct, o->halving_eta, c0, S, &last);
        w->grid += S - last; /* the winner finished on every search chunk */
    } else {
        w->grid = (long)a->distinct * S;
    }
    w->baselines = (long)a->base_new * S;
    /* a baseline that is also a grid budget finishes the chunks halving left it (at most S) */
    w->baselines_max = halving ? (long)a->base_distinct * S : w->baselines;
    for (int p = o->evict_block_search ? o->evict_block / 2 : 0; p >= 1; p /= 2)
        w->ladder_max += 2L * S; /* the plan candidate and uniform (once when equal) */
    /* winner and baselines, and the other allocation when sensitivity planning runs */
    w->heldout = (long)(1 + a->base + (o->sensitivity ? 1 : 0)) * HC;
    return w->grid + w->baselines_max + w->ladder_max + w->heldout;
}

static int make_budget(const search_ctx *c, const kv_profile_inputs *prof, kv_alloc_kind kind,
                       double t, double r, double p, int **tokens, int **blocks) {
    kv_alloc_params a;
    kv_alloc_params_default(&a);
    a.kind = kind;
    a.layer_kind = KV_ALLOC_SQUEEZE;
    a.ratio = c->o->ratio;
    a.context = c->o->context;
    a.block_size = c->o->block_size;
    a.min_tokens = kv_policy_fixed_tokens(c->o->policy) + c->o->evict_block;
    a.t = t;
    a.r = r;
    a.p = p;
    *tokens = kv_malloc((size_t)c->nh * sizeof **tokens, "budgets", c->err);
    *blocks = kv_malloc((size_t)c->nh * sizeof **blocks, "blocks", c->err);
    if (!*tokens || !*blocks) {
        free(*tokens);
        free(*blocks);
        return KV_EINTERNAL;
    }
    int rc = kv_plan_budgets(&a, c->m->cfg.n_layers, c->m->cfg.n_kv_heads,
                             prof ? prof->layer_sim : NULL, prof ? prof->head_sim : NULL,
                             prof ? prof->head_imp : NULL, *tokens, *blocks, NULL, c->err);
    if (rc) {
        free(*tokens);
        free(*blocks);
        *tokens = *blocks = NULL;
    }
    return rc;
}

static void config_params(const kv_search_opts *o, const kv_search_result *r, int cfg, double *t,
                          double *rr, double *p) {
    int ir = cfg % r->n_r, it = (cfg / r->n_r) % r->n_t, ip = cfg / (r->n_r * r->n_t);
    *t = o->allocation == KV_ALLOC_BAKLAVA ? o->t_values[it] : NAN;
    *rr = o->allocation == KV_ALLOC_BAKLAVA ? o->r_values[ir] : NAN;
    *p = o->allocation == KV_ALLOC_UNIFORM ? NAN : o->p_values[ip];
}

/* The grid's shape (points, their arms) and its result arrays. */
static int search_shape(search_ctx *c, const kv_search_opts *o, kv_search_result *res) {
    res->n_p = o->allocation == KV_ALLOC_UNIFORM ? 1 : o->n_p;
    res->n_t = o->allocation == KV_ALLOC_BAKLAVA ? o->n_t : 1;
    res->n_r = o->allocation == KV_ALLOC_BAKLAVA ? o->n_r : 1;
    c->n_cfg = res->n_p * res->n_t * res->n_r;
    c->cfg_arm = kv_malloc((size_t)c->n_cfg * sizeof *c->cfg_arm, "grid arms", c->err);
    c->uniq = kv_malloc((size_t)c->n_cfg * sizeof *c->uniq, "grid arms", c->err);
    res->perplexity = kv_malloc((size_t)c->n_cfg * sizeof *res->perplexity, "grid", c->err);
    res->chunks = kv_calloc((size_t)c->n_cfg, sizeof *res->chunks, "grid", c->err);
    return c->cfg_arm && c->uniq && res->perplexity && res->chunks ? KV_OK : KV_EINTERNAL;
}

/* Stage 0: check the options and the text, size the search (S search chunks, HC held-out). */
static int search_setup(search_ctx *c, const kv_model *m, const kv_profile_inputs *prof,
                        const int *ids, long n_ids, const kv_search_opts *o, kv_search_result *res,
                        kv_error *err) {
    const int C = o->context;
    if (C < 2 || C > m->cfg.seq_len)
        return kv_fail(err, KV_EINPUT, "context %d must be in [2, %d] (the model's context)", C,
                       m->cfg.seq_len);
    if (o->allocation != KV_ALLOC_UNIFORM && !prof)
        return kv_fail(err, KV_EINPUT, "allocation %s needs a profile",
                       kv_alloc_name(o->allocation));
    if (o->allocation == KV_ALLOC_BAKLAVA &&
        (o->n_t < 1 || o->n_r < 1 || !o->t_values || !o->r_values))
        return kv_fail(err, KV_EINPUT, "the baklava search needs t and r grids");
    if (o->n_p < 1 || !o->p_values)
        return kv_fail(err, KV_EINPUT, "the search needs at least one SqueezeAttention p");
    if (o->halving_eta == 1 || o->halving_eta < 0)
        return kv_fail(err, KV_EINPUT, "--halving ETA must be at least 2 (got %d)", o->halving_eta);
    if (o->eval_tokens < C)
        return kv_fail(err, KV_EINPUT, "--eval-tokens %ld is less than one chunk of %d tokens",
                       o->eval_tokens, C);
    long search_tokens = o->eval_tokens < n_ids ? o->eval_tokens : n_ids;
    c->m = m;
    c->o = o;
    c->prof = prof;
    c->ids = ids;
    c->err = err;
    c->res = res;
    c->win_arm = -1;
    for (int b = 0; b < KV_SEARCH_N_BASE; b++) c->base_arm[b] = -1;
    c->nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    c->S = (int)(search_tokens / C);
    if (c->S < 1)
        return kv_fail(err, KV_EINPUT, "the text has %ld tokens, fewer than one chunk of %d", n_ids,
                       C);
    long left = n_ids - (long)c->S * C;
    long ho = o->heldout_tokens < left ? o->heldout_tokens : left;
    c->HC = o->heldout_tokens > 0 ? (int)(ho / C) : 0;
    if (o->heldout_tokens > 0 && c->HC < 1)
        return kv_fail(err, KV_EINPUT,
                       "the text has %ld tokens: %d search chunks of %d use %ld and the %ld "
                       "left are less than one held-out chunk; use a longer text, fewer "
                       "--eval-tokens or --heldout-tokens 0",
                       n_ids, c->S, C, (long)c->S * C, left);
    for (long i = 0; i < (long)(c->S + c->HC) * C; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return kv_fail(err, KV_EINPUT, "token %ld has id %d outside the vocabulary", i, ids[i]);
    res->search_chunks = c->S;
    res->heldout_chunks = c->HC;
    if (search_shape(c, o, res)) return KV_EINTERNAL;
    c->t0 = kv_now();
    c->best_seen = HUGE_VAL;
    return KV_OK;
}

/* Stage 1: the budgets of every grid point, deduplicated into arms. */
static int search_grid_budgets(search_ctx *c) {
    const kv_search_opts *o = c->o;
    int rc = KV_OK;
    for (int g = 0; g < c->n_cfg && !rc; g++) {
        double t, r, p;
        config_params(o, c->res, g, &t, &r, &p);
        int *tok = NULL, *blk = NULL;
        rc = make_budget(c, c->prof, o->allocation, t, r, p, &tok, &blk);
        if (rc) {
            if (o->allocation == KV_ALLOC_BAKLAVA)
                kv_fail_context(c->err, "budgets for t = %g, r = %g, p = %g", t, r, p);
            break;
        }
        int a = arm_get(c, tok, blk);
        if (a < 0) return c->err ? c->err->code : KV_EINTERNAL;
        c->cfg_arm[g] = a;
        if (c->arms[a].first_config < 0) {
            c->arms[a].first_config = g;
            c->uniq[c->n_uniq++] = a;
        }
    }
    c->res->distinct_budgets = c->n_uniq;
    return rc;
}

/* Stage 2: the baselines' budgets (full, uniform, squeeze when there is a profile); every
 * budget must suit the policy (kv_plan_validate through the plan module). */
static int search_baseline_budgets(search_ctx *c) {
    int rc = KV_OK;
    c->base_arm[0] = arm_get(c, NULL, NULL);
    if (c->base_arm[0] < 0) return c->err ? c->err->code : KV_EINTERNAL;
    int *tok = NULL, *blk = NULL;
    rc = make_budget(c, c->prof, KV_ALLOC_UNIFORM, NAN, NAN, NAN, &tok, &blk);
    if (!rc) c->base_arm[1] = arm_get(c, tok, blk);
    if (!rc && c->prof) {
        rc = make_budget(c, c->prof, KV_ALLOC_SQUEEZE, NAN, NAN, KV_SQUEEZE_DEFAULT_P, &tok, &blk);
        if (!rc) c->base_arm[2] = arm_get(c, tok, blk);
    }
    if (!rc && (c->base_arm[1] < 0 || (c->prof && c->base_arm[2] < 0)))
        rc = c->err ? c->err->code : KV_EINTERNAL;
    for (int a = 0; a < c->n_arms && !rc; a++) {
        if (!c->arms[a].tokens) continue;
        kv_plan chk;
        rc = kv_plan_from_budgets(&c->m->cfg, c->arms[a].tokens, NULL, c->o->policy, c->o->ratio,
                                  c->o->context, c->o->block_size, c->o->evict_block, "search", NAN,
                                  NAN, NAN, 0, &chk, c->err);
        kv_plan_free(&chk);
    }
    return rc;
}

/* The KV types the sensitivity knapsack may choose: kv_types_mask when sensitivity
 * planning runs, else none (the plan keeps o->kv_type in every head). */
static int search_knapsack_types(const kv_search_opts *o) {
    return kv_search_sens_opts(o).types_mask;
}

/* Stage 3: one engine whose reservation is the full cache, so it runs every arm. */
static int search_engine(search_ctx *c) {
    const kv_search_opts *o = c->o;
    return kv_search_engine(c->m, o, o->kv_type, o->block_size, o->evict_block,
                            o->sensitivity && o->sens.batch > 1 ? o->sens.batch : 1,
                            search_knapsack_types(o), &c->eng, c->err);
}

int kv_search_sens_count(const kv_model *m, const kv_search_opts *o, int S, kv_search_sens_work *w,
                         kv_error *err) {
    memset(w, 0, sizeof *w);
    if (!o->sensitivity) return KV_OK;
    kv_sens_opts so = kv_search_sens_opts(o);
    const int calib = so.calib_chunks < S ? so.calib_chunks : S;
    int rc = kv_sens_count(m, &so, calib, 0, &w->curves, &w->curves_max, &w->passes, err);
    if (!rc)
        rc = kv_sens_count(m, &so, kv_sens_refine_chunks(&so, calib), 1, &w->round, &w->round_max,
                           NULL, err);
    w->rounds = so.max_rounds;
    w->verify_one = kv_sens_verify_evals(&so, S);
    w->verify_max =
        (long)so.max_rounds * (so.objective == KV_SENS_OBJ_BOTH ? 2 : 1) * w->verify_one;
    return rc;
}

long kv_search_sens_chunks(const kv_search_opts *o, const kv_model *m, int S) {
    kv_search_sens_work w;
    kv_error err = {0};
    if (!o->sensitivity || kv_search_sens_count(m, o, S, &w, &err)) return 0;
    /* every round, each between what always runs and the most it can run */
    long tokens = (w.curves + w.curves_max) / 2 +
                  (long)(w.rounds - 1) * ((w.round + w.round_max) / 2) +
                  (long)w.rounds * w.verify_one;
    return tokens / o->context;
}

int kv_search_type_chunks(const kv_model *m, const kv_search_opts *o, int p, int S, int HC,
                          long *chunks, kv_error *err) {
    const int nh = m->cfg.n_layers * m->cfg.n_kv_heads, hd = m->cfg.head_dim, C = o->context;
    *chunks = 0;
    if (!o->kv_types_mask) return KV_OK;
    int *bud = kv_malloc((size_t)nh * sizeof *bud, "type baseline budgets", err);
    if (!bud) return KV_EINTERNAL;
    /* the plan's bytes, as search_type_baselines takes them */
    double Rb = o->ratio * (double)kv_type_token_bytes(o->kv_type, hd) /
                (double)kv_type_token_bytes(KV_TYPE_F16, hd);
    int rc = KV_OK;
    for (int t = 0; t < KV_CACHE_TYPES && !rc; t++) {
        if (!(o->kv_types_mask & (1 << t))) continue;
        double tr = kv_type_token_ratio(Rb, (kv_cache_type)t, hd);
        rc = kv_uniform_budgets(nh, tr > 1.0 ? 1.0 : tr, C, o->block_size, bud, NULL, err);
        int below = 0, fl = kv_policy_fixed_tokens(o->policy) + p;
        for (int i = 0; i < nh && !rc; i++) below |= bud[i] < C && bud[i] < fl;
        if (!rc && !below) *chunks += S + HC;
    }
    free(bud);
    return rc;
}

/* How many baselines there are, distinct, and not among the grid's budgets (those run on
 * every search chunk after the grid; the others share a grid arm's chunks). */
static void search_arms(const search_ctx *c, kv_search_arms *out) {
    memset(out, 0, sizeof *out);
    out->points = c->n_cfg;
    out->distinct = c->n_uniq;
    for (int b = 0; b < KV_SEARCH_N_BASE; b++) {
        int a = c->base_arm[b], rep = 0;
        for (int j = 0; j < b; j++) rep |= c->base_arm[j] == a;
        out->base += a >= 0;
        out->base_distinct += a >= 0 && !rep;
        out->base_new += a >= c->n_uniq && !rep;
    }
}

/* Stage 4: the grid, exhaustive or by successive halving; sets the winning arm. */
static int search_grid_eval(search_ctx *c) {
    const kv_search_opts *o = c->o;
    int rc = KV_OK;
    kv_search_arms arms;
    search_arms(c, &arms);
    long types = 0;
    kv_error terr = {0};
    /* at most: the ladder may lower the eviction block to 1 */
    if (kv_search_type_chunks(c->m, o, o->evict_block_search ? 1 : o->evict_block, c->S, c->HC,
                              &types, &terr))
        types = 0;
    c->work_total = kv_search_chunk_plan(o, &arms, c->S, c->HC, NULL) +
                    kv_search_sens_chunks(o, c->m, c->S) + types;
    if (o->halving_eta >= 2 && c->n_uniq > 1) {
        kv_sh_opts sh = {.eta = o->halving_eta,
                         .min_chunks =
                             o->halving_min_chunks > 0
                                 ? (o->halving_min_chunks < c->S ? o->halving_min_chunks : c->S)
                                 : 1,
                         .max_chunks = c->S,
                         .tokens_per_chunk = o->context,
                         .prefix_reuse = 1,
                         .round = halving_round};
        halving_user hu = {c, c->uniq};
        kv_sh_result shr;
        rc = kv_successive_halving(c->n_uniq, &sh, halving_eval, &hu, &shr, NULL, c->err);
        if (!rc) {
            c->win_arm = c->uniq[shr.winner];
            c->res->halving_rounds = shr.rounds;
            /* finish the winner on every search chunk so that its perplexity compares
             * with the baselines' (counted as grid work) */
            double ppl = NAN;
            if (shr.winner_chunks < c->S) rc = eval_chunks(c, &c->win_arm, 1, c->S, 1, "grid");
            if (!rc && shr.winner_chunks < c->S) rc = arm_ppl(c, c->win_arm, c->S, &ppl, 1);
        }
        return rc;
    }
    double best = HUGE_VAL;
    rc = eval_chunks(c, c->uniq, c->n_uniq, c->S, 1, "grid");
    for (int u = 0; u < c->n_uniq && !rc; u++) {
        double ppl = NAN;
        for (int ch = 1; ch <= c->S && !rc; ch++) { /* chunk by chunk for progress */
            rc = arm_ppl(c, c->uniq[u], ch, &ppl, 1);
            if (!rc) progress(c, "grid");
        }
        if (!rc && (c->win_arm < 0 || ppl < best)) {
            best = ppl;
            c->win_arm = c->uniq[u];
        }
    }
    return rc;
}

/* Stage 5: the grid's values and the winner's budgets into the result. */
static int search_winner(search_ctx *c) {
    kv_search_result *res = c->res;
    const int C = c->o->context;
    for (int g = 0; g < c->n_cfg; g++) {
        const arm *x = &c->arms[c->cfg_arm[g]];
        res->chunks[g] = x->done;
        double s = 0;
        for (int ch = 0; ch < x->done; ch++) s += x->nll[ch];
        res->perplexity[g] = x->done > 0 ? kv_perplexity_from_nll(s, (long)x->done * (C - 1)) : NAN;
    }
    res->best = c->arms[c->win_arm].first_config;
    config_params(c->o, res, res->best, &res->best_t, &res->best_r, &res->best_p);
    res->best_ppl = res->perplexity[res->best];
    res->best_chunks = res->chunks[res->best];
    res->token_evals = c->grid_chunk_evals * C;
    res->token_evals_exhaustive = (long)c->n_uniq * c->S * C;
    res->tokens = kv_malloc((size_t)c->nh * sizeof *res->tokens, "winner", c->err);
    res->blocks = kv_malloc((size_t)c->nh * sizeof *res->blocks, "winner", c->err);
    if (!res->tokens || !res->blocks) return KV_EINTERNAL;
    memcpy(res->tokens, c->arms[c->win_arm].tokens, (size_t)c->nh * sizeof *res->tokens);
    memcpy(res->blocks, c->arms[c->win_arm].blocks, (size_t)c->nh * sizeof *res->blocks);
    return KV_OK;
}

/* Stage 6: baselines on the search tokens (a plan is never worse than a budgeted baseline
 * measured on the same chunks), then winner and baselines on the held-out tokens. */
static int search_baselines_heldout(search_ctx *c) {
    kv_search_result *res = c->res;
    int rc = eval_chunks(c, c->base_arm, KV_SEARCH_N_BASE, c->S, 0, "baselines");
    for (int b = 0; b < KV_SEARCH_N_BASE && !rc; b++) {
        res->base_ppl[b] = NAN;
        if (c->base_arm[b] < 0) continue;
        for (int ch = 1; ch <= c->S && !rc; ch++) {
            rc = arm_ppl(c, c->base_arm[b], ch, &res->base_ppl[b], 0);
            if (!rc) progress(c, "baselines");
        }
    }
    /* if uniform or squeeze beat the grid's best, that baseline's budgets become the plan's */
    res->winner_kind = c->o->allocation;
    if (!rc && res->best_chunks == c->S) {
        static const kv_alloc_kind base_kind[KV_SEARCH_N_BASE] = {0, KV_ALLOC_UNIFORM,
                                                                  KV_ALLOC_SQUEEZE};
        for (int b = 1; b < KV_SEARCH_N_BASE; b++) {
            if (c->base_arm[b] < 0 || !(res->base_ppl[b] < res->best_ppl)) continue;
            c->win_arm = c->base_arm[b];
            res->best_ppl = res->base_ppl[b];
            res->winner_kind = base_kind[b];
            res->best_t = NAN;
            res->best_r = NAN;
            res->best_p = base_kind[b] == KV_ALLOC_SQUEEZE ? KV_SQUEEZE_DEFAULT_P : NAN;
            memcpy(res->tokens, c->arms[c->win_arm].tokens, (size_t)c->nh * sizeof *res->tokens);
            memcpy(res->blocks, c->arms[c->win_arm].blocks, (size_t)c->nh * sizeof *res->blocks);
        }
    }
    res->grid_ppl = res->best_ppl;
    res->grid_token_evals_all = c->work_done * (long)c->o->context;
    res->grid_seconds = kv_now() - c->t0;
    return rc;
}

/* Stage 7: sensitivity planning (curves, knapsack, refinement) when asked for; its solution
 * becomes the plan when its search perplexity beats the winner so far. */
static int search_sensitivity(search_ctx *c) {
    kv_search_result *res = c->res;
    const kv_search_opts *o = c->o;
    int rc = KV_OK;
    res->sens_ppl = res->sens_heldout = res->grid_heldout = NAN;
    res->policy = kv_malloc((size_t)c->nh * sizeof *res->policy, "winner policies", c->err);
    res->kv_types = kv_malloc((size_t)c->nh * sizeof *res->kv_types, "winner types", c->err);
    if (!res->policy || !res->kv_types) return KV_EINTERNAL;
    for (int h = 0; h < c->nh; h++) res->policy[h] = o->policy;
    for (int h = 0; h < c->nh; h++) res->kv_types[h] = o->kv_type;
    if (!o->sensitivity) return KV_OK;
    kv_sens_opts so = kv_search_sens_opts(o);
    double uni = c->base_arm[1] >= 0 ? res->base_ppl[1] : NAN;
    rc = kv_sens_search(c->eng, c->m, c->ids, c->S, uni, &so, &res->sens, c->err);
    if (rc) return kv_fail_context(c->err, "sensitivity planning");
    c->work_done += res->sens.token_evals / o->context; /* in chunk evaluations, for the ETA */
    res->have_sens = 1;
    res->sens_ppl = res->sens.ppl;
    if (res->best_chunks == c->S && res->sens.ppl < res->best_ppl) {
        res->winner_sens = 1;
        res->best_ppl = res->sens.ppl;
        res->best_t = res->best_r = res->best_p = NAN;
        for (int h = 0; h < c->nh; h++) {
            res->tokens[h] = res->sens.budget[h];
            res->blocks[h] = (res->sens.budget[h] + o->block_size - 1) / o->block_size;
            res->policy[h] = res->sens.policy[h];
            res->kv_types[h] = res->sens.type[h];
        }
    }
    return rc;
}

/* ---- Stage 8: the eviction block ---- */

typedef struct ladder_tasks {
    search_ctx *c;
    kv_engine *eng;               /* the engine at the p being measured */
    const int *budget[2];         /* plan candidate, uniform */
    const kv_policy *policy[2];   /* their per-head policies */
    const kv_cache_type *type[2]; /* their per-head KV types */
} ladder_tasks;

/* Task k: candidate k / S on search chunk k % S. */
static int ladder_task(void *user, long task, double *out, kv_error *err) {
    ladder_tasks *t = user;
    search_ctx *c = t->c;
    int C = c->o->context, cand = (int)(task / c->S), ch = (int)(task % c->S);
    const int *b[1] = {t->budget[cand]};
    const kv_policy *pp[1] = {t->policy[cand]};
    const kv_cache_type *ty[1] = {t->type[cand]};
    int rc = kv_engine_chunk_score_typed(t->eng, c->ids + (long)ch * C, C, 1, b, pp, ty, NULL, out,
                                         NULL, NULL, err);
    c->work_done++;
    if (!rc) progress(c, "eviction block");
    return rc;
}

static int engine_at(search_ctx *c, int p, kv_engine **out) {
    return kv_search_engine(c->m, c->o, c->o->kv_type, c->o->block_size, p, 1,
                            search_knapsack_types(c->o), out, c->err);
}

/* With evict_block_search: the plan candidate (the winner so far) and the uniform budgets
 * at p/2, p/4, ..., 1 on all search chunks; the lowest perplexity (ties: the larger p, then
 * the candidate) becomes the plan, and the engine moves to its p for the held-out stage. */
static int search_evict_block(search_ctx *c) {
    kv_search_result *res = c->res;
    const kv_search_opts *o = c->o;
    res->evict_block = o->evict_block;
    res->n_ladder = 0;
    int uni = c->base_arm[1];
    if (!o->evict_block_search || o->evict_block <= 1 || res->best_chunks != c->S || uni < 0)
        return KV_OK;
    kv_policy *upol = kv_malloc((size_t)c->nh * sizeof *upol, "uniform policies", c->err);
    int *cand_tok = kv_malloc((size_t)c->nh * sizeof *cand_tok, "plan candidate", c->err);
    kv_policy *cand_pol = kv_malloc((size_t)c->nh * sizeof *cand_pol, "plan candidate", c->err);
    double *nll = kv_malloc((size_t)2 * c->S * sizeof *nll, "ladder losses", c->err);
    if (!upol || !cand_tok || !cand_pol || !nll) {
        free(upol), free(cand_tok), free(cand_pol), free(nll);
        return KV_EINTERNAL;
    }
    for (int h = 0; h < c->nh; h++) upol[h] = o->policy;
    memcpy(cand_tok, res->tokens, (size_t)c->nh * sizeof *cand_tok);
    memcpy(cand_pol, res->policy, (size_t)c->nh * sizeof *cand_pol);
    const int *utok = c->arms[uni].tokens;
    int same = !memcmp(cand_tok, utok, (size_t)c->nh * sizeof *utok) &&
               !memcmp(cand_pol, upol, (size_t)c->nh * sizeof *upol);
    /* entry 0: the grid's p, measured already */
    res->ladder_p[0] = o->evict_block;
    res->ladder_plan_ppl[0] = res->best_ppl;
    res->ladder_uniform_ppl[0] = res->base_ppl[1];
    res->n_ladder = 1;
    double best = res->best_ppl;
    int best_p = o->evict_block, best_uni = 0;
    /* (at p, the winner is at least as good as uniform: search_baselines_heldout saw to it) */
    int rc = KV_OK;
    kv_engine *keep = NULL;
    for (int p = o->evict_block / 2; p >= 1 && !rc && res->n_ladder < KV_SEARCH_MAX_LADDER;
         p /= 2) {
        kv_engine *e = NULL;
        rc = engine_at(c, p, &e);
        ladder_tasks t = {c, e, {cand_tok, utok}, {cand_pol, upol}, {res->kv_types, NULL}};
        long nt = (same ? 1L : 2L) * c->S, before = c->work_done;
        double lo, hi;
        chunk_nll_range(c, &lo, &hi);
        if (!rc) rc = kv_tasks_run_range(o->tasks, nt, 1, lo, hi, ladder_task, &t, nll, c->err);
        c->work_done = before + nt;
        res->ladder_token_evals += nt * o->context;
        double pc = NAN, pu = NAN;
        if (!rc) {
            double s0 = 0, s1 = 0;
            for (int ch = 0; ch < c->S; ch++) {
                s0 += nll[ch];
                if (!same) s1 += nll[c->S + ch];
            }
            long n = (long)c->S * (o->context - 1);
            pc = kv_perplexity_from_nll(s0, n);
            pu = same ? pc : kv_perplexity_from_nll(s1, n);
        }
        int i = res->n_ladder++;
        res->ladder_p[i] = p;
        res->ladder_plan_ppl[i] = pc;
        res->ladder_uniform_ppl[i] = pu;
        int better = !rc && (pc < best || pu < best);
        if (better) {
            best_uni = !(pc <= pu);
            best = best_uni ? pu : pc;
            best_p = p;
            kv_engine_free(keep);
            keep = e;
        } else {
            kv_engine_free(e);
        }
    }
    if (!rc && best_p != o->evict_block) {
        kv_engine_free(c->eng);
        c->eng = keep;
        keep = NULL;
        res->evict_block = best_p;
        res->best_ppl = best;
        if (best_uni && !same) { /* uniform at this p beats the candidate */
            c->win_arm = uni;
            res->winner_sens = 0;
            res->winner_kind = KV_ALLOC_UNIFORM;
            res->best_t = res->best_r = res->best_p = NAN;
            memcpy(res->tokens, utok, (size_t)c->nh * sizeof *res->tokens);
            memcpy(res->blocks, c->arms[uni].blocks, (size_t)c->nh * sizeof *res->blocks);
            for (int h = 0; h < c->nh; h++) res->policy[h] = o->policy;
            for (int h = 0; h < c->nh; h++) res->kv_types[h] = o->kv_type;
        }
    }
    kv_engine_free(keep);
    free(upol), free(cand_tok), free(cand_pol), free(nll);
    return rc;
}

/* Stage 9: the plan, the grid's winner, the sensitivity solution and the baselines on the
 * held-out tokens; whether the plan is the uniform one. */
static int search_heldout(search_ctx *c) {
    kv_search_result *res = c->res;
    /* every held-out perplexity of this stage (plan, baselines, the other allocation) as one
     * task list */
    const int *bud[2 + KV_SEARCH_N_BASE];
    const kv_policy *pol[2 + KV_SEARCH_N_BASE];
    const kv_cache_type *typ[2 + KV_SEARCH_N_BASE] = {0};
    double *dst[2 + KV_SEARCH_N_BASE], ppl[2 + KV_SEARCH_N_BASE];
    int n = 0;
    for (int b = 0; b < 1 + KV_SEARCH_N_BASE; b++) {
        res->heldout_ppl[b] = NAN;
        int a = b == 0 ? c->win_arm : c->base_arm[b - 1];
        if (a < 0 || c->HC < 1) continue;
        int sens = b == 0 && res->winner_sens;
        bud[n] = sens ? res->tokens : c->arms[a].tokens;
        pol[n] = sens ? res->policy : NULL;
        typ[n] = sens ? res->kv_types : NULL;
        dst[n++] = &res->heldout_ppl[b];
    }
    if (c->HC > 0 && res->have_sens && res->winner_sens && c->win_arm >= 0) {
        bud[n] = c->arms[c->win_arm].tokens; /* the grid's winner */
        pol[n] = NULL;
        dst[n++] = &res->grid_heldout;
    } else if (c->HC > 0 && res->have_sens && !res->winner_sens) {
        bud[n] = res->sens.budget;
        pol[n] = res->sens.policy;
        typ[n] = res->sens.type;
        dst[n++] = &res->sens_heldout;
    }
    int rc = heldout_ppls(c, n, bud, pol, typ, ppl);
    for (int i = 0; i < n && !rc; i++) *dst[i] = ppl[i];
    if (!rc && c->HC > 0 && res->have_sens) {
        if (res->winner_sens)
            res->sens_heldout = res->heldout_ppl[0];
        else
            res->grid_heldout = res->heldout_ppl[0];
    } else if (!rc) {
        res->grid_heldout = res->heldout_ppl[0];
    }
    if (!rc && c->base_arm[1] >= 0) {
        const int *u = c->arms[c->base_arm[1]].tokens;
        res->identical_to_uniform = !memcmp(u, res->tokens, (size_t)c->nh * sizeof *u);
        for (int h = 0; h < c->nh; h++)
            if (res->policy[h] != c->o->policy || res->kv_types[h] != c->o->kv_type)
                res->identical_to_uniform = 0;
    }
    return rc;
}

/* With the knapsack over types: when the uniform cache of type t (budgets bud) beat the plan
 * on all search chunks, it becomes the plan (as the uniform and squeeze baselines do in stage
 * 6), with its held-out figure. */
static void search_adopt_type_uniform(search_ctx *c, kv_cache_type t, const int *bud) {
    kv_search_result *res = c->res;
    if (!search_knapsack_types(c->o) || t == c->o->kv_type || res->best_chunks != c->S ||
        !(res->type_ppl[t] < res->best_ppl) || !res->kv_types)
        return;
    res->winner_type_uniform = (int)t;
    res->winner_sens = 0;
    res->winner_kind = KV_ALLOC_UNIFORM;
    res->best_t = res->best_r = res->best_p = NAN;
    res->best_ppl = res->type_ppl[t];
    res->heldout_ppl[0] = res->type_heldout[t];
    res->identical_to_uniform = 0;
    for (int h = 0; h < c->nh; h++) {
        res->tokens[h] = bud[h];
        res->blocks[h] = (bud[h] + c->o->block_size - 1) / c->o->block_size;
        res->policy[h] = c->o->policy;
        res->kv_types[h] = t;
    }
}

/* Stage 10: uniform budgets stored in each type of kv_types_mask at the plan's bytes
 * (R of the full F16 cache), on all search chunks and the held-out chunks, each type on its own
 * engine (the pool's blocks are typed). Runs in every process (the chunks are few); NaN where
 * the uniform budget falls below the policy's floor. */
static int search_type_baselines(search_ctx *c) {
    kv_search_result *res = c->res;
    const kv_search_opts *o = c->o;
    int hd = c->m->cfg.head_dim, C = o->context, rc = KV_OK;
    for (int t = 0; t < KV_CACHE_TYPES; t++)
        res->type_ppl[t] = res->type_heldout[t] = res->type_tokens[t] = NAN;
    res->winner_type_uniform = -1;
    if (!o->kv_types_mask) return KV_OK;
    /* the plan's bytes: the token fraction in its own type, in bytes over the F16 cache */
    double Rb = o->ratio * (double)kv_type_token_bytes(o->kv_type, hd) /
                (double)kv_type_token_bytes(KV_TYPE_F16, hd);
    int *bud = kv_malloc((size_t)c->nh * sizeof *bud, "type baseline budgets", c->err);
    if (!bud) return KV_EINTERNAL;
    for (int t = 0; t < KV_CACHE_TYPES && !rc; t++) {
        if (!(o->kv_types_mask & (1 << t))) continue;
        double tr = kv_type_token_ratio(Rb, (kv_cache_type)t, hd);
        if (tr > 1.0) tr = 1.0;
        if ((rc = kv_uniform_budgets(c->nh, tr, C, o->block_size, bud, NULL, c->err))) break;
        long sum = 0;
        int below = 0, floor_tok = kv_policy_fixed_tokens(o->policy) +
                                   (res->evict_block > 0 ? res->evict_block : o->evict_block);
        for (int i = 0; i < c->nh; i++) {
            sum += bud[i];
            below |= bud[i] < C && bud[i] < floor_tok;
        }
        res->type_tokens[t] = (double)sum / c->nh;
        if (below) continue;
        /* at the plan's eviction block (the held-out baselines' p) */
        int p = res->evict_block > 0 ? res->evict_block : o->evict_block;
        kv_engine *e = NULL;
        if ((rc = kv_search_engine(c->m, o, (kv_cache_type)t, o->block_size, p, 1, 0, &e, c->err)))
            break;
        const int *b[1] = {bud};
        for (int part = 0; part < 2 && !rc; part++) {
            int n = part ? c->HC : c->S;
            long start = part ? (long)c->S * C : 0;
            double s = 0.0, nll = 0.0;
            for (int ch = 0; ch < n && !rc; ch++) {
                rc = kv_engine_chunk_nll(e, c->ids + start + (long)ch * C, C, 1, b, NULL, &nll,
                                         NULL, c->err);
                res->type_token_evals += C;
                c->work_done++;
                s += nll;
            }
            if (!rc && n > 0)
                *(part ? &res->type_heldout[t] : &res->type_ppl[t]) =
                    kv_perplexity_from_nll(s, (long)n * (C - 1));
        }
        kv_engine_free(e);
        if (!rc) search_adopt_type_uniform(c, (kv_cache_type)t, bud);
    }
    free(bud);
    return rc;
}

static void search_ctx_free(search_ctx *c) {
    kv_engine_free(c->eng);
    for (int a = 0; a < c->n_arms; a++) {
        free(c->arms[a].tokens);
        free(c->arms[a].blocks);
        free(c->arms[a].nll);
    }
    free(c->arms);
    free(c->cfg_arm);
    free(c->uniq);
}

int kv_search_count_budgets(const kv_model *m, const kv_profile_inputs *prof,
                            const kv_search_opts *o, kv_search_arms *out, kv_error *err) {
    search_ctx c;
    memset(&c, 0, sizeof c);
    kv_search_result res;
    memset(&res, 0, sizeof res);
    c.m = m, c.o = o, c.prof = prof, c.err = err, c.res = &res, c.S = 1, c.win_arm = -1;
    c.nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    for (int b = 0; b < KV_SEARCH_N_BASE; b++) c.base_arm[b] = -1;
    int rc = KV_OK;
    if (o->allocation != KV_ALLOC_UNIFORM && !prof)
        rc = kv_fail(err, KV_EINPUT, "allocation %s needs a profile", kv_alloc_name(o->allocation));
    if (!rc) rc = search_shape(&c, o, &res);
    if (!rc) rc = search_grid_budgets(&c);
    if (!rc) rc = search_baseline_budgets(&c);
    if (!rc) search_arms(&c, out);
    search_ctx_free(&c);
    kv_search_result_free(&res);
    return rc;
}

static const char *const stage_names[KV_SEARCH_STAGES] = {
    "inputs", "setup",   "grid",     "baselines", "curves",   "refine",
    "ladder", "heldout", "kv_types", "guard",     "retrieval"};

const char *kv_search_stage_name(int stage) {
    return stage >= 0 && stage < KV_SEARCH_STAGES ? stage_names[stage] : NULL;
}

/* Charge the wall and CPU seconds since *t to stage st of res and move *t to now. */
static void stage_mark(kv_search_result *res, int st, double t[2]) {
    double w = kv_now(), cpu = kv_cpu_now();
    res->stage_wall[st] += w - t[0];
    res->stage_cpu[st] += cpu - t[1];
    t[0] = w, t[1] = cpu;
}

/* The sensitivity stage's seconds since *t: round 0's curves (their own record) and the rest. */
static void stage_mark_sens(kv_search_result *res, double t[2]) {
    double w = kv_now(), cpu = kv_cpu_now();
    double cw = res->have_sens ? res->sens.curves.seconds : 0;
    double cc = res->have_sens ? res->sens.curves.cpu_seconds : 0;
    res->stage_wall[KV_SEARCH_ST_CURVES] += cw;
    res->stage_cpu[KV_SEARCH_ST_CURVES] += cc;
    res->stage_wall[KV_SEARCH_ST_REFINE] += w - t[0] - cw;
    res->stage_cpu[KV_SEARCH_ST_REFINE] += cpu - t[1] - cc;
    t[0] = w, t[1] = cpu;
}

int kv_search_run(const kv_model *m, const kv_profile_inputs *prof, const int *ids, long n_ids,
                  const kv_search_opts *o, kv_search_result *res, kv_error *err) {
    memset(res, 0, sizeof *res);
    search_ctx c;
    memset(&c, 0, sizeof c);
    double t[2] = {kv_now(), kv_cpu_now()};
    int rc = search_setup(&c, m, prof, ids, n_ids, o, res, err);
    if (!rc) rc = search_grid_budgets(&c);
    if (!rc) rc = search_baseline_budgets(&c);
    if (!rc) rc = search_engine(&c);
    rc = kv_tasks_agree(o->tasks, rc, err); /* under MPI: no rank runs tasks alone */
    stage_mark(res, KV_SEARCH_ST_SETUP, t);
    if (!rc) rc = search_grid_eval(&c);
    if (!rc) rc = search_winner(&c);
    stage_mark(res, KV_SEARCH_ST_GRID, t);
    if (!rc) rc = search_baselines_heldout(&c);
    stage_mark(res, KV_SEARCH_ST_BASELINES, t);
    if (!rc) rc = search_sensitivity(&c);
    stage_mark_sens(res, t);
    if (!rc) rc = search_evict_block(&c);
    stage_mark(res, KV_SEARCH_ST_LADDER, t);
    if (!rc) rc = search_heldout(&c);
    stage_mark(res, KV_SEARCH_ST_HELDOUT, t);
    if (!rc) rc = search_type_baselines(&c);
    stage_mark(res, KV_SEARCH_ST_TYPES, t);
    res->seconds = kv_now() - c.t0;
    res->total_token_evals = res->grid_token_evals_all + res->sens.token_evals +
                             res->ladder_token_evals + res->heldout_token_evals +
                             res->type_token_evals;
    if (!rc && o->progress && !o->progress->quiet) {
        kv_progress_print(o->progress, 1, "search: done, %ld chunk evals in %.1fs", c.work_done,
                          res->seconds);
        kv_progress_done(o->progress);
    }
    search_ctx_free(&c);
    if (rc) kv_search_result_free(res);
    return rc;
}
