/* kvplan serve: request parsing and the OpenAI response objects (cli/serve.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

int kv_serve_utf8_valid(const char *s, size_t n) {
    static const unsigned min_cp[4] = {0, 0x80, 0x800, 0x10000};
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 0;
        if (k == 0 || i + (size_t)k >= n) return 0;
        unsigned cp = c & (0x3Fu >> k);
        for (int j = 1; j <= k; j++) {
            if ((u[i + (size_t)j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + (size_t)j] & 0x3Fu);
        }
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

size_t kv_serve_utf8_complete(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    /* look back at most 3 bytes for a lead byte whose sequence runs past the end */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = u[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

static int fail(char *msg, size_t cap, const char *what) {
    snprintf(msg, cap, "%s", what);
    return -1;
}

/* Chat messages rendered in the server's chat format (kvplan/chat.h; docs/serve.md "Chat
 * template"): plain text joins the contents with "\n". */
static int join_messages(const cJSON *msgs, kv_chat_format fmt, char **out, char *msg, size_t cap) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1)
        return fail(msg, cap, "'messages' must be a non-empty array of {role, content} objects");
    int n = cJSON_GetArraySize(msgs), i = 0;
    kv_chat_msg *m = calloc((size_t)n, sizeof *m);
    if (!m) return fail(msg, cap, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
            free(m);
            return fail(msg, cap, "each message needs a string 'role' and a string 'content'");
        }
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant")) {
            free(m);
            return fail(msg, cap, "a message's 'role' must be system, user or assistant");
        }
        m[i++] = (kv_chat_msg){role->valuestring, content->valuestring};
    }
    kv_error err = {0};
    int rc = kv_chat_render(fmt, m, n, out, &err);
    free(m);
    return rc ? fail(msg, cap, err.msg) : 0;
}

static int parse_stop(const cJSON *stop, kv_serve_req *r, char *msg, size_t cap) {
    if (!stop || cJSON_IsNull(stop)) return 0;
    if (cJSON_IsString(stop)) {
        if (!*stop->valuestring) return fail(msg, cap, "'stop' must not be empty");
        r->stop[r->n_stop++] = strdup(stop->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(stop) || cJSON_GetArraySize(stop) > KV_SERVE_MAX_STOP)
        return fail(msg, cap, "'stop' must be a string or an array of at most 4 strings");
    const cJSON *it;
    cJSON_ArrayForEach(it, stop) {
        if (!cJSON_IsString(it) || !*it->valuestring)
            return fail(msg, cap, "'stop' must be a string or an array of at most 4 strings");
        r->stop[r->n_stop++] = strdup(it->valuestring);
    }
    return 0;
}

/* A number field: absent -> def; present -> a finite number within [lo, hi]. */
static int num_field(const cJSON *root, const char *name, double lo, double hi, double def,
                     double *out, char *msg, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    *out = def;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi) {
        snprintf(msg, cap, "'%s' must be a number in [%g, %g]", name, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int parse_fields(const cJSON *root, kv_serve_req *r, char *msg, size_t cap) {
    double v = 0;
    if (num_field(root, "max_tokens", -1e18, 1e18, -1, &v, msg, cap) || v != floor(v) ||
        (v != -1 && v < 1))
        return fail(msg, cap, "'max_tokens' must be a whole number >= 1");
    r->max_tokens = v > 1e9 ? 1000000000L : (long)v;
    if (num_field(root, "temperature", 0, 2, 1, &r->temperature, msg, cap)) return -1;
    if (num_field(root, "top_p", 0, 1, 1, &r->top_p, msg, cap)) return -1;
    if (r->top_p <= 0) return fail(msg, cap, "'top_p' must be in (0, 1]");
    if (num_field(root, "seed", 0, 9.2e18, 0, &v, msg, cap)) return -1;
    if (v != floor(v)) return fail(msg, cap, "'seed' must be a whole number");
    r->seed = (uint64_t)v;
    if (num_field(root, "n", 1, 1, 1, &v, msg, cap)) return fail(msg, cap, "'n' must be 1");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st))
        return fail(msg, cap, "'stream' must be a boolean");
    r->stream = cJSON_IsTrue(st);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && cJSON_IsObject(so))
        r->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    return parse_stop(cJSON_GetObjectItemCaseSensitive(root, "stop"), r, msg, cap);
}

static int parse_prompt(const cJSON *root, int chat, kv_chat_format fmt, kv_serve_req *r, char *msg,
                        size_t cap) {
    if (chat)
        return join_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"), fmt, &r->prompt,
                             msg, cap);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = cJSON_GetArrayItem(p, 0);
    if (!cJSON_IsString(p))
        return fail(msg, cap, "'prompt' must be a string (or one string in an array)");
    r->prompt = strdup(p->valuestring);
    return r->prompt ? 0 : fail(msg, cap, "out of memory");
}

int kv_serve_parse(const char *body, size_t len, int chat, kv_chat_format fmt, const char *model_id,
                   kv_serve_req *out, char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    out->max_tokens = -1;
    if (!kv_serve_utf8_valid(body, len))
        return fail(msg, cap, "the request body is not valid UTF-8");
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return fail(msg, cap, "the request body is not valid JSON");
    int rc = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(root))
        rc = fail(msg, cap, "the request body must be a JSON object");
    else if (!cJSON_IsString(model))
        rc = fail(msg, cap, "'model' is required (a string)");
    else if (strcmp(model->valuestring, model_id)) {
        snprintf(msg, cap, "the model '%.200s' does not exist; this server serves '%.200s'",
                 model->valuestring, model_id);
        rc = -1;
    }
    if (!rc) rc = parse_prompt(root, chat, fmt, out, msg, cap);
    if (!rc) rc = parse_fields(root, out, msg, cap);
    out->chat = chat;
    cJSON_Delete(root);
    if (rc) kv_serve_req_free(out);
    return rc;
}

void kv_serve_req_free(kv_serve_req *r) {
    free(r->prompt);
    r->prompt = NULL;
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    r->n_stop = 0;
}

static char *print_free(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *kv_serve_error_json(const char *msg, const char *type, const char *code) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    return print_free(o);
}

/* A string item from `len` bytes (not NUL-terminated; may hold NUL-free UTF-8 only). */
static cJSON *text_item(const char *text, size_t len) {
    char *t = malloc(len + 1);
    if (!t) return NULL;
    if (len) memcpy(t, text, len);
    t[len] = 0;
    cJSON *s = cJSON_CreateString(t);
    free(t);
    return s;
}

static cJSON *head(const kv_serve_ident *id, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id->id);
    cJSON_AddStringToObject(o, "object",
                            id->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                     : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)id->created);
    cJSON_AddStringToObject(o, "model", id->model);
    return o;
}

static void add_usage(cJSON *o, const long *usage) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)usage[0]);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)usage[1]);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(usage[0] + usage[1]));
}

char *kv_serve_chunk(const kv_serve_ident *id, const char *text, size_t len, const char *finish,
                     int role, const long *usage) {
    cJSON *o = head(id, 1), *ch = cJSON_AddArrayToObject(o, "choices");
    if (!usage || text || finish) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(ch, c);
        cJSON_AddNumberToObject(c, "index", 0);
        if (id->chat) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (role) cJSON_AddStringToObject(d, "role", "assistant");
            if (text) cJSON_AddItemToObject(d, "content", text_item(text, len));
        } else {
            cJSON_AddItemToObject(c, "text", text_item(text ? text : "", text ? len : 0));
            cJSON_AddNullToObject(c, "logprobs");
        }
        if (finish)
            cJSON_AddStringToObject(c, "finish_reason", finish);
        else
            cJSON_AddNullToObject(c, "finish_reason");
    }
    if (usage) add_usage(o, usage);
    char *js = print_free(o);
    if (!js) return NULL;
    size_t n = strlen(js);
    char *ev = malloc(n + 9);
    if (ev) snprintf(ev, n + 9, "data: %s\n\n", js);
    free(js);
    return ev;
}

char *kv_serve_full(const kv_serve_ident *id, const char *text, size_t len, const char *finish,
                    const long *usage) {
    cJSON *o = head(id, 0), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (id->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", text_item(text, len));
    } else {
        cJSON_AddItemToObject(c, "text", text_item(text, len));
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", finish);
    add_usage(o, usage);
    return print_free(o);
}
