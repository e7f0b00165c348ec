/* Tests of `kvplan inspect` (cli/cmd_inspect.c, cli/inspect_*.c): profile and plan files built here
 * with the h5io API in the docs/design.md schema (stories260K's shape: L = 5, H = 8, H_kv = 4),
 * then the text summary, the JSON round trip, the PNGs (decoded with libpng), the exports and every
 * bad-file case. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <hdf5.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/plan.h"
#include "testutil.h"

enum { L = 5, H = 8, HKV = 4, P = 3, T0 = 48, NT = 10, NR = 19, CTX = 128, BS = 16 };

static double importance[L][HKV];
static double layer_sim[L];
static int tokens[L][HKV];
static double ppl[NT][NR];
static double t_values[NT], r_values[NR];
static const int best_t = 4, best_r = 6, worst_t = 9, worst_r = 18;

/* stories260K's shape (L = 5 layers), no weights (tests/support/testutil.h) */
static void fake_model(kv_model *m) {
    char sha[65];
    snprintf(sha, sizeof sha, "%064d", 7);
    tu_fake_model(m, L, sha);
}

#define OK(call) CU_ASSERT_EQUAL_FATAL((call), KV_OK)

static void make_profile(const char *path) {
    kv_error err = {0};
    kv_h5 *f = NULL;
    kv_model m;
    fake_model(&m);
    OK(kv_h5_create(path, &f, &err));
    OK(kv_h5_write_provenance(f, "kvplan profile stories260K.bin", &m, &err));
    static double cos_mean[P][L][H], cos_var[P][L][H], sim[L][HKV], token_cos[L][H][T0];
    for (int p = 0; p < P; p++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                cos_mean[p][l][h] = 0.2 + 0.07 * ((h * 3 + l) % H) + 0.01 * p;
                cos_var[p][l][h] = 0.01 * (h + 1);
            }
    for (int l = 0; l < L; l++)
        for (int j = 0; j < HKV; j++) {
            double s = 0;
            for (int p = 0; p < P; p++)
                for (int h = 2 * j; h < 2 * j + 2; h++) s += (cos_mean[p][l][h] + 1) / 2;
            sim[l][j] = s / (2 * P);
            importance[l][j] = 1 - sim[l][j];
        }
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T0; t++)
                token_cos[l][h][t] = cos_mean[0][l][h] + 0.25 * sin(0.3 * t + h + l);
    long d3[3] = {P, L, H}, d2[2] = {L, HKV}, dt[3] = {L, H, T0};
    OK(kv_h5_write_f64(f, "/heads/cos_mean", 3, d3, &cos_mean[0][0][0], "cosine", &err));
    OK(kv_h5_write_f64(f, "/heads/cos_var", 3, d3, &cos_var[0][0][0], "cosine^2", &err));
    OK(kv_h5_write_f64(f, "/heads/similarity", 2, d2, &sim[0][0], NULL, &err));
    OK(kv_h5_write_f64(f, "/heads/importance", 2, d2, &importance[0][0], NULL, &err));
    OK(kv_h5_write_f64(f, "/heads/token_cos", 3, dt, &token_cos[0][0][0], "cosine", &err));
    double cos_attn[P][L], cos_block[P][L];
    for (int p = 0; p < P; p++)
        for (int l = 0; l < L; l++) {
            cos_attn[p][l] = 0.6 + 0.07 * l + 0.01 * p;
            cos_block[p][l] = 0.5 + 0.08 * l - 0.01 * p;
        }
    for (int l = 0; l < L; l++) layer_sim[l] = 0.61 + 0.07 * l;
    long dpl[2] = {P, L}, dl[1] = {L}, dpp[2] = {P, P}, dp[1] = {P};
    OK(kv_h5_write_f64(f, "/layers/cos_attn", 2, dpl, &cos_attn[0][0], "cosine", &err));
    OK(kv_h5_write_f64(f, "/layers/cos_block", 2, dpl, &cos_block[0][0], "cosine", &err));
    OK(kv_h5_write_f64(f, "/layers/similarity", 1, dl, layer_sim, "cosine", &err));
    double tau[P][P] = {{1, 0.8, 0.6}, {0.8, 1, 0.7}, {0.6, 0.7, 1}};
    OK(kv_h5_write_f64(f, "/consistency/kendall_tau", 2, dpp, &tau[0][0], NULL, &err));
    int lengths[P] = {48, 40, 44};
    OK(kv_h5_write_i32(f, "/prompts/lengths", 1, dp, lengths, "tokens", &err));
    int toks[132];
    for (int i = 0; i < 132; i++) toks[i] = (i * 37) % 512;
    long dtk[1] = {132};
    OK(kv_h5_write_i32(f, "/prompts/tokens", 1, dtk, toks, NULL, &err));
    /* /hardware as docs/hardware-schema.md */
    OK(kv_h5_attr_str(f, "/hardware", "kind", "cpu", &err));
    OK(kv_h5_attr_str(f, "/hardware", "device_name", "test host", &err));
    OK(kv_h5_attr_i64(f, "/hardware", "device_mem_bytes", 8L << 30, &err));
    double bytes[4] = {4096, 65536, 1048576, 16777216}, med[4], samples[4][2];
    for (int i = 0; i < 4; i++) {
        med[i] = 2e-6 + bytes[i] / 10e9;
        samples[i][0] = med[i];
        samples[i][1] = med[i] * 1.01;
    }
    long ds[1] = {4}, dsr[2] = {4, 2};
    OK(kv_h5_write_f64(f, "/hardware/copy_h2d/bytes", 1, ds, bytes, "bytes", &err));
    OK(kv_h5_write_f64(f, "/hardware/copy_h2d/median", 1, ds, med, "s", &err));
    OK(kv_h5_write_f64(f, "/hardware/copy_h2d/samples", 2, dsr, &samples[0][0], "s", &err));
    OK(kv_h5_attr_f64(f, "/hardware/copy_h2d", "bandwidth", 10e9, &err));
    OK(kv_h5_attr_f64(f, "/hardware/copy_h2d", "latency", 2e-6, &err));
    OK(kv_h5_attr_f64(f, "/hardware/copy_h2d", "r2", 0.9991, &err));
    /* the fit used the 3 sizes from 64 KiB up (docs/hardware-schema.md) */
    OK(kv_h5_attr_i64(f, "/hardware/copy_h2d", "fit_points", 3, &err));
    OK(kv_h5_attr_f64(f, "/hardware/copy_h2d", "fit_min_bytes", 65536, &err));
    OK(kv_h5_attr_f64(f, "/hardware/copy_h2d", "latency_stderr", 1.5e-7, &err));
    OK(kv_h5_attr_f64(f, "/hardware/copy_h2d", "bandwidth_stderr", 2e7, &err));
    int mm[2] = {64, 128}, nn[2] = {32, 32}, kk[2] = {64, 64};
    double fl[2] = {2e9, 4e9};
    long dg[1] = {2};
    OK(kv_h5_write_i32(f, "/hardware/gemm/m", 1, dg, mm, NULL, &err));
    OK(kv_h5_write_i32(f, "/hardware/gemm/n", 1, dg, nn, NULL, &err));
    OK(kv_h5_write_i32(f, "/hardware/gemm/k", 1, dg, kk, NULL, &err));
    OK(kv_h5_write_f64(f, "/hardware/gemm/flops_per_s", 1, dg, fl, "FLOP/s", &err));
    OK(kv_h5_write_f64(f, "/hardware/gemm/median", 1, dg, fl, "s", &err));
    OK(kv_h5_attr_f64(f, "/hardware/gemm", "peak_flops_per_s", 4e9, &err));
    OK(kv_h5_commit(f, &err));
}

static void make_plan(const char *path) {
    kv_error err = {0};
    kv_h5 *f = NULL;
    kv_model m;
    fake_model(&m);
    for (int l = 0; l < L; l++)
        for (int j = 0; j < HKV; j++) tokens[l][j] = (1 + (l + j) % 4) * BS;
    kv_plan b;
    OK(kv_plan_from_budgets(&m.cfg, &tokens[0][0], NULL, KV_POLICY_H2O, 0.25, CTX, BS, BS,
                            "baklava", 0.7, 0.35, NAN, 0, &b, &err));
    OK(kv_h5_create(path, &f, &err));
    OK(kv_h5_write_provenance(f, "kvplan search --ratio 0.25", &m, &err));
    OK(kv_plan_write(f, &b, &err));
    kv_plan_free(&b);
    for (int i = 0; i < NT; i++) t_values[i] = 0.5 + 0.05 * i;
    for (int j = 0; j < NR; j++) r_values[j] = 0.05 + 0.05 * j;
    for (int i = 0; i < NT; i++)
        for (int j = 0; j < NR; j++)
            ppl[i][j] = 20 + 0.5 * (i - best_t) * (i - best_t) + 0.2 * (j - best_r) * (j - best_r);
    ppl[worst_t][worst_r] = 200;
    ppl[0][0] = NAN;
    ppl[1][5] = NAN;
    long dt[1] = {NT}, dr[1] = {NR}, dg[2] = {NT, NR}, d3[1] = {3};
    OK(kv_h5_write_f64(f, "/search/t_values", 1, dt, t_values, NULL, &err));
    OK(kv_h5_write_f64(f, "/search/r_values", 1, dr, r_values, NULL, &err));
    OK(kv_h5_write_f64(f, "/search/perplexity", 2, dg, &ppl[0][0], "perplexity", &err));
    double base[3] = {18.5, 24.25, 22.75};
    OK(kv_h5_write_f64(f, "/search/baselines", 1, d3, base, "perplexity", &err));
    OK(kv_h5_attr_f64(f, "/search", "heldout_perplexity", 21.125, &err));
    double held[4] = {19.5, 18.0, 23.0, 21.0};
    long d4[1] = {4};
    OK(kv_h5_write_f64(f, "/search/heldout", 1, d4, held, "perplexity", &err));
    OK(kv_h5_attr_str(f, "/search/heldout", "names", "winner,full,uniform,squeeze", &err));
    /* /kvpr and /batch as docs/batch-sizing.md */
    OK(kv_h5_attr_f64(f, "/kvpr", "v_com", 32e9, &err));
    OK(kv_h5_attr_f64(f, "/kvpr", "v_gpu", 121e12, &err));
    OK(kv_h5_attr_str(f, "/kvpr", "schedule", "column", &err));
    int kb[2] = {1, 4}, ks[2] = {64, 128}, split_col[2][2] = {{0, 0}, {0, 0}},
        split_row[2][2] = {{64, 127}, {64, 127}};
    double tcol[2][2] = {{1e-6, 2e-6}, {4e-6, 8e-6}}, trow[2][2] = {{1e-8, 2e-8}, {4e-8, 8e-8}};
    long d2[1] = {2}, d22[2] = {2, 2};
    OK(kv_h5_write_i32(f, "/kvpr/batch", 1, d2, kb, "sequences", &err));
    OK(kv_h5_write_i32(f, "/kvpr/seq_len", 1, d2, ks, "tokens", &err));
    OK(kv_h5_write_i32(f, "/kvpr/split_column", 2, d22, &split_col[0][0], "tokens", &err));
    OK(kv_h5_write_i32(f, "/kvpr/split_row", 2, d22, &split_row[0][0], "tokens", &err));
    OK(kv_h5_write_f64(f, "/kvpr/time_column", 2, d22, &tcol[0][0], "s", &err));
    OK(kv_h5_write_f64(f, "/kvpr/time_row", 2, d22, &trow[0][0], "s", &err));
    OK(kv_h5_write_f64(f, "/kvpr/time_no_recompute", 2, d22, &tcol[0][0], "s", &err));
    OK(kv_h5_attr_str(f, "/batch", "rows", "full,decode_only,prefill_decode", &err));
    OK(kv_h5_attr_f64(f, "/batch", "mem_bw", 3e11, &err));
    int bt[3] = {7, 13, 21};
    double tps[3] = {1000.5, 2000.25, 4000.125};
    OK(kv_h5_write_i32(f, "/batch/max_batch", 1, d3, bt, "sequences", &err));
    OK(kv_h5_write_f64(f, "/batch/tokens_per_s", 1, d3, tps, "tokens/s", &err));
    OK(kv_h5_commit(f, &err));
}

static const char *profile_path(void) {
    static int made;
    const char *p = tu_tmp("profile.h5");
    if (!made) {
        make_profile(p);
        made = 1;
    }
    return p;
}

static const char *plan_path(void) {
    static int made;
    const char *p = tu_tmp("plan.h5");
    if (!made) {
        make_plan(p);
        made = 1;
    }
    return p;
}

static int run(char **out, const char *fmt, const char *a, const char *b) {
    char args[2048];
    snprintf(args, sizeof args, fmt, a, b);
    return tu_run_kvplan(args, out, 0);
}

static void test_text_profile(void) {
    char *out = NULL;
    int rc = run(&out, "inspect '%s'%s", profile_path(), "");
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "kvplan profile"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "stories260K.bin"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "H_kv 4 KV heads"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "3 prompts, 3 pairs: mean tau 0.7000, min 0.6000, max 0.8000"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "bandwidth    10.000 GB/s ± 0.02   latency     2.000 us "
                                       "± 0.15   R^2 0.9991"));
    /* which sizes the bandwidth fit used */
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "fit over 3 of 4 sizes, from fit_min_bytes = 64 KiB (65536)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "fitted: 64 KiB, 1 MiB, 16 MiB; not fitted: 1 smaller "
                                       "size from 4 KiB"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "peak      4.000 GFLOP/s"));
    /* layer 0: the most important KV head comes first */
    int order0 = 0;
    for (int j = 1; j < HKV; j++)
        if (importance[0][j] > importance[0][order0]) order0 = j;
    char want[64];
    snprintf(want, sizeof want, "layer  0  kv%-2d %.4f", order0, importance[0][order0]);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
    free(out);
}

static void test_text_plan(void) {
    char *out = NULL;
    int rc = run(&out, "inspect '%s'%s", plan_path(), "");
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "policy h2o, allocation baklava"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "188 of 190 cells evaluated"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "best   t 0.7  r 0.35  perplexity 20.0000"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "worst  t 0.95  r 0.95  perplexity 200.0000"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "full 18.5000, uniform 24.2500, squeeze 22.7500"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "heldout_perplexity = 21.125"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "held-out perplexity (text the search did not see): "
                                       "winner 19.5000, full 18.0000, uniform 23.0000, "
                                       "squeeze 21.0000"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "schedule = column"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "link v_com 32.000 GB/s, device v_gpu 121.000 TFLOP/s"));
    /* the KVPR table row for batch 4, s' = 128 */
    int found = 0;
    for (const char *line = out; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        double b, sq, lc, tc, lr, tr, tn;
        if (sscanf(line, " %lf %lf | %lf %lf | %lf %lf | %lf us", &b, &sq, &lc, &tc, &lr, &tr,
                   &tn) == 7 &&
            b == 4 && sq == 128) {
            found = 1;
            CU_ASSERT_DOUBLE_EQUAL(lc, 0, 0);
            CU_ASSERT_DOUBLE_EQUAL(tc, 8.0, 1e-9); /* microseconds */
            CU_ASSERT_DOUBLE_EQUAL(lr, 127, 0);
            CU_ASSERT_DOUBLE_EQUAL(tr, 0.08, 1e-9);
            CU_ASSERT_DOUBLE_EQUAL(tn, 8.0, 1e-9);
        }
    }
    CU_ASSERT_TRUE(found);
    /* the batch table: one row per case */
    const char *row = strstr(out, "  decode_only ");
    CU_ASSERT_PTR_NOT_NULL_FATAL(row);
    double mb = 0, tp = 0;
    CU_ASSERT_EQUAL(sscanf(row, " decode_only %lf %lf", &mb, &tp), 2);
    CU_ASSERT_DOUBLE_EQUAL(mb, 13, 0);
    CU_ASSERT_DOUBLE_EQUAL(tp, 2000.25, 1e-9);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "mem_bw = 3e+11"));
    free(out);
}

static const cJSON *jpath(const cJSON *o, const char *a, const char *b, const char *c) {
    o = cJSON_GetObjectItemCaseSensitive(o, a);
    if (o && b) o = cJSON_GetObjectItemCaseSensitive(o, b);
    if (o && c) o = cJSON_GetObjectItemCaseSensitive(o, c);
    return o;
}

static void test_json_profile(void) {
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json%s", profile_path(), ""), 0);
    cJSON *j = cJSON_Parse(out ? out : "");
    free(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "kind", NULL, NULL)), "profile");
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "attributes", "model_n_layers", NULL)->valuedouble, L, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "attributes", "schema_version", NULL)->valuedouble,
                           KV_SCHEMA_VERSION, 0);
    const cJSON *imp = jpath(j, "datasets", "/heads/importance", "data");
    CU_ASSERT_PTR_NOT_NULL_FATAL(imp);
    CU_ASSERT_EQUAL(cJSON_GetArraySize(imp), L);
    for (int l = 0; l < L; l++) {
        const cJSON *row = cJSON_GetArrayItem(imp, l);
        CU_ASSERT_EQUAL(cJSON_GetArraySize(row), HKV);
        for (int k = 0; k < HKV; k++)
            CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(row, k)->valuedouble, importance[l][k],
                                   1e-12);
    }
    const cJSON *tc = jpath(j, "datasets", "/heads/token_cos", "shape");
    CU_ASSERT_EQUAL(cJSON_GetArraySize(tc), 3);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(tc, 2)->valuedouble, T0, 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "datasets", "/heads/token_cos", "units")),
                           "cosine");
    /* summary: head order of every layer is by importance, descending */
    const cJSON *heads = jpath(j, "summary", "heads", NULL);
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(heads), L);
    for (int l = 0; l < L; l++) {
        const cJSON *e = cJSON_GetArrayItem(heads, l);
        const cJSON *ord = cJSON_GetObjectItem(e, "order");
        CU_ASSERT_EQUAL(cJSON_GetArraySize(ord), HKV);
        for (int k = 1; k < HKV; k++) {
            int a = cJSON_GetArrayItem(ord, k - 1)->valueint,
                b = cJSON_GetArrayItem(ord, k)->valueint;
            CU_ASSERT(importance[l][a] >= importance[l][b]);
        }
    }
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "summary", "consistency", "mean_tau")->valuedouble, 0.7, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(
        cJSON_GetArrayItem(jpath(j, "summary", "layer_similarity", NULL), 3)->valuedouble,
        layer_sim[3], 1e-12);
    const cJSON *fit = jpath(j, "summary", "hardware", "fits");
    CU_ASSERT_DOUBLE_EQUAL(jpath(fit, "copy_h2d", "bandwidth", NULL)->valuedouble, 10e9, 1);
    CU_ASSERT_DOUBLE_EQUAL(jpath(fit, "copy_h2d", "fit_points", NULL)->valuedouble, 3, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(fit, "copy_h2d", "fit_min_bytes", NULL)->valuedouble, 65536, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(fit, "copy_h2d", "latency_stderr", NULL)->valuedouble, 1.5e-7,
                           1e-20);
    const cJSON *fb = jpath(fit, "copy_h2d", "fitted_bytes", NULL);
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(fb), 3);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(fb, 0)->valuedouble, 65536, 0);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(fb, 2)->valuedouble, 16777216, 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "summary", "hardware", "kind")), "cpu");
    cJSON_Delete(j);
}

static void test_json_plan(void) {
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json%s", plan_path(), ""), 0);
    cJSON *j = cJSON_Parse(out ? out : "");
    free(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "kind", NULL, NULL)), "plan");
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "summary", "plan", "ratio")->valuedouble, 0.25, 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "summary", "plan", "policy")), "h2o");
    const cJSON *tk = jpath(j, "datasets", "/budget/tokens", "data");
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(tk), L);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < HKV; k++)
            CU_ASSERT_EQUAL(cJSON_GetArrayItem(cJSON_GetArrayItem(tk, l), k)->valueint,
                            tokens[l][k]);
    const cJSON *fr = jpath(j, "summary", "plan", "layer_fractions");
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(fr), L);
    for (int l = 0; l < L; l++) {
        double s = 0;
        for (int k = 0; k < HKV; k++) s += tokens[l][k];
        CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(fr, l)->valuedouble, s / (HKV * CTX), 1e-12);
    }
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "summary", "search", "evaluated")->valuedouble, NT * NR - 2, 0);
    const cJSON *best = jpath(j, "summary", "search", "best");
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(best, "t")->valuedouble, t_values[best_t], 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(best, "r")->valuedouble, r_values[best_r], 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(best, "perplexity")->valuedouble, 20, 1e-12);
    const cJSON *worst = jpath(j, "summary", "search", "worst");
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(worst, "perplexity")->valuedouble, 200, 1e-12);
    /* NaN cells are null */
    const cJSON *grid = jpath(j, "datasets", "/search/perplexity", "data");
    CU_ASSERT(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(grid, 0), 0)));
    CU_ASSERT(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(grid, 1), 5)));
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(cJSON_GetArrayItem(grid, 2), 3)->valuedouble,
                           ppl[2][3], 1e-12);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "groups", "/kvpr", "schedule")), "column");
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "summary", "search", "heldout")->child->valuedouble, 19.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(
        jpath(jpath(j, "summary", "search", "heldout"), "squeeze", NULL, NULL)->valuedouble, 21, 0);
    CU_ASSERT_DOUBLE_EQUAL(
        jpath(jpath(j, "summary", "search", "baselines"), "uniform", NULL, NULL)->valuedouble,
        24.25, 0);
    const cJSON *mbj = jpath(j, "datasets", "/batch/max_batch", "data");
    CU_ASSERT_EQUAL(cJSON_GetArrayItem(mbj, 2)->valueint, 21);
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "groups", "/search", "heldout_perplexity")->valuedouble, 21.125,
                           0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(j, "attributes", "model_sha256", NULL)),
                           "0000000000000000000000000000000000000000000000000000000000000007");
    cJSON_Delete(j);
}

/* Decode a PNG; returns 1 when it decodes with the given size and shows more than a few
 * colours (a real picture, not a blank canvas). */
static int check_png(const char *path, unsigned w, unsigned h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return 0;
    img.format = PNG_FORMAT_RGB;
    size_t n = PNG_IMAGE_SIZE(img);
    unsigned char *px = malloc(n);
    int ok = px && png_image_finish_read(&img, NULL, px, 0, NULL);
    if (!ok) {
        png_image_free(&img);
        free(px);
        return 0;
    }
    ok = img.width == w && img.height == h;
    /* count distinct colours among a sample */
    unsigned seen[64];
    int ns = 0;
    for (size_t i = 0; i + 2 < n && ns < 64; i += 3 * 97) {
        unsigned c = (unsigned)px[i] << 16 | (unsigned)px[i + 1] << 8 | px[i + 2];
        int dup = 0;
        for (int k = 0; k < ns; k++)
            if (seen[k] == c) dup = 1;
        if (!dup) seen[ns++] = c;
    }
    free(px);
    return ok && ns > 8;
}

static void test_png(void) {
    char *out = NULL;
    const char *dir = tu_tmp("png");
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --png '%s' > /dev/null 2>&1", profile_path(), dir), 0);
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --png '%s' > /dev/null 2>&1", plan_path(), dir), 0);
    free(out);
    const char *names[] = {"head_importance.png", "token_cos.png",         "layer_similarity.png",
                           "consistency.png",     "search_perplexity.png", "budget_tokens.png"};
    for (int i = 0; i < 6; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!check_png(p, 1200, 800)) fprintf(stderr, "bad picture %s\n", p);
        CU_ASSERT_TRUE(check_png(p, 1200, 800));
    }
}

static void test_export(void) {
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --export budgets-tsv%s", plan_path(), ""), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    int rows = 0;
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int cols = 0;
        char *s2 = NULL;
        for (char *c = strtok_r(line, "\t", &s2); c; c = strtok_r(NULL, "\t", &s2)) {
            if (rows < L && cols < HKV) CU_ASSERT_EQUAL(atoi(c), tokens[rows][cols]);
            cols++;
        }
        CU_ASSERT_EQUAL(cols, HKV);
        rows++;
    }
    CU_ASSERT_EQUAL(rows, L);
    free(out);

    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --export importance-tsv%s", profile_path(), ""), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    rows = 0;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int cols = 0;
        char *s2 = NULL;
        for (char *c = strtok_r(line, "\t", &s2); c; c = strtok_r(NULL, "\t", &s2)) {
            if (rows < L && cols < HKV)
                CU_ASSERT_DOUBLE_EQUAL(atof(c), importance[rows][cols], 1e-6);
            cols++;
        }
        CU_ASSERT_EQUAL(cols, HKV);
        rows++;
    }
    CU_ASSERT_EQUAL(rows, L);
    free(out);

    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --export layer-fractions%s", plan_path(), ""), 0);
    cJSON *a = cJSON_Parse(out ? out : "");
    free(out);
    CU_ASSERT_FATAL(cJSON_IsArray(a));
    CU_ASSERT_EQUAL(cJSON_GetArraySize(a), L);
    for (int l = 0; l < L && l < cJSON_GetArraySize(a); l++) {
        double s = 0;
        for (int k = 0; k < HKV; k++) s += tokens[l][k];
        CU_ASSERT_DOUBLE_EQUAL(cJSON_GetArrayItem(a, l)->valuedouble, s / (HKV * CTX), 1e-6);
    }
    cJSON_Delete(a);

    /* a profile has no budgets; a plan has no importance; unknown formats */
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --export budgets-tsv%s 2>&1", profile_path(), ""), 1);
    CU_ASSERT_TRUE(out && strstr(out, "/budget/tokens"));
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --export importance-tsv%s 2>&1", plan_path(), ""), 1);
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --export csv%s 2>&1", plan_path(), ""), 1);
    free(out);
}

static void test_bad_files(void) {
    char *out = NULL;
    /* missing */
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s 2>&1", tu_tmp("nothing.h5"), ""), 1);
    CU_ASSERT_TRUE(out && strstr(out, "nothing.h5"));
    free(out);
    /* not HDF5 */
    const char *txt = tu_tmp("notes.h5");
    FILE *fp = fopen(txt, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
    fputs("plain text\n", fp);
    fclose(fp);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s 2>&1", txt, ""), 1);
    CU_ASSERT_TRUE(out && strstr(out, "notes.h5") && strstr(out, "not an HDF5 file"));
    free(out);
    /* HDF5 of somebody else */
    const char *foreign = tu_tmp("foreign.h5");
    hid_t fid = H5Fcreate(foreign, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(fid >= 0);
    hsize_t d = 3;
    hid_t sp = H5Screate_simple(1, &d, NULL);
    hid_t ds = H5Dcreate2(fid, "/x", H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(fid);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json%s 2>&1", foreign, ""), 1);
    CU_ASSERT_TRUE(out && strstr(out, "foreign.h5") && strstr(out, "not one of kvplan"));
    free(out);
    /* newer schema */
    const char *newer = tu_tmp("newer.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    OK(kv_h5_create(newer, &f, &err));
    OK(kv_h5_write_provenance(f, "future", NULL, &err));
    OK(kv_h5_attr_i64(f, "/", "schema_version", KV_SCHEMA_VERSION + 1, &err));
    OK(kv_h5_commit(f, &err));
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --png '%s' 2>&1", newer, tu_tmp("png-newer")), 1);
    CU_ASSERT_TRUE(out && strstr(out, "newer.h5") && strstr(out, "newer"));
    free(out);
    /* usage errors */
    CU_ASSERT_EQUAL(run(&out, "inspect%s%s 2>&1", "", ""), 1);
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json --export budgets-tsv%s 2>&1", plan_path(), ""),
                    1);
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect --help%s%s", "", ""), 0);
    CU_ASSERT_TRUE(out && strstr(out, "budgets-tsv"));
    free(out);
}

/* Successive halving: cells screened on fewer chunks are not compared with the finalists. */
static void test_halving_grid(void) {
    const char *path = tu_tmp("halving.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    OK(kv_h5_create(path, &f, &err));
    OK(kv_h5_write_provenance(f, "kvplan search --halving 2", NULL, &err));
    OK(kv_h5_attr_f64(f, "/", "ratio", 0.5, &err));
    double tv[2] = {0.6, 0.8}, rv[2] = {0.1, 0.3};
    double pp[2][2] = {{3.0, 5.0}, {4.0, 4.5}};
    int ch[2][2] = {{1, 4}, {4, 4}};
    int tok[2] = {16, 32};
    long d2[1] = {2}, d22[2] = {2, 2}, db[2] = {1, 2};
    OK(kv_h5_write_i32(f, "/budget/tokens", 2, db, tok, "tokens", &err));
    OK(kv_h5_write_f64(f, "/search/t_values", 1, d2, tv, NULL, &err));
    OK(kv_h5_write_f64(f, "/search/r_values", 1, d2, rv, NULL, &err));
    OK(kv_h5_write_f64(f, "/search/perplexity", 2, d22, &pp[0][0], NULL, &err));
    OK(kv_h5_write_i32(f, "/search/chunks", 2, d22, &ch[0][0], "chunks", &err));
    OK(kv_h5_commit(f, &err));
    char *out = NULL;
    /* a plan fragment (no context_length, no /budget/blocks): shown, but inspect exits 1
     * because the plan module refuses it */
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s", path, ""), 1);
    CU_ASSERT_TRUE(out && strstr(out, "3 cells reached 4 chunks"));
    CU_ASSERT_TRUE(out && strstr(out, "best   t 0.8  r 0.1  perplexity 4.0000"));
    CU_ASSERT_TRUE(out && strstr(out, "worst  t 0.6  r 0.3  perplexity 5.0000"));
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json%s", path, ""), 1);
    cJSON *j = cJSON_Parse(out ? out : "");
    free(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_DOUBLE_EQUAL(jpath(j, "summary", "search", "cells_at_max_chunks")->valuedouble, 3, 0);
    const cJSON *best = jpath(j, "summary", "search", "best");
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(best, "perplexity")->valuedouble, 4.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(best, "t")->valuedouble, 0.8, 0);
    cJSON_Delete(j);
    /* the picture is still drawn */
    CU_ASSERT_EQUAL(
        run(&out, "inspect '%s' --png '%s' >/dev/null 2>&1", path, tu_tmp("png-halving")), 1);
    free(out);
    char png[600];
    snprintf(png, sizeof png, "%s/search_perplexity.png", tu_tmp("png-halving"));
    CU_ASSERT_TRUE(check_png(png, 1200, 800));
}

/* A SqueezeAttention p grid [2, G3T, G3R] with successive halving (like the shipped plans): p 0.5
 * was screened on 1 chunk only (its cells look better, 2.x, but are not comparable); p 1 has the
 * finalists on 8 chunks: best at (t 0.7, r 0.2), worst at (t 0.6, r 0.1); (0.8, 0.3) of p 1 was
 * never evaluated. */
enum { G3T = 4, G3R = 3 };
static const double g3_t[G3T] = {0.5, 0.6, 0.7, 0.8}, g3_r[G3R] = {0.1, 0.2, 0.3};
static const double g3_p[2] = {0.5, 1.0};

static void make_grid3(const char *path, const char *winner) {
    kv_error err = {0};
    kv_h5 *f = NULL;
    kv_model m;
    fake_model(&m);
    double pp[2][G3T][G3R];
    int ch[2][G3T][G3R];
    for (int i = 0; i < G3T; i++)
        for (int j = 0; j < G3R; j++) {
            pp[0][i][j] = 2.0 + 0.01 * (i * G3R + j);
            ch[0][i][j] = 1;
            pp[1][i][j] = 4.0 + 0.1 * i + 0.01 * j; /* screening figures on 3 chunks */
            ch[1][i][j] = 3;
        }
    pp[1][2][1] = 3.5, ch[1][2][1] = 8;  /* best finalist */
    pp[1][1][0] = 3.75, ch[1][1][0] = 8; /* worst finalist */
    pp[1][0][2] = 3.6, ch[1][0][2] = 8;
    pp[1][3][2] = NAN, ch[1][3][2] = 0;
    int tok[L][HKV], blk[L][HKV];
    for (int l = 0; l < L; l++)
        for (int j = 0; j < HKV; j++) blk[l][j] = 2, tok[l][j] = 2 * BS;
    int base = !strcmp(winner, "uniform");
    kv_plan b;
    OK(kv_plan_from_budgets(&m.cfg, &tok[0][0], NULL, KV_POLICY_SINK, 0.25, CTX, BS, BS,
                            base ? "uniform" : "baklava", base ? NAN : 0.7, base ? NAN : 0.2,
                            base ? NAN : 1.0, 0, &b, &err));
    (void)blk;
    OK(kv_h5_create(path, &f, &err));
    OK(kv_h5_write_provenance(f, "kvplan search --p-grid 0.5,1 --halving 3", &m, &err));
    OK(kv_plan_write(f, &b, &err));
    kv_plan_free(&b);
    long dt[1] = {G3T}, dr[1] = {G3R}, dp[1] = {2}, d3[3] = {2, G3T, G3R}, db[1] = {3}, dh[1] = {4};
    OK(kv_h5_write_f64(f, "/search/t_values", 1, dt, g3_t, "similarity", &err));
    OK(kv_h5_write_f64(f, "/search/r_values", 1, dr, g3_r, "fraction", &err));
    OK(kv_h5_write_f64(f, "/search/p_values", 1, dp, g3_p, "fraction", &err));
    OK(kv_h5_write_f64(f, "/search/perplexity", 3, d3, &pp[0][0][0], "perplexity", &err));
    OK(kv_h5_attr_str(f, "/search/perplexity", "dims", "p,t,r", &err));
    OK(kv_h5_write_i32(f, "/search/chunks", 3, d3, &ch[0][0][0], "chunks", &err));
    double bl[3] = {3.0, base ? 3.25 : 3.8, 4.5}, held[4] = {base ? 3.3 : 3.6, 3.1, 3.3, 4.6};
    OK(kv_h5_write_f64(f, "/search/baselines", 1, db, bl, "perplexity", &err));
    OK(kv_h5_write_f64(f, "/search/heldout", 1, dh, held, "perplexity", &err));
    OK(kv_h5_attr_str(f, "/search/heldout", "names", "winner,full,uniform,squeeze", &err));
    OK(kv_h5_attr_str(f, "/search", "method", "successive_halving", &err));
    OK(kv_h5_attr_f64(f, "/search", "best_perplexity", base ? 3.25 : 3.5, &err));
    OK(kv_h5_attr_i64(f, "/search", "best_chunks", 8, &err));
    OK(kv_h5_attr_str(f, "/search", "winner", winner, &err));
    OK(kv_h5_commit(f, &err));
}

/* Decoded RGB pixels of a PNG (caller frees), with its size. */
static unsigned char *read_png(const char *path, unsigned *w, unsigned *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return NULL;
    img.format = PNG_FORMAT_RGB;
    unsigned char *px = malloc(PNG_IMAGE_SIZE(img));
    if (!px || !png_image_finish_read(&img, NULL, px, 0, NULL)) {
        png_image_free(&img);
        free(px);
        return NULL;
    }
    *w = img.width;
    *h = img.height;
    return px;
}

static void test_grid3(void) {
    const char *path = tu_tmp("grid3.h5");
    make_grid3(path, "baklava");
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s", path, ""), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "perplexity grid 2 (p) x 4 (t) x 3 (r): 23 of 24 cells "
                                       "evaluated"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "successive halving: 3 cells reached 8 chunks"));
    /* best and worst among the finalists, not the lower screening figures of p 0.5 */
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "  best   p 1  t 0.7  r 0.2  perplexity 3.5000  (8 chunks)"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "  worst  p 1  t 0.6  r 0.1  perplexity 3.7500  (8 chunks)"));
    /* per p: p 0.5's own best is a screening figure on 1 chunk */
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "p 0.5    12 of 12 cells evaluated, 12 on its most chunks (1)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "      best   t 0.5  r 0.1  perplexity 2.0000  (1 chunk)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "      worst  t 0.8  r 0.3  perplexity 2.1100  (1 chunk)"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(out, "p 1      11 of 12 cells evaluated, 3 on its most chunks (8)"));
    /* the winner, in the plan block before the budgets */
    const char *w = strstr(out, ">> winner (/search@winner): baklava, the grid's best cell "
                                "(p 1, t 0.7, r 0.2): search perplexity 3.5000 on 8 chunks; "
                                "held-out 3.6000");
    CU_ASSERT_PTR_NOT_NULL(w);
    CU_ASSERT(w && strstr(out, "budgets B[l][j]") && w < strstr(out, "budgets B[l][j]"));
    free(out);

    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json%s", path, ""), 0);
    cJSON *j = cJSON_Parse(out ? out : "");
    free(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    const cJSON *sr = jpath(j, "summary", "search", NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(sr);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "np", NULL, NULL)->valuedouble, 2, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "evaluated", NULL, NULL)->valuedouble, 23, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "cells_at_max_chunks", NULL, NULL)->valuedouble, 3, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "best", "p", NULL)->valuedouble, 1.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "best", "t", NULL)->valuedouble, 0.7, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "best", "r", NULL)->valuedouble, 0.2, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "best", "perplexity", NULL)->valuedouble, 3.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "best", "chunks", NULL)->valuedouble, 8, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "worst", "perplexity", NULL)->valuedouble, 3.75, 0);
    const cJSON *per = jpath(sr, "per_p", NULL, NULL);
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(per), 2);
    const cJSON *p0 = cJSON_GetArrayItem(per, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(p0, "p", NULL, NULL)->valuedouble, 0.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(p0, "max_chunks", NULL, NULL)->valuedouble, 1, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(p0, "best", "perplexity", NULL)->valuedouble, 2.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(p0, "worst", "perplexity", NULL)->valuedouble, 2.11, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(jpath(cJSON_GetArrayItem(per, 1), "evaluated", NULL, NULL)->valuedouble,
                           11, 0);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(sr, "winner", "allocation", NULL)),
                           "baklava");
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(sr, "winner", "from", NULL)), "grid");
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "winner", "t", NULL)->valuedouble, 0.7, 0);
    CU_ASSERT_DOUBLE_EQUAL(jpath(sr, "winner", "heldout", NULL)->valuedouble, 3.6, 0);
    /* the map itself: datasets["/search/perplexity"].data[p][t][r], null where not evaluated */
    const cJSON *grid = jpath(j, "datasets", "/search/perplexity", "data");
    CU_ASSERT(
        cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetArrayItem(grid, 1), 3), 2)));
    cJSON_Delete(j);

    /* the picture: one 1200 x 800 PNG with a panel per p */
    const char *dir = tu_tmp("png-grid3");
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --png '%s' 2>&1 >/dev/null", path, dir), 0);
    CU_ASSERT_TRUE(out && strstr(out, "search_perplexity.png"));
    free(out);
    char png[600];
    snprintf(png, sizeof png, "%s/search_perplexity.png", dir);
    CU_ASSERT_TRUE(check_png(png, 1200, 800));
    /* two panels side by side: the middle row of the plot area crosses colour, then the white
     * gap between the panels, then colour again */
    unsigned pw = 0, ph = 0;
    unsigned char *px = read_png(png, &pw, &ph);
    CU_ASSERT_PTR_NOT_NULL_FATAL(px);
    CU_ASSERT_EQUAL(pw, 1200);
    CU_ASSERT_EQUAL(ph, 800);
    int runs = 0, in = 0;
    for (unsigned x = 100; x < 1040 && pw == 1200 && ph == 800; x++) {
        const unsigned char *c = px + (400u * pw + x) * 3;
        int white = c[0] > 250 && c[1] > 250 && c[2] > 250;
        if (!white && !in) runs++;
        in = !white;
    }
    CU_ASSERT_EQUAL(runs, 2);
    free(px);
}

/* A baseline that beat the grid is the winner, and the summary says so. */
static void test_grid3_baseline_winner(void) {
    const char *path = tu_tmp("grid3-uniform.h5");
    make_grid3(path, "uniform");
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s", path, ""), 0);
    CU_ASSERT_TRUE(out && strstr(out, ">> winner (/search@winner): uniform baseline, which "
                                      "beat the grid's best cell (p 1, t 0.7, r 0.2: "
                                      "perplexity 3.5000) on the same chunks: search "
                                      "perplexity 3.2500 on 8 chunks; held-out 3.3000"));
    CU_ASSERT_TRUE(out && strstr(out, "parameters: t unused"));
    free(out);
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --json%s", path, ""), 0);
    cJSON *j = cJSON_Parse(out ? out : "");
    free(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    const cJSON *win = jpath(j, "summary", "search", "winner");
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(jpath(win, "from", NULL, NULL)), "baseline");
    CU_ASSERT_DOUBLE_EQUAL(jpath(win, "perplexity", NULL, NULL)->valuedouble, 3.25, 0);
    CU_ASSERT_PTR_NULL(jpath(win, "t", NULL, NULL));
    cJSON_Delete(j);
    const char *dir = tu_tmp("png-grid3-uniform");
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --png '%s' >/dev/null 2>&1", path, dir), 0);
    free(out);
    char png[600];
    snprintf(png, sizeof png, "%s/search_perplexity.png", dir);
    CU_ASSERT_TRUE(check_png(png, 1200, 800));
}

/* squeeze searches p only: /search/perplexity [NP]. */
static void test_grid_p_only(void) {
    const char *path = tu_tmp("grid-p.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    OK(kv_h5_create(path, &f, &err));
    OK(kv_h5_write_provenance(f, "kvplan search --allocation squeeze", NULL, &err));
    OK(kv_h5_attr_f64(f, "/", "ratio", 0.5, &err));
    double pv[3] = {0.25, 0.5, 1.0}, pp[3] = {4.5, 4.25, 4.75};
    int tok[2] = {16, 32};
    long d3[1] = {3}, db[2] = {1, 2};
    OK(kv_h5_write_i32(f, "/budget/tokens", 2, db, tok, "tokens", &err));
    OK(kv_h5_write_f64(f, "/search/p_values", 1, d3, pv, NULL, &err));
    OK(kv_h5_write_f64(f, "/search/perplexity", 1, d3, pp, NULL, &err));
    OK(kv_h5_attr_str(f, "/search", "winner", "squeeze", &err));
    OK(kv_h5_commit(f, &err));
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s", path, ""), 1); /* a plan fragment: exit 1 */
    CU_ASSERT_TRUE(out && strstr(out, "perplexity grid 3 (p): 3 of 3 cells evaluated"));
    CU_ASSERT_TRUE(out && strstr(out, "best   p 0.5  perplexity 4.2500"));
    CU_ASSERT_TRUE(out && strstr(out, "worst  p 1  perplexity 4.7500"));
    CU_ASSERT_TRUE(out && strstr(out, "winner (/search@winner): squeeze, the grid's best "
                                      "cell (p 0.5)"));
    free(out);
    const char *dir = tu_tmp("png-grid-p");
    CU_ASSERT_EQUAL(run(&out, "inspect '%s' --png '%s' >/dev/null 2>&1", path, dir), 1);
    free(out);
    char png[600];
    snprintf(png, sizeof png, "%s/search_perplexity.png", dir);
    CU_ASSERT_TRUE(check_png(png, 1200, 800));
}

/* A kvplan file that is neither a profile nor a plan is shown generically. */
static void test_generic_file(void) {
    const char *path = tu_tmp("other.h5");
    kv_error err = {0};
    kv_h5 *f = NULL;
    OK(kv_h5_create(path, &f, &err));
    OK(kv_h5_write_provenance(f, "something", NULL, &err));
    double v[2] = {1.5, 2.5};
    long d[1] = {2};
    OK(kv_h5_write_f64(f, "/misc/values", 1, d, v, "widgets", &err));
    OK(kv_h5_commit(f, &err));
    char *out = NULL;
    CU_ASSERT_EQUAL(run(&out, "inspect '%s'%s", path, ""), 0);
    CU_ASSERT_TRUE(out && strstr(out, "/misc/values [2] (widgets)"));
    CU_ASSERT_TRUE(out && strstr(out, "1.5  2.5"));
    free(out);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"text summary of a profile", test_text_profile},
        {"text summary of a plan", test_text_plan},
        {"JSON round trip of a profile", test_json_profile},
        {"JSON round trip of a plan", test_json_plan},
        {"PNG pictures decode with the expected size", test_png},
        {"exports: budgets and importance TSV, layer fractions", test_export},
        {"bad files and usage errors", test_bad_files},
        {"successive-halving grid", test_halving_grid},
        {"[NP, NT, NR] grid: best p/t/r, per p, winner, one panel per p", test_grid3},
        {"a baseline that beat the grid is the winner", test_grid3_baseline_winner},
        {"a p-only [NP] grid", test_grid_p_only},
        {"a generic kvplan file", test_generic_file},
    };
    return tu_main(argc, argv, "inspect", tests, sizeof tests / sizeof tests[0]);
}
