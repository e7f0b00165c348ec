/* Tests of planner/alloc.c: k-means, SqueezeAttention layer budgets, BaKlaVa Alg. 2, the GLPK
 * rounding against brute force, infeasible plans, successive halving. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/alloc.h"
#include "testutil.h"

#define EPS 1e-9

static void assert_vec(const double *got, const double *want, int n, double eps) {
    for (int i = 0; i < n; i++) CU_ASSERT_DOUBLE_EQUAL(got[i], want[i], eps);
}

/* ---- k-means ---- */
static void test_kmeans_known(void) {
    const double x[] = {1.0, 1.1, 0.9, 5.0, 5.2, 9.0, 9.1, 8.9};
    int lab[8], k = 0;
    double c[3];
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_kmeans_1d(x, 8, 3, lab, c, &k, &e), KV_OK);
    CU_ASSERT_EQUAL(k, 3);
    const int want[] = {0, 0, 0, 1, 1, 2, 2, 2};
    for (int i = 0; i < 8; i++) CU_ASSERT_EQUAL(lab[i], want[i]);
    CU_ASSERT_DOUBLE_EQUAL(c[0], 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(c[1], 5.1, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(c[2], 9.0, 1e-12);
}

static void test_kmeans_small_and_ties(void) {
    int lab[3], k = 0;
    double c[3];
    const double two[] = {0.7, 0.3};
    CU_ASSERT_EQUAL_FATAL(kv_kmeans_1d(two, 2, 3, lab, c, &k, NULL), KV_OK);
    CU_ASSERT_EQUAL(k, 2); /* L < 3: fewer clusters */
    CU_ASSERT_EQUAL(lab[0], 1);
    CU_ASSERT_EQUAL(lab[1], 0);
    const double same[] = {0.5, 0.5, 0.5};
    CU_ASSERT_EQUAL_FATAL(kv_kmeans_1d(same, 3, 3, lab, c, &k, NULL), KV_OK);
    CU_ASSERT_EQUAL(k, 1);
    CU_ASSERT_EQUAL(lab[0] + lab[1] + lab[2], 0);
    /* x = 1 is halfway between the initial centres 0 and 2: the tie goes to the lower one */
    const double t[] = {0.0, 1.0, 2.0};
    CU_ASSERT_EQUAL_FATAL(kv_kmeans_1d(t, 3, 2, lab, c, &k, NULL), KV_OK);
    CU_ASSERT_EQUAL(k, 2);
    CU_ASSERT_EQUAL(lab[0], 0);
    CU_ASSERT_EQUAL(lab[1], 0);
    CU_ASSERT_EQUAL(lab[2], 1);
    CU_ASSERT_DOUBLE_EQUAL(c[0], 0.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(c[1], 2.0, 1e-12);
    const double bad[] = {0.0, NAN};
    kv_error e;
    CU_ASSERT_EQUAL(kv_kmeans_1d(bad, 2, 3, lab, c, &k, &e), KV_EINPUT);
}

/* ---- layer budgets ---- */
static void test_squeeze_by_hand(void) {
    /* L = 6, H_kv = 2, C = 100, R = 0.5: total 600, share 100 per layer. Clusters
     * {0.1, 0.2} {0.5, 0.55} {0.9, 0.95}; layers 4, 5 keep p = 0.5 of their share (50 each),
     * the freed 100 goes to the other four layers (+25 each). */
    const double sim[] = {0.1, 0.2, 0.5, 0.55, 0.9, 0.95};
    double out[6];
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_layer_budgets(KV_ALLOC_SQUEEZE, sim, 6, 2, 0.5, 100, 0.5, 0, out, &e),
                          KV_OK);
    const double want[] = {125, 125, 125, 125, 50, 50};
    assert_vec(out, want, 6, EPS);
    /* R = 0.9: share 180; 90 for layers 4, 5 and 225 for the others, above the cap
     * H_kv * C = 200: the cap removes 4 * 25, which goes back equally to the uncapped layers. */
    CU_ASSERT_EQUAL_FATAL(kv_layer_budgets(KV_ALLOC_SQUEEZE, sim, 6, 2, 0.9, 100, 0.5, 0, out, &e),
                          KV_OK);
    const double want2[] = {200, 200, 200, 200, 140, 140};
    assert_vec(out, want2, 6, EPS);
    /* uniform */
    CU_ASSERT_EQUAL_FATAL(
        kv_layer_budgets(KV_ALLOC_UNIFORM, NULL, 6, 2, 0.25, 100, 0.5, 0, out, &e), KV_OK);
    for (int l = 0; l < 6; l++) CU_ASSERT_DOUBLE_EQUAL(out[l], 50.0, EPS);
    /* floor: min_tokens = 30 per head -> at least 60 per layer; p = 0.1 would give 10 */
    CU_ASSERT_EQUAL_FATAL(kv_layer_budgets(KV_ALLOC_SQUEEZE, sim, 6, 2, 0.5, 100, 0.1, 30, out, &e),
                          KV_OK);
    double s = 0;
    for (int l = 0; l < 6; l++) s += out[l];
    CU_ASSERT_DOUBLE_EQUAL(s, 600.0, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(out[4], 60.0, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(out[0], 120.0, 1e-9);
    /* one cluster only: nothing changes */
    const double flat[] = {0.4, 0.4, 0.4};
    CU_ASSERT_EQUAL_FATAL(kv_layer_budgets(KV_ALLOC_SQUEEZE, flat, 3, 2, 0.5, 100, 0.5, 0, out, &e),
                          KV_OK);
    for (int l = 0; l < 3; l++) CU_ASSERT_DOUBLE_EQUAL(out[l], 100.0, EPS);
}

/* ---- Alg. 2 ---- */
static void test_alg2_no_low_all_low(void) {
    const double sim[] = {0.1, 0.2, 0.3, 0.4};
    double b[] = {100, 100, 100, 100};
    int n = -1;
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(4, sim, NULL, 0.5, 0.5, 0, HUGE_VAL, b, &n, &e), KV_OK);
    CU_ASSERT_EQUAL(n, 0);
    for (int i = 0; i < 4; i++) CU_ASSERT_DOUBLE_EQUAL(b[i], 100.0, 0);
    const double hi_sim[] = {0.6, 0.7, 0.8, 0.9};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(4, hi_sim, NULL, 0.5, 0.5, 0, HUGE_VAL, b, &n, &e),
                          KV_OK);
    CU_ASSERT_EQUAL(n, 4);
    for (int i = 0; i < 4; i++) CU_ASSERT_DOUBLE_EQUAL(b[i], 100.0, 0);
}

static void test_alg2_k(void) {
    int n = 0;
    kv_error e;
    /* n = 2 low of m = 4: k = 2, freed 2 * 50 = 100, +50 to heads 2 and 3 */
    const double s1[] = {0.9, 0.8, 0.3, 0.2};
    double b1[] = {100, 100, 100, 100};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(4, s1, NULL, 0.5, 0.5, 0, HUGE_VAL, b1, &n, &e), KV_OK);
    CU_ASSERT_EQUAL(n, 2);
    const double w1[] = {50, 50, 150, 150};
    assert_vec(b1, w1, 4, EPS);
    /* n = 1: k = 1, freed 40 goes to the most important head (1) only */
    const double s2[] = {0.9, 0.1, 0.3, 0.2};
    double b2[] = {100, 100, 100, 100};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(4, s2, NULL, 0.5, 0.4, 0, HUGE_VAL, b2, &n, &e), KV_OK);
    const double w2[] = {60, 140, 100, 100};
    assert_vec(b2, w2, 4, EPS);
    /* n = 3: k = min(3, 1) = 1, freed 150 all to head 3 */
    const double s3[] = {0.9, 0.8, 0.7, 0.2};
    double b3[] = {100, 100, 100, 100};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(4, s3, NULL, 0.5, 0.5, 0, HUGE_VAL, b3, &n, &e), KV_OK);
    CU_ASSERT_EQUAL(n, 3);
    const double w3[] = {50, 50, 50, 250};
    assert_vec(b3, w3, 4, EPS);
    /* same with the context cap C = 200: head 3 capped, its 50 overflow shared by the rest */
    double b4[] = {100, 100, 100, 100};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(4, s3, NULL, 0.5, 0.5, 0, 200, b4, &n, &e), KV_OK);
    const double w4[] = {50 + 50.0 / 3, 50 + 50.0 / 3, 50 + 50.0 / 3, 200};
    assert_vec(b4, w4, 4, 1e-9);
    /* unequal budgets, importance from /heads/importance (not 1 - sim): low 0, 1 free
     * 20 + 10 = 30; k = min(2, 3) = 2 most important non-low heads 3 (0.95), 4 (0.6): +15 each */
    const double s5[] = {0.9, 0.6, 0.1, 0.2, 0.3};
    const double imp5[] = {0.1, 0.4, 0.5, 0.95, 0.6};
    double b5[] = {100, 50, 80, 60, 40};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(5, s5, imp5, 0.5, 0.2, 0, HUGE_VAL, b5, &n, &e), KV_OK);
    const double w5[] = {80, 40, 80, 75, 55};
    assert_vec(b5, w5, 5, EPS);
    /* floor: r = 0.9 would leave head 0 with 4 < lo = 20; it is lifted to 20 and the other
     * head pays: {20, 60} */
    const double s6[] = {0.9, 0.1};
    double b6[] = {40, 40};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(2, s6, NULL, 0.5, 0.9, 20, 100, b6, &n, &e), KV_OK);
    const double w6[] = {20, 60};
    assert_vec(b6, w6, 2, EPS);
    /* equal importance: the tie goes to the lower index */
    const double s7[] = {0.9, 0.3, 0.3};
    double b7[] = {10, 10, 10};
    CU_ASSERT_EQUAL_FATAL(kv_head_realloc(3, s7, NULL, 0.5, 1.0, 0, HUGE_VAL, b7, &n, &e), KV_OK);
    const double w7[] = {0, 20, 10};
    assert_vec(b7, w7, 3, EPS);
}

/* ---- whole plans ---- */
static double lcg(unsigned long *s) {
    *s = *s * 6364136223846793005UL + 1442695040888963407UL;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static void test_plan_sums(void) {
    enum { L = 6, H = 4 };
    double lsim[L], hsim[L * H], x[L * H];
    int tok[L * H], blk[L * H];
    unsigned long s = 42;
    for (int l = 0; l < L; l++) lsim[l] = 0.5 + 0.5 * lcg(&s);
    for (int i = 0; i < L * H; i++) hsim[i] = lcg(&s);
    kv_alloc_kind kinds[] = {KV_ALLOC_UNIFORM, KV_ALLOC_SQUEEZE, KV_ALLOC_BAKLAVA};
    double ratios[] = {0.2, 0.37, 0.5, 0.8, 1.0};
    kv_error e;
    for (int ki = 0; ki < 3; ki++)
        for (int ri = 0; ri < 5; ri++) {
            kv_alloc_params a;
            kv_alloc_params_default(&a);
            a.kind = kinds[ki];
            a.ratio = ratios[ri];
            a.context = 256;
            a.block_size = 16;
            a.min_tokens = 20;
            a.t = 0.6;
            a.r = 0.3;
            int rc = kv_plan_budgets(&a, L, H, lsim, hsim, NULL, tok, blk, x, &e);
            CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
            double total = a.ratio * L * H * a.context, sx = 0, dev = 0;
            long st = 0;
            for (int i = 0; i < L * H; i++) {
                sx += x[i];
                st += tok[i];
                CU_ASSERT_EQUAL(tok[i], blk[i] * 16);
                CU_ASSERT(tok[i] >= 32 && tok[i] <= 256); /* ceil(20/16) blocks .. C */
                CU_ASSERT(x[i] <= 256 + 1e-9 && x[i] >= 20 - 1e-9);
                dev += fabs(tok[i] - x[i]);
            }
            CU_ASSERT(dev / (L * H) < 16.0); /* on average within one block per head */
            CU_ASSERT_DOUBLE_EQUAL(sx, total, 1e-6);
            CU_ASSERT_EQUAL(st, (long)floor(total / 16) * 16);
            CU_ASSERT(total - st < 16.0);
        }
}

/* ---- rounding vs brute force ---- */
static double brute(int n, const double *y, long lo, long hi, long N, long *b, int i, long left) {
    if (i == n - 1) {
        if (left < lo || left > hi) return HUGE_VAL;
        b[i] = left;
        double s = 0;
        for (int j = 0; j < n; j++) s += fabs((double)b[j] - y[j]);
        return s;
    }
    double best = HUGE_VAL;
    for (long v = lo; v <= hi && v <= left; v++) {
        b[i] = v;
        double r = brute(n, y, lo, hi, N, b, i + 1, left - v);
        if (r < best) best = r;
    }
    return best;
}

static void test_round_vs_brute(void) {
    unsigned long s = 7;
    kv_error e;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + trial % 5;
        int bs = (trial % 3 == 0) ? 1 : (trial % 3 == 1 ? 4 : 16);
        int C = bs * (2 + (int)(lcg(&s) * 5)) - (trial % 2); /* sometimes not a multiple */
        if (C < 1) C = 1;
        int min_tokens = (int)(lcg(&s) * C * 0.5);
        double x[5], y[5];
        for (int i = 0; i < n; i++) { /* some outside [lo, hi] on purpose */
            x[i] = lcg(&s) * C * 1.2;
            y[i] = x[i] / bs;
        }
        double total = lcg(&s) * n * C;
        long lo = (min_tokens + bs - 1) / bs, hi = (C + bs - 1) / bs;
        long N = (long)floor(total / bs + 1e-9);
        int tok[5], blk[5];
        int rc = kv_round_budgets(n, x, total, bs, min_tokens, C, tok, blk, &e);
        if (lo * n > N || hi * n < N) {
            CU_ASSERT_EQUAL(rc, KV_EINPUT);
            continue;
        }
        CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
        long b[5], sum = 0;
        double obj = 0;
        for (int i = 0; i < n; i++) {
            sum += blk[i];
            obj += fabs(blk[i] - y[i]);
            CU_ASSERT(blk[i] >= lo && blk[i] <= hi);
            CU_ASSERT_EQUAL(tok[i], blk[i] * bs);
        }
        CU_ASSERT_EQUAL(sum, N);
        double best = brute(n, y, lo, hi, N, b, 0, N);
        CU_ASSERT_DOUBLE_EQUAL(obj, best, 1e-7);
    }
}

/* Many equal fractional parts: the case where a weak formulation makes branch and bound
 * explode; with the chord inequality it is solved at the root. */
static void test_round_many_halves(void) {
    enum { N = 2048 };
    double *x = malloc(N * sizeof *x);
    int *tok = malloc(N * sizeof *tok);
    CU_ASSERT_FATAL(x && tok);
    for (int i = 0; i < N; i++) x[i] = 16 * 4.5;
    kv_error e;
    CU_ASSERT_EQUAL(kv_round_budgets(N, x, 16 * 4.5 * N, 16, 20, 256, tok, NULL, &e), KV_OK);
    long fives = 0, sum = 0;
    for (int i = 0; i < N; i++) {
        fives += tok[i] == 80;
        sum += tok[i];
        CU_ASSERT(tok[i] == 64 || tok[i] == 80);
    }
    CU_ASSERT_EQUAL(fives, N / 2);
    CU_ASSERT_EQUAL(sum, (long)(16 * 4.5 * N));
    free(x);
    free(tok);
}

static void test_infeasible(void) {
    kv_error e;
    double x[4] = {25, 25, 25, 25};
    int tok[4];
    /* lower bounds: 4 heads x ceil(20/16) = 2 blocks = 8 > floor(100/16) = 6 */
    CU_ASSERT_EQUAL(kv_round_budgets(4, x, 100, 16, 20, 256, tok, NULL, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "short by 2 blocks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "lower bounds"));
    /* upper bounds: 2 heads x ceil(32/16) = 4 < 6 */
    CU_ASSERT_EQUAL(kv_round_budgets(2, x, 100, 16, 0, 32, tok, NULL, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "over by 2 blocks"));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "upper bounds"));
    /* a ratio too small for the sinks through the whole planner */
    kv_alloc_params a;
    kv_alloc_params_default(&a);
    a.ratio = 0.05; /* 12.8 tokens per head < 20 */
    double ls[2] = {0.5, 0.9}, hs[4] = {0.1, 0.9, 0.2, 0.8};
    int t4[4], b4[4];
    CU_ASSERT_EQUAL(kv_plan_budgets(&a, 2, 2, ls, hs, NULL, t4, b4, NULL, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "too small"));
    /* bad inputs */
    a.ratio = 1.5;
    CU_ASSERT_EQUAL(kv_plan_budgets(&a, 2, 2, ls, hs, NULL, t4, b4, NULL, &e), KV_EINPUT);
    kv_alloc_kind k;
    CU_ASSERT_EQUAL(kv_alloc_parse("squeeze", &k, &e), KV_OK);
    CU_ASSERT_EQUAL(k, KV_ALLOC_SQUEEZE);
    CU_ASSERT_EQUAL(kv_alloc_parse("pyramid", &k, &e), KV_EINPUT);
}

static void test_project_box(void) {
    const double x[] = {1, 2, 3};
    const double lo[] = {0, 0, 0}, hi[] = {10, 10, 2.5};
    double y[3];
    kv_error e;
    /* common shift lambda: 3 + lambda is capped at 2.5, so 1 + l + 2 + l + 2.5 = 9, l = 1.75 */
    CU_ASSERT_EQUAL_FATAL(kv_project_box(3, x, lo, hi, 9, y, &e), KV_OK);
    const double w[] = {2.75, 3.75, 2.5};
    assert_vec(y, w, 3, 1e-12);
    CU_ASSERT_EQUAL(kv_project_box(3, x, lo, hi, 30, y, &e), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_project_box(3, x, lo, NULL, 30, y, &e), KV_OK);
    const double w2[] = {9, 10, 11};
    assert_vec(y, w2, 3, 1e-12);
}

/* ---- successive halving ---- */
typedef struct sh_user {
    int calls;
    int fail_at;
} sh_user;

static int synth_eval(void *user, int c, int n_chunks, double *ppl, kv_error *err) {
    sh_user *u = user;
    if (++u->calls == u->fail_at) return kv_fail(err, KV_EINTERNAL, "synthetic failure");
    double truth = 10.0 + 0.5 * (c - 17) * (c - 17);
    double noise = (double)((c * 7) % 5 - 2) * 0.4 / n_chunks; /* shrinks with more chunks */
    *ppl = truth + noise;
    return KV_OK;
}

static void test_halving(void) {
    kv_sh_opts o = {.eta = 3, .min_chunks = 1, .max_chunks = 27, .tokens_per_chunk = 255};
    kv_sh_result r;
    sh_user u = {0, -1};
    double last[27];
    kv_error e;
    CU_ASSERT_EQUAL_FATAL(kv_successive_halving(27, &o, synth_eval, &u, &r, last, &e), KV_OK);
    CU_ASSERT_EQUAL(r.winner, 17);
    CU_ASSERT_EQUAL(r.rounds, 3);       /* 27 x 1, 9 x 3, 3 x 9 chunks */
    CU_ASSERT_EQUAL(r.chunk_evals, 81); /* vs 27 x 27 = 729 exhaustive */
    CU_ASSERT_EQUAL(r.token_evals, 81 * 255);
    CU_ASSERT_EQUAL(r.winner_chunks, 9);
    CU_ASSERT_EQUAL(u.calls, 39);
    CU_ASSERT(isnan(last[0]) == 0);
    CU_ASSERT_DOUBLE_EQUAL(r.winner_ppl, 10.0 + 0.8 / 9, 1e-12);
    /* on one chunk config 18 looked best (10.1 < 10.8): the noise was outgrown */
    CU_ASSERT(synth_eval(&u, 18, 1, &last[0], &e) == KV_OK && last[0] < 10.8 - 0.5);
    o.prefix_reuse = 1;
    u.calls = 0;
    CU_ASSERT_EQUAL_FATAL(kv_successive_halving(27, &o, synth_eval, &u, &r, NULL, &e), KV_OK);
    CU_ASSERT_EQUAL(r.chunk_evals, 27 + 9 * 2 + 3 * 6);
    /* chunk cap: 10 configs, eta 2, chunks 1, 2, 4 (= max): 10 + 5 * 2 + 3 * 4 */
    kv_sh_opts o2 = {.eta = 2, .min_chunks = 1, .max_chunks = 4, .tokens_per_chunk = 1};
    u.calls = 0;
    CU_ASSERT_EQUAL_FATAL(kv_successive_halving(10, &o2, synth_eval, &u, &r, NULL, &e), KV_OK);
    CU_ASSERT_EQUAL(r.rounds, 3);
    CU_ASSERT_EQUAL(r.chunk_evals, 32);
    CU_ASSERT_EQUAL(r.winner, 9); /* closest to 17 among 0..9 */
    /* a failing callback stops the search with its error */
    u.calls = 0;
    u.fail_at = 5;
    CU_ASSERT_EQUAL(kv_successive_halving(27, &o, synth_eval, &u, &r, NULL, &e), KV_EINTERNAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "synthetic"));
    o.eta = 1;
    CU_ASSERT_EQUAL(kv_successive_halving(27, &o, synth_eval, &u, &r, NULL, &e), KV_EINPUT);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"kmeans_known", test_kmeans_known},
        {"kmeans_small_and_ties", test_kmeans_small_and_ties},
        {"squeeze_by_hand", test_squeeze_by_hand},
        {"alg2_no_low_all_low", test_alg2_no_low_all_low},
        {"alg2_k", test_alg2_k},
        {"project_box", test_project_box},
        {"plan_sums", test_plan_sums},
        {"round_vs_brute", test_round_vs_brute},
        {"round_many_halves", test_round_many_halves},
        {"infeasible", test_infeasible},
        {"halving", test_halving},
    };
    return tu_main(argc, argv, "alloc", tests, sizeof tests / sizeof tests[0]);
}
