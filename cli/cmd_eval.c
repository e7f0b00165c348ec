/* kvplan eval: perplexity of a text under the full or a budgeted KV cache. */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/eval.h"
#include "kvplan/retrieval.h"

typedef struct eval_args {
    const char *model, *tokenizer, *text, *tokens, *retrieval;
    long context, max_tokens;
    int json, quiet;
    kv_budget_args budget;
    kv_threads_args threads;
} eval_args;

static const kv_opt eval_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(eval_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory"},
    {"--text", NULL, KV_OPT_STR, offsetof(eval_args, text), "FILE",
     .help = "the text, tokenized once with BOS first"},
    {"--tokens", NULL, KV_OPT_STR, offsetof(eval_args, tokens), "FILE",
     .help = "whitespace-separated token ids instead of a text"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(eval_args, tokenizer), "TOK",
     .help = "tokenizer file (default: the model's)"},
    {"--context", NULL, KV_OPT_INT, offsetof(eval_args, context), "C", 2, 1 << 22,
     .help = "tokens per chunk (default: the model's context)"},
    {"--max-tokens", NULL, KV_OPT_INT, offsetof(eval_args, max_tokens), "N", 2, 1099511627776.0,
     .help = "use only the first N tokens (default: all)"},
    {"--retrieval", NULL, KV_OPT_STR, offsetof(eval_args, retrieval), "FILE",
     .help = "retrieval probes (TSV: prompt, tab, answer; docs/retrieval.md): prints the share "
             "whose greedy continuation starts with the answer and the answer's mean NLL; "
             "alone or with --text / --tokens"},
    {"--json", NULL, KV_OPT_FLAG, offsetof(eval_args, json),
     .help = "one JSON object on the last line"},
    {"--quiet", NULL, KV_OPT_FLAG, offsetof(eval_args, quiet), .help = "no progress on stderr"},
};

const kv_cli_spec kv_spec_eval = {
    "eval",
    "usage: kvplan eval MODEL (--text FILE | --tokens FILE | --retrieval FILE) [--tokenizer TOK]\n"
    "                   [--context C] [--max-tokens N] [--json] [--quiet] [budget options]\n",
    "Perplexity: the text is tokenized once (BOS first) or read as whitespace-separated\n"
    "ids, cut into consecutive chunks of C tokens (default: the model's context), a\n"
    "final partial chunk is dropped, and the C - 1 next-token predictions of each chunk\n"
    "are scored with a fresh cache per chunk.\n",
    NULL,
    {{NULL, eval_opts, sizeof eval_opts / sizeof eval_opts[0], 0},
     {"KV budget options (default: the full cache)", kv_budget_opts, KV_BUDGET_OPTS_ALL,
      offsetof(eval_args, budget)},
     {"threads", kv_threads_opts, KV_THREADS_OPTS_N, offsetof(eval_args, threads)}},
};

/* Whitespace-separated token ids; caller frees *ids. */
static int read_ids(const char *path, int **ids, long *n, kv_error *err) {
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(path, &data, &len, err);
    if (rc) return rc;
    long cap = 1024, cnt = 0;
    int *v = malloc((size_t)cap * sizeof *v);
    char *p = data;
    while (v && !rc) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 0x7fffffff) {
            rc = kv_fail(err, KV_EINPUT, "%s: '%.20s' is not a token id (non-negative integer)",
                         path, p);
            break;
        }
        if (cnt == cap) {
            int *nv = realloc(v, (size_t)cap * 2 * sizeof *nv);
            if (!nv) {
                rc = kv_fail(err, KV_EINTERNAL, "%s: out of memory after %ld token ids", path, cnt);
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (int)x;
        p = end;
    }
    free(data);
    if (!v) return kv_fail(err, KV_EINTERNAL, "%s: out of memory", path);
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v;
    *n = cnt;
    return KV_OK;
}

/* The token ids to score: the text tokenized (BOS first; *tok loaded for it) or the ids
 * file; at most max_tokens of them when that is set. */
static int load_ids(const eval_args *a, const kv_model *m, kv_tokenizer **tok, int **ids, long *n,
                    kv_error *err) {
    int rc;
    if (a->tokens) {
        rc = read_ids(a->tokens, ids, n, err);
    } else {
        char *text = NULL;
        size_t len = 0;
        int ni = 0;
        rc = kv_tokenizer_load(a->tokenizer, m, tok, err);
        if (!rc) rc = kv_read_file(a->text, &text, &len, err);
        if (!rc) rc = kv_tokenizer_encode(*tok, text, len, 1, ids, &ni, err);
        *n = ni;
        free(text);
    }
    if (!rc && a->max_tokens && a->max_tokens < *n) *n = a->max_tokens;
    return rc;
}

static void print_result(const kv_model *m, const kv_plan *plan, const kv_engine *eng, int C,
                         const kv_eval_result *res, const kv_probe_score *ps, int json) {
    int budgeted = !plan->full;
    printf("model        %s (%s, %d layers, %d heads, %d KV heads)\n", m->path, m->format,
           m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads);
    printf("cache        %s", budgeted ? "budgeted" : "full");
    if (budgeted)
        printf(" (ratio %.4g, policy %s%s, p %d, b_s %d)", plan->ratio,
               kv_policy_name(plan->policy), kv_plan_mixed_policies(plan) ? " and per-head" : "",
               plan->evict_block, plan->block_size);
    printf(", device %s\n", kv_device_name(kv_engine_device(eng)));
    if (res)
        printf("perplexity   %.6f\nnll          %.6f nats/token\ntokens       %ld scored "
               "in %d chunks of %d\nspeed        %.0f tokens/s\nkv bytes     %zu peak / %zu full "
               "(%.4f)\n",
               res->perplexity, res->nll, res->tokens_scored, res->chunks, C, res->tokens_per_s,
               res->kv_bytes_peak, res->kv_bytes_full,
               (double)res->kv_bytes_peak / (double)res->kv_bytes_full);
    if (ps)
        printf("retrieval    accuracy %.2f%% (%d of %d probes), answer NLL %.4f nats/token\n",
               100 * ps->accuracy, ps->hits, ps->n, ps->nll);
    if (!json) return;
    cJSON *j = cJSON_CreateObject();
    if (res) {
        cJSON_AddNumberToObject(j, "perplexity", res->perplexity);
        cJSON_AddNumberToObject(j, "nll", res->nll);
        cJSON_AddNumberToObject(j, "tokens_scored", (double)res->tokens_scored);
        cJSON_AddNumberToObject(j, "chunks", res->chunks);
        cJSON_AddNumberToObject(j, "tokens_per_s", res->tokens_per_s);
        cJSON_AddNumberToObject(j, "kv_bytes_peak", (double)res->kv_bytes_peak);
        cJSON_AddNumberToObject(j, "kv_bytes_full", (double)res->kv_bytes_full);
    }
    if (ps) {
        cJSON_AddNumberToObject(j, "retrieval_accuracy", ps->accuracy);
        cJSON_AddNumberToObject(j, "retrieval_nll", ps->nll);
        cJSON_AddNumberToObject(j, "retrieval_hits", ps->hits);
        cJSON_AddNumberToObject(j, "retrieval_probes", ps->n);
    }
    cJSON_AddNumberToObject(j, "context", C);
    cJSON_AddNumberToObject(j, "ratio", plan->ratio);
    cJSON_AddStringToObject(j, "policy", budgeted ? kv_policy_name(plan->policy) : "full");
    cJSON_AddStringToObject(j, "device", kv_device_name(kv_engine_device(eng)));
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

/* The probes of --retrieval, tokenized with the --tokenizer or the model's. */
static int load_probes(const eval_args *a, const kv_model *m, kv_tokenizer **tok, int C,
                       kv_probes *probes, kv_error *err) {
    int rc = KV_OK;
    if (!*tok) rc = kv_tokenizer_load(a->tokenizer, m, tok, err);
    if (!rc) rc = kv_probes_read(a->retrieval, *tok, C, probes, err);
    return rc;
}

int kv_cmd_eval(int argc, char **argv) {
    eval_args a = {0};
    int code = kv_cli_parse(&kv_spec_eval, argc, argv, &a);
    if (code >= 0) return code;
    if (!a.model || (a.text && a.tokens) || (!a.text && !a.tokens && !a.retrieval)) {
        fprintf(stderr, "kvplan eval: MODEL and one of --text / --tokens, or --retrieval, are "
                        "required\n");
        kv_cli_help(&kv_spec_eval, stderr);
        return 1;
    }
    if ((a.text && !*a.text) || (a.tokens && !*a.tokens)) {
        fprintf(stderr, "kvplan eval: %s needs a file name (it was given an empty one)\n",
                a.text ? "--text" : "--tokens");
        return 1;
    }
    /* build: model, token ids, probes, plan, engine */
    kv_error err = {0};
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int *ids = NULL;
    long n = 0;
    kv_plan plan = {0};
    kv_engine *eng = NULL;
    kv_probes probes = {0};
    kv_device device = KV_DEVICE_AUTO;
    int rc = kv_cli_load_model(a.model, &m, &err);
    if (!rc) rc = kv_cli_blas_ready(&err);
    if (!rc && (a.text || a.tokens)) rc = load_ids(&a, m, &tok, &ids, &n, &err);
    int C = m ? (a.context ? (int)a.context : m->cfg.seq_len) : 0;
    if (!rc && C > m->cfg.seq_len)
        rc = kv_fail(&err, KV_EINPUT, "--context %d exceeds the model's context %d", C,
                     m->cfg.seq_len);
    if (!rc && a.retrieval) rc = load_probes(&a, m, &tok, C, &probes, &err);
    if (!rc) rc = kv_budget_args_plan(&a.budget, m, C, &plan, &device, &err);
    if (!rc) kv_cli_plan_note("eval", &plan);
    if (!rc) {
        kv_engine_opts eo = {
            .device = device, .max_seqs = 1, .n_threads = kv_threads_args_count(&a.threads)};
        rc = kv_engine_new(m, &plan, &eo, &eng, &err);
    }
    /* run: budgeted perplexity over the chunks, then the probes */
    kv_eval_result res;
    kv_probe_score ps;
    kv_progress prog;
    kv_progress_init(&prog, a.quiet);
    if (!rc && ids) {
        rc = kv_eval_engine(eng, ids, n, 0, &prog, &res, &err);
        kv_progress_done(&prog);
    }
    if (!rc && a.retrieval) rc = kv_probes_eval(eng, m, &probes, 0, 0, NULL, NULL, NULL, &ps, &err);
    /* report */
    if (!rc) print_result(m, &plan, eng, C, ids ? &res : NULL, a.retrieval ? &ps : NULL, a.json);
    kv_engine_free(eng);
    kv_plan_free(&plan);
    kv_probes_free(&probes);
    free(ids);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("eval", &err) : 0;
}
