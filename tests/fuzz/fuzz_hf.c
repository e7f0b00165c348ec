/* libFuzzer target: the Hugging Face checkpoint loader (runtime/model/hf.c): config.json and the
 * safetensors header. Input layout: a 2-byte little-endian length n, n bytes of config.json,
 * then model.safetensors. Both go into a private directory made once per process. */
#include <sys/stat.h>

#include "fuzz_util.h"
#include "kvplan/model.h"
#include "model/model_impl.h"

static char dir[64];

/* the private directory goes when the fuzzer exits */
static void cleanup(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    rmdir(dir);
}

static int put(const char *name, const uint8_t *p, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvplan-fuzz-hf.XXXXXX");
        if (!mkdtemp(dir)) abort();
        atexit(cleanup);
    }
    if (size < 2) return 0;
    size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    if (n > size - 2) n = size - 2;
    if (put("config.json", data + 2, n) || put("model.safetensors", data + 2 + n, size - 2 - n))
        return 0;
    kv_error err = {0};
    kv_model *m = NULL;
    if (kv_model_load_hf(dir, &m, &err) == KV_OK) kv_model_free(m);
    return 0;
}
