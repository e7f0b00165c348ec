/* KVPR split point: KVPR (Jiang et al.) Eq. 6-11 generalised to GQA, solved with GLPK's MIP
 * solver and in closed form. See include/kvplan/kvpr.h for the model and the units. */
#include "kvplan/kvpr.h"

#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *kv_schedule_name(kv_schedule s) {
    return s == KV_SCHED_ROW ? "row" : "column";
}

int kv_schedule_parse(const char *s, kv_schedule *out, kv_error *err) {
    if (s && (!strcmp(s, "column") || !strcmp(s, "col") || !strcmp(s, "column-by-column"))) {
        *out = KV_SCHED_COLUMN;
        return KV_OK;
    }
    if (s && (!strcmp(s, "row") || !strcmp(s, "row-by-row"))) {
        *out = KV_SCHED_ROW;
        return KV_OK;
    }
    return kv_fail(err, KV_EINPUT, "unknown schedule '%s' (expected row or column)",
                   s ? s : "(null)");
}

/* Bytes per K/V element as stored (kv_bytes, else p). */
static double kv_elem_bytes(const kv_kvpr_shape *sh) {
    return sh->kv_bytes > 0 ? sh->kv_bytes : sh->dtype_bytes;
}

/* Whether sending a token's activation costs at least its K and V: h p >= 2 h_kv p_kv. */
static int activations_dearer(const kv_kvpr_shape *sh, kv_schedule sched) {
    return sched == KV_SCHED_COLUMN &&
           (double)sh->hidden * sh->dtype_bytes >= 2.0 * (double)sh->kv_width * kv_elem_bytes(sh);
}

int kv_kvpr_check(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_error *err) {
    if (!sh) return kv_fail(err, KV_EINPUT, "no KVPR shape given");
    if (sh->batch < 1) return kv_fail(err, KV_EINPUT, "batch b = %ld: need at least 1", sh->batch);
    if (sh->seq < 1)
        return kv_fail(err, KV_EINPUT,
                       "current length s' = %ld: nothing is offloaded, there is no split to "
                       "choose (need s' >= 1)",
                       sh->seq);
    if (sh->hidden < 1)
        return kv_fail(err, KV_EINPUT, "hidden size h = %ld: need >= 1", sh->hidden);
    if (sh->kv_width < 1)
        return kv_fail(err, KV_EINPUT, "KV width h_kv = H_kv * d_h = %ld: need >= 1", sh->kv_width);
    if (sh->kv_bytes < 0 || !isfinite(sh->kv_bytes))
        return kv_fail(err, KV_EINPUT, "KVPR: %g bytes per stored K/V element: need >= 0",
                       sh->kv_bytes);
    if (!(sh->dtype_bytes > 0) || !isfinite(sh->dtype_bytes))
        return kv_fail(err, KV_EINPUT, "element size p = %g bytes: need a positive number",
                       sh->dtype_bytes);
    if (!(v_com > 0) || !isfinite(v_com))
        return kv_fail(err, KV_EINPUT,
                       "transfer bandwidth v_com = %g bytes/s: need a positive finite figure "
                       "(a zero bandwidth never moves the cache)",
                       v_com);
    if (!(v_gpu > 0) || !isfinite(v_gpu))
        return kv_fail(err, KV_EINPUT,
                       "device speed v_gpu = %g FLOP/s: need a positive finite figure", v_gpu);
    return KV_OK;
}

int kv_kvpr_eval(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched, long l,
                 kv_kvpr_result *out, kv_error *err) {
    int rc = kv_kvpr_check(sh, v_com, v_gpu, err);
    if (rc) return rc;
    if (l < 0 || l > sh->seq)
        return kv_fail(err, KV_EINPUT, "split l = %ld is outside 0..s' = %ld", l, sh->seq);
    memset(out, 0, sizeof *out);
    double b = (double)sh->batch, s = (double)sh->seq, h = (double)sh->hidden;
    double hkv = (double)sh->kv_width, p = sh->dtype_bytes, pk = kv_elem_bytes(sh), ld = (double)l;
    out->split = l;
    out->bytes_activations = b * ld * h * p;       /* Eq. 6, M_X */
    out->bytes_kv = 2.0 * b * (s - ld) * hkv * pk; /* Eq. 6, M_KV with h_kv, stored bytes */
    out->flops = 4.0 * b * ld * h * hkv;           /* Eq. 8 with W_K, W_V [h, h_kv] */
    out->t_activations = sched == KV_SCHED_COLUMN ? out->bytes_activations / v_com : 0.0;
    out->t_recompute = out->flops / v_gpu; /* Eq. 9 */
    out->t_transfer = out->bytes_kv / v_com;
    out->time = out->t_activations + fmax(out->t_recompute, out->t_transfer); /* Eq. 10 */
    out->time_no_recompute = 2.0 * b * s * hkv * pk / v_com;
    out->bound = out->t_recompute > out->t_transfer ? KV_BOUND_COMPUTE : KV_BOUND_TRANSFER;
    out->activations_dearer = activations_dearer(sh, sched);
    return KV_OK;
}

/* One sentence on why the split is what it is (fills r->note). */
static void explain(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched,
                    kv_kvpr_result *r) {
    double p = sh->dtype_bytes;
    if (r->split == 0 && r->activations_dearer) {
        snprintf(r->note, sizeof r->note,
                 "sending a token's activation (h*p = %.0f bytes) costs at least as much as "
                 "sending its K and V (2*h_kv*p = %.0f bytes) under GQA, so recomputation cannot "
                 "pay off: l = 0, transfer the whole cache",
                 (double)sh->hidden * p, 2.0 * (double)sh->kv_width * kv_elem_bytes(sh));
    } else if (r->split == 0) {
        snprintf(r->note, sizeof r->note,
                 "recomputing one token on the device (%.3g s) costs more than the transfer it "
                 "saves (%.3g s): l = 0, transfer the whole cache",
                 4.0 * (double)sh->batch * (double)sh->hidden * (double)sh->kv_width / v_gpu,
                 2.0 * (double)sh->batch * (double)sh->kv_width * kv_elem_bytes(sh) / v_com);
    } else {
        double saved = r->time_no_recompute > 0 ? 1.0 - r->time / r->time_no_recompute : 0.0;
        /* per-token costs of the two overlapped terms: within one token of each other the
         * split sits at their crossing (l0 of kv_kvpr_closed_form) */
        double c = 4.0 * (double)sh->batch * (double)sh->hidden * (double)sh->kv_width / v_gpu;
        double k = 2.0 * (double)sh->batch * (double)sh->kv_width * kv_elem_bytes(sh) / v_com;
        int balanced = fabs(r->t_recompute - r->t_transfer) <= c + k;
        snprintf(r->note, sizeof r->note,
                 "recompute %ld of %ld tokens (%s schedule); bound by %s%s; %.1f%% faster than "
                 "transferring the whole cache",
                 r->split, sh->seq, kv_schedule_name(sched),
                 r->bound == KV_BOUND_COMPUTE ? "device recomputation (v_gpu)"
                                              : "the host-device link (v_com)",
                 balanced ? " (recomputation and transfer balanced to within one token)" : "",
                 100.0 * saved);
    }
}

int kv_kvpr_closed_form(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched,
                        kv_kvpr_result *out, kv_error *err) {
    int rc = kv_kvpr_check(sh, v_com, v_gpu, err);
    if (rc) return rc;
    long best = 0;
    /* a >= k  <=>  b h p / v_com >= 2 b h_kv p_kv / v_com  <=>  h p >= 2 h_kv p_kv (exact in
     * integers when p_kv = p: h >= 2 h_kv) */
    int dearer = activations_dearer(sh, sched);
    if (!dearer) {
        double b = (double)sh->batch, p = kv_elem_bytes(sh);
        double c = 4.0 * b * (double)sh->hidden * (double)sh->kv_width / v_gpu;
        double k = 2.0 * b * (double)sh->kv_width * p / v_com;
        double l0 = k * (double)sh->seq / (c + k);
        long lo = (long)floor(l0), hi = (long)ceil(l0);
        if (lo < 0) lo = 0;
        if (hi > sh->seq) hi = sh->seq;
        if (lo > sh->seq) lo = sh->seq;
        kv_kvpr_result rl, rh;
        if ((rc = kv_kvpr_eval(sh, v_com, v_gpu, sched, lo, &rl, err))) return rc;
        if ((rc = kv_kvpr_eval(sh, v_com, v_gpu, sched, hi, &rh, err))) return rc;
        best = rh.time < rl.time ? hi : lo;
    }
    if ((rc = kv_kvpr_eval(sh, v_com, v_gpu, sched, best, out, err))) return rc;
    explain(sh, v_com, v_gpu, sched, out);
    return KV_OK;
}

static const char *glpk_ret_name(int ret) {
    switch (ret) {
    case 0:
        return "0 (ok)";
    case GLP_EBOUND:
        return "GLP_EBOUND (invalid bounds)";
    case GLP_EROOT:
        return "GLP_EROOT (no optimal basis for the root LP)";
    case GLP_ENOPFS:
        return "GLP_ENOPFS (no primal feasible solution)";
    case GLP_ENODFS:
        return "GLP_ENODFS (no dual feasible solution)";
    case GLP_EFAIL:
        return "GLP_EFAIL (solver failure)";
    case GLP_EMIPGAP:
        return "GLP_EMIPGAP (relative MIP gap reached)";
    case GLP_ETMLIM:
        return "GLP_ETMLIM (time limit)";
    case GLP_ESTOP:
        return "GLP_ESTOP (terminated by the application)";
    default:
        return "unknown glp_intopt code";
    }
}

static const char *glpk_status_name(int st) {
    switch (st) {
    case GLP_OPT:
        return "GLP_OPT";
    case GLP_FEAS:
        return "GLP_FEAS (feasible, optimality not proven)";
    case GLP_NOFEAS:
        return "GLP_NOFEAS (no integer feasible solution)";
    case GLP_UNDEF:
        return "GLP_UNDEF (solution undefined)";
    default:
        return "unknown status";
    }
}

/* Run glp_intopt on P; on success *status = GLP_OPT. Failures name both GLPK codes. */
static int run_intopt(glp_prob *P, const char *what, int *status, kv_error *err) {
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON; /* solves the LP relaxation itself, no glp_simplex call needed */
    parm.msg_lev = GLP_MSG_OFF;
    int ret = glp_intopt(P, &parm);
    *status = glp_mip_status(P);
    if (ret != 0 || *status != GLP_OPT) return kv_kvpr_glpk_fail(ret, *status, what, err);
    return KV_OK;
}

int kv_kvpr_glpk_fail(int intopt_ret, int mip_status, const char *what, kv_error *err) {
    return kv_fail(err, KV_EINTERNAL,
                   "GLPK could not solve the KVPR split (%s): glp_intopt returned %s, "
                   "glp_mip_status is %s",
                   what ? what : "", glpk_ret_name(intopt_ret), glpk_status_name(mip_status));
}

int kv_kvpr_solve(const kv_kvpr_shape *sh, double v_com, double v_gpu, kv_schedule sched,
                  kv_kvpr_result *out, kv_error *err) {
    int rc = kv_kvpr_check(sh, v_com, v_gpu, err);
    if (rc) return rc;
    /* Time unit: the transfer time of one token's K and V for the batch,
     * k = 2 b h_kv p_kv / v_com. In that unit a' = a / k = h p / (2 h_kv p_kv), c' = c / k =
     * 2 h v_com / (p_kv v_gpu), k' = 1. */
    double s = (double)sh->seq;
    double pk = kv_elem_bytes(sh);
    double a1 = sched == KV_SCHED_COLUMN
                    ? (double)sh->hidden * sh->dtype_bytes / (2.0 * (double)sh->kv_width * pk)
                    : 0.0;
    double c1 = 2.0 * (double)sh->hidden * v_com / (pk * v_gpu);
    if (!isfinite(c1) || !isfinite(a1))
        return kv_fail(err, KV_EINPUT, "KVPR coefficients overflow (v_com %g, v_gpu %g, p %g)",
                       v_com, v_gpu, sh->dtype_bytes);

    glp_prob *P = glp_create_prob();
    glp_set_prob_name(P, "kvpr_split");
    glp_set_obj_dir(P, GLP_MIN);
    glp_add_cols(P, 2);
    glp_set_col_name(P, 1, "l");
    glp_set_col_kind(P, 1, GLP_IV);
    glp_set_col_bnds(P, 1, GLP_DB, 0.0, s); /* 0 <= l <= s' (Eq. 11) */
    glp_set_col_name(P, 2, "T");
    glp_set_col_bnds(P, 2, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(P, 1, a1);  /* M_X / v_com (column schedule) */
    glp_set_obj_coef(P, 2, 1.0); /* + T, the overlapped part */
    /* max(N/v_gpu, M_KV/v_com) <= T as two rows:
     *   row 1: T - c' l >= 0         (recomputation)
     *   row 2: T + l    >= s'        (transfer of K, V [l:s'])   */
    glp_add_rows(P, 2);
    int ind[3];
    double val[3];
    glp_set_row_name(P, 1, "recompute");
    glp_set_row_bnds(P, 1, GLP_LO, 0.0, 0.0);
    ind[1] = 1, val[1] = -c1, ind[2] = 2, val[2] = 1.0;
    glp_set_mat_row(P, 1, 2, ind, val);
    glp_set_row_name(P, 2, "transfer");
    glp_set_row_bnds(P, 2, GLP_LO, s, 0.0);
    ind[1] = 1, val[1] = 1.0, ind[2] = 2, val[2] = 1.0;
    glp_set_mat_row(P, 2, 2, ind, val);

    int status = 0;
    rc = run_intopt(P, "minimum step time", &status, err);
    if (!rc) {
        /* Lexicographic second stage: among the splits with the minimum time, the fewest
         * recomputed tokens (ties happen, e.g. h = 2 h_kv makes every l <= l0 optimal). */
        double tmin = glp_mip_obj_val(P);
        glp_add_rows(P, 1);
        glp_set_row_name(P, 3, "time_at_optimum");
        glp_set_row_bnds(P, 3, GLP_UP, 0.0, tmin + 1e-9 * fmax(1.0, fabs(tmin)));
        ind[1] = 1, val[1] = a1, ind[2] = 2, val[2] = 1.0;
        glp_set_mat_row(P, 3, 2, ind, val);
        glp_set_obj_coef(P, 1, 1.0);
        glp_set_obj_coef(P, 2, 0.0);
        rc = run_intopt(P, "fewest recomputed tokens at the minimum time", &status, err);
    }
    long l = 0;
    if (!rc) {
        double lv = glp_mip_col_val(P, 1);
        l = lround(lv);
        if (l < 0) l = 0;
        if (l > sh->seq) l = sh->seq;
    }
    glp_delete_prob(P);
    if (rc) return rc;
    if ((rc = kv_kvpr_eval(sh, v_com, v_gpu, sched, l, out, err))) return rc;
    out->glpk_status = status;
    explain(sh, v_com, v_gpu, sched, out);
    return KV_OK;
}
