/* kvplan search --estimate (include/kvplan/estimate.h): the estimate's per-stage counts against
 * the token evaluations a real search of stories260K on the TinyStories text records, --shape
 * without a model, and the errors of bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/estimate.h"
#include "kvplan/h5io.h"
#include "kvplan/robust.h"
#include "kvplan/search.h"
#include "planner/sensitivity.h"
#include "testutil.h"

static const char *model_path(void) {
    return tu_shared("models/stories260K/stories260K.bin");
}
static const char *tok_path(void) {
    return tu_shared("models/stories260K/tok512.bin");
}
static const char *text_path(void) {
    return tu_shared("text/tinystories_val_head.txt");
}

/* Suite fixture: a real profile of stories260K on the TinyStories text. */
static int estimate_init(void) {
    char args[2048];
    snprintf(args, sizeof args, "profile %s --tokenizer %s --text %s --no-hw --quiet -o %s",
             model_path(), tok_path(), text_path(), tu_tmp("profile.h5"));
    char *out = NULL;
    int rc = tu_run_kvplan(args, &out, 1);
    if (rc) fprintf(stderr, "kvplan profile failed (%d): %s\n", rc, out ? out : "");
    free(out);
    return rc;
}

/* The search's options for the library test: C 128, 8 search + 2 held-out chunks, R 1/4 of
 * the tokens (b_s = p = 4 by the default rule), a 3 x 3 grid, sensitivity over f16 and q8 with
 * 2 rounds on 1 calibration chunk, the eviction-block ladder on. */
static void small_opts(const kv_model *m, kv_search_opts *o, const double *tv, const double *rv,
                       const double *pv) {
    kv_search_opts_default(o, m);
    o->allocation = KV_ALLOC_BAKLAVA;
    o->ratio = 0.25;
    o->context = 128;
    int bs = 0, p = 0, fl = 0;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(
        kv_search_default_blocks(o->ratio, o->context, KV_POLICY_SINK, 0, 0, &bs, &p, &fl, &e),
        KV_OK);
    o->block_size = bs, o->evict_block = p, o->evict_block_search = 1;
    o->t_values = tv, o->n_t = 3, o->r_values = rv, o->n_r = 3, o->p_values = pv, o->n_p = 1;
    o->eval_tokens = 8 * 128;
    o->heldout_tokens = 2 * 128;
    o->kv_types_mask = (1 << KV_TYPE_F16) | (1 << KV_TYPE_Q8);
    o->sensitivity = 1;
    o->sens.calib_chunks = 1;
    o->sens.max_rounds = 2;
}

/* lo <= v <= hi, printed when not */
static int within(const char *what, long v, long lo, long hi) {
    if (v >= lo && v <= hi) return 1;
    fprintf(stderr, "%s: %ld outside [%ld, %ld]\n", what, v, lo, hi);
    return 0;
}

/* The estimate's rows against what a real search (kv_search_plan: search, guard) records:
 * exact where the count does not depend on the data, inside [least, most] where it does. */
static void check_rows(const kv_search_estimate *est, const kv_search_result *res,
                       const kv_robust_result *rob, int full) {
    const kv_est_row *g = &est->stage[KV_EST_GRID], *b = &est->stage[KV_EST_BASELINES];
    const kv_est_row *c = &est->stage[KV_EST_CURVES], *r = &est->stage[KV_EST_REFINE],
                     *v = &est->stage[KV_EST_VERIFY], *h = &est->stage[KV_EST_HELDOUT],
                     *t = &est->stage[KV_EST_TYPES], *l = &est->stage[KV_EST_LADDER],
                     *gu = &est->stage[KV_EST_GUARD];
    CU_ASSERT_EQUAL(est->distinct, res->distinct_budgets);
    CU_ASSERT_EQUAL(est->points, 9);
    CU_ASSERT(g->exact);
    CU_ASSERT_EQUAL(g->token_evals, res->token_evals);
    CU_ASSERT(within("grid + baselines", res->grid_token_evals_all, g->token_evals + b->token_evals,
                     g->token_evals + b->token_evals_max));
    /* round 0's curves: full, exact; sparse, the second pass depends on the curves */
    CU_ASSERT_EQUAL(c->exact, full);
    CU_ASSERT(c->token_evals > 0);
    CU_ASSERT(within("curves", res->sens.curves.token_evals, c->token_evals, c->token_evals_max));
    if (full) CU_ASSERT_EQUAL(c->token_evals, res->sens.curves.token_evals);
    CU_ASSERT(within("sensitivity", res->sens.token_evals,
                     c->token_evals + r->token_evals + v->token_evals,
                     c->token_evals_max + r->token_evals_max + v->token_evals_max));
    CU_ASSERT(within("ladder", res->ladder_token_evals, l->token_evals, l->token_evals_max));
    CU_ASSERT(h->exact);
    CU_ASSERT_EQUAL(h->token_evals, res->heldout_token_evals);
    CU_ASSERT(within("kv types", res->type_token_evals, t->token_evals, t->token_evals_max));
    CU_ASSERT(t->token_evals > 0);
    CU_ASSERT(within("guard", rob->token_evals, gu->token_evals, gu->token_evals_max));
    CU_ASSERT(within("total", res->total_token_evals + rob->token_evals, est->token_evals,
                     est->token_evals_max));
}

/* The search's record per estimate stage: token evaluations and CPU seconds (refine holds the
 * refinement rounds and the verification: the search times them as one stage; verify gets
 * one solution per round on the S search chunks, the rest is refine). */
static void measured_rows(const kv_search_result *res, const kv_robust_result *rob, int S, int C,
                          long tok[KV_EST_STAGES], double cpu[KV_EST_STAGES]) {
    memset(tok, 0, KV_EST_STAGES * sizeof *tok);
    memset(cpu, 0, KV_EST_STAGES * sizeof *cpu);
    long sens_rest = res->sens.token_evals - res->sens.curves.token_evals;
    long verify = (long)res->sens.rounds * S * C;
    if (verify > sens_rest) verify = sens_rest;
    tok[KV_EST_GRID] = res->token_evals;
    tok[KV_EST_BASELINES] = res->grid_token_evals_all - res->token_evals;
    tok[KV_EST_CURVES] = res->sens.curves.token_evals;
    tok[KV_EST_REFINE] = sens_rest - verify;
    tok[KV_EST_VERIFY] = verify;
    tok[KV_EST_LADDER] = res->ladder_token_evals;
    tok[KV_EST_HELDOUT] = res->heldout_token_evals;
    tok[KV_EST_TYPES] = res->type_token_evals;
    tok[KV_EST_GUARD] = rob->token_evals;
    static const int st[KV_EST_STAGES] = {KV_SEARCH_ST_GRID,
                                          KV_SEARCH_ST_BASELINES,
                                          KV_SEARCH_ST_CURVES,
                                          KV_SEARCH_ST_REFINE,
                                          -1,
                                          KV_SEARCH_ST_LADDER,
                                          KV_SEARCH_ST_HELDOUT,
                                          KV_SEARCH_ST_TYPES,
                                          KV_SEARCH_ST_GUARD,
                                          KV_SEARCH_ST_RETRIEVAL};
    for (int s = 0; s < KV_EST_STAGES; s++) cpu[s] = st[s] >= 0 ? res->stage_cpu[st[s]] : 0;
}

/* The time model against a real search, in CPU seconds (the machine's load changes the wall
 * time, far less the work): the calibration's CPU cost per token of each stage (after the
 * ladder: at the eviction block it chose) times the token evaluations the search recorded for
 * it, against the CPU seconds the search recorded for the stage, within 40 % in total and a
 * factor of 2.5 for each stage of at least 0.1 s; the stages' records cover the process's CPU
 * over the search (cpu_total) within 10 %; and the arithmetic of
 * kv_search_estimate_time_calibrated. */
static void check_time_model(const kv_model *m, const kv_search_opts *o, const int *ids,
                             const kv_search_result *res, const kv_robust_result *rob,
                             double cpu_total, kv_search_estimate *est) {
    double rec = 0;
    for (int s = 0; s < KV_SEARCH_STAGES; s++) rec += res->stage_cpu[s];
    CU_ASSERT(fabs(rec - cpu_total) <= 0.1 * cpu_total + 0.02);
    kv_est_rates r;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_estimate_calibrate(m, o, ids, 8, &r, &e), KV_OK);
    CU_ASSERT(r.cpu_share > 0);
    kv_search_estimate_time_calibrated(est, &r, "test");
    long tok[KV_EST_STAGES];
    double cpu[KV_EST_STAGES], model = 0, meas = 0;
    measured_rows(res, rob, 8, o->context, tok, cpu);
    for (int s = 0; s < KV_EST_STAGES; s++) {
        const kv_est_row *w = &est->stage[s];
        CU_ASSERT(r.cpu_per_token[s] > 0);
        CU_ASSERT_DOUBLE_EQUAL(w->cpu_seconds, w->token_evals * r.cpu_per_token[s], 1e-9);
        CU_ASSERT(r.cpu_per_token_max[s] >= r.cpu_per_token[s]);
        CU_ASSERT_DOUBLE_EQUAL(w->cpu_seconds_max, w->token_evals_max * r.cpu_per_token_max[s],
                               1e-9);
        CU_ASSERT_DOUBLE_EQUAL(w->seconds_max, w->cpu_seconds_max / r.cpu_share, 1e-9);
        CU_ASSERT_DOUBLE_EQUAL(
            w->cpu_seconds_proj,
            w->token_evals_proj * (r.cpu_per_token[s] + r.cpu_per_token_max[s]) / 2, 1e-9);
        /* the stages after the ladder at the p it chose: the search's (least) or lower (most) */
        int after = s == KV_EST_HELDOUT || s == KV_EST_TYPES || s == KV_EST_GUARD;
        double cost = after && res->evict_block < o->evict_block ? r.cpu_per_token_max[s]
                                                                 : r.cpu_per_token[s];
        double mod = tok[s] * cost;
        if (s == KV_EST_REFINE) cpu[s] -= tok[KV_EST_VERIFY] * r.cpu_per_token[KV_EST_VERIFY];
        if (s == KV_EST_VERIFY) cpu[s] = mod; /* timed with refine */
        fprintf(stderr, "time model: %-9s %8ld tokens, modelled %.3f CPU s, recorded %.3f\n",
                kv_est_stage_name(s), tok[s], mod, cpu[s]);
        if (cpu[s] >= 0.1) CU_ASSERT(mod <= 2.5 * cpu[s] && cpu[s] <= 2.5 * mod);
        model += mod, meas += cpu[s];
    }
    fprintf(stderr, "time model: total modelled %.3f CPU s, recorded %.3f\n", model, meas);
    CU_ASSERT(fabs(model - meas) <= 0.4 * meas);
}

/* Three searches of stories260K (C 128, 8 + 2 chunks): the default (sparse curves, the grid by
 * successive halving, eta 3), the old path (--sens-full: full curves, the exhaustive grid) and
 * the exhaustive grid alone (baselines exact). */
static void test_counts_match_search(void) {
    kv_model *m = tu_load_model(model_path());
    kv_error e;
    kv_profile_inputs prof;
    CU_ASSERT_EQUAL_FATAL(kv_profile_inputs_read(tu_tmp("profile.h5"), m, &prof, &e), KV_OK);
    int n = 0;
    int *ids = tu_text_tokens(m, tok_path(), 0, &n);
    CU_ASSERT_FATAL(n >= 10 * 128);
    static const double tv[] = {0.6, 0.7, 0.8}, rv[] = {0.2, 0.5, 0.8}, pv[] = {0.5};
    kv_search_opts o;
    small_opts(m, &o, tv, rv, pv);
    for (int run = 0; run < 3; run++) {
        o.halving_eta = run == 0 ? 3 : 0;
        o.sens.full_curves = run == 1;
        o.sensitivity = run < 2;
        kv_search_estimate est;
        CU_ASSERT_EQUAL_FATAL(
            kv_search_estimate_count(m, &prof, &o, 1, 8, 2, NULL, NULL, 0, &est, &e), KV_OK);
        int ct[10] = {0};
        const char *names[1] = {"tinystories"};
        long tokens[1] = {n};
        kv_robust_layout lay = {1, names, tokens, 8, 2, ct};
        kv_search_result res;
        kv_robust_result rob;
        kv_retrieval_result rr; /* filled only with probes */
        memset(&res, 0, sizeof res);
        memset(&rob, 0, sizeof rob);
        memset(&rr, 0, sizeof rr);
        kv_alloc_params ap;
        kv_alloc_params_default(&ap);
        double cpu0 = kv_cpu_now();
        int rc = kv_search_plan(m, &prof, ids, 10 * 128, &lay, KV_ROBUST_MEAN, &o, NULL, NULL, &res,
                                &rob, &rr, &ap, &e);
        cpu0 = kv_cpu_now() - cpu0;
        if (rc) fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
        if (run == 0) check_time_model(m, &o, ids, &res, &rob, cpu0, &est);
        if (run < 2) {
            check_rows(&est, &res, &rob, run == 1);
        } else {
            const kv_est_row *g = &est.stage[KV_EST_GRID], *b = &est.stage[KV_EST_BASELINES];
            CU_ASSERT_EQUAL(g->token_evals, (long)res.distinct_budgets * 8 * 128);
            CU_ASSERT_EQUAL(g->token_evals, res.token_evals);
            CU_ASSERT(b->exact);
            CU_ASSERT_EQUAL(g->token_evals + b->token_evals, res.grid_token_evals_all);
            CU_ASSERT_EQUAL(est.stage[KV_EST_CURVES].token_evals_max, 0);
        }
        if (run == 0) CU_ASSERT(res.token_evals < (long)res.distinct_budgets * 8 * 128);
        CU_ASSERT_EQUAL(est.token_evals_max >= est.token_evals, 1);
        kv_search_result_free(&res);
        kv_robust_result_free(&rob);
        kv_retrieval_result_free(&rr);
    }
    free(ids);
    kv_profile_inputs_free(&prof);
    kv_model_free(m);
}

/* --estimate on the command line: the grid's count equals the token_evals a real `kvplan
 * search` with the same options writes into its plan. */
static void test_cli_matches_plan(void) {
    char common[2048], args[2300];
    snprintf(common, sizeof common,
             "search --profile %s --model %s --tokenizer %s --text %s --ratio 0.25 --context 128 "
             "--eval-tokens 1024 --heldout-tokens 256 --t-grid 0.6,0.7,0.8 --r-grid 0.2,0.5 "
             "--allocation baklava --kv-types none --quiet",
             tu_tmp("profile.h5"), model_path(), tok_path(), text_path());
    snprintf(args, sizeof args, "%s --estimate --json", common);
    char *out = NULL;
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    const char *grid = out ? strstr(out, "\"grid\"") : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(grid);
    double est_grid = tu_json_number(grid, "token_evals");
    const char *base = strstr(out, "\"baselines\"");
    CU_ASSERT_PTR_NOT_NULL_FATAL(base);
    double est_base = tu_json_number(base, "token_evals");
    CU_ASSERT(tu_json_number(out, "tokens_per_s") > 0);
    CU_ASSERT(tu_json_number(out, "seconds") > 0);
    double proj_cpu = tu_json_number(out, "cpu_seconds_projected");
    CU_ASSERT(proj_cpu > 0);
    free(out);
    snprintf(args, sizeof args, "%s -o %s", common, tu_tmp("plan.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    kv_h5 *f = NULL;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("plan.h5"), &f, &e), KV_OK);
    long grid_evals = -1, all = -1;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "token_evals", &grid_evals, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "grid_token_evals_all", &all, &e), KV_OK);
    /* the stages' record: every stage that ran, wall and CPU; their CPU against the projection
     * (no sensitivity, no per-type caches: grid, baselines, ladder, held-out, guard) */
    double rec = 0;
    for (int s = 0; s < KV_SEARCH_STAGES; s++) {
        char w[48], c[48];
        snprintf(w, sizeof w, "wall_%s", kv_search_stage_name(s));
        snprintf(c, sizeof c, "cpu_%s", kv_search_stage_name(s));
        int ran = s == KV_SEARCH_ST_GRID || s == KV_SEARCH_ST_HELDOUT || s == KV_SEARCH_ST_GUARD;
        if (ran) CU_ASSERT(kv_h5_attr_exists(f, "/search/timing", w));
        if (!kv_h5_attr_exists(f, "/search/timing", c)) continue;
        double v = -1;
        CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/search/timing", c, &v, &e), KV_OK);
        CU_ASSERT(v >= 0);
        rec += v > 0 ? v : 0;
    }
    fprintf(stderr, "cli: projected %.3f CPU s, the search recorded %.3f\n", proj_cpu, rec);
    CU_ASSERT(rec > 0.4 * proj_cpu && rec < 2.5 * proj_cpu);
    kv_h5_close(f);
    CU_ASSERT_DOUBLE_EQUAL(est_grid, (double)grid_evals, 0);
    CU_ASSERT_DOUBLE_EQUAL(est_grid + est_base, (double)all, 0);
}

/* The curves' token_evals and the throughput of `search --estimate --shape ...` (extra
 * options appended). */
static void shape_run(const char *extra, double *curves, double *curves_max, double *tps) {
    char args[1024];
    snprintf(args, sizeof args,
             "search --estimate --shape 32,32,8,128,14336,128256 --context 8192 --ratio 0.125 "
             "--eval-tokens 32768 --heldout-tokens 8192 --device-preset h100 --json %s",
             extra);
    char *out = NULL;
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    const char *cv = out ? strstr(out, "\"curves\"") : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(cv);
    *curves = tu_json_number(cv, "token_evals");
    *curves_max = tu_json_number(cv, "token_evals_max");
    *tps = tu_json_number(out, "tokens_per_s");
    free(out);
}

/* --shape without a model: the curves of a Llama-3-8B-shaped model (256 KV heads, three KV
 * types, the default levels), full (--sens-full) and sparse (the default), and the H100
 * roofline's throughput, by hand. */
static void test_shape(void) {
    double full = 0, full_max = 0, sparse = 0, sparse_max = 0, tps = 0;
    shape_run("--sens-full", &full, &full_max, &tps);
    shape_run("", &sparse, &sparse_max, &tps);
    /* the levels: b_s = p = 16 (R C = 1024 tokens), floor 4 + 16 tokens = 2 blocks to 512 */
    kv_sens_opts so;
    kv_sens_opts_default(&so, NULL);
    so.ratio = 0.125, so.context = 8192, so.block_size = 16, so.evict_block = 16;
    int *lv = NULL, K = 0, bi = -1;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_sens_default_levels(&so, &lv, &K, &e), KV_OK);
    for (int k = 0; k < K; k++)
        if (lv[k] == 64) bi = k;
    free(lv);
    CU_ASSERT_FATAL(bi >= 0);
    /* full: every (head, type, level) but each head's own base point (f16 at 64 blocks), on the
     * first 2 of 4 search chunks, plus the reference and base passes */
    long n_pert = 256L * 3 * K - 256;
    CU_ASSERT_DOUBLE_EQUAL(full, 2.0 * (2 + n_pert) * 8192, 0);
    CU_ASSERT_DOUBLE_EQUAL(full_max, full, 0);
    /* sparse pass 0: f16 at every other level, q8 and q4 at every third, all at the top and
     * the base level (f16's base point is the base run); pass 1 at most every f16 point left */
    long a2 = 0, a3 = 0;
    for (int k = 0; k < K; k++) {
        a2 += k % 2 == 0 || k == K - 1 || k == bi;
        a3 += k % 3 == 0 || k == K - 1 || k == bi;
    }
    long pass0 = 256L * (a2 - 1 + 2 * a3), pass1 = 256L * (K - a2);
    CU_ASSERT_DOUBLE_EQUAL(sparse, 2.0 * (2 + pass0) * 8192, 0);
    CU_ASSERT_DOUBLE_EQUAL(sparse_max, sparse + 2.0 * (2 + pass1) * 8192, 0);
    CU_ASSERT(sparse_max < full);
    /* compute-bound: 2 FLOPs a weight (layers + classifier) + attention over C/2 keys */
    double layer = 4096.0 * 4096 + 2 * 4096.0 * 1024 + 4096.0 * 4096 + 3 * 4096.0 * 14336;
    double flops = 2 * (32 * layer + 4096.0 * 128256) + 32 * 4 * 4096.0 * 4096;
    CU_ASSERT_DOUBLE_EQUAL(tps, 989.4e12 * 0.5 / flops, 1e-6 * tps);
}

/* Bad --shape, an unknown preset, --shape without --estimate: one line naming the problem,
 * exit 1. */
static void test_bad_input(void) {
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"search --estimate --shape 32,32,8,128,14336 --context 4096 --ratio 0.125 "
         "--device-preset h100",
         "--shape '32,32,8,128,14336': 5 fields; expected 6"},
        {"search --estimate --shape 32,32,8,x,14336,32000 --context 4096 --ratio 0.125 "
         "--device-preset h100",
         "field 4 (DH)"},
        {"search --estimate --shape 32,30,8,128,14336,32000 --context 4096 --ratio 0.125 "
         "--device-preset h100",
         "not a multiple of KVH"},
        {"search --estimate --shape 32,32,8,128,14336,32000 --context 4096 --ratio 0.125 "
         "--device-preset tpu",
         "--device-preset 'tpu': unknown (known: h100, a100, cpu)"},
        {"search --estimate --shape 32,32,8,128,14336,32000 --ratio 0.125 --device-preset h100",
         "--shape needs --context"},
        {"search --shape 32,32,8,128,14336,32000 --context 4096 --ratio 0.125", "add --estimate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        CU_ASSERT_EQUAL(tu_run_kvplan(cases[i].args, &out, 1), 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(out);
        if (!strstr(out, cases[i].want)) fprintf(stderr, "got: %s\n", out);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].want));
        const char *nl = strchr(out, '\n');
        CU_ASSERT(nl && nl[1] == '\0'); /* one line */
        free(out);
    }
}

int main(int argc, char **argv) {
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    static const tu_test tests[] = {
        {"counts_match_search", test_counts_match_search},
        {"cli_matches_plan", test_cli_matches_plan},
        {"shape", test_shape},
        {"bad_input", test_bad_input},
    };
    static const tu_suite suite = {"estimate", estimate_init, NULL, tests,
                                   sizeof tests / sizeof tests[0]};
    return tu_main_suites(argc, argv, &suite, 1);
}
