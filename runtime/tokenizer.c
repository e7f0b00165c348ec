/* kvplan tokenizer front end and the scored-piece (SentencePiece-style) BPE tokenizer of
 * llama2.c `tokenizer.bin` files and GGUF "llama" vocabularies.
 *
 * Scored-piece encoding (the algorithm of llama2.c run.c `encode`, made O(n log n) with a
 * heap): prepend a " " piece when the text is not empty, split the text into UTF-8 code
 * points (a code point absent from the vocabulary falls back to its bytes <0xXX>), then
 * repeatedly merge the adjacent pair whose concatenation is a piece with the highest score,
 * leftmost first on ties, until no pair merges. The heap gives exactly the naive loop's result
 * because it orders candidates by (score desc, position asc) and discards stale entries.
 */
#include "kvplan/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strmap.h"
#include "tokenizer_bpe.h"

typedef struct spm_impl {
    int n;
    char **pieces; /* [n] NUL-terminated, owned */
    int *lens;     /* [n] */
    float *scores; /* [n] */
    kv_strmap map;
    int byte_id[256]; /* id of "<0xXX>" or -1 */
    int has_bytes;    /* the vocabulary has at least one "<0xXX>" piece */
} spm_impl;

static void spm_free(void *p) {
    spm_impl *s = p;
    if (!s) return;
    if (s->pieces)
        for (int i = 0; i < s->n; i++) free(s->pieces[i]);
    free(s->pieces);
    free(s->lens);
    free(s->scores);
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

typedef struct sym {
    int id, prev, next;
} sym;

typedef struct cand {
    float score;
    int left, right; /* node indices */
    int lid, rid;    /* ids when pushed (stale check) */
    int merged;      /* id of the merge result */
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

static int try_pair(const spm_impl *s, heap *h, const sym *syms, int left, char *buf) {
    int right = syms[left].next;
    if (right < 0) return 0;
    int a = syms[left].id, b = syms[right].id;
    int la = s->lens[a], lb = s->lens[b];
    memcpy(buf, s->pieces[a], (size_t)la);
    memcpy(buf + la, s->pieces[b], (size_t)lb);
    int m = kv_strmap_get(&s->map, buf, (size_t)(la + lb));
    if (m < 0) return 0;
    cand c = {s->scores[m], left, right, a, b, m};
    return heap_push(h, c);
}

static int spm_encode(const kv_tokenizer *t, const char *text, size_t len, int **ids, int *n,
                      int *cap, kv_error *err) {
    const spm_impl *s = t->impl;
    if (len == 0) return KV_OK;
    int maxlen = 0;
    for (int i = 0; i < s->n; i++)
        if (s->lens[i] > maxlen) maxlen = s->lens[i];
    sym *syms = malloc((len + 2) * sizeof *syms);
    char *buf = malloc((size_t)2 * (size_t)maxlen + 8);
    heap h = {0};
    if (!syms || !buf) {
        free(syms);
        free(buf);
        return kv_fail(err, KV_EINTERNAL, "out of memory (tokenizer)");
    }
    int ns = 0;
    int space = kv_strmap_get(&s->map, " ", 1);
    if (space >= 0) syms[ns++].id = space;
    /* code points, byte fallback (llama2.c run.c encode) */
    char cp[8];
    size_t cp_len = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c & 0xC0) != 0x80) cp_len = 0;
        cp[cp_len++] = (char)c;
        if (i + 1 < len && (((unsigned char)text[i + 1]) & 0xC0) == 0x80 && cp_len < 4) continue;
        int id = kv_strmap_get(&s->map, cp, cp_len);
        if (id >= 0) {
            syms[ns++].id = id;
        } else {
            for (size_t k = 0; k < cp_len; k++) {
                int b = s->byte_id[(unsigned char)cp[k]];
                /* llama2.c's fixed byte offset; a vocabulary without any byte piece (e.g. the
                 * TinyStories-656K GGUF files) maps the byte to piece 0, <unk>, as llama.cpp */
                if (b < 0) b = s->has_bytes ? (unsigned char)cp[k] + 3 : 0;
                if (b >= s->n) {
                    free(syms);
                    free(buf);
                    return kv_fail(err, KV_EINPUT,
                                   "tokenizer has no piece and no byte fallback for byte 0x%02x",
                                   (unsigned char)cp[k]);
                }
                syms[ns++].id = b;
            }
        }
        cp_len = 0;
    }
    for (int i = 0; i < ns; i++) {
        syms[i].prev = i - 1;
        syms[i].next = i + 1 < ns ? i + 1 : -1;
    }
    int rc = KV_OK;
    for (int i = 0; i < ns && rc == KV_OK; i++)
        if (try_pair(s, &h, syms, i, buf) != 0) rc = KV_EINTERNAL;
    while (rc == KV_OK && h.n > 0) {
        cand c = heap_pop(&h);
        if (syms[c.left].id != c.lid || syms[c.left].next != c.right || syms[c.right].id != c.rid)
            continue; /* stale: a neighbour merged since this pair was pushed */
        syms[c.left].id = c.merged;
        int nx = syms[c.right].next;
        syms[c.left].next = nx;
        if (nx >= 0) syms[nx].prev = c.left;
        syms[c.right].id = -1;
        syms[c.right].next = -2;
        if (syms[c.left].prev >= 0 && try_pair(s, &h, syms, syms[c.left].prev, buf) != 0)
            rc = KV_EINTERNAL;
        if (rc == KV_OK && try_pair(s, &h, syms, c.left, buf) != 0) rc = KV_EINTERNAL;
    }
    if (rc) kv_fail(err, rc, "out of memory (tokenizer merges)");
    for (int i = 0; rc == KV_OK && ns > 0 && i >= 0; i = syms[i].next)
        rc = kv_tok_push_id(ids, n, cap, syms[i].id, err);
    free(h.v);
    free(syms);
    free(buf);
    return rc;
}

static int spm_piece(const kv_tokenizer *t, int prev_id, int id, char *out, int cap) {
    const spm_impl *s = t->impl;
    if (cap <= 0) return 0;
    out[0] = '\0';
    if (id < 0 || id >= s->n || id == t->bos_id || id == t->eos_id) return 0;
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
    free(t);
}

int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos, int **ids,
                        int *n, kv_error *err) {
    *ids = NULL;
    *n = 0;
    int cap = 0;
    if (add_bos < 0) add_bos = t->add_bos;
    int rc = KV_OK;
    if (add_bos && t->bos_id >= 0) rc = kv_tok_push_id(ids, n, &cap, t->bos_id, err);
    if (!rc) rc = t->ops->encode(t, text, len, ids, n, &cap, err);
    if (rc) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
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

/* Implemented beside the GGUF and tokenizer.json readers. */
int kv_tokenizer_load_json(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err);
int kv_tokenizer_load_gguf(const kv_model *m, kv_tokenizer **out, kv_error *err);

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int load_path(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    int rc = kv_check_regular(path, "tokenizer", err); /* a FIFO would block the sniff below */
    if (rc) return rc;
    FILE *f = fopen(path, "rb");
    if (!f) return kv_fail(err, KV_EINPUT, "%s: cannot open tokenizer: %s", path, strerror(errno));
    int c;
    do c = fgetc(f);
    while (c == ' ' || c == '\n' || c == '\r' || c == '\t');
    fclose(f);
    if (c == '{') return kv_tokenizer_load_json(path, m, out, err);
    return kv_tokenizer_load_llama2c(path, m->cfg.vocab_size, out, err);
}

int kv_tokenizer_load(const char *path, const kv_model *m, kv_tokenizer **out, kv_error *err) {
    *out = NULL;
    int rc;
    if (path) {
        rc = load_path(path, m, out, err);
    } else if (strcmp(m->format, "gguf") == 0) {
        rc = kv_tokenizer_load_gguf(m, out, err);
    } else if (strcmp(m->format, "safetensors") == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/tokenizer.json", m->path);
        rc = kv_tokenizer_load_json(p, m, out, err);
    } else {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", m->path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/tokenizer.bin", dir);
        snprintf(b, sizeof b, "%s/tok%d.bin", dir, m->cfg.vocab_size);
        if (file_exists(a))
            rc = load_path(a, m, out, err);
        else if (file_exists(b))
            rc = load_path(b, m, out, err);
        else
            return kv_fail(err, KV_EINPUT,
                           "%s: no tokenizer found beside the model (looked for %s and %s); "
                           "pass --tokenizer PATH",
                           m->path, a, b);
    }
    if (rc) return rc;
    if ((*out)->vocab_size != m->cfg.vocab_size) {
        int v = (*out)->vocab_size;
        kv_tokenizer_free(*out);
        *out = NULL;
        return kv_fail(err, KV_EINPUT,
                       "tokenizer has %d tokens but the model %s has a vocabulary of %d: they do "
                       "not belong together",
                       v, m->path, m->cfg.vocab_size);
    }
    return KV_OK;
}
