/* The tokenizer room's internals (not installed): the tokenizer object's fields, the operations
 * each kind (SentencePiece, BPE) provides, and what the vocabulary readers (tokenizer.c,
 * tokenizer_bpe.c, tokenizer_gguf.c) share. The public face is include/kvplan/tokenizer.h, where
 * kv_tokenizer is opaque. */
#ifndef KVPLAN_TOKENIZER_IMPL_H
#define KVPLAN_TOKENIZER_IMPL_H

#include "kvplan/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Operations a tokenizer kind provides (internal to runtime/). */
typedef struct kv_tokenizer_ops {
    /* Encode `len` bytes of text that holds no special token (one fragment between special
     * tokens); append ids to a growing array (*ids, *n, *cap, realloc). */
    int (*encode)(const kv_tokenizer *t, const char *text, size_t len, int **ids, int *n, int *cap,
                  kv_error *err);
    /* The bytes token `id` decodes to, given the previous token (for the SentencePiece rule
     * that drops the leading space after BOS). Writes up to cap-1 bytes + NUL into buf;
     * returns the byte count. */
    int (*piece)(const kv_tokenizer *t, int prev_id, int id, char *buf, int cap);
    void (*free_impl)(void *impl);
} kv_tokenizer_ops;

/* A special token matched verbatim in the text (see the file comment). */
typedef struct kv_tok_special {
    char *text; /* owned, NUL-terminated */
    int len;
    int id;
    int control; /* 1: control or unknown token, cut out only when parsing special tokens */
} kv_tok_special;

typedef enum {
    KV_SPECIAL_LEFTMOST = 0,      /* leftmost occurrence first, the longest there (HF) */
    KV_SPECIAL_LONGEST_FIRST = 1, /* longest token first over the whole text (llama.cpp) */
} kv_special_order;

struct kv_tokenizer {
    kv_tok_kind kind;
    int vocab_size;
    int bos_id, eos_id; /* -1 when none */
    int add_bos;        /* encode with add_bos = -1 uses this default */
    const kv_tokenizer_ops *ops;
    void *impl;
    kv_tok_special *special; /* [n_special], owned; see kv_tokenizer_set_special */
    int n_special;
    kv_special_order special_order;
    char *chat_template; /* owned; the Jinja chat template from the file's metadata, or NULL */
};

/* Set the special tokens (copied; replaces any before): ids[k] with text texts[k] (skipped
 * when empty or NULL), control[k] as in kv_tok_special (NULL = none control). KV_EINTERNAL when
 * out of memory. Used by the vocabulary readers in runtime/. */
int kv_tokenizer_set_special(kv_tokenizer *t, const int *ids, const char *const *texts,
                             const unsigned char *control, int n, kv_special_order order,
                             kv_error *err);

/* Keep a copy of the first n bytes of `jinja` as t's chat template (replacing any before).
 * KV_EINTERNAL when out of memory. */
int kv_tokenizer_set_chat_template(kv_tokenizer *t, const char *jinja, size_t n, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
