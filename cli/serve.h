/* kvplan serve: the OpenAI-compatible HTTP front of the scheduler (kvplan/sched.h).
 * cli/serve_api.c parses requests and writes the JSON of responses (OpenAI's completion and
 * chat completion objects and their streamed chunks); cli/serve_http.c runs the libmicrohttpd
 * daemon and the scheduler's thread; cli/cmd_serve.c is the command. docs/serve.md describes
 * the API, the chat template and the metrics. */
#ifndef KVPLAN_CLI_SERVE_H
#define KVPLAN_CLI_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/chat.h"
#include "kvplan/sched.h"
#include "kvplan/tokenizer.h"

#define KV_SERVE_MAX_STOP 4
#define KV_SERVE_MAX_BODY (1 << 20) /* request body bytes at most (413 beyond) */

/* One parsed /v1/completions or /v1/chat/completions request. */
typedef struct kv_serve_req {
    char *prompt; /* owned; chat: the messages rendered in the server's chat format */
    int chat, stream, include_usage;
    long max_tokens; /* -1: not given */
    double temperature, top_p;
    uint64_t seed;
    char *stop[KV_SERVE_MAX_STOP]; /* owned */
    int n_stop;
} kv_serve_req;

/* Parse body (len bytes) of a request to model `model_id`; a chat's messages are rendered in
 * format fmt (kvplan/chat.h). 0 on success (*out filled; free with kv_serve_req_free), else -1
 * with a one-line reason in msg (an HTTP 400). */
int kv_serve_parse(const char *body, size_t len, int chat, kv_chat_format fmt, const char *model_id,
                   kv_serve_req *out, char *msg, size_t cap);
void kv_serve_req_free(kv_serve_req *r);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or values above U+10FFFF). */
int kv_serve_utf8_valid(const char *s, size_t n);
/* The length of the longest prefix of s[0..n) that does not end inside an incomplete UTF-8
 * sequence (the streamed text is cut there until the rest arrives). */
size_t kv_serve_utf8_complete(const char *s, size_t n);

/* OpenAI-style error object {"error": {"message", "type", "param", "code"}} (malloc'd). */
char *kv_serve_error_json(const char *msg, const char *type, const char *code);

/* The fields a response names. */
typedef struct kv_serve_ident {
    int chat;
    const char *id, *model;
    long created;
} kv_serve_ident;

/* A streamed chunk as one SSE event "data: {...}\n\n" (malloc'd): text (may be NULL) of
 * `len` bytes, finish (NULL while it goes on), role (chat's first chunk), usage (counts >= 0)
 * or NULL for none. */
char *kv_serve_chunk(const kv_serve_ident *id, const char *text, size_t len, const char *finish,
                     int role, const long *usage);
/* The whole non-streamed response object (malloc'd). usage: prompt, completion tokens. */
char *kv_serve_full(const kv_serve_ident *id, const char *text, size_t len, const char *finish,
                    const long *usage);

/* The server (cli/serve_http.c). */
typedef struct kv_server_opts {
    const char *host; /* bind address (127.0.0.1) */
    int port;         /* 0: any free port */
    const char *model_id;
    const char *api_key; /* NULL: none */
    int timeout_s;       /* idle connection timeout */
    double drain_s;      /* shutdown: running requests may finish for this long */
    int ctx;             /* the model's context */
    kv_chat_format chat; /* how chat messages become the prompt */
    int eot_id;          /* the chat format's end-of-turn token (a chat answer stops there), -1 */
    int quiet;
} kv_server_opts;

/* Serve until SIGINT / SIGTERM (blocked by the caller in every thread before this call), then
 * stop accepting, drain and return 0; KV_EINPUT when the address cannot be bound. */
int kv_serve_run(kv_sched *s, const kv_tokenizer *tok, const kv_server_opts *o, kv_error *err);

#endif
