/* libFuzzer target: the Hugging Face tokenizer.json reader and its byte-level / SentencePiece
 * BPE (runtime/tokenizer/tokenizer_bpe.c), with encode / decode of a fixed text and of the input's
 * tail, and a decode of every id. */
#include "fuzz_util.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

/* implemented in runtime/tokenizer/tokenizer_bpe.c (declared where the dispatcher uses it) */
int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fz_memfile("tokenizer.json", data, size, path);
    if (fd < 0) return 0;
    kv_error err = {0};
    kv_tokenizer *t = NULL;
    if (kv_tokenizer_load_json(path, NULL, &t, &err) == KV_OK) {
        static const char text[] = "Hello world, ab cd!\n  \xc3\xa9\xe2\x96\x81 <s> 12";
        const char *texts[2] = {text, (const char *)data + (size > 32 ? size - 32 : 0)};
        size_t lens[2] = {sizeof text - 1, size > 32 ? 32 : size};
        for (int k = 0; k < 2; k++) {
            int *ids = NULL, n = 0;
            if (kv_tokenizer_encode(t, texts[k], lens[k], -1, &ids, &n, &err) == KV_OK) {
                char *out = NULL;
                if (kv_tokenizer_decode(t, ids, n, &out, &err) == KV_OK) free(out);
            }
            free(ids);
        }
        int nv = kv_tokenizer_vocab_size(t) < 4096 ? kv_tokenizer_vocab_size(t) : 4096;
        int *all = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *all);
        if (all) {
            for (int i = 0; i < nv; i++) all[i] = i;
            char *out = NULL;
            if (kv_tokenizer_decode(t, all, nv, &out, &err) == KV_OK) free(out);
            free(all);
        }
        kv_tokenizer_free(t);
    }
    close(fd);
    return 0;
}
