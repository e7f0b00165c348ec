/* The shipped plans (the .h5 files in plans/, scripts/make-plans.sh: `kvplan search` with its
 * defaults on two calibration texts, the TinyStories text and papers 000-002 of ../shared/papers,
 * then the guard of issue 24): for the stories260K R = 1/16 plan, the per-text figures the
 * guard recorded are re-earned by `kvplan eval` on each text alone and show its promise (not
 * worse than uniform on any text or part; the shipped candidate's prediction bound within
 * 0.5%), three pseudo-random BaKlaVa grid cells re-evaluated independently (kvplan plan +
 * kvplan eval on both texts) give their stored perplexity, the runtime's bytes in use follow
 * the budgets and their KV types, and a plan is refused for the other model. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/h5io.h"
#include "kvplan/kvcache.h"
#include "kvplan/plan.h"
#include "testutil.h"

/* Relative tolerance of a figure re-earned against one a plan stores. The shipped plans were made
 * by scripts/make-plans.sh's gcc release build; gcc builds at other optimisation levels round
 * within 2e-7 of it. clang contracts multiply-adds differently and moved the re-earned
 * perplexities by up to 1.7e-5 relative (text 1's plan: 110.6216 vs 110.6235 stored; clang 14,
 * the -O1 sanitizer build), still far below the >1% between neighbouring grid cells. */
#if defined(__clang__)
#define TP_REL 1e-4
#else
#define TP_REL 1e-6
#endif

#define MODEL "models/stories260K/stories260K.bin"
#define TEXT "text/tinystories_val_head.txt"
#define PLAN KVPLAN_SOURCE_DIR "/plans/stories260K.r1-16.h5"

static double *read_f64(kv_h5 *f, const char *path, int *rank, long *dims) {
    double *d = NULL;
    kv_error e = {0};
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_f64(f, path, rank, dims, &d, &e), KV_OK);
    return d;
}

/* The second calibration text as bench/robust_texts.sh makes it: papers 000, 001 and 002 of
 * ../shared/papers in that order, into the test's temporary directory. NULL on failure. */
static const char *papers_calib(void) {
    const char *out = tu_tmp("papers_calib.txt");
    FILE *o = fopen(out, "wb");
    if (!o) return NULL;
    int found = 0;
    for (int k = 0; k < 3; k++) {
        char prefix[16], path[4096];
        snprintf(prefix, sizeof prefix, "%03d_", k);
        DIR *d = opendir(tu_shared("papers"));
        struct dirent *de;
        path[0] = '\0';
        while (d && (de = readdir(d)))
            if (!strncmp(de->d_name, prefix, 4) && strstr(de->d_name, ".txt"))
                snprintf(path, sizeof path, "%s/%s", tu_shared("papers"), de->d_name);
        if (d) closedir(d);
        FILE *i = path[0] ? fopen(path, "rb") : NULL;
        if (!i) continue;
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, i)) > 0) fwrite(buf, 1, n, o);
        fclose(i);
        found++;
    }
    fclose(o);
    return found == 3 ? out : NULL;
}

/* kvplan eval of MODEL on `text` (a --text or --tokens argument) with `opts`; the JSON line's
 * perplexity, mean NLL per scored token and scored tokens. 0 on success. */
static int eval_text(const char *text_arg, const char *opts, double *ppl, double *nll,
                     double *scored) {
    char args[8192], *out = NULL;
    int w = snprintf(args, sizeof args, "eval '%s' %s %s --json --quiet", tu_shared(MODEL),
                     text_arg, opts);
    if (w < 0 || (size_t)w >= sizeof args) return 1; /* the command would be cut short */
    int rc = tu_run_kvplan(args, &out, 0);
    if (!rc) {
        *ppl = tu_json_number(out, "perplexity");
        if (nll) *nll = tu_json_number(out, "nll");
        if (scored) *scored = tu_json_number(out, "tokens_scored");
    }
    free(out);
    return rc;
}

/* Token ids [from, from + n) of text `path` under MODEL's tokenizer into file `ids_path`. */
static int token_slice(const char *path, long from, long n, const char *ids_path) {
    char args[8192], *out = NULL;
    snprintf(args, sizeof args, "tokenize '%s' --text '%s'", tu_shared(MODEL), path);
    int rc = tu_run_kvplan(args, &out, 0);
    FILE *f = rc ? NULL : fopen(ids_path, "w");
    long k = 0, w = 0;
    for (char *p = out, *end; f && p && *p; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (k >= from && k < from + n) fprintf(f, "%ld\n", v), w++;
        k++;
    }
    if (f) fclose(f);
    free(out);
    return rc || w != n;
}

static void test_shipped_plan(void) {
    char args[8192], opts[4096], *out = NULL;
    /* tu_tmp and tu_shared hand out rotating buffers: keep copies */
    char prof[512], papers[512], ts[4096], cell_h5[512], held_ids[512];
    const char *pc = papers_calib();
    CU_ASSERT_PTR_NOT_NULL_FATAL(pc);
    snprintf(papers, sizeof papers, "%s", pc);
    snprintf(prof, sizeof prof, "%s", tu_tmp("profile.h5"));
    snprintf(cell_h5, sizeof cell_h5, "%s", tu_tmp("cell.h5"));
    snprintf(held_ids, sizeof held_ids, "%s", tu_tmp("ts_held.ids"));
    snprintf(ts, sizeof ts, "%s", tu_shared(TEXT));
    const char *texts[2] = {ts, papers};
    /* the profile scripts/make-plans.sh makes */
    snprintf(args, sizeof args, "profile '%s' --text '%s' --text '%s' --no-hw --quiet -o %s",
             tu_shared(MODEL), texts[0], texts[1], prof);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
    kv_error e = {0};
    kv_plan shipped;
    CU_ASSERT_EQUAL_FATAL(kv_plan_read(PLAN, &shipped, &e), KV_OK);
    /* the defaults of `kvplan search` at R * C = 32 tokens per head: b_s = p = 4 for the grid,
     * the sensitivity curves and the baselines; the plan's p measured on p = 4, 2, 1 */
    CU_ASSERT_EQUAL(shipped.block_size, 4);
    CU_ASSERT(shipped.evict_block >= 1 && shipped.evict_block <= 4);
    /* R is a fraction of the full F16 cache's bytes (issue 22): the plan's heads and types */
    double plan_bytes = kv_plan_bytes(&shipped), full_f16 = kv_plan_full_f16_bytes(&shipped);
    CU_ASSERT(plan_bytes <= 0.0625 * full_f16 * (1 + 1e-12));
    kv_h5 *f = NULL;
    CU_ASSERT_EQUAL_FATAL(kv_h5_open_read(PLAN, &f, &e), KV_OK);
    int rank = 0, crank = 0, *chunks = NULL;
    long dims[KV_H5_MAX_RANK], d2[KV_H5_MAX_RANK];
    double *ppl = read_f64(f, "/search/perplexity", &rank, dims);
    CU_ASSERT_EQUAL_FATAL(kv_h5_read_i32(f, "/search/chunks", &crank, d2, &chunks, &e), KV_OK);
    double *tv = read_f64(f, "/search/t_values", &crank, d2);
    double *rv = read_f64(f, "/search/r_values", &crank, d2);
    double *pv = read_f64(f, "/search/p_values", &crank, d2);
    double best = NAN;
    CU_ASSERT_EQUAL(kv_h5_read_attr_f64(f, "/search", "best_perplexity", &best, &e), KV_OK);
    CU_ASSERT(kv_h5_exists(f, "/sensitivity/kl"));
    long grid_p = 0, plan_p = 0;
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "grid_evict_block", &grid_p, &e), KV_OK);
    CU_ASSERT_EQUAL(kv_h5_read_attr_i64(f, "/search", "evict_block", &plan_p, &e), KV_OK);
    CU_ASSERT_EQUAL(grid_p, 4);
    CU_ASSERT_EQUAL(plan_p, shipped.evict_block);
    /* the eviction-block ladder p = 4, 2, 1: the search's best is its lowest entry */
    double *lp = read_f64(f, "/search/evict_block/p", &crank, d2);
    long nl = d2[0];
    double *lplan = read_f64(f, "/search/evict_block/plan", &crank, d2);
    double *luni = read_f64(f, "/search/evict_block/uniform", &crank, d2);
    CU_ASSERT_EQUAL(nl, 3);
    double lbest = HUGE_VAL;
    for (long i = 0; i < nl; i++) {
        double v = lplan[i] < luni[i] ? lplan[i] : luni[i];
        printf("\n    evict block p %g: plan %.6f, uniform %.6f", lp[i], lplan[i], luni[i]);
        if (v < lbest) lbest = v;
    }
    free(lp), free(lplan), free(luni);
    /* the guard's record: two texts, 8 calibration + 4 held-out chunks each */
    double *tfull = read_f64(f, "/search/texts/full", &crank, d2);
    double *tuni = read_f64(f, "/search/texts/uniform", &crank, d2);
    double *tplan = read_f64(f, "/search/texts/plan", &crank, d2);
    double *tch = read_f64(f, "/search/texts/chunks", &crank, d2);
    CU_ASSERT_FATAL(d2[0] == 2 && d2[1] == 2);
    long dk[KV_H5_MAX_RANK];
    double *bound = read_f64(f, "/search/texts/candidates/bound", &crank, dk);
    double *passed = read_f64(f, "/search/texts/candidates/passed", &crank, d2);
    double *cand = read_f64(f, "/search/texts/candidates/perplexity", &crank, d2);
    long dtu[KV_H5_MAX_RANK];
    double *tuni_type = read_f64(f, "/search/kv_types/uniform", &crank, dtu);
    char *decision = NULL;
    CU_ASSERT_EQUAL(kv_h5_read_attr_str(f, "/search/texts", "decision", &decision, &e), KV_OK);
    kv_h5_close(f);
    /* the search's best: the lowest of the ladder and of the uniform caches of each KV type
     * at the plan's bytes (adopted when one beat the mixed plan, issue 22) */
    double tbest = lbest;
    for (long i = 0; i < dtu[0]; i++)
        if (tuni_type[i] < tbest) tbest = tuni_type[i];
    CU_ASSERT(fabs(tbest - best) <= 1e-12 * best);
    printf("\n    guard decision: %s", decision ? decision : "?");
    int shipped_cand = 0;
    for (long k = 0; k < dk[0]; k++)
        if (passed[k] != 0.0 && !memcmp(cand + k * 4, tplan, 4 * sizeof *tplan)) {
            CU_ASSERT(bound[k] <= log1p(0.005));
            shipped_cand = 1;
        }
    CU_ASSERT(shipped_cand);

    /* 1. per text, the calibration figures re-earned by kvplan eval on the text alone (its
     * first 8 chunks); the plan not worse than uniform on any text or part; the TinyStories
     * held-out part (tokens 4096..6143) re-earned too */
    char plan_opt[4096], uni_opt[256];
    snprintf(plan_opt, sizeof plan_opt, "--plan %s", PLAN);
    snprintf(uni_opt, sizeof uni_opt,
             "--ratio 0.0625 --allocation uniform --block-size 1 --evict-block 1");
    for (int t = 0; t < 2; t++) {
        CU_ASSERT_EQUAL(tch[t * 2], 8);
        CU_ASSERT_EQUAL(tch[t * 2 + 1], 4);
        char targ[4200];
        snprintf(targ, sizeof targ, "--text '%s' --max-tokens 4096", texts[t]);
        double p = NAN, u = NAN;
        CU_ASSERT_EQUAL(eval_text(targ, plan_opt, &p, NULL, NULL), 0);
        CU_ASSERT_EQUAL(eval_text(targ, uni_opt, &u, NULL, NULL), 0);
        printf("\n    text %d calibration: full %.4f, uniform %.4f (eval %.4f), plan %.4f (eval "
               "%.4f); held-out: full %.4f, uniform %.4f, plan %.4f",
               t, tfull[t * 2], tuni[t * 2], u, tplan[t * 2], p, tfull[t * 2 + 1], tuni[t * 2 + 1],
               tplan[t * 2 + 1]);
        CU_ASSERT(fabs(p - tplan[t * 2]) <= TP_REL * p);
        CU_ASSERT(fabs(u - tuni[t * 2]) <= TP_REL * u);
        for (int part = 0; part < 2; part++)
            CU_ASSERT(tplan[t * 2 + part] <= tuni[t * 2 + part] * (1 + 1e-6));
    }
    CU_ASSERT_EQUAL_FATAL(token_slice(texts[0], 4096, 2048, held_ids), 0);
    double ph = NAN;
    snprintf(args, sizeof args, "--tokens %s", held_ids);
    CU_ASSERT_EQUAL(eval_text(args, plan_opt, &ph, NULL, NULL), 0);
    CU_ASSERT(fabs(ph - tplan[1]) <= TP_REL * ph);

    /* 2. up to three pseudo-random grid cells re-evaluated independently: kvplan plan from the
     * profile, then kvplan eval on each text's first chunks; the search's 16 chunks are 8 of
     * each text, so the cell's perplexity is exp of the token-weighted mean NLL of the two */
    CU_ASSERT_FATAL(rank == 2 || rank == 3);
    long NP = rank == 3 ? dims[0] : 1, NT = dims[rank - 2], NR = dims[rank - 1];
    /* cells on an even number of chunks (half of them from each text), of distinct
     * perplexity: all of an exhaustive grid's, the last rounds' of a successive-halving one */
    int want = 0;
    double distinct[3];
    for (long cell = 0; cell < NP * NT * NR && want < 3; cell++) {
        if (chunks[cell] < 2 || chunks[cell] % 2 || !isfinite(ppl[cell])) continue;
        int seen = 0;
        for (int i = 0; i < want; i++) seen |= ppl[cell] == distinct[i];
        if (!seen) distinct[want++] = ppl[cell];
    }
    CU_ASSERT(want >= 1);
    unsigned long x = 20261126;
    int done = 0;
    double picked[3];
    for (int tries = 0; done < want && tries < 10000; tries++) {
        x = x * 6364136223846793005ul + 1442695040888963407ul;
        long cell = (long)((x >> 33) % (unsigned long)(NP * NT * NR));
        if (chunks[cell] < 2 || chunks[cell] % 2 || !isfinite(ppl[cell])) continue;
        int seen = 0; /* three cells of different perplexity (high t: cells alike) */
        for (int i = 0; i < done; i++) seen |= ppl[cell] == picked[i];
        if (seen) continue;
        picked[done] = ppl[cell];
        long ip = cell / (NT * NR), it = (cell / NR) % NT, ir = cell % NR;
        snprintf(args, sizeof args,
                 "plan --profile %s --model '%s' --ratio %.17g --kv-type f16 --allocation baklava "
                 "--t %.17g --r %.17g --p %.17g --context 512 --evict-block %d --block-size %d "
                 "--quiet -o %s",
                 prof, tu_shared(MODEL), shipped.ratio, tv[it], rv[ir], pv[ip], (int)grid_p,
                 shipped.block_size, cell_h5);
        CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, NULL, 0), 0);
        snprintf(opts, sizeof opts, "--plan %s", cell_h5);
        double s = 0.0, n = 0.0;
        for (int t = 0; t < 2; t++) {
            char targ[4200];
            snprintf(targ, sizeof targ, "--text '%s' --max-tokens %d", texts[t],
                     chunks[cell] / 2 * 512);
            double p = NAN, nll = NAN, sc = NAN;
            CU_ASSERT_EQUAL_FATAL(eval_text(targ, opts, &p, &nll, &sc), 0);
            s += nll * sc;
            n += sc;
        }
        double v = exp(s / n);
        printf("\n    cell p %.2f t %.2f r %.2f on %d chunks: stored %.6f, re-evaluated %.6f",
               pv[ip], tv[it], rv[ir], chunks[cell], ppl[cell], v);
        /* the stored values come from scripts/make-plans.sh's release build; a build with
         * other optimisation rounds floats differently (seen: 2e-7 in the -O1 sanitizer
         * build), far below the >1% that separates neighbouring cells */
        CU_ASSERT(fabs(v - ppl[cell]) <= TP_REL * ppl[cell]);
        done++;
    }
    CU_ASSERT_EQUAL(done, want);
    printf("\n");

    /* 3. the plan in the runtime: peak K/V bytes within the plan's bytes in its heads' types
     * (+ one block per head), at most R = 1/16 of the full F16 cache plus those blocks */
    snprintf(args, sizeof args, "eval '%s' --text '%s' --plan %s --max-tokens 2048 --json --quiet",
             tu_shared(MODEL), texts[0], PLAN);
    CU_ASSERT_EQUAL_FATAL(tu_run_kvplan(args, &out, 0), 0);
    double peak = tu_json_number(out, "kv_bytes_peak"), full = tu_json_number(out, "kv_bytes_full");
    free(out);
    double slack = 0.0;
    int n_types[KV_CACHE_TYPES] = {0};
    for (int i = 0; i < shipped.n_layers * shipped.n_kv_heads; i++) {
        slack += (double)shipped.block_size *
                 (double)kv_type_token_bytes(shipped.kv_type[i], shipped.model_head_dim);
        n_types[shipped.kv_type[i]]++;
    }
    printf("    R = 1/16 plan: heads f16 %d q8 %d q4 %d; peak %.0f bytes, plan %.0f, full F16 %.0f "
           "(%.4f)\n",
           n_types[KV_TYPE_F16], n_types[KV_TYPE_Q8], n_types[KV_TYPE_Q4], peak, plan_bytes, full,
           peak / full);
    CU_ASSERT(fabs(full - full_f16) <= 0.5);
    CU_ASSERT(peak <= plan_bytes + slack);
    CU_ASSERT(peak <= 0.0625 * full + slack);

    /* 4. refused for another model */
    snprintf(args, sizeof args, "eval '%s' --text '%s' --plan %s --quiet",
             tu_shared("models/tinystories-656k"), texts[0], PLAN);
    CU_ASSERT_EQUAL(tu_run_kvplan(args, &out, 1), 1);
    CU_ASSERT_TRUE(out && strstr(out, "stories260K.r1-16.h5"));
    free(out);
    kv_plan_free(&shipped);
    free(ppl), free(chunks), free(tv), free(rv), free(pv);
    free(tfull), free(tuni), free(tplan), free(tch), free(bound), free(passed), free(cand),
        free(tuni_type);
    free(decision);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"shipped plan: per-text figures re-earned, random cells re-evaluated, bytes, wrong model",
         test_shipped_plan},
    };
    return tu_main(argc, argv, "plans", tests, sizeof tests / sizeof tests[0]);
}
