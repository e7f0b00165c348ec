/* Internal to runtime/: the GGUF container reader (ggml docs/gguf.md, versions 2 and 3,
 * little-endian) shared by the GGUF model loader (runtime/model/gguf.c) and the GGUF vocabulary
 * reader (runtime/tokenizer/tokenizer_gguf.c). It knows the file layout and typed metadata access;
 * it knows nothing about models or tokenizers, so the dependency runs one way: model.c -> gguf.c ->
 * gguf_meta.c <- tokenizer_gguf.c <- tokenizer.c
 *
 * File layout: "GGUF" magic, uint32 version, uint64 tensor_count, uint64 metadata_kv_count;
 * the key/value pairs (gguf string key = uint64 length + bytes, uint32 value type, value;
 * arrays carry uint32 element type + uint64 count); the tensor infos (name, uint32 n_dims,
 * uint64 ne[n_dims] innermost first, uint32 ggml type, uint64 offset relative to the data
 * section); padding to `general.alignment` (default 32); the tensor data. A file with no
 * tensors (a vocabulary-only GGUF, as llama.cpp's converter writes with --vocab-only) may end
 * right after the metadata, without padding.
 */
#ifndef KVPLAN_RUNTIME_GGUF_META_H
#define KVPLAN_RUNTIME_GGUF_META_H

#include <stddef.h>
#include <stdint.h>

#include "kvplan/common.h"

/* GGUF metadata value types (gguf.md "gguf_metadata_value_type"). */
enum {
    KV_GGUF_U8 = 0,
    KV_GGUF_I8 = 1,
    KV_GGUF_U16 = 2,
    KV_GGUF_I16 = 3,
    KV_GGUF_U32 = 4,
    KV_GGUF_I32 = 5,
    KV_GGUF_F32 = 6,
    KV_GGUF_BOOL = 7,
    KV_GGUF_STRING = 8,
    KV_GGUF_ARRAY = 9,
    KV_GGUF_U64 = 10,
    KV_GGUF_I64 = 11,
    KV_GGUF_F64 = 12,
};

/* ggml tensor types kvplan reads: kv_dtype (include/kvplan/quant.h), the ids of ggml.h's enum
 * ggml_type. */

#define KV_GGUF_MAX_DIMS 4

typedef struct kv_gguf_kv {
    const char *key; /* points into the file, not NUL-terminated */
    size_t key_len;
    uint32_t type;
    uint32_t arr_type; /* arrays only */
    uint64_t arr_n;    /* arrays only */
    size_t off;        /* file offset of the value (arrays: of the first element) */
} kv_gguf_kv;

typedef struct kv_gguf_tensor {
    const char *name; /* points into the file, not NUL-terminated */
    size_t name_len;
    uint32_t n_dims;
    uint64_t ne[KV_GGUF_MAX_DIMS]; /* innermost first; unused dimensions are 1 */
    uint32_t type;                 /* ggml type */
    uint64_t offset;               /* relative to the data section */
    size_t nbytes;
} kv_gguf_tensor;

/* A parsed GGUF file: its bytes, loaded into memory it owns (kv_file_load), and the index. */
typedef struct kv_gguf {
    const unsigned char *base; /* the whole file, owned (free) */
    size_t len;
    char path[4096];
    uint32_t version;
    int n_kv;
    kv_gguf_kv *kv; /* [n_kv], owned */
    int n_tensors;
    kv_gguf_tensor *t; /* [n_tensors], owned */
    size_t data_start; /* file offset of the tensor data section */
    double dequant_s;  /* seconds the model loader spent dequantising (runtime/model/gguf.c) */
} kv_gguf;

/* Load `path` into memory (kv_file_load: regular files only, no memory map) and parse its header
 * into a new kv_gguf the caller owns (kv_gguf_close). KV_EINPUT naming the file and the field for
 * anything malformed: bad magic, version other than 2/3 (big-endian files named as such),
 * truncation, counts that cannot fit, unknown value types, tensors with bad dimensions, unsupported
 * ggml types, offsets not aligned or past the end. Tensor types kvplan does not read
 * (kv_dtype_supported) and rows that are not whole blocks of their type are refused by name. */
int kv_gguf_open(const char *path, kv_gguf **out, kv_error *err);
/* Release g and the file's bytes. NULL is ignored. */
void kv_gguf_close(kv_gguf *g);

/* The metadata pair named `key`, or NULL. */
const kv_gguf_kv *kv_gguf_find(const kv_gguf *g, const char *key);
/* The tensor named `name`, or NULL. */
const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name);

/* Typed getters: 1 found (value in *out), 0 absent, -1 present with a wrong type (err set,
 * KV_EINPUT, naming the file and key). Integers accept every integer type and bool; floats
 * accept F32, F64 and integers; strings are copied into buf, truncated to cap-1 bytes. */
int kv_gguf_get_int(const kv_gguf *g, const char *key, int64_t *out, kv_error *err);
int kv_gguf_get_float(const kv_gguf *g, const char *key, double *out, kv_error *err);
int kv_gguf_get_str(const kv_gguf *g, const char *key, char *buf, size_t cap, kv_error *err);

/* The strings of array `key` as NUL-terminated copies: *out[n] (caller frees with
 * kv_gguf_free_strings). Missing, not an array of strings, or more than 2^24 entries ->
 * KV_EINPUT naming the key. */
int kv_gguf_get_strings(const kv_gguf *g, const char *key, char ***out, int *n, kv_error *err);
void kv_gguf_free_strings(char **s, int n);

/* Numeric array `key` converted to float[n] (any numeric element type), caller frees. Absent
 * -> *out = NULL and KV_OK; not numeric or a count other than n -> KV_EINPUT. */
int kv_gguf_get_floats(const kv_gguf *g, const char *key, int n, float **out, kv_error *err);

#endif
