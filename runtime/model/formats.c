/* kvplan model formats: the registry that sends a path to its reader. See include/kvplan/model.h
 * (kv_model_load). Each format is one row {name, probe, load}; the first row whose probe accepts
 * the path loads it. The readers live in their own files (llama2c.c, gguf.c, hf.c) and never call
 * back into this one, which is what keeps the model room free of call cycles. */
#include "kvplan/model.h"
#include "model/model_impl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* What a probe sees: the path's stat and, for a regular file, its first four bytes. */
typedef struct kv_model_probe_in {
    const char *path;
    int is_dir;
    unsigned char magic[4];
    size_t n_magic; /* bytes of magic read (0..4) */
} kv_model_probe_in;

typedef struct kv_model_format {
    const char *name;
    int (*probe)(const kv_model_probe_in *in); /* 1: this format's reader takes the path */
    int (*load)(const char *path, kv_model **out, kv_error *err);
} kv_model_format;

static int probe_hf(const kv_model_probe_in *in) {
    return in->is_dir; /* a Hugging Face directory: config.json + safetensors */
}

static int probe_gguf(const kv_model_probe_in *in) {
    return !in->is_dir && in->n_magic == 4 && memcmp(in->magic, "GGUF", 4) == 0;
}

static int probe_llama2c(const kv_model_probe_in *in) {
    return !in->is_dir; /* no magic: the llama2.c reader validates the header itself */
}

/* In probe order: the magic-less llama2.c checkpoint last. */
static const kv_model_format kv_model_formats[] = {
    {"safetensors", probe_hf, kv_model_load_hf},
    {"gguf", probe_gguf, kv_model_load_gguf},
    {"llama2c", probe_llama2c, kv_model_load_llama2c},
};

int kv_model_load(const char *path, kv_model **out, kv_error *err) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return kv_fail(err, KV_EINPUT, "%s: cannot open model: %s", path, strerror(errno));
    kv_model_probe_in in = {path, S_ISDIR(st.st_mode), {0}, 0};
    if (!in.is_dir) {
        /* a FIFO or a device would block or never end: refused before it is opened */
        int rc = kv_check_regular(path, "model", err);
        if (rc) return rc;
        FILE *f = fopen(path, "rb");
        if (!f) return kv_fail(err, KV_EINPUT, "%s: cannot open model: %s", path, strerror(errno));
        in.n_magic = fread(in.magic, 1, sizeof in.magic, f);
        fclose(f);
    }
    for (size_t i = 0; i < sizeof kv_model_formats / sizeof kv_model_formats[0]; i++) {
        const kv_model_format *fmt = &kv_model_formats[i];
        if (!fmt->probe(&in)) continue;
        int rc = fmt->load(path, out, err);
        if (rc == KV_OK) snprintf((*out)->path, sizeof(*out)->path, "%s", path);
        return rc;
    }
    return kv_fail(err, KV_EINPUT,
                   "%s: not a model kvplan reads (llama2.c .bin, GGUF or a "
                   "Hugging Face directory)",
                   path);
}
