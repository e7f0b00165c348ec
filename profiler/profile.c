/* kvplan profiler: similarity collectors hooked into the forward pass and the profile.h5
 * writer. See include/kvplan/profiler.h for the definitions and their sources. */
#include "kvplan/profiler.h"

#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvplan/engine.h"
#include "kvplan/kvcache.h"
#include "kvplan/tasks.h"

int kv_profile_pick_prompts(const int *stream, long n, int bos_id, int n_prompts, int prompt_len,
                            uint64_t seed, int *out, kv_error *err) {
    if (n_prompts < 1) return kv_fail(err, KV_EINPUT, "the number of prompts must be at least 1");
    if (prompt_len < 2) return kv_fail(err, KV_EINPUT, "prompt length %d is below 2", prompt_len);
    long body = prompt_len - 1;
    /* the stream starts with its own BOS: windows are taken from stream[1..n) */
    long avail = n - 1 - body;
    if (avail < 0)
        return kv_fail(err, KV_EINPUT,
                       "the text has %ld tokens, too few for one prompt of %d tokens", n - 1,
                       prompt_len);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (int i = 0; i < n_prompts; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        double u = (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
        long lo = (long)((double)avail * i / n_prompts);
        long hi = (long)((double)avail * (i + 1) / n_prompts);
        long start = 1 + lo + (long)(u * (double)(hi - lo + 1));
        if (start > 1 + avail) start = 1 + avail;
        int *dst = out + (size_t)i * prompt_len;
        dst[0] = bos_id;
        memcpy(dst + 1, stream + start, (size_t)body * sizeof *dst);
    }
    return KV_OK;
}

void kv_profile_free(kv_profile *pr) {
    if (!pr) return;
    free(pr->tokens);
    free(pr->lengths);
    free(pr->cos_mean);
    free(pr->cos_var);
    free(pr->similarity);
    free(pr->importance);
    free(pr->token_cos);
    free(pr->cos_attn);
    free(pr->cos_block);
    free(pr->layer_similarity);
    free(pr->kendall_tau);
    free(pr->spearman_rho);
    memset(pr, 0, sizeof *pr);
}

/* Collector state for one prompt: where its contributions go (one prompt's record of a task
 * result, see profile_task). */
typedef struct collector {
    const kv_config *cfg;
    double *cos_mean;  /* [L, H] */
    double *cos_var;   /* [L, H] */
    double *cos_attn;  /* [L] */
    double *cos_block; /* [L] */
    double *token_cos; /* [L, H, T] for the first prompt, else NULL */
    int T;
    float *x_in; /* [L, T, dim] residual entering each layer (for the block cosine) */
} collector;

static double cosine(const float *a, const float *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0.0 || bb == 0.0) return 0.0;
    return ab / sqrt(aa * bb);
}

static void on_attn(void *user, int layer, int rows, const float *x_in, const float *o_heads,
                    const float *v_new, const float *attn_out) {
    collector *c = user;
    const kv_config *cfg = c->cfg;
    int H = cfg->n_heads, hd = cfg->head_dim, g = H / cfg->n_kv_heads, dim = cfg->dim;
    int qd = H * hd, kvd = cfg->n_kv_heads * hd;
    size_t ph = (size_t)layer * H;
    for (int h = 0; h < H; h++) {
        int j = h / g;
        double sum = 0, sum2 = 0;
        for (int t = 0; t < rows; t++) {
            double cs = cosine(v_new + (size_t)t * kvd + (size_t)j * hd,
                               o_heads + (size_t)t * qd + (size_t)h * hd, hd);
            sum += cs;
            sum2 += cs * cs;
            if (c->token_cos) c->token_cos[((size_t)layer * H + h) * c->T + t] = cs;
        }
        double mean = sum / rows, var = sum2 / rows - mean * mean;
        c->cos_mean[ph + h] = mean;
        c->cos_var[ph + h] = var > 0 ? var : 0.0;
    }
    /* SqueezeAttention: cos(x_l, x_l + Attn_l(RMSNorm(x_l))) */
    double acc = 0;
    float *tmp = malloc((size_t)dim * sizeof *tmp);
    for (int t = 0; t < rows && tmp; t++) {
        const float *x = x_in + (size_t)t * dim, *a = attn_out + (size_t)t * dim;
        for (int i = 0; i < dim; i++) tmp[i] = x[i] + a[i];
        acc += cosine(x, tmp, dim);
    }
    free(tmp);
    c->cos_attn[layer] = acc / rows;
    memcpy(c->x_in + (size_t)layer * rows * dim, x_in, (size_t)rows * dim * sizeof(float));
}

static void on_block(void *user, int layer, int rows, const float *x_out) {
    collector *c = user;
    int dim = c->cfg->dim;
    double acc = 0;
    for (int t = 0; t < rows; t++)
        acc += cosine(c->x_in + ((size_t)layer * rows + t) * dim, x_out + (size_t)t * dim, dim);
    c->cos_block[layer] = acc / rows;
}

double kv_kendall_tau(const double *a, const double *b, int n) {
    long conc = 0, disc = 0, ta = 0, tb = 0;
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++) {
            double da = a[i] - a[k], db = b[i] - b[k];
            if (da == 0 && db == 0) continue;
            if (da == 0)
                ta++;
            else if (db == 0)
                tb++;
            else if ((da > 0) == (db > 0))
                conc++;
            else
                disc++;
        }
    double den = sqrt((double)(conc + disc + ta) * (double)(conc + disc + tb));
    return den > 0 ? (double)(conc - disc) / den : 0.0;
}

/* The prompts as tasks (kvplan/tasks.h): task k runs prompts [k * G, min(P, (k + 1) * G)), one
 * fresh sequence each, and its result holds one record per prompt (cos_mean [L, H], cos_var
 * [L, H], cos_attn [L], cos_block [L]) followed by token_cos [L, H, T], which only the task of
 * prompt 0 fills. */
typedef struct profile_tasks {
    kv_engine *eng;
    collector col;
    const int *tokens; /* [P, T] */
    int P, T, G, L, H;
    kv_progress *p;
    int done; /* prompts this process ran */
    double t0;
} profile_tasks;

static size_t prompt_rec(int L, int H) {
    return (size_t)2 * L * H + (size_t)2 * L;
}

static int profile_task(void *user, long task, double *out, kv_error *err) {
    profile_tasks *t = user;
    const int L = t->L, H = t->H, T = t->T;
    const size_t rec = prompt_rec(L, H);
    memset(out, 0, ((size_t)t->G * rec + (size_t)L * H * T) * sizeof *out);
    kv_hooks hooks = {&t->col, on_attn, on_block};
    int rc = KV_OK;
    for (int k = 0; k < t->G && !rc; k++) {
        long i = task * t->G + k;
        if (i >= t->P) break;
        double *r = out + (size_t)k * rec;
        t->col.cos_mean = r;
        t->col.cos_var = r + (size_t)L * H;
        t->col.cos_attn = r + (size_t)2 * L * H;
        t->col.cos_block = r + (size_t)2 * L * H + L;
        t->col.token_cos = i == 0 ? out + (size_t)t->G * rec : NULL;
        int seq = -1;
        rc = kv_engine_seq_open(t->eng, NULL, NULL, &seq, err);
        if (rc) break;
        rc = kv_engine_prefill(t->eng, seq, t->tokens + (size_t)i * T, T, KV_LOGITS_NONE, NULL,
                               &hooks, err);
        kv_engine_seq_close(t->eng, seq);
        t->done++;
        double el = kv_now() - t->t0;
        if (!rc && t->p)
            kv_progress_print(t->p, 0, "profile: prompt %ld of %d, %.0f tokens/s", i + 1, t->P,
                              (double)t->done * T / (el > 0 ? el : 1e-9));
    }
    return rc;
}

int kv_profile_run(const kv_model *m, const int *tokens, int P, int T, kv_device device,
                   int n_threads, kv_cache_type kv_type, kv_profile *out, kv_progress *p,
                   kv_error *err) {
    return kv_profile_run_tasks(m, tokens, P, T, device, n_threads, kv_type, NULL, out, p, err);
}

/* Stage 1 of kv_profile_run_tasks: the profile's arrays for P prompts of T tokens. */
static int profile_alloc(const kv_config *cfg, int P, int T, kv_profile *out, kv_error *err) {
    int L = cfg->n_layers, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    out->P = P;
    out->L = L;
    out->H = H;
    out->H_kv = Hkv;
    out->T = T;
    size_t plh = (size_t)P * L * H;
    out->tokens = malloc((size_t)P * T * sizeof(int));
    out->lengths = malloc((size_t)P * sizeof(int));
    out->cos_mean = calloc(plh, sizeof(double));
    out->cos_var = calloc(plh, sizeof(double));
    out->similarity = calloc((size_t)L * Hkv, sizeof(double));
    out->importance = calloc((size_t)L * Hkv, sizeof(double));
    out->token_cos = calloc((size_t)L * H * T, sizeof(double));
    out->cos_attn = calloc((size_t)P * L, sizeof(double));
    out->cos_block = calloc((size_t)P * L, sizeof(double));
    out->layer_similarity = calloc((size_t)L, sizeof(double));
    out->kendall_tau = calloc((size_t)P * P, sizeof(double));
    out->spearman_rho = calloc((size_t)P * P, sizeof(double));
    if (!out->tokens || !out->lengths || !out->cos_mean || !out->cos_var || !out->similarity ||
        !out->importance || !out->token_cos || !out->cos_attn || !out->cos_block ||
        !out->layer_similarity || !out->kendall_tau || !out->spearman_rho)
        return kv_fail(err, KV_EINTERNAL, "out of memory (profile of %d prompts x %d tokens)", P,
                       T);
    return KV_OK;
}

/* Stage 3: every prompt's record (from task results res, G prompts per task, n_out values per
 * task) into the profile, in prompt order; the first prompt's per-token cosines. */
static void profile_gather(const double *res, int G, size_t n_out, kv_profile *out) {
    int L = out->L, H = out->H;
    size_t rec = prompt_rec(L, H);
    for (int i = 0; i < out->P; i++) {
        const double *r = res + (size_t)(i / G) * n_out + (size_t)(i % G) * rec;
        memcpy(out->cos_mean + (size_t)i * L * H, r, (size_t)L * H * sizeof *r);
        memcpy(out->cos_var + (size_t)i * L * H, r + (size_t)L * H, (size_t)L * H * sizeof *r);
        memcpy(out->cos_attn + (size_t)i * L, r + (size_t)2 * L * H, (size_t)L * sizeof *r);
        memcpy(out->cos_block + (size_t)i * L, r + (size_t)2 * L * H + L, (size_t)L * sizeof *r);
    }
    memcpy(out->token_cos, res + (size_t)G * rec, (size_t)L * H * out->T * sizeof *res);
}

/* Stage 4: head similarity s = mean over prompts and the GQA group of (cos + 1) / 2, importance
 * 1 - s [L, H_kv] (BaKlaVa Alg. 1); layer similarity = mean over prompts of cos_attn [L]
 * (SqueezeAttention §3). Refuses non-finite cosines (a broken model) naming the layer. */
static int profile_reduce(const kv_model *m, kv_profile *out, kv_error *err) {
    int P = out->P, L = out->L, H = out->H, Hkv = out->H_kv, g = H / Hkv;
    for (size_t i = 0; i < (size_t)P * L * H; i++)
        if (!isfinite(out->cos_mean[i]))
            return kv_fail(err, KV_EINPUT,
                           "%s: the forward pass produced non-finite values (NaN/Inf) in layer "
                           "%zu: the weights are corrupt",
                           m->path, (i / (size_t)H) % (size_t)L);
    for (int l = 0; l < L; l++) {
        for (int j = 0; j < Hkv; j++) {
            double s = 0;
            for (int i = 0; i < P; i++)
                for (int k = 0; k < g; k++)
                    s += (out->cos_mean[((size_t)i * L + l) * H + j * g + k] + 1.0) / 2.0;
            s /= (double)P * g;
            out->similarity[l * Hkv + j] = s;
            out->importance[l * Hkv + j] = 1.0 - s;
        }
        double ls = 0;
        for (int i = 0; i < P; i++) ls += out->cos_attn[(size_t)i * L + l];
        out->layer_similarity[l] = ls / P;
    }
    return KV_OK;
}

/* Stage 5: Kendall's tau and Spearman's rho (GSL) between the head rankings of each pair of
 * prompts [P, P]. */
static void profile_consistency(kv_profile *out) {
    int P = out->P, n = out->L * out->H;
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            const double *va = out->cos_mean + (size_t)a * n, *vb = out->cos_mean + (size_t)b * n;
            double work[2 * 1024];
            double *wk = n <= 1024 ? work : malloc((size_t)2 * n * sizeof *wk);
            out->kendall_tau[a * P + b] = a == b ? 1.0 : kv_kendall_tau(va, vb, n);
            out->spearman_rho[a * P + b] =
                a == b ? 1.0 : (wk ? gsl_stats_spearman(va, 1, vb, 1, (size_t)n, wk) : NAN);
            if (wk != work) free(wk);
        }
}

int kv_profile_run_tasks(const kv_model *m, const int *tokens, int P, int T, kv_device device,
                         int n_threads, kv_cache_type kv_type, kv_tasks *tasks, kv_profile *out,
                         kv_progress *p, kv_error *err) {
    memset(out, 0, sizeof *out);
    const kv_config *cfg = &m->cfg;
    if (P < 1) return kv_fail(err, KV_EINPUT, "no prompts to profile (--prompts must be >= 1)");
    if (T < 2 || T > cfg->seq_len)
        return kv_fail(err, KV_EINPUT,
                       "prompt length %d must be in [2, %d] (the model's context length)", T,
                       cfg->seq_len);
    int L = cfg->n_layers, H = cfg->n_heads;
    /* Stage 2: prompts in groups of G as tasks, at most 4 per rank, so that the token_cos slot
     * of every task stays small next to the prompts' records */
    const int ranks = kv_tasks_size(tasks), per = 4 * ranks;
    const int G = (P + per - 1) / per, n_tasks = (P + G - 1) / G;
    const size_t rec = prompt_rec(L, H), n_out = (size_t)G * rec + (size_t)L * H * T;
    double *res = malloc((size_t)n_tasks * n_out * sizeof *res);
    profile_tasks pt = {
        .col = {.cfg = cfg, .T = T, .x_in = malloc((size_t)L * T * cfg->dim * sizeof(float))},
        .tokens = tokens,
        .P = P,
        .T = T,
        .G = G,
        .L = L,
        .H = H,
        .p = p};
    kv_plan full = {0};
    int rc = profile_alloc(cfg, P, T, out, err);
    if (!rc && (!pt.col.x_in || !res))
        rc = kv_fail(err, KV_EINTERNAL, "out of memory (profile of %d prompts x %d tokens)", P, T);
    if (!rc && n_out > (size_t)0x7fffffff)
        rc = kv_fail(err, KV_EINPUT, "profile: %zu values per prompt group are too many", n_out);
    if (!rc) {
        memcpy(out->tokens, tokens, (size_t)P * T * sizeof(int));
        for (int i = 0; i < P; i++) out->lengths[i] = T;
        /* the full cache over one prompt: every prompt is one prefill step */
        rc = kv_plan_full(cfg, T, KV_DEFAULT_BLOCK_SIZE,
                          T < KV_DEFAULT_EVICT_BLOCK ? T : KV_DEFAULT_EVICT_BLOCK, KV_POLICY_SINK,
                          &full, err);
        if (!rc) kv_plan_set_kv_type(&full, kv_type);
        out->kv_type = kv_type;
    }
    if (!rc) {
        kv_engine_opts eo = {.device = device, .max_seqs = 1, .n_threads = n_threads};
        rc = kv_engine_new(m, &full, &eo, &pt.eng, err);
    }
    rc = kv_tasks_agree(tasks, rc, err); /* under MPI: no rank runs tasks alone */
    double t0 = kv_now();
    pt.t0 = t0;
    if (!rc) rc = kv_tasks_run(tasks, n_tasks, (int)n_out, profile_task, &pt, res, err);
    if (!rc) profile_gather(res, G, n_out, out);
    out->seconds = kv_now() - t0;
    out->tokens_per_s = (double)P * T / (out->seconds > 0 ? out->seconds : 1e-9);
    if (!rc && p)
        kv_progress_print(p, 1, "profile: %d prompts, %.0f tokens/s", P, out->tokens_per_s);
    kv_engine_free(pt.eng);
    kv_plan_free(&full);
    free(pt.col.x_in);
    free(res);
    if (!rc) rc = profile_reduce(m, out, err);
    if (rc) {
        kv_profile_free(out);
        return rc;
    }
    profile_consistency(out);
    return KV_OK;
}

int kv_profile_write(kv_h5 *f, const kv_profile *pr, kv_error *err) {
    long plh[3] = {pr->P, pr->L, pr->H}, lk[2] = {pr->L, pr->H_kv}, lht[3] = {pr->L, pr->H, pr->T};
    long pl[2] = {pr->P, pr->L}, l1[1] = {pr->L}, pp[2] = {pr->P, pr->P}, pt[2] = {pr->P, pr->T},
         p1[1] = {pr->P};
    int rc = kv_h5_write_f64(f, "/heads/cos_mean", 3, plh, pr->cos_mean, "cosine", err);
    if (!rc) rc = kv_h5_write_f64(f, "/heads/cos_var", 3, plh, pr->cos_var, "cosine^2", err);
    if (!rc) rc = kv_h5_write_f64(f, "/heads/similarity", 2, lk, pr->similarity, "1", err);
    if (!rc) rc = kv_h5_write_f64(f, "/heads/importance", 2, lk, pr->importance, "1", err);
    if (!rc) rc = kv_h5_write_f64(f, "/heads/token_cos", 3, lht, pr->token_cos, "cosine", err);
    if (!rc) rc = kv_h5_write_f64(f, "/layers/cos_attn", 2, pl, pr->cos_attn, "cosine", err);
    if (!rc) rc = kv_h5_write_f64(f, "/layers/cos_block", 2, pl, pr->cos_block, "cosine", err);
    if (!rc)
        rc = kv_h5_write_f64(f, "/layers/similarity", 1, l1, pr->layer_similarity, "cosine", err);
    if (!rc) rc = kv_h5_write_f64(f, "/consistency/kendall_tau", 2, pp, pr->kendall_tau, "1", err);
    if (!rc)
        rc = kv_h5_write_f64(f, "/consistency/spearman_rho", 2, pp, pr->spearman_rho, "1", err);
    if (!rc) rc = kv_h5_write_i32(f, "/prompts/tokens", 2, pt, pr->tokens, "token id", err);
    if (!rc) rc = kv_h5_write_i32(f, "/prompts/lengths", 1, p1, pr->lengths, "tokens", err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/heads", "definition",
                            "c[t] = cos(V[t, h/g], O[t, h]) before W_o (BaKlaVa Alg. 1); "
                            "similarity = mean over prompts and the GQA group of (mean_t c + 1)/2; "
                            "importance = 1 - similarity",
                            err);
    if (!rc)
        rc = kv_h5_attr_str(f, "/layers", "definition",
                            "cos_attn: mean_t cos(x_l, x_l + Attn_l(RMSNorm(x_l))) "
                            "(SqueezeAttention); cos_block: mean_t cos(x_l, x_{l+1}); "
                            "similarity = mean over prompts of cos_attn",
                            err);
    if (!rc) rc = kv_h5_attr_f64(f, "/prompts", "profile_tokens_per_s", pr->tokens_per_s, err);
    if (!rc) rc = kv_h5_attr_str(f, "/prompts", "kv_type", kv_type_name(pr->kv_type), err);
    return rc;
}
