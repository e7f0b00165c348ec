/* kvplan search: BaKlaVa Alg. 3 parameter search by budgeted perplexity, with baselines,
 * held-out check and optional successive halving; writes plan.h5. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/h5io.h"
#include "kvplan/retrieval.h"
#include "kvplan/search.h"
#include "kvplan/tokenizer.h"
#include "plan_args.h"
#include "search_estimate.h"

#ifndef KVPLAN_VERSION_STRING
#define KVPLAN_VERSION_STRING "unknown"
#endif

#define STR_(x) #x
#define STR(x) STR_(x)

typedef struct search_args {
    kv_opt_strs texts;
    const char *text_list, *text_objective;
    const char *tokenizer, *t_grid, *r_grid, *p_grid, *sens_objective, *sens_policies, *kv_types;
    const char *retrieval;
    double retrieval_tol;
    long eval_tokens, heldout_tokens, halving, calib, levels, rounds, sbatch;
    int resume, sens_full, estimate, json;
    const char *shape, *device_preset;
    kv_plan_args a;
    kv_threads_args threads;
} search_args;

static const kv_opt search_opts[] = {
    {"--text", NULL, KV_OPT_STRS, offsetof(search_args, texts), "T",
     .help = "calibration text (tokenized with BOS first); give it up to 16 times for several "
             "texts: the search and held-out tokens are shared evenly among them, every text's "
             "perplexity is recorded (/search/texts) and the plan must not be worse than the "
             "uniform cache on any of them"},
    {"--text-list", NULL, KV_OPT_STR, offsetof(search_args, text_list), "FILE",
     .help = "a file naming calibration texts, one path a line (blank lines and lines starting "
             "with # are skipped), after the --text ones"},
    {"--text-objective", NULL, KV_OPT_STR, offsetof(search_args, text_objective), "O",
     .def = "mean",
     .help = "how the guard ranks the plan, the knapsack's solution, their blends towards "
             "uniform and uniform over the texts (among those not worse than uniform on any "
             "text): mean (of the per-text log(ppl / uniform ppl)), worst (the largest) or both "
             "(their sum)"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(search_args, tokenizer), "TOK",
     .help = "tokenizer file (default: the model's)"},
    {"--t-grid", NULL, KV_OPT_STR, offsetof(search_args, t_grid), "a:b:step",
     .def = "0.50:0.95:0.05", .help = "thresholds on head similarity"},
    {"--r-grid", NULL, KV_OPT_STR, offsetof(search_args, r_grid), "a:b:step",
     .def = "0.05:0.95:0.05", .help = "reductions"},
    {"--p-grid", NULL, KV_OPT_STR, offsetof(search_args, p_grid), "a:b:step",
     .help = "SqueezeAttention p values (default " STR(
         KV_SQUEEZE_DEFAULT_P) "; squeeze searches 0.1:1.0:0.1 by default); a list a,b,c works for "
                               "all grids"},
    {"--eval-tokens", NULL, KV_OPT_INT, offsetof(search_args, eval_tokens), "N", 2, 1099511627776.0,
     .def = "8192", .help = "search tokens"},
    {"--heldout-tokens", NULL, KV_OPT_INT, offsetof(search_args, heldout_tokens), "N", 0,
     1099511627776.0, .def = "4096", .help = "held-out tokens after them (0 = none)"},
    {"--halving", NULL, KV_OPT_INT, offsetof(search_args, halving), "ETA", 2, 1000,
     .help = "successive halving: all points on 1 chunk, keep the best 1/ETA, ETA times more "
             "chunks, ... (default: 3 when sensitivity planning runs and --sens-full is not given, "
             "else exhaustive)"},
    {"--calib-chunks", NULL, KV_OPT_INT, offsetof(search_args, calib), "N", 1, 1 << 20, .def = "2",
     .help = "sensitivity: calibration chunks"},
    {"--sens-levels", NULL, KV_OPT_INT, offsetof(search_args, levels), "N", 2, 4096, .def = "16",
     .help = "sensitivity: measured budget levels per head"},
    {"--sens-rounds", NULL, KV_OPT_INT, offsetof(search_args, rounds), "N", 1, 100, .def = "3",
     .help = "sensitivity: solve rounds, 1 = no refinement"},
    {"--sens-batch", NULL, KV_OPT_INT, offsetof(search_args, sbatch), "N", 1, 64, .def = "32",
     .help = "sensitivity: perturbations per batched pass"},
    {"--sens-full", NULL, KV_OPT_FLAG, offsetof(search_args, sens_full),
     .help = "sensitivity: measure every point of every loss curve in every round (about 3x the "
             "token evaluations of the default sparse curves; docs/planner-search.md)"},
    {"--sens-objective", NULL, KV_OPT_STR, offsetof(search_args, sens_objective), "O", .def = "kl",
     .help = "sensitivity: what the knapsack sums: kl (KL to the full cache), nll, or both "
             "(one solution each, the better on the search tokens kept)"},
    {"--sens-policies", NULL, KV_OPT_STR, offsetof(search_args, sens_policies), "LIST",
     .help = "sensitivity: policies a head may choose, e.g. sink,h2o (default: the --policy "
             "only)"},
    {"--kv-types", NULL, KV_OPT_STR, offsetof(search_args, kv_types), "LIST",
     .help = "KV storage types the sensitivity knapsack may give a head (it chooses tokens and "
             "type per head at the plan's bytes), and whose uniform caches at the plan's bytes "
             "are evaluated on the search and held-out tokens into /search/kv_types (default: "
             "f16,q8,q4; f32 only when listed; `none`: every head --kv-type, no baselines)"},
    {"--retrieval", NULL, KV_OPT_STR, offsetof(search_args, retrieval), "FILE",
     .help = "retrieval probes (TSV: prompt, tab, answer; docs/retrieval.md): after the guard, "
             "a plan whose probe accuracy is more than --retrieval-tolerance below the full "
             "cache's is replaced by the best plan of the retrieval stage (knapsacks with the "
             "heads' retrieval cost, retrieval heads whole), recorded in /search/retrieval"},
    {"--retrieval-tolerance", NULL, KV_OPT_NUM, offsetof(search_args, retrieval_tol), "POINTS", 0,
     100, .def = "5",
     .help = "probe accuracy (percentage points) a plan may lose against the full cache"},
    {"--estimate", NULL, KV_OPT_FLAG, offsetof(search_args, estimate),
     .help = "print every stage's token evaluations (grid, baselines, sensitivity curves and "
             "refinement, eviction-block ladder, held-out, KV-type caches, guard, retrieval) and "
             "a projected wall time (a calibration forward on the search's engine, or "
             "--device-preset's roofline), then exit without searching; -o is not needed"},
    {"--shape", NULL, KV_OPT_STR, offsetof(search_args, shape), "L,H,KVH,DH,FFN,VOCAB",
     .help = "with --estimate: a model given by its shape (layers, heads, KV heads, head dim, FFN "
             "size, vocabulary) instead of --model; needs --context and --device-preset"},
    {"--device-preset", NULL, KV_OPT_STR, offsetof(search_args, device_preset), "h100|a100|cpu",
     .help = "with --estimate: project the time from this device's roofline per token (weights, "
             "KV bytes and FLOPs; docs/search-estimate.md)"},
    {"--json", NULL, KV_OPT_FLAG, offsetof(search_args, json),
     .help = "with --estimate: print the estimate as JSON"},
    {"--resume", NULL, KV_OPT_FLAG, offsetof(search_args, resume),
     .help = "continue a killed run from its task log PLAN.h5.tasks (written as the run goes, "
             "removed when it finishes)"},
};

const kv_cli_spec kv_spec_search = {
    "search",
    "usage: kvplan search --profile P --model MODEL [--tokenizer TOK] --text T --ratio R\n"
    "                     [--allocation both|sensitivity|baklava|squeeze|uniform]\n"
    "                     [--t-grid a:b:step]\n"
    "                     [--r-grid a:b:step] [--p-grid ...] [--eval-tokens N]\n"
    "                     [--heldout-tokens N] [--halving ETA] [options] -o PLAN.h5\n",
    "BaKlaVa Alg. 3: every grid point's budgets are evaluated by budgeted perplexity on\n"
    "the first N tokens of the text (chunks of C tokens, a fresh cache per chunk); the\n"
    "minimum wins. The baselines full, uniform and squeeze are evaluated at the same\n"
    "ratio, and the winner and the baselines once more on held-out tokens after the\n"
    "search tokens. Grid points with identical rounded budgets share one evaluation.\n"
    "Sensitivity planning (--allocation both, the default, or sensitivity): every KV\n"
    "head's loss curve (change of NLL and KL to the full cache when that head alone\n"
    "gets budget b) is measured on the first search chunks in batched passes; a\n"
    "multiple-choice knapsack (GLPK MIP) picks one budget (and policy) per head under\n"
    "the same total; the solution is verified and refined on the search tokens. The\n"
    "better of it and the grid's winner on the search tokens becomes the plan.\n"
    "Without --block-size/--evict-block, b_s = p is chosen from R and C so that budget\n"
    "can move between heads (at least 8 blocks per head on average, floor <= half).\n"
    "Without --evict-block, the winner and uniform are then measured at p/2, ..., 1\n"
    "on the search tokens and the best (budgets, p) becomes the plan (a smaller p\n"
    "keeps more context per head at the same memory, for more eviction work).\n",
    "Under `mpirun -np N` or `srun` the chunk evaluations are shared among the ranks\n"
    "(rank 0 writes the plan, identical to a one-process run's).\n",
    {{NULL, search_opts, sizeof search_opts / sizeof search_opts[0], 0},
     {"plan and search options", kv_plan_opts, KV_PLAN_OPTS_N, offsetof(search_args, a)},
     {"KV budget options (--device: where the evaluations run)", kv_budget_opts,
      KV_BUDGET_OPTS_DEVICE, offsetof(search_args, a) + offsetof(kv_plan_args, b)},
     {"threads", kv_threads_opts, KV_THREADS_OPTS_N, offsetof(search_args, threads)}},
};

/* "sink,h2o" -> policies (at most KV_SENS_MAX_POLICIES). */
static int parse_policies(const char *s, kv_policy *out, int *n, kv_error *err) {
    *n = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == KV_SENS_MAX_POLICIES)
            return kv_fail(err, KV_EINPUT, "--sens-policies '%s': at most %d policies", s,
                           KV_SENS_MAX_POLICIES);
        int rc = kv_policy_parse(t, &out[*n], err);
        if (rc) return kv_fail_context(err, "--sens-policies '%s'", s);
        (*n)++;
    }
    if (*n == 0) return kv_fail(err, KV_EINPUT, "--sens-policies '%s': no policy", s);
    return KV_OK;
}

/* --sens-objective: kl, nll or both. */
static int parse_objective(const char *s, kv_sens_objective *out, kv_error *err) {
    if (!strcmp(s, "kl"))
        *out = KV_SENS_OBJ_KL;
    else if (!strcmp(s, "nll"))
        *out = KV_SENS_OBJ_NLL;
    else if (!strcmp(s, "both"))
        *out = KV_SENS_OBJ_BOTH;
    else
        return kv_fail(err, KV_EINPUT, "--sens-objective '%s': expected kl, nll or both", s);
    return KV_OK;
}

static int mixed_policies(const kv_policy *p, int n, kv_policy base) {
    for (int i = 0; i < n; i++)
        if (p[i] != base) return 1;
    return 0;
}

/* What a search needs, built by every rank: the model, the profile, the allocation
 * parameters, the grids, the sensitivity settings and the text's token ids. */
typedef struct search_job {
    kv_model *m;
    kv_profile_inputs prof;
    int have_prof, evict_block, sensitivity;
    kv_alloc_params ap;
    kv_policy policy;
    double *tv, *rv, *pv;
    int nt, nr, np;
    kv_sens_objective objective;
    kv_policy spolicies[KV_SENS_MAX_POLICIES];
    int n_spol;
    int *ids, n_ids;
    int n_texts;                                 /* calibration texts */
    const char *text_names[KV_ROBUST_MAX_TEXTS]; /* their paths (argv or list_buf) */
    long text_tokens[KV_ROBUST_MAX_TEXTS];       /* tokens of each */
    int *chunk_text, S, HC;                      /* the layout (kv_robust_lay_out) */
    char *list_buf;                              /* --text-list contents, owned */
    kv_robust_objective text_objective;
    char text_sha[65]; /* SHA-256 of the text's bytes and of its token ids (task-log key) */
    char ids_sha[65];
    kv_probes probes;         /* --retrieval's, tokenized (n = 0 without) */
    kv_retrieval_heads heads; /* the profile's /heads/retrieval (none: the stage measures them) */
    kv_retrieval_opts ro;     /* the retrieval stage's options (--retrieval) */
} search_job;

static void job_free(search_job *j) {
    free(j->ids);
    free(j->chunk_text);
    free(j->list_buf);
    free(j->tv);
    free(j->rv);
    free(j->pv);
    kv_profile_inputs_free(&j->prof);
    kv_probes_free(&j->probes);
    kv_retrieval_heads_free(&j->heads);
    kv_model_free(j->m);
}

/* The calibration texts: the --text values, then the paths in --text-list. */
static int collect_texts(const search_args *s, search_job *j, kv_error *err) {
    j->n_texts = 0;
    for (int i = 0; i < s->texts.n; i++) j->text_names[j->n_texts++] = s->texts.v[i];
    if (s->text_list) {
        size_t len = 0;
        int rc = kv_check_regular(s->text_list, "text list", err);
        if (!rc) rc = kv_read_file(s->text_list, &j->list_buf, &len, err);
        if (rc) return rc;
        for (char *save = NULL, *l = strtok_r(j->list_buf, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save)) {
            size_t n = strlen(l);
            while (n && (l[n - 1] == '\r' || l[n - 1] == ' ' || l[n - 1] == '\t')) l[--n] = '\0';
            if (!n || l[0] == '#') continue;
            if (j->n_texts == KV_ROBUST_MAX_TEXTS)
                return kv_fail(err, KV_EINPUT, "%s: more than %d calibration texts", s->text_list,
                               KV_ROBUST_MAX_TEXTS);
            j->text_names[j->n_texts++] = l;
        }
    }
    if (!j->n_texts)
        return kv_fail(err, KV_EINPUT, "%s names no text", s->text_list ? s->text_list : "--text");
    for (int t = 0; t < j->n_texts; t++) {
        int rc = kv_check_regular(j->text_names[t], "text", err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* Every text's token ids (BOS first), with the tokenizer, laid out for the search
 * (kv_robust_lay_out); the SHA-256 of the texts' bytes and of the laid-out ids. */
static int tokenize_text(const search_args *s, search_job *j, kv_error *err) {
    kv_tokenizer *tok = NULL;
    int *ids[KV_ROBUST_MAX_TEXTS] = {0};
    const char *names[2 * KV_ROBUST_MAX_TEXTS];
    const void *bufs[2 * KV_ROBUST_MAX_TEXTS];
    size_t lens[2 * KV_ROBUST_MAX_TEXTS];
    char *texts[KV_ROBUST_MAX_TEXTS] = {0};
    int rc = kv_tokenizer_load(s->tokenizer, j->m, &tok, err);
    for (int t = 0; t < j->n_texts && !rc; t++) {
        size_t len = 0;
        int n = 0;
        rc = kv_read_file(j->text_names[t], &texts[t], &len, err);
        if (!rc) rc = kv_tokenizer_encode(tok, texts[t], len, 1, &ids[t], &n, err);
        if (rc && texts[t]) kv_fail_context(err, "tokenizing %s", j->text_names[t]);
        j->text_tokens[t] = n;
        names[t] = j->text_names[t], bufs[t] = texts[t], lens[t] = len;
    }
    if (!rc)
        rc = kv_robust_lay_out(j->n_texts, j->text_names, (const int *const *)ids, j->text_tokens,
                               j->ap.context, s->eval_tokens, s->heldout_tokens, &j->ids, &j->S,
                               &j->HC, &j->chunk_text, err);
    if (!rc) {
        j->n_ids = (j->S + j->HC) * j->ap.context;
        rc = kv_sha256_parts(names, bufs, lens, (size_t)j->n_texts, j->text_sha, err);
        const char *in[1] = {"token ids"};
        const void *b[1] = {j->ids};
        size_t l[1] = {(size_t)j->n_ids * sizeof *j->ids};
        if (!rc) rc = kv_sha256_parts(in, b, l, 1, j->ids_sha, err);
    }
    for (int t = 0; t < j->n_texts; t++) free(ids[t]), free(texts[t]);
    kv_tokenizer_free(tok);
    return rc;
}

/* --retrieval's probes, tokenized with the text's tokenizer; refused before the search when a
 * probe does not fit the context. */
static int read_probes(const search_args *s, search_job *j, kv_error *err) {
    kv_tokenizer *tok = NULL;
    int rc = kv_tokenizer_load(s->tokenizer, j->m, &tok, err);
    if (!rc) rc = kv_probes_read(s->retrieval, tok, j->ap.context, &j->probes, err);
    kv_tokenizer_free(tok);
    return rc;
}

/* The retrieval stage's options (--retrieval), with the profile's /heads/retrieval when it has
 * them (else the stage measures the heads); heads is the caller's (kv_retrieval_heads_free). */
static int retrieval_opts(const search_args *s, const search_job *j, kv_retrieval_heads *heads,
                          kv_retrieval_opts *ro, kv_error *err) {
    memset(heads, 0, sizeof *heads);
    int found = 0, rc = KV_OK;
    if (s->a.profile) {
        kv_h5 *f = NULL;
        rc = kv_h5_open_read(s->a.profile, &f, err);
        if (!rc)
            rc = kv_retrieval_heads_read(f, s->a.profile, j->m->cfg.n_layers, j->m->cfg.n_kv_heads,
                                         heads, &found, err);
        kv_h5_close(f);
    }
    kv_retrieval_opts_default(ro);
    ro->tolerance = s->retrieval_tol / 100.0;
    ro->heads = found ? heads : NULL;
    return rc;
}

/* --allocation both (default) / sensitivity / a grid allocation. */
static void job_allocation(kv_plan_args *a, search_job *j) {
    j->sensitivity = 1;
    if (!a->b.allocation || !strcmp(a->b.allocation, "both"))
        a->b.allocation = "baklava";
    else if (!strcmp(a->b.allocation, "sensitivity"))
        a->b.allocation = "uniform"; /* the grid is then the uniform plan alone */
    else
        j->sensitivity = 0;
}

/* The default blocks, the sensitivity objective and policies, and the grids. */
static int job_grids(const search_args *s, search_job *j, kv_error *err) {
    const kv_plan_args *a = &s->a;
    int rc = kv_search_default_blocks(j->ap.ratio, j->ap.context, j->policy, (int)a->b.block_size,
                                      (int)a->b.evict_block, &j->ap.block_size, &j->evict_block,
                                      &j->ap.min_tokens, err);
    if (!rc) rc = parse_objective(s->sens_objective, &j->objective, err);
    if (!rc && s->sens_policies)
        rc = parse_policies(s->sens_policies, j->spolicies, &j->n_spol, err);
    if (!rc) rc = kv_grid_parse(s->t_grid, "--t-grid", 0.0, 1.0, &j->tv, &j->nt, err);
    if (!rc) rc = kv_grid_parse(s->r_grid, "--r-grid", 0.0, 1.0, &j->rv, &j->nr, err);
    if (!rc) {
        const char *ps = s->p_grid ? s->p_grid
                                   : (j->ap.kind == KV_ALLOC_SQUEEZE ? "0.1:1.0:0.1"
                                                                     : STR(KV_SQUEEZE_DEFAULT_P));
        rc = kv_grid_parse(ps, "--p-grid", 0.0, 1.0, &j->pv, &j->np, err);
    }
    return rc;
}

static int build_job(search_args *s, search_job *j, kv_error *err) {
    kv_plan_args *a = &s->a;
    /* the text and tokenizer are inputs too: checked before the (long) search starts */
    int rc = collect_texts(s, j, err);
    const char *inputs[5 + KV_ROBUST_MAX_TEXTS] = {a->model, a->profile, s->tokenizer, s->text_list,
                                                   s->retrieval};
    for (int t = 0; t < j->n_texts; t++) inputs[5 + t] = j->text_names[t];
    if (!rc && a->out) rc = kv_check_output(a->out, "-o", inputs, 5 + j->n_texts, err);
    if (!rc) rc = kv_robust_objective_parse(s->text_objective, &j->text_objective, err);
    if (!rc && s->tokenizer) rc = kv_check_regular(s->tokenizer, "tokenizer", err);
    job_allocation(a, j);
    if (!rc)
        rc = kv_plan_args_setup(a, &j->m, &j->prof, &j->have_prof, &j->ap, &j->policy,
                                &j->evict_block, err);
    if (!rc) rc = kv_cli_blas_ready(err);
    if (!rc) rc = job_grids(s, j, err);
    if (!rc) rc = tokenize_text(s, j, err);
    if (!rc && s->retrieval) rc = read_probes(s, j, err);
    if (!rc && s->retrieval) rc = retrieval_opts(s, j, &j->heads, &j->ro, err);
    return rc;
}

/* --estimate --shape: a model of that shape (cfg only), no profile and no text: the chunks
 * are the layout's for texts long enough (kv_robust_lay_out). */
static int shape_job(search_args *s, search_job *j, kv_error *err) {
    kv_plan_args *a = &s->a;
    if (!a->context)
        return kv_fail(err, KV_EINPUT, "--shape needs --context C (tokens per search chunk)");
    if (!s->device_preset)
        return kv_fail(err, KV_EINPUT, "--shape needs --device-preset h100, a100 or cpu");
    if (!(a->b.ratio > 0.0))
        return kv_fail(err, KV_EINPUT, "--ratio R is required (0 < R <= 1 of the full F16 cache)");
    j->m = kv_calloc(1, sizeof *j->m, "model shape", err);
    if (!j->m) return KV_EINTERNAL;
    int rc = kv_estimate_parse_shape(s->shape, (int)a->context, &j->m->cfg, err);
    job_allocation(a, j);
    kv_alloc_params_default(&j->ap);
    if (!rc && (rc = kv_alloc_parse(a->b.allocation, &j->ap.kind, err))) return rc;
    j->policy = KV_POLICY_SINK;
    if (!rc && a->b.policy) rc = kv_policy_parse(a->b.policy, &j->policy, err);
    if (!rc) rc = kv_budget_args_type(&a->b, &j->ap.kv_type, err);
    if (!rc)
        rc = kv_search_ratio_tokens(a->b.ratio, j->ap.kv_type, j->m->cfg.head_dim, &j->ap.ratio,
                                    err);
    j->ap.context = (int)a->context;
    j->ap.layer_kind = KV_ALLOC_SQUEEZE;
    j->ap.block_size = a->b.block_size ? (int)a->b.block_size : KV_DEFAULT_BLOCK_SIZE;
    j->evict_block = a->b.evict_block ? (int)a->b.evict_block : KV_DEFAULT_EVICT_BLOCK;
    j->ap.min_tokens = kv_policy_fixed_tokens(j->policy) + j->evict_block;
    if (!rc) rc = job_grids(s, j, err);
    j->n_texts = s->texts.n > 1 ? s->texts.n : 1;
    long per_text = s->eval_tokens / j->n_texts / a->context;
    j->S = (int)(j->n_texts * per_text);
    j->HC = (int)(j->n_texts * (s->heldout_tokens / j->n_texts / a->context));
    if (!rc && j->S < 1)
        rc = kv_fail(err, KV_EINPUT, "--eval-tokens %ld is less than one chunk of %ld tokens",
                     s->eval_tokens, a->context);
    return rc;
}

static int fill_opts(const search_args *s, const search_job *j, kv_progress *prog,
                     kv_search_opts *so, kv_error *err) {
    kv_search_opts_default(so, j->m);
    so->allocation = j->ap.kind;
    so->ratio = j->ap.ratio;
    so->kv_type = j->ap.kv_type;
    /* default: every type that can beat f16 at the same bytes (f32 never does: it holds half
     * the tokens of f16 at the same rounding-sized error) */
    so->kv_types_mask = (1 << KV_TYPE_F16) | (1 << KV_TYPE_Q8) | (1 << KV_TYPE_Q4);
    if (s->kv_types && !strcmp(s->kv_types, "none")) {
        so->kv_types_mask = 0;
    } else if (s->kv_types) { /* a comma-separated list of type names */
        so->kv_types_mask = 0;
        char buf[128];
        snprintf(buf, sizeof buf, "%s", s->kv_types);
        for (char *tok = buf; tok;) {
            char *comma = strchr(tok, ',');
            if (comma) *comma = '\0';
            kv_cache_type t = KV_TYPE_DEFAULT;
            if (kv_type_parse(tok, &t, err)) return kv_fail_context(err, "--kv-types");
            so->kv_types_mask |= 1 << t;
            tok = comma ? comma + 1 : NULL;
        }
    }
    so->context = j->ap.context;
    so->block_size = j->ap.block_size;
    so->evict_block = j->evict_block;
    so->evict_block_search = !s->a.b.evict_block; /* a given --evict-block is kept */
    so->policy = j->policy;
    so->t_values = j->tv, so->n_t = j->nt;
    so->r_values = j->rv, so->n_r = j->nr;
    so->p_values = j->pv, so->n_p = j->np;
    so->eval_tokens = (long)j->S * j->ap.context; /* the layout's (kv_robust_lay_out) */
    so->heldout_tokens = (long)j->HC * j->ap.context;
    /* the grid only competes with sensitivity planning: by successive halving (eta 3) unless
     * --halving or --sens-full (the exhaustive grid and full curves) says otherwise */
    so->halving_eta = s->halving ? (int)s->halving : j->sensitivity && !s->sens_full ? 3 : 0;
    so->progress = prog;
    so->sensitivity = j->sensitivity;
    /* the first calibration chunks are one per text (interleaved): at least one per text */
    so->sens.calib_chunks = (int)s->calib > j->n_texts ? (int)s->calib : j->n_texts;
    so->sens.max_levels = (int)s->levels;
    so->sens.max_rounds = (int)s->rounds;
    so->sens.batch = (int)s->sbatch;
    so->sens.full_curves = s->sens_full;
    /* a refinement round's curves: half the calibration chunks, at least one per text */
    so->sens.refine_chunks = (int)s->calib / 2 > j->n_texts ? (int)s->calib / 2 : j->n_texts;
    so->sens.objective = j->objective;
    so->sens.n_policies = j->n_spol;
    for (int q = 0; q < j->n_spol; q++) so->sens.policies[q] = j->spolicies[q];
    so->n_threads = kv_threads_args_count(&s->threads);
    return kv_cli_device(s->a.b.device, &so->device, err);
}

/* The task log beside the output (kv_tasks_log_path), keyed by everything the logged
 * results depend on: the log format and the build's schemas, a hash of the arguments (not
 * --resume, --quiet, -o, --threads N: the results are the same bits for every thread count), the
 * SHA-256 of the model, the profile, the text, the --tokenizer file
 * ("model": the model's own) and the text's token ids (so a changed tokenizer beside a
 * llama2.c model counts too); a resume after any of them changed is refused naming it. Rank 0 only
 * (the other ranks keep no log). */
/* Arguments the results do not depend on (--threads: the same bits for every count; -o: the
 * output's name). 2: the argument and its value, 1: the argument alone, 0: part of the key. */
static int key_skips(const char *a) {
    if (!strcmp(a, "--threads") || !strcmp(a, "-o") || !strcmp(a, "--output")) return 2;
    return !strcmp(a, "--resume") || !strcmp(a, "--quiet") || !strncmp(a, "--threads=", 10) ||
           !strncmp(a, "--output=", 9) || !strncmp(a, "-o", 2);
}

static int open_task_log(kv_tasks *tasks, const search_args *s, const search_job *j, int argc,
                         char **argv, char *log_path, size_t cap, kv_error *err) {
    int rc = kv_tasks_log_path(s->a.out, log_path, cap, err);
    if (rc || kv_tasks_rank(tasks) != 0) return rc;
    /* the arguments, each followed by a NUL, hashed */
    size_t total = 1;
    for (int i = 1; i < argc; i++) total += strlen(argv[i]) + 1;
    char *args = kv_malloc(total, "task log key", err);
    if (!args) return KV_EINTERNAL;
    size_t used = 0;
    for (int i = 1; i < argc; i++) {
        int skip = key_skips(argv[i]);
        if (skip) {
            i += skip - 1; /* and its value */
            continue;
        }
        size_t l = strlen(argv[i]) + 1;
        memcpy(args + used, argv[i], l);
        used += l;
    }
    char cmd_sha[65], prof_sha[65] = "none", tok_sha[65] = "model";
    const char *names[1] = {"command line"};
    const void *bufs[1] = {args};
    rc = kv_sha256_parts(names, bufs, &used, 1, cmd_sha, err);
    free(args);
    if (!rc && s->a.profile) rc = kv_sha256_file(s->a.profile, prof_sha, err);
    if (!rc && s->tokenizer) rc = kv_sha256_file(s->tokenizer, tok_sha, err);
    if (rc) return rc;
    char key[1024];
    snprintf(key, sizeof key,
             "format=search-1 schema=%d plan_schema=%d kvplan=%s command=%s model=%s "
             "profile=%s text=%s tokenizer=%s token_ids=%s",
             KV_SCHEMA_VERSION, KV_PLAN_SCHEMA_VERSION, KVPLAN_VERSION_STRING, cmd_sha,
             j->m->sha256, prof_sha, j->text_sha, tok_sha, j->ids_sha);
    const char *inputs[5 + KV_ROBUST_MAX_TEXTS] = {s->a.model, s->a.profile, s->tokenizer,
                                                   s->text_list, s->a.out};
    for (int t = 0; t < j->n_texts; t++) inputs[5 + t] = j->text_names[t];
    rc = kv_tasks_log_open(tasks, log_path, key, s->resume, inputs, 5 + j->n_texts, err);
    if (!rc && kv_tasks_log_discarded(tasks) > 0)
        fprintf(stderr,
                "kvplan search: note: %s held an earlier run's finished tasks (%ld bytes); they "
                "are discarded and the search starts afresh (pass --resume to continue such a "
                "run)\n",
                log_path, kv_tasks_log_discarded(tasks));
    return rc;
}

static void print_perplexities(const kv_search_result *res) {
    printf("perplexity   %-10s %-10s %-10s %-10s %-10s\n", "", "winner", "full", "uniform",
           "squeeze");
    printf("             %-10s %-10.4f %-10.4f %-10.4f %-10.4f\n", "search", res->best_ppl,
           res->base_ppl[0], res->base_ppl[1], res->base_ppl[2]);
    if (res->heldout_chunks > 0)
        printf("             %-10s %-10.4f %-10.4f %-10.4f %-10.4f\n", "held-out",
               res->heldout_ppl[0], res->heldout_ppl[1], res->heldout_ppl[2], res->heldout_ppl[3]);
    if (!res->have_sens) return;
    printf("allocations  %-10s %-10s %-10s\n", "", "grid", "sensitivity");
    printf("             %-10s %-10.4f %-10.4f\n", "search", res->grid_ppl, res->sens_ppl);
    if (res->heldout_chunks > 0)
        printf("             %-10s %-10.4f %-10.4f\n", "held-out", res->grid_heldout,
               res->sens_heldout);
    printf("cost         grid + baselines %ld token evals, %.1f s; sensitivity %ld token "
           "evals (curves %ld, %.1f s), %.1f s\n",
           res->grid_token_evals_all, res->grid_seconds, res->sens.token_evals,
           res->sens.curves.token_evals, res->sens.curves.seconds, res->sens.seconds);
    long guard = res->robust ? res->robust->token_evals : 0;
    printf("             total %ld token evals: + eviction block %ld, held-out %ld, KV-type "
           "uniforms %ld, guard %ld\n",
           res->total_token_evals + guard, res->ladder_token_evals, res->heldout_token_evals,
           res->type_token_evals, guard);
}

/* The per-text table and, on stderr, the guard's decision when it did not keep the plan. */
static void print_texts(const kv_robust_result *r) {
    int N = r->n_texts, k = r->chosen;
    printf("texts        %-28s %-6s %-10s %-10s %-10s %-10s\n", "(perplexity)", "part", "full",
           "uniform", "the plan", "plan/unif");
    for (int i = 0; i < N * 2; i++) {
        if (!r->chunks[i]) continue;
        const char *nm = r->names[i / 2], *sl = strrchr(nm, '/');
        printf("             %-28.28s %-6s %-10.4f %-10.4f %-10.4f %-10.4f\n", sl ? sl + 1 : nm,
               i % 2 ? "held" : "calib", r->full[i], r->uniform[i], r->plan[i],
               r->plan[i] / r->uniform[i]);
    }
    printf("guard        objective %s, decision %s (lambda %.2f)\n",
           kv_robust_objective_name(r->obj), kv_robust_decision(r), r->lambda[k]);
    int checked = 0, dropped = 0;
    for (int c = 0; c < r->n_cand; c++) {
        checked += r->transfer[c] >= 0;
        dropped += r->transfer[c] == 0;
    }
    if (checked)
        printf("transfer     %d of %d knapsack candidates fitted on every text dropped: a text's "
               "own knapsack at their lambda lost on another text (leave one text out)\n",
               dropped, checked);
    if (k != 0)
        fprintf(stderr, "kvplan search: guard: %s; %s\n",
                r->reason[0] ? r->reason
                             : "another candidate scores better on the --text-objective",
                r->source[k] < 0 ? "falling back to the uniform cache it was compared with"
                                 : "shipping the plan's blend towards uniform named in "
                                   "/search/texts@decision");
}

static void print_retrieval(const kv_retrieval_result *r) {
    printf("retrieval    %-10s %-10s %-10s %-10s %-10s (%d probes, tolerance %.0f points)\n", "",
           "full", "uniform", "ppl plan", "the plan", r->full.n, 100 * r->tolerance);
    printf("             %-10s %-10.1f %-10.1f %-10.1f %-10.1f\n", "accuracy %",
           100 * r->full.accuracy, 100 * r->uniform.accuracy, 100 * r->guard.accuracy,
           100 * r->plan.accuracy);
    printf("             %-10s %-10.4f %-10.4f %-10.4f %-10.4f\n", "answer NLL", r->full.nll,
           r->uniform.nll, r->guard.nll, r->plan.nll);
    printf("             %-10s %-10.4f %-10.4f %-10.4f %-10.4f\n", "search ppl", r->full_ppl,
           r->uniform_ppl, r->guard_ppl, r->plan_ppl);
    printf("             decision: %s\n", r->decision);
}

static void print_result(const search_args *s, const search_job *j, const kv_alloc_params *ap,
                         const kv_search_opts *so, const kv_search_result *res) {
    const kv_model *m = j->m;
    printf("plan         %s\nallocation   %s", s->a.out,
           res->winner_sens ? "sensitivity" : kv_alloc_name(ap->kind));
    if (res->winner_sens)
        printf(" (round %d of %d%s)", res->sens.best_round + 1, res->sens.rounds,
               mixed_policies(res->policy, m->cfg.n_layers * m->cfg.n_kv_heads, j->policy)
                   ? ", mixed policies"
                   : "");
    else if (ap->kind == KV_ALLOC_BAKLAVA)
        printf(" (t %.3g, r %.3g, p %.3g)", res->best_t, res->best_r, res->best_p);
    else if (ap->kind == KV_ALLOC_SQUEEZE)
        printf(" (p %.3g)", res->best_p);
    if (res->winner_type_uniform >= 0 && res->kv_types)
        printf(" in %s -- the uniform %s cache at the same bytes beat the other plans on the "
               "search tokens",
               kv_type_name((kv_cache_type)res->winner_type_uniform),
               kv_type_name((kv_cache_type)res->winner_type_uniform));
    else if (!res->winner_sens && ap->kind != so->allocation)
        printf(" -- the %s baseline beat the %s grid's best on the search tokens",
               kv_alloc_name(ap->kind), kv_alloc_name(so->allocation));
    printf("\nratio        %.4g of the full F16 cache (%s: %.4g of the tokens), policy %s, C %d, "
           "b_s %d, p %d\n",
           s->a.b.ratio, kv_type_name(ap->kv_type), ap->ratio, kv_policy_name(j->policy),
           ap->context, ap->block_size, res->evict_block);
    if (res->n_ladder > 1) {
        printf("evict block ");
        for (int i = 0; i < res->n_ladder; i++)
            printf(" p %d: %.4f/%.4f", res->ladder_p[i], res->ladder_plan_ppl[i],
                   res->ladder_uniform_ppl[i]);
        printf(" (search ppl plan/uniform)\n");
    }
    printf("search       %s over %d points (%d distinct budgets), %d chunks x %d tokens\n",
           so->halving_eta >= 2 ? "successive halving" : "exhaustive",
           res->n_p * res->n_t * res->n_r, res->distinct_budgets, res->search_chunks, ap->context);
    printf("token evals  %ld (exhaustive: %ld, ratio %.3f), %.1f s\n", res->token_evals,
           res->token_evals_exhaustive,
           (double)res->token_evals /
               (double)(res->token_evals_exhaustive ? res->token_evals_exhaustive : 1),
           res->seconds);
    print_perplexities(res);
    if (res->kv_types) { /* the plan's heads per KV type (the knapsack's choice) */
        int count[KV_CACHE_TYPES] = {0};
        for (int h = 0; h < m->cfg.n_layers * m->cfg.n_kv_heads; h++) count[res->kv_types[h]]++;
        printf("plan types  ");
        for (int t = 0; t < KV_CACHE_TYPES; t++)
            if (count[t]) printf(" %s %d", kv_type_name((kv_cache_type)t), count[t]);
        printf(" heads\n");
    }
    if (so->kv_types_mask) {
        printf(
            "KV types     uniform at the plan's bytes, search / held-out ppl (tokens per head):");
        for (int t = 0; t < KV_CACHE_TYPES; t++)
            if (so->kv_types_mask & (1 << t))
                printf(" %s %.4f / %.4f (%.0f)", kv_type_name((kv_cache_type)t), res->type_ppl[t],
                       res->type_heldout[t], res->type_tokens[t]);
        printf("\n");
    }
    if (res->robust) print_texts(res->robust);
    if (res->retrieval) print_retrieval(res->retrieval);
    if (res->identical_to_uniform)
        fprintf(stderr,
                "kvplan search: note: the plan is identical to the uniform plan (every head "
                "%d tokens): no allocation beat it on the search tokens%s\n",
                res->tokens[0],
                ap->block_size > 1 ? "; a smaller --block-size/--evict-block leaves more room"
                                   : "");
    if (res->best_chunks < res->search_chunks)
        printf("note         the winner's search perplexity uses %d of %d chunks\n",
               res->best_chunks, res->search_chunks);
}

/* Rank 0's plan file: the winner's parameters (ap, from kv_search_plan) and budgets with the
 * search's record. */
static int write_plan(const search_args *s, const search_job *j, const kv_alloc_params *ap,
                      const kv_search_opts *so, const kv_search_result *res, int argc, char **argv,
                      kv_error *err) {
    char cmd[4096] = "kvplan ";
    kv_cli_command_line(argc, argv, cmd + 7, sizeof cmd - 7);
    return kv_plan_file_write(s->a.out, cmd, s->a.profile, j->m, ap, j->policy, res->evict_block,
                              res->tokens, so, res, err);
}

/* --estimate: the job as the search would run it, counted and timed, nothing searched. */
static int run_estimate(search_args *s) {
    kv_error err = {0};
    search_job j;
    memset(&j, 0, sizeof j);
    kv_search_opts so;
    kv_progress prog;
    kv_progress_init(&prog, 1);
    s->a.no_output = 1;
    int rc = s->shape ? shape_job(s, &j, &err) : build_job(s, &j, &err);
    if (!rc) rc = fill_opts(s, &j, &prog, &so, &err);
    if (!rc) {
        kv_cli_estimate e = {.m = j.m,
                             .model_name = s->shape ? s->shape : s->a.model,
                             .prof = j.have_prof ? &j.prof : NULL,
                             .profile_path = s->a.profile,
                             .so = &so,
                             .n_texts = j.n_texts,
                             .S = j.S,
                             .HC = j.HC,
                             .ids = j.ids,
                             .probes = s->retrieval ? &j.probes : NULL,
                             .ro = &j.ro,
                             .have_heads = j.ro.heads != NULL,
                             .preset = s->device_preset,
                             .json = s->json};
        rc = kv_cli_search_estimate(&e, &err);
    }
    job_free(&j);
    return rc ? kv_cli_report("search", &err) : 0;
}

int kv_cmd_search(int argc, char **argv) {
    search_args s = {0};
    int code = kv_cli_parse(&kv_spec_search, argc, argv, &s);
    if (code >= 0) return code;
    if (s.shape && !s.estimate) {
        fprintf(stderr, "kvplan search: --shape describes a model for --estimate only; add "
                        "--estimate\n");
        return 1;
    }
    if (s.estimate && (s.shape || s.texts.n || s.text_list)) return run_estimate(&s);
    if (!s.texts.n && !s.text_list) {
        fprintf(stderr, "kvplan search: --text T (or --text-list FILE) is required\n");
        kv_cli_help(&kv_spec_search, stderr);
        return 1;
    }
    /* build: tasks (MPI ranks when started by mpirun / srun), inputs, options, task log */
    kv_error err = {0};
    kv_tasks *tasks = NULL;
    if (kv_tasks_init(NULL, NULL, &tasks, &err)) return kv_cli_report("search", &err);
    const int rank = kv_tasks_rank(tasks);
    search_job j;
    memset(&j, 0, sizeof j);
    kv_search_result res;
    memset(&res, 0, sizeof res);
    kv_robust_result rob;
    memset(&rob, 0, sizeof rob);
    kv_retrieval_result rr;
    memset(&rr, 0, sizeof rr);
    kv_progress prog;
    kv_progress_init(&prog, s.a.quiet || rank != 0); /* progress from rank 0 only */
    kv_search_opts so;
    char log_path[PATH_MAX + 64];
    double t_in = kv_now(), cpu_in = kv_cpu_now();
    int rc = build_job(&s, &j, &err);
    if (!rc) rc = fill_opts(&s, &j, &prog, &so, &err);
    t_in = kv_now() - t_in, cpu_in = kv_cpu_now() - cpu_in;
    if (!rc) rc = open_task_log(tasks, &s, &j, argc, argv, log_path, sizeof log_path, &err);
    /* run: the search, its chunk evaluations shared among the ranks */
    rc = kv_tasks_agree(tasks, rc, &err); /* no rank enters the search alone */
    kv_alloc_params ap = j.ap;
    if (!rc) {
        so.tasks = tasks;
        /* the search, the guard over the texts and the retrieval stage (--retrieval) */
        kv_robust_layout lay = {j.n_texts, j.text_names, j.text_tokens, j.S, j.HC, j.chunk_text};
        rc = kv_search_plan(j.m, j.have_prof ? &j.prof : NULL, j.ids, j.n_ids, &lay,
                            j.text_objective, &so, s.retrieval ? &j.probes : NULL, &j.ro, &res,
                            &rob, &rr, &ap, &err);
        res.stage_wall[KV_SEARCH_ST_INPUTS] = t_in, res.stage_cpu[KV_SEARCH_ST_INPUTS] = cpu_in;
        if (!rc && rank == 0 && !s.a.quiet && kv_tasks_resumed(tasks) > 0)
            fprintf(stderr, "search: %ld chunk evaluations taken from %s\n",
                    kv_tasks_resumed(tasks), log_path);
    }
    /* report: only rank 0 writes files and prints */
    if (!rc && rank == 0) rc = write_plan(&s, &j, &ap, &so, &res, argc, argv, &err);
    if (!rc && rank == 0) kv_tasks_log_close(tasks, 1); /* a finished run leaves no log */
    if (!rc && rank == 0) print_result(&s, &j, &ap, &so, &res);
    kv_search_result_free(&res);
    kv_robust_result_free(&rob);
    kv_retrieval_result_free(&rr);
    job_free(&j);
    return kv_cli_finish_tasks("search", tasks, rc, &err);
}
