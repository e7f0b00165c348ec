/* The plan module (kvplan/plan.h): the one definition of uniform, round trips of schema v2
 * (per-head policies) and v1 files, and validation in one place: plans that claim what they do
 * not keep, inconsistent or hostile datasets, plans without a model identity, another model. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/alloc.h"
#include "kvplan/eval.h"
#include "kvplan/plan.h"
#include "testutil.h"

static const char *SHA_A = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
static const char *SHA_B = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/* Budgets 32, 48, 64 tokens (2-4 blocks), ratio = what they keep, per-head policies. */
static void make_plan(const kv_model *m, kv_plan *p) {
    kv_error err = {0};
    int tok[20];
    kv_policy pol[20];
    long sum = 0;
    for (int i = 0; i < 20; i++) {
        tok[i] = 16 * (2 + i % 3);
        pol[i] = (kv_policy)(i % 4);
        sum += tok[i];
    }
    CU_ASSERT_EQUAL_FATAL(kv_plan_from_budgets(&m->cfg, tok, pol, KV_POLICY_H2O,
                                               (double)sum / (20.0 * 256), 256, 16, 16, "baklava",
                                               0.7, 0.35, NAN, 20, p, &err),
                          KV_OK);
}

static int write_plan(const char *path, const kv_model *m, const kv_plan *p, kv_error *err) {
    kv_h5 *f = NULL;
    int rc = kv_h5_create(path, &f, err);
    if (!rc) rc = kv_h5_write_provenance(f, "kvplan search", m, err);
    if (!rc) rc = kv_plan_write(f, p, err);
    if (!rc) return kv_h5_commit(f, err);
    kv_h5_abort(f);
    return rc;
}

static void test_round_trip_and_model_check(void) {
    const char *path = tu_tmp("plan.h5");
    kv_error err = {0};
    kv_model m;
    tu_fake_model(&m, 5, SHA_A);
    kv_plan p, b;
    make_plan(&m, &p);
    CU_ASSERT_EQUAL_FATAL(write_plan(path, &m, &p, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(path, &b, &err), KV_OK);
    CU_ASSERT_EQUAL(b.schema_version, 3);
    CU_ASSERT_EQUAL(b.n_layers, 5);
    CU_ASSERT_EQUAL(b.n_kv_heads, 4);
    CU_ASSERT_EQUAL(b.context, 256);
    CU_ASSERT_EQUAL(b.block_size, 16);
    CU_ASSERT_EQUAL(b.evict_block, 16);
    CU_ASSERT_DOUBLE_EQUAL(b.ratio, p.ratio, 0.0);
    CU_ASSERT_EQUAL(b.policy, KV_POLICY_H2O);
    CU_ASSERT_STRING_EQUAL(b.allocation, "baklava");
    CU_ASSERT_DOUBLE_EQUAL(b.t, 0.7, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(b.r, 0.35, 0.0);
    CU_ASSERT(isnan(b.p));
    CU_ASSERT_EQUAL(b.min_tokens, 20);
    CU_ASSERT_STRING_EQUAL(b.model_sha256, SHA_A);
    CU_ASSERT_EQUAL(b.model_dim, 64);
    CU_ASSERT_EQUAL(b.model_vocab_size, 512);
    for (int i = 0; i < 20; i++) {
        CU_ASSERT_EQUAL(b.budget[i], 16 * (2 + i % 3));
        CU_ASSERT_EQUAL(kv_plan_head_blocks(&b, i), 2 + i % 3);
        CU_ASSERT_EQUAL(b.head_policy[i], (kv_policy)(i % 4));
    }
    CU_ASSERT(kv_plan_mixed_policies(&b));
    CU_ASSERT_EQUAL(kv_plan_check_model(&b, &m, &err), KV_OK);
    kv_model other;
    tu_fake_model(&other, 6, SHA_A);
    CU_ASSERT_EQUAL(kv_plan_check_model(&b, &other, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "plan.h5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "n_layers"));
    tu_fake_model(&other, 5, SHA_A);
    other.cfg.vocab_size = 32000;
    CU_ASSERT_EQUAL(kv_plan_check_model(&b, &other, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "vocab_size"));
    tu_fake_model(&other, 5, SHA_B);
    CU_ASSERT_EQUAL(kv_plan_check_model(&b, &other, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "model_sha256"));
    kv_plan_free(&b);
    CU_ASSERT_PTR_NULL(b.budget);
    kv_plan_free(&b); /* twice is harmless */
    /* a plan that does not name its model is refused when run */
    kv_model anon = m;
    anon.sha256[0] = 0;
    CU_ASSERT_EQUAL_FATAL(write_plan(tu_tmp("anon.h5"), &anon, &p, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(tu_tmp("anon.h5"), &b, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_plan_check_model(&b, &m, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "anon.h5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "model_sha256"));
    kv_plan_free(&b);
    kv_plan_free(&p);
    /* a kvplan file that is not a plan */
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(tu_tmp("prov.h5"), &f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "test", &m, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_plan_read(tu_tmp("prov.h5"), &b, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/budget"));
}

/* A schema v1 plan (as plans were before schema 2: no /budget/policy, and before schema 3 no
 * /budget/kv_type; the shipped plans were such files until issues 13 and 24 re-made them): one
 * policy for all heads, f32 heads, still readable. Made here from a uniform 1/8 plan (b_s 8,
 * p 2) with those datasets removed. */
static void test_v1_plan(void) {
    kv_error err = {0};
    kv_model m;
    tu_fake_model(&m, 5, SHA_A);
    kv_plan u, b;
    CU_ASSERT_EQUAL_FATAL(kv_plan_uniform(&m.cfg, 0.125, 512, 8, 2, KV_POLICY_SINK, &u, &err),
                          KV_OK);
    CU_ASSERT_EQUAL_FATAL(write_plan(tu_tmp("v1.h5"), &m, &u, &err), KV_OK);
    hid_t f = H5Fopen(tu_tmp("v1.h5"), H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    CU_ASSERT(H5Ldelete(f, "/budget/policy", H5P_DEFAULT) >= 0);
    CU_ASSERT(H5Ldelete(f, "/budget/kv_type", H5P_DEFAULT) >= 0);
    H5Fclose(f);
    /* with the datasets gone the checksum no longer matches: refused */
    CU_ASSERT_EQUAL(kv_plan_read(tu_tmp("v1.h5"), &b, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "does not match its SHA-256"));
    /* a real v1 file has no checksum either */
    f = H5Fopen(tu_tmp("v1.h5"), H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    CU_ASSERT(H5Adelete_by_name(f, "/budget", "sha256", H5P_DEFAULT) >= 0);
    H5Fclose(f);
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(tu_tmp("v1.h5"), &b, &err), KV_OK);
    CU_ASSERT_EQUAL(b.budget_sha256, 0);
    CU_ASSERT_EQUAL(b.schema_version, 1);
    CU_ASSERT_EQUAL(b.policy, KV_POLICY_SINK);
    CU_ASSERT_FALSE(kv_plan_mixed_policies(&b));
    CU_ASSERT_EQUAL(b.kv_type[0], KV_TYPE_F32);
    CU_ASSERT_EQUAL(b.block_size, 8);
    CU_ASSERT_EQUAL(b.evict_block, 2);
    /* exactly 1/8 of 5 x 4 heads x 512 tokens, twice that in bytes of the F16 cache (f32) */
    CU_ASSERT_EQUAL(kv_plan_total_tokens(&b), 5 * 4 * 512 / 8);
    CU_ASSERT_DOUBLE_EQUAL(b.ratio, 0.25, 1e-12);
    kv_plan_free(&b);
    kv_plan_free(&u);
}

/* Rewrite one dataset of a good plan with float64 values (so fractions and NaN survive). */
static void corrupt(const char *src, const char *dst, const char *dset, int index, double value) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    hid_t f = H5Fopen(dst, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    double v[20];
    hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
    CU_ASSERT_FATAL(d >= 0);
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(d);
    H5Ldelete(f, dset, H5P_DEFAULT);
    v[index] = value;
    hsize_t dims[2] = {5, 4};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    d = H5Dcreate2(f, dset, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
}

static void set_attr_f64(const char *path, const char *name, double v) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    H5Fclose(f);
}

static void expect_refused(const char *path, const char *what) {
    kv_error err = {0};
    kv_plan b;
    CU_ASSERT_EQUAL(kv_plan_read(path, &b, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
    if (!strstr(err.msg, what)) fprintf(stderr, "\n  expected '%s' in: %s\n", what, err.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, what));
    CU_ASSERT_PTR_NULL(b.budget);
}

/* Plans are checked against what they claim, each error naming the file. */
static void test_validation(void) {
    kv_error err = {0};
    kv_model m;
    tu_fake_model(&m, 5, SHA_A);
    kv_plan p;
    make_plan(&m, &p);
    const char *good = tu_tmp("good.h5");
    CU_ASSERT_EQUAL_FATAL(write_plan(good, &m, &p, &err), KV_OK);
    kv_plan_free(&p);
    const char *bad = tu_tmp("bad.h5");
    corrupt(good, bad, "/budget/tokens", 3, 5120); /* > C */
    expect_refused(bad, "too large; allowed [1, 256]");
    corrupt(good, bad, "/budget/tokens", 3, 2147483647.0);
    expect_refused(bad, "too large");
    corrupt(good, bad, "/budget/tokens", 3, 1e12);
    expect_refused(bad, "too large");
    corrupt(good, bad, "/budget/tokens", 3, 40.5);
    expect_refused(bad, "not a whole number");
    corrupt(good, bad, "/budget/tokens", 3, NAN);
    expect_refused(bad, "not a number");
    corrupt(good, bad, "/budget/tokens", 3, -16);
    expect_refused(bad, "too small");
    /* inspect shows such a plan but exits 1, naming the file and the head */
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "inspect '%s'", bad);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "layer 0 KV head 3"));
    free(out);
    /* and so does eval --plan: no run on a plan that claims what it does not keep */
    snprintf(args, sizeof args, "eval '%s' --text '%s' --plan '%s' --context 256 --quiet",
             tu_shared("models/stories260K/stories260K.bin"),
             tu_shared("text/tinystories_val_head.txt"), bad);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, bad));
    free(out);
    corrupt(good, bad, "/budget/blocks", 0, 0); /* blocks must agree with tokens */
    expect_refused(bad, "too small");
    corrupt(good, bad, "/budget/blocks", 0, 3);
    expect_refused(bad, "inconsistent");
    corrupt(good, bad, "/budget/policy", 0, 7);
    expect_refused(bad, "/budget/policy");
    /* a ratio the budgets do not keep (they keep 960 / 5120 = 0.1875) */
    corrupt(good, bad, "/budget/tokens", 0, 32);
    set_attr_f64(bad, "ratio", 0.5);
    expect_refused(bad, "does not keep the ratio");
    set_attr_f64(bad, "ratio", NAN);
    expect_refused(bad, "ratio");
    /* a budget below the policy's floor: sink needs 4 + p */
    int tok[20];
    for (int i = 0; i < 20; i++) tok[i] = 16;
    CU_ASSERT_EQUAL(kv_plan_from_budgets(&m.cfg, tok, NULL, KV_POLICY_SINK, 16.0 / 256, 256, 16, 16,
                                         "x", NAN, NAN, NAN, 0, &p, &err),
                    KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "sink"));
}

/* Uniform at R is defined once: eval --ratio, kvplan plan --allocation uniform and the search
 * baseline all get kv_uniform_budgets. */
static void test_uniform_defined_once(void) {
    kv_error err = {0};
    kv_model m;
    tu_fake_model(&m, 5, SHA_A);
    const double ratios[] = {0.3, 0.2, 0.125, 0.0625, 0.71};
    for (size_t k = 0; k < sizeof ratios / sizeof ratios[0]; k++) {
        kv_plan u;
        CU_ASSERT_EQUAL_FATAL(
            kv_plan_uniform(&m.cfg, ratios[k], 512, 16, 4, KV_POLICY_SINK, &u, &err), KV_OK);
        kv_alloc_params a;
        kv_alloc_params_default(&a);
        a.kind = KV_ALLOC_UNIFORM;
        a.ratio = ratios[k];
        a.context = 512;
        a.block_size = 16;
        a.min_tokens = 8;
        int tok[20], blk[20];
        CU_ASSERT_EQUAL_FATAL(kv_plan_budgets(&a, 5, 4, NULL, NULL, NULL, tok, blk, NULL, &err),
                              KV_OK);
        long sum = 0;
        int lo = 1 << 30, hi = 0;
        for (int i = 0; i < 20; i++) {
            CU_ASSERT_EQUAL(tok[i], u.budget[i]);
            CU_ASSERT_EQUAL(blk[i], kv_plan_head_blocks(&u, i));
            sum += u.budget[i];
            lo = u.budget[i] < lo ? u.budget[i] : lo;
            hi = u.budget[i] > hi ? u.budget[i] : hi;
        }
        /* the exact-sum rounding: floor(R L H C / b_s) blocks, heads one block apart at most */
        CU_ASSERT_EQUAL(sum, (long)floor(ratios[k] * 20 * 512 / 16 + 1e-9) * 16);
        CU_ASSERT(hi - lo <= 16);
        kv_plan_free(&u);
    }
    /* R = 0.3 of 512: 153.6 tokens a head -> 9.6 blocks: 12 heads get 10, 8 get 9 */
    kv_plan u;
    CU_ASSERT_EQUAL_FATAL(kv_plan_uniform(&m.cfg, 0.3, 512, 16, 4, KV_POLICY_SINK, &u, &err),
                          KV_OK);
    int n160 = 0;
    for (int i = 0; i < 20; i++) n160 += u.budget[i] == 160;
    CU_ASSERT_EQUAL(n160, 12);
    kv_plan_free(&u);
    /* a ratio below the policy's floor says which ratio to pass */
    CU_ASSERT_EQUAL(kv_plan_uniform(&m.cfg, 0.01, 512, 16, 16, KV_POLICY_SINK, &u, &err),
                    KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--ratio >="));
    CU_ASSERT_EQUAL(kv_plan_uniform(&m.cfg, 1.5, 512, 16, 16, KV_POLICY_SINK, &u, &err), KV_EINPUT);
}

/* The CLI: eval --ratio R --allocation uniform and a planner uniform plan at R run the same
 * budgets, so they give the same perplexity and bytes (the stories260K model, real text). */
static void test_eval_ratio_equals_uniform_plan(void) {
    char args[4096], *a = NULL, *b = NULL;
    const char *model = tu_shared("models/stories260K/stories260K.bin");
    const char *text = tu_shared("text/tinystories_val_head.txt");
    snprintf(args, sizeof args,
             "plan --model '%s' --ratio 0.3 --allocation uniform --context 256 --evict-block 4 "
             "--block-size 16 --quiet -o %s",
             model, tu_tmp("u.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    snprintf(args, sizeof args,
             "eval '%s' --text '%s' --context 256 --max-tokens 2048 --plan %s --json --quiet",
             model, text, tu_tmp("u.h5"));
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &a, 0), 0);
    snprintf(args, sizeof args,
             "eval '%s' --text '%s' --context 256 --max-tokens 2048 --ratio 0.3 --allocation "
             "uniform --evict-block 4 --block-size 16 --json --quiet",
             model, text);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &b, 0), 0);
    const char *ja = a ? strrchr(a, '{') : NULL, *jb = b ? strrchr(b, '{') : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(ja);
    CU_ASSERT_PTR_NOT_NULL_FATAL(jb);
    double pa = atof(strstr(ja, "\"perplexity\":") + 13),
           pb = atof(strstr(jb, "\"perplexity\":") + 13);
    double ka = atof(strstr(ja, "\"kv_bytes_peak\":") + 16),
           kb = atof(strstr(jb, "\"kv_bytes_peak\":") + 16);
    CU_ASSERT_DOUBLE_EQUAL(pa, pb, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(ka, kb, 0.0);
    CU_ASSERT(pa > 1.0 && isfinite(pa));
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"plan round trip (v2, per-head policies) and model check",
         test_round_trip_and_model_check},
        {"v1 plans stay readable", test_v1_plan},
        {"plans are validated against what they claim", test_validation},
        {"uniform at R is defined once", test_uniform_defined_once},
        {"eval --ratio uniform equals a uniform plan", test_eval_ratio_equals_uniform_plan},
    };
    return tu_main(argc, argv, "plan", tests, sizeof tests / sizeof tests[0]);
}
