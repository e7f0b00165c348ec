/* The weight types' traits table (quant_traits.h) and the public type table of
 * include/kvplan/quant.h read from it: names, block sizes and bytes, row sizes, parsing, and
 * the integer dot kernel of a type and ISA. Names as ggml.h's enum ggml_type (ggml.c's
 * type_traits .type_name). */
#include "quant/quant_traits.h"

#include <string.h>
#include <strings.h>

#include "quant/quant_kernels.h"

/* A kernel that exists only for the types with integer kernels (ints 1), and only on x86-64. */
#define KV_IF_0(fn) NULL
#define KV_IF_1(fn) fn
#ifdef KV_QK_X86
#define X86(fn) fn
#else
#define X86(fn) NULL
#endif

#define ROW(T, block, bytes, has_min, zero, qs, qh, act, group, sgn, ints)                         \
    [KV_DT_##T] = {                                                                                \
        #T,                                                                                        \
        {block, bytes, has_min, zero, qs, qh, act, group, sgn},                                    \
        {kv_qk_dequant_##T, X86(kv_qk_dequant_avx2_##T), X86(kv_qk_dequant_avx2_##T)},             \
        kv_qk_quantize_##T,                                                                        \
        {kv_qk_dot_##T, X86(kv_qk_dot_avx2_##T), X86(kv_qk_dot_avx2_##T)},                         \
        {KV_IF_##ints(kv_qk_qdot_c_##T), X86(KV_IF_##ints(kv_qk_qdot_avx2_##T)),                   \
         X86(KV_IF_##ints(kv_qk_qdot_vnni_##T))},                                                  \
        KV_IF_##ints(kv_qk_repack_##T),                                                            \
        {NULL, X86(KV_IF_##ints(kv_qk_pack_avx2_##T)), X86(KV_IF_##ints(kv_qk_pack_avx2_##T))},    \
    },

/* The rows of KV_QTYPES, then ggml's other ids by name (ggml.h enum ggml_type). */
/* clang-format off */
static const kv_qtraits kv_qtraits_table[KV_QTYPE_IDS] = {
    KV_QTYPES(ROW)
    [4] = {.name = "Q4_2(removed)"}, [5] = {.name = "Q4_3(removed)"}, [9] = {.name = "Q8_1"},
    [10] = {.name = "Q2_K"},     [11] = {.name = "Q3_K"},   [15] = {.name = "Q8_K"},
    [16] = {.name = "IQ2_XXS"},  [17] = {.name = "IQ2_XS"}, [18] = {.name = "IQ3_XXS"},
    [19] = {.name = "IQ1_S"},    [20] = {.name = "IQ4_NL"}, [21] = {.name = "IQ3_S"},
    [22] = {.name = "IQ2_S"},    [23] = {.name = "IQ4_XS"}, [24] = {.name = "I8"},
    [25] = {.name = "I16"},      [26] = {.name = "I32"},    [27] = {.name = "I64"},
    [28] = {.name = "F64"},      [29] = {.name = "IQ1_M"},
};
/* clang-format on */

#define ONE(...) +1
_Static_assert(0 KV_QTYPES(ONE) == KV_DT_COUNT, "one KV_QTYPES row per kv_dtype");

static const kv_qtraits kv_qtraits_unknown = {.name = "unknown"};

const kv_qtraits *kv_qtraits_get(kv_dtype t) {
    return (unsigned)t < KV_QTYPE_IDS ? &kv_qtraits_table[t] : &kv_qtraits_unknown;
}

#define ID(T, ...) KV_DT_##T,
const kv_dtype kv_dtype_all[KV_DT_COUNT] = {KV_QTYPES(ID)};

int kv_dtype_block(kv_dtype t) {
    return kv_qtraits_get(t)->b.block;
}

size_t kv_dtype_block_bytes(kv_dtype t) {
    return (size_t)kv_qtraits_get(t)->b.bytes;
}

int kv_dtype_supported(uint32_t ggml_type) {
    return ggml_type < KV_QTYPE_IDS && kv_qtraits_table[ggml_type].b.block > 0;
}

const char *kv_dtype_name(uint32_t t) {
    return t < KV_QTYPE_IDS ? kv_qtraits_table[t].name : kv_qtraits_unknown.name;
}

int kv_dtype_parse(const char *name, kv_dtype *out, kv_error *err) {
    for (int i = 0; i < KV_DT_COUNT; i++)
        if (strcasecmp(name, kv_qtraits_get(kv_dtype_all[i])->name) == 0) {
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

kv_qdot_fn kv_qdot_kernel(kv_dtype t, kv_isa isa) {
    if ((unsigned)isa >= KV_ISA_COUNT || !kv_isa_available(isa)) return NULL;
    return kv_qtraits_get(t)->qdot[isa];
}
