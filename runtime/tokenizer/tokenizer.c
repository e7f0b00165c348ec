/* kvplan tokenizer front end (format detection, special tokens, BOS) and the scored-piece
 * (SentencePiece-style) BPE tokenizer of llama2.c `tokenizer.bin` files and GGUF "llama"
 * vocabularies.
 *
 * Scored-piece encoding, as llama.cpp's llm_tokenizer_spm (src/llama-vocab.cpp; the algorithm
 * of SentencePiece's BPE model, and of llama2.c run.c `encode`) made O(n log n) with a heap:
 * prepend " " to the fragment (the dummy prefix, when add_space_prefix), split it into UTF-8
 * code points, then repeatedly merge the adjacent pair whose concatenation is a piece with the
 * highest score, leftmost first on ties, until no pair merges. Symbols are spans of the text,
 * so a pair's concatenation is the span they cover. A final symbol that is not a piece (a code
 * point outside the vocabulary) becomes its bytes <0xXX>. The heap gives exactly the naive
 * loop's result: it orders candidates by (score desc, position asc) and drops stale entries.
 */
#include "kvplan/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf_meta.h"
#include "util/strmap.h"
#include "tokenizer/tokenizer_bpe.h"

typedef struct spm_impl {
    int n;
    char **pieces; /* [n] NUL-terminated, owned */
    int *lens;     /* [n] */
    float *scores; /* [n] */
    kv_strmap map;
    int byte_id[256];      /* id of "<0xXX>" or -1 */
    int has_bytes;         /* the vocabulary has at least one "<0xXX>" piece */
    int add_space_prefix;  /* prepend " " to every fragment (SentencePiece dummy prefix) */
    int max_len;           /* the longest piece, bytes */
    unsigned char *silent; /* [n] 1 = decodes to no text (control, unknown), or NULL */
} spm_impl;

static void spm_free(void *p) {
    spm_impl *s = p;
    if (!s) return;
    if (s->pieces)
        for (int i = 0; i < s->n; i++) free(s->pieces[i]);
    free(s->pieces);
    free(s->lens);
    free(s->scores);
    free(s->silent);
    kv_strmap_free(&s->map);
    free(s);
}

int kv_tok_push_id(int **ids, int *n, int *cap, int id, kv_error *err) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        int *nw = realloc(*ids, (size_t)nc * sizeof *nw);
        if (!nw) return kv_fail(err, KV_EINTERNAL, "out of memory (token ids)");
        *ids = nw;
        *cap = nc;
    }
    (*ids)[(*n)++] = id;
    return KV_OK;
}

/* A symbol is the span [off, off + len) of the fragment; len 0 once merged into its left. */
typedef struct sym {
    size_t off, len;
    int prev, next;
} sym;

typedef struct cand {
    float score;
    int left, right; /* symbol indices */
    size_t size;     /* bytes covered when pushed (stale check, as llama.cpp) */
} cand;

static int cand_before(const cand *a, const cand *b) {
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

typedef struct heap {
    cand *v;
    int n, cap;
} heap;

static int heap_push(heap *h, cand c) {
    if (h->n == h->cap) {
        int nc = h->cap ? 2 * h->cap : 1024;
        cand *nv = realloc(h->v, (size_t)nc * sizeof *nv);
        if (!nv) return -1;
        h->v = nv;
        h->cap = nc;
    }
    int i = h->n++;
    h->v[i] = c;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_before(&h->v[i], &h->v[p])) break;
        cand t = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = t;
        i = p;
    }
    return 0;
}

static cand heap_pop(heap *h) {
    cand top = h->v[0];
    h->v[0] = h->v[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, b = i;
        if (l < h->n && cand_before(&h->v[l], &h->v[b])) b = l;
        if (r < h->n && cand_before(&h->v[r], &h->v[b])) b = r;
        if (b == i) break;
        cand t = h->v[i];
        h->v[i] = h->v[b];
        h->v[b] = t;
        i = b;
    }
    return top;
}

/* Push the pair (left, its next) when the text it covers is a piece. */
static int try_pair(const spm_impl *s, heap *h, const sym *syms, const char *text, int left) {
    if (left < 0) return 0;
    int right = syms[left].next;
    if (right < 0) return 0;
    size_t size = syms[left].len + syms[right].len;
    int m = kv_strmap_get(&s->map, text + syms[left].off, size);
    if (m < 0) return 0;
    cand c = {s->scores[m], left, right, size};
    return heap_push(h, c);
}

/* The id of byte b: its <0xXX> piece; llama2.c's fixed offset b + 3 when the vocabulary has
 * byte pieces but not this one; piece 0 (<unk>) when it has none at all (e.g. the
 * TinyStories-656K GGUF files), as llama.cpp. -1 when the id would be out of range. */
static int byte_token(const spm_impl *s, unsigned char b) {
    int id = s->byte_id[b];
    if (id < 0) id = s->has_bytes ? b + 3 : 0;
    return id < s->n ? id : -1;
}

/* Encode the span text [0, len) on its own (the merge loop of the file comment). */
static int spm_encode_span(const spm_impl *s, const char *text, size_t len, int **ids, int *n,
                           int *cap, kv_error *err) {
    sym *syms = malloc(len * sizeof *syms);
    heap h = {0};
    if (!syms) return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    int ns = 0;
    for (size_t i = 0; i < len;) { /* code points (a bad lead byte is one symbol) */
        unsigned char c = (unsigned char)text[i];
        size_t cl = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (cl > len - i) cl = len - i;
        syms[ns].off = i;
        syms[ns].len = cl;
        syms[ns].prev = ns - 1;
        syms[ns].next = i + cl < len ? ns + 1 : -1;
        ns++;
        i += cl;
    }
    int rc = KV_OK;
    for (int i = 0; i < ns && rc == KV_OK; i++)
        if (try_pair(s, &h, syms, text, i) != 0) rc = KV_EINTERNAL;
    while (rc == KV_OK && h.n > 0) {
        cand c = heap_pop(&h);
        sym *l = &syms[c.left], *r = &syms[c.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != c.size)
            continue; /* stale: a neighbour merged since this pair was pushed */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) syms[l->next].prev = c.left;
        if (try_pair(s, &h, syms, text, l->prev) != 0 || try_pair(s, &h, syms, text, c.left) != 0)
            rc = KV_EINTERNAL;
    }
    if (rc) kv_fail(err, rc, "out of memory (tokenizer merges)");
    for (int i = 0; rc == KV_OK && i >= 0; i = syms[i].next) {
        int id = kv_strmap_get(&s->map, text + syms[i].off, syms[i].len);
        if (id >= 0) {
            rc = kv_tok_push_id(ids, n, cap, id, err);
            continue;
        }
        for (size_t k = 0; k < syms[i].len && rc == KV_OK; k++) {
            unsigned char b = (unsigned char)text[syms[i].off + k];
            int bid = byte_token(s, b);
            if (bid < 0)
                rc = kv_fail(err, KV_EINPUT,
                             "tokenizer has no piece and no byte fallback for byte 0x%02x", b);
            else
                rc = kv_tok_push_id(ids, n, cap, bid, err);
        }
    }
    free(h.v);
    free(syms);
    return rc;
}

/* Whether no piece of the vocabulary spans the boundary before byte i of text [0, len): no
 * substring [a, b) with a < i < b and b - a <= the longest piece is a piece. Then no symbol
 * ever crosses it (every merged symbol is a piece), and the two sides encode independently to
 * the same ids as the whole. i must start a code point. */
static int spm_cut_ok(const spm_impl *s, const char *text, size_t len, size_t i) {
    if (((unsigned char)text[i] & 0xC0) == 0x80) return 0;
    size_t m = (size_t)s->max_len;
    for (size_t w = 2; w <= m; w++) /* short spans first: they are the likely pieces */
        for (size_t a = i >= w - 1 ? i - (w - 1) : 0; a < i && a + w <= len; a++)
            if (kv_strmap_get(&s->map, text + a, w) >= 0) return 0;
    return 1;
}

/* Spans of about this many bytes bound the encoder's memory (symbols and heap, ~40 bytes per
 * byte of text) on long texts; the ids equal one pass over the whole fragment. A span ends at
 * the first safe cut in [SPM_SPAN, 2 SPM_SPAN) bytes; without one the rest is one span. */
enum { SPM_SPAN = 1 << 16 };

static int spm_encode(const kv_tokenizer *t, const char *frag, size_t flen, int **ids, int *n,
                      int *cap, kv_error *err) {
    const spm_impl *s = t->impl;
    if (flen == 0) return KV_OK;
    size_t pre = s->add_space_prefix ? 1 : 0, len = flen + pre;
    char *text = malloc(len);
    if (!text) return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    if (pre) text[0] = ' ';
    memcpy(text + pre, frag, flen);
    int rc = KV_OK;
    for (size_t a = 0; a < len && rc == KV_OK;) {
        size_t b = a + SPM_SPAN;
        while (b < len && b < a + 2 * (size_t)SPM_SPAN && !spm_cut_ok(s, text, len, b)) b++;
        if (b >= len || b == a + 2 * (size_t)SPM_SPAN) b = len;
        rc = spm_encode_span(s, text + a, b - a, ids, n, cap, err);
        a = b;
    }
    free(text);
    return rc;
}

static int spm_piece(const kv_tokenizer *t, int prev_id, int id, char *out, int cap) {
    const spm_impl *s = t->impl;
    if (cap <= 0) return 0;
    out[0] = '\0';
    if (id < 0 || id >= s->n || id == t->bos_id || id == t->eos_id) return 0;
    if (s->silent && s->silent[id]) return 0;
    const char *p = s->pieces[id];
    int len = s->lens[id];
    if (prev_id == t->bos_id && len > 0 && p[0] == ' ') {
        p++;
        len--;
    }
    unsigned int byte;
    if (len == 6 && sscanf(p, "<0x%02X>", &byte) == 1) {
        out[0] = (char)byte;
        if (cap > 1) out[1] = '\0';
        return 1;
    }
    if (len > cap - 1) len = cap - 1;
    memcpy(out, p, (size_t)len);
    out[len] = '\0';
    return len;
}

static const kv_tokenizer_ops spm_ops = {spm_encode, spm_piece, spm_free};

int kv_tokenizer_from_scored(const char *const *pieces, const float *scores, int n, int bos_id,
                             int eos_id, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    spm_impl *s = kv_calloc(1, sizeof *s, "tokenizer", err);
    kv_tokenizer *t = kv_calloc(1, sizeof *t, "tokenizer", err);
    if (!s || !t) {
        free(s);
        free(t);
        return KV_EINTERNAL;
    }
    s->n = n;
    s->pieces = calloc((size_t)n, sizeof *s->pieces);
    s->lens = calloc((size_t)n, sizeof *s->lens);
    s->scores = calloc((size_t)n, sizeof *s->scores);
    if (!s->pieces || !s->lens || !s->scores || kv_strmap_init(&s->map, (size_t)n) != 0) {
        spm_free(s);
        free(t);
        return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    }
    for (int b = 0; b < 256; b++) s->byte_id[b] = -1;
    s->add_space_prefix = 1;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(pieces[i]);
        s->pieces[i] = malloc(len + 1);
        if (!s->pieces[i]) {
            spm_free(s);
            free(t);
            return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
        }
        memcpy(s->pieces[i], pieces[i], len + 1);
        s->lens[i] = (int)len;
        if ((int)len > s->max_len) s->max_len = (int)len;
        s->scores[i] = scores[i];
        unsigned int byte;
        if (len == 6 && sscanf(pieces[i], "<0x%02X>", &byte) == 1 && byte < 256)
            s->byte_id[byte] = i, s->has_bytes = 1;
        /* first occurrence wins, as llama2.c's sorted lookup finds one of equal strings */
        if (kv_strmap_get(&s->map, pieces[i], len) < 0 &&
            kv_strmap_put(&s->map, pieces[i], len, i) != 0) {
            spm_free(s);
            free(t);
            return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
        }
    }
    t->kind = KV_TOK_SPM;
    t->vocab_size = n;
    t->bos_id = bos_id;
    t->eos_id = eos_id;
    t->add_bos = 1;
    t->ops = &spm_ops;
    t->impl = s;
    *out = t;
    return KV_OK;
}

int kv_tokenizer_load_llama2c(const char *path, int vocab_size, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    char *data = NULL;
    size_t len = 0;
    int rc = kv_read_file(path, &data, &len, err);
    if (rc) return rc;
    if (vocab_size <= 0) { /* no model to say how many: count the pieces up to the end */
        vocab_size = 0;
        for (size_t off = 4; off + 8 <= len && vocab_size < (1 << 22); vocab_size++) {
            int32_t plen;
            memcpy(&plen, data + off + 4, 4);
            if (plen < 0 || (size_t)plen > len - off - 8) break;
            off += 8 + (size_t)plen;
        }
        if (vocab_size == 0) {
            free(data);
            return kv_fail(err, KV_EINPUT, "%s: not a llama2.c tokenizer.bin (no pieces)", path);
        }
    }
    char **pieces = calloc((size_t)vocab_size, sizeof *pieces);
    float *scores = calloc((size_t)vocab_size, sizeof *scores);
    if (!pieces || !scores) {
        free(pieces);
        free(scores);
        free(data);
        return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    }
    size_t off = 4;
    int32_t maxlen = 0;
    if (len < 4)
        rc = kv_fail(err, KV_EINPUT, "%s: too short for a llama2.c tokenizer", path);
    else
        memcpy(&maxlen, data, 4);
    if (!rc && (maxlen <= 0 || maxlen > 4096))
        rc = kv_fail(err, KV_EINPUT,
                     "%s: max_token_length %d is not sensible; not a llama2.c "
                     "tokenizer.bin",
                     path, maxlen);
    for (int i = 0; i < vocab_size && !rc; i++) {
        int32_t plen;
        if (off + 8 > len) {
            rc = kv_fail(err, KV_EINPUT,
                         "%s: ends after %d of %d pieces: truncated, or made for a model with a "
                         "smaller vocabulary",
                         path, i, vocab_size);
            break;
        }
        memcpy(&scores[i], data + off, 4);
        memcpy(&plen, data + off + 4, 4);
        off += 8;
        if (plen < 0 || plen > maxlen || off + (size_t)plen > len) {
            rc = kv_fail(err, KV_EINPUT, "%s: piece %d has a bad length %d (truncated or corrupt)",
                         path, i, plen);
            break;
        }
        pieces[i] = malloc((size_t)plen + 1);
        if (!pieces[i]) {
            rc = kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
            break;
        }
        memcpy(pieces[i], data + off, (size_t)plen);
        pieces[i][plen] = '\0';
        off += (size_t)plen;
    }
    if (!rc && off != len)
        rc = kv_fail(err, KV_EINPUT,
                     "%s: %zu bytes remain after %d pieces: the tokenizer has a larger vocabulary "
                     "than the model (%d)",
                     path, len - off, vocab_size, vocab_size);
    if (!rc)
        rc = kv_tokenizer_from_scored((const char *const *)pieces, scores, vocab_size, 1, 2, out,
                                      err);
    for (int i = 0; i < vocab_size; i++) free(pieces[i]);
    free(pieces);
    free(scores);
    free(data);
    return rc;
}

void kv_tokenizer_free(kv_tokenizer *t) {
    if (!t) return;
    if (t->ops && t->ops->free_impl) t->ops->free_impl(t->impl);
    for (int k = 0; k < t->n_special; k++) free(t->special[k].text);
    free(t->special);
    free(t->chat_template);
    free(t);
}

const char *kv_tokenizer_chat_template(const kv_tokenizer *t) {
    return t ? t->chat_template : NULL;
}

int kv_tokenizer_set_chat_template(kv_tokenizer *t, const char *jinja, size_t n, kv_error *err) {
    char *c = kv_malloc(n + 1, "chat template", err);
    if (!c) return KV_EINTERNAL;
    memcpy(c, jinja, n);
    c[n] = '\0';
    free(t->chat_template);
    t->chat_template = c;
    return KV_OK;
}

int kv_spm_configure(kv_tokenizer *t, int add_space_prefix, const unsigned char *silent,
                     kv_error *err) {
    if (t->kind != KV_TOK_SPM) return kv_fail(err, KV_EINTERNAL, "not a scored-piece tokenizer");
    spm_impl *s = t->impl;
    s->add_space_prefix = add_space_prefix != 0;
    if (silent) {
        if (!s->silent && !(s->silent = kv_malloc((size_t)s->n, "tokenizer", err)))
            return KV_EINTERNAL;
        memcpy(s->silent, silent, (size_t)s->n);
    }
    return KV_OK;
}

int kv_tokenizer_set_special(kv_tokenizer *t, const int *ids, const char *const *texts,
                             const unsigned char *control, int n, kv_special_order order,
                             kv_error *err) {
    for (int k = 0; k < t->n_special; k++) free(t->special[k].text);
    free(t->special);
    t->special = NULL;
    t->n_special = 0;
    t->special_order = order;
    if (n <= 0) return KV_OK;
    t->special = kv_calloc((size_t)n, sizeof *t->special, "special tokens", err);
    if (!t->special) return KV_EINTERNAL;
    for (int k = 0; k < n; k++) {
        if (!texts[k] || !texts[k][0] || ids[k] < 0) continue;
        kv_tok_special *sp = &t->special[t->n_special];
        size_t l = strlen(texts[k]);
        if (!(sp->text = kv_malloc(l + 1, "special tokens", err))) return KV_EINTERNAL;
        memcpy(sp->text, texts[k], l + 1);
        sp->len = (int)l;
        sp->id = ids[k];
        sp->control = control ? control[k] != 0 : 0;
        t->n_special++;
    }
    return KV_OK;
}

/* The text split at special tokens: fragments [off, off + len) of text (id -1) or a special
 * token id (len 0). */
typedef struct frag {
    size_t off, len;
    int id;
} frag;

typedef struct frags {
    frag *v;
    int n, cap;
} frags;

static int frag_push(frags *f, size_t off, size_t len, int id) {
    if (f->n == f->cap) {
        int nc = f->cap ? 2 * f->cap : 16;
        frag *nv = realloc(f->v, (size_t)nc * sizeof *nv);
        if (!nv) return -1;
        f->v = nv;
        f->cap = nc;
    }
    f->v[f->n++] = (frag){off, len, id};
    return 0;
}

/* First occurrence of sp in text[from, end), or SIZE_MAX. */
static size_t find_at(const char *text, size_t from, size_t end, const kv_tok_special *sp) {
    size_t sl = (size_t)sp->len;
    for (size_t i = from; i + sl <= end;) {
        const char *c = memchr(text + i, sp->text[0], end - sl + 1 - i);
        if (!c) break;
        size_t at = (size_t)(c - text);
        if (memcmp(c, sp->text, sl) == 0) return at;
        i = at + 1;
    }
    return SIZE_MAX;
}

static int by_length_desc(const void *a, const void *b) {
    const kv_tok_special *x = *(const kv_tok_special *const *)a,
                         *y = *(const kv_tok_special *const *)b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* llama.cpp tokenizer_st_partition: for each special token, longest first, cut every
 * occurrence out of every text fragment. */
static int split_longest_first(const kv_tokenizer *t, const char *text, size_t len,
                               int parse_special, frags *out) {
    const kv_tok_special **order = malloc((size_t)t->n_special * sizeof *order);
    if (!order) return -1;
    int m = 0;
    for (int k = 0; k < t->n_special; k++)
        if (parse_special || !t->special[k].control) order[m++] = &t->special[k];
    qsort(order, (size_t)m, sizeof *order, by_length_desc);
    frags cur = {0}, nxt = {0};
    int bad = frag_push(&cur, 0, len, -1);
    for (int k = 0; k < m && !bad; k++) {
        nxt.n = 0;
        for (int i = 0; i < cur.n && !bad; i++) {
            frag f = cur.v[i];
            if (f.id >= 0) {
                bad = frag_push(&nxt, f.off, f.len, f.id);
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            for (;;) {
                size_t at = find_at(text, pos, end, order[k]);
                if (at == SIZE_MAX) break;
                if (at > pos) bad |= frag_push(&nxt, pos, at - pos, -1);
                bad |= frag_push(&nxt, at, 0, order[k]->id);
                pos = at + (size_t)order[k]->len;
            }
            if (pos < end) bad |= frag_push(&nxt, pos, end - pos, -1);
        }
        frags tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    free(nxt.v);
    free(order);
    *out = cur;
    return bad ? -1 : 0;
}

/* Hugging Face tokenizers: the leftmost occurrence of any special token, the longest there. */
static int split_leftmost(const kv_tokenizer *t, const char *text, size_t len, int parse_special,
                          frags *out) {
    frags f = {0};
    size_t *next = malloc((size_t)t->n_special * sizeof *next);
    unsigned char *searched = calloc((size_t)t->n_special, 1);
    if (!next || !searched) {
        free(next);
        free(searched);
        return -1;
    }
    int bad = 0;
    size_t pos = 0;
    while (pos < len && !bad) {
        /* next[k]: token k's first occurrence at or after its last search start (SIZE_MAX =
         * none), so the text is scanned about once per special token */
        size_t best = len;
        int best_k = -1;
        for (int k = 0; k < t->n_special; k++) {
            if (!parse_special && t->special[k].control) continue;
            if (!searched[k] || (next[k] != SIZE_MAX && next[k] < pos)) {
                next[k] = find_at(text, pos, len, &t->special[k]);
                searched[k] = 1;
            }
            size_t at = next[k];
            if (at == SIZE_MAX) continue;
            if (at < best ||
                (at == best && best_k >= 0 && t->special[k].len > t->special[best_k].len)) {
                best = at;
                best_k = k;
            }
        }
        if (best > pos) bad |= frag_push(&f, pos, best - pos, -1);
        if (best_k >= 0) {
            bad |= frag_push(&f, best, 0, t->special[best_k].id);
            pos = best + (size_t)t->special[best_k].len;
        } else {
            pos = best;
        }
    }
    free(next);
    free(searched);
    *out = f;
    return bad ? -1 : 0;
}

int kv_tokenizer_encode_ex(const kv_tokenizer *t, const char *text, size_t len, int add_bos,
                           int parse_special, int **ids, int *n, kv_error *err) {
    *ids = NULL;
    *n = 0;
    int cap = 0;
    if (add_bos < 0) add_bos = t->add_bos;
    int rc = KV_OK;
    if (add_bos && t->bos_id >= 0) rc = kv_tok_push_id(ids, n, &cap, t->bos_id, err);
    frags f = {0};
    if (!rc && len > 0) {
        int bad;
        if (t->n_special == 0)
            bad = frag_push(&f, 0, len, -1);
        else if (t->special_order == KV_SPECIAL_LONGEST_FIRST)
            bad = split_longest_first(t, text, len, parse_special, &f);
        else
            bad = split_leftmost(t, text, len, parse_special, &f);
        if (bad) rc = kv_fail(err, KV_EINTERNAL, "out of memory (special tokens)");
    }
    for (int i = 0; i < f.n && !rc; i++) {
        if (f.v[i].id >= 0)
            rc = kv_tok_push_id(ids, n, &cap, f.v[i].id, err);
        else
            rc = t->ops->encode(t, text + f.v[i].off, f.v[i].len, ids, n, &cap, err);
    }
    free(f.v);
    if (rc) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}

int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int **ids,
                        int *n, kv_error *err) {
    return kv_tokenizer_encode_ex(t, text, len, add_bos, 1, ids, n, err);
}

int kv_tokenizer_piece(const kv_tokenizer *t, int prev_id, int id, char *buf, int cap) {
    return t->ops->piece(t, prev_id, id, buf, cap);
}

int kv_tokenizer_decode(const kv_tokenizer *t, const int *ids, int n, char **text, kv_error *err) {
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    if (!out) return kv_fail(err, KV_EINTERNAL, "out of memory (decode)");
    char piece[1024];
    for (int i = 0; i < n; i++) {
        int k = t->ops->piece(t, i > 0 ? ids[i - 1] : -1, ids[i], piece, sizeof piece);
        if (len + (size_t)k + 1 > cap) {
            while (len + (size_t)k + 1 > cap) cap *= 2;
            char *nw = realloc(out, cap);
            if (!nw) {
                free(out);
                return kv_fail(err, KV_EINTERNAL, "out of memory (decode)");
            }
            out = nw;
        }
        memcpy(out + len, piece, (size_t)k);
        len += (size_t)k;
    }
    out[len] = '\0';
    *text = out;
    return KV_OK;
}

int kv_tokenizer_bos(const kv_tokenizer *t) {
    return t->bos_id;
}

int kv_tokenizer_eos(const kv_tokenizer *t) {
    return t->eos_id;
}

int kv_tokenizer_vocab_size(const kv_tokenizer *t) {
    return t->vocab_size;
}

kv_tok_kind kv_tokenizer_kind(const kv_tokenizer *t) {
    return t->kind;
}
