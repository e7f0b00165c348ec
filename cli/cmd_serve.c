/* kvplan serve: an OpenAI-compatible HTTP server that batches the requests of many users at
 * every decode step under one KV memory (the scheduler is the runtime's, kvplan/sched.h; the
 * HTTP side is cli/serve_http.c). docs/serve.md. */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvplan/engine.h"
#include "serve.h"

typedef struct serve_args {
    const char *model, *tokenizer, *host, *api_key, *name, *chat;
    double kv_mem, drain;
    long port, max_queue, max_seqs, step_tokens, timeout, group;
    int quiet;
    kv_budget_args budget;
    kv_threads_args threads;
} serve_args;

static const kv_opt serve_opts[] = {
    {"--model", NULL, KV_OPT_STR, offsetof(serve_args, model), "MODEL", .positional = 1,
     .help = "llama2.c .bin, .gguf or Hugging Face directory"},
    {"--tokenizer", NULL, KV_OPT_STR, offsetof(serve_args, tokenizer), "TOK",
     .help = "tokenizer file (default: the model's)"},
    {"--kv-mem", NULL, KV_OPT_QTY, offsetof(serve_args, kv_mem), "BYTES", 1, 1e15,
     .help = "KV bytes the admitted requests may hold (required): a request is admitted when "
             "its plan's per-head budgets, in whole blocks of the plan's KV types, fit"},
    {"--host", NULL, KV_OPT_STR, offsetof(serve_args, host), "H", .def = "127.0.0.1",
     .help = "IPv4 address to listen on"},
    {"--port", NULL, KV_OPT_INT, offsetof(serve_args, port), "N", 0, 65535, .def = "8080",
     .help = "TCP port (0: any free port; the address is printed on stderr)"},
    {"--max-queue", NULL, KV_OPT_INT, offsetof(serve_args, max_queue), "N", 1, 1 << 20,
     .def = "256", .help = "requests waiting for admission at most (429 beyond)"},
    {"--max-seqs", NULL, KV_OPT_INT, offsetof(serve_args, max_seqs), "N", 1, 4096, .def = "256",
     .help = "sequences running at once at most"},
    {"--step-tokens", NULL, KV_OPT_INT, offsetof(serve_args, step_tokens), "N", 1, 1 << 20,
     .def = "64", .help = "prompt tokens prefilled per scheduling step"},
    {"--group", NULL, KV_OPT_INT, offsetof(serve_args, group), "N", 0, 4096, .def = "0",
     .help = "sequences per decode forward call at most (0: every running one on the CPU, "
             "4 on CUDA; every answer is independent of its neighbours on the CPU, and on "
             "CUDA up to 4)"},
    {"--api-key", NULL, KV_OPT_STR, offsetof(serve_args, api_key), "KEY",
     .help = "require 'Authorization: Bearer KEY' on /v1/ endpoints"},
    {"--model-name", NULL, KV_OPT_STR, offsetof(serve_args, name), "NAME",
     .help = "the model id clients name (default: the model file's name without extension)"},
    {"--timeout", NULL, KV_OPT_INT, offsetof(serve_args, timeout), "S", 1, 86400, .def = "30",
     .help = "seconds an idle or slow connection is kept"},
    {"--drain", NULL, KV_OPT_NUM, offsetof(serve_args, drain), "S", 0, 3600, .def = "10",
     .help = "on SIGINT / SIGTERM, seconds running requests may take to finish"},
    {"--chat-template", NULL, KV_OPT_STR, offsetof(serve_args, chat), "F", .def = "auto",
     .help = "how chat messages become the prompt: auto (the family of the tokenizer's "
             "chat_template, else plain), plain, chatml, llama2, llama3, zephyr, gemma, phi3"},
    {"--quiet", NULL, KV_OPT_FLAG, offsetof(serve_args, quiet), .help = "less on stderr"},
};

const kv_cli_spec kv_spec_serve = {
    "serve",
    "usage: kvplan serve MODEL --kv-mem BYTES [--plan PLAN | budget options] [--host H]\n"
    "                    [--port N] [--max-queue N] [--max-seqs N] [--api-key KEY] ...\n",
    "Serve the OpenAI API (POST /v1/completions, /v1/chat/completions; GET /v1/models,\n"
    "/health, /metrics) with continuous batching under the plan's KV budgets.\n",
    "Numbers accept suffixes K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti (powers of 1024).\n",
    {{NULL, serve_opts, sizeof serve_opts / sizeof serve_opts[0], 0},
     {"KV budget options (default: the full cache)", kv_budget_opts, KV_BUDGET_OPTS_ALL,
      offsetof(serve_args, budget)},
     {"threads", kv_threads_opts, KV_THREADS_OPTS_N, offsetof(serve_args, threads)}},
};

/* The model id: --model-name, else the file (or directory) name without its extension. */
static void model_id(const serve_args *a, char *buf, size_t cap) {
    if (a->name) {
        snprintf(buf, cap, "%s", a->name);
        return;
    }
    const char *p = a->model, *slash = strrchr(p, '/');
    while (slash && slash[1] == 0 && slash > p) { /* a directory given with a trailing slash */
        const char *q = slash - 1;
        while (q > p && *q != '/') q--;
        p = *q == '/' ? q + 1 : q;
        snprintf(buf, cap, "%.*s", (int)(slash - p), p);
        return;
    }
    snprintf(buf, cap, "%s", slash ? slash + 1 : p);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf) *dot = 0;
}

/* The chat format (--chat-template, or the family of the tokenizer's template) and its
 * end-of-turn token: the id when the marker encodes to one token, else -1. */
static int chat_format(const serve_args *a, const kv_tokenizer *tok, kv_server_opts *o,
                       kv_error *err) {
    int known = 0;
    const char *jinja = kv_tokenizer_chat_template(tok);
    if (a->chat && strcmp(a->chat, "auto")) {
        if (kv_chat_format_parse(a->chat, &o->chat, err)) return KV_EINPUT;
    } else {
        o->chat = kv_chat_detect(jinja, &known);
    }
    if (!a->quiet && jinja && !known && (!a->chat || !strcmp(a->chat, "auto")))
        fprintf(stderr, "kvplan serve: the tokenizer's chat template is of no family kvplan "
                        "renders; chat messages are joined as plain text (--chat-template)\n");
    o->eot_id = -1;
    const char *eot = kv_chat_end_of_turn(o->chat);
    int *ids = NULL, n = 0;
    if (eot && !kv_tokenizer_encode(tok, eot, strlen(eot), 0, &ids, &n, err) && n == 1)
        o->eot_id = ids[0];
    free(ids);
    return KV_OK;
}

static int serve(const serve_args *a, kv_model *m, kv_tokenizer *tok, kv_error *err) {
    kv_plan plan = {0};
    kv_device device = KV_DEVICE_AUTO;
    kv_engine *eng = NULL;
    kv_sched *s = NULL;
    int rc = kv_budget_args_plan(&a->budget, m, m->cfg.seq_len, &plan, &device, err);
    kv_engine_opts eo = {.device = device,
                         .max_seqs = (int)a->max_seqs,
                         .n_threads = kv_threads_args_count(&a->threads)};
    if (!rc) rc = kv_engine_new(m, &plan, &eo, &eng, err);
    kv_sched_opts so = {.kv_mem = (size_t)a->kv_mem,
                        .max_queue = (int)a->max_queue,
                        .step_tokens = (int)a->step_tokens,
                        .group = (int)a->group};
    if (!rc) rc = kv_sched_new(eng, m, tok, &so, &s, err);
    char id[256];
    model_id(a, id, sizeof id);
    kv_server_opts o = {.host = a->host,
                        .port = (int)a->port,
                        .model_id = id,
                        .api_key = a->api_key,
                        .timeout_s = (int)a->timeout,
                        .drain_s = a->drain,
                        .ctx = m->cfg.seq_len,
                        .quiet = a->quiet};
    if (!rc) rc = chat_format(a, tok, &o, err);
    if (!rc && !a->quiet)
        fprintf(stderr,
                "kvplan serve: %s on %s, %s cache, KV memory %.0f bytes: %zu per "
                "request of the full context; chat format %s\n",
                id, kv_device_name(kv_engine_device(eng)),
                plan.full ? "full" : kv_policy_name(plan.policy), a->kv_mem,
                kv_sched_request_bytes(s, 1, m->cfg.seq_len - 1), kv_chat_format_name(o.chat));
    if (!rc) rc = kv_serve_run(s, tok, &o, err);
    kv_sched_free(s);
    kv_engine_free(eng);
    kv_plan_free(&plan);
    return rc;
}

int kv_cmd_serve(int argc, char **argv) {
    serve_args a = {0};
    int code = kv_cli_parse(&kv_spec_serve, argc, argv, &a);
    if (code >= 0) return code;
    kv_error err = {0};
    if (!a.model || !(a.kv_mem > 0)) {
        kv_fail(&err, KV_EINPUT, "MODEL and --kv-mem BYTES are required");
        return kv_cli_report("serve", &err);
    }
    /* SIGINT / SIGTERM are taken by sigwait (cli/serve_http.c): blocked in every thread */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    kv_model *m = NULL;
    kv_tokenizer *tok = NULL;
    int rc = kv_cli_load_model(a.model, &m, &err);
    if (!rc) rc = kv_cli_blas_ready(&err);
    if (!rc) rc = kv_tokenizer_load(a.tokenizer, m, &tok, &err);
    if (!rc) rc = serve(&a, m, tok, &err);
    kv_tokenizer_free(tok);
    kv_model_free(m);
    return rc ? kv_cli_report("serve", &err) : 0;
}
