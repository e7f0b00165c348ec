/* Hugging Face safetensors loader: placeholder until the reader lands (issue 3). */
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

int kv_model_load_hf(const char *dir, kv_model **out, kv_error *err) {
    *out = NULL;
    return kv_fail(err, KV_EINPUT, "%s: Hugging Face directories are not supported by this build yet",
                   dir);
}

int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    (void)m;
    *out = NULL;
    return kv_fail(err, KV_EINPUT, "%s: tokenizer.json is not supported by this build yet", path);
}
