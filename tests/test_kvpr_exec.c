/* KVPR executor tests (runtime/offload/kvpr_exec.c): on the real stories260K checkpoint (adjacent
 * RoPE) and the TinyStories-656K Hugging Face directory (rotate-half RoPE, GQA 8/4) with
 * tokens of real text, the K and V rebuilt from X[0:l] and K, V [l:s'] equal what the
 * ordinary forward pass stored in its paged cache for l = 0, 1, s'/2, s'-1, s'; the rebuilt
 * V also equals the independent double-precision reference's V; decode steps over the
 * rebuilt caches give the ordinary decode logits; bad inputs give clear errors. A timing
 * report of t_recompute vs t_transfer at a larger synthetic shape closes the suite.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "kvplan/kvcache.h"
#include "offload/kvpr_exec.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"
#include "naive_ref.h"
#include "testutil.h"

#define M260 "models/stories260K/stories260K.bin"
#define TOK260 "models/stories260K/tok512.bin"
#define M656 "models/tinystories-656k"
#define TEXT "text/tinystories_val_head.txt"

#define PREFILL 48 /* s' */
#define STEPS 4    /* decode steps compared */

/* Tokens of the TinyStories text with the model's tokenizer (tok_path NULL: embedded/HF). */
static int *text_tokens(const kv_model *m, const char *tok_path, int *n) {
    int *ids = tu_text_tokens(m, tok_path, 2000, n);
    CU_ASSERT_FATAL(*n >= PREFILL + STEPS);
    return ids;
}

/* x_in of every layer during one prefill call: [L, rows, dim]. */
typedef struct capture {
    int dim;
    int rows;
    float *x_in;
} capture;

static void cap_after_attn(void *user, int layer, int rows, const float *x_in, const float *o,
                           const float *v, const float *attn_out) {
    (void)o, (void)v, (void)attn_out;
    capture *c = user;
    if (rows != c->rows) return;
    memcpy(c->x_in + (size_t)layer * rows * c->dim, x_in, (size_t)rows * c->dim * sizeof(float));
}

/* A prefilled full cache of PREFILL tokens with the x_in capture. */
typedef struct prefilled {
    kv_pool pool;
    kv_cache cache;
    kv_workspace *ws;
    capture cap;
    float *logits; /* [vocab] after the prefill */
} prefilled;

static void prefill(const kv_model *m, const int *ids, prefilled *p) {
    const kv_config *c = &m->cfg;
    kv_error err = {0};
    int L = c->n_layers, Hk = c->n_kv_heads, ctx = PREFILL + STEPS;
    CU_ASSERT_FATAL(kv_pool_init(&p->pool, L * Hk * (ctx / 16 + 1), 16, c->head_dim, &err) ==
                    KV_OK);
    CU_ASSERT_FATAL(kv_cache_init(&p->cache, &p->pool, L, Hk, NULL, KV_POLICY_SINK, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_workspace_new(m, PREFILL, ctx, &p->ws, &err) == KV_OK);
    p->cap.dim = c->dim;
    p->cap.rows = PREFILL;
    p->cap.x_in = calloc((size_t)L * PREFILL * c->dim, sizeof(float));
    p->logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    CU_ASSERT_FATAL(p->cap.x_in && p->logits);
    kv_hooks hk = {.user = &p->cap, .after_attn = cap_after_attn};
    kv_cache *cp = &p->cache;
    int rc = kv_forward(m, p->ws, &cp, 1, ids, PREFILL, KV_LOGITS_LAST, p->logits, &hk, &err);
    if (rc) fprintf(stderr, "prefill: %s\n", err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
}

static void prefilled_free(prefilled *p) {
    kv_workspace_free(p->ws);
    kv_cache_destroy(&p->cache);
    kv_pool_destroy(&p->pool);
    free(p->cap.x_in);
    free(p->logits);
}

static int splits(int s, int out[5]) {
    out[0] = 0, out[1] = 1, out[2] = s / 2, out[3] = s - 1, out[4] = s;
    return 5;
}

/* Rebuilt K, V == the cache's K, V (and V == the double reference's V) for every layer and
 * split, with the two parts in sequence and overlapped. */
static void rebuild_matches(const char *name, const kv_model *m, const int *ids) {
    const kv_config *c = &m->cfg;
    int L = c->n_layers, Hk = c->n_kv_heads, hd = c->head_dim, kvd = Hk * hd, S = PREFILL;
    prefilled p;
    prefill(m, ids, &p);
    /* independent reference: V in double precision */
    tu_capture ref = {0};
    ref.x_in = calloc((size_t)L * S * c->dim, sizeof(double));
    ref.o = calloc((size_t)L * S * c->n_heads * hd, sizeof(double));
    ref.v = calloc((size_t)L * S * kvd, sizeof(double));
    ref.attn_out = calloc((size_t)L * S * c->dim, sizeof(double));
    ref.x_out = calloc((size_t)L * S * c->dim, sizeof(double));
    tu_naive_forward(m, ids, S, NULL, &ref);

    kv_error err = {0};
    kv_kvpr_exec *e = NULL;
    CU_ASSERT_FATAL(kv_kvpr_exec_new(m, S + STEPS, &e, &err) == KV_OK);
    float *K = malloc(sizeof(float) * (size_t)S * kvd),
          *V = malloc(sizeof(float) * (size_t)S * kvd);
    int ls[5], nl = splits(S, ls);
    double ek = 0, ev = 0, eref = 0, etail = 0;
    for (int layer = 0; layer < L; layer++)
        for (int si = 0; si < nl; si++)
            for (int overlap = 0; overlap < 2; overlap++) {
                kv_kvpr_layer lc;
                int rc = kv_kvpr_layer_offload(
                    m, &p.cache, layer, p.cap.x_in + (size_t)layer * S * c->dim, ls[si], &lc, &err);
                if (rc) fprintf(stderr, "offload: %s\n", err.msg);
                CU_ASSERT_FATAL(rc == KV_OK);
                CU_ASSERT(lc.seq == S && lc.split == ls[si]);
                for (size_t i = 0; i < (size_t)S * kvd; i++) K[i] = V[i] = NAN;
                kv_kvpr_timing t;
                rc = kv_kvpr_rebuild(e, &lc, K, V, overlap, &t, &err);
                if (rc) fprintf(stderr, "rebuild: %s\n", err.msg);
                CU_ASSERT_FATAL(rc == KV_OK);
                CU_ASSERT(t.flops == 4.0 * ls[si] * c->dim * kvd);
                CU_ASSERT(t.bytes_kv == 2.0 * (S - ls[si]) * kvd * 4.0);
                CU_ASSERT(t.bytes_activations == (double)ls[si] * c->dim * 4.0);
                kv_head *heads = kv_cache_head(&p.cache, layer, 0);
                for (int j = 0; j < Hk; j++)
                    for (int i = 0; i < S; i++) {
                        const float *ck = kv_head_k(&p.pool, &heads[j], i);
                        const float *cv = kv_head_v(&p.pool, &heads[j], i);
                        for (int d = 0; d < hd; d++) {
                            size_t at = (size_t)i * kvd + (size_t)j * hd + d;
                            double dk = fabs((double)K[at] - ck[d]);
                            double dv = fabs((double)V[at] - cv[d]);
                            if (isnan(dk) || isnan(dv)) dk = dv = INFINITY;
                            if (i < ls[si]) {
                                ek = dk > ek ? dk : ek;
                                ev = dv > ev ? dv : ev;
                            } else {
                                double dd = dk > dv ? dk : dv;
                                etail = dd > etail ? dd : etail;
                            }
                            double dr =
                                fabs(V[at] - ref.v[((size_t)layer * S + i) * kvd + j * hd + d]);
                            eref = dr > eref ? dr : eref;
                        }
                    }
                kv_kvpr_layer_free(&lc);
            }
    printf("\n    %s: recomputed rows vs cache: max |dK| %.3g, |dV| %.3g; transferred rows %.3g; "
           "V vs double reference %.3g\n",
           name, ek, ev, etail, eref);
    CU_ASSERT(ek <= 1e-5);
    CU_ASSERT(ev <= 1e-5);
    CU_ASSERT(etail == 0.0);
    CU_ASSERT(eref <= 1e-4);
    free(K), free(V);
    free(ref.x_in), free(ref.o), free(ref.v), free(ref.attn_out), free(ref.x_out);
    kv_kvpr_exec_free(e);
    prefilled_free(&p);
}

/* STEPS decode steps: the executor over offloaded caches vs the ordinary forward pass. */
static void decode_matches(const char *name, const kv_model *m, const int *ids) {
    const kv_config *c = &m->cfg;
    int L = c->n_layers, S = PREFILL, V = c->vocab_size;
    int ls[5], nl = splits(S, ls);
    float *ref = malloc(sizeof(float) * (size_t)STEPS * V);
    float *got = malloc(sizeof(float) * (size_t)V);
    kv_kvpr_layer *layers = calloc((size_t)L, sizeof *layers);
    kv_kvpr_timing *tim = calloc((size_t)L, sizeof *tim);
    CU_ASSERT_FATAL(ref && got && layers && tim);
    double worst = 0, scale = 0;
    kv_error err = {0};
    for (int si = 0; si < nl; si++) {
        prefilled p;
        prefill(m, ids, &p);
        for (int l = 0; l < L; l++)
            CU_ASSERT_FATAL(kv_kvpr_layer_offload(m, &p.cache, l,
                                                  p.cap.x_in + (size_t)l * S * c->dim, ls[si],
                                                  &layers[l], &err) == KV_OK);
        /* ordinary decode, teacher-forced on the text */
        kv_cache *cp = &p.cache;
        for (int s = 0; s < STEPS; s++)
            CU_ASSERT_FATAL(kv_forward(m, p.ws, &cp, 1, ids + S + s, 1, KV_LOGITS_LAST,
                                       ref + (size_t)s * V, NULL, &err) == KV_OK);
        kv_kvpr_exec *e = NULL;
        CU_ASSERT_FATAL(kv_kvpr_exec_new(m, S + STEPS, &e, &err) == KV_OK);
        for (int s = 0; s < STEPS; s++) {
            int rc = kv_kvpr_decode(e, layers, ids[S + s], got, s & 1, tim, &err);
            if (rc) fprintf(stderr, "kvpr decode: %s\n", err.msg);
            CU_ASSERT_FATAL(rc == KV_OK);
            for (int l = 0; l < L; l++) {
                CU_ASSERT(layers[l].seq == S + s + 1 && layers[l].split == ls[si]);
                CU_ASSERT(tim[l].flops == 4.0 * ls[si] * c->dim * layers[l].kv_width);
            }
            for (int i = 0; i < V; i++) {
                double d = fabs((double)got[i] - ref[(size_t)s * V + i]);
                worst = d > worst ? d : worst;
                double a = fabs(ref[(size_t)s * V + i]);
                scale = a > scale ? a : scale;
            }
        }
        kv_kvpr_exec_free(e);
        for (int l = 0; l < L; l++) kv_kvpr_layer_free(&layers[l]);
        prefilled_free(&p);
    }
    printf("\n    %s: %d decode steps x 5 splits: max |logit diff| %.3g (max |logit| %.3g)\n", name,
           STEPS, worst, scale);
    CU_ASSERT(worst <= 1e-4);
    free(ref), free(got), free(layers), free(tim);
}

static void test_rebuild_260k(void) {
    kv_model *m = tu_load_shared(M260);
    int n = 0;
    int *ids = text_tokens(m, tu_shared(TOK260), &n);
    rebuild_matches("stories260K", m, ids);
    free(ids);
    kv_model_free(m);
}

static void test_rebuild_656k(void) {
    kv_model *m = tu_load_shared(M656);
    CU_ASSERT_EQUAL(m->cfg.rope_layout, KV_ROPE_HALF);
    int n = 0;
    int *ids = text_tokens(m, NULL, &n);
    rebuild_matches("tinystories-656k", m, ids);
    free(ids);
    kv_model_free(m);
}

static void test_decode_260k(void) {
    kv_model *m = tu_load_shared(M260);
    int n = 0;
    int *ids = text_tokens(m, tu_shared(TOK260), &n);
    decode_matches("stories260K", m, ids);
    free(ids);
    kv_model_free(m);
}

static void test_decode_656k(void) {
    kv_model *m = tu_load_shared(M656);
    int n = 0;
    int *ids = text_tokens(m, NULL, &n);
    decode_matches("tinystories-656k", m, ids);
    free(ids);
    kv_model_free(m);
}

/* err has code KV_EINPUT and its message contains `want`. */
static void expect_input_error(int rc, const kv_error *err, const char *want) {
    CU_ASSERT_EQUAL(rc, KV_EINPUT);
    CU_ASSERT_EQUAL(err->code, KV_EINPUT);
    int ok = strstr(err->msg, want) != NULL;
    if (!ok) fprintf(stderr, "\n    expected \"%s\" in \"%s\"\n", want, err->msg);
    CU_ASSERT(ok);
}

static void test_bad_inputs(void) {
    kv_model *m = tu_load_shared(M260);
    const kv_config *c = &m->cfg;
    int n = 0;
    int *ids = text_tokens(m, tu_shared(TOK260), &n);
    int S = PREFILL, L = c->n_layers;
    prefilled p;
    prefill(m, ids, &p);
    const float *x0 = p.cap.x_in;
    kv_error err = {0};
    kv_kvpr_layer lc;
    /* offload */
    expect_input_error(kv_kvpr_layer_offload(m, &p.cache, 0, x0, -1, &lc, &err), &err,
                       "split l = -1 outside 0..s' = 48");
    CU_ASSERT(lc.x == NULL && lc.k == NULL && lc.v == NULL);
    expect_input_error(kv_kvpr_layer_offload(m, &p.cache, 0, x0, S + 1, &lc, &err), &err,
                       "split l = 49 outside 0..s' = 48");
    expect_input_error(kv_kvpr_layer_offload(m, &p.cache, 0, NULL, 3, &lc, &err), &err,
                       "no activations");
    expect_input_error(kv_kvpr_layer_offload(m, &p.cache, L, x0, 3, &lc, &err), &err,
                       "layer 5 outside 0..4");
    CU_ASSERT(kv_kvpr_layer_offload(m, &p.cache, 0, NULL, 0, &lc, &err) == KV_OK); /* l = 0 */
    kv_kvpr_layer_free(&lc);
    /* executor */
    kv_kvpr_exec *e = NULL;
    expect_input_error(kv_kvpr_exec_new(m, 0, &e, &err), &err, "max_ctx = 0");
    CU_ASSERT(e == NULL);
    CU_ASSERT_FATAL(kv_kvpr_exec_new(m, S, &e, &err) == KV_OK);
    int kvd = c->n_kv_heads * c->head_dim;
    float *K = malloc(sizeof(float) * (size_t)S * kvd),
          *V = malloc(sizeof(float) * (size_t)S * kvd);
    CU_ASSERT_FATAL(kv_kvpr_layer_offload(m, &p.cache, 1, x0 + (size_t)S * c->dim, 10, &lc, &err) ==
                    KV_OK);
    kv_kvpr_layer bad = lc;
    bad.split = -2;
    expect_input_error(kv_kvpr_rebuild(e, &bad, K, V, 0, NULL, &err), &err,
                       "split l = -2 outside 0..s' = 48");
    bad = lc, bad.split = S + 5;
    expect_input_error(kv_kvpr_rebuild(e, &bad, K, V, 0, NULL, &err), &err,
                       "split l = 53 outside 0..s' = 48");
    bad = lc, bad.x = NULL;
    expect_input_error(kv_kvpr_rebuild(e, &bad, K, V, 0, NULL, &err), &err,
                       "no activations X[0:l]");
    bad = lc, bad.k = NULL;
    expect_input_error(kv_kvpr_rebuild(e, &bad, K, V, 0, NULL, &err), &err, "K or V is NULL");
    bad = lc, bad.layer = -1;
    expect_input_error(kv_kvpr_rebuild(e, &bad, K, V, 0, NULL, &err), &err, "layer -1 outside");
    bad = lc, bad.kv_width = 7;
    expect_input_error(kv_kvpr_rebuild(e, &bad, K, V, 0, NULL, &err), &err, "widths");
    expect_input_error(kv_kvpr_rebuild(e, &lc, NULL, V, 0, NULL, &err), &err, "no output");
    /* decode: s' + 1 beyond the executor, a bad token, layers out of order or unequal */
    kv_kvpr_layer *layers = calloc((size_t)L, sizeof *layers);
    for (int l = 0; l < L; l++)
        CU_ASSERT_FATAL(kv_kvpr_layer_offload(m, &p.cache, l, x0 + (size_t)l * S * c->dim, S / 2,
                                              &layers[l], &err) == KV_OK);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    expect_input_error(kv_kvpr_decode(e, layers, 5, logits, 0, NULL, &err), &err,
                       "position 48 needs 49 entries");
    kv_kvpr_exec_free(e);
    CU_ASSERT_FATAL(kv_kvpr_exec_new(m, S + 1, &e, &err) == KV_OK);
    expect_input_error(kv_kvpr_decode(e, layers, c->vocab_size, logits, 0, NULL, &err), &err,
                       "outside the vocabulary");
    layers[2].seq--;
    expect_input_error(kv_kvpr_decode(e, layers, 5, logits, 0, NULL, &err), &err,
                       "layer 2 holds s' = 47");
    layers[2].seq++;
    layers[3].layer = 4;
    expect_input_error(kv_kvpr_decode(e, layers, 5, logits, 0, NULL, &err), &err,
                       "layers[3] is layer 4");
    layers[3].layer = 3;
    for (int l = 0; l < L; l++) CU_ASSERT(layers[l].seq == S); /* failures changed nothing */
    CU_ASSERT(kv_kvpr_decode(e, layers, 5, logits, 1, NULL, &err) == KV_OK);
    for (int l = 0; l < L; l++) kv_kvpr_layer_free(&layers[l]);
    free(layers), free(logits);
    kv_kvpr_layer_free(&lc);
    kv_kvpr_exec_free(e);
    prefilled_free(&p);

    /* a cache that evicted entries cannot be offloaded */
    int *bud = malloc(sizeof(int) * (size_t)(L * c->n_kv_heads));
    for (int i = 0; i < L * c->n_kv_heads; i++) bud[i] = 24;
    kv_pool pool;
    kv_cache cc;
    kv_workspace *ws = NULL;
    CU_ASSERT_FATAL(kv_pool_init(&pool, L * c->n_kv_heads * 4, 16, c->head_dim, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_cache_init(&cc, &pool, L, c->n_kv_heads, bud, KV_POLICY_SINK, &err) ==
                    KV_OK);
    CU_ASSERT_FATAL(kv_workspace_new(m, 8, S, &ws, &err) == KV_OK);
    kv_cache *cp = &cc;
    for (int t = 0; t < S; t += 8)
        CU_ASSERT_FATAL(kv_forward(m, ws, &cp, 1, ids + t, 8, KV_LOGITS_NONE, NULL, NULL, &err) ==
                        KV_OK);
    expect_input_error(kv_kvpr_layer_offload(m, &cc, 0, NULL, 0, &lc, &err), &err,
                       "evicted entries");
    kv_workspace_free(ws);
    kv_cache_destroy(&cc);
    kv_pool_destroy(&pool);
    free(bud), free(K), free(V), free(ids);
    kv_model_free(m);
}

/* Timing report at a larger synthetic layer: h = 1024, H_kv * d_h = 256 (GQA 4), s' = 4096,
 * random weights. Checks only that the rebuild gives the same bits in sequence and
 * overlapped; the times are printed, not asserted (they depend on the machine's load).
 * t_seq / t_overlap: wall time of the rebuild with the two parts in sequence / on two
 * threads; GFLOP/s and GB/s are N / t_recompute and M_KV / t_transfer of the sequential run. */
static void test_timing_report(void) {
    kv_model mm;
    memset(&mm, 0, sizeof mm);
    kv_config *c = &mm.cfg;
    c->dim = 1024, c->hidden_dim = 4, c->n_layers = 1, c->n_heads = 8, c->n_kv_heads = 2;
    c->head_dim = 128, c->vocab_size = 4, c->seq_len = 4096, c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f, c->rope_layout = KV_ROPE_HALF;
    int S = 4096, dim = c->dim, kvd = c->n_kv_heads * c->head_dim;
    float *wk = malloc(sizeof(float) * (size_t)kvd * dim),
          *wv = malloc(sizeof(float) * (size_t)kvd * dim);
    float *norm = malloc(sizeof(float) * (size_t)dim);
    float *x = malloc(sizeof(float) * (size_t)S * dim);
    float *tk = malloc(sizeof(float) * (size_t)S * kvd),
          *tv = malloc(sizeof(float) * (size_t)S * kvd);
    float *K1 = malloc(sizeof(float) * (size_t)S * kvd),
          *V1 = malloc(sizeof(float) * (size_t)S * kvd);
    float *K2 = malloc(sizeof(float) * (size_t)S * kvd),
          *V2 = malloc(sizeof(float) * (size_t)S * kvd);
    CU_ASSERT_FATAL(wk && wv && norm && x && tk && tv && K1 && V1 && K2 && V2);
    unsigned s = 12345u;
#define RND() ((s = s * 1103515245u + 12345u), ((float)((s >> 8) & 0xffff) / 65536.0f - 0.5f))
    for (size_t i = 0; i < (size_t)kvd * dim; i++) wk[i] = RND() * 0.05f, wv[i] = RND() * 0.05f;
    for (int i = 0; i < dim; i++) norm[i] = 1.0f;
    for (size_t i = 0; i < (size_t)S * dim; i++) x[i] = RND();
    for (size_t i = 0; i < (size_t)S * kvd; i++) tk[i] = RND(), tv[i] = RND();
#undef RND
    kv_layer_weights lw;
    memset(&lw, 0, sizeof lw);
    lw.attn_norm = norm, lw.wk = kv_weight_f32(wk), lw.wv = kv_weight_f32(wv);
    mm.layers = &lw;
    kv_error err = {0};
    kv_kvpr_exec *e = NULL;
    CU_ASSERT_FATAL(kv_kvpr_exec_new(&mm, S, &e, &err) == KV_OK);
    printf("\n    synthetic layer h = %d, h_kv = %d, s' = %d (fp32, b = 1):\n", dim, kvd, S);
    printf("    %6s %12s %12s %12s %12s %10s %10s\n", "l", "t_recomp ms", "t_xfer ms", "t_seq ms",
           "t_overlap ms", "GFLOP/s", "GB/s");
    int ls[5] = {0, S / 8, S / 4, S / 2, S};
    for (int i = 0; i < 5; i++) {
        kv_kvpr_layer lc = {.layer = 0,
                            .seq = S,
                            .split = ls[i],
                            .dim = dim,
                            .kv_width = kvd,
                            .x = ls[i] ? x : NULL,
                            .k = ls[i] < S ? tk : NULL,
                            .v = ls[i] < S ? tv : NULL};
        /* best of 3 after a warm-up (first touch of the outputs), per mode and per part */
        kv_kvpr_timing t1 = {0}, t2 = {0}, t;
        for (int rep = 0; rep < 4; rep++) {
            CU_ASSERT_FATAL(kv_kvpr_rebuild(e, &lc, K1, V1, 0, &t, &err) == KV_OK);
            if (rep == 1 || (rep > 1 && t.t_total < t1.t_total)) t1 = t;
            CU_ASSERT_FATAL(kv_kvpr_rebuild(e, &lc, K2, V2, 1, &t, &err) == KV_OK);
            if (rep == 1 || (rep > 1 && t.t_total < t2.t_total)) t2 = t;
        }
        CU_ASSERT(memcmp(K1, K2, sizeof(float) * (size_t)S * kvd) == 0);
        CU_ASSERT(memcmp(V1, V2, sizeof(float) * (size_t)S * kvd) == 0);
        if (ls[i] < S) CU_ASSERT(memcmp(K1 + (size_t)ls[i] * kvd, tk, sizeof(float) * 16) == 0);
        printf("    %6d %12.3f %12.3f %12.3f %12.3f %10.2f %10.2f\n", ls[i], 1e3 * t1.t_recompute,
               1e3 * t1.t_transfer, 1e3 * t1.t_total, 1e3 * t2.t_total,
               t1.t_recompute > 0 ? t1.flops / t1.t_recompute * 1e-9 : 0.0,
               t1.t_transfer > 0 ? t1.bytes_kv / t1.t_transfer * 1e-9 : 0.0);
    }
    kv_kvpr_exec_free(e);
    free(wk), free(wv), free(norm), free(x), free(tk), free(tv), free(K1), free(V1), free(K2),
        free(V2);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"rebuilt K, V equal the cache (stories260K)", test_rebuild_260k},
        {"rebuilt K, V equal the cache (tinystories-656k, rotate-half)", test_rebuild_656k},
        {"decode over rebuilt caches (stories260K)", test_decode_260k},
        {"decode over rebuilt caches (tinystories-656k)", test_decode_656k},
        {"bad inputs give clear errors", test_bad_inputs},
        {"timing report t_recompute vs t_transfer", test_timing_report},
    };
    return tu_main(argc, argv, "kvpr_exec", tests, sizeof tests / sizeof tests[0]);
}
