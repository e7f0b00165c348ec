/* Hugging Face checkpoint loader: a directory with config.json and safetensors weights.
 *
 * config.json (transformers LlamaConfig / MistralConfig / Qwen2Config): model_type,
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads (default num_attention_heads), head_dim (optional, must equal
 * hidden_size / heads), max_position_embeddings, rms_norm_eps, rope_theta (default 10000),
 * rope_scaling (must be null), tie_word_embeddings (default false), attention_bias (llama),
 * vocab_size, bos_token_id, eos_token_id (an int or a list: the first is used),
 * hidden_act (must be silu). qwen2 always has q/k/v biases.
 *
 * Weights: model.safetensors, or model.safetensors.index.json whose "weight_map" names the
 * shard of every tensor. safetensors (huggingface/safetensors): uint64 little-endian header
 * size N, an N-byte JSON header {name: {dtype, shape, data_offsets [begin, end)}, optional
 * "__metadata__": {string: string}}, then the data; offsets are relative to byte 8 + N.
 * dtypes F32, F16 and BF16: matrices are kept in their type in place (docs/design.md), norms and
 * biases converted to fp32 on load (F32 in place when aligned).
 * `__metadata__` entries whose key and value are both tensor names record an alias (a tied
 * tensor saved once): TinyStories-656K stores only lm_head.weight and maps
 * model.embed_tokens.weight to it.
 *
 * Hugging Face Llama checkpoints apply RoPE to the two halves of each head (rotate_half), so
 * the weights are kept as they are and cfg.rope_layout = KV_ROPE_HALF.
 * model_sha256 = SHA-256 of config.json followed by the shard files in sorted order.
 */
#include "kvplan/model.h"
#include "model/model_impl.h"
#include "model/tensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct st_tensor {
    const char *name; /* points into the shard's JSON (owned by st_file.json) */
    int dtype;        /* 0 F32, 1 F16, 2 BF16 */
    int n_dims;
    long long shape[8];
    size_t begin, end; /* absolute byte offsets in the shard buffer */
    int file;          /* shard index */
} st_tensor;

typedef struct st_file {
    char path[4200];
    unsigned char *data; /* whole file */
    int adopted;         /* data is owned by the model */
    size_t len;
    cJSON *json;
} st_file;

typedef struct st_set {
    st_file *files;
    int n_files;
    st_tensor *t;
    int n_t, cap_t;
    cJSON **alias;   /* __metadata__ objects per file (borrowed from json) */
    char desc[4200]; /* model.safetensors or the index file, for messages */
} st_set;

static void st_set_free(st_set *s) {
    for (int i = 0; i < s->n_files; i++) {
        if (!s->files[i].adopted) free(s->files[i].data);
        cJSON_Delete(s->files[i].json);
    }
    free(s->files);
    free(s->t);
    free(s->alias);
}

static int parse_json(const char *path, const char *data, size_t len, cJSON **out, kv_error *err) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    if (*out) return KV_OK;
    size_t at = end && end >= data ? (size_t)(end - data) : 0;
    return kv_fail(err, KV_EINPUT, "%s: invalid JSON at byte %zu", path, at);
}

/* One header entry `it` of shard fi into s's tensor index: dtype, shape and data offsets
 * (relative to the data at byte `base`, data_len bytes), checked against each other. */
static int read_entry(st_set *s, int fi, const cJSON *it, size_t base, size_t data_len,
                      kv_error *err) {
    const st_file *f = &s->files[fi];
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s' lacks \"dtype\", \"shape\" or \"data_offsets\"", f->path,
                       it->string);
    if (s->n_t == s->cap_t) {
        int nc = s->cap_t ? 2 * s->cap_t : 64;
        st_tensor *nt = realloc(s->t, (size_t)nc * sizeof *nt);
        if (!nt) return kv_fail(err, KV_EINTERNAL, "out of memory (tensor index)");
        s->t = nt;
        s->cap_t = nc;
    }
    st_tensor *t = &s->t[s->n_t];
    memset(t, 0, sizeof *t);
    t->name = it->string;
    t->file = fi;
    size_t esz;
    if (!strcmp(dt->valuestring, "F32"))
        t->dtype = 0, esz = 4;
    else if (!strcmp(dt->valuestring, "F16"))
        t->dtype = 1, esz = 2;
    else if (!strcmp(dt->valuestring, "BF16"))
        t->dtype = 2, esz = 2;
    else
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s' has dtype \"%s\", which kvplan does "
                       "not read (F32, F16, BF16)",
                       f->path, it->string, dt->valuestring);
    t->n_dims = cJSON_GetArraySize(sh);
    if (t->n_dims > 8)
        return kv_fail(err, KV_EINPUT, "%s: tensor '%s' has %d dimensions", f->path, it->string,
                       t->n_dims);
    double count = 1;
    for (int d = 0; d < t->n_dims; d++) {
        const cJSON *v = cJSON_GetArrayItem(sh, d);
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1e12))
            return kv_fail(err, KV_EINPUT, "%s: tensor '%s': shape[%d] is not a valid size",
                           f->path, it->string, d);
        t->shape[d] = (long long)v->valuedouble;
        count *= v->valuedouble;
    }
    const cJSON *b = cJSON_GetArrayItem(off, 0), *e = cJSON_GetArrayItem(off, 1);
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e) || !(b->valuedouble >= 0) ||
        !(e->valuedouble >= b->valuedouble))
        return kv_fail(err, KV_EINPUT, "%s: tensor '%s': data_offsets are not a valid [begin, end)",
                       f->path, it->string);
    if (e->valuedouble > (double)data_len)
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s': data_offsets [%.0f, %.0f) extend past "
                       "the end of the data (%zu bytes): the file is truncated",
                       f->path, it->string, b->valuedouble, e->valuedouble, data_len);
    t->begin = base + (size_t)b->valuedouble;
    t->end = base + (size_t)e->valuedouble;
    if ((double)(t->end - t->begin) != count * (double)esz)
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s': data_offsets cover %zu bytes but "
                       "shape and dtype %s need %.0f",
                       f->path, it->string, t->end - t->begin, dt->valuestring,
                       count * (double)esz);
    s->n_t++;
    return KV_OK;
}

/* Read one shard and index its tensors into s: the file into memory the model will own (the
 * weights point into it), the 8-byte header size, the JSON header, then each entry. */
static int read_shard(st_set *s, int fi, kv_error *err) {
    st_file *f = &s->files[fi];
    void *bytes = NULL;
    size_t len = 0;
    int rc = kv_file_load(f->path, "safetensors file", 0, &bytes, &len, err);
    if (rc) return rc;
    const char *data = bytes;
    f->data = bytes;
    f->len = len;
    uint64_t hn;
    if (len < 8)
        return kv_fail(err, KV_EINPUT,
                       "%s: %zu bytes is too short for a safetensors file (the "
                       "header size alone is 8)",
                       f->path, len);
    memcpy(&hn, data, 8);
    if (hn < 2 || hn > len - 8)
        return kv_fail(err, KV_EINPUT,
                       "%s: header size %llu does not fit in the %zu-byte file: "
                       "not a safetensors file, or truncated",
                       f->path, (unsigned long long)hn, len);
    char hp[4300];
    snprintf(hp, sizeof hp, "%s (safetensors header)", f->path);
    if ((rc = parse_json(hp, data + 8, (size_t)hn, &f->json, err))) return rc;
    if (!cJSON_IsObject(f->json))
        return kv_fail(err, KV_EINPUT, "%s: the safetensors header is not a JSON object", f->path);
    size_t base = 8 + (size_t)hn;
    const cJSON *it;
    cJSON_ArrayForEach(it, f->json) {
        if (!strcmp(it->string, "__metadata__"))
            s->alias[fi] = (cJSON *)it;
        else if ((rc = read_entry(s, fi, it, base, len - base, err)))
            return rc;
    }
    return KV_OK;
}

static const st_tensor *st_find(const st_set *s, const char *name) {
    for (int i = 0; i < s->n_t; i++)
        if (!strcmp(s->t[i].name, name)) return &s->t[i];
    /* an alias recorded in __metadata__: name -> stored tensor */
    for (int f = 0; f < s->n_files; f++) {
        const cJSON *a = s->alias[f] ? cJSON_GetObjectItemCaseSensitive(s->alias[f], name) : NULL;
        if (cJSON_IsString(a) && strcmp(a->valuestring, name))
            for (int i = 0; i < s->n_t; i++)
                if (!strcmp(s->t[i].name, a->valuestring)) return &s->t[i];
    }
    return NULL;
}

/* Tensor `name` as [rows, cols] (rows = 0: 1-D of length cols): with `out`, an fp32 view (F16
 * and BF16 converted into a buffer the model adopts); with `wout` (matrices), the tensor in its
 * own type in place (F32, F16, BF16: the weights stay in the file's type, docs/design.md). */
static int st_weight(kv_model *m, const st_set *s, const char *name, long long rows, long long cols,
                     int optional, const char *why, const float **out, kv_weight *wout,
                     kv_error *err) {
    if (out) *out = NULL;
    if (wout) wout->data = NULL, wout->type = KV_DT_F32;
    const st_tensor *t = st_find(s, name);
    if (!t) {
        if (optional) return KV_OK;
        return kv_fail(err, KV_EINPUT, "%s: tensor '%s' is missing (%s)", s->desc, name, why);
    }
    const st_file *f = &s->files[t->file];
    int ok = rows ? (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols)
                  : (t->n_dims == 1 && t->shape[0] == cols);
    if (!ok) {
        char shape[128] = "";
        size_t k = 0;
        for (int d = 0; d < t->n_dims && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, d ? ", %lld" : "%lld", t->shape[d]);
        if (rows)
            return kv_fail(err, KV_EINPUT,
                           "%s: tensor '%s' has shape [%s] but config.json (%s) "
                           "needs [%lld, %lld]",
                           f->path, name, shape, why, rows, cols);
        return kv_fail(err, KV_EINPUT,
                       "%s: tensor '%s' has shape [%s] but config.json (%s) needs "
                       "[%lld]",
                       f->path, name, shape, why, cols);
    }
    size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
    const unsigned char *src = f->data + t->begin;
    if (wout && t->dtype != 0) { /* F16 / BF16 kept as they are */
        wout->data = src;
        wout->type = t->dtype == 1 ? KV_DT_F16 : KV_DT_BF16;
        return KV_OK;
    }
    if (t->dtype == 0 && (uintptr_t)src % sizeof(float) == 0) {
        if (wout)
            *wout = kv_weight_f32((const float *)(const void *)src);
        else
            *out = (const float *)(const void *)src;
        return KV_OK;
    }
    float *dst = kv_malloc(n * sizeof *dst + 1, name, err);
    if (!dst) return KV_EINTERNAL;
    if (t->dtype == 0)
        memcpy(dst, src, n * sizeof *dst);
    else
        kv_dequantize_row(t->dtype == 1 ? KV_DT_F16 : KV_DT_BF16, src, dst, (int64_t)n, NULL);
    return kv_model_give_f32(m, dst, out, wout, err);
}

/* ---- config.json ---- */
static int cfg_int(const char *path, const cJSON *j, const char *key, int dflt, int *out,
                   kv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        if (dflt >= 0) {
            *out = dflt;
            return KV_OK;
        }
        return kv_fail(err, KV_EINPUT, "%s: field \"%s\" is missing", path, key);
    }
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) v = cJSON_GetArrayItem(v, 0);
    /* range first: converting a double outside long long's range (1e300) is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= (1 << 24)) ||
        v->valuedouble != floor(v->valuedouble))
        return kv_fail(err, KV_EINPUT, "%s: field \"%s\" must be a non-negative integer", path,
                       key);
    *out = (int)v->valuedouble;
    return KV_OK;
}

static int cfg_num(const char *path, const cJSON *j, const char *key, double dflt, int required,
                   double *out, kv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return kv_fail(err, KV_EINPUT, "%s: field \"%s\" is missing", path, key);
        *out = dflt;
        return KV_OK;
    }
    /* the value is stored as a float: anything beyond float's range is refused here */
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > FLT_MAX)
        return kv_fail(err, KV_EINPUT, "%s: field \"%s\" must be a number within float range", path,
                       key);
    *out = v->valuedouble;
    return KV_OK;
}

static int read_config(const char *path, kv_config *c, kv_error *err) {
    memset(c, 0, sizeof *c);
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(path, &data, &len, err);
    if (rc) return rc;
    cJSON *j = NULL;
    rc = parse_json(path, data, len, &j, err);
    free(data);
    if (rc) return rc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (!cJSON_IsObject(j))
        rc = kv_fail(err, KV_EINPUT, "%s: not a JSON object", path);
    else if (!cJSON_IsString(mt))
        rc = kv_fail(err, KV_EINPUT, "%s: field \"model_type\" is missing", path);
    else if (strcmp(mt->valuestring, "llama") && strcmp(mt->valuestring, "mistral") &&
             strcmp(mt->valuestring, "qwen2"))
        rc = kv_fail(err, KV_EINPUT,
                     "%s: model_type \"%s\" is not supported (llama, mistral, "
                     "qwen2)",
                     path, mt->valuestring);
    if (!rc) {
        snprintf(c->arch, sizeof c->arch, "%s", mt->valuestring);
        rc = cfg_int(path, j, "hidden_size", -1, &c->dim, err);
    }
    if (!rc) rc = cfg_int(path, j, "intermediate_size", -1, &c->hidden_dim, err);
    if (!rc) rc = cfg_int(path, j, "num_hidden_layers", -1, &c->n_layers, err);
    if (!rc) rc = cfg_int(path, j, "num_attention_heads", -1, &c->n_heads, err);
    if (!rc) rc = cfg_int(path, j, "num_key_value_heads", c->n_heads, &c->n_kv_heads, err);
    if (!rc) rc = cfg_int(path, j, "vocab_size", -1, &c->vocab_size, err);
    if (!rc) rc = cfg_int(path, j, "max_position_embeddings", -1, &c->seq_len, err);
    if (!rc && c->n_heads == 0) rc = kv_fail(err, KV_EINPUT, "%s: num_attention_heads is 0", path);
    if (!rc && c->dim % c->n_heads)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: hidden_size %d is not a multiple of num_attention_heads "
                     "%d",
                     path, c->dim, c->n_heads);
    if (!rc) rc = cfg_int(path, j, "head_dim", c->dim / c->n_heads, &c->head_dim, err);
    if (!rc && c->head_dim != c->dim / c->n_heads)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: head_dim %d differs from hidden_size / "
                     "num_attention_heads = %d, which kvplan does not support",
                     path, c->head_dim, c->dim / c->n_heads);
    double v = 0;
    if (!rc) rc = cfg_num(path, j, "rms_norm_eps", 1e-6, 1, &v, err);
    c->norm_eps = (float)v;
    if (!rc) rc = cfg_num(path, j, "rope_theta", 10000.0, 0, &v, err);
    c->rope_theta = (float)v;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!rc && rs && !cJSON_IsNull(rs))
        rc = kv_fail(err, KV_EINPUT,
                     "%s: field \"rope_scaling\" is set; RoPE scaling is not "
                     "supported",
                     path);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (!rc && act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        rc = kv_fail(err, KV_EINPUT, "%s: field \"hidden_act\" must be \"silu\"", path);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    if (!rc && tie && !cJSON_IsBool(tie))
        rc = kv_fail(err, KV_EINPUT, "%s: field \"tie_word_embeddings\" must be true or false",
                     path);
    c->tied_embeddings = cJSON_IsTrue(tie);
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(j, "attention_bias");
    c->attn_bias = !strcmp(c->arch, "qwen2") || cJSON_IsTrue(ab);
    c->rope_layout = KV_ROPE_HALF;
    int id;
    c->bos_id = c->eos_id = -1;
    if (!rc && !cfg_int(path, j, "bos_token_id", 0x7fffffff, &id, err) && id != 0x7fffffff)
        c->bos_id = id;
    if (!rc && !cfg_int(path, j, "eos_token_id", 0x7fffffff, &id, err) && id != 0x7fffffff)
        c->eos_id = id;
    if (!rc) kv_error_clear(err); /* a malformed bos/eos id is ignored */
    cJSON_Delete(j);
    if (!rc) rc = kv_config_check(c, path, err);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The shard list: model.safetensors, or the sorted distinct files of the index's weight_map. */
static int list_shards(const char *dir, st_set *s, kv_error *err) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (stat(p, &st) == 0) {
        s->files = calloc(1, sizeof *s->files);
        if (!s->files) return kv_fail(err, KV_EINTERNAL, "out of memory");
        snprintf(s->files[0].path, sizeof s->files[0].path, "%s", p);
        snprintf(s->desc, sizeof s->desc, "%s", p);
        s->n_files = 1;
        return KV_OK;
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    snprintf(s->desc, sizeof s->desc, "%s", p);
    if (stat(p, &st) != 0)
        return kv_fail(err, KV_EINPUT,
                       "%s: neither model.safetensors nor "
                       "model.safetensors.index.json is present",
                       dir);
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(p, &data, &len, err);
    if (rc) return rc;
    cJSON *j = NULL;
    rc = parse_json(p, data, len, &j, err);
    free(data);
    if (rc) return rc;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *it;
    int n = cJSON_GetArraySize(wm);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    if (!cJSON_IsObject(wm) || n == 0)
        rc = kv_fail(err, KV_EINPUT, "%s: field \"weight_map\" is missing or empty", p);
    else if (!names)
        rc = kv_fail(err, KV_EINTERNAL, "out of memory");
    int k = 0;
    if (!rc) {
        cJSON_ArrayForEach(it, wm) {
            if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
                rc = kv_fail(err, KV_EINPUT,
                             "%s: weight_map[\"%s\"] is not a file name in the "
                             "directory",
                             p, it->string);
                break;
            }
            names[k++] = it->valuestring;
        }
    }
    if (!rc) {
        qsort(names, (size_t)k, sizeof *names, cmp_str);
        int u = 0;
        for (int i = 0; i < k; i++)
            if (i == 0 || strcmp(names[i], names[i - 1])) names[u++] = names[i];
        s->files = calloc((size_t)u, sizeof *s->files);
        if (!s->files) rc = kv_fail(err, KV_EINTERNAL, "out of memory");
        for (int i = 0; i < u && !rc; i++)
            snprintf(s->files[i].path, sizeof s->files[i].path, "%s/%s", dir, names[i]);
        if (!rc) s->n_files = u;
    }
    free(names);
    cJSON_Delete(j);
    return rc;
}

/* A layer's tensors, read role by role from the table (model/tensors.h). */
typedef struct hf_walk {
    kv_model *m;
    const st_set *s;
    kv_error *err;
} hf_walk;

static int load_role(const kv_role_tensor *t, void *user) {
    const hf_walk *w = user;
    char name[128];
    snprintf(name, sizeof name, "model.layers.%d.%s", t->layer, t->role->hf);
    /* rows 0: st_weight's 1-D tensor */
    long long rows = t->role->rows == KV_TDIM_ONE ? 0 : t->rows;
    return st_weight(w->m, w->s, name, rows, t->cols, t->optional, t->hf_shape, t->vec, t->mat,
                     w->err);
}

int kv_model_load_hf(const char *dir, kv_model **out, kv_error *err) {
    *out = NULL;
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct stat stt;
    if (stat(cfg_path, &stt) != 0)
        return kv_fail(err, KV_EINPUT, "%s: a model directory needs config.json (%s: %s)", dir,
                       cfg_path, strerror(errno));
    kv_config c;
    int rc = read_config(cfg_path, &c, err);
    if (rc) return rc;
    st_set s;
    memset(&s, 0, sizeof s);
    rc = list_shards(dir, &s, err);
    if (!rc && !(s.alias = calloc((size_t)s.n_files, sizeof *s.alias)))
        rc = kv_fail(err, KV_EINTERNAL, "out of memory");
    for (int i = 0; i < s.n_files && !rc; i++) rc = read_shard(&s, i, err);
    kv_model *m = NULL;
    if (!rc && !(m = kv_model_alloc(c.n_layers, err))) rc = KV_EINTERNAL;
    /* the model owns the shard buffers from here (kv_model_adopt frees one it cannot keep) */
    for (int i = 0; i < s.n_files && !rc; i++) {
        rc = kv_model_adopt(m, s.files[i].data, err);
        if (rc) s.files[i].data = NULL;
        s.files[i].adopted = 1;
    }
    if (rc) {
        kv_model_free(m);
        st_set_free(&s);
        return rc;
    }
    m->cfg = c;
    snprintf(m->format, sizeof m->format, "safetensors");
    long long d = c.dim, V = c.vocab_size;
    rc = st_weight(m, &s, "model.embed_tokens.weight", V, d, 0, "vocab_size x hidden_size", NULL,
                   &m->tok_emb, err);
    if (!rc)
        rc = st_weight(m, &s, "model.norm.weight", 0, d, 0, "hidden_size", &m->final_norm, NULL,
                       err);
    if (!rc)
        rc = st_weight(m, &s, "lm_head.weight", V, d, c.tied_embeddings,
                       "vocab_size x hidden_size; tie_word_embeddings is false", NULL,
                       &m->classifier, err);
    if (!rc && !m->classifier.data) m->classifier = m->tok_emb;
    if (!rc && m->classifier.data == m->tok_emb.data) m->cfg.tied_embeddings = 1;
    if (!rc) {
        hf_walk w = {m, &s, err};
        rc = kv_layer_roles_each(&c, m->layers, load_role, &w);
    }
    if (!rc) {
        const char **paths = calloc((size_t)s.n_files + 1, sizeof *paths);
        if (!paths)
            rc = kv_fail(err, KV_EINTERNAL, "out of memory");
        else {
            /* config.json from disk, the shards as loaded (the bytes the weights are in) */
            const void **bufs = calloc((size_t)s.n_files + 1, sizeof *bufs);
            size_t *lens = calloc((size_t)s.n_files + 1, sizeof *lens);
            if (!bufs || !lens) rc = kv_fail(err, KV_EINTERNAL, "out of memory");
            paths[0] = cfg_path;
            for (int i = 0; i < s.n_files && !rc; i++) {
                paths[i + 1] = s.files[i].path;
                bufs[i + 1] = s.files[i].data;
                lens[i + 1] = s.files[i].len;
            }
            if (!rc) rc = kv_sha256_parts(paths, bufs, lens, s.n_files + 1, m->sha256, err);
            free(lens);
            free(bufs);
            free(paths);
        }
    }
    st_set_free(&s); /* shard data is owned by the model */
    if (rc) {
        kv_model_free(m);
        return rc;
    }
    *out = m;
    return KV_OK;
}
