/* kvplan sensitivity planning (the planner's internal header): measured per-head loss curves, a
 * multiple-choice knapsack over them, refinement (planner/sensitivity.c; docs/design.md
 * "Sensitivity planning").
 *
 * Loss curves. For a target ratio R, context C, block size b_s, eviction block p and policy:
 * start from the uniform budgets (kv_uniform_budgets: R * C per head in whole blocks), set ONE
 * (layer, KV head) to a budget level b (a block multiple from the policy's floor, its fixed
 * part + p, up to C) and measure, on calibration chunks, the change of the mean next-token NLL
 * and the mean KL divergence from the full cache's next-token distribution:
 * delta_nll[h][q][k], kl[h][q][k] for head h (layer-major, l * H_kv + j), candidate policy q
 * and level k. Every perturbation is one sequence of a batched pass (kv_engine_chunk_score,
 * each sequence with its own budgets and policies), so the curves cost
 * ceil(H * Q * K / batch) passes per calibration chunk.
 *
 * Allocation. Choose one (policy, level) per head minimising the summed curve values subject to
 * sum of blocks = floor(R * L * H_kv * C / b_s) exactly (the uniform plan's total): a
 * multiple-choice knapsack (Sinha & Zoltners 1979), solved as a GLPK MIP with one binary per
 * (head, option) (kv_mckp_solve_mip); kv_mckp_solve_dp is the exact dynamic programme the tests
 * check it against. Between measured levels a curve is interpolated linearly in blocks.
 *
 * KV types. With o->types_mask the items of a head are (level, policy, KV storage
 * type): curve points (h, type, q, k) are measured directly, each as one sequence of the batch
 * storing head h in that type at that level (every other head at its base budget, policy and
 * type), so delta_nll and kl are [n_heads, T, Q, K]. The knapsack's weight is then the stored
 * bytes of the option, k * b_s * kv_type_token_bytes(type, d_h) (scales included), in a common
 * unit (the gcd of the types' block bytes, coarser with sizes rounded up when the table would
 * be large), and the bytes sum to at most the uniform plan's bytes (R * L * H_kv * C tokens in
 * the base type, in whole blocks); solved by kv_mckp_solve_dp_range. With one type equal to the
 * base type this is the tokens-only knapsack above, solution for solution.
 *
 * Refinement. The solution is verified by budgeted perplexity on the search chunks; the curves
 * are re-measured around it (base = the solution) and the knapsack solved again while the
 * search perplexity improves, for at most max_rounds rounds. Every round is recorded.
 *
 * Sparse curves (o->full_curves == 0, the default). Measuring every point costs
 * n_heads * T * Q * K sequences per calibration chunk and round, most of a search's work. A
 * measurement instead runs in passes over subsets of the points and fills the rest:
 *   pass 0 (around uniform): every other level of each head's reference curve (its base type),
 *     every third level of its other types' curves, always the top level and the base level;
 *   pass 1: an unmeasured level of a reference curve whose measured neighbours differ by more
 *     than KV_SENS_FLAT_TOL * base_kl (in the objective's curves: KL, NLL or both); where the
 *     curve is flat it is interpolated linearly in blocks;
 *   the other types' unmeasured levels: the reference curve plus the type's offset to it
 *     (quantisation's cost, measured at its anchors) interpolated linearly in blocks.
 * A refinement round (kv_sens_measure_around, on o->refine_chunks calibration chunks) runs
 * passes 0 and 1 on the reference curves only (each head's base type is then its solution's
 * type) and takes another type's curve as the new reference curve plus the offset between the
 * two types in the previous curves. token_evals counts every sequence that ran (the reference
 * prefill and the base budgets once per chunk and pass); nothing filled is counted.
 *
 * Arrays are row-major; everything a result owns is freed by its _free function. No global
 * state.
 */
#ifndef KVPLAN_PLANNER_SENSITIVITY_H
#define KVPLAN_PLANNER_SENSITIVITY_H

#include "kvplan/common.h"
#include "kvplan/engine.h"
#include "kvplan/h5io.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/sensitivity.h"
#include "kvplan/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kv_sens_opts, kv_sens_curves and kv_sens_result: kvplan/sensitivity.h (a search carries them). */

/* Measure the loss curves of every head around base budgets `base` [n_heads] tokens (NULL =
 * uniform at o->ratio) with base policies `base_policy` (NULL = o->policy), on n_chunks chunks
 * of C tokens at ids (ids[0 .. n_chunks * C)). `levels_blocks` [n_levels] (NULL = chosen from
 * the options: kv_sens_default_levels, plus each head's base level) in blocks. The engine must
 * run a full-cache plan with the same C, b_s and p, max_seqs >= 1 (the batch is capped at
 * max_seqs) and room for a full cache per sequence. With o->tasks the batched passes (one
 * task per batch and chunk, plus the base budgets per chunk) run as tasks, summed in chunk
 * order afterwards, so the curves equal a one-process run's bit for bit (kvplan/tasks.h).
 * Fills *out (kv_sens_curves_free).
 * Errors: KV_EINPUT for options the model cannot run (ratio, floors); errors of the engine. */
int kv_sens_measure(kv_engine *e, const kv_model *m, const int *ids, int n_chunks, const int *base,
                    const kv_policy *base_policy, const int *levels_blocks, int n_levels,
                    const kv_sens_opts *o, kv_sens_curves *out, kv_error *err);
/* kv_sens_measure with base types base_type [n_heads] (NULL = o->kv_type) and, with
 * o->types_mask, one curve per candidate type (docs above). */
int kv_sens_measure_typed(kv_engine *e, const kv_model *m, const int *ids, int n_chunks,
                          const int *base, const kv_policy *base_policy,
                          const kv_cache_type *base_type, const int *levels_blocks, int n_levels,
                          const kv_sens_opts *o, kv_sens_curves *out, kv_error *err);

/* kv_sens_measure_typed around base budgets with the curves of a previous measurement `prev`
 * (same heads, types, policies and levels) at prev's levels: sparse, the reference curves are
 * measured and the other types' follow them with prev's offsets (the header's "Sparse
 * curves"); with o->full_curves it is kv_sens_measure_typed. Errors: as kv_sens_measure_typed;
 * KV_EINPUT when prev's shape differs. */
int kv_sens_measure_around(kv_engine *e, const kv_model *m, const int *ids, int n_chunks,
                           const int *base, const kv_policy *base_policy,
                           const kv_cache_type *base_type, const kv_sens_curves *prev,
                           const kv_sens_opts *o, kv_sens_curves *out, kv_error *err);

/* A curve is flat between two measured levels when they differ by at most this fraction of the
 * base budgets' KL (nats per token, about 1e-3 of the loss the uniform cache adds). */
#define KV_SENS_FLAT_TOL 1e-3

/* The points of a sparse pass (planner/sens_points.c): want [n_heads * T * Q * K] gets 1 for
 * each point pass `pass` (0 or 1) runs, never one already known (known, same shape, 1 = measured
 * or below a floor); pass 1 reads the values of c measured so far and c->base_kl. prev: the
 * previous curves of a refinement round (pass 0 is then the window), NULL around uniform.
 * Returns the number of points wanted. */
int kv_sens_pick_points(const kv_sens_curves *c, const kv_sens_opts *o, int pass,
                        const kv_sens_curves *prev, const unsigned char *known,
                        unsigned char *want);
/* Fill the points of c that are not known (interpolation and type offsets, or with prev the
 * shifted previous curves; the header's "Sparse curves"). Errors: KV_EINPUT when prev's shape
 * differs, KV_EINTERNAL for memory. */
int kv_sens_fill_points(kv_sens_curves *c, const unsigned char *known, const kv_sens_curves *prev,
                        kv_error *err);
/* The token evaluations of verifying one solution on n_search search chunks. */
long kv_sens_verify_evals(const kv_sens_opts *o, int n_search);
/* The calibration chunks of a refinement round: o->refine_chunks (<= 0: calib) of the calib
 * chunks, all calib of them with o->full_curves. */
int kv_sens_refine_chunks(const kv_sens_opts *o, int calib);

/* The token evaluations of one curve measurement on n_chunks calibration chunks of o->context
 * tokens, the same point lists the measurement runs (sens_passes): around = 0, round 0's
 * kv_sens_measure_typed around the uniform budgets at the default levels; around = 1, one
 * refinement round's kv_sens_measure_around around a solution not known yet. Per chunk and
 * pass: the full cache's reference prefill, the base budgets and one sequence per point, C
 * tokens each; a pass with no point runs nothing.
 * *least: what always runs (full curves around uniform, and the sparse pass 0 around uniform:
 * exact; a refinement round: every head's base point among its anchors, which it skips).
 * *most: the most it can run (sparse: pass 1 measures every unmeasured reference-curve point
 * it can; a refinement round: no base point skipped). *passes (may be NULL): the forward
 * passes of *least (per chunk and pass the reference, the base, ceil(points / o->batch)).
 * m is read for its cfg only. Errors: those of kv_sens_measure_typed's options and uniform
 * budgets; KV_EINTERNAL for memory. */
int kv_sens_count(const kv_model *m, const kv_sens_opts *o, int n_chunks, int around, long *least,
                  long *most, long *passes, kv_error *err);

/* The default measured levels in blocks: every block multiple from the lowest policy floor
 * ceil((fixed + p) / b_s) to ceil(C / b_s) when there are at most max_levels, else a geometric
 * ladder between them that always contains the uniform level floor(R * C / b_s). *levels is
 * malloc'ed (caller frees). */
int kv_sens_default_levels(const kv_sens_opts *o, int **levels, int *n_levels, kv_error *err);

/* Multiple-choice knapsack: n_items groups of n_opts options; option (i, k) has cost
 * cost[i * n_opts + k] (non-finite = not allowed) and size size[i * n_opts + k] >= 0. Choose
 * exactly one option per group with sum of sizes == total, minimising the summed cost.
 * choice [n_items] gets the option indices, *objective the summed cost.
 * _mip: GLPK branch and bound, one binary per option (glp_intopt, exact gap 0).
 * _dp: dynamic programme over (group, size), O(n_items * total * n_opts) time.
 * Errors: KV_EINPUT when no choice meets the total (message says so); KV_EINTERNAL for GLPK
 * failures or memory. */
int kv_mckp_solve_mip(int n_items, int n_opts, const double *cost, const int *size, long total,
                      int *choice, double *objective, kv_error *err);
int kv_mckp_solve_dp(int n_items, int n_opts, const double *cost, const int *size, long total,
                     int *choice, double *objective, kv_error *err);
/* The same DP with min_total <= sum of sizes <= capacity (the cheapest choice of any such sum):
 * the knapsack over KV types, whose byte sums cannot always meet a total exactly. */
int kv_mckp_solve_dp_range(int n_items, int n_opts, const double *cost, const int *size,
                           long min_total, long capacity, int *choice, double *objective,
                           kv_error *err);

/* The allocation `sensitivity`: from curves c, one (policy, block level) per head with
 * sum(blocks) = floor(R * n_heads * C / b_s), minimising the summed objective (o->objective)
 * (KL or NLL; both counts as KL here) interpolated linearly in blocks between measured levels
 * (every block multiple from the policy's floor to ceil(C / b_s) is an option). budget [n_heads]
 * tokens, policy [n_heads]; *predicted (may be NULL) the summed predicted change. Errors as
 * kv_mckp_solve_mip. */
int kv_sens_allocate(const kv_sens_curves *c, const kv_sens_opts *o, int *budget, kv_policy *policy,
                     double *predicted, kv_error *err);
/* The allocation over (level, policy, KV type) from typed curves: type [n_heads] (may be NULL
 * for one type) gets each head's type. With several types (or one other than o->kv_type) the
 * weights are stored bytes and the byte sum is at most the uniform plan's
 * (floor(R * n_heads * C / b_s) blocks of the base type), solved by kv_mckp_solve_dp_range; with
 * the base type alone this is kv_sens_allocate. Errors as kv_mckp_solve_dp_range. */
int kv_sens_allocate_typed(const kv_sens_curves *c, const kv_sens_opts *o, int *budget,
                           kv_policy *policy, kv_cache_type *type, double *predicted,
                           kv_error *err);

/* Sensitivity planning end to end: curves on the first o->calib_chunks of the n_search search
 * chunks at ids, knapsack, verification by budgeted perplexity on all search chunks, and up to
 * o->max_rounds - 1 refinements (re-measure around the kept solution, solve again) while the
 * search perplexity improves. uniform_ppl: the uniform plan's search perplexity when known
 * (NaN = measure it). The kept solution is the best of the rounds; it may be the uniform
 * budgets when no round beat them (then best_round = -1). With o->tasks the curves and each
 * verification (one task per search chunk) run as tasks. Fills *r (kv_sens_result_free). */
int kv_sens_search(kv_engine *e, const kv_model *m, const int *ids, int n_search,
                   double uniform_ppl, const kv_sens_opts *o, kv_sens_result *r, kv_error *err);

/* Write /sensitivity: levels [K] (blocks; attribute block_size and `tokens` = levels in
 * tokens), delta_nll and kl ([L, H_kv, K] for one policy, [L, H_kv, Q, K] for several), base
 * [L, H_kv] tokens, attributes ratio, policy, policies, objective, calibration_tokens,
 * token_evals, seconds, base_nll, base_kl; /sensitivity/rounds/perplexity and predicted
 * [rounds], attributes best_round and uniform_perplexity; /sensitivity/budget and
 * /sensitivity/policy [L, H_kv] (the sensitivity allocation's solution, even when another
 * allocation won the search), /sensitivity/kv_type [L, H_kv] (its types; attributes kv_type,
 * the base type, and kv_types, the candidates), the curves with a type axis [L, H_kv, T, (Q,) K]
 * when there are several candidate types. */
int kv_sens_write(kv_h5 *f, int n_layers, int n_kv_heads, const kv_sens_opts *o,
                  const kv_sens_result *r, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
