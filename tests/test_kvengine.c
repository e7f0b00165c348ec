/* The engine (kvplan/engine.h) on the real stories260K checkpoint and TinyStories text:
 * per-head policies evict by their own rule, batched budget sets equal the same sets run one
 * by one, a forked sequence decodes like its source, bytes in use follow the blocks held, and
 * the engine refuses plans and devices it cannot run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/eval.h"
#include "kvplan/tokenizer.h"
#include "testutil.h"

#define M260 "models/stories260K/stories260K.bin"
#define TEXT "text/tinystories_val_head.txt"

static int *text_tokens(const kv_model *m, int *n) {
    return tu_text_tokens(m, NULL, 40000, n);
}

/* A plan whose layer-0 heads use sink, layer-1 heads h2o and the rest l2attn: after a prefill
 * of 200 tokens with budget 48 and p = 1, every head holds what its own policy keeps, and
 * the steps attended min(t + 1, 48) entries per head for token t. */
static void test_per_head_policies(void) {
    kv_model *m = tu_load_shared(M260);
    int n = 0, *ids = text_tokens(m, &n);
    kv_error err = {0};
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads, B = 48;
    int *bud = malloc(sizeof(int) * (size_t)nh);
    kv_policy *pol = malloc(sizeof(kv_policy) * (size_t)nh);
    for (int i = 0; i < nh; i++) {
        int l = i / m->cfg.n_kv_heads;
        bud[i] = B;
        pol[i] = l == 0 ? KV_POLICY_SINK : l == 1 ? KV_POLICY_H2O : KV_POLICY_L2ATTN;
    }
    kv_plan plan;
    CU_ASSERT_FATAL(kv_plan_from_budgets(&m->cfg, bud, pol, KV_POLICY_SINK, 48.0 / 512, 512, 16, 1,
                                         "custom", NAN, NAN, NAN, 0, &plan, &err) == KV_OK);
    CU_ASSERT(kv_plan_mixed_policies(&plan));
    kv_engine *e = NULL;
    kv_engine_opts o = {.device = KV_DEVICE_CPU, .max_seqs = 2};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &o, &e, &err) == KV_OK);
    int seq = -1, T = 200;
    CU_ASSERT_FATAL(kv_engine_seq_open(e, NULL, NULL, &seq, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_engine_prefill(e, seq, ids, T, KV_LOGITS_NONE, NULL, NULL, &err) == KV_OK);
    /* the attention work the budget leaves: token t attends min(t + 1, B) entries per head
     * (p = 1: one token a step, appended after the eviction) */
    unsigned long long work = 0;
    for (int t = 0; t < T; t++) work += (unsigned long long)(t + 1 < B ? t + 1 : B);
    CU_ASSERT_EQUAL(kv_backend_attended(kv_engine_backend(e)), (unsigned long long)nh * work);
    kv_cache *c = kv_engine_cache(e, seq);
    for (int i = 0; i < nh; i++) {
        const kv_head *h = &c->heads[i];
        CU_ASSERT_EQUAL(h->len, B);
        CU_ASSERT_EQUAL(h->policy, pol[i]);
        /* every policy keeps the newest token (it arrived after the last eviction) */
        CU_ASSERT_EQUAL(h->pos[h->len - 1], T - 1);
        if (h->policy == KV_POLICY_SINK) {
            /* StreamingLLM: positions 0..3 and the 44 most recent, nothing else */
            for (int k = 0; k < 4; k++) CU_ASSERT_EQUAL(h->pos[k], k);
            for (int k = 4; k < B; k++) CU_ASSERT_EQUAL(h->pos[k], T - B + k);
        } else if (h->policy == KV_POLICY_H2O) {
            /* H2O keeps the recent half of its budget at the last eviction (24 of 47) */
            for (int k = 0; k < 24; k++) CU_ASSERT_EQUAL(h->pos[B - 1 - k], T - 1 - k);
            CU_ASSERT(h->track_stats);
        } else {
            /* l2attn protects the 10 newest keys (KV-Compress's excluded window) */
            for (int k = 0; k < KV_L2_EXCLUDED_WINDOW; k++)
                CU_ASSERT_EQUAL(h->pos[B - 1 - k], T - 1 - k);
            CU_ASSERT(h->track_stats);
        }
    }
    /* the sink heads are not the h2o heads' selection: the policies really differ */
    int differ = 0;
    for (int k = 0; k < B; k++) differ |= c->heads[0].pos[k] != c->heads[m->cfg.n_kv_heads].pos[k];
    CU_ASSERT(differ);
    /* bytes in use are the blocks held: 48 tokens in 16-token blocks = 3 blocks per head */
    size_t block = kv_engine_bytes_full(e, 16) / (size_t)nh;
    CU_ASSERT_EQUAL(kv_engine_bytes_in_use(e), (size_t)nh * 3 * block);
    kv_engine_seq_close(e, seq);
    CU_ASSERT_EQUAL(kv_engine_bytes_in_use(e), 0);
    kv_engine_free(e);
    kv_plan_free(&plan);
    free(bud);
    free(pol);
    free(ids);
    kv_model_free(m);
}

/* Three budget sets scored in one batched pass equal the same sets scored one at a time
 * (per-row arithmetic; a batch of > 4 rows runs sgemm instead of sgemv, hence 1e-5). */
static void test_batched_sets(void) {
    kv_model *m = tu_load_shared(M260);
    int n = 0, *ids = text_tokens(m, &n);
    CU_ASSERT_FATAL(n >= 512);
    kv_error err = {0};
    int nh = m->cfg.n_layers * m->cfg.n_kv_heads;
    kv_plan full;
    CU_ASSERT_FATAL(kv_plan_full(&m->cfg, 256, 16, 8, KV_POLICY_SINK, &full, &err) == KV_OK);
    kv_engine *e = NULL;
    kv_engine_opts o = {.device = KV_DEVICE_CPU, .max_seqs = 3, .max_step = 256};
    CU_ASSERT_FATAL(kv_engine_new(m, &full, &o, &e, &err) == KV_OK);
    int *b[3];
    for (int s = 0; s < 3; s++) {
        b[s] = malloc(sizeof(int) * (size_t)nh);
        for (int i = 0; i < nh; i++) b[s][i] = s == 0 ? 32 : s == 1 ? 64 : (i % 2 ? 32 : 96);
    }
    const int *bs[3] = {b[0], b[1], b[2]};
    double together[3], alone[3];
    size_t peak = 0;
    CU_ASSERT_FATAL(kv_engine_chunk_nll(e, ids, 256, 3, bs, NULL, together, &peak, &err) == KV_OK);
    for (int s = 0; s < 3; s++)
        CU_ASSERT_FATAL(kv_engine_chunk_nll(e, ids, 256, 1, &bs[s], NULL, &alone[s], NULL, &err) ==
                        KV_OK);
    for (int s = 0; s < 3; s++) {
        CU_ASSERT(isfinite(alone[s]) && alone[s] > 0);
        CU_ASSERT_DOUBLE_EQUAL(together[s], alone[s], 1e-5 * alone[s]);
    }
    /* smaller budgets lose more */
    CU_ASSERT(alone[0] > alone[1]);
    /* the batch's peak: three sets at budget + p = 40, 72, 104 tokens a head at most, in blocks */
    size_t block = kv_engine_bytes_full(e, 16) / (size_t)nh;
    CU_ASSERT(peak <= (size_t)nh * (3 + 5 + 7) * block);
    CU_ASSERT(peak >= (size_t)nh * (2 + 4 + 4) * block);
    for (int s = 0; s < 3; s++) free(b[s]);
    kv_engine_free(e);
    kv_plan_free(&full);
    free(ids);
    kv_model_free(m);
}

/* A forked sequence continues exactly like its source. */
static void test_fork(void) {
    kv_model *m = tu_load_shared(M260);
    int n = 0, *ids = text_tokens(m, &n);
    kv_error err = {0};
    kv_plan plan;
    CU_ASSERT_FATAL(kv_plan_uniform(&m->cfg, 0.125, 512, 16, 4, KV_POLICY_H2O, &plan, &err) ==
                    KV_OK);
    kv_engine *e = NULL;
    kv_engine_opts o = {.device = KV_DEVICE_CPU, .max_seqs = 2};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &o, &e, &err) == KV_OK);
    int a = -1, b = -1, V = m->cfg.vocab_size;
    float *la = malloc(sizeof(float) * (size_t)V * 2), *lb = la + V;
    CU_ASSERT_FATAL(kv_engine_seq_open(e, NULL, NULL, &a, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_engine_prefill(e, a, ids, 150, KV_LOGITS_LAST, la, NULL, &err) == KV_OK);
    CU_ASSERT_FATAL(kv_engine_seq_fork(e, a, &b, &err) == KV_OK);
    CU_ASSERT_EQUAL(kv_engine_cache(e, b)->n_past, 150);
    for (int t = 150; t < 170; t++) {
        CU_ASSERT_FATAL(kv_engine_decode(e, &a, 1, &ids[t], la, &err) == KV_OK);
        CU_ASSERT_FATAL(kv_engine_decode(e, &b, 1, &ids[t], lb, &err) == KV_OK);
        CU_ASSERT_EQUAL(memcmp(la, lb, sizeof(float) * (size_t)V), 0);
    }
    /* and a batched step of both gives the same bits as the single steps */
    int both[2] = {a, b}, tk[2] = {ids[170], ids[170]};
    CU_ASSERT_FATAL(kv_engine_decode(e, both, 2, tk, la, &err) == KV_OK);
    CU_ASSERT_EQUAL(memcmp(la, la + V, sizeof(float) * (size_t)V), 0);
    free(la);
    kv_engine_free(e);
    kv_plan_free(&plan);
    free(ids);
    kv_model_free(m);
}

/* Refusals: a plan for another shape, an unavailable device, too many sequences. */
static void test_refusals(void) {
    kv_model *m = tu_load_shared(M260);
    kv_error err = {0};
    kv_plan plan;
    CU_ASSERT_FATAL(kv_plan_uniform(&m->cfg, 0.25, 512, 16, 16, KV_POLICY_SINK, &plan, &err) ==
                    KV_OK);
    kv_engine *e = NULL;
    plan.model_vocab_size = 32000;
    CU_ASSERT_EQUAL(kv_engine_new(m, &plan, NULL, &e, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "vocab_size"));
    plan.model_vocab_size = m->cfg.vocab_size;
    kv_device d = KV_DEVICE_AUTO;
    if (kv_device_resolve(KV_DEVICE_CUDA, &d, &err) != KV_OK) {
        kv_engine_opts o = {.device = KV_DEVICE_CUDA};
        CU_ASSERT_EQUAL(kv_engine_new(m, &plan, &o, &e, &err), KV_EINPUT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--device cpu"));
        CU_ASSERT_PTR_NULL(e);
        CU_ASSERT_EQUAL(kv_device_resolve(KV_DEVICE_AUTO, &d, &err), KV_OK);
        CU_ASSERT_EQUAL(d, KV_DEVICE_CPU);
    }
    CU_ASSERT_EQUAL(kv_device_parse("tpu", &d, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "tpu"));
    kv_engine_opts o = {.device = KV_DEVICE_CPU, .max_seqs = 1};
    CU_ASSERT_FATAL(kv_engine_new(m, &plan, &o, &e, &err) == KV_OK);
    int s1 = -1, s2 = -1;
    CU_ASSERT_EQUAL(kv_engine_seq_open(e, NULL, NULL, &s1, &err), KV_OK);
    CU_ASSERT_EQUAL(kv_engine_seq_open(e, NULL, NULL, &s2, &err), KV_EINTERNAL);
    kv_engine_free(e);
    kv_plan_free(&plan);
    /* the CLI: one clear line and exit 1 for --device cuda without a device */
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "eval '%s' --text '%s' --max-tokens 600 --device cuda --quiet",
             tu_shared(M260), tu_shared(TEXT));
    if (kv_device_resolve(KV_DEVICE_CUDA, &d, &err) != KV_OK) {
        CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
        CU_ASSERT_TRUE(out && strstr(out, "--device cuda"));
        free(out);
    }
    kv_model_free(m);
}

int main(int argc, char **argv) {
    const tu_test tests[] = {
        {"each head evicts by its own policy", test_per_head_policies},
        {"batched budget sets equal sets one by one", test_batched_sets},
        {"a forked sequence decodes like its source", test_fork},
        {"plans, devices and sequences the engine refuses", test_refusals},
    };
    return tu_main(argc, argv, "kvengine", tests, sizeof tests / sizeof tests[0]);
}
