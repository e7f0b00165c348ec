/* kvplan evaluation: perplexity under a (possibly budgeted) KV cache, and generation.
 *
 * Perplexity (docs/design.md Runtime, "Budgeted perplexity"; BaKlaVa §4 uses the same measure for
 * its search): the token stream is cut into consecutive non-overlapping chunks of C tokens, a
 * final partial chunk is dropped, each chunk gets a fresh cache, and the C - 1 next-token
 * predictions of each chunk are scored. With budgets, the chunk is processed in blocks of p
 * tokens and every head evicts before each block so that no query attends to more than its
 * budget (Batch-Max Alg. 1). Reported: mean NLL (nats/token), perplexity = exp(mean NLL).
 */
#ifndef KVPLAN_EVAL_H
#define KVPLAN_EVAL_H

#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/plan.h"
#include "kvplan/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef struct kv_eval_result {
    double nll;         /* mean negative log-likelihood, nats per scored token */
    double perplexity;  /* exp(nll) */
    long tokens_scored; /* chunks * (C - 1) */
    int chunks;
    double seconds;       /* wall time of the forward passes */
    double tokens_per_s;  /* tokens processed / seconds */
    size_t kv_bytes_peak; /* most bytes of K/V blocks in use at once */
    size_t kv_bytes_full; /* K/V bytes the full cache of one chunk takes */
} kv_eval_result;

/* Perplexity from a sum of next-token NLLs (nats) over n_scored predictions: exp(sum / n).
 * The one place this is computed (eval, search, sensitivity). */
double kv_perplexity_from_nll(double nll_sum, long n_scored);

/* The range a sum of next-token NLLs (nats) over n_scored predictions with a vocabulary of
 * `vocab` tokens can plausibly take, for checking results read back from a task log:
 * lo = n_scored * 1e-9 (a mean perplexity above 1 + 1e-9; 0 and denormals are not a
 * measurement) and hi = n_scored * 100 * max(ln vocab, 1) (a hundred times the uniform
 * distribution's loss per token). */
void kv_nll_sum_range(long n_scored, int vocab, double *lo, double *hi);

/* Perplexity of tokens[0..n_tokens) under engine `e`'s plan (see the header comment): chunks
 * of the plan's context C, max_chunks = 0 for all full chunks, progress may be NULL.
 * KV_EINPUT when there is not a single full chunk or a token id is out of range. */
int kv_eval_engine(kv_engine *e, const int *tokens, long n_tokens, int max_chunks,
                   kv_progress *progress, kv_eval_result *res, kv_error *err);

/* Convenience for callers holding loose budgets (tests, tools): an engine on the CPU for
 * budgets `budget` [L * H_kv] (NULL: the full cache; budgets above C act as C), one policy,
 * p and b_s, then kv_eval_engine. The plan's ratio is what the budgets keep. */
typedef struct kv_eval_opts {
    int context;       /* C tokens per chunk (<= model seq_len) */
    const int *budget; /* [L * H_kv] tokens per head, NULL = full cache */
    kv_policy policy;
    int evict_block;       /* p (Batch-Max); 1 = token-by-token streaming */
    int block_size;        /* b_s tokens per KV block */
    int max_chunks;        /* 0 = all full chunks */
    kv_progress *progress; /* NULL = silent */
    kv_cache_type kv_type; /* KV storage type of every head */
} kv_eval_opts;

/* Defaults: context = model seq_len, budget NULL, policy sink, p = 16, b_s = 16, KV type
 * KV_TYPE_DEFAULT (f16). */
void kv_eval_opts_default(kv_eval_opts *o, const kv_model *m);

/* The plan these options describe (kv_plan_full or kv_plan_from_budgets with allocation
 * "custom", every head of type kv_type, the ratio in bytes over the full F16 cache); KV_EINPUT as
 * kv_plan_validate, naming the failing head. */
int kv_eval_opts_plan(const kv_model *m, const kv_eval_opts *o, kv_plan *out, kv_error *err);

int kv_eval_perplexity(const kv_model *m, const int *tokens, long n_tokens, const kv_eval_opts *o,
                       kv_eval_result *res, kv_error *err);

/* ---- sampling and generation ---- */
typedef struct kv_sampler {
    float temperature; /* 0 = greedy (argmax) */
    float top_p;       /* nucleus threshold in (0, 1]; 1 = off */
    uint64_t rng;      /* xorshift64* state, seeded from --seed */
} kv_sampler;

void kv_sampler_init(kv_sampler *s, float temperature, float top_p, uint64_t seed);
/* Sample an id from logits [vocab] (modified in place by softmax when temperature > 0).
 * `scratch` holds at least 2 * vocab ints worth of space (vocab floats + vocab ints). */
int kv_sample(kv_sampler *s, float *logits, int vocab, void *scratch);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
