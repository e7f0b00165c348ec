/* kvplan inspect: the human-readable summary (cli/inspect.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

/* A bar of `width` cells for value/maxv in [0, 1] using eighth blocks (UTF-8). */
static void bar(FILE *out, double value, double maxv, int width) {
    static const char *eighth[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
    double frac = (maxv > 0 && isfinite(value)) ? value / maxv : 0;
    if (frac < 0) frac = 0;
    if (frac > 1) frac = 1;
    int units = (int)lround(frac * width * 8);
    int cells = 0;
    for (; units >= 8; units -= 8, cells++) fputs("█", out);
    if (units > 0) {
        fputs(eighth[units], out);
        cells++;
    }
    for (; cells < width; cells++) fputc(' ', out);
}

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void print_shape(FILE *out, const ki_dset *d) {
    fputc('[', out);
    for (int i = 0; i < d->rank; i++) fprintf(out, "%s%ld", i ? ", " : "", d->dims[i]);
    fputc(']', out);
}

static void print_num(FILE *out, double v, int is_int) {
    if (isnan(v))
        fputs("nan", out);
    else if (is_int && fabs(v) < 1e15)
        fprintf(out, "%.0f", v);
    else
        fprintf(out, "%.6g", v);
}

/* Attributes of `obj` (except units), one line "  name = value" each, with `indent`. */
static void print_attrs(FILE *out, const ki_file *f, const char *obj, const char *indent,
                        const char *const *skip) {
    for (int i = 0; i < f->n_attrs; i++) {
        const ki_attr *a = &f->attrs[i];
        if (strcmp(a->obj, obj) != 0 || !strcmp(a->name, "units")) continue;
        int skipped = 0;
        for (int k = 0; skip && skip[k]; k++)
            if (!strcmp(skip[k], a->name)) skipped = 1;
        if (skipped) continue;
        fprintf(out, "%s%s = ", indent, a->name);
        if (a->kind == 's')
            fprintf(out, "%s", a->str);
        else if (a->kind == 'i')
            print_num(out, a->num, 1);
        else if (a->kind == 'f')
            print_num(out, a->num, 0);
        else
            fputs("(array or unsupported type)", out);
        fputc('\n', out);
    }
}

/* The i-th comma-separated name of `list` into buf; 0 when there are not that many. */
static int nth_name(const char *list, int i, char *buf, size_t cap) {
    if (!list) return 0;
    for (int k = 0; k < i; k++) {
        list = strchr(list, ',');
        if (!list) return 0;
        list++;
    }
    size_t n = strcspn(list, ",");
    if (n >= cap) n = cap - 1;
    memcpy(buf, list, n);
    buf[n] = '\0';
    return 1;
}

/* A dataset's values: inline when short (labelled by a `names` attribute when it has one), a
 * table for a small matrix, else a summary. */
static void print_values(FILE *out, const ki_file *f, const ki_dset *d, const char *indent) {
    if (!d->v) {
        fprintf(out, "%s(not numeric)\n", indent);
        return;
    }
    const char *names = ki_attr_str(f, d->path, "names");
    char nm[64];
    if (d->rank == 1 && names && nth_name(names, (int)d->count - 1, nm, sizeof nm)) {
        fputs(indent, out);
        for (size_t i = 0; i < d->count; i++) {
            nth_name(names, (int)i, nm, sizeof nm);
            fprintf(out, "%s%s ", i ? ", " : "", nm);
            print_num(out, d->v[i], d->is_int);
        }
        fputc('\n', out);
        return;
    }
    if (d->rank == 1 && d->count <= 24) {
        fputs(indent, out);
        for (size_t i = 0; i < d->count; i++) {
            if (i) fputs("  ", out);
            print_num(out, d->v[i], d->is_int);
        }
        fputc('\n', out);
        return;
    }
    if (d->rank == 2 && d->dims[0] <= 40 && d->dims[1] <= 12) {
        for (long i = 0; i < d->dims[0]; i++) {
            fprintf(out, "%s%3ld |", indent, i);
            for (long j = 0; j < d->dims[1]; j++) {
                double v = d->v[i * d->dims[1] + j];
                if (isnan(v))
                    fprintf(out, " %10s", "nan");
                else if (d->is_int)
                    fprintf(out, " %10.0f", v);
                else
                    fprintf(out, " %10.5g", v);
            }
            fputc('\n', out);
        }
        return;
    }
    double mn = INFINITY, mx = -INFINITY, s = 0;
    size_t n = 0;
    for (size_t i = 0; i < d->count; i++)
        if (isfinite(d->v[i])) {
            mn = fmin(mn, d->v[i]);
            mx = fmax(mx, d->v[i]);
            s += d->v[i];
            n++;
        }
    if (n)
        fprintf(out, "%s%zu values: min %.6g, mean %.6g, max %.6g%s\n", indent, d->count, mn, s / n,
                mx, n < d->count ? " (non-finite skipped)" : "");
    else
        fprintf(out, "%s%zu values, none finite\n", indent, d->count);
}

/* Every dataset and group attribute under `prefix`, generically. Returns the number shown. */
static int print_generic(FILE *out, const ki_file *f, const char *prefix,
                         const char *const *skip_paths) {
    int shown = 0;
    for (int g = 0; g < f->n_groups; g++) {
        if (!starts_with(f->groups[g], prefix)) continue;
        int has = 0;
        for (int i = 0; i < f->n_attrs; i++)
            if (!strcmp(f->attrs[i].obj, f->groups[g])) has = 1;
        if (!has) continue;
        fprintf(out, "  %s:\n", f->groups[g]);
        print_attrs(out, f, f->groups[g], "      ", NULL);
        shown++;
    }
    for (int i = 0; i < f->n_dsets; i++) {
        const ki_dset *d = &f->dsets[i];
        if (!starts_with(d->path, prefix)) continue;
        int skip = 0;
        for (int k = 0; skip_paths && skip_paths[k]; k++)
            if (!strcmp(skip_paths[k], d->path)) skip = 1;
        if (skip) continue;
        const char *u = ki_units(f, d->path);
        fprintf(out, "  %s ", d->path);
        print_shape(out, d);
        if (u) fprintf(out, " (%s)", u);
        fputc('\n', out);
        print_attrs(out, f, d->path, "      @", NULL);
        print_values(out, f, d, "      ");
        shown++;
    }
    return shown;
}

/* A string attribute as shown in text output, or NULL when missing: bytes below 0x20 and 0x7f
 * (newlines, terminal escapes from a hostile file) become '?', and a value longer than
 * cap - 24 bytes is cut with a note of how much was left out, so no attribute becomes a
 * kilobyte-long line. buf has `cap` bytes (>= 32). */
static const char *attr_shown(const ki_file *f, const char *obj, const char *name, char *buf,
                              size_t cap) {
    const char *s = ki_attr_str(f, obj, name);
    if (!s) return NULL;
    size_t n = strlen(s), keep = n <= cap - 1 ? n : cap - 24, i;
    for (i = 0; i < keep; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (keep < n)
        snprintf(buf + i, cap - i, "... (%zu more bytes)", n - keep);
    else
        buf[i] = '\0';
    return buf;
}

static void print_header(FILE *out, const ki_file *f) {
    const char *kind = f->is_plan ? "plan" : f->is_profile ? "profile" : "file";
    char b_ver[64], b_created[64], b_cmd[400], b_mp[300], b_mf[64], b_sha[80];
    const char *ver = attr_shown(f, "/", "kvplan_version", b_ver, sizeof b_ver);
    const char *created = attr_shown(f, "/", "created", b_created, sizeof b_created);
    fprintf(out, "%s: kvplan %s (schema %.0f, written by kvplan %s, created %s)\n", f->path, kind,
            ki_attr_num(f, "/", "schema_version", NAN), ver ? ver : "?", created ? created : "?");
    const char *cmd = attr_shown(f, "/", "command", b_cmd, sizeof b_cmd);
    if (cmd) fprintf(out, "command: %s\n", cmd);
    const char *mp = attr_shown(f, "/", "model_path", b_mp, sizeof b_mp),
               *mf = attr_shown(f, "/", "model_format", b_mf, sizeof b_mf);
    const char *sha = attr_shown(f, "/", "model_sha256", b_sha, sizeof b_sha);
    fprintf(out, "model: %s%s%s%s  sha256 %s\n", mp ? mp : "(unknown)", mf ? " (" : "",
            mf ? mf : "", mf ? ")" : "", sha && *sha ? sha : "(none)");
    if (ki_attr_find(f, "/", "model_n_layers"))
        fprintf(out,
                "  L %.0f layers, H %.0f query heads, H_kv %.0f KV heads, d_h %.0f, dim %.0f, "
                "FFN %.0f, vocab %.0f, trained context %.0f\n",
                ki_attr_num(f, "/", "model_n_layers", NAN),
                ki_attr_num(f, "/", "model_n_heads", NAN),
                ki_attr_num(f, "/", "model_n_kv_heads", NAN),
                ki_attr_num(f, "/", "model_head_dim", NAN), ki_attr_num(f, "/", "model_dim", NAN),
                ki_attr_num(f, "/", "model_hidden_dim", NAN),
                ki_attr_num(f, "/", "model_vocab_size", NAN),
                ki_attr_num(f, "/", "model_seq_len", NAN));
}

static void print_heads(FILE *out, const ki_file *f) {
    int L = 0, hkv = 0;
    double *imp = ki_head_importance(f, &L, &hkv);
    if (!imp) return;
    double mx = 0;
    for (int i = 0; i < L * hkv; i++)
        if (isfinite(imp[i]) && imp[i] > mx) mx = imp[i];
    fprintf(out,
            "\nKV head importance (1 - similarity; bars relative to the largest, %.4f), "
            "most important first:\n",
            mx);
    int *order = malloc((size_t)hkv * sizeof *order);
    if (!order) {
        free(imp);
        return;
    }
    for (int l = 0; l < L; l++) {
        const double *row = imp + (size_t)l * hkv;
        ki_order_desc(row, hkv, order);
        fprintf(out, "  layer %2d ", l);
        for (int k = 0; k < hkv; k++) {
            if (k && k % 8 == 0) fprintf(out, "\n           ");
            fprintf(out, " kv%-2d %.4f ", order[k], row[order[k]]);
            bar(out, row[order[k]], mx, 5);
        }
        fputc('\n', out);
    }
    free(order);
    free(imp);
}

static void print_layers(FILE *out, const ki_file *f) {
    int r1 = 0, c1 = 0, r2 = 0, c2 = 0, r3 = 0, L = 0;
    const double *sim = ki_matrix(f, "/layers/similarity", 1, &r3, &L);
    const double *ca = ki_matrix(f, "/layers/cos_attn", 0, &r1, &c1);
    const double *cb = ki_matrix(f, "/layers/cos_block", 0, &r2, &c2);
    if (!sim && !ca && !cb) return;
    if (!sim) L = ca ? c1 : c2;
    fprintf(out,
            "\nlayer similarity (cosine of the residual stream before and after; higher = "
            "the layer changes less):\n  layer  %-21s%s%s\n",
            sim ? "similarity" : "", ca ? "  attn (mean of prompts)" : "",
            cb ? "  block (mean of prompts)" : "");
    for (int l = 0; l < L; l++) {
        fprintf(out, "  %5d  ", l);
        if (sim) {
            fprintf(out, "%.4f ", sim[l]);
            bar(out, sim[l], 1.0, 14);
        } else {
            fprintf(out, "%21s", "");
        }
        if (ca && l < c1) {
            double m = 0;
            for (int p = 0; p < r1; p++) m += ca[(size_t)p * c1 + l] / r1;
            fprintf(out, "  %22.4f", m);
        }
        if (cb && l < c2) {
            double m = 0;
            for (int p = 0; p < r2; p++) m += cb[(size_t)p * c2 + l] / r2;
            fprintf(out, "  %23.4f", m);
        }
        fputc('\n', out);
    }
}

static void print_consistency(FILE *out, const ki_file *f) {
    ki_tau t;
    const ki_dset *d = ki_dset_find(f, "/consistency/kendall_tau");
    if (!d) return;
    ki_tau_summary(f, &t);
    fprintf(out, "\nprompt consistency (Kendall tau between the head rankings of prompt pairs):\n");
    if (t.pairs)
        fprintf(out, "  %d prompts, %d pairs: mean tau %.4f, min %.4f, max %.4f\n", t.prompts,
                t.pairs, t.mean, t.min, t.max);
    else
        fprintf(out, "  %d prompt(s): no pairs to compare\n", t.prompts);
    int p = 0, L = 0;
    const double *len = ki_matrix(f, "/prompts/lengths", 1, &p, &L);
    if (len) {
        fprintf(out, "  prompt lengths (tokens):");
        for (int i = 0; i < L && i < 16; i++) fprintf(out, " %.0f", len[i]);
        fprintf(out, "%s\n", L > 16 ? " ..." : "");
    }
}

/* "4 KiB", "64 MiB", "1 GiB", or bytes. */
static void fmt_bytes(char *buf, size_t cap, double b) {
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = b;
    while (fabs(v) >= 1024 && u < 4) v /= 1024, u++;
    if (v == floor(v))
        snprintf(buf, cap, "%.0f %s", v, unit[u]);
    else
        snprintf(buf, cap, "%.3g %s", v, unit[u]);
}

/* A copy group's fit (docs/hardware-schema.md): bandwidth and latency with their standard
 * errors, R^2, and which sizes the fit used (fit_points sizes from fit_min_bytes up). */
static void print_copy_fit(FILE *out, const ki_file *f, const char *grp, const char *name,
                           size_t n_sizes) {
    double bw = ki_attr_num(f, grp, "bandwidth", NAN);
    double bw_se = ki_attr_num(f, grp, "bandwidth_stderr", NAN);
    double lat = ki_attr_num(f, grp, "latency", NAN);
    double lat_se = ki_attr_num(f, grp, "latency_stderr", NAN);
    fprintf(out, "  %-20s bandwidth %9.3f GB/s", name, bw / 1e9);
    if (!isnan(bw_se)) fprintf(out, " ± %.3g", bw_se / 1e9);
    fprintf(out, "   latency %9.3f us", lat * 1e6);
    if (!isnan(lat_se)) fprintf(out, " ± %.3g", lat_se * 1e6);
    fprintf(out, "   R^2 %.4f\n", ki_attr_num(f, grp, "r2", NAN));
    double pts = ki_attr_num(f, grp, "fit_points", NAN);
    double minb = ki_attr_num(f, grp, "fit_min_bytes", NAN);
    char path[300];
    snprintf(path, sizeof path, "%s/bytes", grp);
    const ki_dset *bytes = ki_dset_find(f, path);
    if (isnan(pts) && isnan(minb)) {
        fprintf(out, "  %-20s fit time = latency + bytes / bandwidth over %zu sizes\n", "",
                n_sizes);
        return;
    }
    fprintf(out, "  %-20s fit over %.0f of %zu sizes", "", pts, n_sizes);
    if (!isnan(minb)) {
        char lo[32];
        fmt_bytes(lo, sizeof lo, minb);
        fprintf(out, ", from fit_min_bytes = %s (%.0f)", lo, minb);
    }
    fputc('\n', out);
    if (bytes && bytes->v && bytes->rank == 1 && !isnan(minb)) {
        fprintf(out, "  %-20s fitted:", "");
        int shown = 0;
        for (size_t i = 0; i < bytes->count; i++) {
            if (!(bytes->v[i] >= minb)) continue;
            char b[32];
            fmt_bytes(b, sizeof b, bytes->v[i]);
            fprintf(out, "%s %s", shown ? "," : "", b);
            shown++;
        }
        size_t below = 0;
        for (size_t i = 0; i < bytes->count; i++)
            if (bytes->v[i] < minb) below++;
        if (below) {
            char b[32];
            fmt_bytes(b, sizeof b, bytes->v[0]);
            fprintf(out, "; not fitted: %zu smaller size%s from %s", below, below > 1 ? "s" : "",
                    b);
        }
        if (!isnan(pts) && (double)shown != pts)
            fprintf(out, " (note: %d sizes >= fit_min_bytes, fit_points says %.0f)", shown, pts);
        fputc('\n', out);
    }
}

static void print_hardware(FILE *out, const ki_file *f) {
    int any = 0;
    for (int g = 0; g < f->n_groups; g++)
        if (!strcmp(f->groups[g], "/hardware")) any = 1;
    if (!any) return;
    char b_kind[64], b_dev[128];
    const char *kind = attr_shown(f, "/hardware", "kind", b_kind, sizeof b_kind);
    const char *dev = attr_shown(f, "/hardware", "device_name", b_dev, sizeof b_dev);
    double mem = ki_attr_num(f, "/hardware", "device_mem_bytes", NAN);
    fprintf(out, "\nhardware (%s%s): %s, memory %.2f GiB\n", kind ? kind : "?",
            kind && !strcmp(kind, "cpu") ? ": host memcpy and BLAS stand in "
                                           "for the device"
                                         : "",
            dev ? dev : "?", mem / (1024.0 * 1024 * 1024));
    for (int g = 0; g < f->n_groups; g++) {
        const char *grp = f->groups[g];
        if (!starts_with(grp, "/hardware/")) continue;
        const char *name = grp + strlen("/hardware/");
        double bw = ki_attr_num(f, grp, "bandwidth", NAN);
        double peak = ki_attr_num(f, grp, "peak_flops_per_s", NAN);
        char med[300];
        snprintf(med, sizeof med, "%s/median", grp);
        const ki_dset *d = ki_dset_find(f, med);
        if (!isnan(bw)) {
            print_copy_fit(out, f, grp, name, d ? d->count : 0);
        } else if (!isnan(peak)) {
            fprintf(out, "  %-20s peak %10.3f GFLOP/s   (%zu GEMM shapes)\n", name, peak / 1e9,
                    d ? d->count : (size_t)0);
        } else {
            fprintf(out, "  %s:\n", name);
            print_attrs(out, f, grp, "      ", NULL);
        }
    }
}

static void print_winner(FILE *out, const ki_file *f);

static void print_plan(FILE *out, const ki_file *f) {
    double R = ki_attr_num(f, "/", "ratio", NAN), C = ki_attr_num(f, "/", "context_length", NAN);
    double bs = ki_attr_num(f, "/", "block_size", NAN),
           pe = ki_attr_num(f, "/", "evict_block", NAN);
    char b_pol[64], b_alloc[64];
    const char *pol = attr_shown(f, "/", "policy", b_pol, sizeof b_pol),
               *alloc = attr_shown(f, "/", "allocation", b_alloc, sizeof b_alloc);
    fprintf(out,
            "\nplan: ratio R %.4g, context length C %.0f tokens, block size %.0f tokens, "
            "eviction block %.0f tokens, policy %s, allocation %s\n",
            R, C, bs, pe, pol ? pol : "?", alloc ? alloc : "?");
    static const char *const par[3][2] = {{"t", "similarity threshold"},
                                          {"r", "reduction of low heads"},
                                          {"p", "SqueezeAttention fraction"}};
    fprintf(out, "  parameters:");
    for (int k = 0; k < 3; k++) {
        double v = ki_attr_num(f, "/", par[k][0], NAN);
        fprintf(out, "%s %s ", k ? "," : "", par[k][0]);
        if (isnan(v))
            fprintf(out, "unused");
        else
            fprintf(out, "%.4g", v);
        fprintf(out, " (%s)", par[k][1]);
    }
    fputc('\n', out);
    print_winner(out, f);
    int L = 0, hkv = 0, L2 = 0, h2 = 0;
    const double *tok = ki_matrix(f, "/budget/tokens", 0, &L, &hkv);
    const double *blk = ki_matrix(f, "/budget/blocks", 0, &L2, &h2);
    if (blk && (L2 != L || h2 != hkv)) blk = NULL;
    if (tok) {
        double total = 0, tb = 0, mx = 0;
        for (int i = 0; i < L * hkv; i++) {
            total += tok[i];
            if (tok[i] > mx) mx = tok[i];
            if (blk) tb += blk[i];
        }
        fprintf(out, "\nbudgets B[l][j] in tokens (per layer, per KV head; kept = layer sum / "
                     "(H_kv * C)):\n  layer |");
        for (int j = 0; j < hkv; j++) fprintf(out, " %6s%-2d", "kv", j);
        fprintf(out, " |    sum   kept\n");
        for (int l = 0; l < L; l++) {
            double s = 0;
            fprintf(out, "  %5d |", l);
            for (int j = 0; j < hkv; j++) {
                fprintf(out, " %8.0f", tok[(size_t)l * hkv + j]);
                s += tok[(size_t)l * hkv + j];
            }
            fprintf(out, " | %6.0f  %5.3f ", s, C > 0 ? s / (hkv * C) : NAN);
            bar(out, C > 0 ? s / (hkv * C) : 0, 1.0, 10);
            fputc('\n', out);
        }
        /* KV storage types (schema v3; v1/v2 plans are f32) and the stored bytes */
        int v3 = ki_dset_find(f, "/budget/kv_type") != NULL;
        int hd = ki_head_dim(f);
        double bytes = 0;
        fprintf(out, "KV storage type per head%s:\n  layer |", v3 ? "" : " (schema v1/v2: f32)");
        for (int j = 0; j < hkv; j++) fprintf(out, " %6s%-2d", "kv", j);
        fputc('\n', out);
        for (int l = 0; l < L; l++) {
            fprintf(out, "  %5d |", l);
            for (int j = 0; j < hkv; j++) {
                kv_cache_type ty = ki_head_type(f, l * hkv + j);
                fprintf(out, " %8s", kv_type_name(ty));
                if (hd > 0) bytes += tok[(size_t)l * hkv + j] * (double)kv_type_token_bytes(ty, hd);
            }
            fputc('\n', out);
        }
        double full16 = hd > 0 ? L * hkv * C * (double)kv_type_token_bytes(KV_TYPE_F16, hd) : NAN;
        /* v1/v2 files store the token fraction: in bytes over the F16 cache it is 2 R */
        double Rb = v3 ? R : 2.0 * R;
        fprintf(out, "  total %.0f tokens", total);
        if (blk) fprintf(out, " in %.0f blocks", tb);
        fprintf(out,
                " (kept fraction %.4f of the full cache's tokens); %.0f bytes of K/V, %.4f of "
                "the full F16 cache (target R %.4g)\n",
                C > 0 ? total / (L * hkv * C) : NAN, bytes, bytes / full16, Rb);
    }
}

/* "p 0.5<sep>t 0.6<sep>r 0.15" for the axes the grid has (the index when the values are
 * missing); without p when `no_p`. */
static void print_cell(FILE *out, const ki_grid *g, long idx, int no_p, const char *sep) {
    int k, i, j;
    ki_grid_cell(g, idx, &k, &i, &j);
    int p = g->rank != 2 && !no_p;
    if (p) fprintf(out, "p %.4g", g->p ? g->p[k] : k);
    if (g->rank != 1)
        fprintf(out, "%st %.4g%sr %.4g", p ? sep : "", g->t ? g->t[i] : i, sep, g->r ? g->r[j] : j);
}

static void print_best_worst(FILE *out, const ki_grid *g, const ki_grid_stats *s,
                             const char *indent, int no_p) {
    if (s->best < 0) return;
    const char *lbl[2] = {"best ", "worst"};
    long idx[2] = {s->best, s->worst};
    for (int k = 0; k < 2; k++) {
        fprintf(out, "%s%s  ", indent, lbl[k]);
        print_cell(out, g, idx[k], no_p, "  ");
        fprintf(out, "  perplexity %.4f", g->ppl[idx[k]]);
        if (g->chunks) {
            int c = ki_grid_chunks(g, idx[k]);
            fprintf(out, "  (%d chunk%s)", c, c == 1 ? "" : "s");
        }
        fputc('\n', out);
    }
}

/* The winner line: /search@winner with what it won with. */
static void print_winner(FILE *out, const ki_file *f) {
    ki_grid g;
    int has_grid = ki_search_grid(f, &g), from_grid = 0;
    const char *w = ki_search_winner(f, has_grid ? &g : NULL, &from_grid);
    if (!w) return;
    double best = ki_attr_num(f, "/search", "best_perplexity", NAN);
    double chunks = ki_attr_num(f, "/search", "best_chunks", NAN);
    fprintf(out, "  >> winner (/search@winner): %s", w);
    if (from_grid && has_grid && g.all.best >= 0) {
        fprintf(out, ", the grid's best cell (");
        print_cell(out, &g, g.all.best, 0, ", ");
        fprintf(out, "): ");
    } else if (!from_grid && has_grid) {
        fprintf(out, "%s, which beat the grid's best cell",
                strcmp(w, "sensitivity") ? " baseline"
                                         : " allocation (measured per-head loss curves)");
        if (g.all.best >= 0) {
            fprintf(out, " (");
            print_cell(out, &g, g.all.best, 0, ", ");
            fprintf(out, ": perplexity %.4f)", g.ppl[g.all.best]);
        }
        fprintf(out, " on the same chunks: ");
    } else {
        fputs(": ", out);
    }
    if (!isnan(best)) {
        fprintf(out, "search perplexity %.4f", best);
        if (!isnan(chunks)) fprintf(out, " on %.0f chunks", chunks);
    }
    const ki_dset *h = ki_dset_find(f, "/search/heldout");
    const char *names = h ? ki_attr_str(f, h->path, "names") : NULL;
    char nm[64];
    if (h && h->v && h->rank == 1 && h->count > 0 &&
        (!names || (nth_name(names, 0, nm, sizeof nm) && !strcmp(nm, "winner"))))
        fprintf(out, "; held-out %.4f", h->v[0]);
    fputc('\n', out);
}

static void print_search(FILE *out, const ki_file *f) {
    int has = 0;
    for (int g = 0; g < f->n_groups; g++)
        if (!strcmp(f->groups[g], "/search")) has = 1;
    if (!has) return;
    fprintf(out, "\nsearch:\n");
    ki_grid g;
    if (ki_search_grid(f, &g)) {
        const ki_grid_stats *a = &g.all;
        long n = (long)g.np * g.nt * g.nr;
        if (g.rank == 3)
            fprintf(out, "  perplexity grid %d (p) x %d (t) x %d (r): %d of %ld cells evaluated\n",
                    g.np, g.nt, g.nr, a->evaluated, n);
        else if (g.rank == 2)
            fprintf(out, "  perplexity grid %d (t) x %d (r): %d of %ld cells evaluated\n", g.nt,
                    g.nr, a->evaluated, n);
        else
            fprintf(out, "  perplexity grid %d (p): %d of %ld cells evaluated\n", g.np,
                    a->evaluated, n);
        if (g.chunks && a->n_max < a->evaluated)
            fprintf(out,
                    "  (successive halving: %d cells reached %d chunks, the others are "
                    "screening figures on fewer chunks; best and worst are among those %d)\n",
                    a->n_max, a->max_chunks, a->n_max);
        print_best_worst(out, &g, a, "  ", 0);
        if (g.rank == 3) {
            fprintf(out, "  per p (best and worst among the cells of that p evaluated on its "
                         "most chunks):\n");
            for (int k = 0; k < g.np; k++) {
                ki_grid_stats s;
                ki_grid_slice(&g, k, &s);
                fprintf(out, "    p %-6.4g %d of %d cells evaluated", g.p ? g.p[k] : k, s.evaluated,
                        g.nt * g.nr);
                if (g.chunks && s.evaluated)
                    fprintf(out, ", %d on its most chunks (%d)", s.n_max, s.max_chunks);
                fputc('\n', out);
                print_best_worst(out, &g, &s, "      ", 1);
            }
        }
    }
    const char *skip[8] = {"/search/perplexity", "/search/t_values", "/search/r_values",
                           "/search/p_values", "/search/chunks"};
    int ns = 5;
    static const char *const def_bl = "full,uniform,squeeze";
    const struct {
        const char *path, *title, *names;
    } named[] = {{"/search/baselines", "baselines (perplexity at the same ratio)", def_bl},
                 {"/search/heldout", "held-out perplexity (text the search did not see)", NULL}};
    for (int k = 0; k < 2; k++) {
        const ki_dset *d = ki_dset_find(f, named[k].path);
        const char *names = d ? ki_attr_str(f, d->path, "names") : NULL;
        if (!names) names = named[k].names;
        char nm[64];
        if (!d || !d->v || d->rank != 1 || !names ||
            !nth_name(names, (int)d->count - 1, nm, sizeof nm))
            continue;
        fprintf(out, "  %s:", named[k].title);
        for (size_t i = 0; i < d->count; i++) {
            nth_name(names, (int)i, nm, sizeof nm);
            fprintf(out, "%s %s %.4f", i ? "," : "", nm, d->v[i]);
        }
        fputc('\n', out);
        skip[ns++] = named[k].path;
    }
    skip[ns] = NULL;
    ki_print_texts(out, f);
    const char *const *sk = skip;
    print_generic(out, f, "/search", sk);
}

/* /sensitivity: one row per head, its curve (the knapsack's objective: KL to the full cache
 * minus the base's, or the change of NLL) at every measured level, the chosen budget marked. */
static void print_sensitivity(FILE *out, const ki_file *f) {
    const ki_dset *kl = ki_dset_find(f, "/sensitivity/kl");
    const ki_dset *dn = ki_dset_find(f, "/sensitivity/delta_nll");
    const ki_dset *lt = ki_dset_find(f, "/sensitivity/level_tokens");
    const ki_dset *bu = ki_dset_find(f, "/sensitivity/budget");
    if (!kl || !kl->v || !dn || !dn->v || !lt || !lt->v || kl->rank < 3) return;
    int L = (int)kl->dims[0], H = (int)kl->dims[1], K = (int)lt->count;
    int Q = kl->rank == 4 ? (int)kl->dims[2] : 1;
    if ((size_t)L * H * Q * K != kl->count || kl->count != dn->count) return;
    const char *obj = ki_attr_str(f, "/sensitivity", "objective");
    int use_kl = !obj || strcmp(obj, "nll") != 0;
    double base_kl = ki_attr_num(f, "/sensitivity", "base_kl", 0.0);
    fprintf(out, "\nsensitivity (R %.4g, policies %s, %.0f calibration tokens, objective %s):\n",
            ki_attr_num(f, "/sensitivity", "ratio", NAN),
            ki_attr_str(f, "/sensitivity", "policies") ? ki_attr_str(f, "/sensitivity", "policies")
                                                       : "?",
            ki_attr_num(f, "/sensitivity", "calibration_tokens", 0),
            use_kl ? "KL to the full cache (x 1e3, minus the uniform start's)"
                   : "change of mean NLL (x 1e3 nats/token)");
    fprintf(out,
            "  curves cost %.0f token evaluations in %.1f s; search perplexity: uniform %.4f, "
            "sensitivity %.4f (round %.0f of %.0f)\n",
            ki_attr_num(f, "/sensitivity", "curve_token_evals", 0),
            ki_attr_num(f, "/sensitivity", "curve_seconds", NAN),
            ki_attr_num(f, "/sensitivity", "uniform_perplexity", NAN),
            ki_attr_num(f, "/sensitivity", "perplexity", NAN),
            ki_attr_num(f, "/sensitivity", "best_round", -1) + 1,
            ki_attr_num(f, "/sensitivity", "rounds", 0));
    for (int q = 0; q < Q; q++) {
        if (Q > 1) fprintf(out, "  policy %d:\n", q);
        fprintf(out, "  %-8s", "tokens");
        for (int k = 0; k < K; k++) fprintf(out, " %7.0f", lt->v[k]);
        fprintf(out, "   chosen\n");
        for (int h = 0; h < L * H; h++) {
            fprintf(out, "  l%d h%-4d", h / H, h % H);
            double chosen = bu && bu->v && (int)bu->count == L * H ? bu->v[h] : NAN;
            for (int k = 0; k < K; k++) {
                size_t i = ((size_t)h * Q + q) * K + k;
                double v = use_kl ? kl->v[i] - base_kl : dn->v[i];
                if (isfinite(v))
                    fprintf(out, " %7.2f", 1e3 * v);
                else
                    fprintf(out, " %7s", "-");
            }
            if (isfinite(chosen)) fprintf(out, "   %.0f", chosen);
            fputc('\n', out);
        }
    }
}

static void print_section(FILE *out, const ki_file *f, const char *grp, const char *title) {
    int has = 0;
    for (int g = 0; g < f->n_groups; g++)
        if (!strcmp(f->groups[g], grp)) has = 1;
    if (!has) return;
    fprintf(out, "\n%s:\n", title);
    print_attrs(out, f, grp, "  ", NULL);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s/", grp);
    print_generic(out, f, prefix, NULL);
}

/* /kvpr (docs/batch-sizing.md): split point and time per layer for every (batch, s'). */
static void print_kvpr(FILE *out, const ki_file *f) {
    int r = 0, nb = 0, ns = 0, a = 0, b = 0;
    const double *bt = ki_matrix(f, "/kvpr/batch", 1, &r, &nb);
    const double *sq = ki_matrix(f, "/kvpr/seq_len", 1, &r, &ns);
    static const char *const cols[] = {"/kvpr/split_column",      "/kvpr/time_column",
                                       "/kvpr/split_row",         "/kvpr/time_row",
                                       "/kvpr/time_no_recompute", NULL};
    const double *m[5] = {0};
    int ok = bt && sq;
    for (int k = 0; ok && k < 5; k++) {
        m[k] = ki_matrix(f, cols[k], 0, &a, &b);
        if (!m[k] || a != nb || b != ns) ok = 0;
    }
    if (!ok) {
        print_section(out, f, "/kvpr", "KVPR split (recompute vs transfer)");
        return;
    }
    fprintf(out, "\nKVPR split (recompute the first l tokens' K, V from activations, transfer the "
                 "rest), per layer:\n");
    static const char *const skip_attrs[] = {"v_com", "v_gpu", NULL};
    fprintf(out, "  link v_com %.3f GB/s, device v_gpu %.3f TFLOP/s\n",
            ki_attr_num(f, "/kvpr", "v_com", NAN) / 1e9,
            ki_attr_num(f, "/kvpr", "v_gpu", NAN) / 1e12);
    print_attrs(out, f, "/kvpr", "  ", skip_attrs);
    fprintf(out, "  %6s %8s | %18s %12s | %14s %12s | %14s\n", "batch", "s'", "l column-by-column",
            "time (us)", "l row-by-row", "time (us)", "no recompute");
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < ns; j++) {
            size_t k = (size_t)i * ns + j;
            fprintf(out, "  %6.0f %8.0f | %18.0f %12.3f | %14.0f %12.3f | %11.3f us\n", bt[i],
                    sq[j], m[0][k], m[1][k] * 1e6, m[2][k], m[3][k] * 1e6, m[4][k] * 1e6);
        }
    static const char *const skip[] = {
        "/kvpr/batch",     "/kvpr/seq_len",  "/kvpr/split_column",      "/kvpr/time_column",
        "/kvpr/split_row", "/kvpr/time_row", "/kvpr/time_no_recompute", NULL};
    print_generic(out, f, "/kvpr/", skip);
}

/* /batch (docs/batch-sizing.md): one row per case named by the `rows` attribute. */
static void print_batch(FILE *out, const ki_file *f) {
    const char *rows = ki_attr_str(f, "/batch", "rows");
    char nm[64];
    int n = 0;
    while (rows && nth_name(rows, n, nm, sizeof nm)) n++;
    int cnt = 0;
    const ki_dset *cols[16];
    for (int i = 0; i < f->n_dsets && cnt < 16; i++) {
        const ki_dset *d = &f->dsets[i];
        if (starts_with(d->path, "/batch/") && d->v && d->rank == 1 && d->count == (size_t)n)
            cols[cnt++] = d;
    }
    if (!n || !cnt) {
        print_section(out, f, "/batch", "batch sizing");
        return;
    }
    fprintf(out, "\nbatch sizing (Batch-Max):\n");
    static const char *const skip_attrs[] = {"rows", NULL};
    print_attrs(out, f, "/batch", "  ", skip_attrs);
    int width[16];
    fprintf(out, "  %-16s", "");
    for (int c = 0; c < cnt; c++) {
        const char *u = ki_units(f, cols[c]->path);
        char head[96];
        snprintf(head, sizeof head, "%s%s%s%s", cols[c]->path + 7, u ? " (" : "", u ? u : "",
                 u ? ")" : "");
        width[c] = (int)strlen(head) < 12 ? 12 : (int)strlen(head);
        fprintf(out, "  %*s", width[c], head);
    }
    fputc('\n', out);
    for (int r = 0; r < n; r++) {
        nth_name(rows, r, nm, sizeof nm);
        fprintf(out, "  %-16s", nm);
        for (int c = 0; c < cnt; c++) {
            if (cols[c]->is_int)
                fprintf(out, "  %*.0f", width[c], cols[c]->v[r]);
            else
                fprintf(out, "  %*.6g", width[c], cols[c]->v[r]);
        }
        fputc('\n', out);
    }
    const char *skip[17];
    for (int c = 0; c < cnt; c++) skip[c] = cols[c]->path;
    skip[cnt] = NULL;
    print_generic(out, f, "/batch/", skip);
}

static const char *const root_known[] = {"kvplan_version",
                                         "schema_version",
                                         "created",
                                         "command",
                                         "model_sha256",
                                         "model_path",
                                         "model_format",
                                         "model_dim",
                                         "model_hidden_dim",
                                         "model_n_layers",
                                         "model_n_heads",
                                         "model_n_kv_heads",
                                         "model_head_dim",
                                         "model_vocab_size",
                                         "model_seq_len",
                                         "ratio",
                                         "context_length",
                                         "block_size",
                                         "policy",
                                         "allocation",
                                         "t",
                                         "r",
                                         "p",
                                         NULL};

void ki_print_text(FILE *out, const ki_file *f) {
    print_header(out, f);
    if (f->is_profile) {
        print_heads(out, f);
        print_layers(out, f);
        print_consistency(out, f);
        print_hardware(out, f);
    }
    if (f->is_plan) {
        print_plan(out, f);
        print_search(out, f);
        print_sensitivity(out, f);
        int has_kvpr = 0, has_batch = 0;
        for (int g = 0; g < f->n_groups; g++) {
            if (!strcmp(f->groups[g], "/kvpr")) has_kvpr = 1;
            if (!strcmp(f->groups[g], "/batch")) has_batch = 1;
        }
        if (has_kvpr) print_kvpr(out, f);
        if (has_batch) print_batch(out, f);
    } else if (!f->is_profile) {
        print_hardware(out, f);
    }
    ki_print_retrieval(out, f);
    /* anything else at the root */
    int other = 0;
    for (int i = 0; i < f->n_attrs; i++) {
        if (strcmp(f->attrs[i].obj, "/") != 0) continue;
        int known = 0;
        for (int k = 0; root_known[k]; k++)
            if (!strcmp(root_known[k], f->attrs[i].name)) known = 1;
        if (!known) other = 1;
    }
    if (other) {
        fprintf(out, "\nother root attributes:\n");
        print_attrs(out, f, "/", "  ", root_known);
    }
    fprintf(out, "\ndatasets:\n");
    for (int i = 0; i < f->n_dsets; i++) {
        const ki_dset *d = &f->dsets[i];
        const char *u = ki_units(f, d->path);
        fprintf(out, "  %-32s ", d->path);
        print_shape(out, d);
        fprintf(out, "%s%s%s%s\n", d->v ? (d->is_int ? " int" : " float") : " (not numeric)",
                u ? " (" : "", u ? u : "", u ? ")" : "");
    }
    if (!f->is_profile && !f->is_plan) {
        fprintf(out, "\ncontent (neither a profile nor a plan):\n");
        print_generic(out, f, "/", NULL);
    }
}
