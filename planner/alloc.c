/* kvplan budget allocation: layer budgets (uniform, SqueezeAttention), BaKlaVa Alg. 2 head
 * budgets, GLPK rounding to blocks, successive halving. See include/kvplan/alloc.h. */
#include "kvplan/alloc.h"
#include "kvplan/plan.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *kv_alloc_name(kv_alloc_kind k) {
    switch (k) {
    case KV_ALLOC_UNIFORM:
        return "uniform";
    case KV_ALLOC_SQUEEZE:
        return "squeeze";
    case KV_ALLOC_BAKLAVA:
        return "baklava";
    }
    return "?";
}

int kv_alloc_parse(const char *s, kv_alloc_kind *out, kv_error *err) {
    static const kv_alloc_kind all[] = {KV_ALLOC_UNIFORM, KV_ALLOC_SQUEEZE, KV_ALLOC_BAKLAVA};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, kv_alloc_name(all[i]))) {
            *out = all[i];
            return KV_OK;
        }
    return kv_fail(err, KV_EINPUT, "unknown allocation '%s' (expected baklava, squeeze or uniform)",
                   s ? s : "(null)");
}

void kv_alloc_params_default(kv_alloc_params *a) {
    memset(a, 0, sizeof *a);
    a->kind = KV_ALLOC_BAKLAVA;
    a->layer_kind = KV_ALLOC_SQUEEZE;
    a->ratio = 0.5;
    a->kv_type = KV_TYPE_DEFAULT;
    a->context = 256;
    a->block_size = 16;
    a->min_tokens = 20;
    a->t = 0.75;
    a->r = 0.5;
    a->p = KV_SQUEEZE_DEFAULT_P;
}

/* ---------------------------------------------------------------- projection ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double clampd(double v, double lo, double hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

/* f(lambda) = sum clamp(x_i + lambda, lo_i, hi_i) */
static double box_sum(int n, const double *x, const double *lo, const double *hi, double lam) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += clampd(x[i] + lam, lo ? lo[i] : 0.0, hi ? hi[i] : HUGE_VAL);
    return s;
}

int kv_project_box(int n, const double *x, const double *lo, const double *hi, double total,
                   double *y, kv_error *err) {
    if (n < 1) return kv_fail(err, KV_EINPUT, "projection of an empty vector");
    double slo = 0.0, shi = 0.0, sx = 0.0;
    int inside = 1, n_unbounded = 0;
    for (int i = 0; i < n; i++) {
        double l = lo ? lo[i] : 0.0, h = hi ? hi[i] : HUGE_VAL;
        if (!isfinite(x[i]) || !isfinite(l) || isnan(h))
            return kv_fail(err, KV_EINPUT, "budget %d is not a finite number", i);
        if (l > h)
            return kv_fail(err, KV_EINPUT, "budget %d: lower bound %.6g above upper bound %.6g", i,
                           l, h);
        slo += l;
        if (isinf(h))
            n_unbounded++;
        else
            shi += h;
        sx += x[i];
        if (x[i] < l || x[i] > h) inside = 0;
    }
    double tol = 1e-9 * (fabs(total) + 1.0);
    if (total < slo - tol)
        return kv_fail(err, KV_EINPUT,
                       "total %.6g is below the sum of the lower bounds %.6g (short by %.6g)",
                       total, slo, slo - total);
    if (!n_unbounded && total > shi + tol)
        return kv_fail(err, KV_EINPUT,
                       "total %.6g is above the sum of the upper bounds %.6g (over by %.6g)", total,
                       shi, total - shi);
    if (inside && fabs(sx - total) <= tol) {
        if (y != x) memcpy(y, x, (size_t)n * sizeof *y);
        return KV_OK;
    }
    double *bp = kv_malloc((size_t)2 * (size_t)n * sizeof *bp, "projection breakpoints", err);
    if (!bp) return err ? err->code : KV_EINTERNAL;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        bp[nb++] = (lo ? lo[i] : 0.0) - x[i];
        if (hi && isfinite(hi[i])) bp[nb++] = hi[i] - x[i];
    }
    qsort(bp, (size_t)nb, sizeof *bp, cmp_double);
    /* f(bp[0]) = sum(lo); find the first breakpoint where f reaches total and interpolate. */
    double lam = bp[0], fprev = box_sum(n, x, lo, hi, bp[0]);
    int found = fprev >= total;
    for (int k = 1; k < nb && !found; k++) {
        double f = box_sum(n, x, lo, hi, bp[k]);
        if (f >= total) {
            lam = (f > fprev) ? bp[k - 1] + (total - fprev) * (bp[k] - bp[k - 1]) / (f - fprev)
                              : bp[k];
            found = 1;
        }
        fprev = f;
    }
    if (!found) /* beyond the last breakpoint only the unbounded entries still grow */
        lam = bp[nb - 1] + (total - fprev) / (double)(n_unbounded > 0 ? n_unbounded : 1);
    for (int i = 0; i < n; i++) y[i] = clampd(x[i] + lam, lo ? lo[i] : 0.0, hi ? hi[i] : HUGE_VAL);
    free(bp);
    return KV_OK;
}

/* ---------------------------------------------------------------- k-means ---- */

int kv_kmeans_1d(const double *x, int n, int k_req, int *labels, double *centers, int *k_out,
                 kv_error *err) {
    if (n < 1 || k_req < 1)
        return kv_fail(err, KV_EINPUT,
                       "k-means needs at least one value and one cluster "
                       "(got n = %d, k = %d)",
                       n, k_req);
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return kv_fail(err, KV_EINPUT, "k-means: value %d is not finite", i);
    double *u = kv_malloc((size_t)n * sizeof *u, "k-means values", err);
    if (!u) return err ? err->code : KV_EINTERNAL;
    memcpy(u, x, (size_t)n * sizeof *u);
    qsort(u, (size_t)n, sizeof *u, cmp_double);
    int nd = 0; /* distinct values, ascending, compacted into u */
    for (int i = 0; i < n; i++)
        if (nd == 0 || u[i] != u[nd - 1]) u[nd++] = u[i];
    int k = k_req < nd ? k_req : nd;
    for (int c = 0; c < k; c++) centers[c] = u[(int)(((double)c + 0.5) * nd / k)];
    free(u);

    double *sum = kv_calloc((size_t)k, sizeof *sum, "k-means sums", err);
    int *cnt = kv_calloc((size_t)k, sizeof *cnt, "k-means counts", err);
    if (!sum || !cnt) {
        free(sum);
        free(cnt);
        return err ? err->code : KV_EINTERNAL;
    }
    for (int i = 0; i < n; i++) labels[i] = -1;
    for (int iter = 0; iter < 1000; iter++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            int best = 0;
            double bd = fabs(x[i] - centers[0]);
            for (int c = 1; c < k; c++) {
                double d = fabs(x[i] - centers[c]);
                if (d < bd) { /* strict: a tie keeps the lower centre */
                    bd = d;
                    best = c;
                }
            }
            if (labels[i] != best) changed = 1;
            labels[i] = best;
        }
        if (!changed) break;
        memset(sum, 0, (size_t)k * sizeof *sum);
        memset(cnt, 0, (size_t)k * sizeof *cnt);
        for (int i = 0; i < n; i++) {
            sum[labels[i]] += x[i];
            cnt[labels[i]]++;
        }
        for (int c = 0; c < k; c++)
            if (cnt[c]) centers[c] = sum[c] / cnt[c];
    }
    /* Centres of 1-D Lloyd iterations stay ordered; sort anyway and relabel to be safe. */
    int *perm = (int *)cnt; /* reuse: perm[new] = old */
    for (int c = 0; c < k; c++) perm[c] = c;
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && centers[perm[b]] < centers[perm[b - 1]]; b--) {
            int t = perm[b];
            perm[b] = perm[b - 1];
            perm[b - 1] = t;
        }
    int *inv = kv_malloc((size_t)k * sizeof *inv, "k-means relabel", err);
    if (!inv) {
        free(sum);
        free(cnt);
        return err ? err->code : KV_EINTERNAL;
    }
    for (int c = 0; c < k; c++) {
        inv[perm[c]] = c;
        sum[c] = centers[perm[c]];
    }
    memcpy(centers, sum, (size_t)k * sizeof *centers);
    for (int i = 0; i < n; i++) labels[i] = inv[labels[i]];
    free(inv);
    free(sum);
    free(cnt);
    if (k_out) *k_out = k;
    return KV_OK;
}

/* ---------------------------------------------------------------- layers ---- */

int kv_layer_budgets(kv_alloc_kind kind, const double *layer_sim, int n_layers, int n_kv_heads,
                     double ratio, int context, double p, int min_tokens, double *out,
                     kv_error *err) {
    if (n_layers < 1 || n_kv_heads < 1 || context < 1)
        return kv_fail(err, KV_EINPUT, "layer budgets need L, H_kv and C >= 1 (got %d, %d, %d)",
                       n_layers, n_kv_heads, context);
    if (!(ratio > 0.0 && ratio <= 1.0))
        return kv_fail(err, KV_EINPUT, "ratio %g is outside (0, 1]", ratio);
    if (min_tokens < 0) return kv_fail(err, KV_EINPUT, "min_tokens %d is negative", min_tokens);
    double total = ratio * (double)n_layers * n_kv_heads * context;
    double floor_l = (double)n_kv_heads * min_tokens, cap_l = (double)n_kv_heads * context;
    if (floor_l * n_layers > total * (1.0 + 1e-12))
        return kv_fail(err, KV_EINPUT,
                       "ratio %g is too small for the policy's fixed part: every head needs at "
                       "least %d tokens (%.0f in all) but the budget is %.1f tokens "
                       "(R * L * H_kv * C; short by %.1f)",
                       ratio, min_tokens, floor_l * n_layers, total, floor_l * n_layers - total);
    if (min_tokens > context)
        return kv_fail(err, KV_EINPUT, "min_tokens %d exceeds the context %d", min_tokens, context);
    double share = total / n_layers;
    for (int l = 0; l < n_layers; l++) out[l] = share;
    if (kind == KV_ALLOC_SQUEEZE) {
        if (!layer_sim) return kv_fail(err, KV_EINPUT, "squeeze needs the layer similarity");
        if (!(p >= 0.0 && p <= 1.0))
            return kv_fail(err, KV_EINPUT, "SqueezeAttention p = %g is outside [0, 1]", p);
        int *lab = kv_malloc((size_t)n_layers * sizeof *lab, "layer clusters", err);
        if (!lab) return err ? err->code : KV_EINTERNAL;
        double centers[3];
        int k = 0;
        int rc = kv_kmeans_1d(layer_sim, n_layers, 3, lab, centers, &k, err);
        if (rc) {
            free(lab);
            return kv_fail_context(err, "SqueezeAttention layer clustering");
        }
        int n_sim = 0;
        for (int l = 0; l < n_layers; l++) n_sim += lab[l] == k - 1;
        if (k > 1 && n_sim < n_layers) {
            double give = n_sim * (1.0 - p) * share / (n_layers - n_sim);
            for (int l = 0; l < n_layers; l++) out[l] = lab[l] == k - 1 ? p * share : share + give;
        }
        free(lab);
    } else if (kind != KV_ALLOC_UNIFORM) {
        return kv_fail(err, KV_EINPUT, "layer budgets are 'uniform' or 'squeeze', not '%s'",
                       kv_alloc_name(kind));
    }
    double *lo = kv_malloc((size_t)2 * n_layers * sizeof *lo, "layer bounds", err);
    if (!lo) return err ? err->code : KV_EINTERNAL;
    double *hi = lo + n_layers;
    for (int l = 0; l < n_layers; l++) {
        lo[l] = floor_l;
        hi[l] = cap_l;
    }
    int rc = kv_project_box(n_layers, out, lo, hi, total, out, err);
    free(lo);
    return rc ? kv_fail_context(err, "layer budget caps") : KV_OK;
}

/* ---------------------------------------------------------------- heads (Alg. 2) ---- */

int kv_head_realloc(int m, const double *sim, const double *importance, double t, double r,
                    double lo, double hi, double *budget, int *n_low, kv_error *err) {
    if (m < 1) return kv_fail(err, KV_EINPUT, "Alg. 2 needs at least one head");
    if (!(r >= 0.0 && r <= 1.0))
        return kv_fail(err, KV_EINPUT, "reduction r = %g is outside [0, 1]", r);
    if (!(lo <= hi)) return kv_fail(err, KV_EINPUT, "head bounds lo %g > hi %g", lo, hi);
    double total = 0.0;
    for (int i = 0; i < m; i++) total += budget[i];
    double tol = 1e-9 * (fabs(total) + 1.0);
    if (total < m * lo - tol || (isfinite(hi) && total > m * hi + tol))
        return kv_fail(err, KV_EINPUT,
                       "layer budget %.2f tokens is outside [%d * %g, %d * %g] for its heads",
                       total, m, lo, m, hi);
    int n = 0;
    for (int i = 0; i < m; i++) n += sim[i] > t; /* line 1: low importance = high similarity */
    if (n_low) *n_low = n;
    if (n > 0 && n < m) { /* line 2: all (or none) low -> unchanged */
        char *is_low = kv_calloc((size_t)m, 1, "Alg. 2 flags", err);
        if (!is_low) return err ? err->code : KV_EINTERNAL;
        double freed = 0.0;
        for (int i = 0; i < m; i++)
            if (sim[i] > t) {
                is_low[i] = 1;
                freed += r * budget[i]; /* line 6 */
                budget[i] -= r * budget[i];
            }
        int k = n < m - n ? n : m - n;      /* line 9 */
        double delta = freed / k;           /* line 11: n * r / k for equal budgets */
        for (int got = 0; got < k; got++) { /* line 10: top-k by importance, one at a time */
            int best = -1;
            double bi = -HUGE_VAL;
            for (int i = 0; i < m; i++) {
                if (is_low[i]) continue;
                double imp = importance ? importance[i] : 1.0 - sim[i];
                if (best < 0 || imp > bi) {
                    best = i;
                    bi = imp;
                }
            }
            is_low[best] = 2;      /* taken */
            budget[best] += delta; /* line 13 */
        }
        free(is_low);
    }
    int inside = 1;
    for (int i = 0; i < m; i++)
        if (budget[i] < lo || budget[i] > hi) inside = 0;
    if (inside) return KV_OK;
    double *b = kv_malloc((size_t)2 * m * sizeof *b, "head bounds", err);
    if (!b) return err ? err->code : KV_EINTERNAL;
    for (int i = 0; i < m; i++) {
        b[i] = lo;
        b[m + i] = hi;
    }
    int rc = kv_project_box(m, budget, b, b + m, total, budget, err);
    free(b);
    return rc ? kv_fail_context(err, "head budget caps") : KV_OK;
}

/* ---------------------------------------------------------------- whole plan ---- */

int kv_alloc_budgets(const kv_alloc_params *a, int n_layers, int n_kv_heads,
                     const double *layer_sim, const double *head_sim, const double *head_imp,
                     double *out, kv_error *err) {
    if (n_layers < 1 || n_kv_heads < 1)
        return kv_fail(err, KV_EINPUT, "allocation needs L, H_kv >= 1");
    kv_alloc_kind lk;
    switch (a->kind) {
    case KV_ALLOC_UNIFORM:
        lk = KV_ALLOC_UNIFORM;
        break;
    case KV_ALLOC_SQUEEZE:
        lk = KV_ALLOC_SQUEEZE;
        break;
    case KV_ALLOC_BAKLAVA:
        lk = a->layer_kind;
        if (!head_sim) return kv_fail(err, KV_EINPUT, "baklava needs the head similarity");
        if (!(a->t >= 0.0 && a->t <= 1.0))
            return kv_fail(err, KV_EINPUT, "threshold t = %g is outside [0, 1]", a->t);
        break;
    default:
        return kv_fail(err, KV_EINPUT, "unknown allocation kind %d", (int)a->kind);
    }
    double *lb = kv_malloc((size_t)n_layers * sizeof *lb, "layer budgets", err);
    if (!lb) return err ? err->code : KV_EINTERNAL;
    int rc = kv_layer_budgets(lk, layer_sim, n_layers, n_kv_heads, a->ratio, a->context, a->p,
                              a->min_tokens, lb, err);
    for (int l = 0; !rc && l < n_layers; l++) {
        double *row = out + (size_t)l * n_kv_heads;
        for (int j = 0; j < n_kv_heads; j++) row[j] = lb[l] / n_kv_heads;
        if (a->kind == KV_ALLOC_BAKLAVA) {
            rc = kv_head_realloc(n_kv_heads, head_sim + (size_t)l * n_kv_heads,
                                 head_imp ? head_imp + (size_t)l * n_kv_heads : NULL, a->t, a->r,
                                 a->min_tokens, a->context, row, NULL, err);
            if (rc) kv_fail_context(err, "layer %d", l);
        }
    }
    free(lb);
    return rc;
}

/* ---------------------------------------------------------------- rounding ---- */

static const char *glp_ret_name(int ret) {
    switch (ret) {
    case GLP_EBOUND:
        return "invalid bounds (GLP_EBOUND)";
    case GLP_EROOT:
        return "no root LP optimum (GLP_EROOT)";
    case GLP_ENOPFS:
        return "no primal feasible solution (GLP_ENOPFS)";
    case GLP_ENODFS:
        return "no dual feasible solution (GLP_ENODFS)";
    case GLP_EFAIL:
        return "solver failure (GLP_EFAIL)";
    case GLP_EMIPGAP:
        return "MIP gap tolerance reached (GLP_EMIPGAP)";
    case GLP_ETMLIM:
        return "time limit (GLP_ETMLIM)";
    case GLP_ESTOP:
        return "stopped (GLP_ESTOP)";
    default:
        return "unknown return code";
    }
}

/* Stage 1 of kv_round_budgets: the arguments, and whether N blocks fit between n heads' lower
 * (policy floor) and upper (context) bounds lo, hi. */
static int round_check(int n, const double *x, double total, int block_size, int min_tokens,
                       int context, long *N, long *lo, long *hi, kv_error *err) {
    if (n < 1 || block_size < 1 || context < 1 || min_tokens < 0)
        return kv_fail(err, KV_EINPUT,
                       "rounding needs n, b_s, C >= 1 and min_tokens >= 0 "
                       "(got %d, %d, %d, %d)",
                       n, block_size, context, min_tokens);
    if (min_tokens > context)
        return kv_fail(err, KV_EINPUT,
                       "the policy's fixed part plus the eviction block (%d "
                       "tokens) exceeds the context %d",
                       min_tokens, context);
    if (!(total >= 0.0) || !isfinite(total))
        return kv_fail(err, KV_EINPUT, "total budget %g is not a non-negative number", total);
    *N = (long)floor(total / block_size + 1e-9);
    *lo = (min_tokens + block_size - 1) / block_size;
    *hi = (context + block_size - 1) / block_size;
    if (*lo * n > *N)
        return kv_fail(err, KV_EINPUT,
                       "infeasible rounding: the lower bounds need %ld blocks (%d heads x %ld "
                       "blocks for the policy's %d fixed tokens) but the budget has %ld blocks of "
                       "%d tokens; the ratio is too small, short by %ld blocks",
                       *lo * n, n, *lo, min_tokens, *N, block_size, *lo * n - *N);
    if (*hi * n < *N)
        return kv_fail(err, KV_EINPUT,
                       "infeasible rounding: the upper bounds allow %ld blocks (%d heads x %ld "
                       "blocks for the context %d) but the budget has %ld blocks; over by %ld "
                       "blocks",
                       *hi * n, n, *hi, context, *N, *N - *hi * n);
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return kv_fail(err, KV_EINPUT, "budget %d is not finite", i);
    return KV_OK;
}

/* Stage 2: the MIP. Columns b_i (integer blocks in [lo, hi]) and d_i >= |b_i - y_i| with
 * y_i = x_i / b_s; minimise sum d_i subject to sum b_i = N. The chord row makes d_i exact at
 * the two integers around y_i, so the LP relaxation is already tight. */
static int round_build(int n, const double *x, int block_size, long N, long lo, long hi,
                       glp_prob **out, kv_error *err) {
    int *ia = kv_malloc((size_t)(7 * n + 1) * sizeof *ia, "MIP rows", err);
    int *ja = kv_malloc((size_t)(7 * n + 1) * sizeof *ja, "MIP cols", err);
    double *ar = kv_malloc((size_t)(7 * n + 1) * sizeof *ar, "MIP coefficients", err);
    if (!ia || !ja || !ar) {
        free(ia);
        free(ja);
        free(ar);
        return err ? err->code : KV_EINTERNAL;
    }
    glp_prob *P = glp_create_prob();
    glp_set_obj_dir(P, GLP_MIN);
    glp_add_cols(P, 2 * n);
    glp_add_rows(P, 1 + 3 * n);
    int ne = 0;
    /* row 1: sum b_i = N */
    glp_set_row_bnds(P, 1, GLP_FX, (double)N, (double)N);
    for (int i = 0; i < n; i++) {
        int cb = 1 + i, cd = 1 + n + i;
        double y = x[i] / block_size, fl = floor(y), phi = y - fl;
        glp_set_col_kind(P, cb, GLP_IV);
        if (lo == hi)
            glp_set_col_bnds(P, cb, GLP_FX, (double)lo, (double)hi);
        else
            glp_set_col_bnds(P, cb, GLP_DB, (double)lo, (double)hi);
        glp_set_col_bnds(P, cd, GLP_LO, 0.0, 0.0);
        glp_set_obj_coef(P, cd, 1.0);
        ia[++ne] = 1, ja[ne] = cb, ar[ne] = 1.0;
        int r1 = 2 + 3 * i, r2 = r1 + 1, r3 = r1 + 2;
        /* d - b >= -y */
        glp_set_row_bnds(P, r1, GLP_LO, -y, 0.0);
        ia[++ne] = r1, ja[ne] = cd, ar[ne] = 1.0;
        ia[++ne] = r1, ja[ne] = cb, ar[ne] = -1.0;
        /* d + b >= y */
        glp_set_row_bnds(P, r2, GLP_LO, y, 0.0);
        ia[++ne] = r2, ja[ne] = cd, ar[ne] = 1.0;
        ia[++ne] = r2, ja[ne] = cb, ar[ne] = 1.0;
        /* chord: d - (1 - 2 phi) b >= phi - (1 - 2 phi) floor(y) */
        glp_set_row_bnds(P, r3, GLP_LO, phi - (1.0 - 2.0 * phi) * fl, 0.0);
        ia[++ne] = r3, ja[ne] = cd, ar[ne] = 1.0;
        ia[++ne] = r3, ja[ne] = cb, ar[ne] = -(1.0 - 2.0 * phi);
    }
    glp_load_matrix(P, ne, ia, ja, ar);
    free(ia);
    free(ja);
    free(ar);
    *out = P;
    return KV_OK;
}

/* Stage 3: solve, check the status, and read blocks (and tokens = blocks x b_s) per head. */
static int round_solve(glp_prob *P, int n, int block_size, long N, long lo, long hi, int *tokens,
                       int *blocks, kv_error *err) {
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = 60000;
    int ret = glp_intopt(P, &parm);
    if (ret != 0)
        return kv_fail(err, ret == GLP_ENOPFS ? KV_EINPUT : KV_EINTERNAL,
                       "GLPK rounding of %d budgets to %ld blocks failed: %s", n, N,
                       glp_ret_name(ret));
    int st = glp_mip_status(P);
    if (st != GLP_OPT)
        return kv_fail(err, st == GLP_NOFEAS ? KV_EINPUT : KV_EINTERNAL,
                       "GLPK rounding of %d budgets: MIP status %s, not optimal", n,
                       st == GLP_NOFEAS ? "GLP_NOFEAS (infeasible)"
                       : st == GLP_FEAS ? "GLP_FEAS"
                                        : "GLP_UNDEF");
    long sum = 0;
    for (int i = 0; i < n; i++) {
        long b = lround(glp_mip_col_val(P, 1 + i));
        if (b < lo || b > hi)
            return kv_fail(err, KV_EINTERNAL,
                           "GLPK returned %ld blocks for head %d, outside [%ld, %ld]", b, i, lo,
                           hi);
        sum += b;
        tokens[i] = (int)(b * block_size);
        if (blocks) blocks[i] = (int)b;
    }
    if (sum != N)
        return kv_fail(err, KV_EINTERNAL, "GLPK returned %ld blocks in all, not %ld", sum, N);
    return KV_OK;
}

int kv_round_budgets(int n, const double *x, double total, int block_size, int min_tokens,
                     int context, int *tokens, int *blocks, kv_error *err) {
    long N = 0, lo = 0, hi = 0;
    int rc = round_check(n, x, total, block_size, min_tokens, context, &N, &lo, &hi, err);
    if (rc) return rc;
    glp_prob *P = NULL;
    int old_term = glp_term_out(GLP_OFF);
    rc = round_build(n, x, block_size, N, lo, hi, &P, err);
    if (!rc) rc = round_solve(P, n, block_size, N, lo, hi, tokens, blocks, err);
    if (P) glp_delete_prob(P);
    glp_term_out(old_term);
    return rc;
}

int kv_plan_budgets(const kv_alloc_params *a, int n_layers, int n_kv_heads, const double *layer_sim,
                    const double *head_sim, const double *head_imp, int *tokens, int *blocks,
                    double *real_out, kv_error *err) {
    if (n_layers < 1 || n_kv_heads < 1)
        return kv_fail(err, KV_EINPUT, "allocation needs L, H_kv >= 1");
    size_t n = (size_t)n_layers * n_kv_heads;
    double *x = real_out ? real_out : kv_malloc(n * sizeof *x, "real budgets", err);
    if (!x) return err ? err->code : KV_EINTERNAL;
    int rc = kv_alloc_budgets(a, n_layers, n_kv_heads, layer_sim, head_sim, head_imp, x, err);
    if (!rc && a->kind == KV_ALLOC_UNIFORM) {
        /* "uniform at R" has one definition (kvplan/plan.h): the exact-sum rounding of R * C
         * per head in closed form, the same budgets `eval --ratio R` runs */
        rc = kv_uniform_budgets((int)n, a->ratio, a->context, a->block_size, tokens, blocks, err);
        int lo = (a->min_tokens + a->block_size - 1) / a->block_size * a->block_size;
        for (size_t i = 0; !rc && i < n; i++)
            if (tokens[i] < lo && tokens[i] < a->context)
                rc = kv_fail(err, KV_EINPUT,
                             "ratio %g is too small for the policy's fixed part: uniform budgets "
                             "give %d tokens per head, below the floor of %d",
                             a->ratio, tokens[i], lo);
    } else if (!rc) {
        double total = a->ratio * (double)n_layers * n_kv_heads * a->context;
        rc = kv_round_budgets((int)n, x, total, a->block_size, a->min_tokens, a->context, tokens,
                              blocks, err);
    }
    if (x != real_out) free(x);
    return rc;
}

/* ---------------------------------------------------------------- successive halving ---- */

typedef struct sh_item {
    int config;
    double ppl;
} sh_item;

static int sh_cmp(const void *a, const void *b) {
    const sh_item *x = a, *y = b;
    double px = isnan(x->ppl) ? HUGE_VAL : x->ppl, py = isnan(y->ppl) ? HUGE_VAL : y->ppl;
    if (px < py) return -1;
    if (px > py) return 1;
    return (x->config > y->config) - (x->config < y->config);
}

int kv_successive_halving(int n_configs, const kv_sh_opts *o, kv_sh_eval_fn eval, void *user,
                          kv_sh_result *res, double *last_ppl, kv_error *err) {
    if (n_configs < 1 || !eval || !o)
        return kv_fail(err, KV_EINPUT, "successive halving needs configurations and a callback");
    if (o->eta < 2 || o->min_chunks < 1 || o->max_chunks < o->min_chunks || o->tokens_per_chunk < 0)
        return kv_fail(err, KV_EINPUT,
                       "successive halving: need eta >= 2 and 1 <= min_chunks "
                       "<= max_chunks (got %d, %d, %d)",
                       o->eta, o->min_chunks, o->max_chunks);
    memset(res, 0, sizeof *res);
    res->winner = -1;
    sh_item *alive = kv_malloc((size_t)n_configs * sizeof *alive, "halving configs", err);
    int *done = kv_calloc((size_t)n_configs, sizeof *done, "halving chunks", err);
    if (!alive || !done) {
        free(alive);
        free(done);
        return err ? err->code : KV_EINTERNAL;
    }
    if (last_ppl)
        for (int i = 0; i < n_configs; i++) last_ppl[i] = NAN;
    int n_alive = n_configs, chunks = o->min_chunks, rc = KV_OK;
    for (int i = 0; i < n_configs; i++) alive[i].config = i;
    for (;;) {
        if (o->round) { /* the round's configs at once (in alive order), before their evals */
            int *cfg = kv_malloc((size_t)n_alive * sizeof *cfg, "halving round", err);
            if (!cfg) {
                rc = KV_EINTERNAL;
                break;
            }
            for (int i = 0; i < n_alive; i++) cfg[i] = alive[i].config;
            rc = o->round(user, cfg, n_alive, chunks, err);
            free(cfg);
            if (rc) break;
        }
        for (int i = 0; i < n_alive && !rc; i++) {
            int c = alive[i].config;
            rc = eval(user, c, chunks, &alive[i].ppl, err);
            res->chunk_evals += o->prefix_reuse ? chunks - done[c] : chunks;
            done[c] = chunks;
            if (last_ppl) last_ppl[c] = alive[i].ppl;
        }
        if (rc) break;
        res->rounds++;
        qsort(alive, (size_t)n_alive, sizeof *alive, sh_cmp);
        int keep = (n_alive + o->eta - 1) / o->eta;
        if (n_alive == 1 || keep == 1 || chunks == o->max_chunks) {
            res->winner = alive[0].config;
            res->winner_ppl = alive[0].ppl;
            res->winner_chunks = chunks;
            break;
        }
        n_alive = keep;
        chunks = (long)chunks * o->eta > o->max_chunks ? o->max_chunks : chunks * o->eta;
    }
    res->token_evals = res->chunk_evals * o->tokens_per_chunk;
    free(alive);
    free(done);
    return rc;
}
