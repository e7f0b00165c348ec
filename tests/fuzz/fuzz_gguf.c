/* libFuzzer target: the GGUF reader (runtime/model/gguf.c): header, metadata, tensor table and
 * weights through kv_model_load, then the embedded vocabulary through kv_tokenizer_load with
 * an encode / decode round of a fixed text. */
#include "fuzz_util.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fz_memfile("model.gguf", data, size, path);
    if (fd < 0) return 0;
    kv_error err = {0};
    kv_model *m = NULL;
    if (kv_model_load(path, &m, &err) == KV_OK) {
        kv_tokenizer *t = NULL;
        if (kv_tokenizer_load(NULL, m, &t, &err) == KV_OK) {
            static const char text[] = "Once upon a time, ab cd\n\xc3\xa9!";
            int *ids = NULL, n = 0;
            if (kv_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n, &err) == KV_OK) {
                char *out = NULL;
                if (kv_tokenizer_decode(t, ids, n, &out, &err) == KV_OK) free(out);
            }
            free(ids);
            kv_tokenizer_free(t);
        }
        kv_model_free(m);
    }
    close(fd);
    return 0;
}
