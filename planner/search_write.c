/* kvplan search, the plan file: the search's record under /search and a whole plan.h5 (plan,
 * search, sensitivity, KVPR and Batch-Max tables). See include/kvplan/search.h. */
#include "planner/search_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvplan/batch.h"
#include "kvplan/plan.h"
#include "kvplan/retrieval.h"

/* /search/t_values, r_values, p_values, perplexity and chunks: the grid. */
static int write_grid(kv_h5 *f, const kv_search_opts *o, const kv_search_result *r, kv_error *err) {
    int rc = KV_OK;
    long n_cfg = (long)r->n_p * r->n_t * r->n_r;
    if (o->allocation == KV_ALLOC_BAKLAVA) {
        long dt = r->n_t, dr = r->n_r;
        rc = kv_h5_write_f64(f, "/search/t_values", 1, &dt, o->t_values, "similarity", err);
        if (!rc) rc = kv_h5_write_f64(f, "/search/r_values", 1, &dr, o->r_values, "fraction", err);
    }
    if (!rc && o->allocation != KV_ALLOC_UNIFORM) {
        long dp = r->n_p;
        rc = kv_h5_write_f64(f, "/search/p_values", 1, &dp, o->p_values, "fraction", err);
    }
    if (!rc) {
        long dims[3];
        int rank;
        const char *names;
        if (o->allocation == KV_ALLOC_BAKLAVA && r->n_p == 1) {
            rank = 2, dims[0] = r->n_t, dims[1] = r->n_r, names = "t,r";
        } else if (o->allocation == KV_ALLOC_BAKLAVA) {
            rank = 3, dims[0] = r->n_p, dims[1] = r->n_t, dims[2] = r->n_r, names = "p,t,r";
        } else {
            rank = 1, dims[0] = n_cfg, names = o->allocation == KV_ALLOC_SQUEEZE ? "p" : "-";
        }
        rc = kv_h5_write_f64(f, "/search/perplexity", rank, dims, r->perplexity, "perplexity", err);
        if (!rc) rc = kv_h5_attr_str(f, "/search/perplexity", "dims", names, err);
        if (!rc) rc = kv_h5_write_i32(f, "/search/chunks", rank, dims, r->chunks, "chunks", err);
    }
    return rc;
}

/* /search/baselines and /search/heldout with the names of their entries. */
static int write_baselines(kv_h5 *f, const kv_search_result *r, kv_error *err) {
    int rc = KV_OK;
    if (!rc) {
        long d = KV_SEARCH_N_BASE;
        rc = kv_h5_write_f64(f, "/search/baselines", 1, &d, r->base_ppl, "perplexity", err);
        if (!rc) rc = kv_h5_attr_str(f, "/search/baselines", "names", "full,uniform,squeeze", err);
        d = 1 + KV_SEARCH_N_BASE;
        if (!rc)
            rc = kv_h5_write_f64(f, "/search/heldout", 1, &d, r->heldout_ppl, "perplexity", err);
        if (!rc)
            rc = kv_h5_attr_str(f, "/search/heldout", "names", "winner,full,uniform,squeeze", err);
    }
    return rc;
}

/* The /search attributes: method, token counts, winners, perplexities, eviction blocks. */
static int write_attrs(kv_h5 *f, const kv_search_opts *o, const kv_search_result *r,
                       kv_error *err) {
    int rc = KV_OK;
    if (!rc)
        rc = kv_h5_attr_str(f, "/search", "method",
                            o->halving_eta >= 2 ? "successive_halving" : "exhaustive", err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "eta", o->halving_eta, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "eval_tokens", (long)r->search_chunks * o->context, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "heldout_tokens", (long)r->heldout_chunks * o->context,
                            err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "token_evals", r->token_evals, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "token_evals_exhaustive", r->token_evals_exhaustive, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "distinct_budgets", r->distinct_budgets, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "heldout_token_evals", r->heldout_token_evals, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "type_token_evals", r->type_token_evals, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "token_evals_total",
                            r->total_token_evals + (r->robust ? r->robust->token_evals : 0), err);
    if (!rc) rc = kv_h5_attr_f64(f, "/search", "best_perplexity", r->best_ppl, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "best_chunks", r->best_chunks, err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/search", "winner",
                            r->winner_sens ? "sensitivity" : kv_alloc_name(r->winner_kind), err);
    if (!rc) rc = kv_h5_attr_str(f, "/search", "grid_winner", kv_alloc_name(r->winner_kind), err);
    if (!rc) rc = kv_h5_attr_f64(f, "/search", "grid_perplexity", r->grid_ppl, err);
    if (!rc) rc = kv_h5_attr_f64(f, "/search", "grid_heldout", r->grid_heldout, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "grid_token_evals_all", r->grid_token_evals_all, err);
    if (!rc) rc = kv_h5_attr_f64(f, "/search", "grid_seconds", r->grid_seconds, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "sensitivity", r->have_sens, err);
    if (!rc && r->winner_type_uniform >= 0 &&
        r->kv_types) /* a uniform cache of another KV type won */
        rc = kv_h5_attr_str(f, "/search", "winner_kv_type",
                            kv_type_name((kv_cache_type)r->winner_type_uniform), err);
    if (!rc && r->have_sens)
        rc = kv_h5_attr_f64(f, "/search", "sensitivity_perplexity", r->sens_ppl, err);
    if (!rc && r->have_sens)
        rc = kv_h5_attr_f64(f, "/search", "sensitivity_heldout", r->sens_heldout, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "identical_to_uniform", r->identical_to_uniform, err);
    if (!rc) rc = kv_h5_attr_i64(f, "/search", "grid_evict_block", o->evict_block, err);
    if (!rc)
        rc = kv_h5_attr_i64(f, "/search", "evict_block",
                            r->evict_block > 0 ? r->evict_block : o->evict_block, err);
    return rc;
}

/* /search/evict_block: the measured ladder of eviction blocks (when there is one). */
static int write_ladder(kv_h5 *f, const kv_search_result *r, kv_error *err) {
    int rc = KV_OK;
    if (!rc && r->n_ladder > 0) {
        long d = r->n_ladder;
        double pv[KV_SEARCH_MAX_LADDER];
        for (int i = 0; i < r->n_ladder; i++) pv[i] = r->ladder_p[i];
        rc = kv_h5_write_f64(f, "/search/evict_block/p", 1, &d, pv, "tokens", err);
        if (!rc)
            rc = kv_h5_write_f64(f, "/search/evict_block/plan", 1, &d, r->ladder_plan_ppl,
                                 "perplexity", err);
        if (!rc)
            rc = kv_h5_write_f64(f, "/search/evict_block/uniform", 1, &d, r->ladder_uniform_ppl,
                                 "perplexity", err);
        if (!rc)
            rc =
                kv_h5_attr_i64(f, "/search/evict_block", "token_evals", r->ladder_token_evals, err);
    }
    return rc;
}

/* /search/kv_types: the uniform baselines per KV type at the plan's bytes. */
static int write_kv_types(kv_h5 *f, const kv_search_opts *o, const kv_search_result *r,
                          kv_error *err) {
    int rc = KV_OK;
    if (!rc && o->kv_types_mask) { /* uniform per KV type at the plan's bytes */
        double sp[KV_CACHE_TYPES], hp[KV_CACHE_TYPES], tk[KV_CACHE_TYPES];
        char names[64] = "";
        long n = 0;
        for (int t = 0; t < KV_CACHE_TYPES; t++) {
            if (!(o->kv_types_mask & (1 << t))) continue;
            sp[n] = r->type_ppl[t];
            hp[n] = r->type_heldout[t];
            tk[n] = r->type_tokens[t];
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s", n ? "," : "",
                     kv_type_name((kv_cache_type)t));
            n++;
        }
        rc = kv_h5_write_f64(f, "/search/kv_types/uniform", 1, &n, sp, "perplexity", err);
        if (!rc)
            rc = kv_h5_write_f64(f, "/search/kv_types/uniform_heldout", 1, &n, hp, "perplexity",
                                 err);
        if (!rc)
            rc = kv_h5_write_f64(f, "/search/kv_types/tokens_per_head", 1, &n, tk, "tokens", err);
        if (!rc) rc = kv_h5_attr_str(f, "/search/kv_types/uniform", "names", names, err);
        if (!rc)
            rc = kv_h5_attr_str(f, "/search/kv_types/uniform", "definition",
                                "uniform budgets stored in each type at the plan's bytes (R of "
                                "the full F16 cache), on all search chunks; _heldout on the "
                                "held-out chunks",
                                err);
    }
    return rc;
}

/* /search/timing: wall_<stage> and cpu_<stage> (seconds) of every stage that ran. */
static int write_timing(kv_h5 *f, const kv_search_result *r, kv_error *err) {
    int rc = kv_h5_attr_str(f, "/search/timing", "description",
                            "wall (monotonic clock) and CPU (user + system of the process) "
                            "seconds of each search stage; docs/search-estimate.md",
                            err);
    for (int s = 0; s < KV_SEARCH_STAGES && !rc; s++) {
        if (!(r->stage_wall[s] > 0) && !(r->stage_cpu[s] > 0)) continue;
        char name[48];
        snprintf(name, sizeof name, "wall_%s", kv_search_stage_name(s));
        rc = kv_h5_attr_f64(f, "/search/timing", name, r->stage_wall[s], err);
        snprintf(name, sizeof name, "cpu_%s", kv_search_stage_name(s));
        if (!rc) rc = kv_h5_attr_f64(f, "/search/timing", name, r->stage_cpu[s], err);
    }
    return rc;
}

int kv_search_write(kv_h5 *f, const kv_search_opts *o, const kv_search_result *r, kv_error *err) {
    int rc = write_grid(f, o, r, err);
    if (!rc) rc = write_baselines(f, r, err);
    if (!rc) rc = write_attrs(f, o, r, err);
    if (!rc) rc = write_ladder(f, r, err);
    if (!rc) rc = write_kv_types(f, o, r, err);
    if (!rc && r->robust) rc = kv_robust_write(f, r->robust, err);
    if (!rc && r->retrieval) rc = kv_retrieval_write(f, r->retrieval, err);
    if (!rc) rc = kv_h5_attr_f64(f, "/search", "seconds", r->seconds, err);
    if (!rc) rc = write_timing(f, r, err);
    return rc;
}

int kv_plan_file_write(const char *path, const char *command, const char *profile_path,
                       const kv_model *m, const kv_alloc_params *a, kv_policy policy,
                       int evict_block, const int *tokens, const kv_search_opts *so,
                       const kv_search_result *sr, kv_error *err) {
    kv_plan plan;
    int sens = sr && sr->winner_sens;
    /* the knapsack's per-head types: validated against the byte ratio of a->ratio's tokens in
     * a->kv_type (the bytes the knapsack had) */
    int typed = (sens || (sr && sr->winner_type_uniform >= 0)) && sr->kv_types;
    double bratio = kv_search_ratio_bytes(a->ratio, a->kv_type, m->cfg.head_dim);
    int rc = kv_plan_from_budgets_typed(
        &m->cfg, tokens, sens ? sr->policy : NULL, typed ? sr->kv_types : NULL, policy,
        typed ? bratio : a->ratio, a->context, a->block_size, evict_block,
        sens ? "sensitivity" : kv_alloc_name(a->kind),
        !sens && a->kind == KV_ALLOC_BAKLAVA ? a->t : NAN,
        !sens && a->kind == KV_ALLOC_BAKLAVA ? a->r : NAN,
        sens || a->kind == KV_ALLOC_UNIFORM ? NAN : a->p, a->min_tokens, &plan, err);
    if (rc) return rc;
    if (a->kv_type != KV_TYPE_F16 && !typed) { /* the ratio in bytes over the full F16 cache */
        for (int i = 0; i < plan.n_layers * plan.n_kv_heads; i++) plan.kv_type[i] = a->kv_type;
        plan.ratio = bratio;
        rc = kv_plan_validate(&plan, path, err);
        if (rc) {
            kv_plan_free(&plan);
            return rc;
        }
    }
    kv_h5 *f = NULL;
    rc = kv_h5_create(path, &f, err);
    if (!rc) rc = kv_h5_write_provenance(f, command, m, err);
    if (!rc) rc = kv_plan_write(f, &plan, err);
    if (!rc && so && sr) rc = kv_search_write(f, so, sr, err);
    if (!rc && so && sr && sr->have_sens) {
        kv_sens_opts eo = kv_search_sens_opts(so); /* what the curves ran with, KV type too */
        rc = kv_sens_write(f, m->cfg.n_layers, m->cfg.n_kv_heads, &eo, &sr->sens, err);
    }
    if (!rc && so && sr)
        rc = kv_h5_attr_i64(f, "/", "identical_to_uniform", sr->identical_to_uniform, err);
    if (!rc && profile_path)
        rc = kv_plan_write_kvpr_batch_from_profile(f, profile_path, m, &plan, NULL, err);
    if (!rc)
        rc = kv_h5_commit(f, err);
    else
        kv_h5_abort(f);
    kv_plan_free(&plan);
    return rc;
}
