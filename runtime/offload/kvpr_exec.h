/* kvplan KVPR executor (CPU path): rebuild one decoder layer's K and V from an offloaded
 * cache that holds the activations of the first l tokens and the K, V of the rest, then
 * attend (docs/design.md Runtime, KVPR execution; KVPR, Jiang et al., §3.2-3.3 and Eq. 6-11).
 *
 * KVPR keeps layer i's KV cache in host memory. At a decode step the device receives
 *   X[0:l]       = RMSNorm(x_in[0:l]) of the layer (the input of the K/V projections), and
 *   K[l:s'], V[l:s'] of the remaining tokens,
 * recomputes K[0:l] = X[0:l] W_K^T (+ b_K, then RoPE at positions 0..l-1) and
 * V[0:l] = X[0:l] W_V^T (+ b_V) (Eq. 7) on one stream while the other stream copies
 * K, V [l:s'] over the link (Eq. 6), and attends over the merged K, V [0:s'].
 *
 * This file is the plain-C logic any device path shares. The recomputation is one CBLAS
 * GEMM for K and one for V over the l rows (N = 4 l h h_kv FLOPs, Eq. 8); memcpy stands in
 * for the PCIe transfer of M_KV = 2 (s' - l) h_kv p bytes (Eq. 6, GQA form as in
 * kvplan/kvpr.h). Each part is timed on its own with kv_now(), giving the measured
 * t_recompute (Eq. 9) and t_transfer (M_KV / v_com) that the split model of Eq. 10-11
 * balances. The split l is an argument: the planner (kvplan/kvpr.h) chooses it, and the
 * runtime does not depend on the planner.
 *
 * Shapes are row-major fp32, one sequence (b = 1). Widths: h = cfg.dim, h_kv = H_kv * d_h.
 * Positions are 0..s'-1: the offloaded tokens are the sequence's first s' tokens, none
 * evicted. K is stored post-RoPE (as the ordinary cache holds it), V as projected.
 * Units: seconds (kv_now), bytes, FLOPs.
 */
#ifndef KVPLAN_KVPR_EXEC_H
#define KVPLAN_KVPR_EXEC_H

#include "kvplan/common.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's offloaded cache for one sequence, as it sits in host memory.
 *   x [split, dim]                 X = RMSNorm(x_in) of tokens 0..split-1 (NULL when split = 0)
 *   k [seq - split (+ spare), kvw] post-RoPE K of tokens split..seq-1 (NULL when none)
 *   v [seq - split (+ spare), kvw] V of tokens split..seq-1
 * The struct owns x, k and v (malloc'ed; kv_kvpr_layer_free). A caller filling one by hand
 * may point x/k/v at its own memory (cap_tail = 0) for kv_kvpr_rebuild, but must then not pass
 * it to kv_kvpr_decode (which grows k and v with realloc) or kv_kvpr_layer_free. */
typedef struct kv_kvpr_layer {
    int layer;    /* decoder layer index, 0..n_layers-1 */
    int seq;      /* s': tokens held, positions 0..s'-1 */
    int split;    /* l: tokens held as activations (recomputed), 0 <= l <= s' */
    int dim;      /* h, width of one X row */
    int kv_width; /* h_kv = H_kv * d_h, width of one K or V row */
    float *x, *k, *v;
    int cap_tail; /* rows allocated in k and v (>= seq - split) */
} kv_kvpr_layer;

/* Bytes and FLOPs of one rebuild at p = sizeof(float) (Eq. 6, 8) and the measured times. */
typedef struct kv_kvpr_timing {
    double t_recompute;       /* s, the two GEMMs + bias + RoPE over l rows (Eq. 9, measured) */
    double t_transfer;        /* s, the copy of K, V [l:s'] (M_KV / v_com, measured) */
    double t_total;           /* s, wall time of the whole rebuild */
    double bytes_activations; /* M_X = l h p */
    double bytes_kv;          /* M_KV = 2 (s' - l) h_kv p */
    double flops;             /* N = 4 l h h_kv */
} kv_kvpr_timing;

/* Offload layer `layer` of a prefilled sequence cache with split l: X = RMSNorm(x_in[0:l])
 * with the layer's attention norm (the same arithmetic as the forward pass), K, V of tokens
 * l..s'-1 gathered from the paged cache, where s' = the layer's retained entries.
 *   x_in [>= l rows, dim] the residual entering the layer for tokens 0..l-1 (kv_hooks
 *        after_attn x_in); may be NULL when l = 0.
 * *out is filled and owns its buffers (kv_kvpr_layer_free), also zeroed on failure.
 * Errors KV_EINPUT: layer out of range; l < 0 or l > s'; x_in NULL with l > 0; a head that
 * evicted entries (its positions are not exactly 0..s'-1) or heads of unequal length; a
 * cache whose head size or layer/head counts differ from the model. KV_EINTERNAL: memory. */
int kv_kvpr_layer_offload(const kv_model *m, const kv_cache *c, int layer, const float *x_in,
                          int split, kv_kvpr_layer *out, kv_error *err);
/* Release x, k, v and zero the struct (NULL is fine). */
void kv_kvpr_layer_free(kv_kvpr_layer *lc);

/* X = RMSNorm(x_in) for `rows` rows with layer `layer`'s attention norm: out [rows, dim]. */
void kv_kvpr_activations(const kv_model *m, int layer, const float *x_in, int rows, float *out);

/* Executor scratch for one model: RoPE tables for positions 0..max_ctx-1, the rebuilt K, V
 * of one layer and decode buffers. Caller owns it (kv_kvpr_exec_free); not shared between
 * threads. max_ctx is the most entries one rebuilt layer holds, the decoded token included
 * (positions beyond the model's trained context are allowed). KV_EINPUT when max_ctx < 1;
 * KV_EINTERNAL when memory runs out. */
typedef struct kv_kvpr_exec kv_kvpr_exec;
int kv_kvpr_exec_new(const kv_model *m, int max_ctx, kv_kvpr_exec **out, kv_error *err);
void kv_kvpr_exec_free(kv_kvpr_exec *e);

/* Rebuild the layer's full K, V [s', h_kv] into k_out, v_out (caller-allocated, s' * h_kv
 * floats each): rows 0..l-1 recomputed from X (Eq. 7: one sgemm each, bias, RoPE at the
 * row's position), rows l..s'-1 copied from lc->k, lc->v. With overlap = 1 the two parts run
 * concurrently on two OpenMP threads (the two streams); with 0 one after the other. Either
 * way the result is the same bits. `t` (may be NULL) receives the timings.
 * Errors KV_EINPUT: the layer cache is inconsistent with the model (layer, widths), l < 0 or
 * l > s', x NULL with l > 0, k/v NULL with l < s', s' > max_ctx, NULL outputs. */
int kv_kvpr_rebuild(kv_kvpr_exec *e, const kv_kvpr_layer *lc, float *k_out, float *v_out,
                    int overlap, kv_kvpr_timing *t, kv_error *err);

/* One decode step of the whole model for token `token` at position s' with every layer's KV
 * cache offloaded: for each layer, rebuild its K, V (kv_kvpr_rebuild, overlap as given) into
 * a scratch paged cache and run the engine's layer step (kv_forward_layer: the same
 * projections, attention kernel and FFN as ordinary decode) for the new token; then the final
 * norm and classifier into logits [vocab]. The new token's K and V are appended to each
 * layer's transferred part (s' grows by one; l stays). per_layer [n_layers] (may be NULL)
 * receives each layer's rebuild timings.
 * Errors (checked before any layer runs, so a failure leaves every cache unchanged):
 * KV_EINPUT for a token outside the vocabulary, layers that are not 0..L-1 in order or hold
 * different s', s' + 1 > max_ctx, or any rebuild error; KV_EINTERNAL when growing a cache
 * fails. */
int kv_kvpr_decode(kv_kvpr_exec *e, kv_kvpr_layer *layers, int token, float *logits, int overlap,
                   kv_kvpr_timing *per_layer, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
