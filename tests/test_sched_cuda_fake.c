/* The scheduler (kvplan/sched.h) on the real CUDA backend over the fake CUDA runtime
 * (tests/cuda_fake/), stories260K: several requests arriving while others run, admitted two at a
 * time by kv_mem, give the same tokens as each request alone on the CPU (kv_generate) and as
 * alone on the CUDA backend (the scheduler decoding into the engine's pinned logits buffer);
 * every block and every device byte is back afterwards. */
#include "testutil.h"

#include "cuda_fake.h"
#include "kvplan/engine.h"
#include "kvplan/generate.h"
#include "kvplan/plan.h"
#include "kvplan/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M260 "models/stories260K/stories260K.bin"
#define NREQ 5
#define NEW 24

typedef struct got {
    int toks[NEW];
    int n, ended;
    kv_finish finish;
} got;

static int on_event(void *user, const kv_sched_event *ev) {
    got *g = user;
    if (ev->finish != KV_FINISH_NONE) {
        g->ended = 1;
        g->finish = ev->finish;
    } else if (g->n < NEW) {
        g->toks[g->n++] = ev->token;
    }
    return 0;
}

static const char *prompts[NREQ] = {"Once upon a time", "Lily and Ben went to the park",
                                    "The little dog was sad because", "One day, a bird",
                                    "Tom had a red ball. He"};

/* One prompt alone through kv_generate on `device`: its NEW greedy tokens into out. */
static int alone(const kv_model *m, const kv_tokenizer *tok, const kv_plan *plan, kv_device device,
                 const char *prompt, int *out) {
    kv_engine *e = NULL;
    kv_error err = {0};
    kv_engine_opts eo = {.device = device, .max_seqs = 1, .n_threads = 1};
    CU_ASSERT_FATAL(kv_engine_new(m, plan, &eo, &e, &err) == KV_OK);
    kv_gen_opts go = {
        .prompts = &prompt, .n_prompts = 1, .n_seqs = 1, .max_new = NEW, .top_p = 1.0f};
    kv_gen_result r = {0};
    CU_ASSERT_FATAL(kv_generate(e, m, tok, &go, &r, &err) == KV_OK);
    int n = r.seqs[0].n - r.seqs[0].n_prompt;
    memcpy(out, r.seqs[0].ids + r.seqs[0].n_prompt, (size_t)n * sizeof *out);
    kv_gen_result_free(&r);
    kv_engine_free(e);
    return n;
}

static void run_case(const kv_model *m, const kv_tokenizer *tok, const kv_plan *plan) {
    kv_error err = {0};
    kvfake_reset();
    kv_engine *e = NULL;
    kv_engine_opts eo = {.device = KV_DEVICE_CUDA, .max_seqs = NREQ};
    CU_ASSERT_FATAL(kv_engine_new(m, plan, &eo, &e, &err) == KV_OK);
    CU_ASSERT_EQUAL(kv_engine_device(e), KV_DEVICE_CUDA);
    kv_sched *s = NULL;
    kv_sched_opts so = {.kv_mem = 1};
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    size_t one = kv_sched_request_bytes(s, 32, NEW);
    kv_sched_free(s);
    so.kv_mem = 2 * one + one / 2; /* two or three at a time */
    CU_ASSERT_FATAL(kv_sched_new(e, m, tok, &so, &s, &err) == KV_OK);
    got g[NREQ];
    memset(g, 0, sizeof g);
    int peak = 0;
    for (int i = 0; i < NREQ; i++) {
        int *ids = NULL, n = 0;
        CU_ASSERT_FATAL(
            kv_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), 1, &ids, &n, &err) == KV_OK);
        CU_ASSERT_FATAL(n <= 32);
        kv_sched_request r = {ids, n, NEW, 0.0f, 1.0f, 0, on_event, &g[i]};
        CU_ASSERT_EQUAL(kv_sched_submit(s, &r, NULL, &err), KV_SCHED_OK);
        free(ids);
        CU_ASSERT(kv_sched_step(s, NULL, &err) == KV_OK);
    }
    kv_sched_stats st;
    for (int k = 0; k < 1000; k++) {
        CU_ASSERT_FATAL(kv_sched_step(s, NULL, &err) == KV_OK);
        kv_sched_stats_get(s, &st);
        if (st.running > peak) peak = st.running;
        CU_ASSERT(st.kv_in_use <= st.kv_reserved && st.kv_reserved <= so.kv_mem);
        if (st.running == 0 && st.queued == 0) break;
    }
    CU_ASSERT(peak >= 2 && peak < NREQ);
    CU_ASSERT_EQUAL(kv_engine_bytes_in_use(e), 0);
    for (int i = 0; i < NREQ; i++) {
        int cpu[NEW], gpu[NEW];
        int nc = alone(m, tok, plan, KV_DEVICE_CPU, prompts[i], cpu);
        int ng = alone(m, tok, plan, KV_DEVICE_CUDA, prompts[i], gpu);
        CU_ASSERT(g[i].ended && g[i].n == ng && ng == nc);
        CU_ASSERT(memcmp(g[i].toks, gpu, sizeof(int) * (size_t)ng) == 0);
        CU_ASSERT(memcmp(g[i].toks, cpu, sizeof(int) * (size_t)nc) == 0);
    }
    kv_sched_free(s);
    /* the scheduler decoded into the engine's logits buffer (the backend's pinned memory, which
     * the device-to-host copy fills directly): a smaller request gets the same buffer */
    kv_error e2 = {0};
    float *lb = kv_engine_logits_buffer(e, 2, &e2), *lb1 = kv_engine_logits_buffer(e, 1, &e2);
    CU_ASSERT(lb != NULL && lb1 == lb);
    CU_ASSERT(kv_engine_logits_buffer(e, 0, &e2) == NULL && e2.code == KV_EINPUT);
    kv_engine_free(e);
    kvfake_counters c = kvfake_get();
    CU_ASSERT(c.device_live == 0 && c.pinned_live == 0);
}

static void test_sched_on_cuda(void) {
    kv_model *m = tu_load_shared(M260);
    kv_tokenizer *tok = NULL;
    kv_error err = {0};
    CU_ASSERT_FATAL(kv_tokenizer_load(NULL, m, &tok, &err) == KV_OK);
    kv_plan full, budgeted;
    CU_ASSERT_FATAL(kv_plan_full(&m->cfg, m->cfg.seq_len, 16, 16, KV_POLICY_SINK, &full, &err) ==
                    KV_OK);
    CU_ASSERT_FATAL(kv_plan_uniform(&m->cfg, 0.125, m->cfg.seq_len, 8, 4, KV_POLICY_SINK, &budgeted,
                                    &err) == KV_OK);
    run_case(m, tok, &full);
    run_case(m, tok, &budgeted); /* budgets of 64 tokens: evictions from the 16th decode on */
    kv_plan_free(&full);
    kv_plan_free(&budgeted);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    kvfake_reset();
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"scheduler on the CUDA backend: same tokens as the CPU, blocks freed", test_sched_on_cuda},
    };
    return tu_main(argc, argv, "sched_cuda_fake", tests, sizeof tests / sizeof tests[0]);
}
