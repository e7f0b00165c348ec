/* kvplan tokenizer: text <-> token ids for the formats kvplan loads.
 *
 * Kinds: KV_TOK_SPM (SentencePiece-style scored pieces merged greedily by score, byte
 * fallback <0xXX>, a leading space (dummy prefix); llama2.c tokenizer.bin and GGUF
 * tokenizer.ggml.model = "llama"), KV_TOK_BPE (merge-ranked BPE from tokenizer.json or GGUF
 * "gpt2": SentencePiece-style with the "▁" prepend normaliser and byte fallback, or GPT-2
 * byte-level with its regex pre-tokenizer through PCRE2).
 * A tokenizer is immutable after loading and may be shared between threads.
 */
#ifndef KVPLAN_TOKENIZER_H
#define KVPLAN_TOKENIZER_H

#include "kvplan/common.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KV_TOK_SPM = 1, KV_TOK_BPE = 2 } kv_tok_kind;

typedef struct kv_tokenizer kv_tokenizer;

/* Operations a tokenizer kind provides (internal to runtime/). */
typedef struct kv_tokenizer_ops {
    /* Encode `len` bytes of text; append ids to a growing array (*ids, *n, *cap, realloc). */
    int (*encode)(const kv_tokenizer *t, const char *text, size_t len, int **ids, int *n, int *cap,
                  kv_error *err);
    /* The bytes token `id` decodes to, given the previous token (for the SentencePiece rule
     * that drops the leading space after BOS). Writes up to cap-1 bytes + NUL into buf;
     * returns the byte count. */
    int (*piece)(const kv_tokenizer *t, int prev_id, int id, char *buf, int cap);
    void (*free_impl)(void *impl);
} kv_tokenizer_ops;

struct kv_tokenizer {
    kv_tok_kind kind;
    int vocab_size;
    int bos_id, eos_id; /* -1 when none */
    int add_bos;        /* encode with add_bos = -1 uses this default */
    const kv_tokenizer_ops *ops;
    void *impl;
};

/* Load the tokenizer for `m`. With `path` != NULL the file's format is detected from its
 * content (llama2.c tokenizer.bin, or tokenizer.json). With path == NULL: llama2.c models use
 * tokenizer.bin or tok<vocab>.bin beside the model; GGUF uses its embedded vocabulary;
 * Hugging Face directories use tokenizer.json (+ tokenizer_config.json). The vocabulary size
 * must match the model's. Caller owns *out (kv_tokenizer_free). */
int kv_tokenizer_load(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);
void kv_tokenizer_free(kv_tokenizer *t);

/* llama2.c tokenizer.bin reader (scored pieces), and the generic scored-piece constructor
 * the GGUF "llama" vocabulary reuses: pieces[i] is NUL-terminated, spaces as ' ' (callers
 * convert "▁"), byte tokens spelled "<0xXX>". Copies its inputs. */
int kv_tokenizer_load_llama2c(const char *path, int vocab_size, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_from_scored(const char *const *pieces, const float *scores, int n, int bos_id,
                             int eos_id, kv_tokenizer **out, kv_error *err);

/* Encode text to ids. add_bos: 1 prepend BOS, 0 not, -1 the tokenizer's default. The caller
 * owns *ids (free()). */
int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int **ids,
                        int *n, kv_error *err);

/* Decode ids to a NUL-terminated string the caller owns; BOS/EOS produce no text. */
int kv_tokenizer_decode(const kv_tokenizer *t, const int *ids, int n, char **text, kv_error *err);

/* Bytes of one token for streaming output (see kv_tokenizer_ops.piece). */
int kv_tokenizer_piece(const kv_tokenizer *t, int prev_id, int id, char *buf, int cap);

#ifdef __cplusplus
}
#endif
#endif
