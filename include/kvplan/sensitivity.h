/* kvplan sensitivity planning, its public face: the options a search runs it with
 * (kv_search_opts.sens), the measured loss curves and the result a search returns
 * (kv_search_result.sens). The method (per-head loss curves, the multiple-choice knapsack
 * over them, refinement) and the functions that run it are the planner's: planner/sensitivity.h
 * and docs/design.md "Sensitivity planning".
 *
 * Arrays are row-major; everything a result owns is freed by its _free function.
 */
#ifndef KVPLAN_SENSITIVITY_H
#define KVPLAN_SENSITIVITY_H

#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/h5io.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif
KV_API_BEGIN

#define KV_SENS_MAX_POLICIES 4

/* What the knapsack minimises: the KL increase, the NLL change, or both (one knapsack each,
 * both solutions verified on the search tokens, the better kept). */
typedef enum { KV_SENS_OBJ_KL = 0, KV_SENS_OBJ_NLL = 1, KV_SENS_OBJ_BOTH = 2 } kv_sens_objective;

typedef struct kv_sens_opts {
    double ratio;     /* R in (0, 1] */
    int context;      /* C */
    int block_size;   /* b_s */
    int evict_block;  /* Batch-Max p */
    kv_policy policy; /* the base policy (every head in the uniform start) */
    kv_policy policies[KV_SENS_MAX_POLICIES]; /* candidate policies of a head (n_policies) */
    int n_policies;                           /* 0 = {policy} */
    int max_levels;    /* measured levels per curve (default 16); all when fewer exist */
    int batch;         /* perturbations per batched pass (default 32) */
    int calib_chunks;  /* calibration chunks: the first of the search chunks (default 2) */
    int max_rounds;    /* solve rounds (1 = no refinement; default 3) */
    int refine_chunks; /* calibration chunks of a refinement round's curves (the first of them;
                        * 0 = calib_chunks; default 1; ignored with full_curves) */
    kv_sens_objective objective; /* what the knapsack minimises (default KL) */
    int full_curves;       /* 1: measure every curve point (every head, type, policy and level) in
                            * every round, the costlier old path (--sens-full); 0 (default): measure a
                            * subset and fill the rest (planner/sensitivity.h, "Sparse curves") */
    kv_cache_type kv_type; /* the base KV type: every head of the uniform start (f16) */
    int types_mask;        /* bit t: a head may be stored in KV type t; 0 = the base type only (the
                            * tokens-only knapsack). The engine must hold blocks of every type
                            * (kv_engine_opts.type_mask). */
    kv_progress *progress; /* NULL = silent */
    kv_tasks *tasks;       /* NULL: one process; else the batched passes and the verification chunks
                            * run as tasks (kvplan/tasks.h), over MPI ranks when there are several:
                            * a collective call then (every rank calls with the same arguments and
                            * gets the same result, identical to one process's) */
} kv_sens_opts;

/* Defaults: R 0.5, C = model seq_len (256 without a model), b_s 16, p 16, sink, max_levels 16,
 * batch 32, 2 calibration chunks (1 in refinement rounds), 3 rounds, objective KL, sparse curves
 * (full_curves 0), base
 * type f16, types_mask 0, no progress, one process. */
void kv_sens_opts_default(kv_sens_opts *o, const kv_model *m);

typedef struct kv_sens_curves {
    int n_heads;    /* L * H_kv */
    int n_policies; /* Q */
    int n_levels;   /* K */
    int n_types;    /* T (1 without a types_mask) */
    int head_dim;   /* d_h, for the bytes of a type */
    kv_policy policies[KV_SENS_MAX_POLICIES];
    kv_cache_type types[KV_CACHE_TYPES]; /* [T] the candidate types, in code order */
    int *levels; /* [K] budget levels in blocks (tokens = min(b_s * k, C)), owned */
    int *base;   /* [n_heads] base budgets (tokens) the perturbations start from, owned */
    kv_policy *base_policy;   /* [n_heads], owned */
    kv_cache_type *base_type; /* [n_heads], owned */
    double *delta_nll;        /* [n_heads, T, Q, K] change of mean NLL, nats/token; NaN below a
                                 policy's floor; owned */
    double *kl;               /* [n_heads, T, Q, K] mean KL(full || perturbed), nats; owned */
    double base_nll, base_kl; /* of the base budgets (mean per scored token) */
    long tokens;              /* calibration tokens (chunks x C) */
    long token_evals;         /* tokens evaluated for the curves */
    double seconds;           /* wall seconds of the measurement (kv_now) */
    double cpu_seconds;       /* CPU seconds of the process meanwhile (kv_cpu_now) */
} kv_sens_curves;
void kv_sens_curves_free(kv_sens_curves *c);

typedef struct kv_sens_result {
    kv_sens_curves curves; /* the first round's curves (around uniform), owned */
    int rounds;            /* solves run */
    double *round_ppl;     /* [rounds] search perplexity of each round's solution, owned */
    double *round_pred;    /* [rounds] predicted objective change of each solution, owned */
    int *round_obj;        /* [rounds] the objective whose solution the round kept, owned */
    int best_round;        /* 0-based round of the kept solution */
    int *budget;           /* [n_heads] kept budgets (tokens), owned */
    kv_policy *policy;     /* [n_heads] kept policies, owned */
    kv_cache_type *type;   /* [n_heads] kept KV types, owned */
    double ppl;            /* its search perplexity */
    double uniform_ppl;    /* the uniform plan's search perplexity (the start) */
    long token_evals;      /* curves + verification, tokens */
    double seconds;
} kv_sens_result;
void kv_sens_result_free(kv_sens_result *r);

KV_API_END
#ifdef __cplusplus
}
#endif
#endif
