/* Writes the tiny seed inputs of the fuzz targets (tests/fuzz/fuzz_*.c) into DIR/<target>/:
 * small but valid files of every format, made here from constants, so that the fuzzers start
 * inside the readers instead of at their first check. No data from ../shared is copied. Every
 * file is built in a tw_buf, the GGUF one with the tests' GGUF writer (tests/support/).
 * Usage: fuzz_seeds DIR */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "gguf_writer.h"

/* the one tiny model every seed describes: dim 8, FFN 16, 1 layer, 2 heads of 4, vocab 16 */
enum { DIM = 8, HID = 16, NL = 1, NH = 2, NKV = 2, HD = 4, VOC = 16, SEQ = 8 };
static const char *pieces[VOC] = {"<unk>", "<s>", "</s>", " ",  "a",  "b",  "c",  "d",
                                  "e",     "ab",  "cd",   " a", "ba", "de", "ed", "e "};

static char root[4096];
static void save(const char *target, const char *name, const tw_buf *b) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", root, target);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    kv_error err = {0};
    if (tw_save(b, path, &err)) {
        fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
        exit(1);
    }
}

/* weights: a small deterministic pattern */
static float w(size_t i) {
    return (float)((int)(i * 7 % 23) - 11) / 64.0f;
}
static void floats(tw_buf *b, size_t n) {
    for (size_t i = 0; i < n; i++) tw_f32(b, w(i));
}

static void seed_llama2c(void) {
    tw_buf b = {0};
    int32_t hdr[7] = {DIM, HID, NL, NH, NKV, VOC, SEQ};
    tw_put(&b, hdr, sizeof hdr);
    size_t kvd = (size_t)NKV * HD;
    floats(&b, (size_t)VOC * DIM + NL * DIM + NL * DIM * DIM + 2 * NL * kvd * DIM + NL * DIM * DIM +
                   NL * DIM + 3 * (size_t)NL * HID * DIM + DIM + (size_t)SEQ * HD);
    save("llama2c", "tiny.bin", &b);
    /* untied classifier: negative vocab_size and wcls at the end */
    int32_t neg = -VOC;
    memcpy(b.p + 20, &neg, 4);
    floats(&b, (size_t)VOC * DIM);
    save("llama2c", "tiny-untied.bin", &b);
    tw_buf_free(&b);
}

static void seed_tokenizer_bin(void) {
    tw_buf b = {0};
    unsigned char vocab_byte = VOC - 1; /* the target reads vocab = 1 + first byte */
    tw_put(&b, &vocab_byte, 1);
    tw_u32(&b, 5); /* max_token_length */
    for (int i = 0; i < VOC; i++) {
        tw_f32(&b, i < 3 ? 0.0f : -(float)i);
        tw_u32(&b, (uint32_t)strlen(pieces[i]));
        tw_put(&b, pieces[i], strlen(pieces[i]));
    }
    save("tokenizer_bin", "tok16.bin", &b);
    tw_buf_free(&b);
}

/* GGUF v3 (ggml docs/gguf.md): magic, version, tensor count, metadata count, metadata
 * key/type/value, tensor infos (name, n_dims, dims, type, offset), padding to the alignment,
 * tensor data. All tensors F32 (type 0). */
static void seed_gguf(void) {
    struct {
        const char *name;
        uint64_t ne0, ne1;
    } t[] = {
        {"token_embd.weight", DIM, VOC},        {"output_norm.weight", DIM, 0},
        {"blk.0.attn_norm.weight", DIM, 0},     {"blk.0.attn_q.weight", DIM, DIM},
        {"blk.0.attn_k.weight", DIM, NKV * HD}, {"blk.0.attn_v.weight", DIM, NKV * HD},
        {"blk.0.attn_output.weight", DIM, DIM}, {"blk.0.ffn_norm.weight", DIM, 0},
        {"blk.0.ffn_gate.weight", DIM, HID},    {"blk.0.ffn_down.weight", HID, DIM},
        {"blk.0.ffn_up.weight", DIM, HID},
    };
    const size_t nt = sizeof t / sizeof t[0];
    const uint32_t align = 32;
    tw_buf b = {0};
    tw_gguf_header(&b, 3, nt);
    tw_kv_str(&b, "general.architecture", "llama");
    tw_kv_u32(&b, "general.alignment", align);
    tw_kv_u32(&b, "llama.embedding_length", DIM);
    tw_kv_u32(&b, "llama.feed_forward_length", HID);
    tw_kv_u32(&b, "llama.block_count", NL);
    tw_kv_u32(&b, "llama.attention.head_count", NH);
    tw_kv_u32(&b, "llama.attention.head_count_kv", NKV);
    tw_kv_u32(&b, "llama.context_length", SEQ);
    tw_kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    tw_kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    tw_kv_str(&b, "tokenizer.ggml.model", "llama");
    tw_kv_array(&b, "tokenizer.ggml.tokens", TW_STRING, VOC);
    for (int i = 0; i < VOC; i++) tw_str(&b, pieces[i]);
    tw_kv_array(&b, "tokenizer.ggml.scores", TW_FLOAT32, VOC);
    for (int i = 0; i < VOC; i++) tw_f32(&b, i < 3 ? 0.0f : -(float)i);
    tw_kv_array(&b, "tokenizer.ggml.token_type", TW_INT32, VOC);
    for (int i = 0; i < VOC; i++) tw_u32(&b, i < 3 ? 3 : 1);
    tw_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    tw_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    tw_gguf_kv_count(&b);
    uint64_t off = 0;
    for (size_t k = 0; k < nt; k++) {
        tw_tensor_info(&b, t[k].name, t[k].ne1 ? 2 : 1, t[k].ne0, t[k].ne1, 0, off);
        off += (4 * t[k].ne0 * (t[k].ne1 ? t[k].ne1 : 1) + align - 1) / align * align;
    }
    tw_pad(&b, align);
    for (size_t k = 0; k < nt; k++) {
        floats(&b, t[k].ne0 * (t[k].ne1 ? t[k].ne1 : 1));
        tw_pad(&b, align);
    }
    save("gguf", "tiny.gguf", &b);
    tw_buf_free(&b);
}

static void seed_tokenizer_json(void) {
    /* byte-level BPE (GPT-2 style: "Ġ" is the space byte) and a SentencePiece-style one */
    static const char bytelevel[] =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<|endoftext|>\",\"special\":true}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"<|endoftext|>\":0,\"a\":1,\"b\":2,\"c\":3,"
        "\"d\":4,\"\\u0120\":5,\"ab\":6,\"\\u0120a\":7,\"cd\":8,\"abcd\":9,\"!\":10,"
        "\"e\":11},\"merges\":[\"a b\",\"\\u0120 a\",\"c d\",\"ab cd\"]}}";
    static const char spm[] =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
        "{\"id\":1,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
        "\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
        "\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
        "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,"
        "\"</s>\":2,\"<0x41>\":3,\"\\u2581\":4,\"a\":5,\"b\":6,\"\\u2581a\":7,\"ab\":8},"
        "\"merges\":[\"\\u2581 a\",\"a b\"]}}";
    tw_buf b = {0};
    tw_put(&b, bytelevel, sizeof bytelevel - 1);
    save("tokenizer_json", "bytelevel.json", &b);
    b.n = 0;
    tw_put(&b, spm, sizeof spm - 1);
    save("tokenizer_json", "spm.json", &b);
    tw_buf_free(&b);
}

/* safetensors (huggingface/safetensors README): u64 header length, JSON header, data */
static void seed_hf(void) {
    static const char config[] =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
        "\"hidden_size\":8,\"intermediate_size\":16,\"num_hidden_layers\":1,"
        "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"vocab_size\":16,"
        "\"max_position_embeddings\":8,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,"
        "\"hidden_act\":\"silu\",\"tie_word_embeddings\":true,\"bos_token_id\":1,"
        "\"eos_token_id\":2}";
    struct {
        const char *name;
        int r, c;
    } t[] = {
        {"model.embed_tokens.weight", VOC, DIM},
        {"model.norm.weight", 0, DIM},
        {"model.layers.0.input_layernorm.weight", 0, DIM},
        {"model.layers.0.self_attn.q_proj.weight", DIM, DIM},
        {"model.layers.0.self_attn.k_proj.weight", NKV * HD, DIM},
        {"model.layers.0.self_attn.v_proj.weight", NKV * HD, DIM},
        {"model.layers.0.self_attn.o_proj.weight", DIM, DIM},
        {"model.layers.0.post_attention_layernorm.weight", 0, DIM},
        {"model.layers.0.mlp.gate_proj.weight", HID, DIM},
        {"model.layers.0.mlp.down_proj.weight", DIM, HID},
        {"model.layers.0.mlp.up_proj.weight", HID, DIM},
    };
    const size_t nt = sizeof t / sizeof t[0];
    char hdr[4096];
    size_t hn = 0;
    size_t off = 0;
    hn += (size_t)snprintf(hdr + hn, sizeof hdr - hn, "{");
    for (size_t k = 0; k < nt; k++) {
        size_t bytes = 4 * (size_t)(t[k].r ? t[k].r : 1) * (size_t)t[k].c;
        if (t[k].r)
            hn += (size_t)snprintf(hdr + hn, sizeof hdr - hn,
                                   "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],"
                                   "\"data_offsets\":[%zu,%zu]}",
                                   k ? "," : "", t[k].name, t[k].r, t[k].c, off, off + bytes);
        else
            hn += (size_t)snprintf(hdr + hn, sizeof hdr - hn,
                                   "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],"
                                   "\"data_offsets\":[%zu,%zu]}",
                                   k ? "," : "", t[k].name, t[k].c, off, off + bytes);
        off += bytes;
    }
    hn += (size_t)snprintf(hdr + hn, sizeof hdr - hn, "}");
    tw_buf b = {0};
    uint16_t cn = (uint16_t)(sizeof config - 1);
    tw_put(&b, &cn, 2);
    tw_put(&b, config, sizeof config - 1);
    tw_u64(&b, hn);
    tw_put(&b, hdr, hn);
    floats(&b, off / 4);
    save("hf", "tiny.bin", &b);
    tw_buf_free(&b);
}

/* Programs for the structure-aware fuzz_h5 target (its comment gives the encoding): one that
 * builds a plan for a 2-layer, 2-KV-head model and one that builds a profile. */
static void seed_h5(void) {
    static const unsigned char plan[] = {
        1,                                                      /* file_kind plan */
        0, 0,  18, 1,  0, 's', 'i', 'n', 'k',                   /* / policy "sink" */
        0, 0,  19, 1,  3, 'u', 'n', 'i', 'f', 'o', 'r', 'm',    /* / allocation "uniform" */
        1, 0,  14, 3,                                           /* / ratio 0.5 */
        2, 0,  15, 64, 0, 0,   0,                               /* / context_length 64 */
        2, 0,  16, 16, 0, 0,   0,                               /* / block_size 16 */
        2, 0,  17, 16, 0, 0,   0,                               /* / evict_block 16 */
        2, 0,  8,  2,  0, 0,   0,                               /* / model_n_layers 2 */
        2, 0,  9,  2,  0, 0,   0,                               /* / model_n_kv_heads 2 */
        4, 0,  1,  2,  2, 8,   1,   16,  1,   16,  1,   24,  1, /* /budget/tokens [2, 2] */
        4, 1,  1,  2,  2, 1,   1,   1,   1,   1,   1,   2,   1, /* /budget/blocks [2, 2] */
        4, 24, 1,  2,  2, 1,   1,   1,   1,   1,   1,   1,   1, /* /budget/kv_type f16 */
        4, 25, 1,  2,  2, 0,   1,   0,   1,   0,   1,   0,   1, /* /budget/policy sink */
        2, 0,  35, 3,  0, 0,   0,                               /* / plan_schema 3 */
    };
    static const unsigned char profile[] = {
        0,                               /* file_kind profile */
        3, 2, 1, 2, 2, 3,   1,   0,   3, /* /heads/similarity [2, 2] */
        3, 3, 1, 2, 2, 3,   0,   1,   3, /* /heads/importance [2, 2] */
        3, 6, 0, 2, 1, 3,                /* /layers/similarity [2] */
        0, 0, 4, 3, 0, 'k', 'v', 'p', 'l', 'a', 'n', ' ', 'p', 'r', 'o', 'f', 'i', /* command */
    };
    tw_buf b = {0};
    tw_put(&b, plan, sizeof plan);
    save("h5", "plan.prog", &b);
    b.n = 0;
    tw_put(&b, profile, sizeof profile);
    save("h5", "profile.prog", &b);
    tw_buf_free(&b);
}

/* Task logs (fuzz_tasklog): the key the target uses, then records of its three steps (call,
 * n_out, task, values): a whole log, one with a torn last record, one of another run. */
static void tasklog_record(tw_buf *b, int32_t call, int32_t n_out, int64_t task, double v) {
    size_t start = b->n;
    tw_put(b, &call, 4);
    tw_put(b, &n_out, 4);
    tw_put(b, &task, 8);
    for (int k = 0; k < n_out; k++) {
        double x = v + k / 8.0;
        tw_put(b, &x, 8);
    }
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b->p + start, (uInt)(b->n - start));
    tw_put(b, &crc, 4);
}

static void seed_tasklog(void) {
    static const char head[] = "kvplan task log 3\nformat=fuzz-1 model=ab12 text=cd34\n";
    tw_buf b = {0};
    tw_put(&b, head, sizeof head - 1);
    for (int t = 0; t < 6; t++) tasklog_record(&b, 1, 1, t, 3.5 + t);
    for (int t = 2; t >= 0; t--) tasklog_record(&b, 2, 2, t, -1.0 + t);
    tasklog_record(&b, 3, 1, 1, 2.0);
    save("tasklog", "whole.log", &b);
    b.n -= 5; /* torn */
    save("tasklog", "torn.log", &b);
    b.n = 0;
    static const char other[] = "kvplan task log 3\nformat=fuzz-1 model=ffff text=cd34\n";
    tw_put(&b, other, sizeof other - 1);
    tasklog_record(&b, 1, 1, 0, 1.0);
    save("tasklog", "other.log", &b);
    tw_buf_free(&b);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 1;
    }
    snprintf(root, sizeof root, "%s", argv[1]);
    mkdir(root, 0777);
    seed_llama2c();
    seed_tokenizer_bin();
    seed_gguf();
    seed_tokenizer_json();
    seed_hf();
    seed_h5();
    seed_tasklog();
    return 0;
}
