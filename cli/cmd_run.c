/* kvplan run: text generation, optionally batched and under per-head KV budgets. The
 * generation loop is the runtime's (kvplan/generate.h). */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/engine.h"
#include "kvplan/eval.h"
#include "kvplan/generate.h"

typedef struct run_args {
    const char *model, *tokenizer, *prompt, *prompts;
    long n_new, batch, seed;
    double temperature, top_p;
    int quiet;
    kv_budget_args budget;
    kv_threads_args threads;
} run_args;

static const kv_opt run_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(run_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(run_args, tokenizer), "TOK",
     .help = "tokenizer file (default: the model's)"},
    {"--prompt", NULL, KV_OPT_STR, offsetof(run_args, prompt), "TEXT", .def = "",
     .help = "the prompt (BOS first; empty: BOS alone)"},
    {"--prompts", NULL, KV_OPT_STR, offsetof(run_args, prompts), "FILE",
     .help = "one prompt per line"},
    {"-n", NULL, KV_OPT_INT, offsetof(run_args, n_new), "N", 0, 1 << 24, .def = "256",
     .help = "new tokens per sequence, capped by the context"},
    {"--temperature", NULL, KV_OPT_NUM, offsetof(run_args, temperature), "T", 0.0, 100.0,
     .def = "1", .help = "sampling temperature; 0 is greedy"},
    {"--top-p", NULL, KV_OPT_NUM, offsetof(run_args, top_p), "P", 0.0, 1.0, .def = "0.9",
     .help = "nucleus sampling threshold"},
    {"--seed", NULL, KV_OPT_INT, offsetof(run_args, seed), "S", 0, 9.3e18, .def = "0",
     .help = "sampling seed; sequence i uses S + i"},
    {"--batch", NULL, KV_OPT_INT, offsetof(run_args, batch), "B", 1, 4096,
     .help = "sequences decoded together, sharing one KV block pool (default: one per prompt); "
             "prompts are repeated to fill the batch"},
    {"--quiet", NULL, KV_OPT_FLAG, offsetof(run_args, quiet), .help = "no timing on stderr"},
};

const kv_cli_spec kv_spec_run = {
    "run",
    "usage: kvplan run MODEL [--tokenizer TOK] [--prompt TEXT | --prompts FILE]\n"
    "                  [-n N] [--temperature T] [--top-p P] [--seed S] [--batch B]\n"
    "                  [--quiet] [budget options]\n",
    "Generate up to N new tokens after each prompt. One sequence streams to stdout; a batch\n"
    "prints each sequence after it. Timing and KV bytes in use go to stderr.\n",
    NULL,
    {{NULL, run_opts, sizeof run_opts / sizeof run_opts[0], 0},
     {"KV budget options (default: the full cache)", kv_budget_opts, KV_BUDGET_OPTS_ALL,
      offsetof(run_args, budget)},
     {"threads", kv_threads_opts, KV_THREADS_OPTS_N, offsetof(run_args, threads)}},
};

static int read_prompts(const char *path, char ***out, int *n, kv_error *err) {
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(path, &data, &len, err);
    if (rc) return rc;
    int cnt = 0, cap = 16, oom = 0;
    char **v = malloc((size_t)cap * sizeof *v);
    oom = !v;
    for (char *line = strtok(data, "\n"); !oom && line; line = strtok(NULL, "\n")) {
        if (!*line) continue;
        if (cnt == cap) {
            char **nv = cap < INT_MAX / 2 ? realloc(v, (size_t)cap * 2 * sizeof *nv) : NULL;
            if (!nv) {
                oom = 1;
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[cnt] = strdup(line);
        if (!v[cnt]) {
            oom = 1;
            break;
        }
        cnt++;
    }
    free(data);
    if (oom || cnt == 0) {
        for (int i = 0; i < cnt; i++) free(v[i]);
        free(v);
        if (oom) return kv_fail(err, KV_EINTERNAL, "%s: out of memory after %d prompts", path, cnt);
        return kv_fail(err, KV_EINPUT, "%s: no prompts (one per line expected)", path);
    }
    *out = v;
    *n = cnt;
    return KV_OK;
}

/* Streaming output of a single sequence: each token's text as it comes. */
typedef struct stream_out {
    const kv_tokenizer *tok;
    int started;
} stream_out;

static void stream_token(void *user, int seq, int prev, int token) {
    stream_out *so = user;
    char piece[512];
    (void)seq;
    int k = kv_tokenizer_piece(so->tok, prev, token, piece, sizeof piece);
    fwrite(piece, 1, (size_t)k, stdout);
    fflush(stdout);
    so->started = 1;
}

/* A batch prints each sequence after generation; one sequence has streamed already. */
static int print_sequences(const kv_tokenizer *tok, const kv_gen_result *g, kv_error *err) {
    for (int s = 0; s < g->n_seqs; s++) {
        char *text = NULL;
        int rc = kv_tokenizer_decode(tok, g->seqs[s].ids, g->seqs[s].n, &text, err);
        if (rc) return rc;
        printf("--- sequence %d ---\n%s\n", s, text);
        free(text);
    }
    return KV_OK;
}

static void print_stats(const kv_engine *eng, const kv_plan *plan, const kv_gen_result *g, int C) {
    size_t full = (size_t)g->n_seqs * kv_engine_bytes_full(eng, C);
    double t1 = g->prefill_s > 0 ? g->prefill_s : 1e-9, t2 = g->decode_s > 0 ? g->decode_s : 1e-9;
    fprintf(stderr,
            "kvplan run: batch %d on %s, prefill %ld tokens in %.3f s (%.0f tokens/s), "
            "decode %ld tokens in %.3f s (%.1f tokens/s)\n"
            "kvplan run: KV cache %s: %zu bytes in use now, %zu peak (pool peak %zu), full "
            "cache at context %d would take %zu\n",
            g->n_seqs, kv_device_name(kv_engine_device(eng)), g->prefill_tokens, g->prefill_s,
            (double)g->prefill_tokens / t1, g->decoded, g->decode_s, (double)g->decoded / t2,
            plan->full ? "full" : kv_policy_name(plan->policy), kv_engine_bytes_in_use(eng),
            g->kv_peak, kv_engine_bytes_peak(eng), C, full);
}

int kv_cmd_run(int argc, char **argv) {
    run_args a = {0};
    int code = kv_cli_parse(&kv_spec_run, argc, argv, &a);
    if (code >= 0) return code;
    if (!a.model) {
        fprintf(stderr, "kvplan run: MODEL is required\n");
        kv_cli_help(&kv_spec_run, stderr);
        return 1;
    }
    /* build: model, tokenizer, prompts, plan, engine */
    kv_error err = {0};
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    char **prompts = NULL;
    int n_prompts = 0, B = 0;
    kv_plan plan = {0};
    kv_engine *eng = NULL;
    kv_device device = KV_DEVICE_AUTO;
    kv_gen_result g = {0};
    int rc = kv_cli_load_model(a.model, &m, &err);
    if (!rc) rc = kv_cli_blas_ready(&err);
    if (!rc) rc = kv_tokenizer_load(a.tokenizer, m, &tok, &err);
    if (!rc && a.prompts) rc = read_prompts(a.prompts, &prompts, &n_prompts, &err);
    int C = m ? m->cfg.seq_len : 0;
    if (!rc) rc = kv_budget_args_plan(&a.budget, m, C, &plan, &device, &err);
    if (!rc) kv_cli_plan_note("run", &plan);
    B = a.batch ? (int)a.batch : (n_prompts ? n_prompts : 1);
    if (!rc) {
        kv_engine_opts eo = {
            .device = device, .max_seqs = B, .n_threads = kv_threads_args_count(&a.threads)};
        rc = kv_engine_new(m, &plan, &eo, &eng, &err);
    }
    /* run: prefill and decode the batch (one sequence streams) */
    stream_out so = {tok, 0};
    const char *one[1] = {a.prompt};
    kv_gen_opts go = {.prompts = prompts ? (const char *const *)prompts : one,
                      .n_prompts = prompts ? n_prompts : 1,
                      .n_seqs = B,
                      .max_new = a.n_new,
                      .temperature = (float)a.temperature,
                      .top_p = (float)a.top_p,
                      .seed = (uint64_t)a.seed,
                      .on_token = B == 1 ? stream_token : NULL,
                      .user = &so};
    if (!rc) rc = kv_generate(eng, m, tok, &go, &g, &err);
    /* report: the generated text always ends its line, also when an error stopped it */
    if (so.started) {
        printf("\n");
        fflush(stdout);
    }
    if (!rc && B > 1) rc = print_sequences(tok, &g, &err);
    if (!rc && !a.quiet) print_stats(eng, &plan, &g, C);
    kv_gen_result_free(&g);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    kv_engine_free(eng);
    kv_plan_free(&plan);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("run", &err) : 0;
}
