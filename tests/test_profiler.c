/* Profiler tests on the real models: head cos against the naive reference, grouping and
 * importance, consistency matrices, the profile command's file, determinism and bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvplan/h5io.h"
#include "kvplan/profiler.h"
#include "kvplan/tokenizer.h"
#include "naive_ref.h"
#include "testutil.h"

#define MODEL "models/stories260K/stories260K.bin"
#define TEXT "text/tinystories_val_head.txt"

static int *stream_of(kv_model *m, int *n) {
    kv_tokenizer *t = NULL;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_tokenizer_load(NULL, m, &t, &err) == KV_OK);
    char *text = NULL;
    size_t len = 0;
    CU_ASSERT_FATAL(kv_read_file(tu_shared(TEXT), &text, &len, &err) == KV_OK);
    if (len > 60000) text[len = 60000] = 0;
    int *ids = NULL;
    CU_ASSERT_FATAL(kv_tokenizer_encode(t, text, len, 1, &ids, n, &err) == KV_OK);
    free(text);
    kv_tokenizer_free(t);
    return ids;
}

static double dcos(const double *a, const double *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / sqrt(aa * bb);
}

static void check_model(const char *rel) {
    kv_model *m = NULL;
    kv_error err = {0};
    int rc = kv_model_load(tu_shared(rel), &m, &err);
    if (rc) fprintf(stderr, "\n%s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
    int n = 0, *stream = stream_of(m, &n);
    const int P = 3, T = 64;
    int prompts[3 * 64];
    CU_ASSERT_FATAL(kv_profile_pick_prompts(stream, n, 1, P, T, 7, prompts, &err) == KV_OK);
    for (int i = 0; i < P; i++) CU_ASSERT_EQUAL(prompts[i * T], 1);
    kv_profile pr;
    /* f32: the naive reference keeps K/V in double, so the cache must not round them (the
     * default f16 cache moves head cos by up to 0.01 on stories260K, 1.2e-3 on 656K) */
    CU_ASSERT_FATAL(
        kv_profile_run(m, prompts, P, T, KV_DEVICE_CPU, 0, KV_TYPE_F32, &pr, NULL, &err) == KV_OK);
    const kv_config *c = &m->cfg;
    int L = c->n_layers, H = c->n_heads, Hk = c->n_kv_heads, hd = c->head_dim, D = c->dim;
    int g = H / Hk;
    tu_capture cap;
    size_t lt = (size_t)L * T;
    cap.x_in = malloc(lt * D * sizeof(double));
    cap.attn_out = malloc(lt * D * sizeof(double));
    cap.x_out = malloc(lt * D * sizeof(double));
    cap.o = malloc(lt * H * hd * sizeof(double));
    cap.v = malloc(lt * Hk * hd * sizeof(double));
    double max_err = 0, max_lerr = 0;
    for (int p = 0; p < P; p++) {
        tu_naive_forward(m, prompts + p * T, T, NULL, &cap);
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < H; h++) {
                double s = 0, s2 = 0;
                for (int t = 0; t < T; t++) {
                    double cs = dcos(cap.v + ((size_t)l * T + t) * Hk * hd + (h / g) * hd,
                                     cap.o + ((size_t)l * T + t) * H * hd + h * hd, hd);
                    s += cs, s2 += cs * cs;
                    if (p == 0) {
                        double e = fabs(cs - pr.token_cos[((size_t)l * H + h) * T + t]);
                        if (e > max_err) max_err = e;
                    }
                }
                double mean = s / T, var = s2 / T - mean * mean;
                double e = fabs(mean - pr.cos_mean[((size_t)p * L + l) * H + h]);
                if (e > max_err) max_err = e;
                e = fabs(var - pr.cos_var[((size_t)p * L + l) * H + h]);
                if (e > max_err) max_err = e;
            }
            double sa = 0, sb = 0;
            for (int t = 0; t < T; t++) {
                double *x = cap.x_in + ((size_t)l * T + t) * D, y[4096];
                for (int i = 0; i < D; i++) y[i] = x[i] + cap.attn_out[((size_t)l * T + t) * D + i];
                sa += dcos(x, y, D);
                sb += dcos(x, cap.x_out + ((size_t)l * T + t) * D, D);
            }
            double e1 = fabs(sa / T - pr.cos_attn[p * L + l]),
                   e2 = fabs(sb / T - pr.cos_block[p * L + l]);
            if (e1 > max_lerr) max_lerr = e1;
            if (e2 > max_lerr) max_lerr = e2;
        }
    }
    printf("\n    %s: max |naive - profiler| head cos %.2g, layer cos %.2g\n", rel, max_err,
           max_lerr);
    CU_ASSERT(max_err <= 1e-5);
    CU_ASSERT(max_lerr <= 1e-5);
    /* grouping: similarity = mean over prompts and the group of (cos_mean + 1) / 2 */
    for (int l = 0; l < L; l++)
        for (int j = 0; j < Hk; j++) {
            double s = 0;
            for (int p = 0; p < P; p++)
                for (int k = 0; k < g; k++)
                    s += (pr.cos_mean[((size_t)p * L + l) * H + j * g + k] + 1) / 2;
            s /= P * g;
            CU_ASSERT_DOUBLE_EQUAL(pr.similarity[l * Hk + j], s, 1e-12);
            CU_ASSERT_DOUBLE_EQUAL(pr.importance[l * Hk + j], 1.0 - s, 1e-12);
            CU_ASSERT(s >= 0.0 && s <= 1.0);
        }
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            CU_ASSERT_DOUBLE_EQUAL(pr.kendall_tau[a * P + b], pr.kendall_tau[b * P + a], 1e-15);
            CU_ASSERT(fabs(pr.kendall_tau[a * P + b]) <= 1.0);
            CU_ASSERT(fabs(pr.spearman_rho[a * P + b]) <= 1.0 + 1e-12);
            if (a == b) CU_ASSERT_DOUBLE_EQUAL(pr.kendall_tau[a * P + b], 1.0, 0);
        }
    free(cap.x_in), free(cap.attn_out), free(cap.x_out), free(cap.o), free(cap.v);
    kv_profile_free(&pr);
    free(stream);
    kv_model_free(m);
}

static void test_head_cos_stories260k(void) {
    check_model(MODEL);
}

static void test_head_cos_656k(void) {
    check_model("models/tinystories-656k");
}

static void test_kendall(void) {
    double a[] = {1, 2, 3, 4, 5}, b[] = {5, 4, 3, 2, 1}, c[] = {1, 3, 2, 4, 5};
    CU_ASSERT_DOUBLE_EQUAL(kv_kendall_tau(a, a, 5), 1.0, 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(kv_kendall_tau(a, b, 5), -1.0, 1e-15);
    /* one discordant pair of 10: (9 - 1) / 10 */
    CU_ASSERT_DOUBLE_EQUAL(kv_kendall_tau(a, c, 5), 0.8, 1e-15);
}

static int datasets_equal(const char *p1, const char *p2, const char *ds) {
    kv_h5 *a = NULL, *b = NULL;
    kv_error err = {0};
    if (kv_h5_open_read(p1, &a, &err) || kv_h5_open_read(p2, &b, &err)) return 0;
    int ra, rb;
    long da[KV_H5_MAX_RANK], db[KV_H5_MAX_RANK];
    double *x = NULL, *y = NULL;
    int ok = !kv_h5_read_f64(a, ds, &ra, da, &x, &err) &&
             !kv_h5_read_f64(b, ds, &rb, db, &y, &err) && ra == rb;
    size_t n = 1;
    for (int i = 0; ok && i < ra; i++) ok = da[i] == db[i], n *= (size_t)da[i];
    if (ok) ok = memcmp(x, y, n * sizeof *x) == 0;
    free(x), free(y);
    kv_h5_close(a);
    kv_h5_close(b);
    return ok;
}

static void test_profile_command(void) {
    char args[4096], *out = NULL;
    const char *p1 = tu_tmp("p1.h5"), *p2 = tu_tmp("p2.h5");
    snprintf(args, sizeof args, "profile '%s' --prompts 4 --prompt-len 128 --no-hw --quiet -o %s",
             tu_shared(MODEL), p1);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    snprintf(args, sizeof args, "profile '%s' --prompts 4 --prompt-len 128 --no-hw --quiet -o %s",
             tu_shared(MODEL), p2);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    const char *ds[] = {
        "/heads/cos_mean",           "/heads/cos_var",     "/heads/similarity",
        "/heads/importance",         "/heads/token_cos",   "/layers/cos_attn",
        "/layers/cos_block",         "/layers/similarity", "/consistency/kendall_tau",
        "/consistency/spearman_rho", "/prompts/tokens",    "/prompts/lengths"};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        int same = datasets_equal(p1, p2, ds[i]);
        if (!same) printf("\n    differs: %s\n", ds[i]);
        CU_ASSERT(same);
    }
    /* h5dump reads it */
    snprintf(args, sizeof args, "h5dump -H %s > /dev/null 2>&1", p1);
    CU_ASSERT_EQUAL(system(args), 0);
    /* provenance */
    kv_h5 *f = NULL;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_h5_open_read(p1, &f, &err) == KV_OK);
    char *sha = NULL;
    CU_ASSERT_FATAL(kv_h5_read_attr_str(f, "/", "model_sha256", &sha, &err) == KV_OK);
    CU_ASSERT_STRING_EQUAL(sha, "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696");
    free(sha);
    kv_h5_close(f);
    /* with a quick hardware probe the /hardware group is there */
    const char *p3 = tu_tmp("p3.h5");
    snprintf(args, sizeof args, "profile '%s' --prompts 2 --prompt-len 32 --quick-hw --quiet -o %s",
             tu_shared(MODEL), p3);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 1), 0);
    free(out);
    CU_ASSERT_FATAL(kv_h5_open_read(p3, &f, &err) == KV_OK);
    double bw = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/hardware/copy_h2d", "bandwidth", &bw, &err), KV_OK);
    CU_ASSERT(bw > 1e8);
    kv_h5_close(f);
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_profile_bad_input(void) {
    char args[4096], *out = NULL;
    const char *o = tu_tmp("bad.h5");
    snprintf(args, sizeof args, "profile '%s' --text /nonexistent/text.txt --no-hw -o %s",
             tu_shared(MODEL), o);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "/nonexistent/text.txt"));
    free(out);
    snprintf(args, sizeof args, "profile '%s' --prompt-len 4096 --no-hw -o %s", tu_shared(MODEL),
             o);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "context"));
    free(out);
    snprintf(args, sizeof args, "profile '%s' --prompts 0 --no-hw -o %s", tu_shared(MODEL), o);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    free(out);
    snprintf(args, sizeof args, "profile '%s' --no-hw -o /nonexistent-dir/p.h5", tu_shared(MODEL));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "/nonexistent-dir/p.h5"));
    free(out);
    CU_ASSERT(!exists(o));
    /* a good file is never replaced by a failed run */
    snprintf(args, sizeof args, "profile '%s' --prompts 2 --prompt-len 32 --no-hw --quiet -o %s",
             tu_shared(MODEL), o);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    struct stat before, after;
    stat(o, &before);
    snprintf(args, sizeof args, "profile '%s' --prompt-len 4096 --no-hw -o %s", tu_shared(MODEL),
             o);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, NULL, 1), 1);
    stat(o, &after);
    CU_ASSERT_EQUAL(before.st_size, after.st_size);
    CU_ASSERT_EQUAL(before.st_mtime, after.st_mtime);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"head cos = naive recomputation (stories260K)", test_head_cos_stories260k},
        {"head cos = naive recomputation (656K, HF)", test_head_cos_656k},
        {"Kendall tau on known rankings", test_kendall},
        {"profile command: schema, determinism, provenance", test_profile_command},
        {"profile bad input: text, length, prompts, output", test_profile_bad_input},
    };
    return tu_main(argc, argv, "profiler", tests, sizeof tests / sizeof tests[0]);
}
