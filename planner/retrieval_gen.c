/* Pass-key probe generator (include/kvplan/retrieval.h, kv_probes_generate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/retrieval.h"

#define KEY_SENTENCE "The pass key is %05d. Remember it."
#define QUESTION "What is the pass key? The pass key is"

void kv_probe_gen_opts_default(kv_probe_gen_opts *o, int context) {
    memset(o, 0, sizeof *o);
    o->n = 200;
    o->seed = 1;
    o->from = 0.9;
    o->to = 1.0;
    o->depth_lo = 0.0;
    o->depth_hi = 0.6;
    o->context = context;
    o->min_tokens = 96;
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static double rng_unit(uint64_t *s) {
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

/* The text's sentences: [start, end) byte ranges, story by story ("\n\n" separates stories);
 * story_first[k] is the first sentence of story k. A sentence ends after . ! or ? (and a
 * closing quote) followed by white space or the story's end. */
typedef struct sentences {
    long n, cap, *start, *end;
    long n_story, *story_first;
} sentences;

static int sent_push(sentences *s, long a, long b) {
    if (s->n == s->cap) {
        long nc = s->cap ? s->cap * 2 : 1024;
        long *st = realloc(s->start, (size_t)nc * sizeof *st);
        if (st) s->start = st;
        long *en = st ? realloc(s->end, (size_t)nc * sizeof *en) : NULL;
        if (!en) return KV_EINTERNAL;
        s->end = en;
        s->cap = nc;
    }
    s->start[s->n] = a, s->end[s->n] = b, s->n++;
    return KV_OK;
}

/* End of the story starting at i: the next blank line ("\n\n") or the text's end. */
static long story_end(const char *t, long len, long i) {
    while (i < len && !(t[i] == '\n' && i + 1 < len && t[i + 1] == '\n')) i++;
    return i;
}

static int split_sentences(const char *t, long len, sentences *s, kv_error *err) {
    memset(s, 0, sizeof *s);
    s->story_first = malloc((size_t)(len / 2 + 2) * sizeof *s->story_first);
    if (!s->story_first) return kv_fail(err, KV_EINTERNAL, "out of memory: sentences");
    for (long i = 0; i < len;) {
        while (i < len && (t[i] == '\n' || t[i] == ' ' || t[i] == '\r')) i++;
        if (i >= len) break;
        const long e = story_end(t, len, i);
        s->story_first[s->n_story++] = s->n;
        long a = i;
        while (i < e) {
            long b = i + 1;
            if (t[i] == '.' || t[i] == '!' || t[i] == '?') {
                while (b < e && (t[b] == '"' || t[b] == '\'')) b++;
                if (b >= e || t[b] == ' ' || t[b] == '\n') {
                    if (sent_push(s, a, b)) return kv_fail(err, KV_EINTERNAL, "out of memory");
                    while (b < e && (t[b] == ' ' || t[b] == '\n' || t[b] == '\r')) b++;
                    a = b;
                }
            }
            i = b;
        }
        if (a < e && sent_push(s, a, e)) return kv_fail(err, KV_EINTERNAL, "out of memory");
        i = e;
    }
    s->story_first[s->n_story] = s->n;
    return KV_OK;
}

static void sent_free(sentences *s) {
    free(s->start);
    free(s->end);
    free(s->story_first);
}

/* Append sentence k of t to buf (newlines and tabs become spaces), a space before it unless
 * buf is empty. */
static void put_sentence(char *buf, size_t *n, const char *t, long a, long b) {
    if (*n) buf[(*n)++] = ' ';
    for (long i = a; i < b; i++)
        buf[(*n)++] = (t[i] == '\n' || t[i] == '\t' || t[i] == '\r') ? ' ' : t[i];
    buf[*n] = '\0';
}

/* The prompt of sentences [s0, s0 + cnt) with the key sentence before the one at offset kpos. */
static size_t build_prompt(char *buf, const char *t, const sentences *s, long s0, long cnt,
                           long kpos, int key) {
    size_t n = 0;
    buf[0] = '\0';
    char ks[64];
    snprintf(ks, sizeof ks, KEY_SENTENCE, key);
    for (long k = 0; k <= cnt; k++) {
        if (k == kpos) put_sentence(buf, &n, ks, 0, (long)strlen(ks));
        if (k < cnt) put_sentence(buf, &n, t, s->start[s0 + k], s->end[s0 + k]);
    }
    put_sentence(buf, &n, QUESTION, 0, (long)strlen(QUESTION));
    return n;
}

/* Tokens of BOS + prompt + " NNNNN". */
static int probe_tokens(const kv_tokenizer *tok, char *buf, size_t n, int key, int *len,
                        kv_error *err) {
    int *ids = NULL;
    snprintf(buf + n, 16, " %05d", key);
    int rc = kv_tokenizer_encode(tok, buf, strlen(buf), 1, &ids, len, err);
    buf[n] = '\0';
    free(ids);
    return rc;
}

/* One probe: sentences from a random sentence of a random story in the range, as many as fit
 * a target length, the key at a random depth. Appends "prompt\tkey\n" to out. */
static int gen_one(const char *t, const sentences *s, long lo_s, long hi_s, const kv_tokenizer *tok,
                   const kv_probe_gen_opts *o, uint64_t *rng, char *buf, FILE *out, kv_error *err) {
    const int max_len = o->context - 8;
    int target = o->min_tokens + (int)(rng_unit(rng) * (max_len - o->min_tokens + 1));
    if (target > max_len) target = max_len;
    long story = lo_s + (long)(rng_unit(rng) * (double)(hi_s - lo_s));
    long s0 = s->story_first[story];
    long last = s->story_first[hi_s];
    int key = 10000 + (int)(rng_next(rng) % 90000);
    long cnt = 0;
    int len = 0, rc = KV_OK;
    /* grow while the probe stays within the target (the key placed last while counting) */
    while (s0 + cnt < last) {
        size_t n = build_prompt(buf, t, s, s0, cnt + 1, cnt + 1, key);
        rc = probe_tokens(tok, buf, n, key, &len, err);
        if (rc) return rc;
        if (len > target && cnt > 0) break; /* at least one sentence of filler */
        cnt++;
    }
    double depth = o->depth_lo + rng_unit(rng) * (o->depth_hi - o->depth_lo);
    long kpos = (long)(depth * (double)cnt + 0.5);
    for (;; cnt--) {
        if (kpos > cnt) kpos = cnt;
        size_t n = build_prompt(buf, t, s, s0, cnt, kpos, key);
        rc = probe_tokens(tok, buf, n, key, &len, err);
        if (rc) return rc;
        if (len <= max_len || cnt == 0) break;
    }
    if (len > max_len)
        return kv_fail(err, KV_EINPUT, "probe generator: no prompt fits the context of %d",
                       o->context);
    fprintf(out, "%s\t%05d\n", buf, key);
    return KV_OK;
}

int kv_probes_generate(const char *text, size_t len, const kv_tokenizer *tok,
                       const kv_probe_gen_opts *o, char **tsv, kv_error *err) {
    *tsv = NULL;
    if (o->n < 1 || !(o->from >= 0 && o->from < o->to && o->to <= 1) ||
        !(o->depth_lo >= 0 && o->depth_lo <= o->depth_hi && o->depth_hi <= 1) ||
        o->min_tokens < 8 || o->min_tokens > o->context - 8)
        return kv_fail(err, KV_EINPUT,
                       "probe generator: need n >= 1, 0 <= from < to <= 1, 0 <= depth range <= 1 "
                       "and 8 <= min tokens <= context - 8");
    sentences s;
    int rc = split_sentences(text, (long)len, &s, err);
    long lo_s = (long)(o->from * (double)s.n_story), hi_s = (long)(o->to * (double)s.n_story);
    if (!rc && hi_s - lo_s < 2)
        rc = kv_fail(err, KV_EINPUT, "probe generator: stories %ld..%ld of %ld: fewer than 2", lo_s,
                     hi_s, s.n_story);
    char *buf = rc ? NULL : malloc(len + 4096);
    size_t out_len = 0;
    char *out_buf = NULL;
    FILE *out = buf ? open_memstream(&out_buf, &out_len) : NULL;
    if (!rc && (!buf || !out)) rc = kv_fail(err, KV_EINTERNAL, "out of memory: probes");
    uint64_t rng = o->seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < o->n && !rc; i++)
        rc = gen_one(text, &s, lo_s, hi_s, tok, o, &rng, buf, out, err);
    if (out) fclose(out);
    free(buf);
    sent_free(&s);
    if (rc) {
        free(out_buf);
        return rc;
    }
    *tsv = out_buf;
    return KV_OK;
}

int kv_probes_copy(int n, int len, int answer, int vocab, uint64_t seed, kv_probes *out,
                   kv_error *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "(BOS + R + R copies of %d random tokens)", len);
    if (n < 1 || answer < 1 || len <= answer || vocab <= 3)
        return kv_fail(err, KV_EINPUT, "copy probes: need n >= 1 and len > answer >= 1");
    const int per = 1 + 2 * len;
    out->ids = malloc((size_t)n * per * sizeof *out->ids);
    out->off = malloc((size_t)(n + 1) * sizeof *out->off);
    out->n_prompt = malloc((size_t)n * sizeof *out->n_prompt);
    if (!out->ids || !out->off || !out->n_prompt) {
        kv_probes_free(out);
        return kv_fail(err, KV_EINTERNAL, "out of memory: copy probes");
    }
    uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 7;
    for (int i = 0; i < n; i++) {
        int *ids = out->ids + (long)i * per;
        ids[0] = 1; /* BOS of llama2.c / SentencePiece vocabularies */
        for (int k = 0; k < len; k++)
            ids[1 + k] = ids[1 + len + k] = 3 + (int)(rng_next(&rng) % (uint64_t)(vocab - 3));
        out->off[i] = (long)i * per;
        out->n_prompt[i] = per - answer;
    }
    out->off[n] = (long)n * per;
    out->n = n;
    out->max_len = per;
    return KV_OK;
}
