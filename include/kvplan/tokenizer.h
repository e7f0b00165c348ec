/* kvplan tokenizer: text <-> token ids for the formats kvplan loads.
 *
 * Kinds: KV_TOK_SPM (SentencePiece-style scored pieces merged greedily by score, byte
 * fallback <0xXX>, a leading space (dummy prefix); llama2.c tokenizer.bin and GGUF
 * tokenizer.ggml.model = "llama", as llama.cpp's llm_tokenizer_spm), KV_TOK_BPE (merge-ranked
 * BPE from tokenizer.json or GGUF "gpt2": SentencePiece-style with the "▁" prepend normaliser
 * and byte fallback, or GPT-2 byte-level with regex pre-tokenizers through PCRE2; a GGUF
 * vocabulary's pre-tokenizers follow tokenizer.ggml.pre as llama.cpp's llm_tokenizer_bpe).
 *
 * Special tokens. Before a kind's encoder sees the text, the front end cuts out the texts of
 * the special (added) tokens and emits their ids directly. User-defined (added, non-control)
 * tokens are always cut out; control and unknown tokens only when parsing special tokens
 * (kv_tokenizer_encode does; kv_tokenizer_encode_ex can turn it off, as llama.cpp's
 * parse_special = false). The order follows the source: GGUF vocabularies cut the longest
 * token first across the whole text (llama.cpp tokenizer_st_partition); tokenizer.json cuts
 * leftmost first, the longest at a position (Hugging Face tokenizers AddedVocabulary).
 * A tokenizer is immutable after loading and may be shared between threads.
 */
#ifndef KVPLAN_TOKENIZER_H
#define KVPLAN_TOKENIZER_H

#include "kvplan/common.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef enum { KV_TOK_SPM = 1, KV_TOK_BPE = 2 } kv_tok_kind;

typedef struct kv_tokenizer kv_tokenizer;

/* The id of BOS / EOS (-1 when the vocabulary has none), and the vocabulary size. */
int kv_tokenizer_bos(const kv_tokenizer *t);
int kv_tokenizer_eos(const kv_tokenizer *t);
int kv_tokenizer_vocab_size(const kv_tokenizer *t);
/* SentencePiece (KV_TOK_SPM) or byte-level BPE (KV_TOK_BPE). */
kv_tok_kind kv_tokenizer_kind(const kv_tokenizer *t);

/* Load a tokenizer. With `path` != NULL the file's format is detected from its content: a
 * GGUF file (any GGUF with tokenizer.ggml.* metadata, a vocabulary-only one included), a
 * tokenizer.json (first non-blank byte '{'), else a llama2.c tokenizer.bin. With path == NULL
 * the model's own: llama2.c models use tokenizer.bin or tok<vocab>.bin beside the model; GGUF
 * uses its embedded vocabulary; Hugging Face directories use tokenizer.json (+
 * tokenizer_config.json). `m` may be NULL when `path` is given (no model: a tokenizer.bin is
 * then read to its end); with a model the vocabulary size must match the model's.
 * Errors are KV_EINPUT naming the file. Caller owns *out (kv_tokenizer_free). */
int kv_tokenizer_load(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);
void kv_tokenizer_free(kv_tokenizer *t);

/* llama2.c tokenizer.bin reader (scored pieces; vocab_size <= 0 reads pieces to the end of
 * the file), and the generic scored-piece constructor the GGUF "llama" vocabulary reuses:
 * pieces[i] is NUL-terminated, spaces as ' ' (callers convert "▁"), byte tokens spelled
 * "<0xXX>". Copies its inputs. */
int kv_tokenizer_load_llama2c(const char *path, int vocab_size, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_from_scored(const char *const *pieces, const float *scores, int n, int bos_id,
                             int eos_id, kv_tokenizer **out, kv_error *err);

/* Encode text to ids. add_bos: 1 prepend BOS, 0 not, -1 the tokenizer's default. Control
 * tokens written in the text are recognised (parse_special = 1). The caller owns *ids
 * (free()); an empty text gives no ids besides the BOS. */
int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int **ids,
                        int *n, kv_error *err);
/* As kv_tokenizer_encode; parse_special = 0 leaves control-token texts to the encoder as plain
 * text (user-defined tokens are still cut out), as llama.cpp's llama_tokenize with
 * parse_special = false, which its tokenizer tests (test-tokenizer-0) use. */
int kv_tokenizer_encode_ex(const kv_tokenizer *t, const char *text, size_t len, int add_bos,
                           int parse_special, int **ids, int *n, kv_error *err);

/* Decode ids to a NUL-terminated string the caller owns; BOS/EOS produce no text. */
int kv_tokenizer_decode(const kv_tokenizer *t, const int *ids, int n, char **text, kv_error *err);

/* The chat template the tokenizer's file carries (GGUF tokenizer.chat_template, or
 * tokenizer_config.json's chat_template beside a tokenizer.json; a list of named templates gives
 * the one named "default"), as Jinja source owned by t; NULL when the file has none.
 * kv_chat_detect (kvplan/chat.h) names its family. */
const char *kv_tokenizer_chat_template(const kv_tokenizer *t);

/* Bytes of one token for streaming output (see kv_tokenizer_ops.piece). */
int kv_tokenizer_piece(const kv_tokenizer *t, int prev_id, int id, char *buf, int cap);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
