/* llama2.c legacy ("v0") checkpoint loader: the file is read into memory the model owns
 * (kv_file_load) and the weights point into that buffer.
 *
 * Layout (karpathy/llama2.c run.c, legacy export): 7 int32 header fields
 * (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size
 * means an untied classifier follows), then fp32 arrays in this order: token embedding
 * [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim],
 * wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden],
 * w3 [L, hidden, dim], rms_final [dim], freq_cis_real [seq_len, head_dim/2],
 * freq_cis_imag [seq_len, head_dim/2], then wcls [vocab, dim] when untied.
 * The file size must match the header exactly: a truncated or padded file is refused.
 */
#include "kvplan/model.h"
#include "model/model_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The config from the 7 header fields, and the size the whole file must have. */
static int parse_header(const char *path, const int32_t hdr[7], size_t size, kv_config *out,
                        kv_error *err) {
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = hdr[0];
    c.hidden_dim = hdr[1];
    c.n_layers = hdr[2];
    c.n_heads = hdr[3];
    c.n_kv_heads = hdr[4];
    if (hdr[5] == INT32_MIN) /* -hdr[5] would overflow */
        return kv_fail(err, KV_EINPUT,
                       "%s: vocab_size field is %d: not a llama2.c legacy checkpoint", path,
                       (int)hdr[5]);
    int shared = hdr[5] > 0;
    c.vocab_size = hdr[5] > 0 ? hdr[5] : -hdr[5];
    c.seq_len = hdr[6];
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.rope_layout = KV_ROPE_ADJACENT;
    c.tied_embeddings = shared;
    c.bos_id = 1;
    c.eos_id = 2;
    snprintf(c.arch, sizeof c.arch, "llama");
    c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
    if (kv_config_check(&c, path, err))
        return kv_fail_context(err, "not a llama2.c legacy checkpoint (header fields invalid)");
    if (c.dim % c.n_heads)
        return kv_fail(err, KV_EINPUT, "%s: dim %d is not a multiple of n_heads %d", path, c.dim,
                       c.n_heads);
    size_t d = (size_t)c.dim, L = (size_t)c.n_layers, V = (size_t)c.vocab_size,
           hid = (size_t)c.hidden_dim, kvd = (size_t)c.n_kv_heads * c.head_dim,
           hs = (size_t)c.head_dim;
    size_t floats = V * d + L * d + L * d * d + 2 * L * kvd * d + L * d * d + L * d +
                    3 * L * hid * d + d + (size_t)c.seq_len * hs;
    if (!shared) floats += V * d;
    size_t expect = 7 * sizeof(int32_t) + floats * sizeof(float);
    if (size != expect)
        return kv_fail(err, KV_EINPUT,
                       "%s: file is %zu bytes but its header (dim %d, hidden %d, %d layers, %d "
                       "heads, %d KV heads, vocab %d, seq_len %d) needs exactly %zu: the file is "
                       "%s; re-download or re-export it",
                       path, size, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                       c.vocab_size, c.seq_len, expect, size < expect ? "truncated" : "oversized");
    *out = c;
    return KV_OK;
}

static int too_short(const char *path, size_t size, kv_error *err) {
    return kv_fail(err, KV_EINPUT,
                   "%s: too short for a llama2.c checkpoint (%zu bytes, the header alone is 28); "
                   "is this the right file?",
                   path, size);
}

int kv_model_load_llama2c(const char *path, kv_model **out, kv_error *err) {
    *out = NULL;
    /* the header and the file's size first: a wrong file is refused before it is read whole */
    int fd = -1;
    uint64_t size64 = 0;
    int rc = kv_open_regular(path, "model", 0, &fd, &size64, err);
    if (rc) return rc;
    int32_t hdr[7];
    size_t size = (size_t)size64;
    int short_file = size < sizeof hdr || pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr;
    close(fd);
    if (short_file) return too_short(path, size, err);
    kv_config c;
    if ((rc = parse_header(path, hdr, size, &c, err))) return rc;
    /* then the whole file into memory the model owns (no map a truncation could pull away);
     * the header is parsed again from the loaded bytes, which are what the model uses */
    void *buf = NULL;
    if ((rc = kv_file_load(path, "model", 0, &buf, &size, err))) return rc;
    if (size < sizeof hdr) {
        free(buf);
        return too_short(path, size, err);
    }
    memcpy(hdr, buf, sizeof hdr);
    if ((rc = parse_header(path, hdr, size, &c, err))) {
        free(buf);
        return rc;
    }
    kv_model *m = kv_model_alloc(c.n_layers, err);
    if (!m) {
        free(buf);
        return KV_EINTERNAL;
    }
    if ((rc = kv_model_adopt(m, buf, err))) { /* frees buf itself on failure */
        kv_model_free(m);
        return rc;
    }
    m->cfg = c;
    snprintf(m->format, sizeof m->format, "llama2c");
    int shared = c.tied_embeddings;
    size_t d = (size_t)c.dim, L = (size_t)c.n_layers, V = (size_t)c.vocab_size,
           hid = (size_t)c.hidden_dim, kvd = (size_t)c.n_kv_heads * c.head_dim,
           hs = (size_t)c.head_dim;
    const float *p = (const float *)((const char *)buf + sizeof hdr);
    m->tok_emb = kv_weight_f32(p);
    p += V * d;
    const float *rms_att = p;
    p += L * d;
    const float *wq = p;
    p += L * d * d;
    const float *wk = p;
    p += L * kvd * d;
    const float *wv = p;
    p += L * kvd * d;
    const float *wo = p;
    p += L * d * d;
    const float *rms_ffn = p;
    p += L * d;
    const float *w1 = p;
    p += L * hid * d;
    const float *w2 = p;
    p += L * d * hid;
    const float *w3 = p;
    p += L * hid * d;
    m->final_norm = p;
    p += d;
    p += (size_t)c.seq_len * hs; /* freq_cis_real, freq_cis_imag (unused: RoPE is computed) */
    m->classifier = shared ? m->tok_emb : kv_weight_f32(p);
    for (size_t l = 0; l < L; l++) {
        kv_layer_weights *w = &m->layers[l];
        w->attn_norm = rms_att + l * d;
        w->wq = kv_weight_f32(wq + l * d * d);
        w->wk = kv_weight_f32(wk + l * kvd * d);
        w->wv = kv_weight_f32(wv + l * kvd * d);
        w->wo = kv_weight_f32(wo + l * d * d);
        w->ffn_norm = rms_ffn + l * d;
        w->w_gate = kv_weight_f32(w1 + l * hid * d);
        w->w_down = kv_weight_f32(w2 + l * d * hid);
        w->w_up = kv_weight_f32(w3 + l * hid * d);
    }
    /* model_sha256 of the bytes loaded, which are the file's */
    const void *bytes = buf;
    rc = kv_sha256_parts(&path, &bytes, &size, 1, m->sha256, err);
    if (rc) {
        kv_model_free(m);
        return rc;
    }
    *out = m;
    return KV_OK;
}
