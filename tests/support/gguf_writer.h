/* Test-side GGUF writer (issue 14): writes a kv_model as a GGUF v3 "llama" file with its weight
 * matrices in a chosen type, so whole-model checks can run every type on real weights.
 *
 * Layout written (ggml docs/gguf.md): header, metadata (general.architecture = "llama",
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

#include "kvplan/model.h"
#include "kvplan/quant.h"

/* Write `m` to `path` with its matrices in `type`. KV_EINPUT when a row length is not a multiple
 * of the type's block size (the message names the tensor) or the model has biases; KV_EINTERNAL
 * when the file cannot be written. *bytes (may be NULL) gets the file size. */
int tw_write_gguf(const char *path, const kv_model *m, kv_dtype type, size_t *bytes, kv_error *err);

#endif
