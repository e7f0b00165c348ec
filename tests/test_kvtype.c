/* KV storage types (issue 22; include/kvplan/kvcache.h kv_cache_type, runtime/cache/kvtype.h):
 * row round trips on real K/V rows of stories260K and TinyStories-656K within each type's error
 * bound, the stored bytes per token and the pool's byte accounting, attention over each stored
 * type against an f32 cache holding the dequantised values (a backend whose cache_write rounds
 * every new row through the type), the F16 default's perplexity move, and plan schema v3
 * (per-head types, byte ratio, validation, v2 plans read as f32). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>

#include "backend/backend_impl.h"
#include "kvplan/engine.h"
#include "kvplan/eval.h"
#include "engine/forward.h"
#include "kvplan/h5io.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "testutil.h"
#include "util/f16.h" /* internal: the binary16 conversions the cache rows use */

#define M260 "models/stories260K/stories260K.bin"
#define TOK260 "models/stories260K/tok512.bin"
#define M656 "models/tinystories-656k"
#define TEXT "text/tinystories_val_head.txt"

static const kv_cache_type TYPES[4] = {KV_TYPE_F32, KV_TYPE_F16, KV_TYPE_Q8, KV_TYPE_Q4};

/* Tokens of the shared text for model m (its own tokenizer: the 260K's tok512.bin, the 656K
 * directory's tokenizer.json), at most max_bytes of text. */
static int *text_tokens(const kv_model *m, int is_260k, int *n) {
    return tu_text_tokens(m, is_260k ? tu_shared(TOK260) : NULL, 6000, n);
}

/* Real K and V rows: a full f32 cache after T tokens of the text; rows [L * H_kv * T][d_h]
 * (K then V of each entry). */
static float *real_rows(const kv_model *m, const int *ids, int T, long *n_rows) {
    kv_error err = {0};
    int L = m->cfg.n_layers, Hk = m->cfg.n_kv_heads, hd = m->cfg.head_dim, nh = L * Hk;
    kv_pool pool;
    CU_ASSERT_FATAL(kv_pool_init(&pool, nh * (T / 16 + 1), 16, hd, &err) == KV_OK);
    kv_cache c;
    CU_ASSERT_FATAL(kv_cache_init(&c, &pool, L, Hk, NULL, KV_POLICY_SINK, &err) == KV_OK);
    kv_workspace *ws = NULL;
    CU_ASSERT_FATAL(kv_workspace_new(m, T, m->cfg.seq_len, &ws, &err) == KV_OK);
    kv_cache *cp = &c;
    CU_ASSERT_FATAL(kv_forward(m, ws, &cp, 1, ids, T, KV_LOGITS_NONE, NULL, NULL, &err) == KV_OK);
    float *rows = malloc(sizeof(float) * (size_t)nh * T * 2 * hd);
    CU_ASSERT_FATAL(rows != NULL);
    for (int i = 0; i < nh; i++)
        for (int e = 0; e < T; e++) {
            float *r = rows + ((size_t)i * T + e) * 2 * hd;
            kv_head_read(&pool, &c.heads[i], e, r, r + hd);
        }
    *n_rows = (long)nh * T * 2;
    kv_workspace_free(ws);
    kv_cache_destroy(&c);
    kv_pool_destroy(&pool);
    return rows;
}

/* Round trip of every real row: f32 exact; f16 within half an ulp (2^-11 relative, subnormal
 * spacing 2^-24 absolute); q8 within s / 2 with s = max|x| / 127 rounded up to binary16;
 * q4 within s / 2 with s = (max - min) / 15 (min rounded down, s up). Reports RMS errors. */
static void round_trip_on(const kv_model *m, int is_260k, const char *name) {
    int n = 0;
    int *ids = text_tokens(m, is_260k, &n);
    CU_ASSERT_FATAL(n >= 256);
    int hd = m->cfg.head_dim;
    long nr = 0;
    float *rows = real_rows(m, ids, 256, &nr);
    unsigned char buf[1024];
    float back[512];
    printf("\n    %s (d_h %d, %ld rows):", name, hd, nr);
    for (int k = 0; k < 4; k++) {
        kv_cache_type t = TYPES[k];
        double se = 0, sx = 0;
        long bad = 0;
        for (long r = 0; r < nr; r++) {
            const float *x = rows + r * hd;
            kv_type_encode_row(t, hd, x, buf);
            kv_type_decode_row(t, hd, buf, back);
            float lo = x[0], hi = x[0], amax = 0;
            for (int d = 0; d < hd; d++) {
                lo = x[d] < lo ? x[d] : lo;
                hi = x[d] > hi ? x[d] : hi;
                amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
            }
            for (int d = 0; d < hd; d++) {
                double e = fabs((double)back[d] - x[d]), bound = 0;
                switch (t) {
                case KV_TYPE_F32:
                    bound = 0;
                    break;
                case KV_TYPE_F16:
                    bound = fabs(x[d]) * 0x1p-11 + 0x1p-25;
                    break;
                case KV_TYPE_Q8: /* binary16 rounding of s adds at most 2^-10 relative */
                    bound = 0.5 * amax / 127.0 * (1 + 0x1p-10) + 0x1p-24;
                    break;
                case KV_TYPE_Q4: /* min rounded down widens the range by <= 2^-11 |min| */
                    bound = 0.5 * ((hi - lo) + fabs(lo) * 0x1p-10) / 15.0 * (1 + 0x1p-10) + 0x1p-23;
                    break;
                }
                if (e > bound * (1 + 1e-6)) bad++;
                se += e * e;
                sx += (double)x[d] * x[d];
            }
        }
        printf(" %s rms rel err %.2e;", kv_type_name(t), sqrt(se / sx));
        CU_ASSERT_EQUAL(bad, 0);
        if (t == KV_TYPE_F32) CU_ASSERT(se == 0.0);
    }
    printf("\n");
    free(rows);
    free(ids);
}

static void test_round_trip(void) {
    kv_model *m = tu_load_shared(M260);
    round_trip_on(m, 1, "stories260K");
    kv_model_free(m);
    m = tu_load_shared(M656);
    round_trip_on(m, 0, "TinyStories-656K");
    kv_model_free(m);
}

/* binary16: every finite half survives half -> f32 -> half; fp32 -> half rounds to nearest
 * even at the midpoints; beyond the range saturates at 65504; NaN stays NaN. */
static void test_f16_conversions(void) {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u) continue;
        if (kv_f32_to_f16(kv_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(kv_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie -> even (1.0) */
    CU_ASSERT_EQUAL(kv_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie -> even (up) */
    CU_ASSERT_EQUAL(kv_f32_to_f16(1e9f), 0x7bff);
    CU_ASSERT_EQUAL(kv_f32_to_f16(-INFINITY), 0xfbff);
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1p-25f), 0x0000); /* half the smallest subnormal: even */
    CU_ASSERT_EQUAL(kv_f32_to_f16(0x1p-24f), 0x0001);
    CU_ASSERT(isnan(kv_f16_to_f32(kv_f32_to_f16(NAN))));
    /* the row decoder (select form) equals the scalar conversion for every pattern */
    long diff = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        unsigned char row[2] = {(unsigned char)(h & 255u), (unsigned char)(h >> 8)};
        float a = 0, b = kv_f16_to_f32((uint16_t)h);
        kv_type_decode_row(KV_TYPE_F16, 1, row, &a);
        if (memcmp(&a, &b, sizeof a) != 0 && !(isnan(a) && isnan(b))) diff++;
    }
    CU_ASSERT_EQUAL(diff, 0);
}

/* Stored bytes per token of one head (K + V): 8 d_h, 4 d_h, 2 d_h + 4, 2 ceil(d_h / 2) + 8;
 * the pool's bytes in use count exactly the blocks held in each type, scales included. */
static void test_bytes_per_token(void) {
    const int hds[2] = {8, 16};
    const size_t want[2][4] = {{64, 32, 20, 16}, {128, 64, 36, 24}};
    kv_error err = {0};
    for (int h = 0; h < 2; h++) {
        int hd = hds[h];
        for (int k = 0; k < 4; k++) CU_ASSERT_EQUAL(kv_type_token_bytes(TYPES[k], hd), want[h][k]);
        /* a pool with 3 blocks of each type; one head per type takes 40 tokens (3 blocks) */
        int counts[KV_CACHE_TYPES] = {3, 3, 3, 3};
        kv_pool pool;
        CU_ASSERT_FATAL(kv_pool_init_typed(&pool, counts, 16, hd, &err) == KV_OK);
        size_t total = 0;
        for (int k = 0; k < 4; k++) total += 3 * 16 * want[h][k];
        CU_ASSERT_EQUAL(kv_pool_storage_bytes(&pool), total);
        kv_cache c;
        CU_ASSERT_FATAL(kv_cache_init(&c, &pool, 1, 4, NULL, KV_POLICY_SINK, &err) == KV_OK);
        CU_ASSERT_FATAL(kv_cache_set_types(&c, TYPES, &err) == KV_OK);
        float row[16];
        size_t used = 0;
        for (int k = 0; k < 4; k++) {
            for (int e = 0; e < 40; e++) {
                for (int d = 0; d < hd; d++) row[d] = (float)(e * 0.37 - d * 1.1 + k);
                CU_ASSERT_FATAL(kv_head_append(&c, &c.heads[k], row, row, e, &err) == KV_OK);
            }
            used += 3 * 16 * want[h][k];
            CU_ASSERT_EQUAL(kv_pool_bytes_in_use(&pool), used);
            CU_ASSERT_EQUAL(kv_pool_block_type(&pool, c.heads[k].table[0]), TYPES[k]);
            /* the entries read back as their stored values */
            float kk[16], vv[16], enc[16];
            unsigned char b[128];
            for (int d = 0; d < hd; d++) row[d] = (float)(39 * 0.37 - d * 1.1 + k);
            kv_type_encode_row(TYPES[k], hd, row, b);
            kv_type_decode_row(TYPES[k], hd, b, enc);
            kv_head_read(&pool, &c.heads[k], 39, kk, vv);
            CU_ASSERT(memcmp(kk, enc, sizeof(float) * (size_t)hd) == 0);
            CU_ASSERT(memcmp(vv, enc, sizeof(float) * (size_t)hd) == 0);
        }
        CU_ASSERT_EQUAL(kv_pool_peak_bytes(&pool), used);
        /* a fourth block of a type whose range is full: exhausted, naming the type */
        for (int e = 40; e < 48; e++)
            CU_ASSERT_FATAL(kv_head_append(&c, &c.heads[2], row, row, e, &err) == KV_OK);
        CU_ASSERT_EQUAL(kv_head_append(&c, &c.heads[2], row, row, 48, &err), KV_EINTERNAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "q8"));
        kv_cache_clear(&c);
        CU_ASSERT_EQUAL(kv_pool_bytes_in_use(&pool), 0);
        kv_cache_destroy(&c);
        kv_pool_destroy(&pool);
    }
}

/* ---- attention on a stored type vs an f32 cache of the dequantised values ---- */

/* The f32 reference: the CPU backend, but every new K/V row is rounded through the type before
 * attention reads it (encode + decode in place), so the cache holds exactly the values the
 * typed cache stores, in f32. */
static kv_cache_type g_round_type;
static int (*g_cpu_write)(kv_backend *, kv_pool *, const kv_slot_write *, int, kv_error *);

static int rounding_write(kv_backend *b, kv_pool *p, const kv_slot_write *w, int n, kv_error *err) {
    int rc = g_cpu_write(b, p, w, n, err);
    unsigned char buf[1024];
    for (int i = 0; !rc && i < n; i++)
        for (int which = 0; which < 2; which++) {
            float *row = (float *)(void *)kv_pool_slot_row(p, w[i].slot, which);
            kv_type_encode_row(g_round_type, p->head_dim, row, buf);
            kv_type_decode_row(g_round_type, p->head_dim, buf, row);
        }
    return rc;
}

/* Run T tokens in steps of 16 with budget B (h2o, so the statistics matter) on a cache of type
 * t; logits [T, V] and the statistics of every head (acc then acc2, [nh][B]) out. */
static void run_typed(const kv_model *m, const int *ids, int T, int B, kv_cache_type t,
                      int rounding, float *logits, float *stats) {
    kv_error err = {0};
    int L = m->cfg.n_layers, Hk = m->cfg.n_kv_heads, hd = m->cfg.head_dim, nh = L * Hk;
    kv_workspace *ws = NULL;
    CU_ASSERT_FATAL(kv_workspace_new(m, 16, m->cfg.seq_len, &ws, &err) == KV_OK);
    const kv_backend_ops *orig = ws->ops;
    kv_backend_ops ops = *ws->ops;
    if (rounding) {
        g_round_type = t;
        g_cpu_write = ws->ops->cache_write;
        ops.cache_write = rounding_write;
        ws->ops = &ops;
    }
    int counts[KV_CACHE_TYPES] = {0};
    counts[rounding ? KV_TYPE_F32 : t] = nh * ((B + 16) / 16 + 1);
    kv_pool pool;
    CU_ASSERT_FATAL(kv_backend_pool_init_typed(ws, &pool, counts, 16, hd, &err) == KV_OK);
    int *bud = malloc(sizeof(int) * (size_t)nh);
    for (int i = 0; i < nh; i++) bud[i] = B;
    kv_cache c;
    CU_ASSERT_FATAL(kv_cache_init(&c, &pool, L, Hk, bud, KV_POLICY_H2O, &err) == KV_OK);
    kv_cache *cp = &c;
    int V = m->cfg.vocab_size;
    for (int s = 0; s < T; s += 16)
        CU_ASSERT_FATAL(kv_forward(m, ws, &cp, 1, ids + s, 16, KV_LOGITS_ALL,
                                   logits + (size_t)s * V, NULL, &err) == KV_OK);
    for (int i = 0; i < nh; i++) {
        CU_ASSERT_EQUAL(c.heads[i].len, B);
        memcpy(stats + (size_t)i * 2 * B, c.heads[i].acc, sizeof(float) * (size_t)B);
        memcpy(stats + (size_t)i * 2 * B + B, c.heads[i].acc2, sizeof(float) * (size_t)B);
    }
    kv_cache_destroy(&c);
    kv_backend_pool_destroy(ws, &pool);
    ws->ops = orig;
    kv_workspace_free(ws);
    free(bud);
}

static void attention_on(const kv_model *m, int is_260k, const char *name) {
    int n = 0;
    int *ids = text_tokens(m, is_260k, &n);
    int T = 256, B = 64, V = m->cfg.vocab_size, nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    CU_ASSERT_FATAL(n >= T);
    float *a = malloc(sizeof(float) * (size_t)T * V), *b = malloc(sizeof(float) * (size_t)T * V);
    float *sa = malloc(sizeof(float) * (size_t)nh * 2 * B),
          *sb = malloc(sizeof(float) * (size_t)nh * 2 * B);
    printf("\n    %s, T %d, h2o budget %d:", name, T, B);
    for (int k = 1; k < 4; k++) {
        run_typed(m, ids, T, B, TYPES[k], 0, a, sa);
        run_typed(m, ids, T, B, TYPES[k], 1, b, sb);
        double dl = 0, ds = 0;
        for (size_t i = 0; i < (size_t)T * V; i++) dl = fmax(dl, fabs((double)a[i] - b[i]));
        for (size_t i = 0; i < (size_t)nh * 2 * B; i++)
            ds = fmax(ds, fabs((double)sa[i] - sb[i]) / (1e-3 + fabs((double)sb[i])));
        printf(" %s max logit diff %.2g, stats rel %.2g;", kv_type_name(TYPES[k]), dl, ds);
        /* the same values in the same order of operations: equal up to the last bits */
        CU_ASSERT(dl <= 1e-5);
        CU_ASSERT(ds <= 1e-5);
    }
    printf("\n");
    free(a), free(b), free(sa), free(sb), free(ids);
}

static void test_attention_vs_dequantised(void) {
    kv_model *m = tu_load_shared(M260);
    attention_on(m, 1, "stories260K");
    kv_model_free(m);
    m = tu_load_shared(M656);
    attention_on(m, 0, "TinyStories-656K");
    kv_model_free(m);
}

/* The F16 default moves full-cache perplexity by rounding only; q8 by little; the ratios are
 * bytes over the full F16 cache. 6 chunks of 512 of the shared text. */
static void ppl_of(const kv_model *m, const int *ids, int n, kv_cache_type t, double *ppl,
                   double *ratio) {
    kv_eval_opts o;
    kv_eval_opts_default(&o, m);
    o.context = 512;
    o.max_chunks = 6;
    o.kv_type = t;
    kv_eval_result r;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_eval_perplexity(m, ids, n, &o, &r, &err) == KV_OK);
    *ppl = r.perplexity;
    *ratio = (double)r.kv_bytes_peak / (double)r.kv_bytes_full;
}

static void test_default_f16_perplexity(void) {
    const char *paths[2] = {M260, M656};
    for (int mi = 0; mi < 2; mi++) {
        kv_model *m = tu_load_shared(paths[mi]);
        int n = 0;
        int *ids = tu_text_tokens(m, mi == 0 ? tu_shared(TOK260) : NULL, 20000, &n);
        CU_ASSERT_FATAL(n >= 6 * 512);
        double p[4], r[4];
        for (int k = 0; k < 4; k++) ppl_of(m, ids, n, TYPES[k], &p[k], &r[k]);
        printf("\n    %s full cache, 6 x 512 tokens: f32 %.6f (bytes %.4g of F16), f16 %.6f "
               "(%.4g, rel %.2g), q8 %.6f (%.4g), q4 %.6f (%.4g)",
               paths[mi], p[0], r[0], p[1], r[1], (p[1] - p[0]) / p[0], p[2], r[2], p[3], r[3]);
        CU_ASSERT(fabs(p[1] - p[0]) <= 1e-4 * p[0]);
        CU_ASSERT(fabs(p[2] - p[0]) <= 1e-2 * p[0]);
        CU_ASSERT(p[3] > p[2]);
        CU_ASSERT_DOUBLE_EQUAL(r[0], 2.0, 1e-12);
        CU_ASSERT_DOUBLE_EQUAL(r[1], 1.0, 1e-12);
        int hd = m->cfg.head_dim;
        CU_ASSERT_DOUBLE_EQUAL(r[2], (double)(2 * hd + 4) / (4.0 * hd), 1e-12);
        CU_ASSERT_DOUBLE_EQUAL(r[3], (double)(2 * ((hd + 1) / 2) + 8) / (4.0 * hd), 1e-12);
        free(ids);
        kv_model_free(m);
    }
    printf("\n");
}

/* ---- plan schema v3 ---- */
static void test_plan_v3(void) {
    kv_model *m = tu_load_shared(M260);
    kv_error err = {0};
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    /* uniform at byte ratio 1/4 in q8: token fraction 0.25 * 32 / 20 = 0.4 */
    kv_plan u;
    CU_ASSERT_FATAL(kv_plan_uniform_typed(&m->cfg, 0.25, KV_TYPE_Q8, 512, 16, 16, KV_POLICY_SINK,
                                          &u, &err) == KV_OK);
    long tok = kv_plan_total_tokens(&u);
    CU_ASSERT_EQUAL(tok, (long)floor(0.4 * nh * 512 / 16 + 1e-9) * 16);
    CU_ASSERT(fabs(kv_plan_bytes(&u) - 0.25 * kv_plan_full_f16_bytes(&u)) <= nh * 16 * 20.0);
    /* mixed types round trip through plan.h5 */
    for (int i = 0; i < nh; i++) u.kv_type[i] = TYPES[i % 4];
    u.ratio = kv_plan_bytes(&u) / kv_plan_full_f16_bytes(&u);
    snprintf(u.model_sha256, sizeof u.model_sha256, "%s", m->sha256);
    const char *path = tu_tmp("v3.h5");
    kv_h5 *f = NULL;
    CU_ASSERT_FATAL(kv_h5_create(path, &f, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_h5_write_provenance(f, "test", m, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_plan_write(f, &u, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_h5_commit(f, &err) == KV_OK);
    kv_plan b;
    CU_ASSERT_FATAL(kv_plan_read(path, &b, &err) == KV_OK);
    CU_ASSERT_EQUAL(b.schema_version, 3);
    CU_ASSERT(memcmp(b.kv_type, u.kv_type, sizeof(kv_cache_type) * (size_t)nh) == 0);
    CU_ASSERT_DOUBLE_EQUAL(b.ratio, u.ratio, 0.0);
    /* the engine runs it: bytes in use <= the plan's bytes + one block per head */
    kv_engine *e = NULL;
    CU_ASSERT_FATAL(kv_engine_new(m, &b, NULL, &e, &err) == KV_OK);
    int n = 0;
    int *ids = tu_text_tokens(m, tu_shared(TOK260), 6000, &n);
    double nll = 0;
    size_t peak = 0;
    CU_ASSERT_FATAL(kv_engine_chunk_nll(e, ids, 512, 1, NULL, NULL, &nll, &peak, &err) == KV_OK);
    double slack = 0;
    for (int i = 0; i < nh; i++) slack += 16.0 * kv_type_token_bytes(b.kv_type[i], 8);
    printf("\n    mixed f32/f16/q8/q4 plan: peak %zu B, plan %.0f B (+%.0f), ppl %.4f\n", peak,
           kv_plan_bytes(&b), slack, exp(nll / 511));
    CU_ASSERT((double)peak <= kv_plan_bytes(&b) + slack);
    kv_engine_free(e);
    /* the same budgets and types as a sequence of their own (kv_engine_seq_open_typed) in an
     * engine whose plan is the full F16 cache and whose pool holds every type: the same NLL and
     * the same peak bytes, bit for bit; in a batch beside a full-cache f16 sequence the peak
     * adds that sequence's stored bytes exactly */
    kv_plan fp;
    CU_ASSERT_FATAL(kv_plan_full(&m->cfg, 512, 16, 16, KV_POLICY_SINK, &fp, &err) == KV_OK);
    kv_engine_opts eo = {.device = KV_DEVICE_CPU, .max_seqs = 2, .type_mask = 0xf};
    CU_ASSERT_FATAL(kv_engine_new(m, &fp, &eo, &e, &err) == KV_OK);
    kv_plan_free(&fp);
    const int *bb[2] = {b.budget, NULL};
    const kv_policy *pp[2] = {b.head_policy, NULL};
    const kv_cache_type *tt[2] = {b.kv_type, NULL};
    double n2[2] = {0, 0};
    size_t pk2 = 0;
    CU_ASSERT_FATAL(kv_engine_chunk_score_typed(e, ids, 512, 1, bb, pp, tt, NULL, n2, NULL, &pk2,
                                                &err) == KV_OK);
    CU_ASSERT_DOUBLE_EQUAL(n2[0], nll, 0.0);
    CU_ASSERT_EQUAL(pk2, peak);
    CU_ASSERT_FATAL(kv_engine_chunk_score_typed(e, ids, 512, 2, bb, pp, tt, NULL, n2, NULL, &pk2,
                                                &err) == KV_OK);
    CU_ASSERT_EQUAL(pk2, peak + (size_t)nh * 512 * kv_type_token_bytes(KV_TYPE_F16, 8));
    CU_ASSERT_DOUBLE_EQUAL(n2[0], nll, 1e-4 * nll); /* batched: rounding only */
    /* a type the pool does not hold is refused, naming it */
    kv_engine_free(e);
    eo.type_mask = 0;
    CU_ASSERT_FATAL(kv_engine_new(m, &u, &eo, &e, &err) == KV_OK); /* u: f32/f16/q8/q4 */
    kv_cache_type all_q8[64];
    for (int i = 0; i < nh; i++) all_q8[i] = KV_TYPE_Q8;
    all_q8[0] = KV_TYPE_F32;
    int sq = -1;
    CU_ASSERT_EQUAL(kv_engine_seq_open_typed(e, NULL, NULL, all_q8, &sq, &err), KV_OK);
    kv_engine_seq_close(e, sq);
    kv_engine_free(e);
    kv_plan fq;
    CU_ASSERT_FATAL(kv_plan_full(&m->cfg, 512, 16, 16, KV_POLICY_SINK, &fq, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_engine_new(m, &fq, &eo, &e, &err) == KV_OK); /* f16 blocks only */
    kv_plan_free(&fq);
    CU_ASSERT_EQUAL(kv_engine_seq_open_typed(e, NULL, NULL, all_q8, &sq, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "does not hold"));
    kv_engine_free(e);
    /* validation: a type code out of range; a byte ratio the budgets do not keep */
    b.kv_type[3] = (kv_cache_type)7;
    CU_ASSERT_EQUAL(kv_plan_validate(&b, "p", &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "KV type"));
    for (int i = 0; i < nh; i++) b.kv_type[i] = KV_TYPE_F32;
    CU_ASSERT_EQUAL(kv_plan_validate(&b, "p", &err), KV_EINPUT); /* bytes moved, ratio kept */
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "bytes"));
    /* a type above what the full cache holds */
    kv_plan q;
    CU_ASSERT_EQUAL(
        kv_plan_uniform_typed(&m->cfg, 0.9, KV_TYPE_Q4, 512, 16, 16, KV_POLICY_SINK, &q, &err),
        KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "more than the full cache in q4"));
    /* a v2 plan (no /budget/kv_type: made when K/V were f32; the shipped plans were v2 until
     * issue 24 re-made them) reads as f32 with twice its token ratio: a uniform 1/16 plan
     * written, its types dataset removed */
    kv_plan v2, s;
    CU_ASSERT_FATAL(kv_plan_uniform(&m->cfg, 0.0625, 512, 4, 4, KV_POLICY_SINK, &v2, &err) ==
                    KV_OK);
    snprintf(v2.model_sha256, sizeof v2.model_sha256, "%s", m->sha256);
    kv_h5 *f2 = NULL;
    CU_ASSERT_FATAL(kv_h5_create(tu_tmp("v2.h5"), &f2, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_h5_write_provenance(f2, "test", m, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_plan_write(f2, &v2, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_h5_commit(f2, &err) == KV_OK);
    hid_t h = H5Fopen(tu_tmp("v2.h5"), H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(h >= 0);
    CU_ASSERT(H5Ldelete(h, "/budget/kv_type", H5P_DEFAULT) >= 0);
    /* a v2 plan predates the budget checksum too (it would cover the types removed here) */
    CU_ASSERT(H5Adelete_by_name(h, "/budget", "sha256", H5P_DEFAULT) >= 0);
    H5Fclose(h);
    CU_ASSERT_FATAL(kv_plan_read(tu_tmp("v2.h5"), &s, &err) == KV_OK);
    CU_ASSERT_EQUAL(s.schema_version, 2);
    CU_ASSERT_EQUAL(s.kv_type[0], KV_TYPE_F32);
    CU_ASSERT(fabs(kv_plan_bytes(&s) - s.ratio * kv_plan_full_f16_bytes(&s)) <=
              nh * s.block_size * 64.0);
    printf("    v2 plan of token ratio 1/16: ratio %.6g of the F16 cache (f32 heads)\n", s.ratio);
    CU_ASSERT(fabs(s.ratio - 0.125) <= nh * s.block_size * 64.0 / kv_plan_full_f16_bytes(&s));
    kv_plan_free(&s);
    kv_plan_free(&v2);
    kv_plan_free(&b);
    kv_plan_free(&u);
    free(ids);
    kv_model_free(m);
}

/* The CLI: kvplan plan --kv-type q8 at R = 1/4 of the F16 bytes keeps 0.4 of the tokens;
 * inspect shows the type per head in text, JSON and the kv-types-tsv export; eval runs it with
 * bytes within one block per head of the plan. */
static void test_cli_kv_type(void) {
    char args[4096], *out = NULL;
    const char *plan = tu_tmp("q8.h5");
    snprintf(args, sizeof args,
             "plan --model '%s' --ratio 0.25 --kv-type q8 --allocation uniform --context 512 "
             "--quiet -o %s",
             tu_shared(M260), plan);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    snprintf(args, sizeof args, "inspect %s --export kv-types-tsv", plan);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT_TRUE(out && strstr(out, "q8\tq8\tq8\tq8\n"));
    free(out);
    snprintf(args, sizeof args, "inspect %s --json", plan);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT_TRUE(out && strstr(out, "\"kv_types\":[[\"q8\",\"q8\""));
    CU_ASSERT_TRUE(out && strstr(out, "\"kv_bytes\":81920"));
    free(out);
    snprintf(args, sizeof args, "inspect %s", plan);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT_TRUE(out && strstr(out, "0.2500 of the full F16 cache"));
    free(out);
    snprintf(args, sizeof args,
             "eval '%s' --tokenizer '%s' --text '%s' --plan %s --max-tokens 1024 --json --quiet",
             tu_shared(M260), tu_shared(TOK260), tu_shared(TEXT), plan);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    const char *pk = out ? strstr(out, "\"kv_bytes_peak\":") : NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(pk);
    double peak = atof(pk + 16);
    printf("\n    q8 plan at R 1/4: peak %.0f B, plan 81920 B (+%d per block and head)\n", peak,
           16 * 20);
    CU_ASSERT(peak <= 81920 + 20 * 16 * 20);
    free(out);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"row round trip within each type's bound (real K/V, both models)", test_round_trip},
        {"binary16 conversions: exhaustive round trip, ties to even, saturation",
         test_f16_conversions},
        {"bytes per token per type and the pool's byte accounting", test_bytes_per_token},
        {"attention on f16/q8/q4 = f32 cache of the dequantised values",
         test_attention_vs_dequantised},
        {"full-cache perplexity per type (F16 default moves by rounding)",
         test_default_f16_perplexity},
        {"plan schema v3: per-head types, byte ratio, engine bytes", test_plan_v3},
        {"CLI: plan --kv-type, inspect text/JSON/TSV, eval bytes", test_cli_kv_type},
    };
    return tu_main(argc, argv, "kvtype", tests, sizeof tests / sizeof tests[0]);
}
