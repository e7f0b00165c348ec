/* Batch sizing (Batch-Max §3-4, docs/design.md Planning 6), the KV memory arithmetic (article 003)
 * and the /kvpr and /batch groups of plan.h5. See include/kvplan/batch.h. */
#include "kvplan/batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_kv_cache_bytes(long n_layers, long n_kv_heads, long head_dim, long seq_len, long batch,
                      double dtype_bytes, double *bytes, kv_error *err) {
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || seq_len < 1 || batch < 1)
        return kv_fail(err, KV_EINPUT,
                       "KV memory needs positive counts (L %ld, H_kv %ld, d_h %ld, S %ld, B %ld)",
                       n_layers, n_kv_heads, head_dim, seq_len, batch);
    if (!(dtype_bytes > 0) || !isfinite(dtype_bytes))
        return kv_fail(err, KV_EINPUT, "bytes per element %g: need a positive number", dtype_bytes);
    *bytes = 2.0 * (double)n_layers * (double)n_kv_heads * (double)head_dim * (double)seq_len *
             (double)batch * dtype_bytes;
    return KV_OK;
}

void kv_batch_config_from_model(const kv_model *m, double p, kv_batch_config *c) {
    memset(c, 0, sizeof *c);
    const kv_config *k = &m->cfg;
    c->n_layers = k->n_layers;
    c->n_heads = k->n_heads;
    c->n_kv_heads = k->n_kv_heads;
    c->head_dim = k->head_dim;
    c->hidden = k->dim;
    c->ffn_hidden = k->hidden_dim;
    c->vocab = k->vocab_size;
    c->n_params = (double)kv_model_param_count(m);
    c->read_params = (double)kv_model_read_param_count(m);
    c->weight_bytes = p;
    c->dtype_bytes = p;
    c->block_size = 16;
    c->evict_block = 16;
}

const char *kv_batch_mode_name(kv_batch_mode m) {
    switch (m) {
    case KV_BATCH_FULL:
        return "full";
    case KV_BATCH_DECODE_ONLY:
        return "decode_only";
    case KV_BATCH_PREFILL_DECODE:
        return "prefill_decode";
    default:
        return "?";
    }
}

double kv_workspace_bytes_per_seq(const kv_batch_config *c, long tokens, long ctx) {
    double per_token = 3.0 * (double)c->hidden + 2.0 * (double)c->n_heads * (double)c->head_dim +
                       2.0 * (double)c->n_kv_heads * (double)c->head_dim +
                       2.0 * (double)c->ffn_hidden;
    return (double)tokens * per_token * c->dtype_bytes + (double)c->n_heads * (double)ctx * 4.0 +
           (double)c->vocab * 4.0;
}

static long ceil_div(long a, long b) {
    return (a + b - 1) / b;
}

/* Bytes one token takes in head i: K and V, in the head's stored type when given. */
static double token_bytes(const kv_batch_config *c, long i) {
    if (c->kv_type) return (double)kv_type_token_bytes(c->kv_type[i], (int)c->head_dim);
    return 2.0 * (double)c->head_dim * c->dtype_bytes;
}

/* Bytes of one block of head i: K and V of b_s tokens of one (layer, KV head). */
static double block_bytes(const kv_batch_config *c, long i) {
    return (double)c->block_size * token_bytes(c, i);
}

/* KV bytes of one sequence when every head holds `len` entries (or, with budgets, at most
 * its budget plus the eviction block), counted in whole blocks. */
static double kv_held(const kv_batch_config *c, long len, const int *budget) {
    long heads = c->n_layers * c->n_kv_heads;
    double bytes = 0;
    for (long i = 0; i < heads; i++) {
        long n = len;
        if (budget && (long)budget[i] + c->evict_block < n) n = (long)budget[i] + c->evict_block;
        bytes += (double)ceil_div(n, c->block_size) * block_bytes(c, i);
    }
    return bytes;
}

/* Largest number of entries any head attends over: min(max B + e, len) with budgets. */
static long ctx_held(const kv_batch_config *c, long len, const int *budget) {
    if (!budget) return len;
    long heads = c->n_layers * c->n_kv_heads, mx = 0;
    for (long i = 0; i < heads; i++) {
        long n = (long)budget[i] + c->evict_block;
        if (n > mx) mx = n;
    }
    return mx < len ? mx : len;
}

/* Entries read by a decode step with `len` cached tokens: per head min(B, len) (or len). */
static double kv_read(const kv_batch_config *c, long len, const int *budget) {
    long heads = c->n_layers * c->n_kv_heads;
    double bytes = 0;
    for (long i = 0; i < heads; i++)
        bytes += (double)(budget && budget[i] < len ? budget[i] : len) * token_bytes(c, i);
    return bytes;
}

static int check_config(const kv_batch_config *c, kv_error *err) {
    if (c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->head_dim < 1 ||
        c->hidden < 1 || c->ffn_hidden < 1 || c->vocab < 1)
        return kv_fail(err, KV_EINPUT, "batch sizing needs a model shape with positive sizes");
    if (!(c->dtype_bytes > 0) || !(c->weight_bytes > 0) || !isfinite(c->dtype_bytes) ||
        !isfinite(c->weight_bytes))
        return kv_fail(err, KV_EINPUT, "bytes per element (%g) and per weight (%g) must be > 0",
                       c->dtype_bytes, c->weight_bytes);
    if (!(c->device_mem > 0) || !isfinite(c->device_mem))
        return kv_fail(err, KV_EINPUT, "device memory %g bytes: need a positive figure",
                       c->device_mem);
    if (c->mem_bw < 0 || !isfinite(c->mem_bw))
        return kv_fail(err, KV_EINPUT,
                       "memory bandwidth %g bytes/s: need a finite figure >= 0 (0 = unknown)",
                       c->mem_bw);
    if (c->prompt_len < 1)
        return kv_fail(err, KV_EINPUT, "prompt length %ld: need >= 1", c->prompt_len);
    if (c->gen_len < 1)
        return kv_fail(err, KV_EINPUT, "generation length %ld: need >= 1", c->gen_len);
    if (c->block_size < 1 || c->evict_block < 1)
        return kv_fail(err, KV_EINPUT, "block size %d and eviction block %d must be >= 1",
                       c->block_size, c->evict_block);
    if (c->budget) {
        long heads = c->n_layers * c->n_kv_heads;
        for (long i = 0; i < heads; i++)
            if (c->budget[i] < 1)
                return kv_fail(err, KV_EINPUT,
                               "budget of layer %ld KV head %ld is %d tokens: "
                               "need >= 1",
                               i / c->n_kv_heads, i % c->n_kv_heads, c->budget[i]);
    }
    return KV_OK;
}

/* Fill the decode-throughput part of a row for its max_batch. */
static void predict_decode(const kv_batch_config *c, const int *budget, kv_batch_row *r) {
    double total = 0, kv_sum = 0, wread = c->read_params * c->weight_bytes;
    for (long t = 1; t <= c->gen_len; t++) {
        double kv = kv_read(c, c->prompt_len + t - 1, budget);
        kv_sum += kv;
        if (c->mem_bw > 0) total += (wread + (double)r->max_batch * kv) / c->mem_bw;
    }
    r->kv_read_mean = kv_sum / (double)c->gen_len;
    if (c->mem_bw > 0 && r->max_batch > 0) {
        r->step_time = total / (double)c->gen_len;
        r->tokens_per_s = (double)r->max_batch * (double)c->gen_len / total;
    }
}

int kv_batch_size(const kv_batch_config *c, kv_batch_result *out, kv_error *err) {
    memset(out, 0, sizeof *out);
    int rc = check_config(c, err);
    if (rc) return rc;
    out->weights = c->n_params * c->weight_bytes;
    out->free_for_batch = c->device_mem - out->weights;
    if (out->free_for_batch <= 0)
        return kv_fail(err, KV_EINPUT,
                       "device memory %.0f bytes is below the weights %.0f bytes (%.0f parameters "
                       "x %g bytes): no batch fits",
                       c->device_mem, out->weights, c->n_params, c->weight_bytes);
    long s = c->prompt_len, total = c->prompt_len + c->gen_len;
    for (int m = 0; m < KV_BATCH_NMODES; m++) {
        kv_batch_row *r = &out->row[m];
        const int *budget = m == KV_BATCH_FULL ? NULL : c->budget;
        if (m != KV_BATCH_FULL && !c->budget) continue;
        r->available = 1;
        if (m == KV_BATCH_PREFILL_DECODE) {
            /* Alg. 1: blocks of e tokens, each head evicts down to B before a block */
            long blk = c->evict_block < s ? c->evict_block : s;
            r->kv_prefill = kv_held(c, s, budget);
            r->ws_prefill = kv_workspace_bytes_per_seq(c, blk, ctx_held(c, s, budget));
        } else {
            /* the whole prompt at once, its full cache resident until prefill ends */
            r->kv_prefill = kv_held(c, s, NULL);
            r->ws_prefill = kv_workspace_bytes_per_seq(c, s, s);
        }
        r->kv_decode = kv_held(c, total, budget);
        r->ws_decode = kv_workspace_bytes_per_seq(c, 1, ctx_held(c, total, budget));
        double pre = r->kv_prefill + r->ws_prefill, dec = r->kv_decode + r->ws_decode;
        r->prefill_limits = pre > dec;
        r->per_seq = r->prefill_limits ? pre : dec;
        double b = floor(out->free_for_batch / r->per_seq);
        r->max_batch = b > 1e15 ? (long)1e15 : (long)b;
        predict_decode(c, budget, r);
    }
    return KV_OK;
}

/* ---- plan.h5 /kvpr and /batch ---- */

/* /kvpr of a plan: the KVPR split and step time (KVPR Eq. 6-11, generalised to GQA; GLPK) for
 * batches 1, 4, 16, 64 and lengths C/8 .. C, column- and row-by-row, with activations of p bytes
 * per element and K/V of pk bytes per element as the plan stores them. */
static int write_kvpr(kv_h5 *plan, const kv_config *cf, const kv_hw *hw, long C, double p,
                      double pk, kv_error *err) {
    int rc = KV_OK;
    enum { NB = 4, NSMAX = 4 };
    const int batches[NB] = {1, 4, 16, 64};
    int lens[NSMAX], ns = 0;
    for (int k = 3; k >= 0; k--) {
        long v = C >> k;
        if (v < 1) v = 1;
        if (ns == 0 || lens[ns - 1] != (int)v) lens[ns++] = (int)v;
    }
    int split_c[NB * NSMAX], split_r[NB * NSMAX];
    double time_c[NB * NSMAX], time_r[NB * NSMAX], time_0[NB * NSMAX];
    for (int i = 0; i < NB && !rc; i++) {
        for (int j = 0; j < ns && !rc; j++) {
            kv_kvpr_shape sh = {batches[i], lens[j], cf->dim, (long)cf->n_kv_heads * cf->head_dim,
                                p,          pk};
            kv_kvpr_result rcol, rrow;
            rc = kv_kvpr_solve(&sh, hw->v_com, hw->v_gpu, KV_SCHED_COLUMN, &rcol, err);
            if (!rc) rc = kv_kvpr_solve(&sh, hw->v_com, hw->v_gpu, KV_SCHED_ROW, &rrow, err);
            if (rc) break;
            int k = i * ns + j;
            split_c[k] = (int)rcol.split;
            split_r[k] = (int)rrow.split;
            time_c[k] = rcol.time;
            time_r[k] = rrow.time;
            time_0[k] = rcol.time_no_recompute;
        }
    }
    long d1[1] = {NB}, d2[2] = {NB, ns}, ds[1] = {ns};
    if (!rc) rc = kv_h5_write_i32(plan, "/kvpr/batch", 1, d1, batches, "sequences", err);
    if (!rc) rc = kv_h5_write_i32(plan, "/kvpr/seq_len", 1, ds, lens, "tokens", err);
    if (!rc) rc = kv_h5_write_i32(plan, "/kvpr/split_column", 2, d2, split_c, "tokens", err);
    if (!rc) rc = kv_h5_write_i32(plan, "/kvpr/split_row", 2, d2, split_r, "tokens", err);
    if (!rc) rc = kv_h5_write_f64(plan, "/kvpr/time_column", 2, d2, time_c, "s", err);
    if (!rc) rc = kv_h5_write_f64(plan, "/kvpr/time_row", 2, d2, time_r, "s", err);
    if (!rc) rc = kv_h5_write_f64(plan, "/kvpr/time_no_recompute", 2, d2, time_0, "s", err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/kvpr", "v_com", hw->v_com, err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/kvpr", "v_gpu", hw->v_gpu, err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/kvpr", "dtype_bytes", p, err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/kvpr", "kv_bytes", pk, err);
    if (!rc) rc = kv_h5_attr_i64(plan, "/kvpr", "hidden", cf->dim, err);
    if (!rc)
        rc = kv_h5_attr_i64(plan, "/kvpr", "kv_width", (long)cf->n_kv_heads * cf->head_dim, err);
    if (!rc) rc = kv_h5_attr_str(plan, "/kvpr", "hardware", hw->name, err);
    if (!rc) rc = kv_h5_attr_str(plan, "/kvpr", "source", hw->source, err);
    if (!rc)
        rc = kv_h5_attr_str(plan, "/kvpr", "model",
                            "KVPR Eq. 6-11, generalised to GQA "
                            "(per layer, split by GLPK MIP)",
                            err);
    if (rc) return kv_fail_context(err, "writing /kvpr");
    return KV_OK;
}

/* /batch of a plan: Batch-Max batch sizing (Batch-Max §3-4) for the device memory of the
 * profile, with the plan's budgets and stored K/V types, prompt 3/4 and generation 1/4 of C. */
static int write_batch(kv_h5 *plan, const kv_model *m, const kv_hw *hw, const kv_plan *b, long C,
                       double p, kv_error *err) {
    int rc = KV_OK;
    kv_batch_config c;
    kv_batch_config_from_model(m, p, &c);
    c.device_mem = hw->device_mem;
    c.mem_bw = hw->mem_bw > 0 ? hw->mem_bw : 0;
    c.gen_len = C / 4 > 0 ? C / 4 : 1;
    c.prompt_len = C - C / 4 > 0 ? C - C / 4 : 1;
    c.block_size = b->block_size > 0 ? b->block_size : 16;
    c.evict_block = c.block_size;
    c.budget = b->budget;
    c.kv_type = b->kv_type;
    kv_batch_result res;
    kv_error local = {0};
    int brc = kv_batch_size(&c, &res, &local);
    if (brc && brc != KV_EINPUT) return kv_fail(err, brc, "%s", local.msg);
    int maxb[KV_BATCH_NMODES] = {0};
    double tps[KV_BATCH_NMODES] = {0}, kvb[KV_BATCH_NMODES] = {0}, wsb[KV_BATCH_NMODES] = {0};
    for (int i = 0; i < KV_BATCH_NMODES && !brc; i++) {
        const kv_batch_row *r = &res.row[i];
        maxb[i] = r->max_batch > 0x7fffffff ? 0x7fffffff : (int)r->max_batch;
        tps[i] = r->tokens_per_s;
        kvb[i] = r->prefill_limits ? r->kv_prefill : r->kv_decode;
        wsb[i] = r->prefill_limits ? r->ws_prefill : r->ws_decode;
    }
    long d[1] = {KV_BATCH_NMODES};
    rc = kv_h5_write_i32(plan, "/batch/max_batch", 1, d, maxb, "sequences", err);
    if (!rc) rc = kv_h5_write_f64(plan, "/batch/tokens_per_s", 1, d, tps, "tokens/s", err);
    if (!rc) rc = kv_h5_write_f64(plan, "/batch/kv_bytes_per_seq", 1, d, kvb, "bytes", err);
    if (!rc) rc = kv_h5_write_f64(plan, "/batch/workspace_bytes_per_seq", 1, d, wsb, "bytes", err);
    if (!rc) rc = kv_h5_attr_str(plan, "/batch", "rows", "full,decode_only,prefill_decode", err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/batch", "device_mem_bytes", c.device_mem, err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/batch", "weight_bytes", c.n_params * c.weight_bytes, err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/batch", "mem_bw", c.mem_bw, err);
    if (!rc) rc = kv_h5_attr_i64(plan, "/batch", "prompt_len", c.prompt_len, err);
    if (!rc) rc = kv_h5_attr_i64(plan, "/batch", "gen_len", c.gen_len, err);
    if (!rc) rc = kv_h5_attr_f64(plan, "/batch", "dtype_bytes", p, err);
    if (!rc) rc = kv_h5_attr_i64(plan, "/batch", "block_size", c.block_size, err);
    if (!rc) rc = kv_h5_attr_i64(plan, "/batch", "evict_block", c.evict_block, err);
    if (!rc && brc) rc = kv_h5_attr_str(plan, "/batch", "note", local.msg, err);
    if (rc) return kv_fail_context(err, "writing /batch");
    return KV_OK;
}

int kv_plan_write_kvpr_batch(kv_h5 *plan, const kv_model *m, const kv_hw *hw, const kv_plan *b,
                             kv_error *err) {
    const kv_config *cf = &m->cfg;
    if (!b || b->n_layers != cf->n_layers || b->n_kv_heads != cf->n_kv_heads || !b->budget)
        return kv_fail(err, KV_EINPUT, "plan budgets do not match the model (L %d, H_kv %d)",
                       cf->n_layers, cf->n_kv_heads);
    const double p = 4.0; /* kvplan's runtime keeps weights and activations in fp32 */
    /* K and V as the plan stores them: the mean stored bytes per element over the
     * heads (each head holds the same tokens in the KVPR model) */
    double pk = 0;
    for (int i = 0; i < b->n_layers * b->n_kv_heads; i++)
        pk += b->kv_type ? (double)kv_type_token_bytes(b->kv_type[i], cf->head_dim)
                         : 8.0 * cf->head_dim;
    pk /= 2.0 * (double)b->n_layers * b->n_kv_heads * cf->head_dim;
    long C = b->context > 0 ? b->context : cf->seq_len;
    if (C < 1) C = 1;
    int rc = KV_OK;
    if (hw->v_com > 0 && hw->v_gpu > 0) rc = write_kvpr(plan, cf, hw, C, p, pk, err);
    if (rc || !(hw->device_mem > 0)) return rc;
    return write_batch(plan, m, hw, b, C, p, err);
}

int kv_plan_write_kvpr_batch_from_profile(kv_h5 *plan, const char *profile_path, const kv_model *m,
                                          const kv_plan *b, int *written, kv_error *err) {
    if (written) *written = 0;
    kv_h5 *f = NULL;
    int rc = kv_h5_open_read(profile_path, &f, err);
    if (rc) return rc;
    int has_hw = kv_h5_exists(f, "/hardware");
    kv_h5_close(f);
    if (!has_hw) return KV_OK;
    kv_hw hw;
    kv_error local = {0};
    if (kv_hw_from_profile(profile_path, &hw, &local)) return KV_OK; /* incomplete figures */
    rc = kv_plan_write_kvpr_batch(plan, m, &hw, b, err);
    if (!rc && written) *written = 1;
    return rc;
}
