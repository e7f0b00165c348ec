/* Internal to runtime/: the tokenizer constructors the vocabulary readers share, and the
 * readers' entry points for the front end (runtime/tokenizer/tokenizer.c).
 *
 * The merge-ranked BPE tokenizer (KV_TOK_BPE) is shared by the tokenizer.json reader
 * (runtime/tokenizer/tokenizer_bpe.c) and the GGUF "gpt2" vocabulary reader
 * (runtime/tokenizer/tokenizer_gguf.c). Both readers fill a kv_bpe_spec and call
 * kv_tokenizer_bpe_new.
 *
 * Two styles (Hugging Face `tokenizers` semantics, models/bpe/model.rs and word.rs):
 *  - KV_BPE_SPM: SentencePiece-style. The normaliser prepends "▁" to each text segment and
 *    replaces ' ' by "▁"; words are split into UTF-8 code points; a code point absent from the
 *    vocabulary becomes its bytes "<0xXX>" (byte_fallback) or the unknown token. Decoding maps
 *    "▁" to ' ', byte tokens to their byte, and drops the leading space of the first token
 *    (decoder Strip(start = 1)).
 *  - KV_BPE_BYTELEVEL: GPT-2 byte-level. The text is split by regular expressions (PCRE2,
 *    UTF + UCP + DOLLAR_ENDONLY) and each piece's bytes are mapped to the printable code points
 *    of GPT-2's bytes_to_unicode table before BPE; decoding maps them back to bytes.
 * Pre-tokenizer regexes apply in sequence, each to every piece the previous one left, with the
 * piece as the whole subject (lookarounds and anchors do not see past it); matches and the
 * gaps between them both become pieces (Hugging Face Split "Isolated"; llama.cpp
 * unicode_regex_split).
 * Merges are applied per word in rank order (lowest rank first, leftmost on ties) with a heap,
 * O(n log n) in the word length. Special (added) tokens are cut out of the text by the front
 * end (kv_tokenizer_set_special) and never take part in merges.
 */
#ifndef KVPLAN_RUNTIME_TOKENIZER_BPE_H
#define KVPLAN_RUNTIME_TOKENIZER_BPE_H

#include "tokenizer/tokenizer_impl.h"

struct kv_gguf; /* runtime/model/gguf_meta.h */

typedef enum { KV_BPE_SPM = 0, KV_BPE_BYTELEVEL = 1 } kv_bpe_style;

#define KV_BPE_MAX_REGEX 8

/* GPT-2's pre-tokenizer pattern (tokenizers pre_tokenizers/byte_level.rs). */
#define KV_BPE_GPT2_REGEX                                                                          \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct kv_bpe_spec {
    int n_vocab;
    const char *const *tokens; /* [n_vocab] NUL-terminated token strings as the file spells
                                  them (with "▁" or byte-level code points); NULL = unused id */
    int n_merges;
    const char *const *merge_left;  /* [n_merges] first part of merge r (rank r) */
    const char *const *merge_right; /* [n_merges] second part */
    kv_bpe_style style;
    const char *regex;          /* pre-tokenizer split pattern (PCRE2), NULL = no split */
    const char *const *regexes; /* or a sequence of n_regexes patterns (used when regex NULL) */
    int n_regexes;              /* <= KV_BPE_MAX_REGEX */
    int add_prefix_space;       /* byte-level: prepend ' ' when a segment does not start with one */
    int prepend_space;          /* SPM: prepend "▁" to each segment (normaliser Prepend) */
    int replace_space;          /* SPM: replace ' ' by "▁" (normaliser Replace / Metaspace) */
    int byte_fallback;
    int unk_id; /* -1 = none */
    int fuse_unk;
    int ignore_merges;  /* a word that is itself a token skips the merges */
    const int *special; /* [n_special] ids matched verbatim in the text (added tokens) */
    int n_special;
    const unsigned char *special_control; /* [n_special] 1 = control token, or NULL */
    kv_special_order special_order;
    const unsigned char *silent; /* [n_vocab] 1 = decodes to no text (special), or NULL */
    int bos_id, eos_id, add_bos;
} kv_bpe_spec;

/* Build a BPE tokenizer from `spec` (inputs are copied). `what` names the source file in
 * errors: KV_EINPUT for a merge naming an unknown token, a bad regex, duplicate ids.
 * Caller owns *out (kv_tokenizer_free). */
int kv_tokenizer_bpe_new(const kv_bpe_spec *spec, const char *what, kv_tokenizer **out,
                         kv_error *err);

/* Scored-piece options beyond kv_tokenizer_from_scored: the SentencePiece dummy prefix
 * (default on) and the ids that decode to no text ([vocab_size], copied; NULL keeps BOS/EOS
 * only). KV_EINTERNAL for another kind or out of memory. */
int kv_spm_configure(kv_tokenizer *t, int add_space_prefix, const unsigned char *silent,
                     kv_error *err);

/* The readers behind kv_tokenizer_load: a Hugging Face tokenizer.json (+ tokenizer_config.json
 * beside it; m may be NULL, else ids are padded to the model's vocabulary), and the
 * tokenizer.ggml.* vocabulary of a parsed GGUF file (runtime/tokenizer/tokenizer_gguf.c). */
int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_load_gguf(const struct kv_gguf *g, kv_tokenizer **out, kv_error *err);

/* Append `id` to a growing id array (*ids, *n, *cap; realloc, doubling). KV_EINTERNAL when out
 * of memory. Shared by every tokenizer kind (runtime/tokenizer/tokenizer.c). */
int kv_tok_push_id(int **ids, int *n, int *cap, int id, kv_error *err);

#endif
