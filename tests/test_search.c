/* Tests of planner/search.c and the `kvplan plan` / `kvplan search` commands on the real
 * stories260K model with a synthetic profile (the profiler writes the same datasets). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/alloc.h"
#include "kvplan/eval.h"
#include "kvplan/h5io.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "kvplan/search.h"
#include "testutil.h"

enum { L = 5, HKV = 4 };

/* Similarities shaped like a real profile: varied heads, layers 3-4 most similar. */
static const double HEAD_SIM[L * HKV] = {0.42, 0.61, 0.77, 0.55, 0.48, 0.83, 0.66,
                                         0.71, 0.58, 0.62, 0.91, 0.52, 0.73, 0.69,
                                         0.64, 0.87, 0.79, 0.81, 0.57, 0.93};
static const double LAYER_SIM[L] = {0.55, 0.71, 0.74, 0.93, 0.95};

static const char *model_path(void) {
    return tu_shared("models/stories260K/stories260K.bin");
}
static const char *text_path(void) {
    return tu_shared("text/tinystories_val_head.txt");
}

/* Write a profile for `m`, with its sha256 replaced by `sha` when not NULL. */
static int write_profile(const char *path, const kv_model *m, const char *sha) {
    kv_model fake = *m; /* shallow copy: only read by the provenance writer, never freed */
    if (sha) snprintf(fake.sha256, sizeof fake.sha256, "%s", sha);
    kv_error e;
    kv_h5 *f = NULL;
    if (kv_h5_create(path, &f, &e)) return 1;
    double imp[L * HKV];
    for (int i = 0; i < L * HKV; i++) imp[i] = 1.0 - HEAD_SIM[i];
    long d2[2] = {L, HKV}, d1 = L;
    int rc = kv_h5_write_provenance(f, "kvplan profile (test)", &fake, &e);
    if (!rc) rc = kv_h5_write_f64(f, "/heads/similarity", 2, d2, HEAD_SIM, NULL, &e);
    if (!rc) rc = kv_h5_write_f64(f, "/heads/importance", 2, d2, imp, NULL, &e);
    if (!rc) rc = kv_h5_write_f64(f, "/layers/similarity", 1, &d1, LAYER_SIM, NULL, &e);
    if (!rc) return kv_h5_commit(f, &e);
    kv_h5_abort(f);
    return rc;
}

static kv_model *model;

/* Suite fixture: stories260K, its profile (profile.h5) and the same profile claiming another
 * model (other.h5) under tu_tmpdir(). Non-zero, with the reason printed, when a step fails. */
static int search_init(void) {
    kv_error e = {0};
    int rc = kv_model_load(model_path(), &model, &e);
    if (!rc) rc = write_profile(tu_tmp("profile.h5"), model, NULL);
    if (!rc)
        rc = write_profile(tu_tmp("other.h5"), model,
                           "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    if (rc) fprintf(stderr, "search fixture: %s\n", e.msg[0] ? e.msg : "cannot write a profile");
    return rc ? 1 : 0;
}

static int search_cleanup(void) {
    kv_model_free(model);
    model = NULL;
    return 0;
}

static void test_profile_inputs(void) {
    kv_error e;
    kv_profile_inputs p;
    CU_ASSERT_EQUAL_FATAL(kv_profile_inputs_read(tu_tmp("profile.h5"), model, &p, &e), KV_OK);
    CU_ASSERT_EQUAL(p.n_layers, L);
    CU_ASSERT_EQUAL(p.n_kv_heads, HKV);
    CU_ASSERT_DOUBLE_EQUAL(p.head_sim[10], 0.91, 0);
    CU_ASSERT_DOUBLE_EQUAL(p.head_imp[10], 0.09, 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(p.layer_sim[4], 0.95, 0);
    kv_profile_inputs_free(&p);
    CU_ASSERT_EQUAL(kv_profile_inputs_read(tu_tmp("other.h5"), model, &p, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "another model"));
    /* right model, transposed head similarity: the shape error names the dataset */
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(tu_tmp("shape.h5"), &f, &e), KV_OK);
    long dt[2] = {HKV, L}, d1 = L;
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "test", model, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/heads/similarity", 2, dt, HEAD_SIM, NULL, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_f64(f, "/layers/similarity", 1, &d1, LAYER_SIM, NULL, &e), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_profile_inputs_read(tu_tmp("shape.h5"), model, &p, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "/heads/similarity has shape [4, 5], expected [5, 4]"));
}

static void test_grid_parse(void) {
    double *v = NULL;
    int n = 0;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_grid_parse("0.50:0.95:0.05", "--t-grid", 0, 1, &v, &n, &e), KV_OK);
    CU_ASSERT_EQUAL(n, 10);
    CU_ASSERT_DOUBLE_EQUAL(v[0], 0.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(v[9], 0.95, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(v[3], 0.65, 1e-12);
    free(v);
    CU_ASSERT_EQUAL_FATAL(kv_grid_parse("0.05:0.95:0.05", "--r-grid", 0, 1, &v, &n, &e), KV_OK);
    CU_ASSERT_EQUAL(n, 19);
    free(v);
    CU_ASSERT_EQUAL_FATAL(kv_grid_parse("0.3,0.7", "--p-grid", 0, 1, &v, &n, &e), KV_OK);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT_DOUBLE_EQUAL(v[1], 0.7, 0);
    free(v);
    CU_ASSERT_EQUAL(kv_grid_parse("0.5:1.5:0.5", "--t-grid", 0, 1, &v, &n, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "--t-grid"));
    CU_ASSERT_EQUAL(kv_grid_parse("a:b", "--t-grid", 0, 1, &v, &n, &e), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_grid_parse("0.9:0.1:0.1", "--t-grid", 0, 1, &v, &n, &e), KV_EINPUT);
}

static void test_plan_command(void) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args,
             "plan --profile %s --model %s --ratio 0.3 --allocation baklava --t 0.6 --r 0.5 "
             "-o %s",
             tu_tmp("profile.h5"), model_path(), tu_tmp("plan.h5"));
    int rc = tu_run_kvplan(args, &out, 1);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "%s\n", out);
    free(out);
    kv_plan b;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(tu_tmp("plan.h5"), &b, &e), KV_OK);
    CU_ASSERT_STRING_EQUAL(b.allocation, "baklava");
    CU_ASSERT_EQUAL(b.policy, KV_POLICY_SINK);
    CU_ASSERT_DOUBLE_EQUAL(b.t, 0.6, 0);
    CU_ASSERT_DOUBLE_EQUAL(b.r, 0.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(b.p, KV_SQUEEZE_DEFAULT_P, 0);
    CU_ASSERT_EQUAL(b.context, 512);
    CU_ASSERT_EQUAL(b.evict_block, 16);
    CU_ASSERT_EQUAL(kv_plan_check_model(&b, model, &e), KV_OK);
    /* same budgets as the library computes, and the total is R * L * H_kv * C in blocks */
    kv_alloc_params a;
    kv_alloc_params_default(&a);
    a.ratio = 0.3;
    a.context = 512;
    a.min_tokens = 4 + 16;
    a.t = 0.6;
    a.r = 0.5;
    double imp[L * HKV];
    for (int i = 0; i < L * HKV; i++) imp[i] = 1.0 - HEAD_SIM[i];
    int tok[L * HKV], blk[L * HKV];
    CU_ASSERT_EQUAL_FATAL(kv_plan_budgets(&a, L, HKV, LAYER_SIM, HEAD_SIM, imp, tok, blk, NULL, &e),
                          KV_OK);
    long sum = 0;
    for (int i = 0; i < L * HKV; i++) {
        CU_ASSERT_EQUAL(b.budget[i], tok[i]);
        CU_ASSERT_EQUAL(kv_plan_head_blocks(&b, i) * 16, b.budget[i]);
        sum += b.budget[i];
    }
    CU_ASSERT_EQUAL(sum, 3072); /* 0.3 * 5 * 4 * 512 */
    kv_plan_free(&b);

    /* wrong model's profile, ratio too small, baklava without t: clear input errors */
    snprintf(args, sizeof args,
             "plan --profile %s --model %s --ratio 0.3 --allocation squeeze -o %s",
             tu_tmp("other.h5"), model_path(), tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "another model"));
    free(out);
    snprintf(args, sizeof args,
             "plan --profile %s --model %s --ratio 0.02 --allocation squeeze -o %s",
             tu_tmp("profile.h5"), model_path(), tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "too small"));
    free(out);
    snprintf(args, sizeof args, "plan --profile %s --model %s --ratio 0.3 -o %s",
             tu_tmp("profile.h5"), model_path(), tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "--t T"));
    free(out);
    FILE *f = fopen(tu_tmp("bad.h5"), "rb");
    CU_ASSERT_PTR_NULL(f); /* nothing written on errors */
    if (f) fclose(f);
    /* uniform needs no profile */
    snprintf(args, sizeof args, "plan --model %s --ratio 0.5 --allocation uniform -o %s",
             model_path(), tu_tmp("uni.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, NULL, 1), 0);
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(tu_tmp("uni.h5"), &b, &e), KV_OK);
    for (int i = 0; i < L * HKV; i++) CU_ASSERT_EQUAL(b.budget[i], 256);
    CU_ASSERT(isnan(b.t));
    kv_plan_free(&b);
}

static double *read_f64(kv_h5 *f, const char *path, int *rank, long *dims) {
    double *d = NULL;
    kv_error e;
    if (kv_h5_read_f64(f, path, rank, dims, &d, &e)) return NULL;
    return d;
}

/* Exhaustive search on a small grid, then check the file against the engine. */
static void test_search_command(void) {
    char args[4096], *out = NULL;
    const char *common =
        "--allocation baklava --ratio 0.25 --context 256 --t-grid 0.5:0.9:0.2 --r-grid 0.2,0.6 "
        "--eval-tokens 2048 --heldout-tokens 1024 --evict-block 8"; /* p given: no p ladder */
    snprintf(args, sizeof args, "search --profile %s --model %s --text %s %s -o %s",
             tu_tmp("profile.h5"), model_path(), text_path(), common, tu_tmp("search.h5"));
    int rc = tu_run_kvplan(args, &out, 1);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "ETA")); /* progress on stderr */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "held-out"));
    free(out);
    kv_error e;
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("search.h5"), &f, &e), KV_OK);
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *ppl = read_f64(f, "/search/perplexity", &rank, dims);
    double *tv = read_f64(f, "/search/t_values", &rank, dims);
    double *rv = read_f64(f, "/search/r_values", &rank, dims);
    double *base = read_f64(f, "/search/baselines", &rank, dims);
    double *held = read_f64(f, "/search/heldout", &rank, dims);
    CU_ASSERT_FATAL(ppl && tv && rv && base && held);
    long plan_p = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "evict_block", &plan_p, &e), KV_OK);
    CU_ASSERT_EQUAL(plan_p, 8); /* --evict-block is kept: no ladder */
    CU_ASSERT(!kv_h5_exists(f, "/search/evict_block/p"));
    double best = HUGE_VAL, bt = 0, br = 0, bestp = 0;
    for (int i = 0; i < 3 * 2; i++) {
        CU_ASSERT(isfinite(ppl[i]) && ppl[i] > 1.0);
        if (ppl[i] < best) {
            best = ppl[i];
            bt = tv[i / 2];
            br = rv[i % 2];
        }
    }
    CU_ASSERT_DOUBLE_EQUAL(tv[1], 0.7, 1e-12);
    /* the plan is the grid's best unless a budgeted baseline (uniform, squeeze) beat it */
    char *winner = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_attr_str(f, "/search", "winner", &winner, &e), KV_OK);
    int grid_won = !strcmp(winner, "baklava");
    if (!grid_won) {
        int bi = !strcmp(winner, "uniform") ? 1 : 2;
        CU_ASSERT(!strcmp(winner, "uniform") || !strcmp(winner, "squeeze"));
        CU_ASSERT(base[bi] < best);
        best = base[bi];
    } else {
        CU_ASSERT(!(base[1] < best) && !(base[2] < best));
    }
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/search", "best_perplexity", &bestp, &e), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(bestp, best, 1e-12);
    double t = 0, r = 0;
    kv_h5_read_attr_f64(f, "/", "t", &t, &e);
    kv_h5_read_attr_f64(f, "/", "r", &r, &e);
    if (grid_won) {
        CU_ASSERT_DOUBLE_EQUAL(t, bt, 0);
        CU_ASSERT_DOUBLE_EQUAL(r, br, 0);
    } else {
        CU_ASSERT(isnan(t) && isnan(r));
    }
    free(winner);
    for (int i = 0; i < 3; i++) CU_ASSERT(isfinite(base[i]));
    for (int i = 0; i < 4; i++) CU_ASSERT(isfinite(held[i]));
    CU_ASSERT(base[0] < base[1]); /* the full cache beats uniform at R = 0.25 */
    CU_ASSERT(held[1] < held[2]);
    long te = 0, tex = 0;
    kv_h5_read_attr_i64(f, "/search", "token_evals", &te, &e);
    kv_h5_read_attr_i64(f, "/search", "token_evals_exhaustive", &tex, &e);
    CU_ASSERT_EQUAL(te, tex);
    CU_ASSERT(te > 0 && te % (8 * 256) == 0);
    free(ppl), free(tv), free(rv), free(base), free(held);
    kv_h5_close(f);

    /* The plan reproduces its search perplexity through `kvplan eval` (same chunks). */
    kv_plan b;
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(tu_tmp("search.h5"), &b, &e), KV_OK);
    CU_ASSERT_EQUAL(b.context, 256);
    long sum = 0;
    for (int i = 0; i < L * HKV; i++) sum += b.budget[i];
    CU_ASSERT_EQUAL(sum, 5 * 4 * 64); /* 0.25 * 256 per head on average */
    kv_plan_free(&b);
    snprintf(args, sizeof args,
             "eval %s --text %s --plan %s --context 256 --max-tokens 2048 --quiet --json",
             model_path(), text_path(), tu_tmp("search.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    const char *pp = out ? strstr(out, "\"perplexity\":") : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(pp);
    double ev = atof(pp + 13);
    CU_ASSERT_DOUBLE_EQUAL(ev, best, 1e-9 * best);
    free(out);

    /* successive halving on the same grid: same winner or within 0.5%, fewer evaluations;
     * --quiet silences the progress */
    snprintf(args, sizeof args,
             "search --profile %s --model %s --text %s %s --halving 2 "
             "--quiet -o %s",
             tu_tmp("profile.h5"), model_path(), text_path(), common, tu_tmp("halving.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 1), 0);
    CU_ASSERT_PTR_NULL(strstr(out, "ETA"));
    free(out);
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("halving.h5"), &f, &e), KV_OK);
    double hb = 0;
    char *method = NULL;
    long hte = 0;
    kv_h5_read_attr_i64(f, "/search", "token_evals", &hte, &e);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/search", "method", &method, &e), KV_OK);
    CU_ASSERT_STRING_EQUAL(method, "successive_halving");
    free(method);
    kv_h5_close(f);
    CU_ASSERT(hte > 0 && hte < te);
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(tu_tmp("halving.h5"), &b, &e), KV_OK);
    if (!grid_won) { /* the same baseline wins: the exhaustive run's plan */
        CU_ASSERT(isnan(b.t) && isnan(b.r));
        kv_plan_free(&b);
    } else {
        /* the halving winner's perplexity on all search chunks, from the exhaustive grid */
        int it = -1, ir = -1;
        for (int i = 0; i < 3; i++)
            if (fabs(b.t - (0.5 + 0.2 * i)) < 1e-9) it = i;
        ir = fabs(b.r - 0.2) < 1e-9 ? 0 : (fabs(b.r - 0.6) < 1e-9 ? 1 : -1);
        CU_ASSERT_FATAL(it >= 0 && ir >= 0);
        kv_plan_free(&b);
        CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("search.h5"), &f, &e), KV_OK);
        ppl = read_f64(f, "/search/perplexity", &rank, dims);
        kv_h5_close(f);
        CU_ASSERT_FATAL(ppl != NULL);
        hb = ppl[it * 2 + ir];
        CU_ASSERT(hb <= best * 1.005);
        free(ppl);
    }

    /* text too short for search + held-out: clear error */
    snprintf(args, sizeof args,
             "search --profile %s --model %s --text %s --ratio 0.25 "
             "--eval-tokens 100000000 --quiet -o %s",
             tu_tmp("profile.h5"), model_path(), text_path(), tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "held-out"));
    free(out);
}

/* Library level: a p x t x r grid, exhaustive vs halving, squeeze and uniform searches. */
static void test_search_library(void) {
    kv_error e;
    kv_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_model_load(model_path(), &m, &e), KV_OK);
    kv_profile_inputs prof;
    CU_ASSERT_EQUAL_FATAL(kv_profile_inputs_read(tu_tmp("profile.h5"), m, &prof, &e), KV_OK);
    /* a stream of in-vocabulary ids (the engine only needs valid tokens) */
    enum { N = 2400 };
    int *ids = malloc(N * sizeof *ids);
    CU_ASSERT_FATAL(ids != NULL);
    unsigned s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = 1 + (int)((s >> 16) % 300);
    }
    static const double tv[] = {0.6, 0.7, 0.8}, rv[] = {0.2, 0.5, 0.8}, pv[] = {0.5, 1.0};
    kv_search_opts o;
    kv_search_opts_default(&o, m);
    o.ratio = 0.5;
    o.context = 128;
    o.t_values = tv, o.n_t = 3, o.r_values = rv, o.n_r = 3, o.p_values = pv, o.n_p = 2;
    o.eval_tokens = 2048; /* 16 chunks */
    o.heldout_tokens = 256;
    kv_search_result ex, h;
    if (kv_search_run(m, &prof, ids, N, &o, &ex, &e)) fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(ex.search_chunks, 16);
    CU_ASSERT_EQUAL(ex.heldout_chunks, 2);
    CU_ASSERT(ex.distinct_budgets >= 2 && ex.distinct_budgets <= 18);
    double best = HUGE_VAL;
    for (int g = 0; g < 18; g++) {
        CU_ASSERT(isfinite(ex.perplexity[g]));
        CU_ASSERT_EQUAL(ex.chunks[g], 16);
        if (ex.perplexity[g] < best) best = ex.perplexity[g];
    }
    CU_ASSERT_DOUBLE_EQUAL(ex.best_ppl, best, 0);
    CU_ASSERT_DOUBLE_EQUAL(ex.perplexity[ex.best], best, 0);
    CU_ASSERT_EQUAL(ex.token_evals, (long)ex.distinct_budgets * 16 * 128);
    /* the winner's parameters are the grid point's: index = (p * 3 + t) * 3 + r */
    CU_ASSERT_DOUBLE_EQUAL(ex.best_r, rv[ex.best % 3], 0);
    CU_ASSERT_DOUBLE_EQUAL(ex.best_t, tv[(ex.best / 3) % 3], 0);
    CU_ASSERT_DOUBLE_EQUAL(ex.best_p, pv[ex.best / 9], 0);
    o.halving_eta = 3;
    CU_ASSERT_EQUAL_FATAL(kv_search_run(m, &prof, ids, N, &o, &h, &e), KV_OK);
    CU_ASSERT(h.token_evals < ex.token_evals);
    CU_ASSERT(ex.perplexity[h.best] <= 1.005 * ex.best_ppl);
    CU_ASSERT(h.halving_rounds >= 2);
    int not_eval = 0;
    for (int g = 0; g < 18; g++) not_eval += h.chunks[g] == 0;
    CU_ASSERT_EQUAL(not_eval, 0); /* round 0 evaluates every point on one chunk */
    for (int b = 0; b < 3; b++) CU_ASSERT_DOUBLE_EQUAL(h.base_ppl[b], ex.base_ppl[b], 0);
    /* write: rank-3 grid with p */
    kv_alloc_params ap;
    kv_alloc_params_default(&ap);
    ap.ratio = 0.5, ap.context = 128, ap.t = h.best_t, ap.r = h.best_r, ap.p = h.best_p;
    CU_ASSERT_EQUAL(kv_plan_file_write(tu_tmp("lib.h5"), "test", NULL, m, &ap, KV_POLICY_SINK, 16,
                                       h.tokens, &o, &h, &e),
                    KV_OK);
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("lib.h5"), &f, &e), KV_OK);
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *d = read_f64(f, "/search/perplexity", &rank, dims);
    CU_ASSERT_EQUAL(rank, 3);
    CU_ASSERT(dims[0] == 2 && dims[1] == 3 && dims[2] == 3);
    free(d);
    kv_h5_close(f);
    kv_search_result_free(&ex);
    kv_search_result_free(&h);
    /* squeeze: grid over p only */
    o.allocation = KV_ALLOC_SQUEEZE;
    o.halving_eta = 0;
    o.heldout_tokens = 0;
    CU_ASSERT_EQUAL_FATAL(kv_search_run(m, &prof, ids, N, &o, &ex, &e), KV_OK);
    CU_ASSERT(ex.n_p == 2 && ex.n_t == 1 && ex.n_r == 1);
    CU_ASSERT(isnan(ex.best_t) && isnan(ex.best_r));
    CU_ASSERT(isnan(ex.heldout_ppl[0]));
    /* p = 1 keeps every layer's share: the uniform baseline */
    CU_ASSERT_DOUBLE_EQUAL(ex.perplexity[1], ex.base_ppl[1], 0);
    kv_search_result_free(&ex);
    /* errors: too little text, ratio too small for the sinks, bad eta */
    o.heldout_tokens = 100000;
    CU_ASSERT_EQUAL(kv_search_run(m, &prof, ids, 2100, &o, &ex, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "held-out"));
    o.heldout_tokens = 0;
    o.ratio = 0.1; /* 12.8 tokens per head < 4 sinks + 16 */
    CU_ASSERT_EQUAL(kv_search_run(m, &prof, ids, N, &o, &ex, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "too small"));
    o.ratio = 0.5;
    o.halving_eta = 1;
    CU_ASSERT_EQUAL(kv_search_run(m, &prof, ids, N, &o, &ex, &e), KV_EINPUT);
    free(ids);
    kv_profile_inputs_free(&prof);
    kv_model_free(m);
}

/* --kv-types (issue 22): uniform budgets stored in f16, q8 and q4 at the plan's bytes, on the
 * search and held-out tokens. The f16 row is the uniform baseline itself (same budgets, same p,
 * same chunks); q8 keeps 32 / 20 of its tokens per head and q4 2x (d_h 8). */
static void test_search_kv_types(void) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args,
             "search --profile %s --model %s --text %s --allocation uniform --ratio 0.25 "
             "--context 256 --eval-tokens 2048 --heldout-tokens 1024 --evict-block 8 "
             "--kv-types f16,q8,q4 --quiet -o %s",
             tu_tmp("profile.h5"), model_path(), text_path(), tu_tmp("types.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 1), 0);
    CU_ASSERT_TRUE(out && strstr(out, "KV types"));
    free(out);
    kv_error e;
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("types.h5"), &f, &e), KV_OK);
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *u = read_f64(f, "/search/kv_types/uniform", &rank, dims);
    double *h = read_f64(f, "/search/kv_types/uniform_heldout", &rank, dims);
    double *tk = read_f64(f, "/search/kv_types/tokens_per_head", &rank, dims);
    double *base = read_f64(f, "/search/baselines", &rank, dims);
    double *held = read_f64(f, "/search/heldout", &rank, dims);
    CU_ASSERT_FATAL(u && h && tk && base && held);
    printf("\n    uniform at R 1/4 of F16 bytes (search / held-out, tokens per head): f16 %.4f / "
           "%.4f (%.0f), q8 %.4f / %.4f (%.0f), q4 %.4f / %.4f (%.0f)\n",
           u[0], h[0], tk[0], u[1], h[1], tk[1], u[2], h[2], tk[2]);
    CU_ASSERT_DOUBLE_EQUAL(u[0], base[1], 1e-12 * base[1]); /* f16 = the uniform baseline */
    CU_ASSERT_DOUBLE_EQUAL(h[0], held[2], 1e-12 * held[2]);
    CU_ASSERT_DOUBLE_EQUAL(tk[0], 64, 0);
    /* q8: 0.4 of 256 tokens = 128 blocks of 16 over 20 heads, 6 or 7 each: mean 102.4 */
    CU_ASSERT_DOUBLE_EQUAL(tk[1], 102.4, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(tk[2], 128, 0);
    for (int i = 0; i < 3; i++) CU_ASSERT(isfinite(u[i]) && isfinite(h[i]) && u[i] > 1.0);
    free(u), free(h), free(tk), free(base), free(held);
    kv_h5_close(f);
}

/* The planner's rules the CLI calls: the byte ratio <-> token fraction per KV type (the
 * stories260K head size), and the default block size b_s = p. */
static void test_plan_rules(void) {
    kv_error e;
    const int hd = model->cfg.head_dim;
    double tr = 0;
    CU_ASSERT_EQUAL_FATAL(kv_search_ratio_tokens(0.25, KV_TYPE_Q8, hd, &tr, &e), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(tr, kv_type_token_ratio(0.25, KV_TYPE_Q8, hd), 0);
    CU_ASSERT(tr > 0.25); /* q8 holds more tokens than f16 in the same bytes */
    CU_ASSERT_DOUBLE_EQUAL(kv_search_ratio_bytes(tr, KV_TYPE_Q8, hd), 0.25, 1e-12);
    CU_ASSERT_EQUAL(kv_search_ratio_tokens(1.5, KV_TYPE_F16, hd, &tr, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "more than the full cache in f16"));
    /* f32 at R = 2 is the whole cache: capped at 1 */
    CU_ASSERT_EQUAL(kv_search_ratio_tokens(2.0, KV_TYPE_F32, hd, &tr, &e), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(tr, 1.0, 0);
    int bs = 0, p = 0, floor = 0;
    const int C = model->cfg.seq_len, fixed = kv_policy_fixed_tokens(KV_POLICY_SINK);
    /* R * C / 16 tokens per head: the largest power of two with 8 blocks a head and the floor
     * at most half of it */
    CU_ASSERT_EQUAL_FATAL(
        kv_search_default_blocks(1.0 / 16, C, KV_POLICY_SINK, 0, 0, &bs, &p, &floor, &e), KV_OK);
    CU_ASSERT(bs == p && bs >= 1 && bs <= 16);
    CU_ASSERT(C / 16.0 / bs >= 8.0 && fixed + p <= C / 16.0 / 2);
    CU_ASSERT(bs == 16 || !(C / 16.0 / (2 * bs) >= 8.0 && fixed + 2 * bs <= C / 16.0 / 2));
    CU_ASSERT_EQUAL(floor, fixed + p);
    /* a given b_s is kept, p still chosen */
    CU_ASSERT_EQUAL(kv_search_default_blocks(0.5, C, KV_POLICY_SINK, 3, 0, &bs, &p, &floor, &e),
                    KV_OK);
    CU_ASSERT_EQUAL(bs, 3);
    CU_ASSERT_EQUAL(p, 16);
    /* under 8 tokens a head: no block size leaves room */
    CU_ASSERT_EQUAL(kv_search_default_blocks(4.0 / C, C, KV_POLICY_SINK, 0, 0, &bs, &p, &floor, &e),
                    KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "no block size leaves room"));
}

int main(int argc, char **argv) {
    /* the tiny model runs fastest single-threaded */
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    static const tu_test tests[] = {
        {"profile_inputs", test_profile_inputs}, {"grid_parse", test_grid_parse},
        {"plan_command", test_plan_command},     {"search_command", test_search_command},
        {"search_library", test_search_library}, {"search_kv_types", test_search_kv_types},
        {"plan_rules", test_plan_rules},
    };
    static const tu_suite suite = {"search", search_init, search_cleanup, tests,
                                   sizeof tests / sizeof tests[0]};
    return tu_main_suites(argc, argv, &suite, 1);
}
