/* The tokenizer of a GGUF vocabulary (tokenizer.ggml.* metadata, ggml docs/gguf.md
 * "Tokenizer"), read from any parsed GGUF file: a model's, or a vocabulary-only file.
 *
 * tokenizer.ggml.model "llama": scored pieces (runtime/tokenizer/tokenizer.c), "▁" read as ' ', the
 * dummy prefix from tokenizer.ggml.add_space_prefix (default on), BOS/EOS default 1/2 as
 * llama.cpp. "gpt2": byte-level BPE (runtime/tokenizer/tokenizer_bpe.c) whose pre-tokenizer regexes
 * follow tokenizer.ggml.pre exactly as llama.cpp's llm_tokenizer_bpe does (src/llama-vocab.cpp:
 * the name -> type table in llama_vocab::impl::load, the regex lists in the llm_tokenizer_bpe
 * constructor; each list originally from the family's Hugging Face tokenizer.json). An unknown
 * value is refused by name.
 *
 * tokenizer.ggml.token_type (llama.cpp llama_token_type): 2 unknown and 3 control tokens are
 * special (cut out of the text only when parsing special tokens) and decode to nothing;
 * 4 user-defined tokens are always cut out and decode to their text; 6 byte tokens <0xXX>.
 */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_meta.h"
#include "tokenizer/tokenizer_bpe.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* ---- pre-tokenizers (tokenizer.ggml.pre) ---- */

/* GPT-2's pattern as llama.cpp writes it: its regex split keeps the unmatched gaps as pieces,
 * so GPT-2's trailing "|\s+" is implied. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* Llama 3's (tokenizer.json "(?i:'s|...)" spelled case by case, as llama.cpp adapts it) */
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"    \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2's: Llama 3's with single digits */
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"         \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* CJK ideographs and Hangul ranges of the DeepSeek tokenizers (U+4E00-9FA5, U+0800-4E00,
 * U+AC00-D7FF) */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* GPT-4o / Llama 4 and Tekken (Mistral Nemo): cased-word splits, written with PCRE2's Unicode
 * categories as in the families' tokenizer.json */
#define RE_WORD_UPPER_LOWER                                                                        \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
#define RE_WORD_UPPER                                                                              \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"

typedef struct pre_type {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *re[6];
    int ignore_merges; /* a word that is a token is taken whole (llama.cpp ignore_merges) */
    int add_bos;       /* llama.cpp's add_bos default for the type */
} pre_type;

static const pre_type pre_types[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
     {RE_LLAMA3},
     1,
     1},
    {"dbrx|smaug-bpe|glm4|chatglm-bpe", {RE_LLAMA3}, 0, 0},
    /* deepseek-llm: its tokenizer.json spells the cased letters (Lu, Ll, Lt) out as ranges;
     * written here as code points, since some of them (e.g. U+1F7D, U+212A) are not stable
     * under Unicode normalisation */
    {"deepseek-llm",
     {"[\\r\\n]",
      "\\s?["
      "\\x{41}-\\x{5A}\\x{61}-\\x{7A}\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"
      "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}"
      "\\x{376}-\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}"
      "\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}"
      "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"
      "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
      "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
      "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
      "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
      "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
      "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
      "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
      "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}-\\x{2184}"
      "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}-\\x{2CF3}"
      "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
      "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
      "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
      "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
      "\\x{1E900}-\\x{1E943}"
      "]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
     0,
     0},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}, 0, 0},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
      "\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0,
     0},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, 0, 0},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", {"\\p{N}", RE_GPT2}, 0, 0},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|"
     "exaone4|mpt|olmo|jais|trillion|granite-docling",
     {RE_GPT2},
     0,
     0},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2",
     {RE_QWEN2},
     0,
     0},
    {"poro-chat|bloom|gpt3-finnish",
     {" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"},
     0,
     0},
    {"seed-coder",
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
                      "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0,
     0},
    {"tekken",
     {RE_WORD_UPPER_LOWER "|" RE_WORD_UPPER "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
                          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     1,
     1},
    {"gpt-4o|llama4",
     {RE_WORD_UPPER_LOWER RE_CONTRACTIONS "?|" RE_WORD_UPPER RE_CONTRACTIONS
                                          "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
                                          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     0,
     0},
};

/* The pre-tokenizer type named `pre` ("" = absent: llama.cpp uses "default"), or NULL. */
static const pre_type *find_pre(const char *pre) {
    if (!pre[0]) pre = "default";
    size_t n = strlen(pre);
    for (size_t i = 0; i < sizeof pre_types / sizeof pre_types[0]; i++)
        for (const char *p = pre_types[i].names; p;) {
            const char *bar = strchr(p, '|');
            size_t l = bar ? (size_t)(bar - p) : strlen(p);
            if (l == n && memcmp(p, pre, n) == 0) return &pre_types[i];
            p = bar ? bar + 1 : NULL;
        }
    return NULL;
}

/* ---- shared: ids, types ---- */

/* tokenizer.ggml.<key> as an id in [0, n), else dflt. */
static int meta_id(const kv_gguf *g, const char *key, int n, int dflt, kv_error *err, int *rc) {
    int64_t v;
    int got = kv_gguf_get_int(g, key, &v, err);
    if (got < 0) *rc = KV_EINPUT;
    return got > 0 && v >= 0 && v < n ? (int)v : dflt >= 0 && dflt < n ? dflt : -1;
}

/* Token types as ints ([n], all TT_NORMAL when the key is absent); caller frees. */
static int token_types(const kv_gguf *g, int n, int **out, kv_error *err) {
    float *f = NULL;
    int rc = kv_gguf_get_floats(g, "tokenizer.ggml.token_type", n, &f, err);
    if (rc) return rc;
    int *t = kv_malloc((size_t)n * sizeof *t + 1, "token types", err);
    if (!t) {
        free(f);
        return KV_EINTERNAL;
    }
    for (int i = 0; i < n; i++) {
        /* a float from the file: only whole numbers in [0, 255] are converted */
        if (f && !(f[i] >= 0.0f && f[i] <= 255.0f && f[i] == floorf(f[i]))) {
            rc = kv_fail(err, KV_EINPUT,
                         "%s: tokenizer.ggml.token_type[%d] is %g, not a token type (a whole "
                         "number 0-6); the file is damaged",
                         g->path, i, (double)f[i]);
            free(f);
            free(t);
            return rc;
        }
        t[i] = f ? (int)f[i] : TT_NORMAL;
    }
    free(f);
    *out = t;
    return KV_OK;
}

/* Special tokens and silent ids from the types: unknown and control are special (control = 1)
 * and silent; user-defined are special (control = 0). Arrays sized [n]. */
static int classify(const int *types, int n, int *special, unsigned char *control,
                    unsigned char *silent) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        int ty = types[i];
        silent[i] = ty == TT_UNKNOWN || ty == TT_CONTROL;
        if (ty == TT_UNKNOWN || ty == TT_CONTROL || ty == TT_USER) {
            special[k] = i;
            control[k] = ty != TT_USER;
            k++;
        }
    }
    return k;
}

/* Replace every "▁" (U+2581, e2 96 81) by ' ' in place. */
static void unescape_spaces(char *s) {
    char *w = s;
    for (const char *r = s; *r;) {
        if ((unsigned char)r[0] == 0xe2 && (unsigned char)r[1] == 0x96 &&
            (unsigned char)r[2] == 0x81) {
            *w++ = ' ';
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* ---- "llama": scored pieces ---- */
static int gguf_tok_llama(const kv_gguf *g, char **tokens, int n, const int *types,
                          kv_tokenizer **out, kv_error *err) {
    int rc = KV_OK;
    int bos = meta_id(g, "tokenizer.ggml.bos_token_id", n, 1, err, &rc);
    int eos = meta_id(g, "tokenizer.ggml.eos_token_id", n, 2, err, &rc);
    if (rc) return rc;
    float *scores = NULL;
    rc = kv_gguf_get_floats(g, "tokenizer.ggml.scores", n, &scores, err);
    if (rc) return rc;
    if (!scores) {
        scores = kv_calloc((size_t)n + 1, sizeof *scores, "scores", err);
        if (!scores) return KV_EINTERNAL;
    }
    /* A vocabulary whose scores are all equal (a BPE vocabulary converted without its merges,
     * e.g. TinyStories-656K's GGUF files) would merge leftmost-first; its ids are in merge
     * order, so rank by id instead (documented heuristic, docs/formats.md). */
    int equal = 1;
    for (int i = 1; i < n && equal; i++) equal = scores[i] == scores[0];
    if (equal && n > 1)
        for (int i = 0; i < n; i++) scores[i] = -(float)i;
    for (int i = 0; i < n; i++) unescape_spaces(tokens[i]);
    rc = kv_tokenizer_from_scored((const char *const *)tokens, scores, n, bos, eos, out, err);
    free(scores);
    if (rc) return rc;
    int *special = malloc((size_t)n * sizeof *special + 1);
    unsigned char *control = malloc((size_t)n + 1), *silent = malloc((size_t)n + 1);
    int64_t add_bos = 1, space = 1;
    if (!special || !control || !silent) rc = kv_fail(err, KV_EINTERNAL, "out of memory");
    if (!rc && (kv_gguf_get_int(g, "tokenizer.ggml.add_bos_token", &add_bos, err) < 0 ||
                kv_gguf_get_int(g, "tokenizer.ggml.add_space_prefix", &space, err) < 0))
        rc = KV_EINPUT;
    if (!rc) {
        int k = classify(types, n, special, control, silent);
        rc = kv_spm_configure(*out, space != 0, silent, err);
        if (!rc) {
            const char **texts = malloc((size_t)k * sizeof *texts + 1);
            if (!texts) rc = kv_fail(err, KV_EINTERNAL, "out of memory");
            for (int i = 0; texts && i < k; i++) texts[i] = tokens[special[i]];
            if (!rc)
                rc = kv_tokenizer_set_special(*out, special, texts, control, k,
                                              KV_SPECIAL_LONGEST_FIRST, err);
            free(texts);
        }
        (*out)->add_bos = add_bos != 0;
    }
    free(special);
    free(control);
    free(silent);
    if (rc) {
        kv_tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- "gpt2": byte-level BPE ---- */
static int gguf_tok_gpt2(const kv_gguf *g, char **tokens, int n, const int *types,
                         kv_tokenizer **out, kv_error *err) {
    char pre[64] = "";
    int rc = kv_gguf_get_str(g, "tokenizer.ggml.pre", pre, sizeof pre, err) < 0 ? KV_EINPUT : 0;
    const pre_type *pt = rc ? NULL : find_pre(pre);
    if (!rc && !pt) {
        char known[2048] = "";
        size_t k = 0;
        for (size_t i = 0; i < sizeof pre_types / sizeof pre_types[0] && k < sizeof known; i++)
            k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? "|" : "",
                                  pre_types[i].names);
        return kv_fail(err, KV_EINPUT,
                       "%s: tokenizer.ggml.pre '%s' is not a pre-tokenizer kvplan knows (it "
                       "follows llama.cpp for: %s)",
                       g->path, pre, known);
    }
    int bos = meta_id(g, "tokenizer.ggml.bos_token_id", n, -1, err, &rc);
    int eos = meta_id(g, "tokenizer.ggml.eos_token_id", n, -1, err, &rc);
    int unk = meta_id(g, "tokenizer.ggml.unknown_token_id", n, -1, err, &rc);
    int64_t add_bos = pt ? pt->add_bos : 0;
    if (!rc && kv_gguf_get_int(g, "tokenizer.ggml.add_bos_token", &add_bos, err) < 0)
        rc = KV_EINPUT;
    if (rc) return rc;
    char **merges = NULL;
    int n_merges = 0;
    rc = kv_gguf_get_strings(g, "tokenizer.ggml.merges", &merges, &n_merges, err);
    if (rc) return rc;
    char **left = calloc((size_t)n_merges + 1, sizeof *left);
    char **right = calloc((size_t)n_merges + 1, sizeof *right);
    int *special = malloc((size_t)n * sizeof *special + 1);
    unsigned char *control = malloc((size_t)n + 1), *silent = malloc((size_t)n + 1);
    if (!left || !right || !special || !control || !silent)
        rc = kv_fail(err, KV_EINTERNAL, "out of memory (merges)");
    for (int i = 0; i < n_merges && !rc; i++) {
        /* "left right", split at the first space after the first byte (llama.cpp) */
        char *sp = merges[i][0] ? strchr(merges[i] + 1, ' ') : NULL;
        if (!sp || !sp[1])
            rc = kv_fail(err, KV_EINPUT,
                         "%s: tokenizer.ggml.merges[%d] = '%.60s' is not two tokens separated "
                         "by one space",
                         g->path, i, merges[i]);
        else {
            *sp = '\0';
            left[i] = merges[i];
            right[i] = sp + 1;
        }
    }
    if (!rc) {
        int k = classify(types, n, special, control, silent);
        int nre = 0;
        while (nre < 6 && pt->re[nre]) nre++;
        kv_bpe_spec s;
        memset(&s, 0, sizeof s);
        s.n_vocab = n;
        s.tokens = (const char *const *)tokens;
        s.n_merges = n_merges;
        s.merge_left = (const char *const *)left;
        s.merge_right = (const char *const *)right;
        s.style = KV_BPE_BYTELEVEL;
        s.regexes = pt->re;
        s.n_regexes = nre;
        s.ignore_merges = pt->ignore_merges;
        s.unk_id = unk;
        s.special = special;
        s.n_special = k;
        s.special_control = control;
        s.special_order = KV_SPECIAL_LONGEST_FIRST;
        s.silent = silent;
        s.bos_id = bos;
        s.eos_id = eos;
        s.add_bos = add_bos != 0 && bos >= 0;
        rc = kv_tokenizer_bpe_new(&s, g->path, out, err);
    }
    free(special);
    free(control);
    free(silent);
    free(left);
    free(right);
    kv_gguf_free_strings(merges, n_merges);
    return rc;
}

/* tokenizer.chat_template, when the file has one, kept on t. A value that is not a string is
 * refused by name. */
static int gguf_chat_template(const kv_gguf *g, kv_tokenizer *t, kv_error *err) {
    const kv_gguf_kv *kv = kv_gguf_find(g, "tokenizer.chat_template");
    if (!kv) return KV_OK;
    if (kv->type != KV_GGUF_STRING)
        return kv_fail(err, KV_EINPUT,
                       "%s: metadata 'tokenizer.chat_template' has value type %u, expected a "
                       "string",
                       g->path, kv->type);
    uint64_t n;
    memcpy(&n, g->base + kv->off, 8); /* kv_gguf_open checked that the bytes are in the file */
    return kv_tokenizer_set_chat_template(t, (const char *)g->base + kv->off + 8, (size_t)n, err);
}

int kv_tokenizer_load_gguf(const kv_gguf *g, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    char model[32] = "";
    int got = kv_gguf_get_str(g, "tokenizer.ggml.model", model, sizeof model, err);
    if (got < 0) return KV_EINPUT;
    if (!got)
        return kv_fail(err, KV_EINPUT,
                       "%s: no tokenizer in this GGUF file (metadata 'tokenizer.ggml.model' is "
                       "missing); pass --tokenizer PATH",
                       g->path);
    if (strcmp(model, "llama") != 0 && strcmp(model, "gpt2") != 0)
        return kv_fail(err, KV_EINPUT,
                       "%s: tokenizer.ggml.model '%s' is not supported (kvplan reads 'llama' "
                       "and 'gpt2'); pass --tokenizer PATH",
                       g->path, model);
    char **tokens = NULL;
    int n = 0, *types = NULL;
    int rc = kv_gguf_get_strings(g, "tokenizer.ggml.tokens", &tokens, &n, err);
    if (!rc && n == 0) rc = kv_fail(err, KV_EINPUT, "%s: tokenizer.ggml.tokens is empty", g->path);
    if (!rc) rc = token_types(g, n, &types, err);
    if (!rc)
        rc = !strcmp(model, "llama") ? gguf_tok_llama(g, tokens, n, types, out, err)
                                     : gguf_tok_gpt2(g, tokens, n, types, out, err);
    free(types);
    kv_gguf_free_strings(tokens, n);
    if (!rc) rc = gguf_chat_template(g, *out, err);
    if (rc) {
        kv_tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}
