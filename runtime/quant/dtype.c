/* Weight data types: the type table of include/kvplan/quant.h (block sizes and bytes from the
 * traits table, quant_traits.h; names, row bytes), shared by the decoders (quant.c) and the
 * integer dot products (quant_dot.c). Layouts as ggml's ggml-common.h and the GGUF spec
 * (docs/gguf.md). */
#include "kvplan/quant.h"
#include "quant/quant_traits.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

const kv_dtype kv_dtype_all[KV_DT_COUNT] = {KV_DT_F32,  KV_DT_F16,  KV_DT_BF16, KV_DT_Q8_0,
                                            KV_DT_Q4_0, KV_DT_Q4_1, KV_DT_Q5_0, KV_DT_Q5_1,
                                            KV_DT_Q4_K, KV_DT_Q5_K, KV_DT_Q6_K};

int kv_dtype_block(kv_dtype t) {
    return kv_qtraits_get(t).block;
}

size_t kv_dtype_block_bytes(kv_dtype t) {
    return (size_t)kv_qtraits_get(t).bytes;
}

int kv_dtype_supported(uint32_t ggml_type) {
    for (int i = 0; i < KV_DT_COUNT; i++)
        if ((uint32_t)kv_dtype_all[i] == ggml_type) return 1;
    return 0;
}

const char *kv_dtype_name(uint32_t t) {
    /* ggml.h enum ggml_type, ids 0..30 */
    static const char *names[] = {
        "F32",   "F16",   "Q4_0",    "Q4_1",   "Q4_2(removed)", "Q4_3(removed)", "Q5_0",
        "Q5_1",  "Q8_0",  "Q8_1",    "Q2_K",   "Q3_K",          "Q4_K",          "Q5_K",
        "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS",       "IQ1_S",         "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS",  "I8",     "I16",           "I32",           "I64",
        "F64",   "IQ1_M", "BF16"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

int kv_dtype_parse(const char *name, kv_dtype *out, kv_error *err) {
    for (int i = 0; i < KV_DT_COUNT; i++)
        if (strcasecmp(name, kv_dtype_name((uint32_t)kv_dtype_all[i])) == 0) {
            *out = kv_dtype_all[i];
            return KV_OK;
        }
    return kv_fail(err, KV_EINPUT,
                   "unknown weight type '%s' (kvplan knows F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                   "Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                   name);
}

int kv_dtype_row_bytes(kv_dtype t, int64_t n, const char *what, size_t *bytes, kv_error *err) {
    int qk = kv_dtype_block(t);
    if (!qk)
        return kv_fail(err, KV_EINPUT,
                       "%s: ggml type %d (%s) is not one kvplan reads (F32, F16, BF16, Q8_0, "
                       "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                       what ? what : "tensor", (int)t, kv_dtype_name((uint32_t)t));
    if (n <= 0 || n % qk)
        return kv_fail(err, KV_EINPUT,
                       "%s: a row of %lld elements cannot be stored as %s, whose blocks hold %d "
                       "elements (the row length must be a positive multiple of %d)",
                       what ? what : "tensor", (long long)n, kv_dtype_name((uint32_t)t), qk, qk);
    *bytes = (size_t)(n / qk) * kv_dtype_block_bytes(t);
    return KV_OK;
}
