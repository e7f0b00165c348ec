/* Tests of several calibration texts and the guard (planner/robust.c, include/kvplan/robust.h,
 * `kvplan search --text A --text B`): the chunk layout, the option parsing and its errors, and
 * a real two-text search on stories260K whose per-text figures (/search/texts) are re-measured
 * with `kvplan eval` and must show the guard's promise: on every calibration text and
 * held-out part the plan is not worse than the uniform cache (b_s = p = 1), and its
 * chunk-by-chunk prediction bound (re-earned by eval per chunk) is within 0.5%. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/robust.h"
#include "kvplan/tokenizer.h"
#include "support/testutil.h"

#define MODEL "models/stories260K/stories260K.bin"
#define TEXT "text/tinystories_val_head.txt"
#define PAPER "papers/000_50e4c75caff53a63.txt"

/* ---- the layout (no model) ---- */

static void test_lay_out(void) {
    /* two texts of 10 and 7 "chunks" of C = 4: 2 search chunks each (eval 16 / 2 texts = 8
     * tokens), then 1 held-out chunk each (heldout 8 / 2 = 4 tokens) */
    int a[40], b[28];
    for (int i = 0; i < 40; i++) a[i] = 1000 + i;
    for (int i = 0; i < 28; i++) b[i] = 2000 + i;
    const int *ids[2] = {a, b};
    const char *names[2] = {"a.txt", "b.txt"};
    long n[2] = {40, 28};
    int *out = NULL, *ct = NULL, S = 0, HC = 0;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_robust_lay_out(2, names, ids, n, 4, 16, 8, &out, &S, &HC, &ct, &e),
                          KV_OK);
    CU_ASSERT_EQUAL(S, 4);
    CU_ASSERT_EQUAL(HC, 2);
    /* search chunks interleaved a0 b0 a1 b1, then held-out a2 b2 */
    static const int want_text[6] = {0, 1, 0, 1, 0, 1};
    static const int want_first[6] = {1000, 2000, 1004, 2004, 1008, 2008};
    for (int k = 0; k < 6; k++) {
        CU_ASSERT_EQUAL(ct[k], want_text[k]);
        CU_ASSERT_EQUAL(out[k * 4], want_first[k]);
        CU_ASSERT_EQUAL(out[k * 4 + 3], want_first[k] + 3);
    }
    free(out), free(ct);
    /* one text: its first (S + HC) chunks in order, as a one-text search always read */
    CU_ASSERT_EQUAL_FATAL(kv_robust_lay_out(1, names, ids, n, 4, 16, 8, &out, &S, &HC, &ct, &e),
                          KV_OK);
    CU_ASSERT_EQUAL(S, 4);
    CU_ASSERT_EQUAL(HC, 2);
    for (int i = 0; i < 24; i++) CU_ASSERT_EQUAL(out[i], 1000 + i);
    free(out), free(ct);
    /* a text shorter than one chunk is named */
    long short_n[2] = {40, 3};
    CU_ASSERT_EQUAL(kv_robust_lay_out(2, names, ids, short_n, 4, 16, 8, &out, &S, &HC, &ct, &e),
                    KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "b.txt"));
    CU_ASSERT_PTR_NULL(out);
    kv_robust_objective o;
    CU_ASSERT_EQUAL(kv_robust_objective_parse("worst", &o, &e), KV_OK);
    CU_ASSERT_EQUAL(o, KV_ROBUST_WORST);
    CU_ASSERT_EQUAL(kv_robust_objective_parse("median", &o, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "median"));
}

/* ---- the fixture: a profile of both texts, one two-text search ---- */

static char search_out[1 << 16];
static int search_rc = -1;

static int robust_init(void) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "profile %s --text %s --text %s --no-hw --quiet -o %s",
             tu_shared(MODEL), tu_shared(TEXT), tu_shared(PAPER), tu_tmp("profile.h5"));
    int rc = tu_run_kvplan(args, &out, 1);
    if (rc) fprintf(stderr, "profile: %s\n", out ? out : "");
    free(out);
    if (rc) return 1;
    snprintf(args, sizeof args,
             "search --profile %s --model %s --text %s --text %s --ratio 0.0625 --context 512 "
             "--eval-tokens 2048 --heldout-tokens 1024 --t-grid 0.9 --r-grid 0.3,0.6 "
             "--sens-levels 6 --sens-rounds 1 --sens-batch 8 --quiet -o %s",
             tu_tmp("profile.h5"), tu_shared(MODEL), tu_shared(TEXT), tu_shared(PAPER),
             tu_tmp("plan.h5"));
    out = NULL;
    search_rc = tu_run_kvplan(args, &out, 1);
    snprintf(search_out, sizeof search_out, "%s", out ? out : "");
    free(out);
    return 0;
}

static double *read_f64(kv_h5 *f, const char *path, long *dims) {
    double *d = NULL;
    int rank = 0;
    kv_error e;
    if (kv_h5_read_f64(f, path, &rank, dims, &d, &e)) return NULL;
    return d;
}

/* Token ids (BOS first) of a shared text, with stories260K's tokenizer. */
static int *text_ids(const kv_model *m, const char *rel, int *n) {
    kv_tokenizer *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL;
    kv_error e = {0};
    int rc = kv_tokenizer_load(NULL, m, &tok, &e);
    if (!rc) rc = kv_read_file(tu_shared(rel), &text, &len, &e);
    if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &ids, n, &e);
    if (rc) fprintf(stderr, "%s: %s\n", rel, e.msg);
    free(text);
    kv_tokenizer_free(tok);
    return ids;
}

/* `kvplan eval` figure `key` ("perplexity", or "nll": nats per scored token) of
 * ids[from, from + n) under `budget` (kvplan eval options). */
static double eval_key(const int *ids, long from, long n, const char *budget, const char *key) {
    FILE *f = fopen(tu_tmp("chunk.ids"), "w");
    if (!f) return NAN;
    for (long i = from; i < from + n; i++) fprintf(f, "%d\n", ids[i]);
    fclose(f);
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "eval %s --tokens %s --context 512 --json --quiet %s",
             tu_shared(MODEL), tu_tmp("chunk.ids"), budget);
    double v = tu_run_kvplan(args, &out, 0) == 0 ? tu_json_number(out, key) : NAN;
    free(out);
    return v;
}

static double eval_ppl(const int *ids, long from, long n, const char *budget) {
    return eval_key(ids, from, n, budget, "perplexity");
}

/* Two texts given with --text twice: per-text figures recorded, re-measured by kvplan eval,
 * and the guard's promise holding on each text and part. */
/* The transfer check (leave one text out) of plan file `path`, re-earned from its stored
 * figures where they decide it: a candidate fitted on every text's curves (sources 1, 2, 7)
 * is marked 0 whenever a text's own knapsack (source 3 + t) at the same lambda is worse than
 * uniform on a part of another text; one marked 1 has all those per-text figures within
 * uniform's; every other candidate is -1 (and all are -1 without two per-text knapsacks);
 * the shipped plan's figures are those of a candidate that passed and was not marked 0.
 * Returns the number of candidates checked (marked 0 or 1), *n_failed those marked 0. */
static int check_transfer(const char *path, int *n_failed) {
    kv_h5 *f = NULL;
    kv_error e = {0};
    *n_failed = 0;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &e), KV_OK);
    long dk[KV_H5_MAX_RANK] = {0}, dl[KV_H5_MAX_RANK] = {0}, dt[KV_H5_MAX_RANK] = {0},
         dp[KV_H5_MAX_RANK] = {0}, dc[KV_H5_MAX_RANK] = {0}, du[KV_H5_MAX_RANK] = {0};
    double *src = read_f64(f, "/search/texts/candidates/source", dk);
    double *lam = read_f64(f, "/search/texts/candidates/lambda", dl);
    double *tr = read_f64(f, "/search/texts/candidates/transfer", dt);
    double *passed = read_f64(f, "/search/texts/candidates/passed", dp);
    double *cand = read_f64(f, "/search/texts/candidates/perplexity", dc);
    double *uni = read_f64(f, "/search/texts/uniform", du);
    double *plan = read_f64(f, "/search/texts/plan", du);
    kv_h5_close(f);
    CU_ASSERT_FATAL(src && lam && tr && passed && cand && uni && plan);
    const long K = dk[0], N = du[0];
    CU_ASSERT_FATAL(dl[0] == K && dt[0] == K && dp[0] == K && dc[0] == K && dc[1] == N);
    int n_own = 0, checked = 0, shipped = 0;
    for (long k = 0; k < K; k++) n_own += src[k] >= 3 && src[k] < 7 && lam[k] == 1.0;
    for (long k = 0; k < K; k++) {
        int fitted_on_all = src[k] == 1 || src[k] == 2 || src[k] == 7;
        if (!fitted_on_all || n_own < 2) {
            CU_ASSERT_EQUAL(tr[k], -1.0);
        } else {
            CU_ASSERT(tr[k] == 0.0 || tr[k] == 1.0);
            int loses = 0; /* a text's own knapsack, same lambda, worse on another text */
            for (long j = 0; j < K; j++) {
                if (!(src[j] >= 3 && src[j] < 7) || lam[j] != lam[k]) continue;
                for (long i = 0; i < N * 2; i++)
                    if (i / 2 != (long)src[j] - 3 && isfinite(uni[i]) &&
                        cand[j * N * 2 + i] > uni[i] * (1 + 1e-6))
                        loses = 1;
            }
            if (loses) CU_ASSERT_EQUAL(tr[k], 0.0);
            checked++;
            *n_failed += tr[k] == 0.0;
        }
        if (passed[k] != 0.0 && tr[k] != 0.0 &&
            !memcmp(cand + k * N * 2, plan, (size_t)N * 2 * sizeof *plan))
            shipped = 1;
    }
    CU_ASSERT(shipped);
    free(src), free(lam), free(tr), free(passed), free(cand), free(uni), free(plan);
    return checked;
}

static void test_two_texts(void) {
    if (search_rc) fprintf(stderr, "%s\n", search_out);
    CU_ASSERT_EQUAL_FATAL(search_rc, 0);
    kv_h5 *f = NULL;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("plan.h5"), &f, &e), KV_OK);
    long dims[KV_H5_MAX_RANK] = {0}, d2[KV_H5_MAX_RANK] = {0};
    double *full = read_f64(f, "/search/texts/full", dims);
    double *uni = read_f64(f, "/search/texts/uniform", d2);
    double *plan = read_f64(f, "/search/texts/plan", d2);
    double *chunks = read_f64(f, "/search/texts/chunks", d2);
    double *tokens = read_f64(f, "/search/texts/tokens", d2);
    char *names = NULL, *decision = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/search/texts", "names", &names, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/search/texts", "decision", &decision, &e), KV_OK);
    kv_h5_close(f);
    CU_ASSERT_FATAL(full && uni && plan && chunks && tokens && names && decision);
    CU_ASSERT_EQUAL(dims[0], 2);
    CU_ASSERT_EQUAL(dims[1], 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(names, "tinystories_val_head.txt"));
    CU_ASSERT_PTR_NOT_NULL(strstr(names, "000_50e4c75caff53a63.txt"));
    /* 2048 search tokens and 1024 held-out tokens, shared evenly: 2 + 1 chunks per text */
    for (int t = 0; t < 2; t++) {
        CU_ASSERT_EQUAL(chunks[t * 2], 2);
        CU_ASSERT_EQUAL(chunks[t * 2 + 1], 1);
    }
    /* the guard: never worse than the uniform cache on what the search was shown */
    for (int i = 0; i < 4; i++) {
        printf("\n    text %d %s: full %.4f uniform %.4f plan %.4f", i / 2,
               i % 2 ? "held-out" : "calibration", full[i], uni[i], plan[i]);
        CU_ASSERT(isfinite(plan[i]) && plan[i] > 1.0);
        CU_ASSERT(plan[i] <= uni[i] * (1 + 1e-6));
    }
    printf("\n    decision %s\n", decision);
    /* the figures are what kvplan eval measures on the same tokens: text 0's calibration
     * chunks (its first 1024 tokens) and text 1's held-out chunk (its tokens 1024..1535) */
    kv_model *m = tu_load_shared(MODEL);
    int n0 = 0, n1 = 0;
    int *ids0 = text_ids(m, TEXT, &n0), *ids1 = text_ids(m, PAPER, &n1);
    CU_ASSERT_FATAL(ids0 && ids1);
    CU_ASSERT_EQUAL(tokens[0], n0);
    CU_ASSERT_EQUAL(tokens[1], n1);
    char plan_opt[1024];
    snprintf(plan_opt, sizeof plan_opt, "--plan %s", tu_tmp("plan.h5"));
    const char *uni_opt = "--ratio 0.0625 --allocation uniform --block-size 1 --evict-block 1";
    double p0 = eval_ppl(ids0, 0, 1024, plan_opt), u0 = eval_ppl(ids0, 0, 1024, uni_opt);
    double f1 = eval_ppl(ids1, 1024, 512, ""), p1 = eval_ppl(ids1, 1024, 512, plan_opt);
    printf("    eval: plan %.6f %.6f uniform %.6f full %.6f\n", p0, p1, u0, f1);
    CU_ASSERT_DOUBLE_EQUAL(p0, plan[0], 1e-9 * plan[0]);
    CU_ASSERT_DOUBLE_EQUAL(u0, uni[0], 1e-9 * uni[0]);
    CU_ASSERT_DOUBLE_EQUAL(f1, full[3], 1e-9 * full[3]);
    CU_ASSERT_DOUBLE_EQUAL(p1, plan[3], 1e-9 * plan[3]);
    /* the prediction bound of the shipped candidate, re-earned chunk by chunk: per text the
     * per-token NLL change against uniform on its 3 chunks (2 calibration + 1 held-out), mean m,
     * deviation s, m + 1.645 s sqrt(1/3 + 1/4); the largest over the texts is the stored bound of
     * the candidate whose figures are the plan's, and it is within log(1.005) */
    double worst = -HUGE_VAL;
    for (int t = 0; t < 2; t++) {
        const int *ids = t ? ids1 : ids0;
        double d[3], m = 0.0, v = 0.0;
        for (int c = 0; c < 3; c++) {
            d[c] = eval_key(ids, c * 512L, 512, plan_opt, "nll") -
                   eval_key(ids, c * 512L, 512, uni_opt, "nll");
            m += d[c] / 3;
        }
        for (int c = 0; c < 3; c++) v += (d[c] - m) * (d[c] - m) / 2;
        double bnd = m + 1.645 * sqrt(v) * sqrt(1.0 / 3 + 1.0 / 4);
        printf("    text %d: NLL change per chunk %.5f %.5f %.5f, bound %.5f\n", t, d[0], d[1],
               d[2], bnd);
        if (bnd > worst) worst = bnd;
    }
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("plan.h5"), &f, &e), KV_OK);
    long dk[KV_H5_MAX_RANK] = {0}, dc[KV_H5_MAX_RANK] = {0}, dp[KV_H5_MAX_RANK] = {0};
    double *bound = read_f64(f, "/search/texts/candidates/bound", dk);
    double *cand = read_f64(f, "/search/texts/candidates/perplexity", dc);
    double *passed = read_f64(f, "/search/texts/candidates/passed", dp);
    long dob[KV_H5_MAX_RANK] = {0};
    double *obj = read_f64(f, "/search/texts/candidates/objective", dob);
    kv_h5_close(f);
    CU_ASSERT_FATAL(bound && cand && passed && obj && dc[0] == dk[0] && dp[0] == dk[0] &&
                    dob[0] == dk[0]);
    int found = 0;
    double best_obj = HUGE_VAL, written_obj = HUGE_VAL;
    for (long k = 0; k < dk[0]; k++) {
        if (passed[k] != 0.0) CU_ASSERT(bound[k] <= log1p(0.005));
        if (obj[k] < best_obj) best_obj = obj[k];
        if (memcmp(cand + k * 4, plan, 4 * sizeof *plan) || passed[k] == 0.0) continue;
        CU_ASSERT_DOUBLE_EQUAL(bound[k], worst, 1e-7);
        if (obj[k] < written_obj) written_obj = obj[k];
        found = 1;
    }
    /* the written candidate is the best by the objective (no margin for the search's plan) */
    printf("    written candidate's objective %.6f, best %.6f\n", written_obj, best_obj);
    CU_ASSERT_DOUBLE_EQUAL(written_obj, best_obj, 1e-12);
    printf("    shipped candidate's bound %.5f (re-earned), at most %.5f\n", worst, log1p(0.005));
    CU_ASSERT(found);
    CU_ASSERT(worst <= log1p(0.005));
    int n_failed = 0, n_checked = check_transfer(tu_tmp("plan.h5"), &n_failed);
    printf("    transfer check: %d candidates fitted on both texts, %d failed it\n", n_checked,
           n_failed);
    free(bound), free(cand), free(passed), free(obj);
    free(ids0), free(ids1);
    kv_model_free(m);
    free(full), free(uni), free(plan), free(chunks), free(tokens), free(names), free(decision);
    /* the search's own table and inspect's (text and JSON) */
    CU_ASSERT_PTR_NOT_NULL(strstr(search_out, "guard        objective mean"));
    char line[160];
    snprintf(line, sizeof line, "transfer     %d of %d knapsack candidates", n_failed, n_checked);
    CU_ASSERT_PTR_NOT_NULL(strstr(search_out, line));
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "inspect %s", tu_tmp("plan.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 0);
    CU_ASSERT_TRUE(out && strstr(out, "calibration texts (/search/texts"));
    CU_ASSERT_TRUE(out && strstr(out, "000_50e4c75caff53a63.txt"));
    free(out);
    snprintf(args, sizeof args, "inspect %s --json", tu_tmp("plan.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT_TRUE(out && strstr(out, "\"texts\":{\"objective\":\"mean\""));
    CU_ASSERT_TRUE(out && strstr(out, "\"part\":\"heldout\""));
    free(out);
}

/* The shipped plans (plans/, scripts/make-plans.sh: two texts): the transfer check holds as
 * check_transfer re-earns it, and on TinyStories-656K at R = 1/16 it decides: a knapsack fitted
 * on both texts is dropped there (each text's own knapsack loses to uniform on the other). */
static void test_shipped_transfer(void) {
    static const char *const plans[] = {"stories260K.r1-4",      "stories260K.r1-8",
                                        "stories260K.r1-16",     "tinystories-656k.r1-4",
                                        "tinystories-656k.r1-8", "tinystories-656k.r1-16"};
    for (int i = 0; i < 6; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/plans/%s.h5", KVPLAN_SOURCE_DIR, plans[i]);
        int n_failed = 0, n = check_transfer(path, &n_failed);
        printf("\n    %s: %d candidates checked, %d failed", plans[i], n, n_failed);
        CU_ASSERT(n > 0);
        if (i == 5) CU_ASSERT(n_failed > 0);
    }
    printf("\n");
}

/* Bad inputs: a missing second text is named; a text list naming nothing; a bad objective. */
static void test_bad_texts(void) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args,
             "search --profile %s --model %s --text %s --text %s --ratio 0.125 -o %s",
             tu_tmp("profile.h5"), tu_shared(MODEL), tu_shared(TEXT), tu_tmp("no-such-text.txt"),
             tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "no-such-text.txt"));
    free(out);
    FILE *f = fopen(tu_tmp("empty.list"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("# nothing here\n\n", f);
    fclose(f);
    snprintf(args, sizeof args, "search --profile %s --model %s --text-list %s --ratio 0.125 -o %s",
             tu_tmp("profile.h5"), tu_shared(MODEL), tu_tmp("empty.list"), tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "empty.list names no text"));
    free(out);
    snprintf(args, sizeof args,
             "search --profile %s --model %s --text %s --text-objective median --ratio 0.125 "
             "-o %s",
             tu_tmp("profile.h5"), tu_shared(MODEL), tu_shared(TEXT), tu_tmp("bad.h5"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "median"));
    free(out);
    f = fopen(tu_tmp("bad.h5"), "rb");
    CU_ASSERT_PTR_NULL(f); /* nothing written on errors */
    if (f) fclose(f);
    /* profile: the two texts are recorded, newline-joined */
    kv_h5 *h = NULL;
    kv_error e = {0};
    char *text = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(tu_tmp("profile.h5"), &h, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(h, "/", "text", &text, &e), KV_OK);
    kv_h5_close(h);
    CU_ASSERT_TRUE(text && strstr(text, "tinystories_val_head.txt\n"));
    CU_ASSERT_TRUE(text && strstr(text, "000_50e4c75caff53a63.txt"));
    free(text);
}

int main(int argc, char **argv) {
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    static const tu_test unit[] = {{"lay_out", test_lay_out},
                                   {"shipped_transfer", test_shipped_transfer}};
    static const tu_test cli[] = {{"two_texts", test_two_texts}, {"bad_texts", test_bad_texts}};
    static const tu_suite suites[] = {
        {"robust", NULL, NULL, unit, 2},
        {"robust_search", robust_init, NULL, cli, 2},
    };
    return tu_main_suites(argc, argv, suites, 2);
}
