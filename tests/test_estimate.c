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

/* The estimate's counts equal what a real search (kv_search_plan: search, guard) records:
 * exactly for the grid, the baselines and the first round of curves; within the estimate's
 * range for the refinement, the verification and the ladder. Then with successive halving. */
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
    for (int halving = 0; halving < 2; halving++) {
        o.halving_eta = halving ? 3 : 0;
        o.sensitivity = !halving; /* the halving run checks the grid alone */
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
        int rc = kv_search_plan(m, &prof, ids, 10 * 128, &lay, KV_ROBUST_MEAN, &o, NULL, NULL, &res,
                                &rob, &rr, &ap, &e);
        if (rc) fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
        const kv_est_row *g = &est.stage[KV_EST_GRID], *b = &est.stage[KV_EST_BASELINES];
        CU_ASSERT_EQUAL(est.distinct, res.distinct_budgets);
        CU_ASSERT_EQUAL(est.points, 9);
        CU_ASSERT(g->exact);
        CU_ASSERT_EQUAL(g->token_evals, res.token_evals);
        CU_ASSERT(within("grid + baselines", res.grid_token_evals_all,
                         g->token_evals + b->token_evals, g->token_evals + b->token_evals_max));
        if (!halving) {
            CU_ASSERT_EQUAL(g->token_evals, (long)res.distinct_budgets * 8 * 128);
            CU_ASSERT(b->exact);
            CU_ASSERT_EQUAL(g->token_evals + b->token_evals, res.grid_token_evals_all);
            const kv_est_row *c = &est.stage[KV_EST_CURVES], *r = &est.stage[KV_EST_REFINE],
                             *v = &est.stage[KV_EST_VERIFY];
            CU_ASSERT(c->exact);
            CU_ASSERT_EQUAL(c->token_evals, res.sens.curves.token_evals);
            CU_ASSERT(c->token_evals > 0);
            CU_ASSERT(within("sensitivity", res.sens.token_evals,
                             c->token_evals + r->token_evals + v->token_evals,
                             c->token_evals + r->token_evals_max + v->token_evals_max));
            CU_ASSERT(within("ladder", res.ladder_token_evals, est.stage[KV_EST_LADDER].token_evals,
                             est.stage[KV_EST_LADDER].token_evals_max));
        } else {
            CU_ASSERT(res.token_evals < (long)res.distinct_budgets * 8 * 128);
            CU_ASSERT_EQUAL(est.stage[KV_EST_CURVES].token_evals_max, 0);
        }
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
    free(out);
    snprintf(args, sizeof args, "%s -o %s", common, tu_tmp("plan.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    kv_h5 *f = NULL;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("plan.h5"), &f, &e), KV_OK);
    long grid_evals = -1, all = -1;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "token_evals", &grid_evals, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "grid_token_evals_all", &all, &e), KV_OK);
    kv_h5_close(f);
    CU_ASSERT_DOUBLE_EQUAL(est_grid, (double)grid_evals, 0);
    CU_ASSERT_DOUBLE_EQUAL(est_grid + est_base, (double)all, 0);
}

/* --shape without a model: the curves of a Llama-3-8B-shaped model (256 KV heads, three KV
 * types, the default levels) and the H100 roofline's throughput, by hand. */
static void test_shape(void) {
    char *out = NULL;
    const char *args = "search --estimate --shape 32,32,8,128,14336,128256 --context 8192 "
                       "--ratio 0.125 --eval-tokens 32768 --heldout-tokens 8192 "
                       "--device-preset h100 --json";
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    const char *cv = out ? strstr(out, "\"curves\"") : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(cv);
    double curves = tu_json_number(cv, "token_evals");
    double tps = tu_json_number(out, "tokens_per_s");
    free(out);
    /* the levels: b_s = p = 16 (R C = 1024 tokens), floor 4 + 16 tokens = 2 blocks to 512 */
    kv_sens_opts so;
    kv_sens_opts_default(&so, NULL);
    so.ratio = 0.125, so.context = 8192, so.block_size = 16, so.evict_block = 16;
    int *lv = NULL, K = 0;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_sens_default_levels(&so, &lv, &K, &e), KV_OK);
    int has_uniform = 0;
    for (int k = 0; k < K; k++) has_uniform |= lv[k] == 64;
    free(lv);
    CU_ASSERT(has_uniform);
    /* every (head, type, level) but each head's own base point (f16 at 64 blocks), on the first
     * 2 of 4 search chunks, plus the reference and base passes */
    long n_pert = 256L * 3 * K - 256;
    CU_ASSERT_DOUBLE_EQUAL(curves, 2.0 * (2 + n_pert) * 8192, 0);
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
