/* kvplan eval: perplexity of a text under the full or a budgeted KV cache. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/eval.h"

static void help(FILE *f) {
    fprintf(
        f,
        "usage: kvplan eval MODEL (--text FILE | --tokens FILE) [--tokenizer TOK]\n"
        "                   [--context C] [--max-tokens N] [--json] [--quiet] [budget options]\n"
        "Perplexity: the text is tokenized once (BOS first) or read as whitespace-separated\n"
        "ids, cut into consecutive chunks of C tokens (default: the model's context), a\n"
        "final partial chunk is dropped, and the C - 1 next-token predictions of each chunk\n"
        "are scored with a fresh cache per chunk.\n%s"
        "--json prints one JSON object on the last line.\n",
        kv_budget_args_help);
}

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
            if (!nv) break;
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (int)x;
        p = end;
    }
    free(data);
    if (!v) return kv_fail(err, KV_EINTERNAL, "out of memory");
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v;
    *n = cnt;
    return KV_OK;
}

int kv_cmd_eval(int argc, char **argv) {
    kv_error err = {0};
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL, *ids_path = NULL;
    long context = 0, max_tokens = 0;
    int json = 0, quiet = 0;
    kv_budget_args ba = {0};
    const kv_cli_numopt nums[] = {{"--context", .lval = &context, .llo = 2, .lhi = 1 << 22},
                                  {"--max-tokens", .lval = &max_tokens, .llo = 2, .lhi = 1L << 40}};
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--quiet"))
            quiet = 1;
        else if ((r = kv_cli_opt(argc, argv, &i, "--tokenizer", &tok_path, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "--text", &text_path, &err)) ||
                 (r = kv_cli_opt(argc, argv, &i, "--tokens", &ids_path, &err))) {
            if (r < 0) return kv_cli_report("eval", &err);
        } else if ((r = kv_cli_num_table(argc, argv, &i, nums, sizeof nums / sizeof nums[0],
                                         &err))) {
            if (r < 0) return kv_cli_report("eval", &err);
        } else if ((r = kv_budget_args_take(&ba, argc, argv, &i, &err))) {
            if (r < 0) return kv_cli_report("eval", &err);
        } else if (kv_cli_take_model("eval", argv[i], &model_path)) {
            return 1;
        }
    }
    if (!model_path || (!text_path == !ids_path)) {
        fprintf(stderr, "kvplan eval: MODEL and exactly one of --text / --tokens are required\n");
        help(stderr);
        return 1;
    }
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int *ids = NULL;
    long n = 0;
    int rc = kv_cli_load_model(model_path, &m, &err);
    if (!rc && text_path) {
        char *text = NULL;
        size_t len = 0;
        int ni = 0;
        rc = kv_tokenizer_load(tok_path, m, &tok, &err);
        if (!rc) rc = kv_read_file(text_path, &text, &len, &err);
        if (!rc) rc = kv_tokenizer_encode(tok, text, len, 1, &ids, &ni, &err);
        n = ni;
        free(text);
    } else if (!rc) {
        rc = read_ids(ids_path, &ids, &n, &err);
    }
    kv_eval_result res;
    kv_progress prog;
    kv_progress_init(&prog, quiet);
    kv_plan plan = {0};
    kv_engine *eng = NULL;
    kv_device device = KV_DEVICE_AUTO;
    int C = m ? (context ? (int)context : m->cfg.seq_len) : 0;
    if (!rc && C > m->cfg.seq_len)
        rc = kv_fail(&err, KV_EINPUT, "--context %d exceeds the model's context %d", C,
                     m->cfg.seq_len);
    if (!rc) rc = kv_budget_args_plan(&ba, m, C, &plan, &device, &err);
    if (!rc) {
        kv_engine_opts eo = {.device = device, .max_seqs = 1};
        rc = kv_engine_new(m, &plan, &eo, &eng, &err);
    }
    if (!rc) {
        if (max_tokens && max_tokens < n) n = max_tokens;
        rc = kv_eval_engine(eng, ids, n, 0, &prog, &res, &err);
        kv_progress_done(&prog);
    }
    int budgeted = !plan.full;
    if (!rc) {
        printf("model        %s (%s, %d layers, %d heads, %d KV heads)\n", m->path, m->format,
               m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads);
        printf("cache        %s", budgeted ? "budgeted" : "full");
        if (budgeted)
            printf(" (ratio %.4g, policy %s%s, p %d, b_s %d)", plan.ratio,
                   kv_policy_name(plan.policy),
                   kv_plan_mixed_policies(&plan) ? " and per-head" : "", plan.evict_block,
                   plan.block_size);
        printf(", device %s", kv_device_name(kv_engine_device(eng)));
        printf("\nperplexity   %.6f\nnll          %.6f nats/token\ntokens       %ld scored "
               "in %d chunks of %d\nspeed        %.0f tokens/s\nkv bytes     %zu peak / %zu full "
               "(%.4f)\n",
               res.perplexity, res.nll, res.tokens_scored, res.chunks, C, res.tokens_per_s,
               res.kv_bytes_peak, res.kv_bytes_full,
               (double)res.kv_bytes_peak / (double)res.kv_bytes_full);
        if (json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "perplexity", res.perplexity);
            cJSON_AddNumberToObject(j, "nll", res.nll);
            cJSON_AddNumberToObject(j, "tokens_scored", (double)res.tokens_scored);
            cJSON_AddNumberToObject(j, "chunks", res.chunks);
            cJSON_AddNumberToObject(j, "context", C);
            cJSON_AddNumberToObject(j, "tokens_per_s", res.tokens_per_s);
            cJSON_AddNumberToObject(j, "kv_bytes_peak", (double)res.kv_bytes_peak);
            cJSON_AddNumberToObject(j, "kv_bytes_full", (double)res.kv_bytes_full);
            cJSON_AddNumberToObject(j, "ratio", plan.ratio);
            cJSON_AddStringToObject(j, "policy", budgeted ? kv_policy_name(plan.policy) : "full");
            cJSON_AddStringToObject(j, "device", kv_device_name(kv_engine_device(eng)));
            char *s = cJSON_PrintUnformatted(j);
            if (s) printf("%s\n", s);
            free(s);
            cJSON_Delete(j);
        }
    }
    kv_engine_free(eng);
    kv_plan_free(&plan);
    free(ids);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("eval", &err) : 0;
}
