/* kvplan search --estimate: the throughput, the stage counts and their table or JSON. See
 * cli/search_estimate.h and include/kvplan/estimate.h. */
#include "search_estimate.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The throughputs: the preset's roofline (--device-preset), else a calibration forward on the
 * search's engine (single sequence and a batch of the curves' size), with the profile's
 * figure named beside it. */
static int choose_rate(const kv_cli_estimate *e, kv_search_estimate *est, kv_error *err) {
    char src[512];
    if (e->preset) {
        kv_roofline r;
        int rc = kv_estimate_roofline(&e->m->cfg, e->so->context, 1, e->preset, &r, err);
        if (rc) return rc;
        snprintf(src, sizeof src, "roofline (%s-bound; %.3g GFLOP, %.3g MB per token) on %.150s",
                 r.compute_bound ? "compute" : "memory", r.flops / 1e9,
                 (r.weight_bytes + r.kv_bytes) / 1e6, r.source);
        kv_search_estimate_time(est, r.tokens_per_s, r.tokens_per_s, src);
        return KV_OK;
    }
    double prof = 0;
    char pnote[96] = "";
    if (e->profile_path && !kv_estimate_rate_profile(e->profile_path, &prof, NULL))
        snprintf(pnote, sizeof pnote, "; the profile's full-cache forward: %.0f tokens/s", prof);
    kv_est_rates r;
    int rc = kv_estimate_calibrate(e->m, e->so, e->ids, e->S, &r, err);
    if (rc) return rc;
    snprintf(src, sizeof src,
             "calibration: %d shapes of the search's passes in %.1f s (%.1f CPU s; %.2f CPU s a "
             "wall s, the wall projection's)%s",
             r.probes, r.seconds, r.cpu_seconds, r.cpu_share, pnote);
    kv_search_estimate_time_calibrated(est, &r, src);
    return KV_OK;
}

static void print_table(const kv_cli_estimate *e, const kv_search_estimate *est) {
    const kv_config *c = &e->m->cfg;
    printf("estimate     %s: L %d, H %d, H_kv %d, d_h %d, FFN %d, vocab %d\n", e->model_name,
           c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->hidden_dim, c->vocab_size);
    printf("search       ratio %.4g (tokens %.4g), C %d, b_s %d, p %d, %d search + %d held-out "
           "chunks, %d grid points (%d distinct budgets%s)\n",
           kv_search_ratio_bytes(e->so->ratio, e->so->kv_type, c->head_dim), e->so->ratio,
           est->context, e->so->block_size, e->so->evict_block, est->search_chunks,
           est->heldout_chunks, est->points, est->distinct < 0 ? est->points : est->distinct,
           est->distinct < 0 ? ", unknown without a profile: counted as all" : "");
    printf("%-12s %12s %12s %9s %9s %9s %9s %10s  %s\n", "stage", "token evals", "at most",
           "wall s", "at most", "CPU s", "at most", "tokens/s", "count");
    for (int s = 0; s < KV_EST_STAGES; s++) {
        const kv_est_row *r = &est->stage[s];
        if (!r->token_evals_max) continue;
        printf("%-12s %12ld %12ld %9.1f %9.1f %9.1f %9.1f %10.0f  %s\n", kv_est_stage_name(s),
               r->token_evals, r->token_evals_max, r->seconds, r->seconds_max, r->cpu_seconds,
               r->cpu_seconds_max, r->tokens_per_s, r->exact ? "exact" : "range");
    }
    printf("%-12s %12ld %12ld %9.1f %9.1f %9.1f %9.1f\n", "total", est->token_evals,
           est->token_evals_max, est->seconds, est->seconds_max, est->cpu_seconds,
           est->cpu_seconds_max);
    printf("projected    %.1f s wall, %.1f CPU s (the most; midway: the guard's further source, "
           "the stages after the ladder between its p and 1)\n",
           est->seconds_proj, est->cpu_seconds_proj);
    printf("rate         %s\n", est->rate_source);
    if (est->sens_rounds > 1)
        printf("note         refine/verify: %d refinement solves at most (fewer when a round does "
               "not improve); ladder, guard, retrieval: data-dependent parts at most\n",
               est->sens_rounds);
}

static int print_json(const kv_cli_estimate *e, const kv_search_estimate *est, kv_error *err) {
    const kv_config *c = &e->m->cfg;
    cJSON *root = cJSON_CreateObject(), *st = cJSON_CreateArray();
    if (!root || !st) {
        cJSON_Delete(root), cJSON_Delete(st);
        return kv_fail(err, KV_EINTERNAL, "out of memory: JSON");
    }
    cJSON_AddStringToObject(root, "model", e->model_name);
    int shape[6] = {c->n_layers, c->n_heads,    c->n_kv_heads,
                    c->head_dim, c->hidden_dim, c->vocab_size};
    cJSON_AddItemToObject(root, "shape", cJSON_CreateIntArray(shape, 6));
    cJSON_AddNumberToObject(root, "context", est->context);
    cJSON_AddNumberToObject(root, "ratio_tokens", e->so->ratio);
    cJSON_AddNumberToObject(root, "block_size", e->so->block_size);
    cJSON_AddNumberToObject(root, "evict_block", e->so->evict_block);
    cJSON_AddNumberToObject(root, "search_chunks", est->search_chunks);
    cJSON_AddNumberToObject(root, "heldout_chunks", est->heldout_chunks);
    cJSON_AddNumberToObject(root, "grid_points", est->points);
    cJSON_AddNumberToObject(root, "distinct_budgets", est->distinct);
    /* the totals before the stages: a reader looking for the first "token_evals" gets them */
    cJSON_AddNumberToObject(root, "token_evals", (double)est->token_evals);
    cJSON_AddNumberToObject(root, "token_evals_max", (double)est->token_evals_max);
    cJSON_AddNumberToObject(root, "seconds", est->seconds);
    cJSON_AddNumberToObject(root, "seconds_max", est->seconds_max);
    cJSON_AddNumberToObject(root, "cpu_seconds", est->cpu_seconds);
    cJSON_AddNumberToObject(root, "cpu_seconds_max", est->cpu_seconds_max);
    cJSON_AddNumberToObject(root, "cpu_share", est->cpu_share);
    cJSON_AddNumberToObject(root, "seconds_projected", est->seconds_proj);
    cJSON_AddNumberToObject(root, "cpu_seconds_projected", est->cpu_seconds_proj);
    cJSON_AddNumberToObject(root, "tokens_per_s", est->tokens_per_s);
    cJSON_AddNumberToObject(root, "batch_tokens_per_s", est->batch_tokens_per_s);
    cJSON_AddStringToObject(root, "rate_source", est->rate_source);
    for (int s = 0; s < KV_EST_STAGES; s++) {
        const kv_est_row *r = &est->stage[s];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "stage", kv_est_stage_name(s));
        cJSON_AddNumberToObject(o, "token_evals", (double)r->token_evals);
        cJSON_AddNumberToObject(o, "token_evals_max", (double)r->token_evals_max);
        cJSON_AddBoolToObject(o, "exact", r->exact);
        cJSON_AddNumberToObject(o, "seconds", r->seconds);
        cJSON_AddNumberToObject(o, "seconds_max", r->seconds_max);
        cJSON_AddNumberToObject(o, "cpu_seconds", r->cpu_seconds);
        cJSON_AddNumberToObject(o, "cpu_seconds_max", r->cpu_seconds_max);
        cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
        cJSON_AddNumberToObject(o, "token_evals_projected", (double)r->token_evals_proj);
        cJSON_AddNumberToObject(o, "seconds_projected", r->seconds_proj);
        cJSON_AddNumberToObject(o, "cpu_seconds_projected", r->cpu_seconds_proj);
        cJSON_AddItemToArray(st, o);
    }
    cJSON_AddItemToObject(root, "stages", st);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt) return kv_fail(err, KV_EINTERNAL, "out of memory: JSON");
    printf("%s\n", txt);
    free(txt);
    return KV_OK;
}

int kv_cli_search_estimate(const kv_cli_estimate *e, kv_error *err) {
    kv_search_estimate est;
    int rc = kv_search_estimate_count(e->m, e->prof, e->so, e->n_texts, e->S, e->HC, e->probes,
                                      e->ro, e->have_heads, &est, err);
    if (!rc) rc = choose_rate(e, &est, err);
    if (rc) return rc;
    if (e->json) return print_json(e, &est, err);
    print_table(e, &est);
    return KV_OK;
}
