/* kvplan plan: the one in-memory form of a KV budget plan, and the one module that reads,
 * writes, validates and defines plans (docs/design.md "One engine, one plan, several backends";
 * plan.h5 schema v1 and v2 in docs/formats.md and plans/README.md).
 *
 * A plan gives every (layer, KV head) a budget B[l][j] in tokens and an eviction policy, for
 * chunks/sequences of context C, KV blocks of b_s tokens and Batch-Max eviction blocks of p
 * tokens. The planner returns one (kv_plan_from_budgets), the engine runs one (kv_engine_new),
 * plan.h5 stores one (kv_plan_write / kv_plan_read). "Uniform at ratio R" is defined here once
 * (kv_plan_uniform) and used by `eval --ratio`, the search's uniform baseline and `kvplan plan
 * --allocation uniform` alike.
 *
 * Arrays [L, H_kv] are row-major (layer-major): element (l, j) at l * H_kv + j. Budgets are
 * tokens (int32). Everything a plan owns is released by kv_plan_free. No global state.
 */
#ifndef KVPLAN_PLAN_H
#define KVPLAN_PLAN_H

#include "kvplan/common.h"
#include "kvplan/h5io.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

/* Schema of the plan files this build writes (v2 adds /budget/policy [L, H_kv]; v3 adds
 * /budget/kv_type [L, H_kv] and measures the ratio in bytes); v1 files (one policy for every
 * head) and v2 files stay readable: their heads are f32 (the only type of the runtime that
 * wrote them) and their stored token ratio r becomes the byte ratio 2 r (docs/formats.md). */
#define KV_PLAN_SCHEMA_VERSION 3

/* The largest ratio: a full f32 cache is twice the F16 reference. */
#define KV_PLAN_MAX_RATIO 2.0

typedef struct kv_plan {
    int n_layers, n_kv_heads; /* L, H_kv */
    int context;              /* C: tokens per chunk / sequence the budgets refer to */
    int block_size;           /* b_s tokens per KV block */
    int evict_block;          /* Batch-Max p: tokens processed between evictions */
    double ratio;             /* R: stored bytes / the full F16 cache's bytes:
                               * sum_i B_i * token_bytes(T_i) = R * L * H_kv * C * 2 * d_h * 2,
                               * within one block per head; for F16 heads the token fraction */
    kv_policy policy;         /* the plan's default policy (root attribute `policy`) */
    kv_policy *head_policy;   /* [L * H_kv] the policy of each head, owned */
    int *budget;              /* [L * H_kv] B[l][j] tokens, owned; each in [1, C] */
    kv_cache_type *kv_type;   /* [L * H_kv] KV storage type of each head, owned */
    int full;                 /* 1 when every budget is C: the full cache, nothing evicted */
    char allocation[32];      /* "full", "uniform", "squeeze", "baklava", ... */
    double t, r, p;           /* BaKlaVa threshold / reduction, SqueezeAttention p; NaN unused */
    int min_tokens;           /* the floor the planner used (0 = not recorded) */
    /* identity of the model the plan was made for ("" / 0 when made in memory) */
    char model_sha256[65];
    int model_dim, model_n_heads, model_head_dim, model_vocab_size;
    int schema_version; /* of the file it was read from; KV_PLAN_SCHEMA_VERSION otherwise */
    int budget_sha256;  /* read from a file: 1 when it had /budget@sha256 (and it matched), 0
                         * when it had none (older plans: nothing protects its types/policies) */
    char source[1024];  /* the file it was read from, "" when made in memory */
} kv_plan;

/* The full cache as a plan: every head keeps C tokens (R = 1), policy `policy`, b_s, p.
 * Fills *out (kv_plan_free). Errors: KV_EINPUT for C < 1, b_s outside [1, 4096], p outside
 * [1, C]; KV_EINTERNAL out of memory. */
int kv_plan_full(const kv_config *cfg, int context, int block_size, int evict_block,
                 kv_policy policy, kv_plan *out, kv_error *err);

/* THE definition of "uniform at ratio R" (docs/design.md Planning 1-3 with equal heads): the total
 * N = floor(R * L * H_kv * C / b_s) blocks is shared as evenly as whole blocks allow, head i
 * (layer-major) getting floor((i + 1) N / n) - floor(i N / n) blocks, n = L * H_kv (so the
 * heads differ by at most one block, the extra blocks spread evenly over the layers); a head
 * keeps b_s * blocks tokens, capped at C. This is the exact-sum, least-absolute-deviation
 * rounding of R * C per head (docs/design.md Planning 3), solved in closed form.
 * Errors KV_EINPUT: R outside (0, 1]; a head below the policy's floor (fixed part + p) or
 * below one block, naming the ratio to pass instead. Fills *out (kv_plan_free). */
/* The arithmetic of kv_plan_uniform alone, for n heads: tokens [n] (and blocks [n], may be
 * NULL). No floor check. KV_EINPUT for R outside (0, 1] or sizes below 1. */
int kv_uniform_budgets(int n, double ratio, int context, int block_size, int *tokens, int *blocks,
                       kv_error *err);
int kv_plan_uniform(const kv_config *cfg, double ratio, int context, int block_size,
                    int evict_block, kv_policy policy, kv_plan *out, kv_error *err);
/* Uniform at byte ratio R with every head of type t: the token fraction
 * r = R * token_bytes(f16) / token_bytes(t) (capped at 1) is shared as kv_plan_uniform shares
 * R, and the plan records the byte ratio its budgets keep (R, or less when r was capped).
 * kv_plan_uniform is this with t = KV_TYPE_F16 (r = R). Errors as kv_plan_uniform. */
int kv_plan_uniform_typed(const kv_config *cfg, double ratio, kv_cache_type t, int context,
                          int block_size, int evict_block, kv_policy policy, kv_plan *out,
                          kv_error *err);
/* The token fraction of byte ratio R for heads of type t at head size d_h (see above). */
double kv_type_token_ratio(double ratio, kv_cache_type t, int head_dim);

/* A plan from per-head budgets (the planner's result): budget [L * H_kv] tokens (copied),
 * one policy for all heads (head_policy NULL) or per head [L * H_kv] (copied). allocation,
 * t, r, p and min_tokens are recorded as given. The plan is validated (kv_plan_validate).
 * Fills *out (kv_plan_free). */
int kv_plan_from_budgets(const kv_config *cfg, const int *budget, const kv_policy *head_policy,
                         kv_policy policy, double ratio, int context, int block_size,
                         int evict_block, const char *allocation, double t, double r, double p,
                         int min_tokens, kv_plan *out, kv_error *err);
/* kv_plan_from_budgets with per-head KV types [L * H_kv] (copied; NULL: f16); ratio is then
 * the byte ratio R over the full F16 cache that the typed budgets keep (validated). */
int kv_plan_from_budgets_typed(const kv_config *cfg, const int *budget,
                               const kv_policy *head_policy, const kv_cache_type *types,
                               kv_policy policy, double ratio, int context, int block_size,
                               int evict_block, const char *allocation, double t, double r,
                               double p, int min_tokens, kv_plan *out, kv_error *err);

/* Validate a plan: L, H_kv >= 1; C >= 2; b_s in [1, 4096]; p in [1, C]; R finite in (0, 2];
 * every budget in [1, C] and at least its policy's fixed part + p (unless it is C, which never
 * evicts); every policy and KV type known; the stored bytes sum_i B_i * token_bytes(T_i)
 * within one block per head (b_s * token_bytes(T_i) each) of R times the full F16 cache (a plan
 * that claims a ratio it does not keep is refused). `what` names the plan in messages (its
 * file); every error is KV_EINPUT and says which head or value fails and what to do. */
int kv_plan_validate(const kv_plan *p, const char *what, kv_error *err);

/* Refuse a plan made for another model: a different config (L, H_kv, dim, H, d_h, vocab) or a
 * different model_sha256. A plan read from a file must name its model (an empty sha256 is an
 * error); a plan made in memory (source "") is only checked for shape. KV_EINPUT names both. */
int kv_plan_check_model(const kv_plan *p, const kv_model *m, kv_error *err);

/* Read plan.h5 (schema v1, v2 or v3) and validate it (kv_plan_validate, and /budget/blocks must
 * equal ceil(tokens / b_s) per head; fractional, NaN or out-of-range budgets are refused).
 * When /budget has the attribute sha256 it must equal kv_plan_budget_sha256 of what was read
 * (a flipped bit in a type or policy code is refused); a file without it is read as before
 * and out->budget_sha256 is 0 (callers print a note).
 * Errors KV_EINPUT name the file and the dataset or attribute. Fills *out (kv_plan_free). */
int kv_plan_read(const char *path, kv_plan *out, kv_error *err);

/* SHA-256 (OpenSSL) of a plan's per-head content, as 64 hex digits + NUL into hex: the bytes
 * "kvplan budget 1\0", L and H_kv, then per head (layer-major) its tokens, blocks, policy code
 * and KV type code, each int32 little-endian: what /budget/tokens, /budget/blocks,
 * /budget/policy and /budget/kv_type hold. Written by kv_plan_write as /budget@sha256.
 * KV_EINTERNAL when memory runs out. */
int kv_plan_budget_sha256(const kv_plan *p, char hex[65], kv_error *err);

/* Write the plan's part of plan.h5 into an open file: root attributes ratio, context_length,
 * block_size, evict_block, policy, allocation, t, r, p, min_tokens (when > 0), plan_schema;
 * /budget/tokens, /budget/blocks [L, H_kv] int32, /budget/policy [L, H_kv] int32 (codes of
 * kv_policy, named in its `codes` attribute) and /budget/kv_type [L, H_kv] int32 (codes of
 * kv_cache_type, named in its `codes` attribute) and /budget@sha256 (kv_plan_budget_sha256).
 * Provenance (model identity) is written by kv_h5_write_provenance. */
int kv_plan_write(kv_h5 *f, const kv_plan *p, kv_error *err);

/* Deep copy (dst is overwritten; kv_plan_free it). */
int kv_plan_copy(kv_plan *dst, const kv_plan *src, kv_error *err);

/* Release the arrays and zero the struct; safe twice and on a zeroed plan. */
void kv_plan_free(kv_plan *p);

/* Blocks of head i: ceil(B_i / b_s). */
static inline int kv_plan_head_blocks(const kv_plan *p, int i) {
    return (p->budget[i] + p->block_size - 1) / p->block_size;
}
/* Total budget sum(B) in tokens. */
long kv_plan_total_tokens(const kv_plan *p);
/* Bytes the budgets keep: sum_i B_i * kv_type_token_bytes(T_i, d_h) (d_h: model_head_dim). */
double kv_plan_bytes(const kv_plan *p);
/* The ratio reference: the full F16 cache, L * H_kv * C * 2 * d_h * 2 bytes. */
double kv_plan_full_f16_bytes(const kv_plan *p);
/* Set every head's KV type to t keeping the budgets; the ratio becomes the byte ratio the
 * budgets keep in t (kv_plan_bytes / kv_plan_full_f16_bytes). */
void kv_plan_set_kv_type(kv_plan *p, kv_cache_type t);
/* 1 when the heads have more than one KV type; the type of head 0 in *first. */
int kv_plan_mixed_types(const kv_plan *p, kv_cache_type *first);
/* 1 when some head has a policy other than the plan's default. */
int kv_plan_mixed_policies(const kv_plan *p);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
