/* Batch sizing (Batch-Max §3-4) and the KV memory arithmetic (article 003): hand-computed
 * cases, the article's Llama-3-70B example, bad inputs, the /kvpr and /batch plan groups and
 * the `kvplan batch` command on stories260K. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/batch.h"
#include "kvplan/h5io.h"
#include "kvplan/kvpr.h"
#include "kvplan/model.h"
#include "testutil.h"

#define GIB 1073741824.0

static const char *model_path(void) {
    return tu_shared("models/stories260K/stories260K.bin");
}

static void test_article_llama3_70b(void) {
    kv_error err = {0};
    double bytes = 0;
    /* L 80, H_kv 8, d_h 128, S 4096, B 64, FP16 */
    CU_ASSERT_EQUAL(kv_kv_cache_bytes(80, 8, 128, 4096, 64, 2.0, &bytes, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(bytes, 85899345920.0, 0.0);
    CU_ASSERT_DOUBLE_EQUAL(bytes / GIB, 80.0, 0.0);
    /* Llama 3 8B (L 32, 8 KV heads of 128) at batch 32, seq 4096: the formula gives 16 GiB
     * (the article's summary table prints 4.0 GB for this row, a factor 4 below its own
     * formula; the worked 70B example above is the consistent figure) */
    CU_ASSERT_EQUAL(kv_kv_cache_bytes(32, 8, 128, 4096, 32, 2.0, &bytes, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(bytes / GIB, 16.0, 0.0);
    /* KVPR Table 1: one OPT-6.7B layer (32 heads of 128), b 32, s 1024 -> 512 MiB */
    CU_ASSERT_EQUAL(kv_kv_cache_bytes(1, 32, 128, 1024, 32, 2.0, &bytes, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(bytes, 512.0 * 1024 * 1024, 0.0);
    CU_ASSERT_EQUAL(kv_kv_cache_bytes(80, 8, 128, 0, 64, 2.0, &bytes, &err), KV_EINPUT);
    CU_ASSERT_EQUAL(kv_kv_cache_bytes(80, 8, 128, 4096, 64, 0.0, &bytes, &err), KV_EINPUT);
}

/* A small made-up model whose numbers are worked out by hand below. */
static kv_batch_config small_config(const int *budget) {
    kv_batch_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8;
    c.hidden = 32, c.ffn_hidden = 64, c.vocab = 100;
    c.n_params = 1e6, c.read_params = 5e5, c.weight_bytes = 2, c.dtype_bytes = 2;
    c.device_mem = 2e6 + 1e6; /* weights 2e6 bytes, 1e6 free */
    c.mem_bw = 1e9;
    c.prompt_len = 64, c.gen_len = 16;
    c.block_size = 16, c.evict_block = 16;
    c.budget = budget;
    return c;
}

static void test_hand_computed(void) {
    const int budget[4] = {16, 16, 16, 16};
    kv_batch_config c = small_config(budget);
    kv_batch_result r;
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_batch_size(&c, &r, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.weights, 2e6, 0);
    CU_ASSERT_DOUBLE_EQUAL(r.free_for_batch, 1e6, 0);
    /* per-token activations: 3*32 + 2*4*8 + 2*2*8 + 2*64 = 320 elements = 640 bytes;
     * block = 2 * 16 * 8 * 2 = 512 bytes; 4 (layer, KV head) pairs */
    CU_ASSERT_DOUBLE_EQUAL(kv_workspace_bytes_per_seq(&c, 1, 80), 640 + 4 * 80 * 4 + 400, 0);
    const kv_batch_row *f = &r.row[KV_BATCH_FULL];
    CU_ASSERT_DOUBLE_EQUAL(f->kv_prefill, 4 * 4 * 512, 0); /* 64 tokens = 4 blocks */
    CU_ASSERT_DOUBLE_EQUAL(f->ws_prefill, 64 * 640 + 4 * 64 * 4 + 400, 0); /* 42384 */
    CU_ASSERT_DOUBLE_EQUAL(f->kv_decode, 4 * 5 * 512, 0); /* 80 tokens = 5 blocks */
    CU_ASSERT_DOUBLE_EQUAL(f->ws_decode, 640 + 4 * 80 * 4 + 400, 0);
    CU_ASSERT_DOUBLE_EQUAL(f->per_seq, 50576, 0);
    CU_ASSERT_EQUAL(f->prefill_limits, 1);
    CU_ASSERT_EQUAL(f->max_batch, 19); /* floor(1e6 / 50576) */
    const kv_batch_row *d = &r.row[KV_BATCH_DECODE_ONLY];
    CU_ASSERT_DOUBLE_EQUAL(d->per_seq, 50576, 0);         /* prefill of the whole prompt limits */
    CU_ASSERT_DOUBLE_EQUAL(d->kv_decode, 4 * 2 * 512, 0); /* 16 + 16 tokens = 2 blocks */
    CU_ASSERT_EQUAL(d->max_batch, 19);
    const kv_batch_row *pd = &r.row[KV_BATCH_PREFILL_DECODE];
    CU_ASSERT_DOUBLE_EQUAL(pd->kv_prefill, 4 * 2 * 512, 0);
    CU_ASSERT_DOUBLE_EQUAL(pd->ws_prefill, 16 * 640 + 4 * 32 * 4 + 400, 0); /* 11152 */
    CU_ASSERT_DOUBLE_EQUAL(pd->per_seq, 4096 + 11152, 0);
    CU_ASSERT_EQUAL(pd->max_batch, 65); /* floor(1e6 / 15248) */
    /* decode: weights read 5e5 x 2 bytes per step; full KV read 4 x (63 + t) x 32 bytes */
    double kv_full = 128.0 * (16 * 63 + 136); /* sum over t = 1..16 */
    double t_full = (16 * 1e6 + 19 * kv_full) / 1e9;
    CU_ASSERT_DOUBLE_EQUAL(f->tokens_per_s, 19 * 16 / t_full, 1e-9 * f->tokens_per_s);
    CU_ASSERT_DOUBLE_EQUAL(f->kv_read_mean, kv_full / 16, 1e-9);
    double t_pd = (16 * 1e6 + 65 * 16 * (4 * 16 * 32.0)) / 1e9;
    CU_ASSERT_DOUBLE_EQUAL(pd->tokens_per_s, 65 * 16 / t_pd, 1e-9 * pd->tokens_per_s);
    CU_ASSERT(pd->tokens_per_s > d->tokens_per_s);
    /* without budgets only the full row exists */
    c.budget = NULL;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_OK);
    CU_ASSERT_EQUAL(r.row[KV_BATCH_FULL].max_batch, 19);
    CU_ASSERT_EQUAL(r.row[KV_BATCH_DECODE_ONLY].available, 0);
    CU_ASSERT_EQUAL(r.row[KV_BATCH_PREFILL_DECODE].available, 0);
    /* no bandwidth: batch sizes, no tokens/s */
    c.mem_bw = 0;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_OK);
    CU_ASSERT_EQUAL(r.row[KV_BATCH_FULL].max_batch, 19);
    CU_ASSERT_DOUBLE_EQUAL(r.row[KV_BATCH_FULL].tokens_per_s, 0, 0);
}

static void test_batch_max_shape(void) {
    /* Llama-2-13B-like on 4 x 32 GB (Batch-Max §4): long prompt, short generation */
    enum { L = 40, HKV = 40 };
    static int budget[L * HKV];
    for (int i = 0; i < L * HKV; i++) budget[i] = 1024;
    kv_batch_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = L, c.n_heads = 40, c.n_kv_heads = HKV, c.head_dim = 128;
    c.hidden = 5120, c.ffn_hidden = 13824, c.vocab = 32000;
    c.n_params = 13.0e9, c.read_params = 13.0e9, c.weight_bytes = 2, c.dtype_bytes = 2;
    c.device_mem = 4 * 32 * GIB, c.mem_bw = 4 * 900e9;
    c.prompt_len = 3584, c.gen_len = 512, c.block_size = 16, c.evict_block = 64;
    c.budget = budget;
    kv_batch_result r;
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_batch_size(&c, &r, &err), KV_OK);
    long bf = r.row[0].max_batch, bd = r.row[1].max_batch, bp = r.row[2].max_batch;
    /* full KV of one sequence: 2 * 40 * 40 * 128 * 4096 * 2 bytes = 3.125 GiB */
    CU_ASSERT_DOUBLE_EQUAL(r.row[0].kv_decode, 2.0 * 40 * 40 * 128 * 4096 * 2, 0);
    CU_ASSERT(bf >= 1 && bd >= bf && bp > 2 * bd);
    CU_ASSERT(r.row[2].tokens_per_s > r.row[1].tokens_per_s);
    CU_ASSERT(r.row[1].tokens_per_s >= r.row[0].tokens_per_s);
}

static void test_bad_inputs(void) {
    kv_batch_config c = small_config(NULL);
    kv_batch_result r;
    kv_error err = {0};
    c.device_mem = 1.5e6; /* below the 2e6 bytes of weights */
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "below the weights"));
    c = small_config(NULL);
    c.prompt_len = 0;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_EINPUT);
    c = small_config(NULL);
    c.gen_len = 0;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_EINPUT);
    c = small_config(NULL);
    c.mem_bw = -1;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_EINPUT);
    c = small_config(NULL);
    c.device_mem = 0;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_EINPUT);
    const int zero[4] = {16, 0, 16, 16};
    c = small_config(zero);
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "layer 0 KV head 1"));
    /* memory above the weights but below one sequence: 0, not an error */
    c = small_config(NULL);
    c.device_mem = 2e6 + 1000;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_OK);
    CU_ASSERT_EQUAL(r.row[0].max_batch, 0);
    CU_ASSERT_DOUBLE_EQUAL(r.row[0].tokens_per_s, 0, 0);
}

/* A plan for stories260K: uniform budget of `tokens` per head, C 512, b_s 16. With `hw` the
 * /kvpr and /batch groups are written too. */
static int write_plan(const char *path, int tokens, const kv_hw *hw) {
    kv_error err = {0};
    kv_model *m = NULL;
    if (kv_model_load(model_path(), &m, &err)) return -1;
    int n = m->cfg.n_layers * m->cfg.n_kv_heads;
    int *tok = calloc((size_t)n, sizeof *tok);
    for (int i = 0; i < n && tok; i++) tok[i] = tokens;
    kv_plan b;
    int rc =
        tok ? kv_plan_from_budgets(&m->cfg, tok, NULL, KV_POLICY_AVGATTN, (double)tokens / 512.0,
                                   512, 16, 16, "uniform", NAN, NAN, NAN, 0, &b, &err)
            : -1;
    kv_h5 *f = NULL;
    if (!rc) rc = kv_h5_create(path, &f, &err);
    if (!rc) rc = kv_h5_write_provenance(f, "test_batch", m, &err);
    if (!rc) rc = kv_plan_write(f, &b, &err);
    if (!rc && hw) rc = kv_plan_write_kvpr_batch(f, m, hw, &b, &err);
    if (!rc)
        rc = kv_h5_commit(f, &err);
    else if (f)
        kv_h5_abort(f);
    if (rc) fprintf(stderr, "write_plan: %s\n", err.msg);
    free(tok);
    kv_plan_free(&b);
    kv_model_free(m);
    return rc;
}

static int write_profile(const char *path);

static void test_plan_groups(void) {
    kv_hw hw;
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_hw_from_preset("l4", &hw, &err), KV_OK);
    hw.device_mem = 4e6; /* small enough that the three rows differ for this tiny model */
    const char *path = tu_tmp("plan_kvpr_batch.h5");
    CU_ASSERT_EQUAL_FATAL(write_plan(path, 64, &hw), 0);
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(path, &f, &err), KV_OK);
    int rank = 0, *batches = NULL, *lens = NULL, *sc = NULL, *sr = NULL, *mb = NULL;
    long dims[KV_H5_MAX_RANK], d2[KV_H5_MAX_RANK];
    double *tc = NULL, *tps = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_i32(f, "/kvpr/batch", &rank, dims, &batches, &err), KV_OK);
    CU_ASSERT_EQUAL(dims[0], 4);
    CU_ASSERT_EQUAL(kv_h5_read_i32(f, "/kvpr/seq_len", &rank, d2, &lens, &err), KV_OK);
    CU_ASSERT_EQUAL(d2[0], 4);
    CU_ASSERT_EQUAL(kv_h5_read_i32(f, "/kvpr/split_column", &rank, dims, &sc, &err), KV_OK);
    CU_ASSERT_EQUAL(rank, 2);
    CU_ASSERT_EQUAL(kv_h5_read_i32(f, "/kvpr/split_row", &rank, dims, &sr, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_f64(f, "/kvpr/time_column", &rank, dims, &tc, &err), KV_OK);
    double v_com = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/kvpr", "v_com", &v_com, &err), KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(v_com, 32e9, 0);
    if (batches && lens && sc && sr && tc) {
        CU_ASSERT_EQUAL(lens[0], 64);
        CU_ASSERT_EQUAL(lens[3], 512);
        int row_nonzero = 0;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                /* stories260K: h 64, h_kv 32, fp32 activations (p = 4), K and V in the plan's
                 * default type f16 (p_kv = 2; issue 22) */
                kv_kvpr_shape sh = {batches[i], lens[j], 64, 32, 4.0, 2.0};
                kv_kvpr_result rc_, rr;
                CU_ASSERT_EQUAL(kv_kvpr_solve(&sh, hw.v_com, hw.v_gpu, KV_SCHED_COLUMN, &rc_, &err),
                                KV_OK);
                CU_ASSERT_EQUAL(kv_kvpr_solve(&sh, hw.v_com, hw.v_gpu, KV_SCHED_ROW, &rr, &err),
                                KV_OK);
                CU_ASSERT_EQUAL(sc[i * 4 + j], rc_.split);
                CU_ASSERT_EQUAL(sc[i * 4 + j], 0); /* h = 2 h_kv: X costs as much as K and V */
                CU_ASSERT_EQUAL(sr[i * 4 + j], rr.split);
                CU_ASSERT_DOUBLE_EQUAL(tc[i * 4 + j], rc_.time, 1e-15);
                row_nonzero += rr.split > 0;
            }
        CU_ASSERT(row_nonzero > 0);
    }
    CU_ASSERT_EQUAL(kv_h5_read_i32(f, "/batch/max_batch", &rank, dims, &mb, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_f64(f, "/batch/tokens_per_s", &rank, dims, &tps, &err), KV_OK);
    long gen = 0, prompt = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/batch", "gen_len", &gen, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/batch", "prompt_len", &prompt, &err), KV_OK);
    CU_ASSERT_EQUAL(gen, 128);
    CU_ASSERT_EQUAL(prompt, 384);
    if (mb && tps) {
        /* the same numbers from kv_batch_size */
        kv_model *m = NULL;
        CU_ASSERT_EQUAL_FATAL(kv_model_load(model_path(), &m, &err), KV_OK);
        int budget[20];
        for (int i = 0; i < 20; i++) budget[i] = 64;
        kv_batch_config c;
        kv_batch_config_from_model(m, 4.0, &c);
        c.device_mem = 4e6, c.mem_bw = hw.mem_bw, c.prompt_len = 384, c.gen_len = 128;
        c.budget = budget;
        kv_cache_type types[20];
        for (int i = 0; i < 20; i++) types[i] = KV_TYPE_F16; /* the plan's default type */
        c.kv_type = types;
        kv_batch_result r;
        CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_OK);
        printf("\n    max batch (f16 K/V): full %ld, decode_only %ld, prefill_decode %ld\n",
               r.row[0].max_batch, r.row[1].max_batch, r.row[2].max_batch);
        /* the same plan with f32 K/V (types NULL, p = 4) holds no more sequences */
        kv_batch_config c32 = c;
        c32.kv_type = NULL;
        kv_batch_result r32;
        CU_ASSERT_EQUAL(kv_batch_size(&c32, &r32, &err), KV_OK);
        printf("    max batch (f32 K/V): full %ld, decode_only %ld, prefill_decode %ld\n",
               r32.row[0].max_batch, r32.row[1].max_batch, r32.row[2].max_batch);
        for (int k = 0; k < 3; k++) CU_ASSERT(r.row[k].max_batch >= r32.row[k].max_batch);
        for (int k = 0; k < 3; k++) {
            CU_ASSERT_EQUAL(mb[k], r.row[k].max_batch);
            CU_ASSERT_DOUBLE_EQUAL(tps[k], r.row[k].tokens_per_s, 1e-9 * tps[k]);
        }
        CU_ASSERT(mb[2] > mb[1] && mb[1] >= mb[0] && mb[0] > 0);
        kv_model_free(m);
    }
    free(batches), free(lens), free(sc), free(sr), free(tc), free(mb), free(tps);
    kv_h5_close(f);
}

static void test_plan_from_profile(void) {
    kv_error err = {0};
    kv_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_model_load(model_path(), &m, &err), KV_OK);
    const char *prof = tu_tmp("profile_for_plan.h5");
    CU_ASSERT_EQUAL_FATAL(write_profile(prof), 0);
    /* a profile without /hardware: a plan made from a search profile with --no-hw */
    const char *nohw = tu_tmp("plan_nohw_src.h5");
    CU_ASSERT_EQUAL_FATAL(write_plan(nohw, 32, NULL), 0);
    kv_plan b;
    CU_ASSERT_EQUAL_FATAL(
        kv_plan_uniform(&m->cfg, 32.0 / 512, 512, 16, 16, KV_POLICY_SINK, &b, &err), KV_OK);
    for (int k = 0; k < 2; k++) {
        const char *out = tu_tmp(k ? "plan_wrap_nohw.h5" : "plan_wrap.h5");
        kv_h5 *f = NULL;
        int written = -1;
        CU_ASSERT_EQUAL_FATAL(kv_h5_create(out, &f, &err), KV_OK);
        CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "test_batch", m, &err), KV_OK);
        CU_ASSERT_EQUAL(
            kv_plan_write_kvpr_batch_from_profile(f, k ? nohw : prof, m, &b, &written, &err),
            KV_OK);
        CU_ASSERT_EQUAL(written, k ? 0 : 1);
        CU_ASSERT_EQUAL(kv_h5_commit(f, &err), KV_OK);
        CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(out, &f, &err), KV_OK);
        CU_ASSERT_EQUAL(kv_h5_exists(f, "/kvpr/split_row"), k ? 0 : 1);
        CU_ASSERT_EQUAL(kv_h5_exists(f, "/batch/max_batch"), k ? 0 : 1);
        if (!k) {
            double bw = 0;
            CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/batch", "mem_bw", &bw, &err), KV_OK);
            CU_ASSERT_DOUBLE_EQUAL(bw, 800e9, 0);
        }
        kv_h5_close(f);
    }
    kv_plan_free(&b);
    kv_model_free(m);
}

static cJSON *last_json(const char *out) {
    if (!out) return NULL;
    const char *end = out + strlen(out);
    while (end > out && end[-1] == '\n') end--;
    const char *line = end;
    while (line > out && line[-1] != '\n') line--;
    char *copy = strndup(line, (size_t)(end - line));
    cJSON *j = cJSON_Parse(copy);
    free(copy);
    return j;
}

static double jget(const cJSON *j, const char *row, const char *k) {
    const cJSON *o = row ? cJSON_GetObjectItemCaseSensitive(j, row) : j;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* A profile.h5 with the /hardware figures kv_hw_read_rates needs (docs/hardware-schema.md). */
static int write_profile(const char *path) {
    kv_error err = {0};
    kv_model *m = NULL;
    kv_h5 *f = NULL;
    if (kv_model_load(model_path(), &m, &err)) return -1;
    long d[1] = {2};
    double bytes[2] = {4096, 1 << 30};
    int rc = kv_h5_create(path, &f, &err);
    if (!rc) rc = kv_h5_write_provenance(f, "test_batch", m, &err);
    if (!rc) rc = kv_h5_write_f64(f, "/hardware/copy_h2d/bytes", 1, d, bytes, "bytes", &err);
    if (!rc) rc = kv_h5_attr_f64(f, "/hardware/copy_h2d", "bandwidth", 25e9, &err);
    if (!rc) rc = kv_h5_attr_f64(f, "/hardware/copy_h2d", "latency", 1e-5, &err);
    if (!rc) rc = kv_h5_write_f64(f, "/hardware/copy_d2d/bytes", 1, d, bytes, "bytes", &err);
    if (!rc) rc = kv_h5_attr_f64(f, "/hardware/copy_d2d", "bandwidth", 400e9, &err);
    if (!rc) rc = kv_h5_write_f64(f, "/hardware/gemm/median", 1, d, bytes, "s", &err);
    if (!rc) rc = kv_h5_attr_f64(f, "/hardware/gemm", "peak_flops_per_s", 50e12, &err);
    if (!rc) rc = kv_h5_attr_str(f, "/hardware", "kind", "cuda", &err);
    if (!rc) rc = kv_h5_attr_str(f, "/hardware", "device_name", "Test GPU", &err);
    if (!rc) rc = kv_h5_attr_i64(f, "/hardware", "device_mem_bytes", 2000000, &err);
    if (!rc)
        rc = kv_h5_commit(f, &err);
    else
        kv_h5_abort(f);
    if (rc) fprintf(stderr, "write_profile: %s\n", err.msg);
    kv_model_free(m);
    return rc;
}

static void test_cli(void) {
    const char *plan = tu_tmp("plan_cli.h5");
    CU_ASSERT_EQUAL_FATAL(write_plan(plan, 32, NULL), 0);
    char args[2048], *out = NULL;
    snprintf(args, sizeof args,
             "batch --model %s --plan %s --device-mem 4M --prompt-len 448 "
             "--gen-len 64 --mem-bw 300e9 --json",
             model_path(), plan);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    cJSON *j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    kv_model *m = NULL;
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_model_load(model_path(), &m, &err), KV_OK);
    int budget[20];
    for (int i = 0; i < 20; i++) budget[i] = 32;
    kv_batch_config c;
    kv_batch_config_from_model(m, 2.0, &c);
    c.device_mem = 4e6, c.mem_bw = 300e9, c.prompt_len = 448, c.gen_len = 64, c.budget = budget;
    kv_batch_result r;
    CU_ASSERT_EQUAL(kv_batch_size(&c, &r, &err), KV_OK);
    const char *rows[3] = {"full", "decode_only", "prefill_decode"};
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_DOUBLE_EQUAL(jget(j, rows[k], "max_batch"), (double)r.row[k].max_batch, 0);
        CU_ASSERT_DOUBLE_EQUAL(jget(j, rows[k], "tokens_per_s"), r.row[k].tokens_per_s,
                               1e-9 * r.row[k].tokens_per_s);
    }
    CU_ASSERT(jget(j, "prefill_decode", "max_batch") > jget(j, "decode_only", "max_batch"));
    CU_ASSERT_DOUBLE_EQUAL(jget(j, NULL, "weights"), 260032.0 * 2, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "prefill+decode"));
    cJSON_Delete(j);
    free(out);
    kv_model_free(m);
    /* preset figures, no plan: only the full row */
    snprintf(args, sizeof args,
             "batch --model %s --hardware l4 --prompt-len 256 --gen-len 64 "
             "--json",
             model_path());
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_DOUBLE_EQUAL(jget(j, NULL, "device_mem"), 24 * GIB, 0);
    CU_ASSERT(jget(j, "full", "max_batch") > 1000);
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "decode_only")));
    cJSON_Delete(j);
    free(out);
    /* profiled figures: device memory and 2 x copy_d2d as the memory traffic rate */
    const char *prof = tu_tmp("profile_batch.h5");
    CU_ASSERT_EQUAL_FATAL(write_profile(prof), 0);
    snprintf(args, sizeof args,
             "batch --model %s --profile %s --prompt-len 256 --gen-len 64 "
             "--json",
             model_path(), prof);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    j = last_json(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_DOUBLE_EQUAL(jget(j, NULL, "device_mem"), 2e6, 0);
    CU_ASSERT_DOUBLE_EQUAL(jget(j, NULL, "mem_bw"), 800e9, 0);
    CU_ASSERT(jget(j, "full", "tokens_per_s") > 0);
    cJSON_Delete(j);
    free(out);
    /* memory below the weights, missing memory, zero prompt: exit 1 with a message */
    snprintf(args, sizeof args,
             "batch --model %s --device-mem 100000 --prompt-len 256 "
             "--gen-len 64",
             model_path());
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "below the weights"));
    free(out);
    snprintf(args, sizeof args, "batch --model %s --prompt-len 256 --gen-len 64", model_path());
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "--device-mem"));
    free(out);
    snprintf(args, sizeof args, "batch --model %s --device-mem 1G --prompt-len 0 --gen-len 64",
             model_path());
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "prompt length 0"));
    free(out);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"article: Llama-3-70B, batch 64, 4096 tokens, FP16 = 85,899,345,920 bytes",
         test_article_llama3_70b},
        {"hand-computed batch sizes, workspace and tokens/s", test_hand_computed},
        {"Batch-Max shape: P&D > decode-only >= full", test_batch_max_shape},
        {"bad inputs are refused", test_bad_inputs},
        {"plan /kvpr and /batch groups", test_plan_groups},
        {"plan groups from a profile (and none without /hardware)", test_plan_from_profile},
        {"CLI kvplan batch", test_cli},
    };
    return tu_main(argc, argv, "batch", tests, sizeof tests / sizeof tests[0]);
}
