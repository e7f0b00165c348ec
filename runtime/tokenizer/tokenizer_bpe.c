/* Merge-ranked BPE tokenizer (KV_TOK_BPE) and the Hugging Face tokenizer.json reader.
 * See runtime/tokenizer/tokenizer_bpe.h for the two styles and the merge algorithm.
 *
 * tokenizer.json (Hugging Face `tokenizers` serialisation) fields read:
 *   model: {type "BPE", vocab {token: id}, merges ["a b", ...] or [["a","b"], ...],
 *           byte_fallback, unk_token, fuse_unk, ignore_merges}
 *   added_tokens: [{id, content, special}] (matched verbatim before anything else)
 *   normalizer: null | Prepend{prepend "▁"} | Replace{pattern {String " "}, content "▁"} |
 *               NFC/NFKC (accepted as a no-op: the input is expected in NFC) | Sequence
 *   pre_tokenizer: null | ByteLevel{add_prefix_space, use_regex} | Split{pattern {Regex|String},
 *               behavior "Isolated"} | Metaspace{replacement "▁", prepend_scheme} | Sequence
 *   post_processor: TemplateProcessing whose single template starts with the BOS (add_bos
 *               default when tokenizer_config.json does not say)
 * tokenizer_config.json beside it: add_bos_token, bos_token, eos_token.
 */
#include "tokenizer/tokenizer_bpe.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/strmap.h"

typedef struct bpe_impl {
    int n; /* ids 0..n-1 */
    kv_bpe_style style;
    kv_strmap vocab;  /* token string (as spelled in the file) -> id */
    kv_strmap merges; /* 8-byte key (left id, right id) -> rank */
    int *merge_new;   /* [n_merges] id of the merged token */
    int n_merges;
    char **dec;                       /* [n] bytes each id decodes to, owned (NULL = nothing) */
    int *dec_len;                     /* [n] */
    unsigned char *silent;            /* [n] 1 = special token, decodes to nothing */
    pcre2_code *re[KV_BPE_MAX_REGEX]; /* pre-tokenizer splits applied in sequence */
    int n_re;
    int add_prefix_space, prepend_space, replace_space, byte_fallback, unk_id, fuse_unk,
        ignore_merges;
    size_t max_len;         /* bytes of the longest vocabulary string */
    int byte_id[256];       /* SPM: id of "<0xXX>" or -1 */
    char byte_char[256][3]; /* byte-level: UTF-8 of each byte's code point */
    int byte_char_len[256];
} bpe_impl;

static void bpe_free(void *p) {
    bpe_impl *b = p;
    if (!b) return;
    kv_strmap_free(&b->vocab);
    kv_strmap_free(&b->merges);
    free(b->merge_new);
    if (b->dec)
        for (int i = 0; i < b->n; i++) free(b->dec[i]);
    free(b->dec);
    free(b->dec_len);
    free(b->silent);
    for (int i = 0; i < b->n_re; i++) pcre2_code_free(b->re[i]);
    free(b);
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static int byte_to_cp(int byte) {
    if ((byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
        (byte >= 0xAE && byte <= 0xFF))
        return byte;
    int n = 0;
    for (int b = 0; b < byte; b++)
        if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) n++;
    return 256 + n;
}

static int utf8_put(int cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Length of the UTF-8 sequence starting at s (1 for invalid lead bytes), clipped to n. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    size_t l = 1;
    if (s[0] >= 0xF0)
        l = 4;
    else if (s[0] >= 0xE0)
        l = 3;
    else if (s[0] >= 0xC0)
        l = 2;
    if (l > n) l = n;
    for (size_t i = 1; i < l; i++)
        if ((s[i] & 0xC0) != 0x80) return i;
    return l;
}

/* ---- the merge loop ---- */
typedef struct bsym {
    int id, prev, next;
} bsym;
typedef struct bmerge {
    int rank, pos, lid, rid;
} bmerge;
typedef struct bheap {
    bmerge *v;
    int n, cap;
} bheap;

static int bm_before(const bmerge *a, const bmerge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int bheap_push(bheap *h, bmerge m) {
    if (h->n == h->cap) {
        int nc = h->cap ? 2 * h->cap : 256;
        bmerge *nv = realloc(h->v, (size_t)nc * sizeof *nv);
        if (!nv) return -1;
        h->v = nv;
        h->cap = nc;
    }
    int i = h->n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!bm_before(&m, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = m;
    return 0;
}

static bmerge bheap_pop(bheap *h) {
    bmerge top = h->v[0], last = h->v[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, b = -1;
        if (l < h->n) b = l;
        if (r < h->n && bm_before(&h->v[r], &h->v[l])) b = r;
        if (b < 0 || !bm_before(&h->v[b], &last)) break;
        h->v[i] = h->v[b];
        i = b;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

static int merge_rank(const bpe_impl *b, int l, int r) {
    int key[2] = {l, r};
    return kv_strmap_get(&b->merges, (const char *)key, sizeof key);
}

static int push_pair(const bpe_impl *b, bheap *h, const bsym *s, int pos) {
    int nx = s[pos].next;
    if (nx < 0) return 0;
    int rank = merge_rank(b, s[pos].id, s[nx].id);
    if (rank < 0) return 0;
    bmerge m = {rank, pos, s[pos].id, s[nx].id};
    return bheap_push(h, m);
}

typedef struct scratch {
    bsym *syms;
    size_t cap;
    bheap heap;
} scratch;

/* BPE on one word (bytes w[0..len)): initial symbols per code point (byte fallback, unknown),
 * then merges lowest rank first, leftmost on ties (tokenizers models/bpe/word.rs merge_all). */
static int bpe_word(const bpe_impl *b, scratch *sc, const char *w, size_t len, int **ids, int *n,
                    int *cap, kv_error *err) {
    if (len == 0) return KV_OK;
    if (b->ignore_merges) {
        int id = kv_strmap_get(&b->vocab, w, len);
        if (id >= 0) return kv_tok_push_id(ids, n, cap, id, err);
    }
    if (sc->cap < len + 1) {
        bsym *ns = realloc(sc->syms, (len + 1) * sizeof *ns);
        if (!ns) return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
        sc->syms = ns;
        sc->cap = len + 1;
    }
    bsym *s = sc->syms;
    int ns = 0, prev_unk = 0;
    for (size_t i = 0; i < len;) {
        size_t cl = utf8_len((const unsigned char *)w + i, len - i);
        int id = kv_strmap_get(&b->vocab, w + i, cl);
        if (id >= 0) {
            s[ns++].id = id;
            prev_unk = 0;
        } else {
            int ok = b->byte_fallback;
            for (size_t k = 0; k < cl && ok; k++) ok = b->byte_id[(unsigned char)w[i + k]] >= 0;
            if (ok) {
                for (size_t k = 0; k < cl; k++) s[ns++].id = b->byte_id[(unsigned char)w[i + k]];
                prev_unk = 0;
            } else if (b->unk_id >= 0) {
                if (!(b->fuse_unk && prev_unk)) s[ns++].id = b->unk_id;
                prev_unk = 1;
            } /* no unknown token: the code point is dropped, as tokenizers does */
        }
        i += cl;
    }
    for (int i = 0; i < ns; i++) {
        s[i].prev = i - 1;
        s[i].next = i + 1 < ns ? i + 1 : -1;
    }
    bheap *h = &sc->heap;
    h->n = 0;
    for (int i = 0; i < ns; i++)
        if (push_pair(b, h, s, i)) return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    while (h->n > 0) {
        bmerge m = bheap_pop(h);
        int l = m.pos, r = s[l].next;
        if (s[l].id != m.lid || r < 0 || s[r].id != m.rid) continue; /* stale */
        s[l].id = b->merge_new[m.rank];
        s[l].next = s[r].next;
        if (s[r].next >= 0) s[s[r].next].prev = l;
        s[r].id = -1;
        s[r].next = -1;
        if ((s[l].prev >= 0 && push_pair(b, h, s, s[l].prev)) || push_pair(b, h, s, l))
            return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    }
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = s[i].next)
        if (kv_tok_push_id(ids, n, cap, s[i].id, err)) return KV_EINTERNAL;
    return KV_OK;
}

/* Growable byte buffer. */
typedef struct bbuf {
    char *p;
    size_t n, cap;
} bbuf;
static int bb_put(bbuf *b, const char *s, size_t n) {
    if (n > SIZE_MAX / 4 || b->n > SIZE_MAX / 4) return -1;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (b->n + n + 1 > nc) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* One piece of pre-tokenised text: byte-level mapping (if that style), then BPE. */
static int encode_piece(const bpe_impl *b, scratch *sc, bbuf *tmp, const char *p, size_t len,
                        int **ids, int *n, int *cap, kv_error *err) {
    if (b->style != KV_BPE_BYTELEVEL) return bpe_word(b, sc, p, len, ids, n, cap, err);
    tmp->n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (bb_put(tmp, b->byte_char[c], (size_t)b->byte_char_len[c]))
            return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    }
    return bpe_word(b, sc, tmp->p, tmp->n, ids, n, cap, err);
}

/* Pieces of the normalised text: [off, off + len) spans. */
typedef struct span {
    size_t off, len;
} span;
typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static int span_push(spans *s, size_t off, size_t len) {
    if (len == 0) return 0;
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 64;
        span *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return -1;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = (span){off, len};
    return 0;
}

/* Where the split of one subject by a regex stands: the next match from `off`, the end of
 * the last match `last`, `done` once the subject's tail is out. */
typedef struct splitter {
    size_t off, last;
    uint32_t opts; /* 0 until the first match has checked the subject's UTF-8 */
    int done;
} splitter;

/* Append to `out` the next pieces of the subject text[base, base + len) split by `re` (the
 * matches and the gaps between them, as llama.cpp unicode_regex_split and HF Split
 * "Isolated"), stopping once `out` holds `max` spans or the subject is done. */
static int split_next(pcre2_code *re, pcre2_match_data *md, const char *text, size_t base,
                      size_t len, splitter *st, spans *out, size_t max, kv_error *err) {
    const char *p = text + base;
    while (!st->done && out->n < max) {
        int rc = st->off <= len ? pcre2_match(re, (PCRE2_SPTR)p, len, st->off, st->opts, md, NULL)
                                : PCRE2_ERROR_NOMATCH;
        st->opts = PCRE2_NO_UTF_CHECK;
        if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
            return kv_fail(err, KV_EINPUT,
                           "the text is not valid UTF-8 (in the %zu bytes from byte %zu), "
                           "which the byte-level pre-tokenizer needs",
                           len, base);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kv_fail(err, KV_EINPUT, "tokenizer pre-tokenizer regex failed at byte %zu: %s",
                           base + st->off, (const char *)msg);
        }
        if (rc == PCRE2_ERROR_NOMATCH) { /* the tail after the last match */
            st->done = 1;
            if (span_push(out, base + st->last, len - st->last))
                return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (span_push(out, base + st->last, ms - st->last) || span_push(out, base + ms, me - ms))
            return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
        st->last = me;
        if (me == ms) /* empty match: step one code point (past the end: no more matches) */
            st->off = me >= len ? len + 1 : me + utf8_len((const unsigned char *)p + me, len - me);
        else
            st->off = me;
    }
    return KV_OK;
}

/* Split every piece of `in` by `re` into `out` (each piece is the whole subject). */
static int split_pieces(pcre2_code *re, pcre2_match_data *md, const char *text, const spans *in,
                        spans *out, kv_error *err) {
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        splitter st = {0, 0, 0, 0};
        int rc = split_next(re, md, text, in->v[i].off, in->v[i].len, &st, out, SIZE_MAX, err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* The normalised text of a fragment into norm: SentencePiece style (a leading "▁" when
 * prepend_space, spaces as "▁"), else an optional leading space (add_prefix_space). */
static int bpe_normalise(const bpe_impl *b, const char *text, size_t len, bbuf *norm) {
    static const char meta[] = "\xe2\x96\x81"; /* "▁" */
    int oom = 0;
    if (b->style == KV_BPE_SPM) {
        if (b->prepend_space) oom |= bb_put(norm, meta, 3);
        size_t run = 0;
        for (size_t i = 0; i < len && !oom; i++) {
            if (text[i] == ' ' && b->replace_space) {
                oom |= bb_put(norm, text + run, i - run) | bb_put(norm, meta, 3);
                run = i + 1;
            }
        }
        if (!oom) oom |= bb_put(norm, text + run, len - run);
    } else {
        if (b->add_prefix_space && text[0] != ' ') oom |= bb_put(norm, " ", 1);
        if (!oom) oom |= bb_put(norm, text, len);
    }
    return oom || !norm->p ? -1 : 0;
}

/* Whether the text [0, len) may be cut before byte i (a code point's start) with the same ids
 * as one pass: no vocabulary string spans the cut (every merged symbol is one, so no symbol
 * ever crosses it and both sides merge alone, in the same order), and the code points on
 * both sides are vocabulary strings (no unknown-token fusion across it). */
static int bpe_cut_ok(const bpe_impl *b, const char *text, size_t len, size_t i) {
    if (i == 0 || i >= len || ((unsigned char)text[i] & 0xC0) == 0x80) return 0;
    size_t a = i - 1;
    while (a > 0 && ((unsigned char)text[a] & 0xC0) == 0x80) a--;
    size_t cr = utf8_len((const unsigned char *)text + i, len - i);
    if (kv_strmap_get(&b->vocab, text + a, i - a) < 0 || kv_strmap_get(&b->vocab, text + i, cr) < 0)
        return 0;
    for (size_t w = 2; w <= b->max_len; w++) /* short spans first: the likely strings */
        for (size_t s = i >= w - 1 ? i - (w - 1) : 0; s < i && s + w <= len; s++)
            if (kv_strmap_get(&b->vocab, text + s, w) >= 0) return 0;
    return 1;
}

/* Without a pre-tokenizer regex the fragment is one word: a long one is encoded in spans of
 * about this many bytes (ending at the first safe cut in [BPE_SPAN, 2 BPE_SPAN), else at the
 * end), which bounds the symbols and the merge heap (a 20 MB text took 27 bytes per byte). */
enum { BPE_SPAN = 1 << 16 };

static int bpe_encode_word(const bpe_impl *b, scratch *sc, bbuf *tmp, const char *text, size_t len,
                           int **ids, int *n, int *cap, kv_error *err) {
    if (b->style == KV_BPE_BYTELEVEL) /* its vocabulary is spelled in mapped bytes */
        return encode_piece(b, sc, tmp, text, len, ids, n, cap, err);
    int rc = KV_OK;
    for (size_t a = 0; a < len && !rc;) {
        size_t e = a + BPE_SPAN;
        while (e < len && e < a + 2 * (size_t)BPE_SPAN && !bpe_cut_ok(b, text, len, e)) e++;
        if (e >= len || e == a + 2 * (size_t)BPE_SPAN) e = len;
        rc = encode_piece(b, sc, tmp, text + a, e - a, ids, n, cap, err);
        a = e;
    }
    return rc;
}

/* Pieces of the first pre-tokenizer regex taken at a time: the pieces, their splits by the
 * other regexes and their BPE are done batch by batch, so memory beyond the text and the ids
 * stays bounded (a 50 MB text used to hold every piece's span at once, 27 bytes per byte). */
#define BPE_PIECE_BATCH 4096

/* Encode one fragment (no special tokens in it): normalise, pre-tokenise, BPE each piece. */
static int bpe_encode(const kv_tokenizer *t, const char *text, size_t len, int **ids, int *n,
                      int *cap, kv_error *err) {
    const bpe_impl *b = t->impl;
    if (len == 0) return KV_OK;
    scratch sc = {0};
    bbuf norm = {0}, tmp = {0};
    spans cur = {0}, nxt = {0};
    pcre2_match_data *md = NULL;
    int oom = bpe_normalise(b, text, len, &norm);
    if (!oom && b->n_re > 0)
        oom |= !(md = pcre2_match_data_create(1, NULL)); /* only the whole match */
    int rc = oom ? kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)") : KV_OK;
    if (!rc && b->n_re == 0) rc = bpe_encode_word(b, &sc, &tmp, norm.p, norm.n, ids, n, cap, err);
    splitter st = {0, 0, 0, b->n_re == 0};
    while (!rc && !st.done) {
        cur.n = 0;
        rc = split_next(b->re[0], md, norm.p, 0, norm.n, &st, &cur, BPE_PIECE_BATCH, err);
        for (int r = 1; r < b->n_re && !rc; r++) {
            rc = split_pieces(b->re[r], md, norm.p, &cur, &nxt, err);
            spans sw = cur;
            cur = nxt;
            nxt = sw;
        }
        for (size_t i = 0; i < cur.n && !rc; i++)
            rc = encode_piece(b, &sc, &tmp, norm.p + cur.v[i].off, cur.v[i].len, ids, n, cap, err);
    }
    if (md) pcre2_match_data_free(md);
    free(cur.v);
    free(nxt.v);
    free(sc.syms);
    free(sc.heap.v);
    free(norm.p);
    free(tmp.p);
    return rc;
}

static int bpe_piece(const kv_tokenizer *t, int prev_id, int id, char *out, int cap) {
    const bpe_impl *b = t->impl;
    if (cap <= 0) return 0;
    out[0] = '\0';
    if (id < 0 || id >= b->n || b->silent[id] || !b->dec[id]) return 0;
    const char *p = b->dec[id];
    int len = b->dec_len[id];
    /* SentencePiece decoder Strip(start 1): the text's first token loses its leading space */
    if (b->style == KV_BPE_SPM && b->prepend_space && (prev_id < 0 || prev_id == t->bos_id) &&
        len > 0 && p[0] == ' ') {
        p++;
        len--;
    }
    if (len > cap - 1) len = cap - 1;
    memcpy(out, p, (size_t)len);
    out[len] = '\0';
    return len;
}

static const kv_tokenizer_ops bpe_ops = {bpe_encode, bpe_piece, bpe_free};

/* The bytes token string `s` decodes to, in a new buffer. */
static char *decode_token(const bpe_impl *b, const char *s, int *out_len) {
    size_t n = strlen(s);
    char *o = malloc(n + 1);
    if (!o) return NULL;
    size_t k = 0;
    unsigned int byte;
    if (b->style == KV_BPE_SPM) {
        if (b->byte_fallback && n == 6 && sscanf(s, "<0x%02X>", &byte) == 1 && byte < 256) {
            o[0] = (char)byte;
            *out_len = 1;
            return o;
        }
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                o[k++] = ' ';
                i += 3;
            } else {
                o[k++] = s[i++];
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            size_t cl = utf8_len((const unsigned char *)s + i, n - i);
            int found = -1;
            for (int c = 0; c < 256 && found < 0; c++)
                if ((size_t)b->byte_char_len[c] == cl && memcmp(b->byte_char[c], s + i, cl) == 0)
                    found = c;
            if (found >= 0)
                o[k++] = (char)found;
            else {
                memcpy(o + k, s + i, cl); /* not a byte-level code point: keep it */
                k += cl;
            }
            i += cl;
        }
    }
    o[k] = '\0';
    *out_len = (int)k;
    return o;
}

/* Stage 1 of kv_tokenizer_bpe_new: the spec's flags, the byte-level alphabet and the tables. */
static int bpe_alloc(const kv_bpe_spec *sp, bpe_impl *b, kv_error *err) {
    b->n = sp->n_vocab;
    b->style = sp->style;
    b->add_prefix_space = sp->add_prefix_space;
    b->prepend_space = sp->prepend_space;
    b->replace_space = sp->replace_space;
    b->byte_fallback = sp->byte_fallback;
    b->unk_id = sp->unk_id;
    b->fuse_unk = sp->fuse_unk;
    b->ignore_merges = sp->ignore_merges;
    b->n_merges = sp->n_merges;
    for (int c = 0; c < 256; c++) {
        b->byte_id[c] = -1;
        b->byte_char_len[c] = utf8_put(byte_to_cp(c), b->byte_char[c]);
    }
    b->dec = calloc((size_t)b->n, sizeof *b->dec);
    b->dec_len = calloc((size_t)b->n, sizeof *b->dec_len);
    b->silent = calloc((size_t)b->n, 1);
    b->merge_new = calloc((size_t)sp->n_merges + 1, sizeof *b->merge_new);
    if (!b->dec || !b->dec_len || !b->silent || !b->merge_new ||
        kv_strmap_init(&b->vocab, (size_t)b->n) || kv_strmap_init(&b->merges, (size_t)sp->n_merges))
        return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    return KV_OK;
}

/* Stage 2: piece -> id (the first id of a piece wins), byte tokens <0xXX>, decoded bytes. */
static int bpe_read_vocab(const kv_bpe_spec *sp, bpe_impl *b, kv_error *err) {
    for (int i = 0; i < b->n; i++) {
        const char *s = sp->tokens[i];
        if (!s) continue;
        size_t l = strlen(s);
        if (kv_strmap_get(&b->vocab, s, l) >= 0) continue;
        if (kv_strmap_put(&b->vocab, s, l, i)) return kv_fail(err, KV_EINTERNAL, "out of memory");
        if (l > b->max_len) b->max_len = l;
        unsigned int byte;
        if (l == 6 && sscanf(s, "<0x%02X>", &byte) == 1 && byte < 256) b->byte_id[byte] = i;
        if (!(b->dec[i] = decode_token(b, s, &b->dec_len[i])))
            return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    }
    return KV_OK;
}

/* Stage 3: (left id, right id) -> rank, and the id each merge makes; every part must be in the
 * vocabulary. The first rank of a pair wins. */
static int bpe_read_merges(const kv_bpe_spec *sp, const char *what, bpe_impl *b, kv_error *err) {
    char *cat = NULL;
    size_t cat_cap = 0;
    int rc = KV_OK;
    for (int r = 0; r < sp->n_merges && !rc; r++) {
        const char *l = sp->merge_left[r], *rt = sp->merge_right[r];
        size_t ll = strlen(l), rl = strlen(rt);
        int li = kv_strmap_get(&b->vocab, l, ll), ri = kv_strmap_get(&b->vocab, rt, rl);
        if (ll + rl + 1 > cat_cap) {
            cat_cap = 2 * (ll + rl + 1);
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                rc = kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
                break;
            }
            cat = nc;
        }
        memcpy(cat, l, ll);
        memcpy(cat + ll, rt, rl);
        int m = kv_strmap_get(&b->vocab, cat, ll + rl);
        if (li < 0 || ri < 0 || m < 0) {
            rc = kv_fail(err, KV_EINPUT,
                         "%s: merges[%d] = \"%.40s %.40s\" names a token that is "
                         "not in the vocabulary (%s)",
                         what, r, l, rt,
                         li < 0   ? "left part"
                         : ri < 0 ? "right part"
                                  : "merged result");
            break;
        }
        int key[2] = {li, ri};
        if (kv_strmap_get(&b->merges, (const char *)key, sizeof key) >= 0) continue;
        if (kv_strmap_put(&b->merges, (const char *)key, sizeof key, r))
            rc = kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
        b->merge_new[r] = m;
    }
    free(cat);
    return rc;
}

/* Stage 4: added tokens decode to their content as written; silent ids (the spec's, BOS, EOS)
 * decode to nothing. */
static int bpe_read_special(const kv_bpe_spec *sp, bpe_impl *b, kv_error *err) {
    for (int k = 0; k < sp->n_special; k++) {
        int id = sp->special[k];
        if (id < 0 || id >= b->n || !sp->tokens[id] || !sp->tokens[id][0] || !b->dec[id]) continue;
        size_t l = strlen(sp->tokens[id]);
        free(b->dec[id]);
        b->dec[id] = malloc(l + 1);
        if (!b->dec[id]) return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
        memcpy(b->dec[id], sp->tokens[id], l + 1);
        b->dec_len[id] = (int)l;
    }
    for (int k = 0; sp->silent && k < b->n; k++) b->silent[k] = sp->silent[k];
    if (sp->bos_id >= 0 && sp->bos_id < b->n) b->silent[sp->bos_id] = 1;
    if (sp->eos_id >= 0 && sp->eos_id < b->n) b->silent[sp->eos_id] = 1;
    return KV_OK;
}

/* Stage 5: the pre-tokenizer regexes compiled with PCRE2 (JIT where available). */
static int bpe_compile_regexes(const kv_bpe_spec *sp, const char *what, bpe_impl *b,
                               kv_error *err) {
    const char *const *res = sp->regex ? &sp->regex : sp->regexes;
    int n_res = sp->regex ? 1 : sp->n_regexes;
    if (n_res > KV_BPE_MAX_REGEX)
        return kv_fail(err, KV_EINTERNAL, "%s: %d pre-tokenizer regexes, at most %d", what, n_res,
                       KV_BPE_MAX_REGEX);
    for (int r = 0; r < n_res; r++) {
        int ec;
        PCRE2_SIZE eo;
        /* DOLLAR_ENDONLY: '$' is the end of the piece only, as in ECMAScript (llama.cpp) */
        b->re[r] = pcre2_compile((PCRE2_SPTR)res[r], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!b->re[r]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return kv_fail(err, KV_EINPUT,
                           "%s: pre-tokenizer regex %d does not compile at offset %zu: %s", what,
                           r + 1, (size_t)eo, (const char *)msg);
        }
        b->n_re++;
        pcre2_jit_compile(b->re[r], PCRE2_JIT_COMPLETE); /* optional speed-up */
    }
    return KV_OK;
}

/* Stage 6: the special tokens' texts for the splitter in front of BPE. */
static int bpe_set_special(const kv_bpe_spec *sp, const bpe_impl *b, kv_tokenizer *t,
                           kv_error *err) {
    const char **texts = calloc((size_t)sp->n_special + 1, sizeof *texts);
    if (!texts) return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    for (int k = 0; k < sp->n_special; k++) {
        int id = sp->special[k];
        texts[k] = id >= 0 && id < b->n ? sp->tokens[id] : NULL;
    }
    int rc = kv_tokenizer_set_special(t, sp->special, texts, sp->special_control, sp->n_special,
                                      sp->special_order, err);
    free(texts);
    return rc;
}

int kv_tokenizer_bpe_new(const kv_bpe_spec *sp, const char *what, kv_tokenizer **out,
                         kv_error *err) {
    *out = NULL;
    if (sp->n_vocab <= 0)
        return kv_fail(err, KV_EINPUT, "%s: the tokenizer vocabulary is empty", what);
    bpe_impl *b = kv_calloc(1, sizeof *b, "tokenizer", err);
    kv_tokenizer *t = kv_calloc(1, sizeof *t, "tokenizer", err);
    if (!b || !t) {
        free(b);
        free(t);
        return KV_EINTERNAL;
    }
    int rc = bpe_alloc(sp, b, err);
    if (!rc) rc = bpe_read_vocab(sp, b, err);
    if (!rc) rc = bpe_read_merges(sp, what, b, err);
    if (!rc) rc = bpe_read_special(sp, b, err);
    if (!rc) rc = bpe_compile_regexes(sp, what, b, err);
    if (!rc) rc = bpe_set_special(sp, b, t, err);
    if (rc) {
        bpe_free(b);
        for (int k = 0; k < t->n_special; k++) free(t->special[k].text);
        free(t->special);
        free(t);
        return rc;
    }
    t->kind = KV_TOK_BPE;
    t->vocab_size = b->n;
    t->bos_id = sp->bos_id < b->n ? sp->bos_id : -1;
    t->eos_id = sp->eos_id < b->n ? sp->eos_id : -1;
    t->add_bos = sp->add_bos;
    t->ops = &bpe_ops;
    t->impl = b;
    *out = t;
    return KV_OK;
}

/* ---- tokenizer.json ---- */

static int parse_json_file(const char *path, cJSON **out, kv_error *err) {
    *out = NULL;
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(path, &data, &len, err);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    if (!j) {
        size_t at = end && end >= data ? (size_t)(end - data) : 0;
        size_t line = 1;
        for (size_t i = 0; i < at && i < len; i++) line += data[i] == '\n';
        free(data);
        return kv_fail(err, KV_EINPUT, "%s: invalid JSON at byte %zu (line %zu)", path, at, line);
    }
    free(data);
    *out = j;
    return KV_OK;
}

/* The content of a special-token field: a string or {"content": string}. */
static const char *token_content(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

typedef struct json_style {
    int bytelevel, add_prefix_space, prepend, replace_space, metaspace_split;
    const char *regex;
} json_style;

static int read_normalizer(const char *path, const cJSON *n, json_style *st, kv_error *err) {
    if (!n || cJSON_IsNull(n)) return KV_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    if (!cJSON_IsString(type))
        return kv_fail(err, KV_EINPUT, "%s: normalizer has no \"type\" string", path);
    const char *t = type->valuestring;
    if (!strcmp(t, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
        if (!cJSON_IsArray(list))
            return kv_fail(err, KV_EINPUT, "%s: normalizer.normalizers is not an array", path);
        cJSON_ArrayForEach(it, list) if (read_normalizer(path, it, st, err)) return KV_EINPUT;
        return KV_OK;
    }
    if (!strcmp(t, "Prepend")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(n, "prepend");
        if (!cJSON_IsString(p) || strcmp(p->valuestring, "\xe2\x96\x81"))
            return kv_fail(err, KV_EINPUT,
                           "%s: normalizer Prepend.prepend must be \"\xe2\x96\x81\"", path);
        st->prepend = 1;
        return KV_OK;
    }
    if (!strcmp(t, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(n, "content");
        if (!cJSON_IsString(s) || strcmp(s->valuestring, " ") || !cJSON_IsString(c) ||
            strcmp(c->valuestring, "\xe2\x96\x81"))
            return kv_fail(err, KV_EINPUT,
                           "%s: normalizer Replace is only supported for "
                           "pattern.String \" \" -> content \"\xe2\x96\x81\"",
                           path);
        st->replace_space = 1;
        return KV_OK;
    }
    if (!strcmp(t, "NFC") || !strcmp(t, "NFKC")) return KV_OK; /* input expected in NFC */
    return kv_fail(err, KV_EINPUT,
                   "%s: normalizer.type \"%s\" is not supported (Prepend, Replace, "
                   "NFC, Sequence)",
                   path, t);
}

static int read_pretok(const char *path, const cJSON *p, json_style *st, kv_error *err) {
    if (!p || cJSON_IsNull(p)) return KV_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type))
        return kv_fail(err, KV_EINPUT, "%s: pre_tokenizer has no \"type\" string", path);
    const char *t = type->valuestring;
    if (!strcmp(t, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *it;
        if (!cJSON_IsArray(list))
            return kv_fail(err, KV_EINPUT, "%s: pre_tokenizer.pretokenizers is not an array", path);
        cJSON_ArrayForEach(it, list) if (read_pretok(path, it, st, err)) return KV_EINPUT;
        return KV_OK;
    }
    if (!strcmp(t, "ByteLevel")) {
        st->bytelevel = 1;
        st->add_prefix_space =
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"));
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!ur || cJSON_IsTrue(ur)) {
            if (st->regex)
                return kv_fail(err, KV_EINPUT,
                               "%s: pre_tokenizer: a Split followed by a ByteLevel "
                               "with use_regex is not supported",
                               path);
            st->regex = KV_BPE_GPT2_REGEX;
        }
        return KV_OK;
    }
    if (!strcmp(t, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(re))
            return kv_fail(err, KV_EINPUT, "%s: pre_tokenizer Split needs pattern.Regex", path);
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
            return kv_fail(err, KV_EINPUT, "%s: pre_tokenizer Split.behavior must be \"Isolated\"",
                           path);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "invert")))
            return kv_fail(err, KV_EINPUT, "%s: pre_tokenizer Split.invert is not supported", path);
        if (st->regex)
            return kv_fail(err, KV_EINPUT, "%s: pre_tokenizer: two regex splits are not supported",
                           path);
        st->regex = re->valuestring;
        return KV_OK;
    }
    if (!strcmp(t, "Metaspace")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "replacement");
        if (r && (!cJSON_IsString(r) || strcmp(r->valuestring, "\xe2\x96\x81")))
            return kv_fail(err, KV_EINPUT,
                           "%s: pre_tokenizer Metaspace.replacement must be "
                           "\"\xe2\x96\x81\"",
                           path);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
        st->replace_space = 1;
        if ((cJSON_IsString(ps) && strcmp(ps->valuestring, "never")) || cJSON_IsTrue(aps))
            st->prepend = 1;
        const cJSON *split = cJSON_GetObjectItemCaseSensitive(p, "split");
        if (!split || cJSON_IsTrue(split)) st->metaspace_split = 1;
        return KV_OK;
    }
    return kv_fail(err, KV_EINPUT,
                   "%s: pre_tokenizer.type \"%s\" is not supported (ByteLevel, "
                   "Split, Metaspace, Sequence)",
                   path, t);
}

/* What tokenizer.json (and tokenizer_config.json beside it) hold, gathered stage by stage by
 * kv_tokenizer_load_json; the strings point into the parsed documents. */
typedef struct json_vocab {
    cJSON *doc, *cfg;        /* tokenizer.json, tokenizer_config.json (NULL when absent) */
    const cJSON *model;      /* doc.model */
    int n;                   /* vocabulary size (the model's when given) */
    const char **tokens;     /* [n] id -> piece (NULL for unused ids) */
    int n_merges, r;         /* merges in the file, merges read */
    char **left, **right;    /* [n_merges] the merge pairs, owned */
    int *special, n_special; /* ids of added_tokens */
    unsigned char *silent;   /* [n] 1 for added tokens marked "special" */
    json_style st;
    int bos, eos, unk, add_bos;
} json_vocab;

/* Stage 1: tokenizer_config.json beside `path`, parsed when present. */
static int read_config(const char *path, json_vocab *v, kv_error *err) {
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s", path);
    char *slash = strrchr(cfg_path, '/');
    if (slash)
        snprintf(slash + 1, sizeof cfg_path - (size_t)(slash + 1 - cfg_path),
                 "tokenizer_config.json");
    else
        snprintf(cfg_path, sizeof cfg_path, "tokenizer_config.json");
    FILE *f = fopen(cfg_path, "rb");
    if (!f) return KV_OK;
    fclose(f);
    return parse_json_file(cfg_path, &v->cfg, err);
}

/* Stage 2: the fields kvplan reads are present with the right JSON types. */
static int check_fields(const char *path, const json_vocab *v, kv_error *err) {
    const cJSON *model = v->model;
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(v->doc, "added_tokens");
    if (!cJSON_IsObject(model))
        return kv_fail(err, KV_EINPUT, "%s: field \"model\" is missing or not an object", path);
    if (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE")))
        return kv_fail(err, KV_EINPUT, "%s: model.type \"%s\" is not supported (kvplan reads BPE)",
                       path, cJSON_IsString(mtype) ? mtype->valuestring : "?");
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(model, "vocab")))
        return kv_fail(err, KV_EINPUT, "%s: field \"model.vocab\" is missing or not an object",
                       path);
    const char *unsup[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(model, unsup[i]);
        if (u && !cJSON_IsNull(u) && !(cJSON_IsString(u) && !u->valuestring[0]))
            return kv_fail(err, KV_EINPUT, "%s: model.%s is set, which kvplan does not support",
                           path, unsup[i]);
    }
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(model, "merges")))
        return kv_fail(err, KV_EINPUT, "%s: field \"model.merges\" is missing or not an array",
                       path);
    if (added && !cJSON_IsArray(added))
        return kv_fail(err, KV_EINPUT, "%s: field \"added_tokens\" is not an array", path);
    return KV_OK;
}

/* A JSON number that is a whole token id in [0, 2^24) (3.5 is not read as 3). */
static int json_id_ok(const cJSON *it) {
    return cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < (1 << 24) &&
           it->valuedouble == floor(it->valuedouble);
}

/* Stage 3: the vocabulary size from the largest id of model.vocab and added_tokens, checked
 * against the model's (ids past the tokenizer's are the model's padding). */
static int count_ids(const char *path, const kv_model *m, json_vocab *v, kv_error *err) {
    const cJSON *it;
    int n = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(v->model, "vocab")) {
        if (!json_id_ok(it))
            return kv_fail(err, KV_EINPUT,
                           "%s: model.vocab[\"%.60s\"] is not a valid id (a whole number in "
                           "[0, 2^24))",
                           path, it->string);
        if (it->valueint + 1 > n) n = it->valueint + 1;
    }
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(v->doc, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!json_id_ok(id) || !cJSON_IsString(c))
            return kv_fail(err, KV_EINPUT,
                           "%s: an added_tokens entry lacks a valid \"id\" or \"content\"", path);
        if (id->valueint + 1 > n) n = id->valueint + 1;
    }
    if (m && n > m->cfg.vocab_size)
        return kv_fail(err, KV_EINPUT,
                       "%s: token ids reach %d but the model %s has a vocabulary "
                       "of %d: they do not belong together",
                       path, n - 1, m->path, m->cfg.vocab_size);
    v->n = m ? m->cfg.vocab_size : n;
    return KV_OK;
}

/* Stage 4: id -> piece for the vocabulary and the added tokens (which are special; those
 * marked "special" are also silent when decoded). */
static int collect_tokens(json_vocab *v, kv_error *err) {
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(v->doc, "added_tokens"), *it;
    v->n_merges = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v->model, "merges"));
    v->tokens = calloc((size_t)v->n + 1, sizeof *v->tokens);
    v->left = calloc((size_t)v->n_merges + 1, sizeof *v->left);
    v->right = calloc((size_t)v->n_merges + 1, sizeof *v->right);
    v->special = calloc((size_t)cJSON_GetArraySize(added) + 1, sizeof *v->special);
    v->silent = calloc((size_t)v->n + 1, 1);
    if (!v->tokens || !v->left || !v->right || !v->special || !v->silent)
        return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer.json)");
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(v->model, "vocab"))
        v->tokens[it->valueint] = it->string;
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        v->tokens[id] = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        v->special[v->n_special++] = id;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"))) v->silent[id] = 1;
    }
    return KV_OK;
}

/* Stage 5: model.merges, each "a b" or ["a", "b"], copied into left/right. */
static int read_merges(const char *path, json_vocab *v, kv_error *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(v->model, "merges")) {
        int r = v->r;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring, *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
                return kv_fail(err, KV_EINPUT,
                               "%s: model.merges[%d] = \"%.60s\" is not two "
                               "tokens separated by one space",
                               path, r, s);
            v->left[r] = strndup(s, (size_t)(sp - s));
            v->right[r] = strdup(sp + 1);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            v->left[r] = strdup(cJSON_GetArrayItem(it, 0)->valuestring);
            v->right[r] = strdup(cJSON_GetArrayItem(it, 1)->valuestring);
        } else {
            return kv_fail(err, KV_EINPUT,
                           "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path, r);
        }
        v->r++;
        if (!v->left[r] || !v->right[r])
            return kv_fail(err, KV_EINTERNAL, "out of memory (merges)");
    }
    return KV_OK;
}

/* Stage 6: the pre-tokenisation style from the normalizer and pre_tokenizer. */
static int read_style(const char *path, json_vocab *v, kv_error *err) {
    json_style *st = &v->st;
    int rc = read_normalizer(path, cJSON_GetObjectItemCaseSensitive(v->doc, "normalizer"), st, err);
    if (!rc)
        rc = read_pretok(path, cJSON_GetObjectItemCaseSensitive(v->doc, "pre_tokenizer"), st, err);
    if (!rc && st->bytelevel && (st->prepend || st->replace_space))
        rc = kv_fail(err, KV_EINPUT,
                     "%s: a ByteLevel pre_tokenizer combined with a \"\xe2\x96\x81\" "
                     "normaliser is not supported",
                     path);
    if (!rc && !st->bytelevel && st->prepend != st->replace_space && st->prepend)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: normalizer prepends \"\xe2\x96\x81\" but does not "
                     "replace spaces, which kvplan does not support",
                     path);
    return rc;
}

/* Stage 7: BOS, EOS and UNK ids (tokenizer_config.json's bos_token/eos_token, model.unk_token;
 * the model's ids otherwise) and whether a BOS is added (add_bos_token, else a post_processor
 * template that starts with the BOS). */
static void read_special_ids(const kv_model *m, json_vocab *v) {
    v->bos = m ? m->cfg.bos_id : -1, v->eos = m ? m->cfg.eos_id : -1;
    v->add_bos = -1, v->unk = -1;
    const cJSON *unk_tok = cJSON_GetObjectItemCaseSensitive(v->model, "unk_token");
    const char *bt =
        v->cfg ? token_content(cJSON_GetObjectItemCaseSensitive(v->cfg, "bos_token")) : NULL;
    const char *et =
        v->cfg ? token_content(cJSON_GetObjectItemCaseSensitive(v->cfg, "eos_token")) : NULL;
    for (int i = 0; i < v->n; i++) {
        const char *t = v->tokens[i];
        if (!t) continue;
        if (bt && !strcmp(bt, t)) v->bos = i;
        if (et && !strcmp(et, t)) v->eos = i;
        if (cJSON_IsString(unk_tok) && !strcmp(unk_tok->valuestring, t) && v->unk < 0) v->unk = i;
    }
    if (v->cfg) {
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(v->cfg, "add_bos_token");
        if (cJSON_IsBool(ab)) v->add_bos = cJSON_IsTrue(ab);
    }
    if (v->add_bos >= 0) return;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(v->doc, "post_processor");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *stok =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, 0), "SpecialToken");
    const cJSON *sid = cJSON_GetObjectItemCaseSensitive(stok, "id");
    v->add_bos = 0;
    for (int i = 0; cJSON_IsString(sid) && i < v->n && !v->add_bos; i++)
        if (v->tokens[i] && !strcmp(sid->valuestring, v->tokens[i]) &&
            (v->bos < 0 || v->bos == i)) {
            v->bos = i; /* the template's leading special token is the BOS */
            v->add_bos = 1;
        }
}

/* Stage 8: the BPE tokenizer from what was gathered. */
static int build_tokenizer(const char *path, const json_vocab *v, kv_tokenizer **out,
                           kv_error *err) {
    const cJSON *model = v->model;
    kv_bpe_spec s;
    memset(&s, 0, sizeof s);
    s.n_vocab = v->n;
    s.tokens = v->tokens;
    s.n_merges = v->r;
    s.merge_left = (const char *const *)v->left;
    s.merge_right = (const char *const *)v->right;
    s.style = v->st.bytelevel ? KV_BPE_BYTELEVEL : KV_BPE_SPM;
    s.regex = v->st.metaspace_split ? "\xe2\x96\x81[^\xe2\x96\x81]*|[^\xe2\x96\x81]+" : v->st.regex;
    s.add_prefix_space = v->st.add_prefix_space;
    s.prepend_space = v->st.prepend;
    s.replace_space = v->st.replace_space;
    s.byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    s.unk_id = v->unk;
    s.fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    s.ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    s.special = v->special;
    s.n_special = v->n_special;
    s.silent = v->silent;
    s.bos_id = v->bos;
    s.eos_id = v->eos;
    s.add_bos = v->add_bos > 0;
    return kv_tokenizer_bpe_new(&s, path, out, err);
}

static void json_vocab_free(json_vocab *v) {
    for (int i = 0; i < v->n_merges && v->left && v->right; i++) {
        free(v->left[i]);
        free(v->right[i]);
    }
    free(v->left);
    free(v->right);
    free(v->tokens);
    free(v->special);
    free(v->silent);
    cJSON_Delete(v->doc);
    cJSON_Delete(v->cfg);
}

/* tokenizer_config.json's chat_template, kept on t: a string, or a list of {name, template}
 * objects (the one named "default"). A value of any other shape is ignored (no template). */
static int json_chat_template(const json_vocab *v, kv_tokenizer *t, kv_error *err) {
    const cJSON *ct = v->cfg ? cJSON_GetObjectItemCaseSensitive(v->cfg, "chat_template") : NULL;
    if (cJSON_IsArray(ct)) {
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))
                pick = cJSON_GetObjectItemCaseSensitive(it, "template");
        }
        ct = pick;
    }
    if (!cJSON_IsString(ct)) return KV_OK;
    return kv_tokenizer_set_chat_template(t, ct->valuestring, strlen(ct->valuestring), err);
}

int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    json_vocab v = {0};
    int rc = parse_json_file(path, &v.doc, err);
    if (rc) return rc;
    v.model = cJSON_GetObjectItemCaseSensitive(v.doc, "model");
    rc = read_config(path, &v, err);
    if (!rc) rc = check_fields(path, &v, err);
    if (!rc) rc = count_ids(path, m, &v, err);
    if (!rc) rc = collect_tokens(&v, err);
    if (!rc) rc = read_merges(path, &v, err);
    if (!rc) rc = read_style(path, &v, err);
    if (!rc) read_special_ids(m, &v);
    if (!rc) rc = build_tokenizer(path, &v, out, err);
    if (!rc) rc = json_chat_template(&v, *out, err);
    if (rc) {
        kv_tokenizer_free(*out);
        *out = NULL;
    }
    json_vocab_free(&v);
    return rc;
}
