/* kvplan profiler: per-head and per-layer similarity of a model on real prompts, prompt
 * consistency, and (through hwprobe.h) hardware speeds, written to profile.h5.
 *
 * Definitions (docs/design.md "Profiling"; BaKlaVa Alg. 1; SqueezeAttention §3):
 *  - head cos: for layer l, query head h, KV head j = h / g and token t,
 *      c[t] = cos(V[t, j], O[t, h]),  O = softmax(Q K^T / sqrt(d_h) + causal mask) V,
 *    before the output projection; per prompt its mean and (population) variance over t.
 *  - head similarity s = (mean + 1) / 2, averaged over prompts, then over the g query heads of
 *    each KV head -> [L, H_kv]; importance = 1 - s.
 *  - layer similarity: mean over tokens of cos(x_l, x_l + Attn_l(RMSNorm(x_l)))
 *    (SqueezeAttention, the default) and of cos(x_l, x_{l+1}) (the whole block), [P, L].
 *  - consistency: Kendall's tau-b and Spearman's rho (GSL) between the per-prompt rankings of
 *    the L*H query heads by cos mean, [P, P].
 */
#ifndef KVPLAN_PROFILER_H
#define KVPLAN_PROFILER_H

#include "kvplan/backend.h"
#include "kvplan/common.h"
#include "kvplan/h5io.h"
#include "kvplan/hwprobe.h"
#include "kvplan/model.h"
#include "kvplan/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

typedef struct kv_profile {
    int P, L, H, H_kv, T;     /* prompts, layers, query heads, KV heads, tokens per prompt */
    kv_cache_type kv_type;    /* KV storage type of the full cache profiled (attr kv_type) */
    int *tokens;              /* [P, T] prompt token ids (BOS first), owned */
    int *lengths;             /* [P] */
    double *cos_mean;         /* [P, L, H] */
    double *cos_var;          /* [P, L, H] */
    double *similarity;       /* [L, H_kv] */
    double *importance;       /* [L, H_kv] */
    double *token_cos;        /* [L, H, T] first prompt, per token */
    double *cos_attn;         /* [P, L] */
    double *cos_block;        /* [P, L] */
    double *layer_similarity; /* [L] mean over prompts of cos_attn */
    double *kendall_tau;      /* [P, P] */
    double *spearman_rho;     /* [P, P] */
    double seconds;           /* wall time of the forward passes with collectors */
    double tokens_per_s;
} kv_profile;

/* Pick `n_prompts` prompts of `prompt_len` tokens from a token stream (the tokenized text,
 * BOS first) deterministically: stratified start offsets, window i starting in the i-th
 * equal stretch of the stream at a position drawn from a xorshift generator seeded by `seed`.
 * Each prompt is BOS followed by prompt_len - 1 consecutive stream tokens (never starting on
 * the stream's own BOS). out: [n_prompts, prompt_len], caller-allocated. KV_EINPUT when the
 * stream is shorter than one prompt. */
int kv_profile_pick_prompts(const int *stream, long n, int bos_id, int n_prompts, int prompt_len,
                            uint64_t seed, int *out, kv_error *err);

/* Run the collectors over the prompts (full cache in KV type `kv_type`, one prefill per
 * prompt, on an engine on `device` with n_threads CPU threads, kv_engine_opts.n_threads: <= 0
 * the CPUs available). `tokens` [P, T] is copied into the profile. The caller owns
 * `out` (kv_profile_free). Progress ("prompt i of N, tokens/s") goes to `p` when not NULL.
 * kv_profile_run is kv_profile_run_tasks with tasks NULL (one process). */
int kv_profile_run(const kv_model *m, const int *tokens, int P, int T, kv_device device,
                   int n_threads, kv_cache_type kv_type, kv_profile *out, kv_progress *p,
                   kv_error *err);

/* The same with the prompts (in groups of at most ceil(P / (4 * ranks))) as tasks of
 * kv_tasks_run (kvplan/tasks.h): under MPI a collective call that every rank makes with the
 * same arguments; the ranks share the prompts, every rank leaves with the whole profile, and
 * every dataset is bit-identical to a one-process run's (each prompt runs in a fresh sequence
 * and its contributions are combined in prompt order); seconds and tokens_per_s are the wall
 * time of the whole run. Give `p` on rank 0 only. Errors: those of kv_profile_run, and the
 * first failing rank's (kv_tasks_agree / kv_tasks_run). */
int kv_profile_run_tasks(const kv_model *m, const int *tokens, int P, int T, kv_device device,
                         int n_threads, kv_cache_type kv_type, kv_tasks *tasks, kv_profile *out,
                         kv_progress *p, kv_error *err);
void kv_profile_free(kv_profile *pr);

/* Write the profile's datasets (docs/design.md "Files": /heads, /layers, /consistency, /prompts)
 * into an open file. Provenance and /hardware are written by the caller. */
int kv_profile_write(kv_h5 *f, const kv_profile *pr, kv_error *err);

/* Kendall's tau-b between two score vectors of length n (ties handled), O(n^2). */
double kv_kendall_tau(const double *a, const double *b, int n);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
