/* kvplan profile: head/layer similarity, prompt consistency and hardware speeds -> profile.h5 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/h5io.h"
#include "kvplan/profiler.h"
#include "kvplan/retrieval.h"
#include "kvplan/tasks.h"
#include "kvplan/tokenizer.h"

typedef struct profile_args {
    const char *model, *tokenizer, *out, *device, *retrieval;
    kv_opt_strs texts; /* --text, once or more */
    long n_prompts, prompt_len, seed, retrieval_window;
    int no_hw, quick_hw, quiet, induction;
    kv_budget_args kv; /* only --kv-type (KV_BUDGET_OPTS_TYPE) */
    kv_threads_args threads;
} profile_args;

static const kv_opt profile_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(profile_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(profile_args, tokenizer), "TOK",
     .help = "tokenizer file (default: the model's)"},
    {"--text", NULL, KV_OPT_STRS, offsetof(profile_args, texts), "FILE",
     .help = "text the prompts are picked from (default "
             "../shared/text/tinystories_val_head.txt); given more than once, the prompts are "
             "shared evenly among the texts (the first texts get one more when they do not "
             "divide)"},
    {"--prompts", NULL, KV_OPT_INT, offsetof(profile_args, n_prompts), "N", 1, 100000, .def = "8",
     .help = "prompts"},
    {"--prompt-len", NULL, KV_OPT_INT, offsetof(profile_args, prompt_len), "T", 2, 1 << 22,
     .def = "256", .help = "tokens per prompt (at most the model's context)"},
    {"--seed", NULL, KV_OPT_INT, offsetof(profile_args, seed), "S", 0, 9.3e18, .def = "0",
     .help = "seed of the prompt picking"},
    {"--retrieval", NULL, KV_OPT_STR, offsetof(profile_args, retrieval), "FILE",
     .help = "retrieval probes (TSV: prompt, tab, answer; docs/retrieval.md): records "
             "/heads/retrieval, the rise of the probes' answer NLL when each KV head alone "
             "keeps a sink + recent window (the search's retrieval stage reads it)"},
    {"--retrieval-window", NULL, KV_OPT_INT, offsetof(profile_args, retrieval_window), "W", 1,
     1 << 22, .help = "tokens the cut head keeps (default: C / 8)"},
    {"--induction", NULL, KV_OPT_FLAG, offsetof(profile_args, induction),
     .help = "also record /heads/induction: the same cost on copies of random tokens (BOS + R "
             "+ R, the last 8 tokens of the second copy scored), a proxy that needs no probe "
             "file"},
    {"--no-hw", NULL, KV_OPT_FLAG, offsetof(profile_args, no_hw),
     .help = "skip the hardware measurements"},
    {"--quick-hw", NULL, KV_OPT_FLAG, offsetof(profile_args, quick_hw),
     .help = "measure small sizes only"},
    {"--device", NULL, KV_OPT_STR, offsetof(profile_args, device), "D",
     .help = "auto (default), cpu or cuda: where the prompts run"},
    {"-o", "--output", KV_OPT_STR, offsetof(profile_args, out), "profile.h5", .def = "profile.h5",
     .help = "output file (written atomically)"},
    {"--quiet", NULL, KV_OPT_FLAG, offsetof(profile_args, quiet), .help = "no progress on stderr"},
};

const kv_cli_spec kv_spec_profile = {
    "profile",
    "usage: kvplan profile MODEL [--tokenizer TOK] [--text FILE] [--prompts N]\n"
    "                      [--prompt-len T] [--seed S] [--no-hw] [--quick-hw] [--quiet]\n"
    "                      [--device auto|cpu|cuda] [--kv-type T] [-o profile.h5]\n",
    "Runs N prompts of T tokens (picked deterministically from FILE) through the full-cache\n"
    "forward pass and records per-head cos(V, softmax(QK^T)V) (BaKlaVa Alg. 1), layer\n"
    "similarity (SqueezeAttention), Kendall tau / Spearman rho between prompts, and host (and\n"
    "CUDA) copy and GEMM speeds.\n",
    "Under `mpirun -np N` or `srun` the prompts are shared among the ranks (rank 0\n"
    "probes the hardware and writes the file, identical to a one-process run's).\n",
    {{NULL, profile_opts, sizeof profile_opts / sizeof profile_opts[0], 0},
     {"KV cache", kv_budget_opts, KV_BUDGET_OPTS_TYPE, offsetof(profile_args, kv)},
     {"threads", kv_threads_opts, KV_THREADS_OPTS_N, offsetof(profile_args, threads)}},
};

/* What a profile run needs, built by every rank: the model and the prompts [P * T] picked
 * from the text. */
typedef struct profile_job {
    kv_model *m;
    int *prompts;
} profile_job;

/* The prompts of text t (count of them, at dst): tokenized, then picked. */
static int pick_from_text(const profile_args *a, kv_tokenizer *tok, const char *path, int count,
                          int *dst, kv_error *err) {
    char *text = NULL;
    size_t len = 0;
    int *stream = NULL, n = 0;
    int rc = kv_read_file(path, &text, &len, err);
    if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &stream, &n, err);
    if (!rc) {
        rc = kv_profile_pick_prompts(stream, n,
                                     kv_tokenizer_bos(tok) >= 0 ? kv_tokenizer_bos(tok) : stream[0],
                                     count, (int)a->prompt_len, (uint64_t)a->seed, dst, err);
    }
    if (rc) kv_fail_context(err, "%s", path);
    free(stream);
    free(text);
    return rc;
}

static int build_job(const profile_args *a, profile_job *j, kv_error *err) {
    kv_tokenizer *tok = NULL;
    const char *inputs[3 + KV_OPT_MAX_STRS] = {a->model, a->tokenizer, a->retrieval};
    for (int t = 0; t < a->texts.n; t++) inputs[3 + t] = a->texts.v[t];
    int rc = kv_check_output(a->out, "-o", inputs, 3 + a->texts.n, err);
    if (!rc && a->retrieval) rc = kv_check_regular(a->retrieval, "probe file", err);
    for (int t = 0; t < a->texts.n && !rc; t++) rc = kv_check_regular(a->texts.v[t], "text", err);
    if (!rc && a->texts.n > a->n_prompts)
        rc = kv_fail(err, KV_EINPUT, "%d texts need at least as many --prompts (got %ld)",
                     a->texts.n, a->n_prompts);
    if (!rc && a->tokenizer) rc = kv_check_regular(a->tokenizer, "tokenizer", err);
    if (!rc) rc = kv_cli_load_model(a->model, &j->m, err);
    if (!rc) rc = kv_cli_blas_ready(err);
    if (!rc && a->prompt_len > j->m->cfg.seq_len)
        rc = kv_fail(err, KV_EINPUT,
                     "--prompt-len %ld exceeds the context length %d of %s; choose T <= %d",
                     a->prompt_len, j->m->cfg.seq_len, a->model, j->m->cfg.seq_len);
    if (!rc) rc = kv_tokenizer_load(a->tokenizer, j->m, &tok, err);
    if (!rc) {
        j->prompts = malloc((size_t)a->n_prompts * (size_t)a->prompt_len * sizeof *j->prompts);
        if (!j->prompts) rc = kv_fail(err, KV_EINTERNAL, "out of memory");
    }
    /* text t gives prompts [first, first + count): the texts in order, evenly shared */
    long first = 0;
    for (int t = 0; t < a->texts.n && !rc; t++) {
        int count = (int)(a->n_prompts / a->texts.n + (t < a->n_prompts % a->texts.n));
        rc = pick_from_text(a, tok, a->texts.v[t], count, j->prompts + first * a->prompt_len, err);
        first += count;
    }
    kv_tokenizer_free(tok);
    return rc;
}

/* Rank 0's file: provenance, the profile and (unless --no-hw) the hardware fits. */
static int write_profile(const profile_args *a, const char *cmd, const kv_model *m,
                         const kv_profile *pr, const kv_retrieval_heads *rh,
                         const kv_retrieval_heads *ind, kv_progress *prog, kv_error *err) {
    kv_h5 *f = NULL;
    int rc = kv_h5_create(a->out, &f, err);
    if (!rc) rc = kv_h5_write_provenance(f, cmd, m, err);
    if (!rc) rc = kv_h5_attr_str(f, "/", "file_kind", "profile", err);
    /* the text's path; several texts joined by '\n' */
    size_t tl = 1;
    for (int t = 0; t < a->texts.n; t++) tl += strlen(a->texts.v[t]) + 1;
    char *texts = rc ? NULL : kv_malloc(tl, "text names", err);
    if (!rc && !texts) rc = KV_EINTERNAL;
    if (!rc) {
        texts[0] = '\0';
        for (int t = 0; t < a->texts.n; t++) {
            if (t) strcat(texts, "\n");
            strcat(texts, a->texts.v[t]);
        }
        rc = kv_h5_attr_str(f, "/", "text", texts, err);
    }
    free(texts);
    if (!rc) rc = kv_h5_attr_i64(f, "/", "seed", a->seed, err);
    if (!rc) rc = kv_profile_write(f, pr, err);
    if (!rc && rh->nll_rise) rc = kv_retrieval_heads_write(f, rh, err);
    if (!rc && ind->nll_rise) rc = kv_retrieval_induction_write(f, ind, err);
    if (!rc && !a->no_hw) {
        kv_hw_opts ho;
        kv_hw_opts_default(&ho, a->quick_hw);
        rc = kv_hw_probe_and_write(f, &m->cfg, &ho, prog, err);
        kv_progress_done(prog);
    }
    if (!rc) return kv_h5_commit(f, err);
    if (f) kv_h5_abort(f);
    return rc;
}

/* --retrieval / --induction: every KV head's retrieval cost on the full cache, on the probe
 * file and on copies of random tokens (rank 0). */
static int measure_retrieval(const profile_args *a, const kv_model *m, kv_device device,
                             kv_cache_type kv_type, kv_progress *prog, kv_retrieval_heads *rh,
                             kv_retrieval_heads *ind, kv_error *err) {
    const int C = m->cfg.seq_len;
    kv_tokenizer *tok = NULL;
    kv_probes probes = {0};
    kv_plan full = {0};
    kv_engine *e = NULL;
    int rc = kv_plan_full(&m->cfg, C, KV_DEFAULT_BLOCK_SIZE, KV_DEFAULT_EVICT_BLOCK, KV_POLICY_SINK,
                          &full, err);
    if (!rc) {
        kv_plan_set_kv_type(&full, kv_type);
        kv_engine_opts eo = {
            .device = device, .max_seqs = 1, .n_threads = kv_threads_args_count(&a->threads)};
        rc = kv_engine_new(m, &full, &eo, &e, err);
    }
    int w = a->retrieval_window ? (int)a->retrieval_window : C / 8;
    if (!rc && a->retrieval) {
        rc = kv_tokenizer_load(a->tokenizer, m, &tok, err);
        if (!rc) rc = kv_probes_read(a->retrieval, tok, C, &probes, err);
        if (!rc) rc = kv_retrieval_heads_measure(e, m, &probes, 0, w, prog, rh, err);
        kv_probes_free(&probes);
        kv_progress_done(prog);
    }
    if (!rc && a->induction) {
        int len = (C - 1) / 2 < 100 ? (C - 1) / 2 : 100;
        rc = kv_probes_copy(32, len, 8, m->cfg.vocab_size, (uint64_t)a->seed + 1, &probes, err);
        if (!rc) rc = kv_retrieval_heads_measure(e, m, &probes, 0, w, prog, ind, err);
        kv_probes_free(&probes);
        kv_progress_done(prog);
    }
    kv_engine_free(e);
    kv_plan_free(&full);
    kv_tokenizer_free(tok);
    return rc;
}

static void print_summary(const profile_args *a, const kv_profile *pr) {
    fprintf(stderr, "kvplan profile: wrote %s (%ld prompts x %ld tokens, %.0f tokens/s)\n", a->out,
            a->n_prompts, a->prompt_len, pr->tokens_per_s);
    int L = pr->L, K = pr->H_kv, best = 0, worst = 0;
    for (int i = 1; i < L * K; i++) {
        if (pr->importance[i] > pr->importance[best]) best = i;
        if (pr->importance[i] < pr->importance[worst]) worst = i;
    }
    double tau = 0;
    int cnt = 0;
    for (int x = 0; x < pr->P; x++)
        for (int y = x + 1; y < pr->P; y++, cnt++) tau += pr->kendall_tau[x * pr->P + y];
    fprintf(stderr,
            "kvplan profile: most important KV head: layer %d head %d (%.4f); least: layer %d "
            "head %d (%.4f); mean Kendall tau between prompts %.3f\n",
            best / K, best % K, pr->importance[best], worst / K, worst % K, pr->importance[worst],
            cnt ? tau / cnt : 1.0);
}

int kv_cmd_profile(int argc, char **argv) {
    profile_args a = {0};
    int code = kv_cli_parse(&kv_spec_profile, argc, argv, &a);
    if (code >= 0) return code;
    if (!a.model) {
        fprintf(stderr, "kvplan profile: MODEL is required\n");
        kv_cli_help(&kv_spec_profile, stderr);
        return 1;
    }
    char default_text[4200], cmdline[8192], full_cmd[8300];
    snprintf(default_text, sizeof default_text, "%s/text/tinystories_val_head.txt",
             kv_shared_dir());
    if (!a.texts.n) a.texts.v[a.texts.n++] = default_text;
    kv_cli_command_line(argc, argv, cmdline, sizeof cmdline);
    snprintf(full_cmd, sizeof full_cmd, "kvplan %s", cmdline);
    /* build: tasks (MPI ranks when started by mpirun / srun), model, prompts */
    kv_error err = {0};
    kv_tasks *tasks = NULL;
    if (kv_tasks_init(NULL, NULL, &tasks, &err)) return kv_cli_report("profile", &err);
    const int rank = kv_tasks_rank(tasks);
    kv_progress prog;
    kv_progress_init(&prog, a.quiet || rank != 0); /* progress from rank 0 only */
    profile_job job = {0};
    kv_profile pr = {0};
    kv_device device = KV_DEVICE_AUTO;
    int rc = build_job(&a, &job, &err);
    if (!rc) rc = kv_cli_device(a.device, &device, &err);
    kv_cache_type kv_type = KV_TYPE_DEFAULT;
    if (!rc) rc = kv_budget_args_type(&a.kv, &kv_type, &err);
    /* run: the prompts, shared among the ranks */
    rc = kv_tasks_agree(tasks, rc, &err); /* no rank enters the prompts alone */
    if (!rc)
        rc = kv_profile_run_tasks(job.m, job.prompts, (int)a.n_prompts, (int)a.prompt_len, device,
                                  kv_threads_args_count(&a.threads), kv_type, tasks, &pr, &prog,
                                  &err);
    kv_progress_done(&prog);
    /* report: only rank 0 measures the retrieval heads, writes the file and probes the
     * hardware (the others wait, idle) */
    kv_retrieval_heads rh, ind;
    memset(&rh, 0, sizeof rh);
    memset(&ind, 0, sizeof ind);
    if (!rc && rank == 0 && (a.retrieval || a.induction))
        rc = measure_retrieval(&a, job.m, device, kv_type, &prog, &rh, &ind, &err);
    if (!rc && rank == 0) rc = write_profile(&a, full_cmd, job.m, &pr, &rh, &ind, &prog, &err);
    kv_retrieval_heads_free(&rh);
    kv_retrieval_heads_free(&ind);
    if (!rc && !a.quiet && rank == 0) print_summary(&a, &pr);
    kv_profile_free(&pr);
    free(job.prompts);
    kv_model_free(job.m);
    return kv_cli_finish_tasks("profile", tasks, rc, &err);
}
