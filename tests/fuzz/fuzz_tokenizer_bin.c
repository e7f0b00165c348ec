/* libFuzzer target: the llama2.c tokenizer.bin reader (runtime/tokenizer/tokenizer.c). The first
 * byte picks the vocabulary size the reader is told (1..256), the rest is the file; a loaded
 * tokenizer encodes a fixed text and the input's tail, and decodes every id once. */
#include "fuzz_util.h"
#include "kvplan/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int vocab = 1 + data[0];
    char path[64];
    int fd = fz_memfile("tokenizer.bin", data + 1, size - 1, path);
    if (fd < 0) return 0;
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    if (kv_tokenizer_load_llama2c(path, vocab, &t, &err) == KV_OK) {
        static const char text[] = "Once upon a time abcde <0x41> \xe2\x96\x81x";
        const char *texts[2] = {text, (const char *)data + (size > 33 ? size - 32 : 1)};
        size_t lens[2] = {sizeof text - 1, size > 33 ? 32 : size - 1};
        for (int k = 0; k < 2; k++) {
            int *ids = NULL, n = 0;
            if (kv_tokenizer_encode(t, texts[k], lens[k], 1, &ids, &n, &err) == KV_OK) {
                char *out = NULL;
                if (kv_tokenizer_decode(t, ids, n, &out, &err) == KV_OK) free(out);
            }
            free(ids);
        }
        int *all = malloc((size_t)vocab * sizeof *all);
        if (all) {
            for (int i = 0; i < vocab; i++) all[i] = i;
            char *out = NULL;
            if (kv_tokenizer_decode(t, all, vocab, &out, &err) == KV_OK) free(out);
            free(all);
        }
        kv_tokenizer_free(t);
    }
    close(fd);
    return 0;
}
