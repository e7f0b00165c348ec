/* Retrieval probes: reading, scoring and generating them (include/kvplan/retrieval.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/retrieval.h"

void kv_probes_free(kv_probes *p) {
    if (!p) return;
    free(p->ids);
    free(p->off);
    free(p->n_prompt);
    memset(p, 0, sizeof *p);
}

/* Grow the probe arrays to hold one more probe of `n` tokens. */
static int probes_reserve(kv_probes *p, long *cap_ids, int *cap_n, long n, kv_error *err) {
    if (p->n + 1 >= *cap_n) {
        int nc = *cap_n ? *cap_n * 2 : 64;
        long *off = realloc(p->off, (size_t)(nc + 1) * sizeof *off);
        if (off) p->off = off;
        int *np = off ? realloc(p->n_prompt, (size_t)nc * sizeof *np) : NULL;
        if (!np) return kv_fail(err, KV_EINTERNAL, "out of memory: probes");
        p->n_prompt = np;
        *cap_n = nc;
    }
    if (p->off[p->n] + n > *cap_ids) {
        long nc = (*cap_ids + n) * 2;
        int *ids = realloc(p->ids, (size_t)nc * sizeof *ids);
        if (!ids) return kv_fail(err, KV_EINTERNAL, "out of memory: probe tokens");
        p->ids = ids;
        *cap_ids = nc;
    }
    return KV_OK;
}

/* Tokenize one probe line (prompt, answer) and append it. */
static int probe_add(kv_probes *p, const char *path, int line, const char *prompt, size_t plen,
                     const char *answer, const kv_tokenizer *tok, int context, long *cap_ids,
                     int *cap_n, kv_error *err) {
    size_t alen = strlen(answer);
    char *full = kv_malloc(plen + alen + 2, "probe", err);
    if (!full) return KV_EINTERNAL;
    memcpy(full, prompt, plen);
    full[plen] = ' ';
    memcpy(full + plen + 1, answer, alen + 1);
    int *pi = NULL, *fi = NULL, np = 0, nf = 0;
    int rc = kv_tokenizer_encode(tok, prompt, plen, 1, &pi, &np, err);
    if (!rc) rc = kv_tokenizer_encode(tok, full, plen + alen + 1, 1, &fi, &nf, err);
    if (rc) kv_fail_context(err, "%s line %d", path, line);
    if (!rc && (nf <= np || memcmp(pi, fi, (size_t)np * sizeof *pi)))
        rc = kv_fail(err, KV_EINPUT,
                     "%s line %d: the answer's tokens do not follow the prompt's (the prompt "
                     "tokenizes differently when the answer follows it); end the prompt before "
                     "the answer's word",
                     path, line);
    if (!rc && nf > context)
        rc = kv_fail(err, KV_EINPUT,
                     "%s line %d: the probe is %d tokens (BOS + prompt + answer), longer than the "
                     "context of %d; shorten the prompt",
                     path, line, nf, context);
    if (!rc) rc = probes_reserve(p, cap_ids, cap_n, nf, err);
    if (!rc) {
        memcpy(p->ids + p->off[p->n], fi, (size_t)nf * sizeof *fi);
        p->n_prompt[p->n] = np;
        p->off[p->n + 1] = p->off[p->n] + nf;
        if (nf > p->max_len) p->max_len = nf;
        p->n++;
    }
    free(pi);
    free(fi);
    free(full);
    return rc;
}

int kv_probes_parse(const char *path, const char *data, size_t len, const kv_tokenizer *tok,
                    int context, kv_probes *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    long cap_ids = 0;
    int cap_n = 0, rc = KV_OK, line = 0;
    out->off = calloc(1, sizeof *out->off);
    if (!out->off) return kv_fail(err, KV_EINTERNAL, "out of memory: probes");
    for (size_t at = 0; at < len && !rc;) {
        const char *l = data + at, *nl = memchr(l, '\n', len - at);
        size_t n = nl ? (size_t)(nl - l) : len - at;
        at += n + 1;
        line++;
        if (n && l[n - 1] == '\r') n--;
        if (!n) continue;
        const char *tab = memchr(l, '\t', n);
        if (!tab || tab == l || tab == l + n - 1) {
            rc = kv_fail(err, KV_EINPUT,
                         "%s line %d: expected PROMPT<TAB>ANSWER (both non-empty); fix the "
                         "probe file",
                         path, line);
            break;
        }
        size_t alen = (size_t)(l + n - tab - 1);
        char *ans = kv_malloc(alen + 1, "probe answer", err);
        if (!ans) return kv_probes_free(out), KV_EINTERNAL;
        memcpy(ans, tab + 1, alen);
        ans[alen] = '\0';
        rc = probe_add(out, path, line, l, (size_t)(tab - l), ans, tok, context, &cap_ids, &cap_n,
                       err);
        free(ans);
    }
    if (!rc && out->n == 0)
        rc = kv_fail(err, KV_EINPUT, "%s: no probe (expected lines PROMPT<TAB>ANSWER)", path);
    if (rc) kv_probes_free(out);
    return rc;
}

int kv_probes_read(const char *path, const kv_tokenizer *tok, int context, kv_probes *out,
                   kv_error *err) {
    char *data = NULL;
    size_t len = 0;
    int rc = kv_check_regular(path, "probe file", err);
    if (!rc) rc = kv_read_file(path, &data, &len, err);
    if (!rc) rc = kv_probes_parse(path, data, len, tok, context, out, err);
    free(data);
    return rc;
}

/* Log-softmax of the wanted token and whether it is the argmax (first maximum). */
static double answer_step(const float *logits, int vocab, int want, int *is_max) {
    float mx = logits[0];
    int arg = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > mx) mx = logits[v], arg = v;
    double s = 0;
    for (int v = 0; v < vocab; v++) s += exp((double)logits[v] - mx);
    *is_max = arg == want;
    return -((double)logits[want] - mx - log(s));
}

/* One probe in a fresh sequence: *hit when every answer token is the argmax. */
static int probe_one(kv_engine *e, const kv_probes *p, int i, const int *budget,
                     const kv_policy *policy, const kv_cache_type *types, float *logits, int vocab,
                     int *hit, double *nll, kv_error *err) {
    int seq = -1;
    const int *ids = p->ids + p->off[i];
    const int np = p->n_prompt[i], na = (int)(p->off[i + 1] - p->off[i]) - np;
    int rc = kv_engine_seq_open_typed(e, budget, policy, types, &seq, err);
    if (rc) return rc;
    rc = kv_engine_prefill(e, seq, ids, np, KV_LOGITS_LAST, logits, NULL, err);
    *hit = 1;
    *nll = 0;
    for (int a = 0; a < na && !rc; a++) {
        int is_max = 0;
        *nll += answer_step(logits, vocab, ids[np + a], &is_max);
        if (!is_max) *hit = 0;
        if (a + 1 < na) rc = kv_engine_decode(e, &seq, 1, &ids[np + a], logits, err);
    }
    kv_engine_seq_close(e, seq);
    return rc;
}

int kv_probes_eval(kv_engine *e, const kv_model *m, const kv_probes *p, int first, int count,
                   const int *budget, const kv_policy *policy, const kv_cache_type *types,
                   kv_probe_score *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    if (count <= 0 || first + count > p->n) count = p->n - first;
    if (first < 0 || count < 1)
        return kv_fail(err, KV_EINPUT, "%s: probes %d.. outside the %d probes", p->path, first,
                       p->n);
    const kv_plan *plan = kv_engine_plan(e);
    if (p->max_len > plan->context)
        return kv_fail(err, KV_EINPUT,
                       "%s: a probe is %d tokens, longer than the context of %d; shorten it",
                       p->path, p->max_len, plan->context);
    const int vocab = m->cfg.vocab_size;
    float *logits = kv_malloc((size_t)vocab * sizeof *logits, "probe logits", err);
    if (!logits) return KV_EINTERNAL;
    int rc = KV_OK;
    long answer_tokens = 0;
    double nll_sum = 0;
    for (int i = first; i < first + count && !rc; i++) {
        int hit = 0;
        double nll = 0;
        rc = probe_one(e, p, i, budget, policy, types, logits, vocab, &hit, &nll, err);
        out->hits += hit;
        nll_sum += nll;
        answer_tokens += (p->off[i + 1] - p->off[i]) - p->n_prompt[i];
    }
    free(logits);
    if (rc) return rc;
    out->n = count;
    out->accuracy = (double)out->hits / count;
    out->nll = nll_sum / (double)answer_tokens;
    return KV_OK;
}
