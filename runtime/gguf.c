/* GGUF loader (ggml docs/gguf.md, versions 2 and 3, little-endian).
 *
 * File layout: "GGUF" magic, uint32 version, uint64 tensor_count, uint64 metadata_kv_count;
 * the key/value pairs (gguf string key = uint64 length + bytes, uint32 value type, value;
 * arrays carry uint32 element type + uint64 count); the tensor infos (name, uint32 n_dims,
 * uint64 ne[n_dims] innermost first, uint32 ggml type, uint64 offset relative to the data
 * section); padding to `general.alignment` (default 32); the tensor data.
 *
 * A ggml tensor with ne = [in, out] is the row-major matrix [out, in], the kv_model layout.
 * Weight matrices stay in their file's type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K; layouts: include/kvplan/quant.h), in place in the memory map; norms and
 * biases in another type than F32 are dequantised on load (runtime/quant.c) into buffers the
 * model owns. GGUF conversions of llama models permute the
 * Q and K rows for RoPE on adjacent pairs (KV_ROPE_ADJACENT); qwen2 conversions keep the
 * rotate-half layout (KV_ROPE_HALF).
 *
 * The metadata table is kept (model->gguf, pointing into the map) for the embedded tokenizer:
 * tokenizer.ggml.model "llama" (scored pieces, runtime/tokenizer.c) or "gpt2" (merges,
 * byte-level, runtime/tokenizer_bpe.c).
 */
#include "kvplan/model.h"
#include "kvplan/quant.h"
#include "kvplan/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer_bpe.h"

enum {
    GT_U8 = 0,
    GT_I8 = 1,
    GT_U16 = 2,
    GT_I16 = 3,
    GT_U32 = 4,
    GT_I32 = 5,
    GT_F32 = 6,
    GT_BOOL = 7,
    GT_STRING = 8,
    GT_ARRAY = 9,
    GT_U64 = 10,
    GT_I64 = 11,
    GT_F64 = 12,
};

#define GGUF_MAX_DIMS 4

typedef struct gguf_kv {
    const char *key;
    size_t key_len;
    uint32_t type;
    uint32_t arr_type; /* arrays only */
    uint64_t arr_n;    /* arrays only */
    size_t off;        /* offset of the value (arrays: of the first element) */
} gguf_kv;

typedef struct gguf_tensor {
    const char *name;
    size_t name_len;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t offset; /* relative to the data section */
    size_t nbytes;
} gguf_tensor;

/* Kept in model->gguf; points into the model's memory map (not owned). */
typedef struct kv_gguf_meta {
    const unsigned char *base;
    size_t len;
    char path[4096];
    uint32_t version;
    int n_kv;
    gguf_kv *kv; /* owned */
    int n_tensors;
    gguf_tensor *t; /* owned */
    size_t data_start;
    double dequant_s; /* seconds spent converting non-F32 norms/biases to fp32 on load */
} kv_gguf_meta;

void kv_gguf_meta_free(void *meta) {
    kv_gguf_meta *g = meta;
    if (!g) return;
    free(g->kv);
    free(g->t);
    free(g);
}

/* Seconds the last load of `m` spent dequantising (0 for other formats). For measurements. */
double kv_gguf_dequant_seconds(const kv_model *m);
double kv_gguf_dequant_seconds(const kv_model *m) {
    const kv_gguf_meta *g = m && strcmp(m->format, "gguf") == 0 ? m->gguf : NULL;
    return g ? g->dequant_s : 0.0;
}

/* ---- bounds-checked reader ---- */
typedef struct rd {
    const unsigned char *p;
    size_t len, off;
    const char *path;
    kv_error *err;
} rd;

static int need(rd *r, size_t n, const char *field) {
    if (r->off > r->len || r->len - r->off < n)
        return kv_fail(r->err, KV_EINPUT,
                       "%s: truncated GGUF header: %s at byte %zu needs %zu bytes but the file "
                       "has %zu",
                       r->path, field, r->off, n, r->len);
    return KV_OK;
}
static int rd_u32(rd *r, uint32_t *v, const char *field) {
    if (need(r, 4, field)) return KV_EINPUT;
    memcpy(v, r->p + r->off, 4);
    r->off += 4;
    return KV_OK;
}
static int rd_u64(rd *r, uint64_t *v, const char *field) {
    if (need(r, 8, field)) return KV_EINPUT;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return KV_OK;
}
static int rd_str(rd *r, const char **s, size_t *n, const char *field) {
    uint64_t len;
    if (rd_u64(r, &len, field)) return KV_EINPUT;
    if (len > r->len - r->off)
        return kv_fail(r->err, KV_EINPUT,
                       "%s: truncated or corrupt GGUF header: %s at byte %zu is a string of "
                       "%llu bytes but only %zu remain in the file",
                       r->path, field, r->off - 8, (unsigned long long)len, r->len - r->off);
    *s = (const char *)r->p + r->off;
    *n = (size_t)len;
    r->off += (size_t)len;
    return KV_OK;
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GT_U8:
    case GT_I8:
    case GT_BOOL:
        return 1;
    case GT_U16:
    case GT_I16:
        return 2;
    case GT_U32:
    case GT_I32:
    case GT_F32:
        return 4;
    case GT_U64:
    case GT_I64:
    case GT_F64:
        return 8;
    default:
        return 0;
    }
}

static int skip_value(rd *r, uint32_t type, const char *key) {
    char field[160];
    snprintf(field, sizeof field, "value of '%.120s'", key);
    if (type == GT_STRING) {
        const char *s;
        size_t n;
        return rd_str(r, &s, &n, field);
    }
    size_t sz = scalar_size(type);
    if (!sz)
        return kv_fail(r->err, KV_EINPUT, "%s: metadata '%s' has unknown value type %u", r->path,
                       key, type);
    return need(r, sz, field) ? KV_EINPUT : (r->off += sz, KV_OK);
}

static int parse_kv(rd *r, gguf_kv *kv) {
    const char *k;
    size_t kn;
    if (rd_str(r, &k, &kn, "metadata key")) return KV_EINPUT;
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(kn < 120 ? kn : 120), k);
    kv->key = k;
    kv->key_len = kn;
    char field[160];
    snprintf(field, sizeof field, "type of '%.120s'", key);
    if (rd_u32(r, &kv->type, field)) return KV_EINPUT;
    if (kv->type == GT_ARRAY) {
        snprintf(field, sizeof field, "array header of '%.120s'", key);
        if (rd_u32(r, &kv->arr_type, field) || rd_u64(r, &kv->arr_n, field)) return KV_EINPUT;
        if (kv->arr_type == GT_ARRAY)
            return kv_fail(r->err, KV_EINPUT,
                           "%s: metadata '%s' is an array of arrays, which "
                           "kvplan does not read",
                           r->path, key);
        kv->off = r->off;
        if (kv->arr_type != GT_STRING) {
            size_t sz = scalar_size(kv->arr_type);
            if (!sz)
                return kv_fail(r->err, KV_EINPUT,
                               "%s: metadata '%s' has unknown array element "
                               "type %u",
                               r->path, key, kv->arr_type);
            if (kv->arr_n > (r->len / sz) + 1) return need(r, (size_t)-1, field);
            snprintf(field, sizeof field, "array data of '%.120s'", key);
            if (need(r, (size_t)kv->arr_n * sz, field)) return KV_EINPUT;
            r->off += (size_t)kv->arr_n * sz;
        } else {
            if (kv->arr_n > r->len / 8 + 1) return need(r, (size_t)-1, field);
            for (uint64_t i = 0; i < kv->arr_n; i++)
                if (skip_value(r, GT_STRING, key)) return KV_EINPUT;
        }
        return KV_OK;
    }
    kv->off = r->off;
    return skip_value(r, kv->type, key);
}

static const gguf_kv *find_kv(const kv_gguf_meta *g, const char *key) {
    size_t n = strlen(key);
    for (int i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0) return &g->kv[i];
    return NULL;
}

/* Integer metadata of any integer type; 1 found, 0 absent, -1 wrong type (err set). */
static int meta_int(const kv_gguf_meta *g, const char *key, int64_t *out, kv_error *err) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return 0;
    const unsigned char *p = g->base + kv->off;
    switch (kv->type) {
    case GT_U8:
        *out = p[0];
        return 1;
    case GT_I8:
        *out = (int8_t)p[0];
        return 1;
    case GT_BOOL:
        *out = p[0] != 0;
        return 1;
    case GT_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case GT_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case GT_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case GT_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case GT_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        *out = (int64_t)v;
        return 1;
    }
    case GT_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return 1;
    }
    default:
        kv_fail(err, KV_EINPUT, "%s: metadata '%s' has value type %u, expected an integer", g->path,
                key, kv->type);
        return -1;
    }
}

static int meta_float(const kv_gguf_meta *g, const char *key, double *out, kv_error *err) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return 0;
    const unsigned char *p = g->base + kv->off;
    if (kv->type == GT_F32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    if (kv->type == GT_F64) {
        memcpy(out, p, 8);
        return 1;
    }
    int64_t i;
    int rc = meta_int(g, key, &i, err);
    if (rc == 1)
        *out = (double)i;
    else if (rc < 0)
        kv_fail(err, KV_EINPUT, "%s: metadata '%s' has value type %u, expected a number", g->path,
                key, kv->type);
    return rc;
}

/* String metadata copied into buf (truncated to cap-1); 1 found, 0 absent, -1 wrong type. */
static int meta_str(const kv_gguf_meta *g, const char *key, char *buf, size_t cap, kv_error *err) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return 0;
    if (kv->type != GT_STRING) {
        kv_fail(err, KV_EINPUT, "%s: metadata '%s' has value type %u, expected a string", g->path,
                key, kv->type);
        return -1;
    }
    uint64_t n;
    memcpy(&n, g->base + kv->off, 8);
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), (const char *)g->base + kv->off + 8);
    return 1;
}

/* Bytes of tensor t's data from its type and shape (runtime/quant.c): rows of ne[0] elements in
 * whole blocks. Unsupported types and rows that are not a multiple of the block size fail here,
 * naming the tensor. */
static int tensor_nbytes(const char *path, gguf_tensor *t, kv_error *err) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] == 0 || n > ((uint64_t)1 << 40) / t->ne[d])
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%.*s': dimension %u (%llu) is not "
                           "sensible",
                           path, (int)t->name_len, t->name, d, (unsigned long long)t->ne[d]);
        n *= t->ne[d];
    }
    char what[4300];
    snprintf(what, sizeof what, "%s: tensor '%.*s'", path, (int)t->name_len, t->name);
    if (!kv_dtype_supported(t->type))
        return kv_fail(err, KV_EINPUT,
                       "%s has ggml type %u (%s), which kvplan does not read (supported: F32, "
                       "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); convert or "
                       "quantise the model to one of those",
                       what, t->type, kv_dtype_name(t->type));
    size_t row;
    if (kv_dtype_row_bytes((kv_dtype)t->type, (int64_t)t->ne[0], what, &row, err)) return KV_EINPUT;
    t->nbytes = row * (size_t)(n / t->ne[0]);
    return KV_OK;
}

/* Parse the header of the mapped file into g (kv table, tensor table, data section). */
static int parse_header(kv_gguf_meta *g, kv_error *err) {
    rd r = {g->base, g->len, 0, g->path, err};
    if (g->len < 4 || memcmp(g->base, "GGUF", 4) != 0)
        return kv_fail(err, KV_EINPUT, "%s: not a GGUF file: the magic is not \"GGUF\"", g->path);
    r.off = 4;
    if (rd_u32(&r, &g->version, "version")) return KV_EINPUT;
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version != 0)
            return kv_fail(err, KV_EINPUT,
                           "%s: GGUF version field reads %u: a big-endian GGUF "
                           "file, which kvplan does not read",
                           g->path, g->version);
        return kv_fail(err, KV_EINPUT,
                       "%s: GGUF version %u is not supported (kvplan reads "
                       "versions 2 and 3)%s",
                       g->path, g->version,
                       g->version == 1 ? "; re-convert this v1 file with a current llama.cpp" : "");
    }
    uint64_t n_t, n_kv;
    if (rd_u64(&r, &n_t, "tensor_count") || rd_u64(&r, &n_kv, "metadata_kv_count"))
        return KV_EINPUT;
    /* every kv needs >= 12 bytes and every tensor info >= 24 */
    if (n_kv > g->len / 12 || n_t > g->len / 24)
        return kv_fail(err, KV_EINPUT,
                       "%s: header counts (%llu tensors, %llu metadata pairs) "
                       "cannot fit in a %zu-byte file: corrupt or truncated",
                       g->path, (unsigned long long)n_t, (unsigned long long)n_kv, g->len);
    g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
    g->t = calloc((size_t)n_t + 1, sizeof *g->t);
    if (!g->kv || !g->t) return kv_fail(err, KV_EINTERNAL, "out of memory (GGUF header)");
    for (uint64_t i = 0; i < n_kv; i++) {
        if (parse_kv(&r, &g->kv[i])) return KV_EINPUT;
        g->n_kv++;
    }
    uint64_t align = 32;
    int64_t a;
    int got = meta_int(g, "general.alignment", &a, err);
    if (got < 0) return KV_EINPUT;
    if (got) {
        if (a <= 0 || (a & (a - 1)) || a > (1 << 20))
            return kv_fail(err, KV_EINPUT, "%s: general.alignment %lld is not a power of two",
                           g->path, (long long)a);
        align = (uint64_t)a;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        gguf_tensor *t = &g->t[i];
        if (rd_str(&r, &t->name, &t->name_len, "tensor name")) return KV_EINPUT;
        char field[160];
        snprintf(field, sizeof field, "tensor info of '%.*s'",
                 (int)(t->name_len < 100 ? t->name_len : 100), t->name);
        if (rd_u32(&r, &t->n_dims, field)) return KV_EINPUT;
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
            return kv_fail(err, KV_EINPUT, "%s: tensor '%.*s' has %u dimensions (1..4 allowed)",
                           g->path, (int)t->name_len, t->name, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (rd_u64(&r, &t->ne[d], field)) return KV_EINPUT;
        for (uint32_t d = t->n_dims; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        if (rd_u32(&r, &t->type, field) || rd_u64(&r, &t->offset, field)) return KV_EINPUT;
        g->n_tensors++;
    }
    g->data_start = (r.off + align - 1) / align * align;
    if (g->data_start > g->len)
        return kv_fail(err, KV_EINPUT,
                       "%s: the file ends (%zu bytes) before its tensor data "
                       "section starts (byte %zu): truncated",
                       g->path, g->len, g->data_start);
    size_t data_len = g->len - g->data_start;
    for (int i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->t[i];
        if (tensor_nbytes(g->path, t, err)) return KV_EINPUT;
        if (t->offset % align)
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%.*s': offset %llu is not a multiple of "
                           "the alignment %llu",
                           g->path, (int)t->name_len, t->name, (unsigned long long)t->offset,
                           (unsigned long long)align);
        if (t->offset > data_len)
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%.*s': offset %llu is past the end of "
                           "the tensor data (%zu bytes)",
                           g->path, (int)t->name_len, t->name, (unsigned long long)t->offset,
                           data_len);
        if (t->nbytes > data_len - t->offset)
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%.*s': data [%llu, %llu) extends past "
                           "the end of the tensor data (%zu bytes): the file is truncated",
                           g->path, (int)t->name_len, t->name, (unsigned long long)t->offset,
                           (unsigned long long)(t->offset + t->nbytes), data_len);
    }
    return KV_OK;
}

static const gguf_tensor *find_tensor(const kv_gguf_meta *g, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < g->n_tensors; i++)
        if (g->t[i].name_len == n && memcmp(g->t[i].name, name, n) == 0) return &g->t[i];
    return NULL;
}

/* Tensor `name` expected to be [rows, cols] row-major (ne = [cols, rows]; a 1-D tensor has
 * rows = 1). With `wout` (matrices): the tensor in its own type, in place in the memory map
 * (issue 14: weights stay in their file's type). With `out` (norms, biases): an fp32 view, F32
 * in place, other types dequantised into a buffer the model adopts. Absent and optional: NULL
 * data and KV_OK. */
static int get_weight(kv_model *m, kv_gguf_meta *g, const char *name, uint64_t rows, uint64_t cols,
                      int optional, const char *why, const float **out, kv_weight *wout,
                      kv_error *err) {
    if (out) *out = NULL;
    if (wout) wout->data = NULL, wout->type = KV_DT_F32;
    const gguf_tensor *t = find_tensor(g, name);
    if (!t) {
        if (optional) return KV_OK;
        return kv_fail(err, KV_EINPUT, "%s: tensor '%s' is missing (%s)", g->path, name, why);
    }
    int ok = t->ne[0] == cols && t->ne[1] == rows && t->ne[2] == 1 && t->ne[3] == 1;
    if (rows == 1) ok = t->n_dims == 1 && t->ne[0] == cols;
    if (!ok) {
        char shape[96] = "";
        size_t k = 0;
        for (uint32_t d = 0; d < t->n_dims && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, d ? ", %llu" : "%llu",
                                  (unsigned long long)t->ne[d]);
        if (rows == 1)
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%s' has ne [%s] but the config (%s) "
                           "needs [%llu]",
                           g->path, name, shape, why, (unsigned long long)cols);
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s' has ne [%s] but the config (%s) needs "
                       "[%llu, %llu]",
                       g->path, name, shape, why, (unsigned long long)cols,
                       (unsigned long long)rows);
    }
    const unsigned char *src = g->base + g->data_start + t->offset;
    size_t n = (size_t)(rows * cols);
    if (wout && (t->type != KV_DT_F32 || ((uintptr_t)src % sizeof(float)) == 0)) {
        wout->data = src; /* tensor_nbytes checked the type and the row's whole blocks */
        wout->type = (kv_dtype)t->type;
        return KV_OK;
    }
    if (t->type == KV_DT_F32 && ((uintptr_t)src % sizeof(float)) == 0) {
        *out = (const float *)(const void *)src;
        return KV_OK;
    }
    float *dst = kv_malloc(n * sizeof *dst, name, err);
    if (!dst) return KV_EINTERNAL;
    double t0 = kv_now();
    /* tensor_nbytes checked the type and that ne[0] is a whole number of blocks */
    if (kv_dequantize_row((kv_dtype)t->type, src, dst, (int64_t)n, err)) {
        free(dst);
        return kv_fail_context(err, "%s: tensor '%s'", g->path, name);
    }
    g->dequant_s += kv_now() - t0;
    if (kv_model_adopt(m, dst, err)) return KV_EINTERNAL;
    if (wout)
        *wout = kv_weight_f32(dst);
    else
        *out = dst;
    return KV_OK;
}

/* Required positive integer "<arch>.<suffix>" (or optional with a default when dflt >= 0). */
static int arch_int(const kv_gguf_meta *g, const char *arch, const char *suffix, int64_t dflt,
                    int *out, kv_error *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    int got = meta_int(g, key, &v, err);
    if (got < 0) return KV_EINPUT;
    if (!got) {
        if (dflt >= 0) {
            *out = (int)dflt;
            return KV_OK;
        }
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is missing", g->path, key);
    }
    if (v <= 0 || v > (1 << 24))
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' = %lld is not sensible", g->path, key,
                       (long long)v);
    *out = (int)v;
    return KV_OK;
}

static int load_config(kv_gguf_meta *g, kv_config *c, kv_error *err) {
    memset(c, 0, sizeof *c);
    char arch[sizeof((kv_config *)0)->arch] = "";
    int got = meta_str(g, "general.architecture", arch, sizeof arch, err);
    if (got < 0) return KV_EINPUT;
    if (!got)
        return kv_fail(err, KV_EINPUT, "%s: metadata 'general.architecture' is missing", g->path);
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2") != 0)
        return kv_fail(err, KV_EINPUT,
                       "%s: general.architecture '%s' is not supported (kvplan "
                       "reads llama and qwen2)",
                       g->path, arch);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    if (arch_int(g, arch, "embedding_length", -1, &c->dim, err) ||
        arch_int(g, arch, "feed_forward_length", -1, &c->hidden_dim, err) ||
        arch_int(g, arch, "block_count", -1, &c->n_layers, err) ||
        arch_int(g, arch, "attention.head_count", -1, &c->n_heads, err) ||
        arch_int(g, arch, "context_length", -1, &c->seq_len, err))
        return KV_EINPUT;
    if (arch_int(g, arch, "attention.head_count_kv", c->n_heads, &c->n_kv_heads, err))
        return KV_EINPUT;
    if (c->dim % c->n_heads)
        return kv_fail(err, KV_EINPUT,
                       "%s: %s.embedding_length %d is not a multiple of "
                       "%s.attention.head_count %d",
                       g->path, arch, c->dim, arch, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    char key[160];
    int64_t kl;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    got = meta_int(g, key, &kl, err);
    if (got < 0) return KV_EINPUT;
    if (got && kl != c->head_dim)
        return kv_fail(err, KV_EINPUT,
                       "%s: %s = %lld differs from embedding_length / head_count "
                       "= %d, which kvplan does not support",
                       g->path, key, (long long)kl, c->head_dim);
    int rot;
    if (arch_int(g, arch, "rope.dimension_count", c->head_dim, &rot, err)) return KV_EINPUT;
    if (rot != c->head_dim)
        return kv_fail(err, KV_EINPUT,
                       "%s: %s.rope.dimension_count %d is not the head size %d "
                       "(partial rotary embeddings are not supported)",
                       g->path, arch, rot, c->head_dim);
    double v;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    got = meta_float(g, key, &v, err);
    if (got < 0) return KV_EINPUT;
    if (!got) return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is missing", g->path, key);
    c->norm_eps = (float)v;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    got = meta_float(g, key, &v, err);
    if (got < 0) return KV_EINPUT;
    c->rope_theta = got ? (float)v : 10000.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char scaling[32] = "";
    if (meta_str(g, key, scaling, sizeof scaling, err) < 0) return KV_EINPUT;
    if (scaling[0] && strcmp(scaling, "none") != 0)
        return kv_fail(err, KV_EINPUT, "%s: %s = '%s': RoPE scaling is not supported", g->path, key,
                       scaling);
    c->rope_layout = strcmp(arch, "qwen2") == 0 ? KV_ROPE_HALF : KV_ROPE_ADJACENT;
    c->attn_bias = strcmp(arch, "qwen2") == 0;
    int64_t id;
    c->bos_id = c->eos_id = -1;
    if ((got = meta_int(g, "tokenizer.ggml.bos_token_id", &id, err)) < 0) return KV_EINPUT;
    if (got && id >= 0 && id < (1 << 24)) c->bos_id = (int)id;
    if ((got = meta_int(g, "tokenizer.ggml.eos_token_id", &id, err)) < 0) return KV_EINPUT;
    if (got && id >= 0 && id < (1 << 24)) c->eos_id = (int)id;
    return KV_OK;
}

static int map_file(const char *path, kv_gguf_meta *g, void **map, kv_error *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kv_fail(err, KV_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return kv_fail(err, KV_EINPUT, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (st.st_size < 24) {
        close(fd);
        return kv_fail(err, KV_EINPUT, "%s: %lld bytes is too short for a GGUF header (24)", path,
                       (long long)st.st_size);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return kv_fail(err, KV_EINTERNAL, "%s: mmap failed: %s", path, strerror(errno));
    *map = p;
    g->base = p;
    g->len = (size_t)st.st_size;
    return KV_OK;
}

int kv_model_load_gguf(const char *path, kv_model **out, kv_error *err) {
    *out = NULL;
    kv_gguf_meta *g = kv_calloc(1, sizeof *g, "GGUF metadata", err);
    if (!g) return KV_EINTERNAL;
    snprintf(g->path, sizeof g->path, "%s", path);
    void *map = NULL;
    int rc = map_file(path, g, &map, err);
    if (rc) {
        kv_gguf_meta_free(g);
        return rc;
    }
    kv_config c;
    rc = parse_header(g, err);
    if (!rc) rc = load_config(g, &c, err);
    /* the vocabulary size: llama.vocab_size, else the token list, else the embedding */
    if (!rc) {
        char key[96];
        snprintf(key, sizeof key, "%s.vocab_size", c.arch);
        int64_t v;
        int got = meta_int(g, key, &v, err);
        const gguf_kv *toks = find_kv(g, "tokenizer.ggml.tokens");
        const gguf_tensor *emb = find_tensor(g, "token_embd.weight");
        if (got < 0)
            rc = KV_EINPUT;
        else if (got)
            c.vocab_size = (int)v;
        else if (toks && toks->type == GT_ARRAY)
            c.vocab_size = (int)toks->arr_n;
        else if (emb)
            c.vocab_size = (int)emb->ne[1];
        else
            rc = kv_fail(err, KV_EINPUT, "%s: tensor 'token_embd.weight' is missing", path);
    }
    if (!rc) rc = kv_config_check(&c, path, err);
    kv_model *m = NULL;
    if (!rc && !(m = kv_model_alloc(c.n_layers, err))) rc = KV_EINTERNAL;
    if (rc) {
        munmap(map, g->len);
        kv_gguf_meta_free(g);
        return rc;
    }
    m->map = map;
    m->map_len = g->len;
    m->gguf = g;
    m->cfg = c;
    snprintf(m->format, sizeof m->format, "gguf");
    uint64_t d = (uint64_t)c.dim, V = (uint64_t)c.vocab_size, hid = (uint64_t)c.hidden_dim,
             q = (uint64_t)c.n_heads * c.head_dim, kvd = (uint64_t)c.n_kv_heads * c.head_dim;
    rc = get_weight(m, g, "token_embd.weight", V, d, 0, "vocab_size x embedding_length", NULL,
                    &m->tok_emb, err);
    if (!rc)
        rc = get_weight(m, g, "output_norm.weight", 1, d, 0, "embedding_length", &m->final_norm,
                        NULL, err);
    if (!rc)
        rc = get_weight(m, g, "output.weight", V, d, 1, "vocab_size x embedding_length", NULL,
                        &m->classifier, err);
    if (!rc && !m->classifier.data) {
        m->classifier = m->tok_emb;
        m->cfg.tied_embeddings = 1;
    }
    for (int l = 0; l < c.n_layers && !rc; l++) {
        kv_layer_weights *w = &m->layers[l];
        char name[96];
        struct {
            const char *suffix;
            uint64_t rows, cols;
            int optional;
            const char *why;
            const float **dst;
            kv_weight *wdst;
        } spec[] = {
            {"attn_norm.weight", 1, d, 0, "embedding_length", &w->attn_norm, NULL},
            {"attn_q.weight", q, d, 0, "head_count*head_dim x embedding_length", NULL, &w->wq},
            {"attn_k.weight", kvd, d, 0, "head_count_kv*head_dim x embedding_length", NULL, &w->wk},
            {"attn_v.weight", kvd, d, 0, "head_count_kv*head_dim x embedding_length", NULL, &w->wv},
            {"attn_output.weight", d, q, 0, "embedding_length x head_count*head_dim", NULL, &w->wo},
            {"attn_q.bias", 1, q, !c.attn_bias, "head_count*head_dim", &w->bq, NULL},
            {"attn_k.bias", 1, kvd, !c.attn_bias, "head_count_kv*head_dim", &w->bk, NULL},
            {"attn_v.bias", 1, kvd, !c.attn_bias, "head_count_kv*head_dim", &w->bv, NULL},
            {"ffn_norm.weight", 1, d, 0, "embedding_length", &w->ffn_norm, NULL},
            {"ffn_gate.weight", hid, d, 0, "feed_forward_length x embedding_length", NULL,
             &w->w_gate},
            {"ffn_down.weight", d, hid, 0, "embedding_length x feed_forward_length", NULL,
             &w->w_down},
            {"ffn_up.weight", hid, d, 0, "feed_forward_length x embedding_length", NULL, &w->w_up},
        };
        for (size_t k = 0; k < sizeof spec / sizeof spec[0] && !rc; k++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, spec[k].suffix);
            rc = get_weight(m, g, name, spec[k].rows, spec[k].cols, spec[k].optional, spec[k].why,
                            spec[k].dst, spec[k].wdst, err);
        }
    }
    if (!rc) rc = kv_sha256_file(path, m->sha256, err);
    if (rc) {
        kv_model_free(m);
        return rc;
    }
    *out = m;
    return KV_OK;
}

/* ---- embedded tokenizer ---- */

/* The strings of array metadata `key` as NUL-terminated copies (caller frees each and the
 * array); *n gets the count. Missing or wrong type -> KV_EINPUT naming the key. */
static int meta_strings(const kv_gguf_meta *g, const char *key, char ***out, int *n,
                        kv_error *err) {
    *out = NULL;
    *n = 0;
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is missing", g->path, key);
    if (kv->type != GT_ARRAY || kv->arr_type != GT_STRING)
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is not an array of strings", g->path,
                       key);
    if (kv->arr_n > (1u << 24))
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' has %llu entries, too many", g->path, key,
                       (unsigned long long)kv->arr_n);
    char **s = calloc((size_t)kv->arr_n + 1, sizeof *s);
    if (!s) return kv_fail(err, KV_EINTERNAL, "out of memory (%s)", key);
    size_t off = kv->off;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t len;
        memcpy(&len, g->base + off, 8); /* bounds were checked by parse_kv */
        s[i] = malloc((size_t)len + 1);
        if (!s[i]) {
            for (uint64_t j = 0; j < i; j++) free(s[j]);
            free(s);
            return kv_fail(err, KV_EINTERNAL, "out of memory (%s)", key);
        }
        memcpy(s[i], g->base + off + 8, (size_t)len);
        s[i][len] = '\0';
        off += 8 + (size_t)len;
    }
    *out = s;
    *n = (int)kv->arr_n;
    return KV_OK;
}

static void free_strings(char **s, int n) {
    if (!s) return;
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

/* Numeric array metadata `key` converted to floats (any numeric element type); NULL when
 * absent (KV_OK). Wrong type or count -> KV_EINPUT. */
static int meta_floats(const kv_gguf_meta *g, const char *key, int n, float **out, kv_error *err) {
    *out = NULL;
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return KV_OK;
    size_t sz = kv->type == GT_ARRAY ? scalar_size(kv->arr_type) : 0;
    if (!sz || kv->arr_type == GT_BOOL)
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is not a numeric array", g->path, key);
    if (kv->arr_n != (uint64_t)n)
        return kv_fail(err, KV_EINPUT,
                       "%s: metadata '%s' has %llu entries but "
                       "tokenizer.ggml.tokens has %d",
                       g->path, key, (unsigned long long)kv->arr_n, n);
    float *v = kv_malloc((size_t)n * sizeof *v + 1, key, err);
    if (!v) return KV_EINTERNAL;
    const unsigned char *p = g->base + kv->off;
    for (int i = 0; i < n; i++, p += sz) {
        switch (kv->arr_type) {
        case GT_F32:
            memcpy(&v[i], p, 4);
            break;
        case GT_F64: {
            double x;
            memcpy(&x, p, 8);
            v[i] = (float)x;
            break;
        }
        case GT_I32: {
            int32_t x;
            memcpy(&x, p, 4);
            v[i] = (float)x;
            break;
        }
        case GT_U32: {
            uint32_t x;
            memcpy(&x, p, 4);
            v[i] = (float)x;
            break;
        }
        case GT_I8:
            v[i] = (float)(int8_t)p[0];
            break;
        case GT_U8:
            v[i] = (float)p[0];
            break;
        case GT_I16: {
            int16_t x;
            memcpy(&x, p, 2);
            v[i] = (float)x;
            break;
        }
        case GT_U16: {
            uint16_t x;
            memcpy(&x, p, 2);
            v[i] = (float)x;
            break;
        }
        case GT_I64: {
            int64_t x;
            memcpy(&x, p, 8);
            v[i] = (float)x;
            break;
        }
        default: {
            uint64_t x;
            memcpy(&x, p, 8);
            v[i] = (float)x;
            break;
        }
        }
    }
    *out = v;
    return KV_OK;
}

/* Replace every "▁" (U+2581, e2 96 81) by ' ' in place. */
static void unescape_spaces(char *s) {
    char *w = s;
    for (const char *r = s; *r;) {
        if ((unsigned char)r[0] == 0xe2 && (unsigned char)r[1] == 0x96 &&
            (unsigned char)r[2] == 0x81) {
            *w++ = ' ';
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

static int gguf_tok_llama(const kv_gguf_meta *g, char **tokens, int n, int bos, int eos,
                          kv_tokenizer **out, kv_error *err) {
    float *scores = NULL;
    int rc = meta_floats(g, "tokenizer.ggml.scores", n, &scores, err);
    if (rc) return rc;
    if (!scores) {
        scores = kv_calloc((size_t)n + 1, sizeof *scores, "scores", err);
        if (!scores) return KV_EINTERNAL;
    }
    /* A vocabulary whose scores are all equal (a BPE vocabulary converted without its merges,
     * e.g. TinyStories-656K's GGUF files) would merge leftmost-first; its ids are in merge
     * order, so rank by id instead (documented heuristic). */
    int equal = 1;
    for (int i = 1; i < n && equal; i++) equal = scores[i] == scores[0];
    if (equal && n > 1)
        for (int i = 0; i < n; i++) scores[i] = -(float)i;
    for (int i = 0; i < n; i++) unescape_spaces(tokens[i]);
    rc = kv_tokenizer_from_scored((const char *const *)tokens, scores, n, bos, eos, out, err);
    free(scores);
    if (rc) return rc;
    int64_t add_bos;
    int got = meta_int(g, "tokenizer.ggml.add_bos_token", &add_bos, err);
    if (got < 0) {
        kv_tokenizer_free(*out);
        *out = NULL;
        return KV_EINPUT;
    }
    if (got) (*out)->add_bos = add_bos != 0;
    return KV_OK;
}

/* Pre-tokenizer patterns by tokenizer.ggml.pre (llama.cpp llama-vocab.cpp; the Hugging Face
 * tokenizer.json of each family): GPT-2; Qwen2 (single digits); Llama 3 (digits in threes). */
static const char *pre_regex(const char *pre) {
    if (!pre[0] || !strcmp(pre, "default") || !strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2"))
        return KV_BPE_GPT2_REGEX;
    if (!strcmp(pre, "qwen2"))
        return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe") || !strcmp(pre, "smaug-bpe"))
        return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    return NULL;
}

static int gguf_tok_gpt2(const kv_gguf_meta *g, char **tokens, int n, int bos, int eos,
                         kv_tokenizer **out, kv_error *err) {
    char **merges = NULL;
    int n_merges = 0;
    int rc = meta_strings(g, "tokenizer.ggml.merges", &merges, &n_merges, err);
    if (rc) return rc;
    char **left = calloc((size_t)n_merges + 1, sizeof *left);
    char **right = calloc((size_t)n_merges + 1, sizeof *right);
    float *types = NULL;
    int *special = calloc((size_t)n + 1, sizeof *special);
    if (!left || !right || !special) rc = kv_fail(err, KV_EINTERNAL, "out of memory (merges)");
    for (int i = 0; i < n_merges && !rc; i++) {
        char *sp = strchr(merges[i], ' ');
        if (!sp || sp == merges[i] || !sp[1])
            rc = kv_fail(err, KV_EINPUT,
                         "%s: tokenizer.ggml.merges[%d] = '%.60s' is not two "
                         "tokens separated by one space",
                         g->path, i, merges[i]);
        else {
            *sp = '\0';
            left[i] = merges[i];
            right[i] = sp + 1;
        }
    }
    char pre[64] = "";
    if (!rc && meta_str(g, "tokenizer.ggml.pre", pre, sizeof pre, err) < 0) rc = KV_EINPUT;
    const char *regex = pre_regex(pre);
    if (!rc && !regex)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: tokenizer.ggml.pre '%s' is not a pre-tokenizer kvplan "
                     "knows (default, gpt2, qwen2, llama-bpe)",
                     g->path, pre);
    if (!rc) rc = meta_floats(g, "tokenizer.ggml.token_type", n, &types, err);
    int n_special = 0;
    for (int i = 0; types && i < n && !rc; i++)
        if (types[i] == 3.0f || types[i] == 4.0f) special[n_special++] = i; /* control, user */
    int64_t add_bos = 0, unk = -1;
    if (!rc && meta_int(g, "tokenizer.ggml.add_bos_token", &add_bos, err) < 0) rc = KV_EINPUT;
    if (!rc && meta_int(g, "tokenizer.ggml.unknown_token_id", &unk, err) < 0) rc = KV_EINPUT;
    if (!rc) {
        kv_bpe_spec s;
        memset(&s, 0, sizeof s);
        s.n_vocab = n;
        s.tokens = (const char *const *)tokens;
        s.n_merges = n_merges;
        s.merge_left = (const char *const *)left;
        s.merge_right = (const char *const *)right;
        s.style = KV_BPE_BYTELEVEL;
        s.regex = regex;
        s.unk_id = unk >= 0 && unk < n ? (int)unk : -1;
        s.special = special;
        s.n_special = n_special;
        s.bos_id = bos;
        s.eos_id = eos;
        s.add_bos = add_bos != 0;
        rc = kv_tokenizer_bpe_new(&s, g->path, out, err);
    }
    free(types);
    free(special);
    free(left);
    free(right);
    free_strings(merges, n_merges);
    return rc;
}

int kv_tokenizer_load_gguf(const kv_model *m, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_load_gguf(const kv_model *m, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    const kv_gguf_meta *g = m->gguf;
    if (!g) return kv_fail(err, KV_EINTERNAL, "%s: GGUF metadata was not kept", m->path);
    char model[32] = "";
    int got = meta_str(g, "tokenizer.ggml.model", model, sizeof model, err);
    if (got < 0) return KV_EINPUT;
    if (!got)
        return kv_fail(err, KV_EINPUT,
                       "%s: no embedded tokenizer (metadata "
                       "'tokenizer.ggml.model' is missing); pass --tokenizer PATH",
                       g->path);
    char **tokens = NULL;
    int n = 0;
    int rc = meta_strings(g, "tokenizer.ggml.tokens", &tokens, &n, err);
    if (rc) return rc;
    int bos = m->cfg.bos_id < n ? m->cfg.bos_id : -1, eos = m->cfg.eos_id < n ? m->cfg.eos_id : -1;
    if (!strcmp(model, "llama"))
        rc = gguf_tok_llama(g, tokens, n, bos, eos, out, err);
    else if (!strcmp(model, "gpt2"))
        rc = gguf_tok_gpt2(g, tokens, n, bos, eos, out, err);
    else
        rc = kv_fail(err, KV_EINPUT,
                     "%s: tokenizer.ggml.model '%s' is not supported (kvplan "
                     "reads 'llama' and 'gpt2'); pass --tokenizer PATH",
                     g->path, model);
    free_strings(tokens, n);
    return rc;
}
