/* GGUF loader: placeholder until the GGUF reader lands (issue 3). */
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

#include <stdlib.h>

int kv_model_load_gguf(const char *path, kv_model **out, kv_error *err) {
    *out = NULL;
    return kv_fail(err, KV_EINPUT, "%s: GGUF models are not supported by this build yet", path);
}

void kv_gguf_meta_free(void *meta) {
    free(meta);
}

int kv_tokenizer_load_gguf(const kv_model *m, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_load_gguf(const kv_model *m, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    return kv_fail(err, KV_EINPUT, "%s: GGUF tokenizers are not supported by this build yet", m->path);
}
