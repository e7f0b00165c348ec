/* Weight types in their own type: runtime/quant/quant.c.
 *
 *   - the type table (block sizes and bytes: ggml-common.h's static_asserts on the block_*
 *     structs) and row sizes;
 *   - every block layout on hand-built blocks: d, dmin, scales and quants set byte by byte, the
 *     expected values written element by element from the format's definition (ggml-common.h /
 *     ggml-quants.c dequantize_row_*), plus values worked out by hand;
 *   - quantise -> dequantise error on real weights (TinyStories-656K, F32 safetensors) against
 *     bounds that follow from each type's definition, and pinned relative RMS errors;
 *   - typed dot products (AVX2 and portable kernels) and the typed matmul (dot path, tiled GEMM
 *     path, F32 BLAS path) against the dequantise-then-fp32 reference computed in double;
 *   - the integer dots with 8-bit activations (issue 23): every isa's kernel equals the
 *     portable one bit for bit, and the error against fp32 stays within the activation rounding;
 *   - whole models written by the test GGUF writer (tests/support/gguf_writer.c): 656K in F32,
 *     Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (perplexity against F32), and the K-quants on a synthetic model
 *     whose rows are multiples of 256 (logits against F32). */
#include <CUnit/CUnit.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvplan/eval.h"
#include "engine/forward.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/quant.h"
#include "kvplan/tokenizer.h"
#include "quant/quant_dot.h"
#include "quant/quant_gemm.h"
#include "gguf_writer.h"
#include "synthetic.h"
#include "testutil.h"

#define M656 "models/tinystories-656k"
#define TEXT "text/tinystories_val_head.txt"

/* ---- type table ---- */

static void test_type_table(void) {
    /* block sizes from ggml-common.h (QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32, QK_K = 256)
     * and the byte sizes its static_asserts pin */
    struct {
        kv_dtype t;
        int block;
        size_t bytes;
        const char *name;
    } want[] = {{KV_DT_F32, 1, 4, "F32"},       {KV_DT_F16, 1, 2, "F16"},
                {KV_DT_BF16, 1, 2, "BF16"},     {KV_DT_Q8_0, 32, 34, "Q8_0"},
                {KV_DT_Q4_0, 32, 18, "Q4_0"},   {KV_DT_Q4_1, 32, 20, "Q4_1"},
                {KV_DT_Q5_0, 32, 22, "Q5_0"},   {KV_DT_Q5_1, 32, 24, "Q5_1"},
                {KV_DT_Q4_K, 256, 144, "Q4_K"}, {KV_DT_Q5_K, 256, 176, "Q5_K"},
                {KV_DT_Q6_K, 256, 210, "Q6_K"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CU_ASSERT_EQUAL(kv_dtype_block(want[i].t), want[i].block);
        CU_ASSERT_EQUAL(kv_dtype_block_bytes(want[i].t), want[i].bytes);
        CU_ASSERT_STRING_EQUAL(kv_dtype_name(want[i].t), want[i].name);
        CU_ASSERT(kv_dtype_supported(want[i].t));
        kv_dtype p;
        CU_ASSERT_EQUAL(kv_dtype_parse(want[i].name, &p, NULL), KV_OK);
        CU_ASSERT_EQUAL(p, want[i].t);
    }
    /* the GGUF ids (ggml.h enum ggml_type) */
    CU_ASSERT_EQUAL(KV_DT_Q4_0, 2);
    CU_ASSERT_EQUAL(KV_DT_Q8_0, 8);
    CU_ASSERT_EQUAL(KV_DT_Q4_K, 12);
    CU_ASSERT_EQUAL(KV_DT_Q6_K, 14);
    CU_ASSERT_EQUAL(KV_DT_BF16, 30);
    CU_ASSERT_FALSE(kv_dtype_supported(10)); /* Q2_K */
    CU_ASSERT_FALSE(kv_dtype_supported(9));  /* Q8_1 */
    CU_ASSERT_STRING_EQUAL(kv_dtype_name(10), "Q2_K");
    size_t b = 0;
    kv_error err = {0};
    CU_ASSERT_EQUAL(kv_dtype_row_bytes(KV_DT_Q4_K, 4096, "x", &b, &err), KV_OK);
    CU_ASSERT_EQUAL(b, 16 * 144);
    CU_ASSERT_EQUAL(kv_dtype_row_bytes(KV_DT_Q8_0, 4096, "x", &b, &err), KV_OK);
    CU_ASSERT_EQUAL(b, 128 * 34);
    CU_ASSERT_EQUAL(kv_dtype_row_bytes(KV_DT_F16, 172, "x", &b, &err), KV_OK);
    CU_ASSERT_EQUAL(b, 344);
    CU_ASSERT_EQUAL(kv_dtype_row_bytes(KV_DT_Q4_K, 128, "blk.0.attn_q.weight", &b, &err),
                    KV_EINPUT);
    printf("\n  %s", err.msg);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "blk.0.attn_q.weight"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "multiple of 256"));
    CU_ASSERT_EQUAL(kv_dtype_row_bytes((kv_dtype)10, 256, "t", &b, &err), KV_EINPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "Q2_K"));
    kv_dtype p;
    CU_ASSERT_EQUAL(kv_dtype_parse("q4_k", &p, &err), KV_OK);
    CU_ASSERT_EQUAL(p, KV_DT_Q4_K);
    CU_ASSERT_EQUAL(kv_dtype_parse("Q3_K", &p, &err), KV_EINPUT);
}

/* ---- hand-built blocks ---- */

/* little-endian binary16 bit patterns: 0.25, 0.5, 1.0, -2.0 */
#define H_0_25 0x3400
#define H_0_5 0x3800
#define H_1 0x3C00
#define H_M2 0xC000
static void put16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)(v >> 8);
}

static void dequant(kv_dtype t, const unsigned char *blk, float *y, int n) {
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_dequantize_row(t, blk, y, n, &err), KV_OK);
}

static int all_equal(const float *y, const float *want, int n) {
    for (int i = 0; i < n; i++)
        if (y[i] != want[i]) {
            printf("\n  element %d: got %g, want %g", i, y[i], want[i]);
            return 0;
        }
    return 1;
}

static void test_blocks_32(void) {
    unsigned char b[2 * 34];
    float y[64], want[64];
    /* Q8_0: d = 0.5, q[j] = j - 16 -> 0.5 (j - 16); two blocks, the second with d = 1 */
    put16(b, H_0_5);
    for (int j = 0; j < 32; j++) b[2 + j] = (unsigned char)(signed char)(j - 16);
    put16(b + 34, H_1);
    for (int j = 0; j < 32; j++) b[36 + j] = (unsigned char)(signed char)(127 - 8 * j);
    dequant(KV_DT_Q8_0, b, y, 64);
    for (int j = 0; j < 32; j++) want[j] = 0.5f * (float)(j - 16), want[32 + j] = 127.0f - 8 * j;
    CU_ASSERT(all_equal(y, want, 64));
    CU_ASSERT_EQUAL(y[0], -8.0f);
    CU_ASSERT_EQUAL(y[31], 7.5f);
    CU_ASSERT_EQUAL(y[63], -121.0f);

    /* qs[j] = j | (15 - j) << 4: element j is the low nibble j, element j + 16 the high one */
    unsigned char qs[16];
    for (int j = 0; j < 16; j++) qs[j] = (unsigned char)(j | (15 - j) << 4);

    /* Q4_0: d = 0.25, x = d (nibble - 8) */
    put16(b, H_0_25);
    memcpy(b + 2, qs, 16);
    dequant(KV_DT_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) want[j] = 0.25f * (j - 8), want[16 + j] = 0.25f * (7 - j);
    CU_ASSERT(all_equal(y, want, 32));
    CU_ASSERT_EQUAL(y[0], -2.0f);
    CU_ASSERT_EQUAL(y[16], 1.75f);
    CU_ASSERT_EQUAL(y[31], -2.0f);

    /* Q4_1: d = 0.5, m = -2, x = d nibble + m */
    put16(b, H_0_5);
    put16(b + 2, H_M2);
    memcpy(b + 4, qs, 16);
    dequant(KV_DT_Q4_1, b, y, 32);
    for (int j = 0; j < 16; j++) want[j] = 0.5f * j - 2, want[16 + j] = 0.5f * (15 - j) - 2;
    CU_ASSERT(all_equal(y, want, 32));
    CU_ASSERT_EQUAL(y[31], -2.0f);
    CU_ASSERT_EQUAL(y[16], 5.5f);

    /* Q5_0: d = 1, qh = 0xF0F0A5A5 (bytes a5 a5 f0 f0): bit j is element j's fifth bit;
     * x = d ((nibble | bit << 4) - 16) */
    unsigned char qh[4] = {0xa5, 0xa5, 0xf0, 0xf0};
    uint32_t h = 0xF0F0A5A5u;
    put16(b, H_1);
    memcpy(b + 2, qh, 4);
    memcpy(b + 6, qs, 16);
    dequant(KV_DT_Q5_0, b, y, 32);
    for (int j = 0; j < 32; j++) {
        int nib = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
        want[j] = (float)((nib | (int)((h >> j) & 1) << 4) - 16);
    }
    CU_ASSERT(all_equal(y, want, 32));
    CU_ASSERT_EQUAL(y[0], 0.0f);   /* nibble 0, bit 0 of 0xa5 set: 16 - 16 */
    CU_ASSERT_EQUAL(y[1], -15.0f); /* nibble 1, bit 1 clear */
    CU_ASSERT_EQUAL(y[16], -1.0f); /* nibble 15, bit 16 (0xf0 bit 0) clear */
    CU_ASSERT_EQUAL(y[20], 11.0f); /* nibble 11, bit 20 (0xf0 bit 4) set: 27 - 16 */

    /* Q5_1: d = 0.5, m = 1, qh as above: x = d (nibble | bit << 4) + m */
    put16(b, H_0_5);
    put16(b + 2, H_1);
    memcpy(b + 4, qh, 4);
    memcpy(b + 8, qs, 16);
    dequant(KV_DT_Q5_1, b, y, 32);
    for (int j = 0; j < 32; j++) {
        int nib = j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
        want[j] = 0.5f * (float)(nib | (int)((h >> j) & 1) << 4) + 1.0f;
    }
    CU_ASSERT(all_equal(y, want, 32));
    CU_ASSERT_EQUAL(y[0], 9.0f);
    CU_ASSERT_EQUAL(y[20], 14.5f);
}

/* The K-quant scales of the hand-built Q4_K/Q5_K blocks, and their 12 packed bytes worked out
 * by hand from get_scale_min_k4: bytes 0-3 = sc[0..3] | (sc[4..7] >> 4) << 6, bytes 4-7 =
 * m[0..3] | (m[4..7] >> 4) << 6, bytes 8-11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4. */
static const int k_sc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
static const int k_m[8] = {0, 7, 63, 1, 40, 16, 2, 31};
static const unsigned char k_packed[12] = {0x41, 0x82, 0xC3, 0x3F, 0x80, 0x47,
                                           0x3F, 0x41, 0x81, 0x01, 0x20, 0xF5};

static void test_blocks_k(void) {
    unsigned char b[210];
    float y[256], want[256];
    unsigned char qs[128], qh[32];
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (unsigned char)((l & 15) | ((l + 3 * c) & 15) << 4);
    for (int l = 0; l < 32; l++) qh[l] = (unsigned char)(l * 37 + 11);

    /* Q4_K: d = 0.5, dmin = 0.25. Element i is in sub-block s = i / 32, at l = i % 32 of it;
     * sub-blocks 2c and 2c + 1 use the low / high nibbles of qs[32c + l]. x = d sc q - dmin m */
    put16(b, H_0_5);
    put16(b + 2, H_0_25);
    memcpy(b + 4, k_packed, 12);
    memcpy(b + 16, qs, 128);
    dequant(KV_DT_Q4_K, b, y, 256);
    for (int i = 0; i < 256; i++) {
        int s = i / 32, l = i % 32, byte = qs[32 * (s / 2) + l];
        int q = s % 2 ? byte >> 4 : byte & 15;
        want[i] = 0.5f * (float)k_sc[s] * (float)q - 0.25f * (float)k_m[s];
    }
    CU_ASSERT(all_equal(y, want, 256));
    CU_ASSERT_EQUAL(y[224], 14.75f); /* sub-block 7, nibble 9: 0.5*5*9 - 0.25*31 */
    CU_ASSERT_EQUAL(y[133], 32.5f);  /* sub-block 4, nibble 5: 0.5*17*5 - 0.25*40 */
    CU_ASSERT_EQUAL(y[33], -0.75f);  /* sub-block 1, nibble 1: 0.5*2*1 - 0.25*7 */

    /* Q5_K: as Q4_K plus qh: element l of sub-block s takes bit s of qh[l] as its fifth bit */
    put16(b, H_0_5);
    put16(b + 2, H_0_25);
    memcpy(b + 4, k_packed, 12);
    memcpy(b + 16, qh, 32);
    memcpy(b + 48, qs, 128);
    dequant(KV_DT_Q5_K, b, y, 256);
    for (int i = 0; i < 256; i++) {
        int s = i / 32, l = i % 32, byte = qs[32 * (s / 2) + l];
        int q = (s % 2 ? byte >> 4 : byte & 15) | ((qh[l] >> s) & 1) << 4;
        want[i] = 0.5f * (float)k_sc[s] * (float)q - 0.25f * (float)k_m[s];
    }
    CU_ASSERT(all_equal(y, want, 256));
    /* qh[0] = 11 = 0b1011: sub-blocks 0, 1, 3 get the fifth bit at l = 0 */
    CU_ASSERT_EQUAL(y[0], 8.0f);     /* 0.5*1*16 - 0 */
    CU_ASSERT_EQUAL(y[32], 14.25f);  /* 0.5*2*16 - 0.25*7 */
    CU_ASSERT_EQUAL(y[64], -15.75f); /* sub-block 2, nibble 0, bit clear: -0.25*63 */
    CU_ASSERT_EQUAL(y[96], 598.25f); /* sub-block 3, nibble 3 | 16: 0.5*63*19 - 0.25*1 */

    /* Q6_K: ql[k] = 7k + 3, qh[k] = 13k + 5, scales = 1, -1, 2, -2, ..., 8, -8, d = 0.5.
     * Element i: half h = i / 128, r = i % 128, group g = r / 32, l = r % 32; low 4 bits from
     * ql[64h + l + 32 (g % 2)] (low nibble for g < 2, high for g >= 2), high 2 bits from bits
     * 2g, 2g+1 of qh[32h + l]; x = d * scales[i / 16] * (q - 32). */
    unsigned char ql[128], q6h[64];
    signed char sc6[16];
    for (int k = 0; k < 128; k++) ql[k] = (unsigned char)(7 * k + 3);
    for (int k = 0; k < 64; k++) q6h[k] = (unsigned char)(13 * k + 5);
    for (int k = 0; k < 16; k++) sc6[k] = (signed char)((k / 2 + 1) * (k % 2 ? -1 : 1));
    memcpy(b, ql, 128);
    memcpy(b + 128, q6h, 64);
    memcpy(b + 192, sc6, 16);
    put16(b + 208, H_0_5);
    dequant(KV_DT_Q6_K, b, y, 256);
    for (int i = 0; i < 256; i++) {
        int hh = i / 128, r = i % 128, g = r / 32, l = r % 32;
        int lb = ql[64 * hh + l + 32 * (g % 2)];
        int lo = g < 2 ? lb & 15 : lb >> 4, hi = (q6h[32 * hh + l] >> (2 * g)) & 3;
        want[i] = 0.5f * (float)sc6[i / 16] * (float)((lo | hi << 4) - 32);
    }
    CU_ASSERT(all_equal(y, want, 256));
    CU_ASSERT_EQUAL(y[0], -6.5f);    /* ql 3, qh bits 1: 19 - 32 = -13, scale 1 */
    CU_ASSERT_EQUAL(y[64], -48.0f);  /* high nibble 0, bits 0: -32, scale 3 */
    CU_ASSERT_EQUAL(y[160], -39.0f); /* ql[96] = 163 low 3, qh[32] = 165 bits 2-3 = 1: -13 * 6 */

    /* the quantisers write the same layout: re-quantising the hand-built values decodes to them
     * within the format's resolution, and the packed scale bytes round-trip */
    unsigned char r[210];
    float z[256];
    kv_error err = {0};
    dequant(KV_DT_Q4_K, (const unsigned char[144]){0}, z, 256); /* all-zero block decodes to 0 */
    for (int i = 0; i < 256; i++) CU_ASSERT_EQUAL(z[i], 0.0f);
    CU_ASSERT_EQUAL(kv_quantize_row(KV_DT_Q6_K, want, r, 256, &err), KV_OK);
    dequant(KV_DT_Q6_K, r, z, 256);
    double e = 0, s = 0;
    for (int i = 0; i < 256; i++) e += fabs(z[i] - want[i]), s += fabs(want[i]);
    printf("\n  Q6_K re-quantised hand block: mean |error| / mean |x| = %.4f", e / s);
    CU_ASSERT(e / s < 0.02);
}

/* ---- quantise -> dequantise on real weights ---- */

typedef struct qstat {
    double rel_rms;   /* ||x - q(x)|| / ||x|| */
    double bound_use; /* max over elements of |error| / bound (32-block and half types) */
} qstat;

static float h16(const unsigned char *p) { /* decode an f16 field (for the bounds) */
    float f;
    kv_dequantize_row(KV_DT_F16, p, &f, 1, NULL);
    return f;
}

/* Error of quantising x [n] to t, and the per-element bound use where the type's definition
 * gives one: F16 half an ulp (2^-11 |x|, 2^-25 below the normal range), BF16 2^-8 |x|, Q8_0
 * d/2, Q4_0/Q5_0 d (the largest-magnitude element sets d = -max/2^(b-1); an element of the
 * other sign up to max clamps to the top level), Q4_1/Q5_1 d/2 plus the f16 rounding of d and m
 * (2^-11 (16 d + |m|)). */
static qstat quant_error(kv_dtype t, const float *x, int n) {
    size_t rb = 0;
    kv_error err = {0};
    CU_ASSERT_EQUAL_FATAL(kv_dtype_row_bytes(t, n, "w", &rb, &err), KV_OK);
    unsigned char *q = malloc(rb);
    float *y = malloc((size_t)n * sizeof *y);
    CU_ASSERT_EQUAL_FATAL(kv_quantize_row(t, x, q, n, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_dequantize_row(t, q, y, n, &err), KV_OK);
    qstat st = {0, 0};
    double e2 = 0, x2 = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)y[i] - x[i]);
        e2 += e * e, x2 += (double)x[i] * x[i];
        double bound = -1;
        const unsigned char *blk = q + (size_t)(i / 32) * kv_dtype_block_bytes(t);
        switch (t) {
        case KV_DT_F16:
            bound = fabs(x[i]) * 0x1p-11 + 0x1p-25;
            break;
        case KV_DT_BF16:
            bound = fabs(x[i]) * 0x1p-8;
            break;
        case KV_DT_Q8_0:
            bound = 0.5 * fabs(h16(blk)) * (1 + 1e-6) + 1e-12;
            break;
        case KV_DT_Q4_0:
        case KV_DT_Q5_0:
            bound = fabs(h16(blk)) * (1 + 1e-6) + 1e-12;
            break;
        case KV_DT_Q4_1:
        case KV_DT_Q5_1: {
            double d = h16(blk), m = h16(blk + 2);
            bound = 0.5 * d + 0x1p-11 * (16 * d + fabs(m)) + 1e-12;
            break;
        }
        default:
            break;
        }
        if (bound >= 0 && e / bound > st.bound_use) st.bound_use = e / bound;
    }
    st.rel_rms = sqrt(e2 / x2);
    free(q);
    free(y);
    return st;
}

static void test_quant_error_real(void) {
    kv_model *m = tu_load_shared(M656);
    /* three real tensors, each taken as one flat row (sizes are multiples of 256) */
    struct {
        const char *name;
        const float *p;
        int n;
    } w[] = {{"token_embd", m->tok_emb.data, 2048 * 128},
             {"blk.0.ffn_gate", m->layers[0].w_gate.data, 384 * 128},
             {"blk.1.ffn_down", m->layers[1].w_down.data, 128 * 384}};
    /* relative RMS error pins: measured on these tensors (see the printed table), with a
     * margin of about 25 % so that a quantiser change that loses accuracy fails. For scale:
     * round-to-nearest with step d has RMS error d / sqrt(12); Q8_0's d = max|x| / 127 over
     * 32 weights (max ~2.5 sigma) gives ~5.7e-3. */
    struct {
        kv_dtype t;
        double max_rel_rms;
    } pin[] = {{KV_DT_F16, 2.5e-4},  {KV_DT_BF16, 2.0e-3}, {KV_DT_Q8_0, 6.7e-3},
               {KV_DT_Q6_K, 2.4e-2}, {KV_DT_Q5_1, 4.7e-2}, {KV_DT_Q5_0, 5.4e-2},
               {KV_DT_Q5_K, 4.8e-2}, {KV_DT_Q4_1, 9.9e-2}, {KV_DT_Q4_0, 1.08e-1},
               {KV_DT_Q4_K, 9.9e-2}};
    /* 656K's weights were trained in bfloat16 and are exact in F16 and BF16; for those two
     * types the same tensors are scaled by pi/3 in fp32 so that rounding happens */
    float *scaled[3];
    for (size_t k = 0; k < 3; k++) {
        scaled[k] = malloc((size_t)w[k].n * sizeof *scaled[k]);
        for (int i = 0; i < w[k].n; i++) scaled[k][i] = w[k].p[i] * 1.04719755f;
    }
    printf("\n  quantise -> dequantise, relative RMS error (max |error| / bound):\n  %-6s", "type");
    for (size_t k = 0; k < 3; k++) printf(" %24s", w[k].name);
    double rms[KV_DT_COUNT][3];
    for (size_t p = 0; p < sizeof pin / sizeof pin[0]; p++) {
        printf("\n  %-6s", kv_dtype_name(pin[p].t));
        for (size_t k = 0; k < 3; k++) {
            int half = pin[p].t == KV_DT_F16 || pin[p].t == KV_DT_BF16;
            qstat s = quant_error(pin[p].t, half ? scaled[k] : w[k].p, w[k].n);
            rms[p][k] = s.rel_rms;
            printf("   %.3e (%.3f)", s.rel_rms, s.bound_use);
            CU_ASSERT(s.bound_use <= 1.0);
            CU_ASSERT(s.rel_rms < pin[p].max_rel_rms);
            CU_ASSERT(s.rel_rms > 0);
        }
    }
    printf("\n");
    /* more bits, less error: Q8_0 < Q6_K < Q5_K < Q4_K and Q5_x < Q4_x */
    for (size_t k = 0; k < 3; k++) {
        CU_ASSERT(rms[2][k] < rms[3][k]); /* Q8_0 < Q6_K */
        CU_ASSERT(rms[3][k] < rms[6][k]); /* Q6_K < Q5_K */
        CU_ASSERT(rms[6][k] < rms[9][k]); /* Q5_K < Q4_K */
        CU_ASSERT(rms[4][k] < rms[7][k]); /* Q5_1 < Q4_1 */
        CU_ASSERT(rms[5][k] < rms[8][k]); /* Q5_0 < Q4_0 */
        free(scaled[k]);
    }
    kv_model_free(m);
}

/* Our Q8_0 quantiser against llama.cpp's: tinystories-656k-q8_0.gguf was written by
 * llama.cpp from the same weights and is kept as Q8_0 in memory; block for block, the scale d
 * must be the same f16 (both take max|x| / 127) and the quants equal or one step apart (ours
 * divide by the rounded d, llama.cpp's reference by the exact one). */
static void test_q8_0_vs_llama_cpp(void) {
    kv_model *a = tu_load_shared(M656);
    kv_model *q = tu_load_shared(M656 "/tinystories-656k-q8_0.gguf");
    CU_ASSERT_EQUAL_FATAL(q->tok_emb.type, KV_DT_Q8_0);
    CU_ASSERT_EQUAL_FATAL(a->tok_emb.type, KV_DT_F32);
    int n = 2048 * 128, nb = n / 32;
    unsigned char *blk = malloc((size_t)nb * 34);
    const unsigned char *ref = q->tok_emb.data;
    CU_ASSERT_EQUAL_FATAL(kv_quantize_row(KV_DT_Q8_0, a->tok_emb.data, blk, n, NULL), KV_OK);
    long same_d = 0, same = 0, near = 0;
    for (int b = 0; b < nb; b++) {
        const unsigned char *x = blk + (size_t)b * 34, *y = ref + (size_t)b * 34;
        same_d += memcmp(x, y, 2) == 0;
        for (int j = 0; j < 32; j++) {
            int dq = (signed char)x[2 + j] - (signed char)y[2 + j];
            same += dq == 0;
            near += dq == 1 || dq == -1;
        }
    }
    printf("\n  656K embedding, our Q8_0 vs llama.cpp's file: d equal in %ld of %d blocks; quants "
           "%ld of %d equal, %ld one step apart",
           same_d, nb, same, n, near);
    CU_ASSERT_EQUAL(same_d, nb);
    CU_ASSERT_EQUAL(same + near, n);
    CU_ASSERT(same > n * 0.99);
    free(blk);
    kv_model_free(q);
    kv_model_free(a);
}

/* ---- dot products and matmul ---- */

/* The reference: dequantise the row, then sum in double. *mag gets sum |w_i x_i|. */
static double ref_dot(kv_dtype t, const void *w, const float *x, int n, double *mag) {
    float *y = malloc((size_t)n * sizeof *y);
    kv_dequantize_row(t, w, y, n, NULL);
    double s = 0, a = 0;
    for (int i = 0; i < n; i++) s += (double)y[i] * x[i], a += fabs((double)y[i] * x[i]);
    free(y);
    *mag = a;
    return s;
}

static void test_dot(void) {
    kv_model *m = tu_load_shared(M656);
    const float *wsrc = m->layers[0].w_gate.data, *xsrc = m->tok_emb.data; /* real weights, rows */
    int lens[] = {256, 512, 4096, 172, 40}; /* 172, 40: F16/BF16 rows with a tail */
    double worst = 0;
    for (int li = 0; li < 5; li++) {
        int n = lens[li];
        for (int ti = 0; ti < KV_DT_COUNT; ti++) {
            kv_dtype t = kv_dtype_all[ti];
            if (n % kv_dtype_block(t)) continue;
            size_t rb = 0;
            kv_dtype_row_bytes(t, n, "w", &rb, NULL);
            unsigned char *q = malloc(rb);
            for (int r = 0; r < 6; r++) {
                kv_quantize_row(t, wsrc + (size_t)r * 997, q, n, NULL);
                const float *x = xsrc + (size_t)r * 5003;
                double mag, ref = ref_dot(t, q, x, n, &mag);
                double a = kv_dot_row(t, q, x, n), p = kv_dot_row_portable(t, q, x, n);
                /* fp32 accumulation in any order: |error| <= 2 n u sum |w x|, u = 2^-24 */
                double bound = 2.0 * n * 0x1p-24 * mag;
                worst = fmax(worst, fmax(fabs(a - ref), fabs(p - ref)) / bound);
                if (fabs(a - ref) > bound || fabs(p - ref) > bound)
                    printf("\n  %s n=%d: ref %.9g avx/default %.9g portable %.9g", kv_dtype_name(t),
                           n, ref, a, p);
                CU_ASSERT(fabs(a - ref) <= bound);
                CU_ASSERT(fabs(p - ref) <= bound);
            }
            free(q);
        }
    }
    printf("\n  typed dot vs dequantise + double: worst |error| / (2 n u sum|wx|) = %.3f", worst);
    kv_model_free(m);
}

/* Issue 23: the integer dots (x quantised to 8-bit blocks, kv_dot_row_q8). Every kernel the
 * CPU has (portable C, AVX2, AVX-512 VNNI) gives the portable kernel's bits exactly; the result
 * differs from the fp32 dot of the dequantised row with x only by the activation rounding:
 * |x_i - d_b q_i| <= d_b / 2 (d_b = max|x| / 127 over x's block of 32 or 256), so
 * |error| <= sum_i |w_i| d_b / 2 (x 1.01 for the rounding of x / d) + fp32 summation
 * (4 n u sum |w_i| (|x_i| + d_b / 2)). Lengths with 1-2 blocks, a partial group of 8 blocks
 * (96, 288, 768), a K-quant group of 8 super-blocks and one more (2304) and many blocks;
 * weights and x real 656K rows. */
static void test_int_dot(void) {
    kv_model *m = tu_load_shared(M656);
    const float *wsrc = m->layers[0].w_gate.data, *xsrc = m->tok_emb.data;
    int lens[] = {32, 96, 256, 288, 768, 2304, 4096}; /* 2304: a K-quant group of 8 + 1 */
    double worst = 0;
    int checked = 0;
    for (int isa = 0; isa <= KV_ISA_AVX512_VNNI; isa++)
        printf("\n  isa %s: %s", kv_isa_name((kv_isa)isa),
               kv_isa_available((kv_isa)isa) ? "available" : "not on this CPU");
    for (int li = 0; li < 7; li++) {
        int n = lens[li];
        for (int ti = 0; ti < KV_DT_COUNT; ti++) {
            kv_dtype t = kv_dtype_all[ti];
            if (t == KV_DT_F32 || t == KV_DT_F16 || t == KV_DT_BF16 || n % kv_dtype_block(t))
                continue;
            int qb = kv_dtype_block(t) == 256 ? 256 : 32;
            size_t rb = 0;
            kv_dtype_row_bytes(t, n, "w", &rb, NULL);
            unsigned char *q = malloc(rb);
            float *wd = malloc((size_t)n * sizeof *wd);
            for (int r = 0; r < 6; r++) {
                kv_quantize_row(t, wsrc + (size_t)r * 997, q, n, NULL);
                kv_dequantize_row(t, q, wd, n, NULL);
                const float *x = xsrc + (size_t)r * 5003;
                double ref = 0, bound = 0, mag = 0;
                for (int b = 0; b < n / qb; b++) {
                    double amax = 0;
                    for (int j = 0; j < qb; j++) amax = fmax(amax, fabs(x[b * qb + j]));
                    double d = amax / 127;
                    for (int j = 0; j < qb; j++) {
                        int i = b * qb + j;
                        ref += (double)wd[i] * x[i];
                        bound += 1.01 * fabs(wd[i]) * d / 2;
                        mag += fabs(wd[i]) * (fabs(x[i]) + d / 2);
                    }
                }
                bound += 4.0 * n * 0x1p-24 * mag;
                float p = 0, a = 0;
                CU_ASSERT_EQUAL(kv_dot_row_q8(t, q, x, n, KV_ISA_PORTABLE, &p, NULL), KV_OK);
                for (int isa = 1; isa <= KV_ISA_AVX512_VNNI; isa++) {
                    if (!kv_isa_available((kv_isa)isa)) continue;
                    CU_ASSERT_EQUAL(kv_dot_row_q8(t, q, x, n, (kv_isa)isa, &a, NULL), KV_OK);
                    if (memcmp(&a, &p, sizeof a))
                        printf("\n  %s n=%d %s: %.9g, portable %.9g", kv_dtype_name(t), n,
                               kv_isa_name((kv_isa)isa), a, p);
                    CU_ASSERT_EQUAL(memcmp(&a, &p, sizeof a), 0);
                    checked++;
                }
                worst = fmax(worst, fabs(p - ref) / bound);
                if (fabs(p - ref) > bound)
                    printf("\n  %s n=%d: int %.9g vs fp32 %.9g (bound %.3g)", kv_dtype_name(t), n,
                           p, ref, bound);
                CU_ASSERT(fabs(p - ref) <= bound);
            }
            free(wd);
            free(q);
        }
    }
    printf("\n  integer dot: %d SIMD results equal to portable; worst |error| / bound = %.3f",
           checked, worst);
    /* the activation rows themselves: the AVX2 quantiser writes the portable one's bytes, on
     * real rows and on rows of exact rounding midpoints (max 127 -> d = 1: x = k + 1/2) */
    if (kv_isa_available(KV_ISA_AVX2)) {
        float *mid = malloc(4096 * sizeof *mid);
        for (int i = 0; i < 4096; i++)
            mid[i] = i % 32 == 0 ? 127.0f : (float)(i % 254 - 127) + 0.5f;
        int same = 1, rows = 0;
        for (int li = 0; li < 6; li++)
            for (int k = 0; k < 2; k++) {
                kv_dtype t = k ? KV_DT_Q4_K : KV_DT_Q8_0;
                int n = lens[li];
                if (n % kv_dtype_block(t)) continue;
                size_t ab = kv_qdot_act_bytes(t, n);
                unsigned char *a0 = calloc(1, ab), *a1 = calloc(1, ab);
                for (int src = 0; src < 2; src++) {
                    const float *x = src ? mid : xsrc + (size_t)li * 4099;
                    kv_qdot_quantize_act_isa(t, x, n, a0, KV_ISA_PORTABLE);
                    kv_qdot_quantize_act_isa(t, x, n, a1, KV_ISA_AVX2);
                    same &= memcmp(a0, a1, ab) == 0;
                    rows++;
                }
                free(a0);
                free(a1);
            }
        printf("\n  activation rows: AVX2 quantiser = portable on %d rows: %s", rows,
               same ? "yes" : "NO");
        CU_ASSERT(same);
        free(mid);
    }
    kv_error err = {0};
    float o;
    unsigned char f16row[64] = {0};
    CU_ASSERT_EQUAL(kv_dot_row_q8(KV_DT_F16, f16row, xsrc, 32, KV_ISA_PORTABLE, &o, &err),
                    KV_EINPUT);
    CU_ASSERT_EQUAL(kv_dot_row_q8(KV_DT_Q4_K, f16row, xsrc, 32, KV_ISA_PORTABLE, &o, &err),
                    KV_EINPUT);
    kv_model_free(m);
}

/* The F32 decode GEMV's documented order (runtime/quant/quant.c, gemv_f32_c), written again
 * here: 16 partial sums (mul then add), folded a_k + a_(k+8), a fixed tree, the tail in order. */
static float gemv_f32_ref(const float *w, const float *x, int n) {
    float a[16] = {0}, b[8];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) a[k] = a[k] + w[i + k] * x[i + k];
    for (int k = 0; k < 8; k++) b[k] = a[k] + a[k + 8];
    float s = ((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7]));
    for (; i < n; i++) s = s + w[i] * x[i];
    return s;
}

/* W [out, in] fp32 (malloc'd, the caller frees): rows of the 656K embedding m->tok_emb
 * (flattened, 256 rows of 1024 for in = 1024) reused cyclically. */
static float *cyclic_embedding_rows(const kv_model *m, int out, int in) {
    const float *E = m->tok_emb.data;
    int n_src = (int)((long)m->cfg.vocab_size * m->cfg.dim / in);
    float *wf = malloc((size_t)out * in * sizeof *wf);
    CU_ASSERT_FATAL(wf != NULL && n_src > 0);
    for (int o = 0; o < out; o++)
        memcpy(wf + (size_t)o * in, E + (size_t)(o % n_src) * in, (size_t)in * sizeof *wf);
    return wf;
}

/* The `out` rows of wf [out, in] quantised to type t (malloc'd, the caller frees); *rb gets the
 * bytes of a row. */
static unsigned char *quantize_rows(kv_dtype t, const float *wf, int out, int in, size_t *rb) {
    CU_ASSERT_EQUAL_FATAL(kv_dtype_row_bytes(t, in, "w", rb, NULL), KV_OK);
    unsigned char *w = malloc(*rb * out);
    CU_ASSERT_FATAL(w != NULL);
    for (int o = 0; o < out; o++) kv_quantize_row(t, wf + (size_t)o * in, w + *rb * o, in, NULL);
    return w;
}

static void test_matmul(void) {
    kv_model *m = tu_load_shared(M656);
    /* W [1100, 1024]: rows of the 656K embedding (flattened, 256 rows of 1024) reused
     * cyclically, so the tiled path runs 8 chunks (144 W rows each: ceil(1100 / 8) rounded up
     * to 16, the last one partial) through one tile of 144 rows; x: 20 rows of real weights
     * (w_up holds 48 rows of 1024). */
    int in = 1024, out = 1100, R = 20;
    const float *X = m->layers[1].w_up.data;
    float *wf = cyclic_embedding_rows(m, out, in);
    float *y = malloc((size_t)R * out * sizeof *y), *y1 = malloc((size_t)out * sizeof *y1);
    float *deq = malloc((size_t)out * in * sizeof *deq);
    double worst = 0;
    for (int ti = 0; ti < KV_DT_COUNT; ti++) {
        kv_dtype t = kv_dtype_all[ti];
        size_t rb = 0;
        unsigned char *w = quantize_rows(t, wf, out, in, &rb);
        kv_dequantize_row(t, w, deq, (int64_t)out * in, NULL);
        size_t sf = kv_qmatmul_scratch_floats(t, R, in, out);
        int integer = t != KV_DT_F32 && t != KV_DT_F16 && t != KV_DT_BF16;
        int igemm = kv_qgemm_covers(t);
        if (igemm) {
            /* the quantised rows (padded to 20) and one panel of 144 W rows per thread */
            size_t act = (kv_qgemm_act_bytes(R, in) + 63) / 64 * 64;
            size_t pan = (kv_qgemm_panel_bytes(144, in) + 63) / 64 * 64;
            CU_ASSERT_EQUAL(sf, (act + pan + 3) / 4);
            CU_ASSERT_EQUAL(kv_qmatmul_scratch_threads(t, R, in, out, 3), (act + 3 * pan + 3) / 4);
        } else {
            CU_ASSERT_EQUAL(sf, t == KV_DT_F32 ? 0 : (size_t)144 * in);
            /* one tile per thread */
            CU_ASSERT_EQUAL(kv_qmatmul_scratch_threads(t, R, in, out, 3), 3 * sf);
        }
        /* up to 16 rows the quantised rows of x (~1.16-1.25 bytes per element) */
        size_t s16 = kv_qmatmul_scratch_floats(t, 16, in, out);
        if (integer) {
            CU_ASSERT(s16 * 4 >= (size_t)16 * in && s16 * 4 <= (size_t)16 * in * 13 / 10 + 64 * 16);
        } else {
            CU_ASSERT_EQUAL(s16, t == KV_DT_F32 ? 0 : (size_t)144 * in);
        }
        float *scratch = sf ? malloc(sf * sizeof *scratch) : NULL;
        int rows_list[] = {1, 3, 4, R, R, 16};
        for (int c = 0; c < 6; c++) {
            int rows = rows_list[c];
            kv_qmatmul(y, X, w, t, rows, in, out, c == 3 ? scratch : NULL, c == 3 ? sf : 0);
            /* quantised types: the integer dots up to 16 rows or without tile scratch; above 16
             * rows the integer GEMM for the types it covers (its bits: test_igemm) */
            int int_path = integer && (rows <= 16 || (c != 3 && !igemm));
            if (igemm && rows > 16) {
                size_t ab = kv_qgemm_act_bytes(rows, in);
                void *act = malloc(ab);
                float *z = malloc((size_t)rows * out * sizeof *z);
                kv_qgemm_quantize(t, X, rows, in, act);
                kv_qgemm_ref(z, act, w, t, rows, in, out);
                CU_ASSERT_EQUAL(memcmp(z, y, (size_t)rows * out * 4), 0);
                free(z);
                free(act);
            }
            for (int r = 0; r < rows && int_path; r++) /* the bits of the integer dot */
                for (int o = 0; o < out; o++) {
                    float e = 0;
                    kv_dot_row_q8(t, w + rb * o, X + (size_t)r * in, in, kv_isa_best(), &e, NULL);
                    if (memcmp(&e, y + (size_t)r * out + o, 4)) {
                        printf("\n  %s rows %d (%d, %d): %.9g vs %.9g", kv_dtype_name(t), rows, r,
                               o, y[(size_t)r * out + o], e);
                        CU_FAIL("integer matmul differs from kv_dot_row_q8");
                        o = out, r = rows;
                    }
                }
            for (int r = 0; r < rows && !int_path && !(igemm && rows > 16); r++)
                for (int o = 0; o < out; o++) {
                    double s = 0, a = 0;
                    for (int i = 0; i < in; i++) {
                        double p = (double)deq[(size_t)o * in + i] * X[(size_t)r * in + i];
                        s += p, a += fabs(p);
                    }
                    double e = fabs(y[(size_t)r * out + o] - s), bound = 2.0 * in * 0x1p-24 * a;
                    worst = fmax(worst, e / bound);
                    if (e > bound)
                        printf("\n  %s rows %d (%d, %d): %.9g vs %.9g", kv_dtype_name(t), rows, r,
                               o, y[(size_t)r * out + o], s);
                    CU_ASSERT(e <= bound);
                }
            /* a batched decode step gives each row the bits it gets alone */
            if ((rows <= 4 || int_path) && rows > 1) {
                kv_qmatmul(y1, X + (size_t)(rows - 1) * in, w, t, 1, in, out, NULL, 0);
                CU_ASSERT_EQUAL(memcmp(y1, y + (size_t)(rows - 1) * out, (size_t)out * 4), 0);
            }
        }
        /* F32 weights: up to 4 rows the GEMV of runtime/quant/quant.c (gemv_f32_ref's order,
         * whatever the ISA), sgemm above, bit for bit */
        if (t == KV_DT_F32) {
            /* as the CPU backend runs it: OpenBLAS on one thread (its sgemv's bits depend on
             * its thread count; the backend's pool does the threading) */
            openblas_set_num_threads(1);
            const float *wf32 = (const float *)(const void *)w;
            float *z = malloc((size_t)R * out * sizeof *z);
            kv_qmatmul(y, X, w, t, R, in, out, NULL, 0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, out, in, 1.0f, X, in, wf32, in,
                        0.0f, z, out);
            CU_ASSERT_EQUAL(memcmp(y, z, (size_t)R * out * 4), 0);
            kv_qmatmul(y, X, w, t, 2, in, out, NULL, 0);
            for (int r = 0; r < 2; r++)
                for (int o = 0; o < out; o++)
                    z[(size_t)r * out + o] =
                        gemv_f32_ref(wf32 + (size_t)o * in, X + (size_t)r * in, in);
            CU_ASSERT_EQUAL(memcmp(y, z, (size_t)2 * out * 4), 0);
            free(z);
        }
        free(scratch);
        free(w);
    }
    printf("\n  typed matmul vs dequantise + double: worst |error| / (2 in u sum|wx|) = %.3f",
           worst);
    free(deq);
    free(wf);
    free(y);
    free(y1);
    kv_model_free(m);
}

/* The integer GEMM (runtime/quant/quant_gemm.c, issue 23 item 2): for every type it covers and
 * every isa of this CPU, the chunked kernel's outputs equal the portable reference's bit for
 * bit (W rows and x rows not multiples of the tiles (16 x 6 VNNI, 8 x 4 AVX2, tails by 2), two
 * chunks); each reference output is within the activation rounding of the fp32 product of the
 * dequantised row (the bound of test_int_dot with per-32 activation scales); a row's output does
 * not depend on the batch. W: 100 rows of the 656K embedding rows (1024 long), x: w_up rows. */
static void test_igemm(void) {
    kv_model *m = tu_load_shared(M656);
    int in = 1024, out = 100, rows_list[] = {1, 5, 17, 23};
    const float *X = m->layers[1].w_up.data;
    float *wf = cyclic_embedding_rows(m, out, in), *wd = malloc((size_t)out * in * sizeof *wd);
    float *y = malloc((size_t)23 * out * sizeof *y), *z = malloc((size_t)23 * out * sizeof *z);
    void *act = malloc(kv_qgemm_act_bytes(23, in)), *act1 = malloc(kv_qgemm_act_bytes(1, in));
    void *panel = malloc(kv_qgemm_panel_bytes(out, in));
    int checked = 0, covered = 0;
    double worst = 0;
    for (int ti = 0; ti < KV_DT_COUNT; ti++) {
        kv_dtype t = kv_dtype_all[ti];
        if (!kv_qgemm_covers(t)) continue;
        covered++;
        size_t rb = 0;
        unsigned char *w = quantize_rows(t, wf, out, in, &rb);
        kv_dequantize_row(t, w, wd, (int64_t)out * in, NULL);
        for (int ri = 0; ri < 4; ri++) {
            int rows = rows_list[ri];
            kv_qgemm_quantize(t, X, rows, in, act);
            kv_qgemm_ref(z, act, w, t, rows, in, out);
            for (int isa = 0; isa <= KV_ISA_AVX512_VNNI; isa++) {
                if (!kv_isa_available((kv_isa)isa)) continue;
                memset(y, 0xff, (size_t)rows * out * sizeof *y);
                kv_qgemm_range(y, act, w, t, rows, in, out, 0, 40, panel, (kv_isa)isa);
                kv_qgemm_range(y, act, w, t, rows, in, out, 40, out, panel, (kv_isa)isa);
                if (memcmp(y, z, (size_t)rows * out * 4))
                    printf("\n  %s %s rows %d: differs from the reference", kv_dtype_name(t),
                           kv_isa_name((kv_isa)isa), rows);
                CU_ASSERT_EQUAL(memcmp(y, z, (size_t)rows * out * 4), 0);
                checked++;
            }
            /* the last row alone */
            kv_qgemm_quantize(t, X + (size_t)(rows - 1) * in, 1, in, act1);
            kv_qgemm_range(y, act1, w, t, 1, in, out, 0, out, panel, kv_isa_best());
            CU_ASSERT_EQUAL(memcmp(y, z + (size_t)(rows - 1) * out, (size_t)out * 4), 0);
        }
        /* the error against fp32 (23 rows' reference in z) */
        for (int r = 0; r < 23; r++)
            for (int o = 0; o < out; o++) {
                const float *x = X + (size_t)r * in, *wr = wd + (size_t)o * in;
                double ref = 0, bound = 0, mag = 0;
                for (int b = 0; b < in / 32; b++) {
                    double amax = 0;
                    for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[b * 32 + j]));
                    double d = amax / 127;
                    for (int j = 0; j < 32; j++) {
                        int i = b * 32 + j;
                        ref += (double)wr[i] * x[i];
                        bound += 1.01 * fabs(wr[i]) * d / 2;
                        mag += fabs(wr[i]) * (fabs(x[i]) + d / 2);
                    }
                }
                bound += 4.0 * in * 0x1p-24 * mag;
                double e = fabs(z[(size_t)r * out + o] - ref);
                worst = fmax(worst, e / bound);
                if (e > bound)
                    printf("\n  %s (%d, %d): %.9g vs fp32 %.9g (bound %.3g)", kv_dtype_name(t), r,
                           o, z[(size_t)r * out + o], ref, bound);
                CU_ASSERT(e <= bound);
            }
        free(w);
    }
    printf("\n  integer GEMM: %d types, %d (type, rows, isa) results equal to the reference; "
           "worst |error| / bound = %.3f",
           covered, checked, worst);
    CU_ASSERT(covered >= 8);
    free(panel);
    free(act1);
    free(act);
    free(z);
    free(y);
    free(wd);
    free(wf);
    kv_model_free(m);
}

/* ---- whole models ---- */

static int *text_ids_656k(const kv_model *m, int *n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", tu_shared(M656));
    return tu_text_tokens(m, path, 0, n);
}

static double ppl(const kv_model *m, const int *ids, long n, int chunks) {
    kv_error err = {0};
    kv_eval_opts o;
    kv_eval_opts_default(&o, m);
    o.context = 512;
    o.max_chunks = chunks;
    kv_eval_result r;
    int rc = kv_eval_perplexity(m, ids, n, &o, &r, &err);
    if (rc) fprintf(stderr, "eval: %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    return r.perplexity;
}

static kv_model *write_and_load(const kv_model *m, kv_dtype t, const char *name, size_t *bytes) {
    kv_error err = {0};
    const char *path = tu_tmp(name);
    int rc = tw_write_gguf(path, m, t, bytes, &err);
    if (rc) fprintf(stderr, "write %s: %s\n", name, err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    kv_model *q = tu_load_model(path);
    CU_ASSERT_STRING_EQUAL(q->format, "gguf");
    return q;
}

/* kv_qmatmul_pool: every type and path (1, 3, 4, 16, 20 rows; 20 with and without tile
 * scratch) gives the bits of kv_qmatmul on 1, 2 and 3 threads. W [1100, 1024] from the 656K
 * embedding rows as in test_matmul, x rows of its w_up. */
static void test_matmul_pool(void) {
    kv_model *m = tu_load_shared(M656);
    int in = 1024, out = 1100, R = 20;
    const float *X = m->layers[1].w_up.data;
    float *wf = cyclic_embedding_rows(m, out, in);
    float *y0 = malloc((size_t)R * out * sizeof *y0), *y = malloc((size_t)R * out * sizeof *y);
    kv_workers *pools[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3; p++) CU_ASSERT_FATAL(kv_workers_new(p + 1, &pools[p], NULL) == KV_OK);
    int compared = 0, differ = 0;
    for (int ti = 0; ti < KV_DT_COUNT; ti++) {
        kv_dtype t = kv_dtype_all[ti];
        size_t rb = 0;
        unsigned char *w = quantize_rows(t, wf, out, in, &rb);
        size_t sf = kv_qmatmul_scratch_threads(t, R, in, out, 3);
        float *scratch = sf ? malloc(sf * sizeof *scratch) : NULL;
        int rows_list[] = {1, 3, 4, 16, R, R};
        for (int c = 0; c < 6; c++) {
            int rows = rows_list[c];
            float *s = c == 5 ? NULL : scratch;
            size_t n = c == 5 ? 0 : sf;
            kv_qmatmul(y0, X, w, t, rows, in, out, s, n);
            for (int p = 0; p < 3; p++) {
                memset(y, 0xff, (size_t)rows * out * sizeof *y);
                kv_qmatmul_pool(y, X, w, t, rows, in, out, s, n, pools[p]);
                differ += memcmp(y, y0, (size_t)rows * out * sizeof *y) != 0;
                compared++;
            }
        }
        free(scratch);
        free(w);
    }
    printf("\n  pooled matmul: %d of %d results (types x row counts x 1/2/3 threads) differ from "
           "kv_qmatmul's bits",
           differ, compared);
    CU_ASSERT_EQUAL(differ, 0);
    for (int p = 0; p < 3; p++) kv_workers_free(pools[p]);
    free(y);
    free(y0);
    free(wf);
    kv_model_free(m);
}

/* Rows of y from kv_qmatmul_rowwise_pool that differ from a one-row kv_qmatmul of that row
 * (bitwise), for `rows` rows of X [rows, in] against w [out, in] of type t. */
static int rowwise_differ(const float *X, const void *w, kv_dtype t, int rows, int in, int out,
                          kv_workers *pool, float *y, float *y1) {
    int differ = 0;
    memset(y, 0xff, (size_t)rows * out * sizeof *y);
    kv_qmatmul_rowwise_pool(y, X, w, t, rows, in, out, NULL, 0, pool);
    for (int r = 0; r < rows; r++) {
        kv_qmatmul(y1, X + (size_t)r * in, w, t, 1, in, out, NULL, 0);
        differ += memcmp(y1, y + (size_t)r * out, (size_t)out * sizeof *y1) != 0;
    }
    return differ;
}

/* Batch-invariant matmul: every row of any batch gets the bits it gets alone, for every type,
 * row counts across the 4-row register blocks and past the GEMM thresholds (4 and 16), on 2
 * threads; F32 also with a row length that leaves a scalar tail (1000 = 62 * 16 + 8). Real
 * weights: W rows from the 656K embedding, x rows from its w_up. */
static void test_matmul_rowwise(void) {
    kv_model *m = tu_load_shared(M656);
    int in = 1024, out = 300, R = 20;
    const float *X = m->layers[1].w_up.data;
    float *wf = cyclic_embedding_rows(m, out, in);
    float *y = malloc((size_t)R * out * sizeof *y), *y1 = malloc((size_t)out * sizeof *y1);
    kv_workers *pool = NULL;
    CU_ASSERT_FATAL(kv_workers_new(2, &pool, NULL) == KV_OK);
    int rows_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 20}, nr = 11, compared = 0, differ = 0;
    for (int ti = 0; ti < KV_DT_COUNT; ti++) {
        kv_dtype t = kv_dtype_all[ti];
        size_t rb = 0;
        unsigned char *w = quantize_rows(t, wf, out, in, &rb);
        for (int c = 0; c < nr; c++, compared++)
            differ += rowwise_differ(X, w, t, rows_list[c], in, out, pool, y, y1);
        free(w);
    }
    /* F32 rows of 1000: the tail after the 16-wide loop */
    int in2 = 1000;
    float *w2 = malloc((size_t)out * in2 * sizeof *w2), *x2 = malloc((size_t)R * in2 * sizeof *x2);
    for (int o = 0; o < out; o++) memcpy(w2 + (size_t)o * in2, wf + (size_t)o * in, in2 * 4);
    for (int r = 0; r < R; r++) memcpy(x2 + (size_t)r * in2, X + (size_t)r * in, in2 * 4);
    for (int c = 0; c < nr; c++, compared++)
        differ += rowwise_differ(x2, w2, KV_DT_F32, rows_list[c], in2, out, pool, y, y1);
    /* the plain F32 path above 4 rows (sgemm) for contrast: its rows may round differently */
    kv_qmatmul(y, x2, w2, KV_DT_F32, R, in2, out, NULL, 0);
    int gemm_differ = 0;
    for (int r = 0; r < R; r++) {
        kv_qmatmul(y1, x2 + (size_t)r * in2, w2, KV_DT_F32, 1, in2, out, NULL, 0);
        gemm_differ += memcmp(y1, y + (size_t)r * out, (size_t)out * sizeof *y1) != 0;
    }
    printf("\n  rowwise matmul: %d rows differ from their one-row bits (%d batches: %d types x %d "
           "row counts + F32 with a tail); sgemm at %d rows: %d rows differ",
           differ, compared, KV_DT_COUNT, nr, R, gemm_differ);
    CU_ASSERT_EQUAL(differ, 0);
    CU_ASSERT_EQUAL(compared, (KV_DT_COUNT + 1) * nr);
    kv_workers_free(pool);
    free(w2);
    free(x2);
    free(y);
    free(y1);
    free(wf);
    kv_model_free(m);
}

static void test_656k_types_perplexity(void) {
    kv_model *a = tu_load_shared(M656);
    int n = 0;
    int *ids = text_ids_656k(a, &n);
    /* 8 chunks of 512 tokens (4088 predictions) keep the suite short under ASan */
    const int chunks = 8;
    double p_st = ppl(a, ids, n, chunks);
    size_t bytes = 0;
    kv_model *f = write_and_load(a, KV_DT_F32, "656k-f32.gguf", &bytes);
    double p_f = ppl(f, ids, n, chunks);
    printf("\n  656K perplexity (%d x 512 tokens): safetensors F32 %.6f, written F32 GGUF %.6f "
           "(%zu bytes)",
           chunks, p_st, p_f, bytes);
    /* the written F32 file is the same model (Q/K rows permuted for RoPE on adjacent pairs) */
    CU_ASSERT(fabs(p_f - p_st) / p_st < 1e-5);
    /* Tolerances on |perplexity / F32 - 1|, pinned from the values measured here (Q8_0
     * -0.04 %, Q5_1 +2.8 %, Q5_0 -0.3 %, Q4_1 +6.1 %, Q4_0 +10.3 %; 8 x 512 tokens; these
     * 512-row prefills took the F32 tiles; with the integer dots and 8-bit activations for
     * every row, issue 23: -0.061, +2.841, -0.251, +6.036, +10.244 %; now through the integer
     * GEMM with 8-bit activations, issue 23 item 2: -0.052, +2.837, -0.306, +6.065,
     * +10.311 %) with a
     * margin of ~1.5x for the 4- and 5-bit types: a model of 656K parameters has no redundancy
     * to absorb 4-bit noise (relative weight error ~8 %, test above), and 4088 scored tokens
     * leave the 5-bit results within noise of each other. Q8_0 (weight error 0.5 %) must stay
     * within 0.5 %. The order 8 bits < 5 bits < 4 bits must hold. */
    struct {
        kv_dtype t;
        const char *file;
        double tol;
    } ty[] = {{KV_DT_Q8_0, "656k-q8_0.gguf", 0.005},
              {KV_DT_Q5_1, "656k-q5_1.gguf", 0.05},
              {KV_DT_Q5_0, "656k-q5_0.gguf", 0.05},
              {KV_DT_Q4_1, "656k-q4_1.gguf", 0.15},
              {KV_DT_Q4_0, "656k-q4_0.gguf", 0.15}};
    double rel[5];
    for (int k = 0; k < 5; k++) {
        kv_model *q = write_and_load(a, ty[k].t, ty[k].file, &bytes);
        double p = ppl(q, ids, n, chunks);
        rel[k] = (p - p_f) / p_f;
        printf("\n  %-5s %.6f (%+.3f %%, tolerance %.1f %%), %zu bytes", kv_dtype_name(ty[k].t), p,
               100 * rel[k], 100 * ty[k].tol, bytes);
        CU_ASSERT(fabs(rel[k]) < ty[k].tol);
        kv_model_free(q);
    }
    CU_ASSERT(fabs(rel[0]) < fabs(rel[1]) && fabs(rel[0]) < fabs(rel[2]));
    CU_ASSERT(fabs(rel[1]) < fabs(rel[3]) && fabs(rel[2]) < fabs(rel[4]));
    free(ids);
    kv_model_free(f);
    kv_model_free(a);
}

/* Logits [n, vocab] of tokens[0..n) in one prefill. */
static float *logits_all(const kv_model *m, const int *tokens, int n) {
    kv_error err = {0};
    kv_pool pool;
    kv_cache c;
    kv_workspace *ws = NULL;
    long blocks = kv_cache_blocks_needed(m->cfg.n_layers, m->cfg.n_kv_heads, NULL, n, 1, 16);
    CU_ASSERT_EQUAL_FATAL(kv_pool_init(&pool, (int)blocks, 16, m->cfg.head_dim, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(
        kv_cache_init(&c, &pool, m->cfg.n_layers, m->cfg.n_kv_heads, NULL, KV_POLICY_SINK, &err),
        KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_workspace_new(m, n, n, &ws, &err), KV_OK);
    float *lg = malloc((size_t)n * m->cfg.vocab_size * sizeof *lg);
    kv_cache *seqs[1] = {&c};
    int rc = kv_forward(m, ws, seqs, 1, tokens, n, KV_LOGITS_ALL, lg, NULL, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KV_OK);
    kv_workspace_free(ws);
    kv_cache_destroy(&c);
    kv_pool_destroy(&pool);
    return lg;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        e += d * d, s += (double)b[i] * b[i];
    }
    return sqrt(e / s);
}

static float *logits_prefill_decode(const kv_model *m, const int *tokens, int np, int nd);

static void test_k_quants_synthetic(void) {
    /* A model of real shape whose rows are multiples of 256 (the K-quants' super-block):
     * dim 256, FFN 768, 4 query heads of 64 over 2 KV heads (GQA), 2 layers, vocab 1024. */
    kv_error err = {0};
    kv_model *s = synth_model((synth_shape){256, 2, 4, 2, 768, 1024, 256}, 0, 14, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    const int n = 24;
    int tokens[24];
    for (int i = 0; i < n; i++) tokens[i] = (i * 389 + 7) % 1024;
    size_t V = 1024, cnt = (size_t)n * V, bytes = 0;
    float *ref = logits_all(s, tokens, n);
    kv_model *f = write_and_load(s, KV_DT_F32, "syn-f32.gguf", &bytes);
    float *lf = logits_all(f, tokens, n);
    double e_f = rel_l2(lf, ref, cnt);
    printf("\n  synthetic 256/768 model, %d tokens: written F32 GGUF vs in memory: rel. L2 %.2e", n,
           e_f);
    CU_ASSERT(e_f < 1e-6);
    /* Tolerances on the relative L2 error of all logits, pinned from the values measured here
     * (Q8_0 0.0089, Q6_K 0.032, Q5_K 0.066, Q4_K 0.134) with a ~1.35x margin; the logits error
     * follows the weights' relative error (Q8_0 : Q4_K ~ 1 : 15 in both). K-quants ordered by
     * bits; Q8_0 for scale. The 24-token prefill took the F32 tiles (more than 16 rows); it
     * now takes the integer GEMM with 8-bit activations (issue 23 item 2): Q8_0 0.0117, Q6_K
     * 0.0330, Q5_K 0.0665, Q4_K 0.1344.
     * Issue 23: the same logits through the integer dots with 8-bit activations (as llama.cpp's
     * CPU backend), an 8-row prefill and 16 decode steps (tol_int): Q8_0 0.0117, Q6_K 0.0341,
     * Q5_K 0.0672, Q4_K 0.1347. The activation rounding is about as large as Q8_0's weight
     * rounding (0.0089 * sqrt(2) = 0.0126 expected for two independent errors of that size),
     * so Q8_0's is pinned at 0.016 (1.35x) on both paths now; the others' share is small
     * against their weight error and they keep their tolerance. */
    struct {
        kv_dtype t;
        const char *file;
        double tol, tol_int;
    } ty[] = {{KV_DT_Q8_0, "syn-q8_0.gguf", 0.016, 0.016},
              {KV_DT_Q6_K, "syn-q6_k.gguf", 0.045, 0.045},
              {KV_DT_Q5_K, "syn-q5_k.gguf", 0.09, 0.09},
              {KV_DT_Q4_K, "syn-q4_k.gguf", 0.18, 0.18}};
    double e[4], ei[4];
    for (int k = 0; k < 4; k++) {
        kv_model *q = write_and_load(s, ty[k].t, ty[k].file, &bytes);
        float *lq = logits_all(q, tokens, n);
        e[k] = rel_l2(lq, lf, cnt);
        printf("\n  %-5s rel. L2 logits error %.4f (tolerance %.3f), %zu bytes",
               kv_dtype_name(ty[k].t), e[k], ty[k].tol, bytes);
        CU_ASSERT(e[k] < ty[k].tol);
        float *li = logits_prefill_decode(q, tokens, 8, n - 8);
        ei[k] = rel_l2(li, lf, cnt);
        printf("; integer dots %.4f (tolerance %.3f)", ei[k], ty[k].tol_int);
        CU_ASSERT(ei[k] < ty[k].tol_int);
        CU_ASSERT(ei[k] > 0.5 * e[k]); /* the integer path really ran: its own error */
        free(li);
        free(lq);
        kv_model_free(q);
    }
    CU_ASSERT(e[0] < e[1] && e[1] < e[2] && e[2] < e[3]);
    CU_ASSERT(ei[0] < ei[1] && ei[1] < ei[2] && ei[2] < ei[3]);
    free(ref);
    free(lf);
    kv_model_free(f);
    kv_model_free(s);
}

/* Logits of a prefill of `np` tokens (one call, all rows: the tiled GEMM path) followed by
 * `nd` decode steps (one row each: the typed dot path): [(np + nd), vocab]. */
static float *logits_prefill_decode(const kv_model *m, const int *tokens, int np, int nd) {
    kv_error err = {0};
    kv_pool pool;
    kv_cache c;
    kv_workspace *ws = NULL;
    int n = np + nd, V = m->cfg.vocab_size;
    long blocks = kv_cache_blocks_needed(m->cfg.n_layers, m->cfg.n_kv_heads, NULL, n, 1, 16);
    CU_ASSERT_EQUAL_FATAL(kv_pool_init(&pool, (int)blocks, 16, m->cfg.head_dim, &err), KV_OK);
    CU_ASSERT_EQUAL_FATAL(
        kv_cache_init(&c, &pool, m->cfg.n_layers, m->cfg.n_kv_heads, NULL, KV_POLICY_SINK, &err),
        KV_OK);
    CU_ASSERT_EQUAL_FATAL(kv_workspace_new(m, np, n, &ws, &err), KV_OK);
    float *lg = malloc((size_t)n * V * sizeof *lg);
    kv_cache *seqs[1] = {&c};
    CU_ASSERT_EQUAL_FATAL(kv_forward(m, ws, seqs, 1, tokens, np, KV_LOGITS_ALL, lg, NULL, &err),
                          KV_OK);
    for (int i = 0; i < nd; i++)
        CU_ASSERT_EQUAL_FATAL(kv_forward(m, ws, seqs, 1, tokens + np + i, 1, KV_LOGITS_LAST,
                                         lg + (size_t)(np + i) * V, NULL, &err),
                              KV_OK);
    kv_workspace_free(ws);
    kv_cache_destroy(&c);
    kv_pool_destroy(&pool);
    return lg;
}

/* max |a - b| / max |b| */
static double rel_max(const float *a, const float *b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return e / s;
}

/* Issue 14 part 3: F16 and BF16 weights computed in their own type give the logits of the fp32
 * path (the same weights expanded to F32 on disk and loaded as F32) within 1e-5 relative. Both
 * compute in fp32 from identical values; only the summation order differs (typed dot kernels
 * and per-tile sgemm against sgemv / one sgemm). Models: llama.cpp's F16 conversion of 656K,
 * 656K written as BF16, and the synthetic 256/768 model written as F16 and BF16. */
static void test_half_logits_vs_fp32(void) {
    kv_error err = {0};
    kv_model *st = tu_load_shared(M656);
    kv_model *syn = synth_model((synth_shape){256, 2, 4, 2, 768, 1024, 256}, 0, 15, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(syn);
    struct {
        const char *what;
        kv_model *src; /* NULL: load `file` from the shared models */
        const char *file;
        kv_dtype t;
    } cases[] = {
        {"656K llama.cpp F16 file", NULL, M656 "/TinyStories-656K.f16.gguf", KV_DT_F16},
        {"656K written BF16", st, "656k-bf16.gguf", KV_DT_BF16},
        {"synthetic 256/768 F16", syn, "syn-f16.gguf", KV_DT_F16},
        {"synthetic 256/768 BF16", syn, "syn-bf16.gguf", KV_DT_BF16},
    };
    int tokens[40];
    for (int k = 0; k < 4; k++) {
        kv_model *h = cases[k].src ? write_and_load(cases[k].src, cases[k].t, cases[k].file, NULL)
                                   : tu_load_shared(cases[k].file);
        CU_ASSERT_EQUAL(h->layers[0].wq.type, cases[k].t);
        CU_ASSERT_EQUAL(h->classifier.type, cases[k].t);
        char name[64];
        snprintf(name, sizeof name, "half-as-f32-%d.gguf", k);
        kv_model *f = write_and_load(h, KV_DT_F32, name, NULL);
        CU_ASSERT_EQUAL(f->layers[0].wq.type, KV_DT_F32);
        int V = h->cfg.vocab_size;
        for (int i = 0; i < 40; i++) tokens[i] = (i * 577 + 3) % V;
        float *a = logits_prefill_decode(h, tokens, 32, 8),
              *b = logits_prefill_decode(f, tokens, 32, 8);
        double ep = rel_max(a, b, (size_t)32 * V),
               ed = rel_max(a + (size_t)32 * V, b + (size_t)32 * V, (size_t)8 * V);
        printf("\n  %-26s vs its F32 expansion: max |logit diff| / max |logit| prefill %.2e, "
               "decode %.2e",
               cases[k].what, ep, ed);
        CU_ASSERT(ep < 1e-5);
        CU_ASSERT(ed < 1e-5);
        free(a);
        free(b);
        kv_model_free(f);
        kv_model_free(h);
    }
    kv_model_free(syn);
    kv_model_free(st);
}

/* kB of a "VmRSS:"-style line of /proc/self/status; -1 when absent. */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) v = strtol(line + n, NULL, 10);
    fclose(f);
    return v;
}

typedef struct mem_probe {
    long base_kb, peak_kb;   /* VmRSS before loading, VmHWM after the run */
    size_t kv_bytes, ws_est; /* the K/V pool and the workspace's size estimate */
} mem_probe;

/* The child side (a fresh process: this test binary run as `test_quant --mem-probe PATH`, so no
 * thread pool is inherited): load PATH, prefill 64 tokens (blocks of 32) and decode 16, print
 * "base_kb peak_kb kv_bytes ws_est" (VmRSS at start, VmHWM after the run). */
static int mem_probe_child(const char *path) {
    mem_probe r = {status_kb("VmRSS:"), 0, 0, 0};
    kv_error err = {0};
    kv_model *m = NULL;
    if (kv_model_load(path, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 3;
    }
    const kv_config *c = &m->cfg;
    int n = 80, rows = 32;
    long blocks = kv_cache_blocks_needed(c->n_layers, c->n_kv_heads, NULL, n, 1, 16);
    kv_pool pool;
    kv_cache kc;
    kv_workspace *ws = NULL;
    if (kv_pool_init(&pool, (int)blocks, 16, c->head_dim, &err) ||
        kv_cache_init(&kc, &pool, c->n_layers, c->n_kv_heads, NULL, KV_POLICY_SINK, &err) ||
        kv_workspace_new(m, rows, n, &ws, &err))
        return 4;
    float *lg = malloc((size_t)rows * c->vocab_size * sizeof *lg);
    int tok[80];
    for (int i = 0; i < n; i++) tok[i] = (i * 7919 + 11) % c->vocab_size;
    kv_cache *seqs[1] = {&kc};
    for (int t = 0; t < 64; t += rows)
        if (kv_forward(m, ws, seqs, 1, tok + t, rows, KV_LOGITS_LAST, lg, NULL, &err)) return 5;
    for (int t = 64; t < n; t++)
        if (kv_forward(m, ws, seqs, 1, tok + t, 1, KV_LOGITS_LAST, lg, NULL, &err)) return 5;
    r.peak_kb = status_kb("VmHWM:");
    r.kv_bytes = (size_t)blocks * kv_pool_block_bytes(&pool);
    size_t R = (size_t)rows, d = (size_t)c->dim, qd = (size_t)c->n_heads * c->head_dim,
           kvd = (size_t)c->n_kv_heads * c->head_dim, hid = (size_t)c->hidden_dim;
    /* forward.c's buffers: 5 x [R, d], 2 x [R, qd], 2 x [R, kvd], 2 x [R, hid], RoPE tables,
     * a score row per thread, the matmul tile scratch; plus the logits here */
    r.ws_est = 4 * (R * (5 * d + 2 * qd + 2 * kvd + 2 * hid) + (size_t)n * c->head_dim +
                    64 * (size_t)n + kv_model_matmul_scratch(m, rows) + R * (size_t)c->vocab_size);
    printf("%ld %ld %zu %zu\n", r.base_kb, r.peak_kb, r.kv_bytes, r.ws_est);
    free(lg);
    kv_workspace_free(ws);
    kv_cache_destroy(&kc);
    kv_pool_destroy(&pool);
    kv_model_free(m);
    return 0;
}

static int probe_memory(const char *path, mem_probe *out) {
    char self[4096], cmd[9000];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) return -1;
    self[k] = '\0';
    snprintf(cmd, sizeof cmd, "'%s' --mem-probe '%s'", self, path);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int got =
        fscanf(p, "%ld %ld %zu %zu", &out->base_kb, &out->peak_kb, &out->kv_bytes, &out->ws_est);
    int st = pclose(p);
    return got == 4 && st == 0 ? 0 : -1;
}

/* Issue 14 part 3: a model in F16 or Q8_0 needs about its file size in memory, not 4 bytes a
 * parameter. A synthetic model of real shape (dim 768, 12 query / 4 KV heads of 64, FFN 2048,
 * vocab 32000, 4 layers: 74.4M parameters, 298 MB as fp32) is written as F16 and Q8_0 GGUF; a
 * fresh process loads each and runs 64 prefill + 16 decode tokens; its peak resident set over
 * its start must stay within file size + KV + workspace + 24 MiB (the slack covers OpenBLAS's
 * packing buffers, thread stacks and allocator overhead), far below fp32, and above what it
 * must have read (the file less the embedding rows of tokens never seen). Measured: F16
 * 111 MB peak for a 149 MB file, Q8_0 64 MB for 79 MB (the 32000-row embedding is mapped
 * but only 80 rows are touched). */
static void test_memory_own_type(void) {
#if defined(__SANITIZE_ADDRESS__)
    printf("\n  skipped under AddressSanitizer (its shadow memory and quarantine change the "
           "resident set)");
    (void)probe_memory;
    return;
#else
    kv_error err = {0};
    kv_model *s = synth_model((synth_shape){768, 4, 12, 4, 2048, 32000, 4096}, 0, 2026, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    size_t f32_bytes = kv_model_resident_bytes(s), file_bytes[2];
    const char *files[2] = {"mem-f16.gguf", "mem-q8_0.gguf"};
    kv_dtype types[2] = {KV_DT_F16, KV_DT_Q8_0};
    char paths[2][512];
    for (int k = 0; k < 2; k++) {
        snprintf(paths[k], sizeof paths[k], "%s", tu_tmp(files[k]));
        CU_ASSERT_EQUAL_FATAL(tw_write_gguf(paths[k], s, types[k], &file_bytes[k], &err), KV_OK);
    }
    kv_model_free(s);
    for (int k = 0; k < 2; k++) {
        mem_probe r;
        CU_ASSERT_EQUAL_FATAL(probe_memory(paths[k], &r), 0);
        double peak = (double)(r.peak_kb - r.base_kb) * 1024.0;
        double bound =
            (double)file_bytes[k] + (double)r.kv_bytes + (double)r.ws_est + 24.0 * 1048576;
        printf("\n  %-5s file %.1f MB, KV %.2f MB, workspace %.1f MB: peak RSS over start %.1f MB "
               "(bound %.1f MB; the fp32 weights alone: %.1f MB)",
               kv_dtype_name(types[k]), file_bytes[k] / 1e6, r.kv_bytes / 1e6, r.ws_est / 1e6,
               peak / 1e6, bound / 1e6, f32_bytes / 1e6);
        CU_ASSERT(peak <= bound);
        CU_ASSERT(peak < 0.6 * (double)f32_bytes);
        /* every weight but the embedding rows of unused tokens was read */
        size_t emb = 0;
        kv_dtype_row_bytes(types[k], 768, "token_embd", &emb, NULL);
        CU_ASSERT(peak >= 0.9 * (double)(file_bytes[k] - emb * 32000));
        remove(paths[k]);
    }
#endif
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--mem-probe") == 0) return mem_probe_child(argv[2]);
    static const tu_test tests[] = {
        {"type table, row sizes, errors", test_type_table},
        {"hand-built Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 blocks", test_blocks_32},
        {"hand-built Q4_K/Q5_K/Q6_K blocks", test_blocks_k},
        {"quantise -> dequantise error on 656K weights", test_quant_error_real},
        {"Q8_0 quantiser vs llama.cpp's Q8_0 file", test_q8_0_vs_llama_cpp},
        {"typed dot vs dequantise + double", test_dot},
        {"integer dots: every isa = portable, within the activation rounding", test_int_dot},
        {"typed matmul: dot, tiled GEMM, F32 paths", test_matmul},
        {"integer GEMM: every isa = reference, within the activation rounding", test_igemm},
        {"pooled matmul: the same bits on 1, 2, 3 threads", test_matmul_pool},
        {"rowwise matmul: every row of any batch = its one-row bits", test_matmul_rowwise},
        {"656K written in Q8_0/Q5_x/Q4_x: perplexity vs F32", test_656k_types_perplexity},
        {"K-quants on a synthetic 256-multiple model: logits vs F32", test_k_quants_synthetic},
        {"F16/BF16 in their own type: logits within 1e-5 of fp32", test_half_logits_vs_fp32},
        {"F16/Q8_0 model of real shape: peak RSS ~ file + KV + workspace", test_memory_own_type},
    };
    return tu_main(argc, argv, "quant", tests, sizeof tests / sizeof tests[0]);
}
