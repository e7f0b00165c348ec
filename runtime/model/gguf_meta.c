/* GGUF container reader: header, metadata, tensor infos. See runtime/model/gguf_meta.h. */
#include "model/gguf_meta.h"

#include "kvplan/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void kv_gguf_close(kv_gguf *g) {
    if (!g) return;
    free((void *)g->base);
    free(g->kv);
    free(g->t);
    free(g);
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

/* Bytes of a scalar value of each GGUF value type (GGUF spec, "gguf_metadata_value_type");
 * 0 for a string, an array or an id past the spec. */
static const unsigned char kv_gguf_scalar_bytes[] = {
    [KV_GGUF_U8] = 1,    [KV_GGUF_I8] = 1,  [KV_GGUF_BOOL] = 1, [KV_GGUF_U16] = 2,
    [KV_GGUF_I16] = 2,   [KV_GGUF_U32] = 4, [KV_GGUF_I32] = 4,  [KV_GGUF_F32] = 4,
    [KV_GGUF_U64] = 8,   [KV_GGUF_I64] = 8, [KV_GGUF_F64] = 8,  [KV_GGUF_STRING] = 0,
    [KV_GGUF_ARRAY] = 0,
};

static size_t scalar_size(uint32_t t) {
    return t < sizeof kv_gguf_scalar_bytes ? kv_gguf_scalar_bytes[t] : 0;
}

static int skip_value(rd *r, uint32_t type, const char *key) {
    char field[160];
    snprintf(field, sizeof field, "value of '%.120s'", key);
    if (type == KV_GGUF_STRING) {
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

static int parse_kv(rd *r, kv_gguf_kv *kv) {
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
    if (kv->type == KV_GGUF_ARRAY) {
        snprintf(field, sizeof field, "array header of '%.120s'", key);
        if (rd_u32(r, &kv->arr_type, field) || rd_u64(r, &kv->arr_n, field)) return KV_EINPUT;
        if (kv->arr_type == KV_GGUF_ARRAY)
            return kv_fail(r->err, KV_EINPUT,
                           "%s: metadata '%s' is an array of arrays, which "
                           "kvplan does not read",
                           r->path, key);
        kv->off = r->off;
        if (kv->arr_type != KV_GGUF_STRING) {
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
                if (skip_value(r, KV_GGUF_STRING, key)) return KV_EINPUT;
        }
        return KV_OK;
    }
    kv->off = r->off;
    return skip_value(r, kv->type, key);
}

const kv_gguf_kv *kv_gguf_find(const kv_gguf *g, const char *key) {
    size_t n = strlen(key);
    for (int i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0) return &g->kv[i];
    return NULL;
}

/* Integer metadata of any integer type; 1 found, 0 absent, -1 wrong type (err set). */
int kv_gguf_get_int(const kv_gguf *g, const char *key, int64_t *out, kv_error *err) {
    const kv_gguf_kv *kv = kv_gguf_find(g, key);
    if (!kv) return 0;
    const unsigned char *p = g->base + kv->off;
    switch (kv->type) {
    case KV_GGUF_U8:
        *out = p[0];
        return 1;
    case KV_GGUF_I8:
        *out = (int8_t)p[0];
        return 1;
    case KV_GGUF_BOOL:
        *out = p[0] != 0;
        return 1;
    case KV_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case KV_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 1;
    }
    case KV_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case KV_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    case KV_GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        *out = v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v; /* no wrap to negative */
        return 1;
    }
    case KV_GGUF_I64: {
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

int kv_gguf_get_float(const kv_gguf *g, const char *key, double *out, kv_error *err) {
    const kv_gguf_kv *kv = kv_gguf_find(g, key);
    if (!kv) return 0;
    const unsigned char *p = g->base + kv->off;
    if (kv->type == KV_GGUF_F32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return 1;
    }
    if (kv->type == KV_GGUF_F64) {
        memcpy(out, p, 8);
        return 1;
    }
    int64_t i;
    int rc = kv_gguf_get_int(g, key, &i, err);
    if (rc == 1)
        *out = (double)i;
    else if (rc < 0)
        kv_fail(err, KV_EINPUT, "%s: metadata '%s' has value type %u, expected a number", g->path,
                key, kv->type);
    return rc;
}

/* String metadata copied into buf (truncated to cap-1); 1 found, 0 absent, -1 wrong type. */
int kv_gguf_get_str(const kv_gguf *g, const char *key, char *buf, size_t cap, kv_error *err) {
    const kv_gguf_kv *kv = kv_gguf_find(g, key);
    if (!kv) return 0;
    if (kv->type != KV_GGUF_STRING) {
        kv_fail(err, KV_EINPUT, "%s: metadata '%s' has value type %u, expected a string", g->path,
                key, kv->type);
        return -1;
    }
    uint64_t n;
    memcpy(&n, g->base + kv->off, 8);
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), (const char *)g->base + kv->off + 8);
    return 1;
}

/* Bytes of tensor t's data from its type and shape (runtime/quant/quant.c): rows of ne[0] elements
 * in whole blocks. Unsupported types and rows that are not a multiple of the block size fail here,
 * naming the tensor. */
static int tensor_nbytes(const char *path, kv_gguf_tensor *t, kv_error *err) {
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
static int parse_header(kv_gguf *g, kv_error *err) {
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
    int got = kv_gguf_get_int(g, "general.alignment", &a, err);
    if (got < 0) return KV_EINPUT;
    if (got) {
        if (a <= 0 || (a & (a - 1)) || a > (1 << 20))
            return kv_fail(err, KV_EINPUT, "%s: general.alignment %lld is not a power of two",
                           g->path, (long long)a);
        align = (uint64_t)a;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        kv_gguf_tensor *t = &g->t[i];
        if (rd_str(&r, &t->name, &t->name_len, "tensor name")) return KV_EINPUT;
        char field[160];
        snprintf(field, sizeof field, "tensor info of '%.*s'",
                 (int)(t->name_len < 100 ? t->name_len : 100), t->name);
        if (rd_u32(&r, &t->n_dims, field)) return KV_EINPUT;
        if (t->n_dims == 0 || t->n_dims > KV_GGUF_MAX_DIMS)
            return kv_fail(err, KV_EINPUT, "%s: tensor '%.*s' has %u dimensions (1..4 allowed)",
                           g->path, (int)t->name_len, t->name, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (rd_u64(&r, &t->ne[d], field)) return KV_EINPUT;
        for (uint32_t d = t->n_dims; d < KV_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        if (rd_u32(&r, &t->type, field) || rd_u64(&r, &t->offset, field)) return KV_EINPUT;
        g->n_tensors++;
    }
    g->data_start = (r.off + align - 1) / align * align;
    /* a file without tensors needs no data section: it may end right after the metadata */
    if (g->n_tensors == 0 && g->data_start > g->len) g->data_start = g->len;
    if (g->data_start > g->len)
        return kv_fail(err, KV_EINPUT,
                       "%s: the file ends (%zu bytes) before its tensor data "
                       "section starts (byte %zu): truncated",
                       g->path, g->len, g->data_start);
    size_t data_len = g->len - g->data_start;
    for (int i = 0; i < g->n_tensors; i++) {
        kv_gguf_tensor *t = &g->t[i];
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

const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < g->n_tensors; i++)
        if (g->t[i].name_len == n && memcmp(g->t[i].name, name, n) == 0) return &g->t[i];
    return NULL;
}

/* The strings of array metadata `key` as NUL-terminated copies (caller frees each and the
 * array); *n gets the count. Missing or wrong type -> KV_EINPUT naming the key. */
int kv_gguf_get_strings(const kv_gguf *g, const char *key, char ***out, int *n, kv_error *err) {
    *out = NULL;
    *n = 0;
    const kv_gguf_kv *kv = kv_gguf_find(g, key);
    if (!kv) return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is missing", g->path, key);
    if (kv->type != KV_GGUF_ARRAY || kv->arr_type != KV_GGUF_STRING)
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

void kv_gguf_free_strings(char **s, int n) {
    if (!s) return;
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

/* Numeric array metadata `key` converted to floats (any numeric element type); NULL when
 * absent (KV_OK). Wrong type or count -> KV_EINPUT. */
int kv_gguf_get_floats(const kv_gguf *g, const char *key, int n, float **out, kv_error *err) {
    *out = NULL;
    const kv_gguf_kv *kv = kv_gguf_find(g, key);
    if (!kv) return KV_OK;
    size_t sz = kv->type == KV_GGUF_ARRAY ? scalar_size(kv->arr_type) : 0;
    if (!sz || kv->arr_type == KV_GGUF_BOOL)
        return kv_fail(err, KV_EINPUT, "%s: metadata '%s' is not a numeric array", g->path, key);
    if (kv->arr_n < (uint64_t)n)
        return kv_fail(err, KV_EINPUT,
                       "%s: metadata '%s' has %llu entries, fewer than the %d needed", g->path, key,
                       (unsigned long long)kv->arr_n, n);
    float *v = kv_malloc((size_t)n * sizeof *v + 1, key, err);
    if (!v) return KV_EINTERNAL;
    const unsigned char *p = g->base + kv->off;
    for (int i = 0; i < n; i++, p += sz) {
        switch (kv->arr_type) {
        case KV_GGUF_F32:
            memcpy(&v[i], p, 4);
            break;
        case KV_GGUF_F64: {
            double x;
            memcpy(&x, p, 8);
            /* beyond float's range the conversion is undefined: saturate to infinity */
            v[i] = x > FLT_MAX ? INFINITY : x < -FLT_MAX ? -INFINITY : (float)x;
            break;
        }
        case KV_GGUF_I32: {
            int32_t x;
            memcpy(&x, p, 4);
            v[i] = (float)x;
            break;
        }
        case KV_GGUF_U32: {
            uint32_t x;
            memcpy(&x, p, 4);
            v[i] = (float)x;
            break;
        }
        case KV_GGUF_I8:
            v[i] = (float)(int8_t)p[0];
            break;
        case KV_GGUF_U8:
            v[i] = (float)p[0];
            break;
        case KV_GGUF_I16: {
            int16_t x;
            memcpy(&x, p, 2);
            v[i] = (float)x;
            break;
        }
        case KV_GGUF_U16: {
            uint16_t x;
            memcpy(&x, p, 2);
            v[i] = (float)x;
            break;
        }
        case KV_GGUF_I64: {
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

int kv_gguf_open(const char *path, kv_gguf **out, kv_error *err) {
    *out = NULL;
    kv_gguf *g = kv_calloc(1, sizeof *g, "GGUF header", err);
    if (!g) return KV_EINTERNAL;
    snprintf(g->path, sizeof g->path, "%s", path);
    void *data = NULL;
    size_t len = 0;
    int rc = kv_file_load(path, "GGUF file", 0, &data, &len, err);
    if (rc) {
        free(g);
        return rc;
    }
    g->base = data;
    g->len = len;
    if (len < 24)
        rc =
            kv_fail(err, KV_EINPUT, "%s: %zu bytes is too short for a GGUF header (24)", path, len);
    if (!rc) rc = parse_header(g, err);
    if (rc) {
        kv_gguf_close(g);
        return rc;
    }
    *out = g;
    return KV_OK;
}
