/* Tests of retrieval probes and the retrieval stage (planner/retrieval*.c,
 * include/kvplan/retrieval.h, `kvplan probes`, `eval --retrieval`) on the real passkey-tiny
 * model, the only shared model that copies a fact from its context: the probe file format and
 * its errors, probe scoring under the full and a uniform cache, the retrieval heads, the probe
 * generator on the held-out stories, the /heads/retrieval round trip, and the search stage
 * turning a uniform plan that loses the pass key into one that finds it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/h5io.h"
#include "kvplan/retrieval.h"
#include "kvplan/search.h"
#include "kvplan/tokenizer.h"
#include "support/testutil.h"

#define MODEL "models/passkey-tiny/passkey-tiny.bin"
#define TOK "models/stories260K/tok512.bin"
#define CALIB "models/passkey-tiny/passkey-calib.tsv"
#define TEXT "text/tinystories_val_head.txt"
#define C 256
#define NP 40 /* probes the model-running tests score (of the 200) */

static kv_model *g_m;
static kv_tokenizer *g_tok;
static kv_probes g_probes;
static kv_engine *g_e; /* full cache, sink, b_s = p = 16, f16 */

static int init(void) {
    kv_error e = {0};
    if (kv_model_load(tu_shared(MODEL), &g_m, &e) ||
        kv_tokenizer_load(tu_shared(TOK), g_m, &g_tok, &e) ||
        kv_probes_read(tu_shared(CALIB), g_tok, C, &g_probes, &e)) {
        fprintf(stderr, "retrieval fixture: %s\n", e.msg);
        return 1;
    }
    kv_plan full;
    if (kv_plan_full(&g_m->cfg, C, 16, 16, KV_POLICY_SINK, &full, &e)) return 1;
    int rc = kv_engine_new(g_m, &full, NULL, &g_e, &e);
    kv_plan_free(&full);
    if (rc) fprintf(stderr, "retrieval fixture: %s\n", e.msg);
    return rc;
}

static int cleanup(void) {
    kv_engine_free(g_e);
    kv_probes_free(&g_probes);
    kv_tokenizer_free(g_tok);
    kv_model_free(g_m);
    return 0;
}

/* The calibration file: 200 probes, each answer the five digits after the prompt. */
static void test_parse(void) {
    CU_ASSERT_EQUAL(g_probes.n, 200);
    CU_ASSERT(g_probes.max_len <= C);
    for (int i = 0; i < g_probes.n; i++) {
        const int *ids = g_probes.ids + g_probes.off[i];
        int np = g_probes.n_prompt[i], na = (int)(g_probes.off[i + 1] - g_probes.off[i]) - np;
        CU_ASSERT(na >= 1 && na <= 6);
        CU_ASSERT_EQUAL(ids[0], kv_tokenizer_bos(g_tok));
        char *ans = NULL;
        kv_error e = {0};
        CU_ASSERT_EQUAL_FATAL(kv_tokenizer_decode(g_tok, ids + np, na, &ans, &e), KV_OK);
        /* the answer tokens spell five digits (a leading space is the tokenizer's) */
        const char *d = ans[0] == ' ' ? ans + 1 : ans;
        CU_ASSERT_EQUAL(strlen(d), 5u);
        CU_ASSERT_EQUAL(strspn(d, "0123456789"), 5u);
        free(ans);
    }
}

/* Bad probe files: a line without a tab, a probe longer than the context, no probe. */
static void test_parse_errors(void) {
    kv_probes p;
    kv_error e = {0};
    const char *no_tab = "The pass key is 12345. What is the pass key? 12345\n";
    CU_ASSERT_EQUAL(kv_probes_parse("x.tsv", no_tab, strlen(no_tab), g_tok, C, &p, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "x.tsv line 1"));
    CU_ASSERT_EQUAL(kv_probes_parse("y.tsv", "\n\n", 2, g_tok, C, &p, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "no probe"));
    /* the calibration file at a context of 64 tokens: the first probe is refused, named */
    CU_ASSERT_EQUAL(kv_probes_read(tu_shared(CALIB), g_tok, 64, &p, &e), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "line 1"));
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "longer than the context of 64"));
    CU_ASSERT_PTR_NULL(p.ids);
}

/* The full cache finds the key; uniform sink at R = 1/8 (32 tokens a head) does not. */
static void test_full_and_uniform(void) {
    kv_probe_score full, uni;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_probes_eval(g_e, g_m, &g_probes, 0, NP, NULL, NULL, NULL, &full, &e),
                          KV_OK);
    CU_ASSERT_EQUAL(full.n, NP);
    CU_ASSERT(full.accuracy >= 0.95);
    CU_ASSERT(full.nll < 0.1);
    const int nh = g_m->cfg.n_layers * g_m->cfg.n_kv_heads;
    int budget[64];
    for (int h = 0; h < nh; h++) budget[h] = C / 8;
    CU_ASSERT_EQUAL_FATAL(kv_probes_eval(g_e, g_m, &g_probes, 0, NP, budget, NULL, NULL, &uni, &e),
                          KV_OK);
    CU_ASSERT(uni.accuracy <= 0.05);
    CU_ASSERT(uni.nll > full.nll + 1.0);
    /* a range outside the probes is refused */
    CU_ASSERT_EQUAL(kv_probes_eval(g_e, g_m, &g_probes, 300, 1, NULL, NULL, NULL, &uni, &e),
                    KV_EINPUT);
}

/* The retrieval heads: cutting layer 4 KV head 0 alone loses the key, most heads cost nothing;
 * keeping the two costliest heads whole and every other head at 32 tokens finds it. */
static void test_heads(void) {
    kv_retrieval_heads h;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_retrieval_heads_measure(g_e, g_m, &g_probes, NP, 32, NULL, &h, &e),
                          KV_OK);
    const int nh = h.n_layers * h.n_kv_heads;
    int best = 0, second = -1, cheap = 0;
    for (int i = 1; i < nh; i++)
        if (h.nll_rise[i] > h.nll_rise[best]) best = i;
    for (int i = 0; i < nh; i++)
        if (i != best && (second < 0 || h.nll_rise[i] > h.nll_rise[second])) second = i;
    for (int i = 0; i < nh; i++) cheap += fabs(h.nll_rise[i]) < 0.02;
    CU_ASSERT_EQUAL(best, 4 * 4 + 0);
    CU_ASSERT(h.nll_rise[best] > 0.5);
    CU_ASSERT(h.accuracy[best] < 0.3);
    CU_ASSERT(cheap >= nh - 3);
    CU_ASSERT(h.full_accuracy >= 0.95);
    int budget[64];
    for (int i = 0; i < nh; i++) budget[i] = 32;
    budget[best] = budget[second] = C;
    kv_probe_score duo;
    CU_ASSERT_EQUAL_FATAL(kv_probes_eval(g_e, g_m, &g_probes, 0, NP, budget, NULL, NULL, &duo, &e),
                          KV_OK);
    CU_ASSERT(duo.accuracy >= 0.9);
    /* window out of range */
    kv_retrieval_heads bad;
    CU_ASSERT_EQUAL(kv_retrieval_heads_measure(g_e, g_m, &g_probes, NP, 4, NULL, &bad, &e),
                    KV_EINPUT);
    /* /heads/retrieval written and read back */
    kv_h5 *f = NULL;
    const char *path = tu_tmp("heads.h5");
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(path, &f, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_write_provenance(f, "test", g_m, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_retrieval_heads_write(f, &h, &e), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_h5_commit(f, &e), KV_OK);
    kv_retrieval_heads back;
    int found = 0;
    int orc = kv_h5_open_read(path, &f, &e);
    if (orc) fprintf(stderr, "heads.h5: %s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(orc, KV_OK);
    CU_ASSERT_EQUAL(kv_retrieval_heads_read(f, path, 5, 4, &back, &found, &e), KV_OK);
    CU_ASSERT_EQUAL(found, 1);
    CU_ASSERT_EQUAL(back.window, 32);
    CU_ASSERT_EQUAL(back.n_probes, NP);
    for (int i = 0; found && i < nh; i++) CU_ASSERT_EQUAL(back.nll_rise[i], h.nll_rise[i]);
    kv_retrieval_heads_free(&back);
    CU_ASSERT_EQUAL(kv_retrieval_heads_read(f, path, 4, 4, &back, &found, &e), KV_EINPUT);
    kv_h5_close(f);
    kv_retrieval_heads_free(&h);
}

/* The proxy without a probe file: random-token copies rank layer 4 KV heads 0 and 2 (the
 * pass-key heads) first. */
static void test_induction(void) {
    kv_probes p;
    kv_retrieval_heads h;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_probes_copy(8, 100, 8, g_m->cfg.vocab_size, 1, &p, &e), KV_OK);
    CU_ASSERT_EQUAL(p.max_len, 201);
    CU_ASSERT_EQUAL(p.n_prompt[0], 193);
    CU_ASSERT_EQUAL(p.ids[1], p.ids[101]);
    CU_ASSERT_EQUAL_FATAL(kv_retrieval_heads_measure(g_e, g_m, &p, 0, 32, NULL, &h, &e), KV_OK);
    int order[2] = {-1, -1};
    for (int i = 0; i < 20; i++) {
        if (order[0] < 0 || h.nll_rise[i] > h.nll_rise[order[0]])
            order[1] = order[0], order[0] = i;
        else if (order[1] < 0 || h.nll_rise[i] > h.nll_rise[order[1]])
            order[1] = i;
    }
    CU_ASSERT_EQUAL(order[0], 16);
    CU_ASSERT_EQUAL(order[1], 18);
    CU_ASSERT(h.nll_rise[16] > 1.0);
    kv_retrieval_heads_free(&h);
    kv_probes_free(&p);
    CU_ASSERT_EQUAL(kv_probes_copy(8, 8, 8, 512, 1, &p, &e), KV_EINPUT);
}

/* Generated probes: from the stories after 90 % of the file (a calibration from the first 90 %
 * never saw them), the key sentence inside, deterministic per seed, and answered by the full
 * cache. */
static void test_generate(void) {
    char *text = NULL, *tsv = NULL, *tsv2 = NULL;
    size_t len = 0;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_read_file(tu_shared(TEXT), &text, &len, &e), KV_OK);
    kv_probe_gen_opts o;
    kv_probe_gen_opts_default(&o, C);
    o.n = 24;
    CU_ASSERT_EQUAL_FATAL(kv_probes_generate(text, len, g_tok, &o, &tsv, &e), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_probes_generate(text, len, g_tok, &o, &tsv2, &e), KV_OK);
    CU_ASSERT_STRING_EQUAL(tsv, tsv2);
    free(tsv2);
    o.seed = 2;
    CU_ASSERT_EQUAL_FATAL(kv_probes_generate(text, len, g_tok, &o, &tsv2, &e), KV_OK);
    CU_ASSERT(strcmp(tsv, tsv2) != 0);
    free(tsv2);
    /* where the held-out stories start: after 90 % of the blank-line separated stories */
    long stories = 1;
    for (size_t i = 0; i + 1 < len; i++) stories += text[i] == '\n' && text[i + 1] == '\n';
    long seen = 0;
    size_t cut = 0;
    for (size_t i = 0; i + 1 < len && !cut; i++)
        if (text[i] == '\n' && text[i + 1] == '\n' && ++seen == (long)(0.9 * (double)stories) - 1)
            cut = i;
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(tsv, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        char *tab = strchr(l, '\t');
        CU_ASSERT_PTR_NOT_NULL_FATAL(tab);
        char want[64];
        snprintf(want, sizeof want, "The pass key is %s. Remember it.", tab + 1);
        *tab = '\0';
        CU_ASSERT_PTR_NOT_NULL(strstr(l, want));
        CU_ASSERT_PTR_NOT_NULL(strstr(l, "What is the pass key? The pass key is"));
        /* the filler (the prompt without the key sentence) starts in the held-out stories */
        char *k = strstr(l, want), filler[24];
        size_t kl = strlen(want);
        if (k == l) {
            snprintf(filler, sizeof filler, "%s", l + kl + 1);
        } else {
            size_t pre = (size_t)(k - l) - 1;
            snprintf(filler, sizeof filler, "%.*s", (int)(pre < 23 ? pre : 23), l);
        }
        CU_ASSERT(strncmp(filler, "What is the pass key", 20) != 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(text + cut, filler));
        *tab = '\t';
        lines++;
    }
    CU_ASSERT_EQUAL(lines, 24);
    free(tsv);
    /* scored: the probes parse at C and the full cache answers nearly all of them */
    CU_ASSERT_EQUAL_FATAL(kv_probes_generate(text, len, g_tok, &o, &tsv, &e), KV_OK);
    kv_probes p;
    CU_ASSERT_EQUAL_FATAL(kv_probes_parse("gen", tsv, strlen(tsv), g_tok, C, &p, &e), KV_OK);
    kv_probe_score s;
    CU_ASSERT_EQUAL_FATAL(kv_probes_eval(g_e, g_m, &p, 0, 0, NULL, NULL, NULL, &s, &e), KV_OK);
    CU_ASSERT(s.accuracy >= 0.9);
    kv_probes_free(&p);
    free(tsv);
    /* a range with too few stories is refused */
    o.from = 0.9999;
    CU_ASSERT_EQUAL(kv_probes_generate(text, len, g_tok, &o, &tsv, &e), KV_EINPUT);
    free(text);
}

/* The search stage on a uniform plan at R = 1/4 of F16 tokens only (64 tokens a head, which
 * finds almost no key; at 1/8 two heads whole leave the other 18 below the policy's floor
 * without the smaller KV types): the head costs are measured, the candidates solved from
 * curves measured around uniform, and the plan becomes one that keeps the accuracy within 5
 * points of the full cache at the same bytes. With a tolerance of 100 points the uniform plan
 * is kept. */
static void test_stage(void) {
    kv_error e = {0};
    int n = 0;
    int *ids = tu_text_tokens(g_m, tu_shared(TOK), 6000, &n);
    CU_ASSERT_FATAL(n >= 2 * C);
    kv_search_opts so;
    kv_search_opts_default(&so, g_m);
    so.ratio = 0.25, so.context = C, so.block_size = 16, so.evict_block = 16;
    so.kv_types_mask = 0, so.sensitivity = 1, so.n_threads = 1;
    so.sens.max_levels = 4, so.sens.calib_chunks = 1;
    const int nh = g_m->cfg.n_layers * g_m->cfg.n_kv_heads;
    kv_search_result res;
    memset(&res, 0, sizeof res);
    res.tokens = calloc((size_t)nh, sizeof *res.tokens);
    res.blocks = calloc((size_t)nh, sizeof *res.blocks);
    res.policy = calloc((size_t)nh, sizeof *res.policy);
    res.kv_types = calloc((size_t)nh, sizeof *res.kv_types);
    res.evict_block = 16;
    CU_ASSERT_EQUAL_FATAL(kv_uniform_budgets(nh, 0.25, C, 16, res.tokens, res.blocks, &e), KV_OK);
    for (int h = 0; h < nh; h++) res.kv_types[h] = KV_TYPE_F16;
    kv_probes p = g_probes;
    p.n = NP; /* the first NP probes */
    kv_retrieval_opts ro;
    kv_retrieval_opts_default(&ro);
    ro.tolerance = 1.0;
    kv_retrieval_result rr;
    int rc = kv_retrieval_search(g_m, ids, 2, &so, &p, &ro, 16, &res, &rr, &e);
    if (rc) fprintf(stderr, "stage: %s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT_EQUAL(rr.chosen, -1);
    CU_ASSERT_EQUAL(rr.n_cand, 0);
    CU_ASSERT(rr.guard.accuracy <= 0.2);
    CU_ASSERT(rr.full.accuracy >= 0.95);
    CU_ASSERT_EQUAL(res.tokens[0], 64);
    kv_h5 *f = NULL; /* the record of a kept plan: no candidates, no heads */
    CU_ASSERT_EQUAL_FATAL(kv_h5_create(tu_tmp("kept.h5"), &f, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_retrieval_write(f, &rr, &e), KV_OK);
    kv_h5_abort(f);
    kv_retrieval_result_free(&rr);
    ro.tolerance = 0.05;
    rc = kv_retrieval_search(g_m, ids, 2, &so, &p, &ro, 16, &res, &rr, &e);
    if (rc) fprintf(stderr, "stage: %s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT(rr.chosen >= 0);
    CU_ASSERT(rr.n_cand >= 2);
    CU_ASSERT(rr.plan.accuracy >= rr.full.accuracy - 0.05);
    CU_ASSERT_EQUAL(res.tokens[16], C); /* layer 4 KV head 0 whole */
    CU_ASSERT_EQUAL(res.winner_sens, 1);
    long sum = 0;
    for (int h = 0; h < nh; h++) sum += res.tokens[h];
    CU_ASSERT(sum <= (long)nh * 64); /* the same memory as uniform */
    CU_ASSERT(rr.plan_ppl < rr.uniform_ppl * 1.05);
    kv_retrieval_result_free(&rr);
    free(res.tokens), free(res.blocks), free(res.policy), free(res.kv_types);
    free(ids);
}

/* The second round at R = 1/16 of the F16 bytes (b_s = p = 2, f16/q8/q4): one head whole in q4
 * is 40 % of the bytes and leaves the others at their floor, so no first-round candidate keeps
 * the key on these probes; the plan keeps the two costliest heads compressed under l2attn
 * (layer 4 KV heads 0 and 2, C/2 tokens or less, q4) and finds the key on most probes within
 * the same bytes. */
static void test_stage_kept(void) {
    kv_error e = {0};
    int n = 0;
    int *ids = tu_text_tokens(g_m, tu_shared(TOK), 6000, &n);
    CU_ASSERT_FATAL(n >= 2 * C);
    kv_search_opts so;
    kv_search_opts_default(&so, g_m);
    so.ratio = 0.0625, so.context = C, so.block_size = 2, so.evict_block = 2;
    so.kv_types_mask = (1 << KV_TYPE_F16) | (1 << KV_TYPE_Q8) | (1 << KV_TYPE_Q4);
    so.sensitivity = 1, so.n_threads = 1, so.sens.max_levels = 6, so.sens.calib_chunks = 1;
    const int nh = g_m->cfg.n_layers * g_m->cfg.n_kv_heads;
    kv_search_result res;
    memset(&res, 0, sizeof res);
    res.tokens = calloc((size_t)nh, sizeof *res.tokens);
    res.blocks = calloc((size_t)nh, sizeof *res.blocks);
    res.policy = calloc((size_t)nh, sizeof *res.policy);
    res.kv_types = calloc((size_t)nh, sizeof *res.kv_types);
    res.evict_block = 2;
    CU_ASSERT_EQUAL_FATAL(kv_uniform_budgets(nh, 0.0625, C, 2, res.tokens, res.blocks, &e), KV_OK);
    for (int h = 0; h < nh; h++) res.kv_types[h] = KV_TYPE_F16;
    kv_probes p = g_probes;
    p.n = NP;
    kv_retrieval_opts ro;
    kv_retrieval_opts_default(&ro);
    ro.tolerance = 0.3;
    kv_retrieval_result rr;
    int rc = kv_retrieval_search(g_m, ids, 2, &so, &p, &ro, 2, &res, &rr, &e);
    if (!rc && rr.chosen >= 0)
        printf(" [%d candidates; plan: %d heads x %d tokens l2attn, accuracy %.3f, ppl %.4f] ",
               rr.n_cand, rr.forced[rr.chosen], rr.kept[rr.chosen], rr.plan.accuracy, rr.plan_ppl);
    if (rc) fprintf(stderr, "stage: %s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT(rr.full.accuracy >= 0.95);
    CU_ASSERT(rr.guard.accuracy <= 0.1);
    int first = 0, second = 0;
    for (int k = 0; k < rr.n_cand; k++) {
        if (rr.kept[k]) {
            second++;
            continue;
        }
        first++;
        CU_ASSERT(rr.cand[k].accuracy < rr.full.accuracy - ro.tolerance); /* why round 2 ran */
    }
    CU_ASSERT(first >= 2);
    CU_ASSERT(second >= 6);
    CU_ASSERT_FATAL(rr.chosen >= 0);
    CU_ASSERT(rr.kept[rr.chosen] > 0 && rr.kept[rr.chosen] <= C / 2);
    CU_ASSERT(rr.plan.accuracy >= 0.6);
    CU_ASSERT(rr.plan.accuracy >= rr.full.accuracy - ro.tolerance);
    CU_ASSERT(strstr(rr.decision, "kept by attention") != NULL);
    const int hd = g_m->cfg.head_dim;
    double bytes = 0;
    for (int h = 0; h < nh; h++) {
        int kept = h == 16 || h == 18;
        CU_ASSERT_EQUAL(res.policy[h] == KV_POLICY_L2ATTN, kept);
        if (kept) CU_ASSERT_EQUAL(res.tokens[h], rr.kept[rr.chosen]);
        if (kept) CU_ASSERT_EQUAL(res.kv_types[h], KV_TYPE_Q4);
        bytes += (double)res.tokens[h] * (double)kv_type_token_bytes(res.kv_types[h], hd);
    }
    /* physical: the kept tokens fit 1/16 of the full F16 cache (the engine adds p a head) */
    CU_ASSERT(bytes <= 0.0625 * nh * C * (double)kv_type_token_bytes(KV_TYPE_F16, hd) + 1e-9);
    kv_probe_score again; /* the plan's accuracy re-earned on its own engine */
    kv_engine *en = NULL;
    kv_plan full;
    CU_ASSERT_EQUAL_FATAL(kv_plan_full(&g_m->cfg, C, 2, 2, KV_POLICY_SINK, &full, &e), KV_OK);
    kv_engine_opts eo = {.max_seqs = 1, .n_threads = 1, .type_mask = so.kv_types_mask};
    rc = kv_engine_new(g_m, &full, &eo, &en, &e);
    kv_plan_free(&full);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    CU_ASSERT_EQUAL(
        kv_probes_eval(en, g_m, &p, 0, NP, res.tokens, res.policy, res.kv_types, &again, &e),
        KV_OK);
    CU_ASSERT_EQUAL(again.hits, rr.plan.hits);
    kv_engine_free(en);
    kv_retrieval_result_free(&rr);
    free(res.tokens), free(res.blocks), free(res.policy), free(res.kv_types);
    free(ids);
}

/* The commands: eval --retrieval (text and JSON), a too-long probe file refused, probes -o. */
static void test_cli(void) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "eval %s --tokenizer %s --retrieval %s --json --quiet",
             tu_shared(MODEL), tu_shared(TOK), tu_shared(CALIB));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT(out && strstr(out, "retrieval    accuracy"));
    double acc = tu_json_number(out, "retrieval_accuracy");
    CU_ASSERT(acc >= 0.95 && acc <= 1.0);
    CU_ASSERT(tu_json_number(out, "retrieval_nll") < 0.1);
    CU_ASSERT_EQUAL(tu_json_number(out, "retrieval_probes"), 200);
    free(out);
    snprintf(args, sizeof args, "eval %s --tokenizer %s --retrieval %s --context 64 --quiet",
             tu_shared(MODEL), tu_shared(TOK), tu_shared(CALIB));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT(out && strstr(out, "longer than the context of 64"));
    free(out);
    snprintf(args, sizeof args, "probes %s --tokenizer %s --text %s --n 5 -o %s", tu_shared(MODEL),
             tu_shared(TOK), tu_shared(TEXT), tu_tmp("p.tsv"));
    CU_ASSERT_EQUAL(tu_run_kvplan(args, NULL, 1), 0);
    kv_probes p;
    kv_error e = {0};
    CU_ASSERT_EQUAL(kv_probes_read(tu_tmp("p.tsv"), g_tok, C, &p, &e), KV_OK);
    CU_ASSERT_EQUAL(p.n, 5);
    kv_probes_free(&p);
}

/* `kvplan search --retrieval` end to end, small: a uniform grid at R = 1/4 of F16 tokens only on
 * 2 chunks, the stage on 40 probes; the plan file records /search/retrieval, and `kvplan eval
 * --plan` re-earns the stage's accuracy on those probes. */
static void test_search_cli(void) {
    char args[4096], *out = NULL;
    const char *probes = tu_tmp("p40.tsv"), *prof = tu_tmp("prof.h5"), *plan = tu_tmp("r.h5");
    snprintf(args, sizeof args, "head -n %d '%s' > '%s'", NP, tu_shared(CALIB), probes);
    CU_ASSERT_EQUAL_FATAL(tu_run_sh(args, NULL), 0);
    snprintf(args, sizeof args, "profile %s --tokenizer %s --no-hw --prompts 2 --quiet -o %s",
             tu_shared(MODEL), tu_shared(TOK), prof);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 1), 0);
    snprintf(args, sizeof args,
             "search --profile %s --model %s --tokenizer %s --text %s --ratio 0.25 "
             "--allocation uniform --kv-types none --eval-tokens 512 --heldout-tokens 0 "
             "--sens-levels 4 --retrieval %s --quiet -o %s",
             prof, tu_shared(MODEL), tu_shared(TOK), tu_shared(TEXT), probes, plan);
    int rc = tu_run_kvplan(args, &out, 1);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT(out && strstr(out, "decision: retrieval"));
    free(out);
    kv_h5 *f = NULL;
    kv_error e = {0};
    double acc = NAN;
    long chosen = -2;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(plan, &f, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search/retrieval", "chosen", &chosen, &e), KV_OK);
    int rank = 0;
    long dims[KV_H5_MAX_RANK];
    double *b = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_f64(f, "/search/retrieval/baselines", &rank, dims, &b, &e), KV_OK);
    kv_h5_close(f);
    CU_ASSERT(chosen >= 0);
    CU_ASSERT_FATAL(b && rank == 2 && dims[0] == 4 && dims[1] == 3);
    acc = b[3 * 3];
    CU_ASSERT(acc >= b[0] - 0.05);
    free(b);
    snprintf(args, sizeof args, "eval %s --tokenizer %s --retrieval %s --plan %s --json --quiet",
             tu_shared(MODEL), tu_shared(TOK), probes, plan);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT_DOUBLE_EQUAL(tu_json_number(out, "retrieval_accuracy"), acc, 1e-9);
    free(out);
    snprintf(args, sizeof args, "inspect %s", plan);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 0), 0);
    CU_ASSERT(out && strstr(out, "retrieval (40 probes, tolerance 5 points)"));
    free(out);
}

int main(int argc, char **argv) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    static const tu_test tests[] = {
        {"parse", test_parse},
        {"parse_errors", test_parse_errors},
        {"full_and_uniform", test_full_and_uniform},
        {"heads", test_heads},
        {"induction", test_induction},
        {"generate", test_generate},
        {"stage", test_stage},
        {"stage_kept", test_stage_kept},
        {"search_cli", test_search_cli},
        {"cli", test_cli},
    };
    static const tu_suite suites[] = {
        {"retrieval", init, cleanup, tests, sizeof tests / sizeof tests[0]},
    };
    return tu_main_suites(argc, argv, suites, 1);
}
