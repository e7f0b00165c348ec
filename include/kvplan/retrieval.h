/* kvplan retrieval: probes that ask the model for a fact stated earlier in its context, the
 * per-head cost of cutting a head to a streaming window, and the search stage that keeps
 * retrieval (planner/retrieval.c; docs/retrieval.md).
 *
 * Perplexity is a poor judge of KV eviction: most next tokens need only recent context, so a
 * cache that forgets a fact stated 200 tokens back scores almost as well as the full cache.
 * A probe file is a TSV, one probe a line: the prompt, a tab, the expected answer (the format
 * of ../shared/models/passkey-tiny/passkey-calib.tsv). A probe is answered when the greedy
 * continuation of BOS + prompt starts with the answer's tokens (the tokens of prompt + " " +
 * answer after the prompt's own); its answer NLL is the mean next-token NLL of those tokens
 * under teacher forcing, which moves smoothly where accuracy jumps.
 *
 * Retrieval heads (DuoAttention, Xiao et al. 2024, §3: a few heads carry long-range lookups,
 * the others need only attention sinks and a recent window): for each (layer, KV head) the
 * rise of the probes' mean answer NLL when that head alone keeps a sink + recent window of W
 * tokens and every other head the whole context. The search stage
 * (kv_retrieval_search) adds that rise, scaled by the share of the context a budget drops
 * ((C - B) / (C - W), 0 at the whole context), to the sensitivity curves of every head, solves
 * the knapsack again for several weights and with the k costliest heads forced whole
 * (DuoAttention's plan, the other heads' windows chosen by the knapsack), and keeps the plan
 * with the lowest search perplexity among those whose probe accuracy is at most `tolerance`
 * below the full cache's. When none of those is within it (a ratio too small to keep a
 * retrieval head whole), a second round keeps the k = 1, 2 costliest heads compressed by
 * attention instead: each holds C/2, 7C/16 or 3C/8 tokens in the cheapest allowed KV type
 * under the policy l2attn (KV-Compress, Rehg 2024: the entries with the least accumulated
 * squared attention are evicted, so the entries a head looked at sharply survive in a small
 * budget), and the other heads share the rest of the bytes by the knapsack or, as
 * DuoAttention's streaming heads, all alike (one window, in each allowed KV type).
 *
 * Arrays [L, H_kv] are row-major (l * H_kv + j). Everything a struct owns is freed by its
 * _free function. No global state.
 */
#ifndef KVPLAN_RETRIEVAL_H
#define KVPLAN_RETRIEVAL_H

#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/h5io.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

struct kv_search_opts;
struct kv_search_result;

/* Probes, tokenized. Probe i is ids[off[i] .. off[i + 1]): BOS + prompt (n_prompt[i] tokens),
 * then the answer's tokens (at least one). */
typedef struct kv_probes {
    int n;         /* probes */
    int *ids;      /* [off[n]] owned */
    long *off;     /* [n + 1] owned */
    int *n_prompt; /* [n] owned */
    int max_len;   /* the longest probe, tokens (prompt + answer) */
    char path[1024];
} kv_probes;

/* Parse probe text data[0..len) read from `path` (named in messages) with tokenizer tok:
 * every non-empty line is PROMPT TAB ANSWER (a trailing CR is dropped). A probe longer than
 * `context` tokens (prompt + answer, BOS included) is refused: KV_EINPUT naming the file, the
 * line, its length and the context. Also KV_EINPUT for a line without a tab, an empty prompt
 * or answer, an answer whose tokens do not follow the prompt's (the prompt's tokens are not a
 * prefix of prompt + " " + answer's), and a file with no probe. Fills *out (kv_probes_free). */
int kv_probes_parse(const char *path, const char *data, size_t len, const kv_tokenizer *tok,
                    int context, kv_probes *out, kv_error *err);
/* kv_probes_parse of the file at `path`. */
int kv_probes_read(const char *path, const kv_tokenizer *tok, int context, kv_probes *out,
                   kv_error *err);
void kv_probes_free(kv_probes *p);

/* Accuracy and answer NLL of probes [first, first + count) under one set of budgets. */
typedef struct kv_probe_score {
    int n;           /* probes scored */
    int hits;        /* answered (greedy continuation starts with the answer) */
    double accuracy; /* hits / n, in [0, 1] */
    double nll;      /* mean NLL of the answer tokens, nats/token (teacher forcing) */
} kv_probe_score;

/* Score probes [first, first + count) (count <= 0: all from first) on engine e running model m
 * (the model the engine was made for), each in a fresh
 * sequence with budgets `budget` [L * H_kv] tokens, policies `policy` and KV types `types`
 * (each may be NULL: the engine plan's): the prompt is prefilled (in blocks of the plan's p
 * when a head can be over budget), then each answer token is compared with the argmax of the
 * logits and decoded (teacher forcing), as `kvplan run` would generate greedily. The engine
 * must allow positions up to the probes' max_len. Errors: KV_EINPUT for a range outside the
 * probes, a probe longer than the engine's context; those of the engine. */
int kv_probes_eval(kv_engine *e, const kv_model *m, const kv_probes *p, int first, int count,
                   const int *budget, const kv_policy *policy, const kv_cache_type *types,
                   kv_probe_score *out, kv_error *err);

/* Per-head retrieval cost (/heads/retrieval in a profile). */
typedef struct kv_retrieval_heads {
    int n_layers, n_kv_heads;
    int window;      /* W: tokens the cut head keeps (sink policy: KV_SINK_TOKENS + recent) */
    int n_probes;    /* probes measured */
    double full_nll; /* the probes' mean answer NLL with the full cache */
    double full_accuracy;
    double *nll_rise;  /* [L * H_kv] answer NLL with head h cut, minus full_nll; owned */
    double *accuracy;  /* [L * H_kv] probe accuracy with head h cut; owned */
    char probes[1024]; /* the probe file */
} kv_retrieval_heads;

/* Measure the retrieval cost of every head (see the top of this file) on the first
 * max_probes probes (0: all) with the full-cache engine e of model m (policy sink, so a head with
 * budget W keeps KV_SINK_TOKENS sinks and the most recent W - KV_SINK_TOKENS tokens). W must be at
 * least KV_SINK_TOKENS + the engine plan's p and below its context. Costs (1 + L * H_kv)
 * passes over the probes; progress may be NULL. Fills *out (kv_retrieval_heads_free). */
int kv_retrieval_heads_measure(kv_engine *e, const kv_model *m, const kv_probes *p, int max_probes,
                               int window, kv_progress *progress, kv_retrieval_heads *out,
                               kv_error *err);
void kv_retrieval_heads_free(kv_retrieval_heads *h);
/* Write /heads/retrieval [L, H_kv] (answer NLL rise, nats/token) and
 * /heads/retrieval_accuracy [L, H_kv], with attributes window, n_probes, full_nll,
 * full_accuracy, probes, units. */
int kv_retrieval_heads_write(kv_h5 *f, const kv_retrieval_heads *h, kv_error *err);
/* The same for the copy probes' proxy: /heads/induction and /heads/induction_accuracy. */
int kv_retrieval_induction_write(kv_h5 *f, const kv_retrieval_heads *h, kv_error *err);
/* Read them back from an open profile (KV_EINPUT when absent or of another shape than
 * [n_layers, n_kv_heads]); *found = 0 and KV_OK when the profile has no /heads/retrieval. */
int kv_retrieval_heads_read(kv_h5 *f, const char *path, int n_layers, int n_kv_heads,
                            kv_retrieval_heads *out, int *found, kv_error *err);

/* Generating pass-key probes (the format of passkey-tiny's README): TinyStories-like text
 * whose stories are separated by blank lines; the filler is consecutive sentences of the
 * stories in [from, to) of the file (fractions of the story count, e.g. 0.9 to 1 for stories
 * a calibration from the first 90 % never saw), with the sentence
 * "The pass key is NNNNN. Remember it." (NNNNN uniform in 10000..99999) at a sentence
 * boundary whose relative depth is uniform in [depth_lo, depth_hi], and
 * " What is the pass key? The pass key is" at the end; the answer is NNNNN. The prompt's
 * length is uniform in [min_tokens, context - 8] tokens (BOS and answer included), as whole
 * sentences allow. */
typedef struct kv_probe_gen_opts {
    int n;                     /* probes */
    uint64_t seed;             /* xorshift64* seed */
    double from, to;           /* story range (fractions), default 0.9, 1.0 */
    double depth_lo, depth_hi; /* key depth in the filler, default 0, 1 */
    int context;               /* C tokens (default: the caller's model context) */
    int min_tokens;            /* shortest prompt, default 96 (the key and the question
                                * alone are about 55 tokens of tok512) */
} kv_probe_gen_opts;
void kv_probe_gen_opts_default(kv_probe_gen_opts *o, int context);
/* Generate o->n probes from text[0..len) as TSV lines (*tsv malloc'ed, caller frees).
 * KV_EINPUT when the range holds fewer than 2 stories or no prompt fits the context. */
int kv_probes_generate(const char *text, size_t len, const kv_tokenizer *tok,
                       const kv_probe_gen_opts *o, char **tsv, kv_error *err);

/* Copy probes, the proxy that needs no probe file (an induction score): n sequences
 * BOS (id 1) + R + R of `len` random ids uniform in [3, vocab) each, scored on the last
 * `answer` tokens of the second copy (prompt: BOS + R + R minus them). A head that the copy
 * needs loses it when cut to a window shorter than len. KV_EINPUT for n < 1 or
 * len <= answer < 1. Fills *out (kv_probes_free). */
int kv_probes_copy(int n, int len, int answer, int vocab, uint64_t seed, kv_probes *out,
                   kv_error *err);

/* The search stage (see the top of this file). */
#define KV_RETRIEVAL_MAX_CAND 36
typedef struct kv_retrieval_opts {
    double tolerance; /* accuracy a plan may lose against the full cache, in [0, 1] (0.05) */
    int max_probes;   /* calibration probes used (0: all) */
    int window;       /* W of the head costs when they are measured here (0: the uniform
                       * budget R * C, at least KV_SINK_TOKENS + p) */
    const kv_retrieval_heads *heads; /* measured head costs (a profile's), or NULL */
} kv_retrieval_opts;
void kv_retrieval_opts_default(kv_retrieval_opts *o);

typedef struct kv_retrieval_result {
    kv_probe_score full, uniform, guard, plan;         /* the probes under each */
    double full_ppl, uniform_ppl, guard_ppl, plan_ppl; /* search perplexity, same chunks */
    int n_cand;
    double weight[KV_RETRIEVAL_MAX_CAND]; /* the retrieval weight (NaN: forced heads) */
    int forced[KV_RETRIEVAL_MAX_CAND];    /* heads forced whole (0: weight candidate) */
    int whole[KV_RETRIEVAL_MAX_CAND];     /* heads at the whole context in the solution */
    int kept[KV_RETRIEVAL_MAX_CAND];      /* tokens of each of the `forced` costliest heads
                                           * when they keep them by attention (policy l2attn),
                                           * 0: not such a candidate */
    int others[KV_RETRIEVAL_MAX_CAND];    /* with kept: the other heads' KV type when all
                                           * alike (a kv_cache_type), -1: by the knapsack */
    double cand_ppl[KV_RETRIEVAL_MAX_CAND];
    kv_probe_score cand[KV_RETRIEVAL_MAX_CAND];
    int chosen; /* candidate index kept, -1: the perplexity guard's plan */
    double tolerance;
    char decision[256];       /* in words */
    kv_retrieval_heads heads; /* the head costs used (owned copy) */
    int heads_measured;       /* 1: measured by the search, 0: from the profile */
} kv_retrieval_result;

/* After the search and its guard: score the plan in res (res->tokens, policy, kv_types,
 * res->evict_block; b_s = o->block_size, or the guard's uniform b_s when it fell back to
 * uniform, `guard_block_size`) on the probes; when its accuracy is more than o->tolerance below
 * the full cache's, replace it (res->tokens, blocks, policy, kv_types, winner_sens = 1) by the
 * best retrieval candidate that is within the tolerance (lowest perplexity on the first
 * n_chunks search chunks at ids). res->sens curves are used when present, else measured.
 * Errors: KV_EINPUT when no candidate keeps the accuracy within the tolerance (the message
 * says what to pass); those of the engine and the knapsack. Fills *rr
 * (kv_retrieval_result_free). */
int kv_retrieval_search(const kv_model *m, const int *ids, int n_chunks,
                        const struct kv_search_opts *o, const kv_probes *probes,
                        const kv_retrieval_opts *ro, int guard_block_size,
                        struct kv_search_result *res, kv_retrieval_result *rr, kv_error *err);
void kv_retrieval_result_free(kv_retrieval_result *r);
/* Write /search/retrieval: datasets baselines [4, 3] (full, uniform, guard, plan x accuracy,
 * answer NLL, search perplexity), candidates [K, 8] (weight, forced, whole, accuracy, NLL,
 * perplexity, kept, others), heads [L, H_kv] (the NLL rise used); attributes chosen, decision,
 * tolerance, probes, n_probes, window, heads_source. */
int kv_retrieval_write(kv_h5 *f, const kv_retrieval_result *r, kv_error *err);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
