/* The tests' one GGUF writer (ggml docs/gguf.md), in two layers:
 *
 *  - a byte buffer (tw_buf) with the GGUF encodings: little-endian scalars, strings (u64 length
 *    + bytes), metadata entries (key, value type, value), array headers, tensor infos, padding
 *    to the alignment. Hand-built files (tests/test_gguf.c's synthetic and corrupted files, the
 *    fuzz seeds of tests/fuzz/fuzz_seeds.c) are written with it byte by byte;
 *  - tw_write_gguf: a whole kv_model as a GGUF v3 "llama" file with its weight matrices in a
 *    chosen type, so whole-model checks can run every type on real weights.
 *
 * tw_write_gguf's layout: header, metadata (general.architecture = "llama",
 * general.alignment = 32, llama.{embedding_length, feed_forward_length, block_count,
 * attention.head_count, attention.head_count_kv, context_length,
 * attention.layer_norm_rms_epsilon, rope.freq_base, vocab_size}, tokenizer.ggml.{bos,eos}_token_id
 * when known), tensor infos with llama.cpp's names (token_embd, output_norm, output when untied,
 * blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}),
 * then the data, every tensor at a 32-byte aligned offset. The nine matrices and the embedding
 * are written in `type` (quantised by kv_quantize_row), the norms in F32. A model in the
 * rotate-half RoPE layout (Hugging Face) gets its Q and K rows permuted to the adjacent-pairs
 * layout a GGUF llama file uses (as llama.cpp's converter does), so it loads back equivalent.
 * Models with attention biases (qwen2) are refused. */
#ifndef KVPLAN_TESTS_GGUF_WRITER_H
#define KVPLAN_TESTS_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/model.h"
#include "kvplan/quant.h"

/* GGUF metadata value types (ggml gguf.h enum gguf_type). */
enum {
    TW_UINT8 = 0,
    TW_INT8 = 1,
    TW_UINT16 = 2,
    TW_INT16 = 3,
    TW_UINT32 = 4,
    TW_INT32 = 5,
    TW_FLOAT32 = 6,
    TW_BOOL = 7,
    TW_STRING = 8,
    TW_ARRAY = 9,
    TW_UINT64 = 10,
    TW_INT64 = 11,
    TW_FLOAT64 = 12,
};

/* A growing byte buffer. p is malloc'ed and owned by the buffer (tw_buf_free); n bytes written.
 * An allocation failure sets `failed` and drops every later write; tw_save reports it. n_kv
 * counts the metadata entries written since tw_gguf_header. Zero-initialise before use. */
typedef struct tw_buf {
    unsigned char *p;
    size_t n, cap;
    uint64_t n_kv;
    int failed;
} tw_buf;

void tw_buf_free(tw_buf *b);
/* Append n bytes (little-endian scalars: this machine's order, x86-64). */
void tw_put(tw_buf *b, const void *p, size_t n);
void tw_u32(tw_buf *b, uint32_t v);
void tw_u64(tw_buf *b, uint64_t v);
void tw_f32(tw_buf *b, float v);
/* A GGUF string: u64 byte length, then the bytes (no terminator). */
void tw_str(tw_buf *b, const char *s);
/* Zero bytes up to the next multiple of `align` bytes from the buffer's start. */
void tw_pad(tw_buf *b, size_t align);

/* GGUF header: "GGUF", u32 version, u64 tensor count, u64 metadata count (0 here; set by
 * tw_gguf_kv_count from n_kv). Resets n_kv. */
void tw_gguf_header(tw_buf *b, uint32_t version, uint64_t n_tensors);
/* Write n_kv into the header's metadata count (bytes 16..23). */
void tw_gguf_kv_count(tw_buf *b);
/* A metadata entry's key and value type; the caller writes the value (counted in n_kv). */
void tw_key(tw_buf *b, const char *key, uint32_t type);
void tw_kv_u32(tw_buf *b, const char *key, uint32_t v);
void tw_kv_f32(tw_buf *b, const char *key, float v);
void tw_kv_str(tw_buf *b, const char *key, const char *v);
/* An array entry's key and header (type ARRAY, element type, count); the caller writes the
 * count elements (strings with tw_str). */
void tw_kv_array(tw_buf *b, const char *key, uint32_t elem_type, uint64_t count);
/* A tensor info: name, n_dims (1 or 2), ne0 (the row length) and, for 2-D, ne1 (the rows),
 * ggml type id, data offset in bytes from the start of the data section. */
void tw_tensor_info(tw_buf *b, const char *name, int n_dims, uint64_t ne0, uint64_t ne1,
                    uint32_t type, uint64_t offset);

/* Write the buffer to `path` (created or truncated). KV_EINTERNAL, naming the path, when the
 * buffer had an allocation failure or the file cannot be written. */
int tw_save(const tw_buf *b, const char *path, kv_error *err);

/* Write `m` to `path` with its matrices in `type`. KV_EINPUT when a row length is not a multiple
 * of the type's block size (the message names the tensor) or the model has biases; KV_EINTERNAL
 * when the file cannot be written. *bytes (may be NULL) gets the file size. */
int tw_write_gguf(const char *path, const kv_model *m, kv_dtype type, size_t *bytes, kv_error *err);
/* The same with a placeholder SentencePiece vocabulary of vocab_size tokens (<unk>, <s>, </s>,
 * the 256 byte tokens, then "t<id>"; bos 1, eos 2), which llama.cpp needs to load a file (the
 * peer benchmark, bench/peer_llamacpp.sh; token ids are fed directly). KV_EINPUT below 260. */
int tw_write_gguf_vocab(const char *path, const kv_model *m, kv_dtype type, size_t *bytes,
                        kv_error *err);

#endif
