/* kvplan chat formats (include/kvplan/chat.h): template detection and rendering. */
#include "kvplan/chat.h"

#include <stdlib.h>
#include <string.h>

typedef struct chat_buf {
    char *p;
    size_t n, cap;
    int failed;
} chat_buf;

static void put_n(chat_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void put(chat_buf *b, const char *s) {
    put_n(b, s, strlen(s));
}

static int is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}
/* s without leading and trailing white space (Python's str.strip(), as the templates call). */
static void put_stripped(chat_buf *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && is_space(s[i])) i++;
    while (n > i && is_space(s[n - 1])) n--;
    put_n(b, s + i, n - i);
}

static const char *const kv_chat_names[] = {"plain",  "chatml", "llama2", "llama3",
                                            "zephyr", "gemma",  "phi3"};
#define KV_CHAT_N ((int)(sizeof kv_chat_names / sizeof kv_chat_names[0]))

kv_chat_format kv_chat_detect(const char *jinja, int *known) {
    /* most specific markers first: a Llama 3 or ChatML template may mention [INST] in a comment
     * far less often than the reverse */
    static const struct {
        const char *marker;
        kv_chat_format f;
    } rules[] = {
        {"<|start_header_id|>", KV_CHAT_LLAMA3},
        {"<|im_start|>", KV_CHAT_CHATML},
        {"<start_of_turn>", KV_CHAT_GEMMA},
        {"[INST]", KV_CHAT_LLAMA2},
        {"<|end|>", KV_CHAT_PHI3},
        {"<|user|>", KV_CHAT_ZEPHYR},
    };
    if (known) *known = 0;
    if (!jinja) return KV_CHAT_PLAIN;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (strstr(jinja, rules[i].marker)) {
            if (known) *known = 1;
            return rules[i].f;
        }
    return KV_CHAT_PLAIN;
}

const char *kv_chat_format_name(kv_chat_format f) {
    return (int)f >= 0 && (int)f < KV_CHAT_N ? kv_chat_names[f] : "?";
}

int kv_chat_format_parse(const char *name, kv_chat_format *out, kv_error *err) {
    for (int i = 0; name && i < KV_CHAT_N; i++)
        if (!strcmp(name, kv_chat_names[i])) {
            *out = (kv_chat_format)i;
            return KV_OK;
        }
    return kv_fail(err, KV_EINPUT,
                   "unknown chat format '%s' (known: plain, chatml, llama2, llama3, zephyr, gemma, "
                   "phi3)",
                   name ? name : "(null)");
}

const char *kv_chat_end_of_turn(kv_chat_format f) {
    switch (f) {
    case KV_CHAT_CHATML:
        return "<|im_end|>";
    case KV_CHAT_LLAMA2:
    case KV_CHAT_ZEPHYR:
        return "</s>";
    case KV_CHAT_LLAMA3:
        return "<|eot_id|>";
    case KV_CHAT_GEMMA:
        return "<end_of_turn>";
    case KV_CHAT_PHI3:
        return "<|end|>";
    default:
        return NULL;
    }
}

static void render_plain(chat_buf *b, const kv_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        if (i) put(b, "\n");
        put(b, m[i].content);
    }
}

static void render_chatml(chat_buf *b, const kv_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        put(b, "<|im_start|>"), put(b, m[i].role), put(b, "\n");
        put(b, m[i].content), put(b, "<|im_end|>\n");
    }
    put(b, "<|im_start|>assistant\n");
}

/* Llama 2 chat: a system message goes inside the first user turn; every user turn after the
 * first opens with "<s>" (the template writes bos_token before each [INST]; the first is the
 * BOS encoding adds). */
static void render_llama2(chat_buf *b, const kv_chat_msg *m, int n) {
    const char *sys = n > 0 && !strcmp(m[0].role, "system") ? m[0].content : NULL;
    int users = 0;
    for (int i = sys ? 1 : 0; i < n; i++) {
        if (!strcmp(m[i].role, "user")) {
            put(b, users++ ? "<s>[INST] " : "[INST] ");
            if (sys && users == 1) put(b, "<<SYS>>\n"), put(b, sys), put(b, "\n<</SYS>>\n\n");
            put_stripped(b, m[i].content), put(b, " [/INST]");
        } else if (!strcmp(m[i].role, "assistant")) {
            put(b, " "), put_stripped(b, m[i].content), put(b, " </s>");
        }
    }
}

static void render_llama3(chat_buf *b, const kv_chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        put(b, "<|start_header_id|>"), put(b, m[i].role), put(b, "<|end_header_id|>\n\n");
        put_stripped(b, m[i].content), put(b, "<|eot_id|>");
    }
    put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Zephyr and Phi-3: "<|ROLE|>\n" CONTENT END "\n" per message, END "</s>" or "<|end|>". */
static void render_tagged(chat_buf *b, const kv_chat_msg *m, int n, const char *end) {
    for (int i = 0; i < n; i++) {
        put(b, "<|"), put(b, m[i].role), put(b, "|>\n");
        put(b, m[i].content), put(b, end), put(b, "\n");
    }
    put(b, "<|assistant|>\n");
}
static void render_zephyr(chat_buf *b, const kv_chat_msg *m, int n) {
    render_tagged(b, m, n, "</s>");
}
static void render_phi3(chat_buf *b, const kv_chat_msg *m, int n) {
    render_tagged(b, m, n, "<|end|>");
}

/* Gemma: roles user and model; no system role, so a system message's content opens the first
 * user turn, followed by a blank line. */
static void render_gemma(chat_buf *b, const kv_chat_msg *m, int n) {
    const char *sys = n > 0 && !strcmp(m[0].role, "system") ? m[0].content : NULL;
    int first_user = 1;
    for (int i = sys ? 1 : 0; i < n; i++) {
        int user = !strcmp(m[i].role, "user");
        put(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (user && first_user && sys) put_stripped(b, sys), put(b, "\n\n");
        if (user) first_user = 0;
        put_stripped(b, m[i].content), put(b, "<end_of_turn>\n");
    }
    put(b, "<start_of_turn>model\n");
}

int kv_chat_render(kv_chat_format f, const kv_chat_msg *msgs, int n, char **out, kv_error *err) {
    *out = NULL;
    if (!msgs || n < 1) return kv_fail(err, KV_EINPUT, "a chat needs at least one message");
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
            return kv_fail(err, KV_EINPUT, "message %d: role must be system, user or assistant", i);
        if (!msgs[i].content) return kv_fail(err, KV_EINPUT, "message %d has no content", i);
    }
    if ((int)f < 0 || (int)f >= KV_CHAT_N)
        return kv_fail(err, KV_EINPUT, "unknown chat format %d", (int)f);
    static void (*const render[])(chat_buf *, const kv_chat_msg *, int) = {
        render_plain,  render_chatml, render_llama2, render_llama3,
        render_zephyr, render_gemma,  render_phi3};
    chat_buf b = {0};
    put(&b, ""); /* an empty rendering is still a string */
    render[f](&b, msgs, n);
    if (b.failed) {
        free(b.p);
        return kv_fail(err, KV_EINTERNAL, "out of memory rendering a chat");
    }
    *out = b.p;
    return KV_OK;
}
