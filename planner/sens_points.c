/* kvplan sparse loss curves: which curve points a measurement pass runs and how the points it
 * did not run are filled (planner/sensitivity.h, "Sparse curves"). Pure functions over the
 * curve arrays; the engine work is kv_sens_measure_typed's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/sensitivity.h"

/* The curve index of (head h, type ty, policy q, level k) in [n_heads, T, Q, K]. */
static long pt(const kv_sens_curves *c, int h, int ty, int q, int k) {
    return (((long)h * c->n_types + ty) * c->n_policies + q) * c->n_levels + k;
}

/* The reference type of head h: its base type's index among the candidates (0 when the base
 * type is not one of them). */
static int ref_type(const kv_sens_curves *c, int h) {
    for (int ty = 0; ty < c->n_types; ty++)
        if (c->types[ty] == c->base_type[h]) return ty;
    return 0;
}

static int tokens_of(const kv_sens_curves *c, const kv_sens_opts *o, int k) {
    long t = (long)c->levels[k] * o->block_size;
    return t > o->context ? o->context : (int)t;
}

/* The highest level index whose tokens are <= the head's base budget (-1: none). */
static int base_index(const kv_sens_curves *c, const kv_sens_opts *o, int h) {
    int j = -1;
    for (int k = 0; k < c->n_levels; k++)
        if (tokens_of(c, o, k) <= c->base[h]) j = k;
    return j;
}

/* Pass 0: every other level of the reference curve, every third of the other types' curves
 * (none in a refinement round, with prev: they follow the reference curve), always the top
 * level and the base level. */
static int first_pass_point(const kv_sens_curves *c, const kv_sens_opts *o,
                            const kv_sens_curves *prev, int h, int ty, int k) {
    const int K = c->n_levels, ref = ty == ref_type(c, h);
    if (prev && !ref) return 0;
    if (k == K - 1 || k == base_index(c, o, h)) return 1;
    return ref ? k % 2 == 0 : k % 3 == 0;
}

/* The largest change of the objective's curves (KL, NLL or both) between points i and j. */
static double gap(const kv_sens_curves *c, const kv_sens_opts *o, long i, long j) {
    double g = 0;
    if (o->objective != KV_SENS_OBJ_NLL) g = fabs(c->kl[j] - c->kl[i]);
    if (o->objective != KV_SENS_OBJ_KL) {
        double d = fabs(c->delta_nll[j] - c->delta_nll[i]);
        g = d > g ? d : g;
    }
    return isnan(g) ? HUGE_VAL : g;
}

/* Pass 1: an unmeasured point of a reference curve runs unless the nearest measured points on
 * both sides differ by at most tol (the curve is flat there). */
static int refine_point(const kv_sens_curves *c, const kv_sens_opts *o, const unsigned char *known,
                        int h, int ty, int q, int k, double tol) {
    const int r = ref_type(c, h);
    if (ty != r) return 0;
    int lo = k - 1, hi = k + 1;
    while (lo >= 0 && !known[pt(c, h, ty, q, lo)]) lo--;
    while (hi < c->n_levels && !known[pt(c, h, ty, q, hi)]) hi++;
    if (lo < 0 || hi >= c->n_levels) return 1;
    return gap(c, o, pt(c, h, ty, q, lo), pt(c, h, ty, q, hi)) > tol;
}

int kv_sens_pick_points(const kv_sens_curves *c, const kv_sens_opts *o, int pass,
                        const kv_sens_curves *prev, const unsigned char *known,
                        unsigned char *want) {
    const double tol = KV_SENS_FLAT_TOL * fabs(c->base_kl);
    int n = 0;
    for (int h = 0; h < c->n_heads; h++)
        for (int ty = 0; ty < c->n_types; ty++)
            for (int q = 0; q < c->n_policies; q++)
                for (int k = 0; k < c->n_levels; k++) {
                    long i = pt(c, h, ty, q, k);
                    int w = 0;
                    if (known[i])
                        w = 0;
                    else if (pass == 0)
                        w = first_pass_point(c, o, prev, h, ty, k);
                    else
                        w = refine_point(c, o, known, h, ty, q, k, tol);
                    want[i] = (unsigned char)w;
                    n += w;
                }
    return n;
}

/* Linear interpolation in blocks at level k of v (stride 1 over the levels of one curve) from
 * the nearest known finite points; one side only: that point's value; none: NaN. */
static double interp(const kv_sens_curves *c, const double *v, const unsigned char *known, int k) {
    int lo = k - 1, hi = k + 1;
    while (lo >= 0 && !(known[lo] && isfinite(v[lo]))) lo--;
    while (hi < c->n_levels && !(known[hi] && isfinite(v[hi]))) hi++;
    if (lo < 0 && hi >= c->n_levels) return NAN;
    if (lo < 0) return v[hi];
    if (hi >= c->n_levels) return v[lo];
    double f = (double)(c->levels[k] - c->levels[lo]) / (c->levels[hi] - c->levels[lo]);
    return v[lo] + f * (v[hi] - v[lo]);
}

/* One curve (h, ty, q): the reference curve interpolated; another type's as the reference curve
 * plus its offset to it, interpolated between the points it measured or, with prev, the
 * offset between the two types in prev at that level. */
static void fill_curve(kv_sens_curves *c, const kv_sens_curves *prev, const unsigned char *known,
                       int h, int ty, int q, double *off) {
    const int K = c->n_levels, r = ref_type(c, h);
    const long i0 = pt(c, h, ty, q, 0), r0 = pt(c, h, r, q, 0);
    const unsigned char *kn = known + i0;
    for (int a = 0; a < 2; a++) {
        double *v = (a ? c->kl : c->delta_nll) + i0;
        const double *ref = (a ? c->kl : c->delta_nll) + r0;
        if (ty == r) {
            for (int k = 0; k < K; k++)
                if (!kn[k]) v[k] = interp(c, v, kn, k);
            continue;
        }
        if (prev) {
            const double *pv = (a ? prev->kl : prev->delta_nll) + i0;
            const double *pr = (a ? prev->kl : prev->delta_nll) + r0;
            for (int k = 0; k < K; k++)
                if (!kn[k]) v[k] = ref[k] + (pv[k] - pr[k]);
            continue;
        }
        for (int k = 0; k < K; k++) off[k] = kn[k] ? v[k] - ref[k] : NAN;
        for (int k = 0; k < K; k++)
            if (!kn[k]) v[k] = ref[k] + interp(c, off, kn, k);
    }
}

int kv_sens_fill_points(kv_sens_curves *c, const unsigned char *known, const kv_sens_curves *prev,
                        kv_error *err) {
    if (prev && (prev->n_heads != c->n_heads || prev->n_types != c->n_types ||
                 prev->n_policies != c->n_policies || prev->n_levels != c->n_levels))
        return kv_fail(err, KV_EINPUT, "sensitivity: the previous curves have another shape");
    double *off = kv_malloc((size_t)c->n_levels * sizeof *off, "curve offsets", err);
    if (!off) return KV_EINTERNAL;
    for (int h = 0; h < c->n_heads; h++) {
        const int r = ref_type(c, h);
        /* the reference curve first: the other types' offsets are taken to it */
        for (int s = 0; s < c->n_types; s++) {
            const int ty = s == 0 ? r : s <= r ? s - 1 : s;
            for (int q = 0; q < c->n_policies; q++) {
                fill_curve(c, prev, known, h, ty, q, off);
            }
        }
    }
    free(off);
    return KV_OK;
}
