/* KVPR split (KVPR Eq. 6-11 generalised to GQA): GLPK MIP vs brute force vs closed form,
 * the GQA l = 0 case, KVPR Table 1's transfer figures, bad inputs, presets, profiles, CLI. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"
#include "testutil.h"

#define GIB 1073741824.0

/* Smallest l with the minimum t(l), by evaluating every l in 0..s'. */
static long brute_force(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched,
                        double *tmin_out) {
    kv_error err = {0};
    double tmin = INFINITY;
    long best = -1;
    for (long l = 0; l <= sh->seq; l++) {
        kv_kvpr_result r;
        CU_ASSERT_EQUAL_FATAL(kv_kvpr_eval(sh, v_com, v_gpu, sched, l, &r, &err), KV_OK);
        if (r.time < tmin * (1.0 - 1e-12)) {
            tmin = r.time;
            best = l;
        }
    }
    *tmin_out = tmin;
    return best;
}

static void test_glpk_matches_brute_force(void) {
    /* MHA, GQA g = 2 (exact tie between X and K+V), GQA g = 4, GQA g = 8 and a tiny model */
    const long shapes[][2] = {{4096, 4096}, {4096, 2048}, {4096, 1024}, {5120, 640}, {64, 32}};
    const long batches[] = {1, 8, 32};
    const long seqs[] = {1, 2, 7, 100, 1024};
    const double v_coms[] = {16 * GIB, 32 * GIB, 1e8};
    const double v_gpus[] = {1e10, 312e12};
    int cases = 0, nonzero_col = 0, nonzero_row = 0, nontrivial = 0;
    for (size_t a = 0; a < sizeof shapes / sizeof shapes[0]; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t c = 0; c < 5; c++)
                for (size_t d = 0; d < 3; d++)
                    for (size_t e = 0; e < 2; e++)
                        for (int sc = 0; sc < 2; sc++) {
                            kv_kvpr_shape sh = {batches[b],   seqs[c], shapes[a][0],
                                                shapes[a][1], 2.0,     0};
                            kv_schedule sched = sc ? KV_SCHED_ROW : KV_SCHED_COLUMN;
                            kv_error err = {0};
                            double tmin;
                            long lbf = brute_force(&sh, v_coms[d], v_gpus[e], sched, &tmin);
                            kv_kvpr_result g, cf;
                            int rc = kv_kvpr_solve(&sh, v_coms[d], v_gpus[e], sched, &g, &err);
                            CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
                            CU_ASSERT_EQUAL(g.glpk_status, 5 /* GLP_OPT */);
                            CU_ASSERT_EQUAL(
                                kv_kvpr_closed_form(&sh, v_coms[d], v_gpus[e], sched, &cf, &err),
                                KV_OK);
                            if (g.split != lbf || cf.split != lbf)
                                fprintf(stderr,
                                        "h %ld h_kv %ld b %ld s' %ld v_com %g v_gpu %g %s:"
                                        " glpk %ld closed %ld brute %ld\n",
                                        sh.hidden, sh.kv_width, sh.batch, sh.seq, v_coms[d],
                                        v_gpus[e], kv_schedule_name(sched), g.split, cf.split, lbf);
                            CU_ASSERT_EQUAL(g.split, lbf);
                            CU_ASSERT_EQUAL(cf.split, lbf);
                            CU_ASSERT_DOUBLE_EQUAL(g.time, tmin, 1e-12 * tmin);
                            CU_ASSERT(g.time <= g.time_no_recompute * (1 + 1e-12));
                            cases++;
                            if (lbf > 0 && !sc) nonzero_col++;
                            if (lbf > 0 && sc) nonzero_row++;
                            if (lbf > 0 && lbf < sh.seq) nontrivial++;
                        }
    /* the grid really exercises interior optima in both schedules, not only l = 0 */
    CU_ASSERT(nonzero_col > 20);
    CU_ASSERT(nonzero_row > 20);
    CU_ASSERT(nontrivial > 40);
    CU_ASSERT_EQUAL(cases, 5 * 3 * 5 * 3 * 2 * 2);
}

static void test_llama3_8b_gqa_is_zero(void) {
    /* h 4096, 8 KV heads of 128: X costs 4096 p per token, K and V 2 * 1024 p */
    kv_kvpr_shape sh = {32, 1024, 4096, 8 * 128, 2.0, 0};
    kv_error err = {0};
    kv_kvpr_result r;
    CU_ASSERT_EQUAL_FATAL(kv_kvpr_solve(&sh, 32 * GIB, 312e12, KV_SCHED_COLUMN, &r, &err), KV_OK);
    CU_ASSERT_EQUAL(r.split, 0);
    CU_ASSERT_EQUAL(r.activations_dearer, 1);
    CU_ASSERT_DOUBLE_EQUAL(r.time, r.time_no_recompute, 1e-15);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.note, "l = 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.note, "activation"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.note, "8192 bytes")); /* h * p */
    CU_ASSERT_PTR_NOT_NULL(strstr(r.note, "4096 bytes")); /* 2 * h_kv * p */
    /* one token recomputed is strictly worse than none */
    kv_kvpr_result r1;
    CU_ASSERT_EQUAL(kv_kvpr_eval(&sh, 32 * GIB, 312e12, KV_SCHED_COLUMN, 1, &r1, &err), KV_OK);
    CU_ASSERT(r1.time > r.time);
    /* row-by-row does not send X, so recomputation pays there */
    CU_ASSERT_EQUAL(kv_kvpr_solve(&sh, 32 * GIB, 312e12, KV_SCHED_ROW, &r, &err), KV_OK);
    CU_ASSERT(r.split > 0);
    CU_ASSERT(r.time < r.time_no_recompute);
    /* the same width as MHA (OPT-6.7B-like) recomputes in the column schedule */
    kv_kvpr_shape mha = {32, 1024, 4096, 4096, 2.0, 0};
    CU_ASSERT_EQUAL(kv_kvpr_solve(&mha, 32 * GIB, 312e12, KV_SCHED_COLUMN, &r, &err), KV_OK);
    CU_ASSERT(r.split > 0 && r.split < 1024);
    CU_ASSERT_EQUAL(r.activations_dearer, 0);
    CU_ASSERT(r.time < 0.9 * r.time_no_recompute);
}

static void test_opt67b_table1(void) {
    /* KVPR Table 1: OPT-6.7B, b 32, s 1024, fp16: 512 MB of KV per layer, 15.6 ms at 32 GB/s */
    kv_kvpr_shape sh = {32, 1024, 4096, 4096, 2.0, 0};
    kv_error err = {0};
    kv_kvpr_result r;
    CU_ASSERT_EQUAL_FATAL(kv_kvpr_eval(&sh, 32 * GIB, 312e12, KV_SCHED_COLUMN, 0, &r, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.bytes_kv, 512.0 * 1024 * 1024, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(r.time_no_recompute, 0.015625, 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(round(r.time_no_recompute * 1e4) / 10.0, 15.6, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(r.time, r.time_no_recompute, 1e-15);
    CU_ASSERT_EQUAL(r.bound, KV_BOUND_TRANSFER);
    /* all recomputed: N = 4 b s h^2 FLOPs, M_X = b s h p bytes */
    CU_ASSERT_EQUAL(kv_kvpr_eval(&sh, 32 * GIB, 312e12, KV_SCHED_COLUMN, 1024, &r, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.flops, 4.0 * 32 * 1024 * 4096.0 * 4096.0, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(r.bytes_activations, 256.0 * 1024 * 1024, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(r.bytes_kv, 0.0, 0.0);
    CU_ASSERT_EQUAL(r.bound, KV_BOUND_COMPUTE);
}

static void test_closed_form_interior(void) {
    /* MHA column: a = k/2, l0 = k s' / (c + k); check the split sits at the crossing */
    kv_kvpr_shape sh = {8, 1000, 1024, 1024, 2.0, 0};
    double v_com = 1e10, v_gpu = 1e13;
    double c = 4.0 * 8 * 1024 * 1024 / v_gpu, k = 2.0 * 8 * 1024 * 2 / v_com;
    double l0 = k * 1000 / (c + k);
    kv_error err = {0};
    kv_kvpr_result r;
    CU_ASSERT_EQUAL_FATAL(kv_kvpr_closed_form(&sh, v_com, v_gpu, KV_SCHED_COLUMN, &r, &err), KV_OK);
    CU_ASSERT(r.split == (long)floor(l0) || r.split == (long)ceil(l0));
    CU_ASSERT(fabs(r.t_recompute - r.t_transfer) <= fmax(c, k) + 1e-15);
    CU_ASSERT_EQUAL(r.glpk_status, 0);
}

static void test_bad_inputs(void) {
    kv_error err = {0};
    kv_kvpr_result r;
    kv_kvpr_shape ok = {4, 128, 256, 64, 2.0, 0};
    kv_kvpr_shape s0 = ok;
    s0.seq = 0;
    CU_ASSERT_EQUAL(kv_kvpr_solve(&s0, 1e9, 1e12, KV_SCHED_COLUMN, &r, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "s' = 0"));
    CU_ASSERT_EQUAL(kv_kvpr_solve(&ok, 0.0, 1e12, KV_SCHED_COLUMN, &r, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "v_com = 0"));
    CU_ASSERT_EQUAL(kv_kvpr_solve(&ok, 1e9, -1.0, KV_SCHED_ROW, &r, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "v_gpu"));
    CU_ASSERT_EQUAL(kv_kvpr_closed_form(&ok, NAN, 1e12, KV_SCHED_ROW, &r, &err), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_kvpr_closed_form(&ok, INFINITY, 1e12, KV_SCHED_ROW, &r, &err), KV_EINPUT);
    kv_kvpr_shape bad = ok;
    bad.batch = 0;
    CU_ASSERT_EQUAL(kv_kvpr_solve(&bad, 1e9, 1e12, KV_SCHED_ROW, &r, &err), KV_EINPUT);
    bad = ok;
    bad.dtype_bytes = 0;
    CU_ASSERT_EQUAL(kv_kvpr_solve(&bad, 1e9, 1e12, KV_SCHED_ROW, &r, &err), KV_EINPUT);
    bad = ok;
    bad.kv_width = 0;
    CU_ASSERT_EQUAL(kv_kvpr_eval(&bad, 1e9, 1e12, KV_SCHED_ROW, 0, &r, &err), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_kvpr_eval(&ok, 1e9, 1e12, KV_SCHED_ROW, 129, &r, &err), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_kvpr_eval(&ok, 1e9, 1e12, KV_SCHED_ROW, -1, &r, &err), KV_EINPUT);
    kv_schedule s;
    CU_ASSERT_EQUAL(kv_schedule_parse("diagonal", &s, &err), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_schedule_parse("row-by-row", &s, &err), KV_OK);
    CU_ASSERT_EQUAL(s, KV_SCHED_ROW);
    CU_ASSERT_EQUAL(kv_schedule_parse("column", &s, &err), KV_OK);
    CU_ASSERT_EQUAL(s, KV_SCHED_COLUMN);
}

static void test_glpk_failure_message(void) {
    /* the codes glpk.h defines: GLP_ENOPFS 0x0A, GLP_NOFEAS 4; GLP_ETMLIM 0x09, GLP_FEAS 2 */
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_kvpr_glpk_fail(0x0A, 4, "minimum step time", &err), KV_EINTERNAL);
    CU_ASSERT_EQUAL(err.code, KV_EINTERNAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "GLP_ENOPFS"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "GLP_NOFEAS"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "minimum step time"));
    CU_ASSERT_EQUAL(kv_kvpr_glpk_fail(0x09, 2, "x", &err), KV_EINTERNAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "GLP_ETMLIM"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "GLP_FEAS"));
}

static void test_slow_device_no_recompute(void) {
    /* MHA, row schedule, a device so slow that one recomputed token costs more than it saves */
    kv_kvpr_shape sh = {1, 10, 4096, 4096, 2.0, 0};
    kv_error err = {0};
    kv_kvpr_result r;
    CU_ASSERT_EQUAL_FATAL(kv_kvpr_solve(&sh, 1e12, 1e6, KV_SCHED_ROW, &r, &err), KV_OK);
    CU_ASSERT_EQUAL(r.split, 0);
    CU_ASSERT_EQUAL(r.activations_dearer, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.note, "l = 0"));
}

static void test_presets(void) {
    int n = 0;
    const kv_hw_preset *t = kv_hw_presets(&n);
    CU_ASSERT_EQUAL(n, 4);
    const char *keys[] = {"h100-sxm", "h200", "a100-40g-pcie4", "l4"};
    for (int i = 0; i < 4; i++) {
        kv_hw hw;
        kv_error err = {0};
        CU_ASSERT_EQUAL(kv_hw_from_preset(keys[i], &hw, &err), KV_OK);
        CU_ASSERT(hw.v_com > 1e9 && hw.v_gpu > 1e13 && hw.mem_bw > 1e11 && hw.device_mem > 1e10);
        CU_ASSERT(strlen(t[i].source) > 10);
    }
    kv_hw hw;
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_hw_from_preset("a100-40g-pcie4", &hw, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(hw.v_com, 32e9, 0); /* PCIe 4.0 x16, one direction (KVPR §1) */
    CU_ASSERT_DOUBLE_EQUAL(hw.mem_bw, 1.555e12, 0);
    CU_ASSERT_DOUBLE_EQUAL(hw.device_mem, 40 * GIB, 0);
    CU_ASSERT_DOUBLE_EQUAL(hw.v_gpu, 312e12, 0);
    CU_ASSERT_EQUAL(kv_hw_from_preset("h100-sxm", &hw, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(hw.mem_bw, 3.35e12, 0);
    CU_ASSERT_EQUAL(kv_hw_from_preset("tpu-v5", &hw, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "l4"));
}

/* A minimal profile.h5 with /hardware figures (docs/hardware-schema.md). */
static int write_profile(const char *path, int with_fp16, int with_hw) {
    kv_error err = {0};
    kv_model *m = NULL;
    kv_h5 *f = NULL;
    if (kv_model_load(tu_shared("models/stories260K/stories260K.bin"), &m, &err)) return -1;
    int rc = kv_h5_create(path, &f, &err);
    if (!rc) rc = kv_h5_write_provenance(f, "test_kvpr", m, &err);
    long d[1] = {2};
    double bytes[2] = {4096, 1 << 30};
    if (with_hw) {
        if (!rc) rc = kv_h5_write_f64(f, "/hardware/copy_h2d/bytes", 1, d, bytes, "bytes", &err);
        if (!rc) rc = kv_h5_attr_f64(f, "/hardware/copy_h2d", "bandwidth", 24e9, &err);
        if (!rc) rc = kv_h5_attr_f64(f, "/hardware/copy_h2d", "latency", 1e-5, &err);
        if (!rc) rc = kv_h5_write_f64(f, "/hardware/copy_d2d/bytes", 1, d, bytes, "bytes", &err);
        if (!rc) rc = kv_h5_attr_f64(f, "/hardware/copy_d2d", "bandwidth", 900e9, &err);
        if (!rc) rc = kv_h5_write_f64(f, "/hardware/gemm/median", 1, d, bytes, "s", &err);
        if (!rc) rc = kv_h5_attr_f64(f, "/hardware/gemm", "peak_flops_per_s", 20e12, &err);
        if (with_fp16 && !rc)
            rc = kv_h5_write_f64(f, "/hardware/gemm_fp16/median", 1, d, bytes, "s", &err);
        if (with_fp16 && !rc)
            rc = kv_h5_attr_f64(f, "/hardware/gemm_fp16", "peak_flops_per_s", 150e12, &err);
        if (!rc) rc = kv_h5_attr_str(f, "/hardware", "kind", "cuda", &err);
        if (!rc) rc = kv_h5_attr_str(f, "/hardware", "device_name", "Test GPU", &err);
        if (!rc) rc = kv_h5_attr_i64(f, "/hardware", "device_mem_bytes", 16L << 30, &err);
    } else {
        if (!rc) rc = kv_h5_write_f64(f, "/layers/similarity", 1, d, bytes, NULL, &err);
    }
    if (!rc)
        rc = kv_h5_commit(f, &err);
    else
        kv_h5_abort(f);
    if (rc) fprintf(stderr, "write_profile: %s\n", err.msg);
    kv_model_free(m);
    return rc;
}

static void test_hw_from_profile(void) {
    const char *p16 = tu_tmp("profile_fp16.h5"), *p32 = tu_tmp("profile_fp32.h5");
    const char *pnone = tu_tmp("profile_nohw.h5");
    CU_ASSERT_EQUAL_FATAL(write_profile(p16, 1, 1), 0);
    CU_ASSERT_EQUAL_FATAL(write_profile(p32, 0, 1), 0);
    CU_ASSERT_EQUAL_FATAL(write_profile(pnone, 0, 0), 0);
    kv_hw hw;
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_hw_from_profile(p16, &hw, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(hw.v_com, 24e9, 0);
    CU_ASSERT_DOUBLE_EQUAL(hw.v_gpu, 150e12, 0);     /* gemm_fp16 preferred */
    CU_ASSERT_DOUBLE_EQUAL(hw.mem_bw, 2 * 900e9, 0); /* traffic: a copy reads and writes */
    CU_ASSERT_DOUBLE_EQUAL(hw.device_mem, 16.0 * GIB, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(hw.name, "Test GPU"));
    CU_ASSERT_EQUAL(kv_hw_from_profile(p32, &hw, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(hw.v_gpu, 20e12, 0); /* falls back to gemm */
    CU_ASSERT_EQUAL(kv_hw_from_profile(pnone, &hw, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/hardware"));
    CU_ASSERT_EQUAL(kv_hw_from_profile(tu_tmp("missing.h5"), &hw, &err), KV_EINPUT);
}

/* The JSON object on the last line of `out` (caller deletes), or NULL. */
static cJSON *last_json(const char *out) {
    if (!out) return NULL;
    const char *end = out + strlen(out);
    while (end > out && (end[-1] == '\n' || end[-1] == ' ')) end--;
    const char *line = end;
    while (line > out && line[-1] != '\n') line--;
    char *copy = strndup(line, (size_t)(end - line));
    cJSON *j = cJSON_Parse(copy);
    free(copy);
    return j;
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void test_cli_shape_table1(void) {
    char *out = NULL;
    int rc = tu_run_kvplan("kvpr --hidden 4096 --kv-heads 32 --head-dim 128 --batch 32 "
                           "--seq-len 1024 --v-com 32Gi --v-gpu 312e12 --layers 32 --json",
                           &out, 0);
    CU_ASSERT_EQUAL(rc, 0);
    cJSON *j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "time_no_recompute"), 0.015625, 1e-15);
    kv_kvpr_shape sh = {32, 1024, 4096, 4096, 2.0, 0};
    kv_kvpr_result r;
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_kvpr_solve(&sh, 32 * GIB, 312e12, KV_SCHED_COLUMN, &r, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "split"), (double)r.split, 0);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "time"), r.time, 1e-15);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "split l = "));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "all 32 layers"));
    cJSON_Delete(j);
    free(out);
}

static void test_cli_model_gqa_and_decode(void) {
    /* stories260K: h 64, 4 KV heads of 8 -> h_kv 32 = h / 2: X costs as much as K and V */
    char args[1024], *out = NULL;
    snprintf(args, sizeof args,
             "kvpr --model %s --hardware a100-40g-pcie4 --batch 16 "
             "--seq-len 256 --gen-len 8 --json",
             tu_shared("models/stories260K/stories260K.bin"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    cJSON *j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "split"), 0, 0);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "kv_width"), 32, 0);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "layers"), 5, 0);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "time"), jnum(j, "time_no_recompute"), 1e-18);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "l = 0"));
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(j, "decode");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(dec, "steps");
    CU_ASSERT_EQUAL(cJSON_GetArraySize(steps), 8);
    double prev = 0;
    for (int i = 0; i < cJSON_GetArraySize(steps); i++) {
        const cJSON *st = cJSON_GetArrayItem(steps, i);
        CU_ASSERT_DOUBLE_EQUAL(jnum(st, "seq_len"), 256 + i, 0);
        CU_ASSERT(jnum(st, "time_no_recompute") > prev);
        prev = jnum(st, "time_no_recompute");
    }
    cJSON_Delete(j);
    free(out);
    /* the row schedule recomputes part of it, and the split grows with s' */
    snprintf(args, sizeof args,
             "kvpr --model %s --v-com 32e9 --v-gpu 1e12 --batch 16 "
             "--seq-len 256 --gen-len 40 --schedule row --json",
             tu_shared("models/stories260K/stories260K.bin"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT(jnum(j, "split") > 0);
    CU_ASSERT(jnum(j, "time") < jnum(j, "time_no_recompute"));
    steps =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "decode"), "steps");
    CU_ASSERT_EQUAL(cJSON_GetArraySize(steps), 40);
    CU_ASSERT(jnum(cJSON_GetArrayItem(steps, 39), "split") >
              jnum(cJSON_GetArrayItem(steps, 0), "split"));
    cJSON_Delete(j);
    free(out);
}

static void test_cli_profile_and_errors(void) {
    const char *prof = tu_tmp("profile_cli.h5");
    CU_ASSERT_EQUAL_FATAL(write_profile(prof, 1, 1), 0);
    char args[1024], *out = NULL;
    snprintf(args, sizeof args,
             "kvpr --profile %s --hidden 4096 --kv-heads 32 --head-dim 128 "
             "--batch 8 --seq-len 512 --json",
             prof);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    cJSON *j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "v_com"), 24e9, 0);
    CU_ASSERT_DOUBLE_EQUAL(jnum(j, "v_gpu"), 150e12, 0);
    cJSON_Delete(j);
    free(out);
    /* zero bandwidth, s' = 0, missing hardware, unknown preset: exit 1 with a message */
    CU_ASSERT_EQUAL(tu_run_kvplan("kvpr --hidden 64 --kv-heads 4 --head-dim 8 --batch 1 "
                                  "--seq-len 10 --v-com 0 --v-gpu 1e12",
                                  &out, 1),
                    1);
    CU_ASSERT_TRUE(out && strstr(out, "v_com = 0"));
    free(out);
    CU_ASSERT_EQUAL(tu_run_kvplan("kvpr --hidden 64 --kv-heads 4 --head-dim 8 --batch 1 "
                                  "--seq-len 0 --v-com 1e9 --v-gpu 1e12",
                                  &out, 1),
                    1);
    CU_ASSERT_TRUE(out && strstr(out, "s' = 0"));
    free(out);
    CU_ASSERT_EQUAL(tu_run_kvplan("kvpr --hidden 64 --kv-heads 4 --head-dim 8 --batch 1 "
                                  "--seq-len 10",
                                  &out, 1),
                    1);
    CU_ASSERT_TRUE(out && strstr(out, "--v-com"));
    free(out);
    CU_ASSERT_EQUAL(tu_run_kvplan("kvpr --hardware b200 --hidden 64 --kv-heads 4 --head-dim 8 "
                                  "--batch 1 --seq-len 10",
                                  &out, 1),
                    1);
    CU_ASSERT_TRUE(out && strstr(out, "unknown hardware preset"));
    free(out);
    CU_ASSERT_EQUAL(tu_run_kvplan("kvpr --hardware list", &out, 0), 0);
    CU_ASSERT_TRUE(out && strstr(out, "a100-40g-pcie4"));
    CU_ASSERT_TRUE(out && strstr(out, "datasheet"));
    free(out);
    CU_ASSERT_EQUAL(tu_run_kvplan("kvpr --help", &out, 0), 0);
    CU_ASSERT_TRUE(out && strstr(out, "--schedule"));
    free(out);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"GLPK split equals brute force (MHA, GQA; row, column)", test_glpk_matches_brute_force},
        {"Llama-3-8B-like GQA: X dearer than K+V, l = 0", test_llama3_8b_gqa_is_zero},
        {"OPT-6.7B-like MHA: 512 MiB, 15.6 ms (KVPR Table 1)", test_opt67b_table1},
        {"closed form sits at the crossing", test_closed_form_interior},
        {"bad inputs are refused", test_bad_inputs},
        {"slow device: l = 0 with a reason", test_slow_device_no_recompute},
        {"GLPK failures name glp_intopt's code and glp_mip_status", test_glpk_failure_message},
        {"hardware presets", test_presets},
        {"hardware figures from a profile", test_hw_from_profile},
        {"CLI: shape flags, Table 1 figures, JSON", test_cli_shape_table1},
        {"CLI: stories260K GQA and decode table", test_cli_model_gqa_and_decode},
        {"CLI: profile figures and errors", test_cli_profile_and_errors},
    };
    return tu_main(argc, argv, "kvpr", tests, sizeof tests / sizeof tests[0]);
}
