/* kvplan tokenizer formats: the registry that sends a tokenizer file (or a model's embedded or
 * neighbouring tokenizer) to its reader. See include/kvplan/tokenizer.h (kv_tokenizer_load). The
 * readers (tokenizer.c: llama2.c tokenizer.bin; tokenizer_bpe.c: tokenizer.json;
 * tokenizer_gguf.c: GGUF metadata) never call back into this file. */
#include "kvplan/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf_meta.h"
#include "tokenizer/tokenizer_bpe.h"

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* What a probe sees: the first four bytes and the first byte that is not blank. */
typedef struct kv_tok_probe_in {
    unsigned char head[4];
    size_t n_head;
    int first; /* first non-blank byte, or EOF */
} kv_tok_probe_in;

typedef struct kv_tok_format {
    const char *name;
    int (*probe)(const kv_tok_probe_in *in); /* 1: this reader takes the file */
    int (*load)(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);
} kv_tok_format;

static int probe_gguf(const kv_tok_probe_in *in) {
    return in->n_head == 4 && memcmp(in->head, "GGUF", 4) == 0;
}
static int load_gguf(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    (void)m;
    kv_gguf *g = NULL;
    int rc = kv_gguf_open(path, &g, err);
    if (!rc) rc = kv_tokenizer_load_gguf(g, out, err);
    kv_gguf_close(g);
    return rc;
}
static int probe_json(const kv_tok_probe_in *in) {
    return in->first == '{'; /* a tokenizer.json */
}
static int probe_llama2c(const kv_tok_probe_in *in) {
    (void)in;
    return 1; /* no magic: the reader validates the file itself */
}
static int load_llama2c(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    return kv_tokenizer_load_llama2c(path, m ? m->cfg.vocab_size : 0, out, err);
}

/* In probe order: the magic-less llama2.c tokenizer.bin last. */
static const kv_tok_format kv_tok_formats[] = {
    {"gguf", probe_gguf, load_gguf},
    {"tokenizer.json", probe_json, kv_tokenizer_load_json},
    {"llama2c", probe_llama2c, load_llama2c},
};

/* A tokenizer file, its format detected from the content. m may be NULL. */
static int load_path(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    int rc = kv_check_regular(path, "tokenizer", err); /* a FIFO would block the sniff below */
    if (rc) return rc;
    FILE *f = fopen(path, "rb");
    if (!f) return kv_fail(err, KV_EINPUT, "%s: cannot open tokenizer: %s", path, strerror(errno));
    kv_tok_probe_in in = {{0}, 0, EOF};
    in.n_head = fread(in.head, 1, 4, f);
    for (size_t i = 0;; i++) {
        int c = i < in.n_head ? in.head[i] : fgetc(f);
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
            in.first = c;
            break;
        }
    }
    fclose(f);
    for (size_t i = 0; i < sizeof kv_tok_formats / sizeof kv_tok_formats[0]; i++)
        if (kv_tok_formats[i].probe(&in)) return kv_tok_formats[i].load(path, m, out, err);
    return kv_fail(err, KV_EINPUT, "%s: not a tokenizer kvplan reads", path);
}

int kv_tokenizer_load(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    int rc;
    if (!path && !m)
        return kv_fail(err, KV_EINTERNAL, "kv_tokenizer_load needs a tokenizer path or a model");
    if (path) {
        rc = load_path(path, m, out, err);
    } else if (strcmp(m->format, "gguf") == 0) {
        if (!m->gguf) return kv_fail(err, KV_EINTERNAL, "%s: GGUF metadata was not kept", m->path);
        rc = kv_tokenizer_load_gguf(m->gguf, out, err);
    } else if (strcmp(m->format, "safetensors") == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/tokenizer.json", m->path);
        rc = kv_tokenizer_load_json(p, m, out, err);
    } else {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", m->path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/tokenizer.bin", dir);
        snprintf(b, sizeof b, "%s/tok%d.bin", dir, m->cfg.vocab_size);
        if (file_exists(a))
            rc = load_path(a, m, out, err);
        else if (file_exists(b))
            rc = load_path(b, m, out, err);
        else
            return kv_fail(err, KV_EINPUT,
                           "%s: no tokenizer found beside the model (looked for %s and %s); "
                           "pass --tokenizer PATH",
                           m->path, a, b);
    }
    if (rc) return rc;
    if (m && (*out)->vocab_size != m->cfg.vocab_size) {
        int v = (*out)->vocab_size;
        kv_tokenizer_free(*out);
        *out = NULL;
        return kv_fail(err, KV_EINPUT,
                       "tokenizer %s has %d tokens but the model %s has a vocabulary of %d: they "
                       "do not belong together",
                       path ? path : "(embedded)", v, m->path, m->cfg.vocab_size);
    }
    return KV_OK;
}
