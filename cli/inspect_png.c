/* kvplan inspect --png: heatmaps with labelled axes, a title and a colour bar, drawn with cairo
 * (cli/inspect.h). One generic renderer (one or more panels sharing a colour scale) serves
 * every picture:
 *   head_importance.png   /heads/importance [L, H_kv]       rows layers, columns KV heads
 *   token_cos.png         /heads/token_cos [L, H, T0]       one panel per layer (BaKlaVa Fig. 2)
 *   layer_similarity.png  /layers/cos_attn, cos_block [P, L] rows prompts, columns layers
 *   search_perplexity.png /search/perplexity [NT, NR]       x = t, y = r (BaKlaVa Fig. 7)
 *   consistency.png       /consistency/kendall_tau [P, P]   prompt x prompt
 *   budget_tokens.png     /budget/tokens [L, H_kv]          rows layers, columns KV heads */
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "inspect.h"

enum { CMAP_VIRIDIS = 0, CMAP_DIVERGING = 1, CMAP_GOOD_BAD = 2 };

typedef struct hm_panel {
    const double *v; /* [rows * cols] row-major */
    int rows, cols;
    char title[64];
    int good_col, bad_col;     /* columns outlined green / red, -1 for none */
    int mark_r, mark_c;        /* one cell outlined in black, -1 for none */
    int mark2_r, mark2_c;      /* one cell outlined with a dashed black line, -1 for none */
    const char *dots;          /* [rows * cols]: non-zero cells get a dot in a corner, or NULL */
    const char *const *suffix; /* [rows * cols]: text after an annotated value (e.g. the KV
                                * type of a budget), or NULL */
} hm_panel;

typedef struct hm_spec {
    const char *title, *subtitle, *subtitle2, *xlabel, *ylabel, *cbar_label;
    const hm_panel *panels;
    int n_panels;
    const double *xvals, *yvals; /* tick values (NULL: the index) */
    double xscale, yscale;       /* tick value multiplier (e.g. 100 for percent) */
    const char *xfmt, *yfmt;     /* printf format of a tick value */
    int y_up;                    /* row 0 at the bottom */
    int cmap;
    int logscale;
    int annotate;
    const char *ann_fmt;
    const char *legend;      /* extra line under the colour bar, or NULL */
    const char *dot_legend;  /* what a dot means (and a bold value), or NULL */
    int no_yticks;           /* a single row without a y axis */
    const char *fade_legend; /* set: cells without a dot are drawn faded; what that means */
} hm_spec;

/* ---- colours ---- */

typedef struct rgb {
    double r, g, b;
} rgb;

static rgb lerp_anchors(const rgb *a, int n, double x) {
    if (!(x >= 0)) x = 0;
    if (x > 1) x = 1;
    double pos = x * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return a[n - 1];
    double t = pos - i;
    rgb c = {a[i].r + t * (a[i + 1].r - a[i].r), a[i].g + t * (a[i + 1].g - a[i].g),
             a[i].b + t * (a[i + 1].b - a[i].b)};
    return c;
}

static rgb colour(int cmap, double x) {
    static const rgb viridis[] = {
        {0.267, 0.005, 0.329}, {0.283, 0.141, 0.458}, {0.254, 0.265, 0.530}, {0.207, 0.372, 0.553},
        {0.164, 0.471, 0.558}, {0.128, 0.567, 0.551}, {0.135, 0.659, 0.518}, {0.267, 0.749, 0.441},
        {0.478, 0.821, 0.318}, {0.741, 0.873, 0.150}, {0.993, 0.906, 0.144}};
    static const rgb diverging[] = {{0.230, 0.299, 0.754},
                                    {0.552, 0.690, 0.996},
                                    {0.865, 0.865, 0.865},
                                    {0.958, 0.603, 0.482},
                                    {0.706, 0.016, 0.150}};
    static const rgb goodbad[] = {{0.102, 0.596, 0.314},
                                  {0.569, 0.812, 0.376},
                                  {1.000, 1.000, 0.749},
                                  {0.988, 0.553, 0.349},
                                  {0.843, 0.188, 0.153}};
    if (cmap == CMAP_DIVERGING) return lerp_anchors(diverging, 5, x);
    if (cmap == CMAP_GOOD_BAD) return lerp_anchors(goodbad, 5, x);
    return lerp_anchors(viridis, 11, x);
}

/* ---- drawing helpers ---- */

static void text_at(cairo_t *cr, double x, double y, double size, int bold, double align,
                    const char *s) {
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - align * e.x_advance, y);
    cairo_show_text(cr, s);
}

static void text_vertical(cairo_t *cr, double x, double y, double size, const char *s) {
    cairo_save(cr);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, size, 0, 0.5, s);
    cairo_restore(cr);
}

/* Scale of a value into [0, 1]. */
static double norm(const hm_spec *s, double v, double lo, double hi) {
    if (s->logscale) {
        v = log(v);
        lo = log(lo);
        hi = log(hi);
    }
    return hi > lo ? (v - lo) / (hi - lo) : 0.5;
}

static int tick_step(int n, double px_per_cell, double min_px) {
    static const int steps[] = {1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        if (steps[i] * px_per_cell >= min_px) return steps[i];
    return n > 0 ? n : 1;
}

static void tick_label(char *buf, size_t cap, const double *vals, double scale, const char *fmt,
                       int i) {
    if (vals)
        snprintf(buf, cap, fmt ? fmt : "%g", vals[i] * (scale ? scale : 1));
    else
        snprintf(buf, cap, "%d", i);
}

/* Draw the heatmap(s) of `s` onto a KI_PNG_W x KI_PNG_H surface and save it to `path`. */
/* cairo's PNG encoder writes into memory; the file is written in one piece afterwards. */
typedef struct png_buf {
    unsigned char *data;
    size_t len, cap;
} png_buf;

static cairo_status_t png_buf_write(void *closure, const unsigned char *data, unsigned int n) {
    png_buf *b = closure;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n) cap *= 2;
        unsigned char *nd = realloc(b->data, cap);
        if (!nd) return CAIRO_STATUS_NO_MEMORY;
        b->data = nd;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    return CAIRO_STATUS_SUCCESS;
}

/* Where things go on the image: the panel grid (prow x pcol panels of pw x ph pixels inside
 * the margins) and the colour range [lo, hi] shared by every panel. */
typedef struct hm_layout {
    double W, H, left, right, top, bottom;
    int prow, pcol;
    double gapx, gapy, head, pw, ph;
    double lo, hi;
} hm_layout;

/* value range over every panel; returns whether a cell is not drawable (NaN, <= 0 on a log
 * scale) */
static int value_range(const hm_spec *s, double *plo, double *phi) {
    double lo = INFINITY, hi = -INFINITY;
    int any_nan = 0;
    for (int p = 0; p < s->n_panels; p++)
        for (int i = 0; i < s->panels[p].rows * s->panels[p].cols; i++) {
            double v = s->panels[p].v[i];
            if (!isfinite(v) || (s->logscale && v <= 0)) {
                any_nan = 1;
                continue;
            }
            lo = fmin(lo, v);
            hi = fmax(hi, v);
        }
    if (!isfinite(lo)) lo = 0, hi = 1;
    if (s->cmap == CMAP_DIVERGING) {
        double m = fmax(fabs(lo), fabs(hi));
        if (m <= 1.0) m = 1.0;
        lo = -m;
        hi = m;
    }
    if (hi == lo) hi = lo + (lo ? fabs(lo) * 0.01 : 1.0);
    *plo = lo;
    *phi = hi;
    return any_nan;
}

static hm_layout layout(const hm_spec *s) {
    hm_layout L = {.W = KI_PNG_W, .H = KI_PNG_H, .left = 95, .right = 150, .bottom = 75};
    L.top = s->subtitle2 ? 96 : 80;
    L.prow = (s->n_panels + 7) / 8;
    L.pcol = (s->n_panels + L.prow - 1) / L.prow;
    L.gapx = s->n_panels > 1 ? 45 : 0;
    L.gapy = s->n_panels > 1 ? 55 : 0;
    L.head = s->n_panels > 1 ? 18 : 0; /* panel title space */
    L.pw = (L.W - L.left - L.right - L.gapx * (L.pcol - 1)) / L.pcol;
    L.ph = (L.H - L.top - L.bottom - L.gapy * (L.prow - 1)) / L.prow - L.head;
    return L;
}

static void draw_titles(cairo_t *cr, const hm_spec *s, const hm_layout *L) {
    cairo_set_source_rgb(cr, 0, 0, 0);
    text_at(cr, L->W / 2, 34, 22, 1, 0.5, s->title);
    if (s->subtitle) {
        cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
        text_at(cr, L->W / 2, 58, 13, 0, 0.5, s->subtitle);
    }
    if (s->subtitle2) {
        cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
        text_at(cr, L->W / 2, 76, 13, 0, 0.5, s->subtitle2);
    }
}

/* hatch: a cell that was not evaluated */
static void draw_hatch(cairo_t *cr, double x, double y, double cw, double ch) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_fill(cr);
    cairo_save(cr);
    cairo_rectangle(cr, x, y, cw, ch);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
    cairo_set_line_width(cr, 1);
    for (double d = -ch; d < cw; d += 8) {
        cairo_move_to(cr, x + d, y + ch);
        cairo_line_to(cr, x + d + ch, y);
    }
    cairo_stroke(cr);
    cairo_restore(cr);
}

/* cell (r, c) of a panel at (x, y), cw x ch pixels: its colour, dot and value */
static void draw_cell(cairo_t *cr, const hm_spec *s, const hm_panel *pn, const hm_layout *L, int r,
                      int c, double x, double y, double cw, double ch) {
    double v = pn->v[(size_t)r * pn->cols + c];
    int dot = pn->dots && pn->dots[(size_t)r * pn->cols + c];
    cairo_rectangle(cr, x, y, cw + 0.5, ch + 0.5);
    if (!isfinite(v) || (s->logscale && v <= 0)) {
        draw_hatch(cr, x, y, cw, ch);
        return;
    }
    rgb col = colour(s->cmap, norm(s, v, L->lo, L->hi));
    if (s->fade_legend && pn->dots && !dot) {
        col.r = 0.45 * col.r + 0.55;
        col.g = 0.45 * col.g + 0.55;
        col.b = 0.45 * col.b + 0.55;
    }
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_fill(cr);
    if (dot) {
        double rad = fmax(1.5, fmin(4.0, fmin(cw, ch) / 6));
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        cairo_arc(cr, x + rad + 4, y + rad + 4, rad, 0, 2 * M_PI);
        cairo_fill(cr);
    }
    if (s->annotate && cw >= 38 && ch >= 15) {
        char buf[48];
        snprintf(buf, sizeof buf, s->ann_fmt ? s->ann_fmt : "%.3g", v);
        const char *sfx = pn->suffix ? pn->suffix[(size_t)r * pn->cols + c] : NULL;
        if (sfx && *sfx) {
            size_t l = strlen(buf);
            snprintf(buf + l, sizeof buf - l, " %s", sfx);
        }
        double lum = 0.299 * col.r + 0.587 * col.g + 0.114 * col.b;
        cairo_set_source_rgb(cr, lum < 0.5 ? 1 : 0, lum < 0.5 ? 1 : 0, lum < 0.5 ? 1 : 0);
        text_at(cr, x + cw / 2, y + ch / 2 + 4, fmin(12, ch * 0.6), dot, 0.5, buf);
    }
}

/* outlines: the good and bad columns, the marked cell and the second (dashed) mark */
static void draw_outlines(cairo_t *cr, const hm_spec *s, const hm_panel *pn, double x0, double y0,
                          double cw, double ch, double ph) {
    cairo_set_line_width(cr, 2.5);
    if (pn->good_col >= 0) {
        cairo_set_source_rgb(cr, 0.0, 0.75, 0.0);
        cairo_rectangle(cr, x0 + pn->good_col * cw + 1.25, y0 + 1.25, cw - 2.5, ph - 2.5);
        cairo_stroke(cr);
    }
    if (pn->bad_col >= 0) {
        cairo_set_source_rgb(cr, 0.9, 0.0, 0.0);
        cairo_rectangle(cr, x0 + pn->bad_col * cw + 1.25, y0 + 1.25, cw - 2.5, ph - 2.5);
        cairo_stroke(cr);
    }
    if (pn->mark_r >= 0 && pn->mark_c >= 0) {
        double y = s->y_up ? y0 + (pn->rows - 1 - pn->mark_r) * ch : y0 + pn->mark_r * ch;
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_set_line_width(cr, 3);
        cairo_rectangle(cr, x0 + pn->mark_c * cw + 1.5, y + 1.5, cw - 3, ch - 3);
        cairo_stroke(cr);
    }
    if (pn->mark2_r >= 0 && pn->mark2_c >= 0) {
        double y = s->y_up ? y0 + (pn->rows - 1 - pn->mark2_r) * ch : y0 + pn->mark2_r * ch;
        static const double dash[] = {5, 3};
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_set_line_width(cr, 2);
        cairo_set_dash(cr, dash, 2, 0);
        cairo_rectangle(cr, x0 + pn->mark2_c * cw + 1.5, y + 1.5, cw - 3, ch - 3);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
    }
}

/* frame and ticks of panel p (y ticks on the first panel of each row) */
static void draw_frame(cairo_t *cr, const hm_spec *s, const hm_panel *pn, const hm_layout *L, int p,
                       double x0, double y0, double cw, double ch) {
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, x0, y0, L->pw, L->ph);
    cairo_stroke(cr);
    char buf[48];
    double fs = pn->cols > 40 || s->n_panels > 4 ? 10 : 12;
    int xs = tick_step(pn->cols, cw, s->xvals ? 42 : 22);
    for (int c = 0; c < pn->cols; c += xs) {
        double x = x0 + (c + 0.5) * cw;
        cairo_move_to(cr, x, y0 + L->ph);
        cairo_line_to(cr, x, y0 + L->ph + 4);
        cairo_stroke(cr);
        tick_label(buf, sizeof buf, s->xvals, s->xscale, s->xfmt, c);
        text_at(cr, x, y0 + L->ph + 17, fs, 0, 0.5, buf);
    }
    if (p % L->pcol != 0 || s->no_yticks) return;
    int ys = tick_step(pn->rows, ch, 16);
    for (int r = 0; r < pn->rows; r += ys) {
        double y = s->y_up ? y0 + (pn->rows - 1 - r + 0.5) * ch : y0 + (r + 0.5) * ch;
        cairo_move_to(cr, x0 - 4, y);
        cairo_line_to(cr, x0, y);
        cairo_stroke(cr);
        tick_label(buf, sizeof buf, s->yvals, s->yscale, s->yfmt, r);
        text_at(cr, x0 - 7, y + 4, fs, 0, 1.0, buf);
    }
}

/* panel grid */
static void draw_panels(cairo_t *cr, const hm_spec *s, const hm_layout *L) {
    for (int p = 0; p < s->n_panels; p++) {
        const hm_panel *pn = &s->panels[p];
        double x0 = L->left + (p % L->pcol) * (L->pw + L->gapx);
        double y0 = L->top + (p / L->pcol) * (L->ph + L->gapy + L->head) + L->head;
        double cw = L->pw / pn->cols, ch = L->ph / pn->rows;
        if (L->head > 0) {
            cairo_set_source_rgb(cr, 0, 0, 0);
            text_at(cr, x0 + L->pw / 2, y0 - 6, 13, 1, 0.5, pn->title);
        }
        for (int r = 0; r < pn->rows; r++) {
            double y = s->y_up ? y0 + (pn->rows - 1 - r) * ch : y0 + r * ch;
            for (int c = 0; c < pn->cols; c++)
                draw_cell(cr, s, pn, L, r, c, x0 + c * cw, y, cw, ch);
        }
        draw_outlines(cr, s, pn, x0, y0, cw, ch, L->ph);
        draw_frame(cr, s, pn, L, p, x0, y0, cw, ch);
    }
    /* axis labels */
    cairo_set_source_rgb(cr, 0, 0, 0);
    double plot_w = L->pcol * L->pw + (L->pcol - 1) * L->gapx;
    text_at(cr, L->left + plot_w / 2, L->H - 28, 15, 0, 0.5, s->xlabel);
    text_vertical(cr, 28, L->top + (L->H - L->top - L->bottom) / 2, 15, s->ylabel);
}

/* the legend lines under the colour bar, from (bx, ly) */
static void draw_legend(cairo_t *cr, const hm_spec *s, double bx, double ly, int any_nan) {
    if (s->fade_legend) {
        rgb col = colour(s->cmap, 0.25);
        cairo_set_source_rgb(cr, 0.45 * col.r + 0.55, 0.45 * col.g + 0.55, 0.45 * col.b + 0.55);
        cairo_rectangle(cr, bx - 20, ly - 10, 12, 12);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, bx - 4, ly, 11, 0, 0, s->fade_legend);
        ly += 18;
    }
    if (s->dot_legend) {
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        cairo_arc(cr, bx - 14, ly - 4, 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
        text_at(cr, bx - 4, ly, 11, 0, 0, s->dot_legend);
        ly += 18;
    }
    if (any_nan) {
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_rectangle(cr, bx - 20, ly - 10, 12, 12);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
        cairo_move_to(cr, bx - 20, ly + 2);
        cairo_line_to(cr, bx - 8, ly - 10);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, bx - 4, ly, 11, 0, 0, "not evaluated");
        ly += 18;
    }
    if (s->legend) text_at(cr, bx - 20, ly, 11, 0, 0, s->legend);
}

/* colour bar */
static void draw_colour_bar(cairo_t *cr, const hm_spec *s, const hm_layout *L, int any_nan) {
    double bx = L->W - L->right + 35, bw = 22, by = L->top + 10;
    double bh = L->H - L->top - L->bottom - 60, lo = L->lo, hi = L->hi;
    for (int i = 0; i < (int)bh; i++) {
        rgb col = colour(s->cmap, 1.0 - (double)i / (bh - 1));
        cairo_set_source_rgb(cr, col.r, col.g, col.b);
        cairo_rectangle(cr, bx, by + i, bw, 1.5);
        cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, bx, by, bw, bh);
    cairo_stroke(cr);
    for (int k = 0; k <= 4; k++) {
        double frac = k / 4.0;
        double v = s->logscale ? exp(log(lo) + frac * (log(hi) - log(lo))) : lo + frac * (hi - lo);
        double y = by + bh - frac * bh;
        cairo_move_to(cr, bx + bw, y);
        cairo_line_to(cr, bx + bw + 4, y);
        cairo_stroke(cr);
        char buf[32];
        snprintf(buf, sizeof buf, "%.4g", v);
        text_at(cr, bx + bw + 7, y + 4, 11, 0, 0, buf);
    }
    text_vertical(cr, bx - 10, by + bh / 2, 13, s->cbar_label);
    if (s->legend || s->dot_legend || s->fade_legend || any_nan)
        draw_legend(cr, s, bx, by + bh + 22, any_nan);
}

/* encode the image and write it: the whole PNG reaches the disk atomically, so a full disk
 * leaves no truncated image */
static int write_png(cairo_surface_t *surf, const char *path, kv_error *err) {
    cairo_surface_flush(surf);
    png_buf pb = {NULL, 0, 0};
    cairo_status_t st = cairo_surface_write_to_png_stream(surf, png_buf_write, &pb);
    if (st != CAIRO_STATUS_SUCCESS) {
        free(pb.data);
        return kv_fail(err, KV_EINTERNAL, "%s: cannot encode the PNG: %s", path,
                       cairo_status_to_string(st));
    }
    int rc = kv_write_file_atomic(path, pb.data, pb.len, err);
    free(pb.data);
    return rc;
}

/* One heatmap image: titles, the panel grid, the colour bar and legend, written to path. */
static int render(const hm_spec *s, const char *path, kv_error *err) {
    cairo_surface_t *surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, KI_PNG_W, KI_PNG_H);
    if (cairo_surface_status(surf) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(surf);
        return kv_fail(err, KV_EINTERNAL, "%s: cairo cannot create an image", path);
    }
    cairo_t *cr = cairo_create(surf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    hm_layout L = layout(s);
    int any_nan = value_range(s, &L.lo, &L.hi);
    draw_titles(cr, s, &L);
    draw_panels(cr, s, &L);
    draw_colour_bar(cr, s, &L, any_nan);
    cairo_destroy(cr);
    int rc = write_png(surf, path, err);
    cairo_surface_destroy(surf);
    return rc;
}

static hm_panel panel(const double *v, int rows, int cols, const char *title) {
    hm_panel p;
    memset(&p, 0, sizeof p);
    p.v = v;
    p.rows = rows;
    p.cols = cols;
    snprintf(p.title, sizeof p.title, "%s", title ? title : "");
    p.good_col = p.bad_col = p.mark_r = p.mark_c = p.mark2_r = p.mark2_c = -1;
    return p;
}

static hm_spec spec(const char *title, const char *xlabel, const char *ylabel, const char *cbar,
                    const hm_panel *p, int n, int cmap) {
    hm_spec s;
    memset(&s, 0, sizeof s);
    s.title = title;
    s.xlabel = xlabel;
    s.ylabel = ylabel;
    s.cbar_label = cbar;
    s.panels = p;
    s.n_panels = n;
    s.cmap = cmap;
    return s;
}

/* ---- the pictures ---- */

static int png_importance(const ki_file *f, const char *path, kv_error *err) {
    int L = 0, hkv = 0;
    double *imp = ki_head_importance(f, &L, &hkv);
    if (!imp) return kv_fail(err, KV_EINTERNAL, "out of memory: importance");
    hm_panel p = panel(imp, L, hkv, NULL);
    hm_spec s = spec("KV head importance", "KV head j", "layer l", "importance = 1 - similarity",
                     &p, 1, CMAP_VIRIDIS);
    s.subtitle = "importance of each (layer, KV head): 1 - (mean cos(V, O) + 1) / 2, averaged "
                 "over prompts and the query heads of the group";
    s.annotate = 1;
    s.ann_fmt = "%.3f";
    int rc = render(&s, path, err);
    free(imp);
    return rc;
}

/* The heads' retrieval cost: a profile's /heads/retrieval, else a plan's record of it. */
static int png_retrieval(const ki_file *f, const char *path, kv_error *err) {
    int L = 0, hkv = 0;
    const double *v = ki_matrix(f, "/heads/retrieval", 0, &L, &hkv);
    if (!v) v = ki_matrix(f, "/search/retrieval/heads", 0, &L, &hkv);
    hm_panel p = panel(v, L, hkv, NULL);
    hm_spec s = spec("retrieval heads", "KV head j", "layer l", "answer NLL rise (nats/token)", &p,
                     1, CMAP_VIRIDIS);
    s.subtitle = "rise of the retrieval probes' mean answer NLL when this (layer, KV head) alone "
                 "keeps only sinks + a recent window (DuoAttention's retrieval heads are bright)";
    s.annotate = 1;
    s.ann_fmt = "%.3f";
    return render(&s, path, err);
}

static int png_token_cos(const ki_file *f, const char *path, kv_error *err) {
    const ki_dset *d = ki_dset_find(f, "/heads/token_cos");
    int L = (int)d->dims[0], H = (int)d->dims[1], T = (int)d->dims[2];
    int n = L > 64 ? 64 : L; /* at most 64 panels */
    double *buf = kv_malloc((size_t)n * H * T * sizeof *buf, "token_cos picture", err);
    hm_panel *ps = kv_calloc((size_t)n, sizeof *ps, "token_cos panels", err);
    if (!buf || !ps) {
        free(buf);
        free(ps);
        return KV_EINTERNAL;
    }
    for (int l = 0; l < n; l++) {
        double *v = buf + (size_t)l * H * T;
        double best = INFINITY, worst = -INFINITY;
        int good = -1, bad = -1;
        for (int h = 0; h < H; h++) {
            double s = 0;
            int cnt = 0;
            for (int t = 0; t < T; t++) {
                double x = d->v[((size_t)l * H + h) * T + t];
                v[(size_t)t * H + h] = x;
                if (isfinite(x)) s += x, cnt++;
            }
            double m = cnt ? s / cnt : NAN;
            if (cnt && m < best) best = m, good = h;
            if (cnt && m > worst) worst = m, bad = h;
        }
        char title[32];
        snprintf(title, sizeof title, "layer %d", l);
        ps[l] = panel(v, T, H, title);
        ps[l].good_col = good; /* lowest mean similarity: most important */
        ps[l].bad_col = bad;   /* highest: least important */
    }
    hm_spec s = spec("Per-token head similarity, first prompt", "query head h", "token position t",
                     "cos(V[t, j], O[t, h])", ps, n, CMAP_DIVERGING);
    s.subtitle = "green outline: head with the lowest mean (most important); red: the highest "
                 "mean (least important)";
    int rc = render(&s, path, err);
    free(ps);
    free(buf);
    return rc;
}

static int png_layers(const ki_file *f, const char *path, kv_error *err) {
    hm_panel ps[3];
    int n = 0, r = 0, c = 0;
    const double *v;
    if ((v = ki_matrix(f, "/layers/cos_attn", 0, &r, &c)))
        ps[n++] = panel(v, r, c, "attention: cos(x, x + Attn(x))");
    if ((v = ki_matrix(f, "/layers/cos_block", 0, &r, &c)))
        ps[n++] = panel(v, r, c, "whole block: cos(x_l, x_l+1)");
    int only_sim = n == 0;
    if (only_sim && (v = ki_matrix(f, "/layers/similarity", 1, &r, &c)))
        ps[n++] = panel(v, r, c, "profile similarity");
    if (!n) return KV_OK;
    hm_spec s = spec("Layer similarity (SqueezeAttention)", "layer l", only_sim ? "" : "prompt",
                     "cosine similarity", ps, n, CMAP_VIRIDIS);
    s.subtitle = "cosine between the residual stream before and after each layer, per prompt; "
                 "high = the layer changes the stream little";
    s.annotate = 1;
    s.ann_fmt = "%.3f";
    return render(&s, path, err);
}

static int png_consistency(const ki_file *f, const char *path, kv_error *err) {
    int p = 0, q = 0;
    const double *v = ki_matrix(f, "/consistency/kendall_tau", 0, &p, &q);
    hm_panel pn = panel(v, p, q, NULL);
    ki_tau t;
    char sub[200];
    if (ki_tau_summary(f, &t))
        snprintf(sub, sizeof sub,
                 "Kendall tau between the KV-head importance rankings of two "
                 "prompts; %d pairs: mean %.3f, min %.3f, max %.3f",
                 t.pairs, t.mean, t.min, t.max);
    else
        snprintf(sub, sizeof sub, "Kendall tau between head rankings (one prompt: no pairs)");
    hm_spec s = spec("Prompt consistency of the head ranking", "prompt", "prompt", "Kendall tau",
                     &pn, 1, CMAP_VIRIDIS);
    s.subtitle = sub;
    s.annotate = 1;
    s.ann_fmt = "%.2f";
    return render(&s, path, err);
}

/* "t = 0.6, r = 0.15" (and "p = 1, " first when the grid has p) of a cell. */
static void cell_label(char *buf, size_t cap, const ki_grid *g, long idx) {
    int k, i, j;
    ki_grid_cell(g, idx, &k, &i, &j);
    char ps[32] = "";
    if (g->rank != 2)
        snprintf(ps, sizeof ps, "p = %.3g%s", g->p ? g->p[k] : k, g->rank == 3 ? ", " : "");
    if (g->rank == 1)
        snprintf(buf, cap, "%s", ps);
    else
        snprintf(buf, cap, "%st = %.3g, r = %.3g", ps, g->t ? g->t[i] : i, g->r ? g->r[j] : j);
}

/* The search grid: one panel per SqueezeAttention p, each the (t, r) map (x = t, y = r), on one
 * colour scale; a p-only grid is one row over p. */
/* Panel k of the search picture: its cells (v, dots: [rows, cols] at pv, pd), its title, the
 * overall best cell (solid) and, when it lacks that, its own best (dashed). */
static hm_panel search_panel(const ki_grid *g, int k, int rows, int cols, int halving, double *pv,
                             char *pd) {
    char title[64] = "";
    const size_t cap = sizeof title;
    for (int i = 0; i < cols; i++)
        for (int j = 0; j < rows; j++) {
            /* panel cell (row j, column i) */
            long idx = g->rank == 1 ? i : ((long)k * g->nt + i) * g->nr + j;
            pv[(size_t)j * cols + i] = g->ppl[idx];
            pd[(size_t)j * cols + i] =
                halving && isfinite(g->ppl[idx]) && ki_grid_chunks(g, idx) == g->all.max_chunks;
        }
    ki_grid_stats st = {0, 0, 0, -1, -1};
    if (g->rank == 3) {
        ki_grid_slice(g, k, &st);
        double pk = g->p ? g->p[k] : k;
        if (st.best >= 0 && g->chunks)
            snprintf(title, cap, "p = %.3g: %sbest %.4g on %d chunk%s", pk,
                     st.max_chunks < g->all.max_chunks ? "screened only, " : "", g->ppl[st.best],
                     st.max_chunks, st.max_chunks == 1 ? "" : "s");
        else if (st.best >= 0)
            snprintf(title, cap, "p = %.3g: best %.4g", pk, g->ppl[st.best]);
        else
            snprintf(title, cap, "p = %.3g: nothing evaluated", pk);
    }
    hm_panel pn = panel(pv, rows, cols, title);
    if (halving) pn.dots = pd;
    int bk, bi, bj;
    if (g->all.best >= 0) {
        ki_grid_cell(g, g->all.best, &bk, &bi, &bj);
        if (g->rank == 1)
            pn.mark_r = 0, pn.mark_c = bk;
        else if (bk == k)
            pn.mark_r = bj, pn.mark_c = bi;
    }
    /* a panel without the overall best: its own best, dashed */
    if (g->rank == 3 && st.best >= 0 && st.best != g->all.best) {
        ki_grid_cell(g, st.best, &bk, &bi, &bj);
        pn.mark2_r = bj;
        pn.mark2_c = bi;
    }
    return pn;
}

/* The two subtitle lines: the grid's evaluation and best cell; the winner. */
static void search_subtitles(const ki_file *f, const ki_grid *g, int halving, char *sub, char *sub2,
                             size_t cap) {
    char best[64];
    double R = ki_attr_num(f, "/", "ratio", NAN);
    if (g->all.best >= 0) {
        cell_label(best, sizeof best, g, g->all.best);
        if (halving)
            snprintf(sub, cap,
                     "ratio R = %.3g; successive halving: %d cells on %d chunks "
                     "(dot, bold), the rest screened on fewer; solid outline: the grid's best, "
                     "%.4g at %s",
                     R, g->all.n_max, g->all.max_chunks, g->ppl[g->all.best], best);
        else
            snprintf(sub, cap,
                     "ratio R = %.3g; %d of %ld cells evaluated; solid outline: "
                     "the grid's best, perplexity %.4g at %s",
                     R, g->all.evaluated, (long)g->np * g->nt * g->nr, g->ppl[g->all.best], best);
    } else {
        snprintf(sub, cap, "ratio R = %.3g; no cell evaluated", R);
    }
    int from_grid = 0;
    const char *w = ki_search_winner(f, g, &from_grid);
    double wp = ki_attr_num(f, "/search", "best_perplexity", NAN);
    char wps[48] = "";
    if (!isnan(wp)) snprintf(wps, sizeof wps, ", perplexity %.4g", wp);
    sub2[0] = '\0';
    if (w && from_grid)
        snprintf(sub2, cap, "winner: %s grid cell%s%s", w, wps,
                 g->rank == 3 ? "; dashed outline: the best of a p's own most-evaluated cells"
                              : "");
    else if (w)
        snprintf(sub2, cap,
                 "winner: the %s baseline%s on the same chunks, beat every "
                 "grid cell%s",
                 w, wps, g->rank == 3 ? "; dashed: a p's own best" : "");
    else if (g->rank == 3)
        snprintf(sub2, cap, "dashed outline: the best of a p's own most-evaluated cells");
}

/* The picture's axes: perplexity over p (rank 1) or over (t, r) with one panel per p. */
static hm_spec search_spec(const ki_grid *g, const hm_panel *ps, int np) {
    hm_spec s;
    if (g->rank == 1) {
        s = spec("Budget search: perplexity over SqueezeAttention p", "SqueezeAttention p", "",
                 "perplexity (lower is better)", ps, 1, CMAP_GOOD_BAD);
        s.xvals = g->p;
        s.xfmt = "%.3g";
        s.no_yticks = 1;
    } else {
        s = spec(g->rank == 3 ? "Budget search: perplexity over (t, r), one panel per "
                                "SqueezeAttention p"
                              : "Budget search: perplexity over (t, r)",
                 "similarity threshold t", "reduction r of low-importance heads (%)",
                 "perplexity (lower is better)", ps, np, CMAP_GOOD_BAD);
        s.xvals = g->t;
        s.xfmt = "%.2f";
        s.yvals = g->r;
        s.yscale = 100;
        s.yfmt = "%.0f";
        s.y_up = 1;
    }
    s.annotate = 1;
    s.ann_fmt = "%.4g";
    return s;
}

static int png_search(const ki_file *f, const char *path, kv_error *err) {
    ki_grid g;
    if (!ki_search_grid(f, &g)) return KV_OK;
    int np = g.rank == 1 ? 1 : g.np; /* panels */
    int rows = g.rank == 1 ? 1 : g.nr, cols = g.rank == 1 ? g.np : g.nt;
    size_t cells = (size_t)rows * cols;
    double *v = kv_malloc((size_t)np * cells * sizeof *v, "search picture", err);
    char *dots = kv_calloc((size_t)np * cells, 1, "search picture", err);
    hm_panel *ps = kv_calloc((size_t)np, sizeof *ps, "search panels", err);
    int rc = !v || !dots || !ps ? KV_EINTERNAL : KV_OK;
    /* a dot marks the cells evaluated on the most chunks when halving left others behind:
     * those are the comparable figures the best cell is chosen from */
    int halving = g.chunks && g.all.n_max < g.all.evaluated;
    for (int k = 0; !rc && k < np; k++)
        ps[k] = search_panel(&g, k, rows, cols, halving, v + (size_t)k * cells,
                             dots + (size_t)k * cells);
    char sub[240], sub2[240], dl[64];
    hm_spec s;
    if (!rc) {
        search_subtitles(f, &g, halving, sub, sub2, sizeof sub);
        s = search_spec(&g, ps, np);
        s.subtitle = sub;
        s.subtitle2 = sub2[0] ? sub2 : NULL;
        if (halving) {
            snprintf(dl, sizeof dl, "%d chunk%s (bold)", g.all.max_chunks,
                     g.all.max_chunks == 1 ? "" : "s");
            s.dot_legend = dl;
            s.fade_legend = "pale: fewer chunks";
        }
        double lo = INFINITY, hi = 0;
        for (size_t i = 0; i < (size_t)np * cells; i++)
            if (isfinite(v[i]) && v[i] > 0) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
        s.logscale = isfinite(lo) && hi / lo > 2.0;
        if (s.logscale) s.legend = "log colour scale";
        rc = render(&s, path, err);
    }
    free(ps);
    free(dots);
    free(v);
    return rc;
}

static int png_budget(const ki_file *f, const char *path, kv_error *err) {
    int L = 0, hkv = 0;
    const double *v = ki_matrix(f, "/budget/tokens", 0, &L, &hkv);
    hm_panel p = panel(v, L, hkv, NULL);
    char sub[200];
    const char *alloc = ki_attr_str(f, "/", "allocation"), *pol = ki_attr_str(f, "/", "policy");
    snprintf(sub, sizeof sub,
             "tokens each KV head keeps: ratio R = %.3g, context C = %.0f, "
             "allocation %s, policy %s",
             ki_attr_num(f, "/", "ratio", NAN), ki_attr_num(f, "/", "context_length", NAN),
             alloc ? alloc : "?", pol ? pol : "?");
    /* v3 plans: each cell also names the head's KV storage type */
    int tl = 0, th = 0;
    const double *tv = ki_matrix(f, "/budget/kv_type", 0, &tl, &th);
    const char **names = NULL;
    char sub2[200] = "";
    if (tv && tl == L && th == hkv) {
        names = kv_calloc((size_t)L * hkv, sizeof *names, "budget picture", err);
        if (!names) return KV_EINTERNAL;
        int count[KV_CACHE_TYPES] = {0};
        for (int i = 0; i < L * hkv; i++) {
            int code = -1;
            ki_whole_in(tv[i], 0, KV_CACHE_TYPES - 1, &code);
            names[i] = kv_type_valid(code) ? kv_type_name((kv_cache_type)code) : "?";
            if (kv_type_valid(code)) count[code]++;
        }
        size_t l = (size_t)snprintf(sub2, sizeof sub2, "KV storage type per head (cell text):");
        for (int t = 0; t < KV_CACHE_TYPES && l < sizeof sub2; t++)
            if (count[t])
                l += (size_t)snprintf(sub2 + l, sizeof sub2 - l, " %s %d",
                                      kv_type_name((kv_cache_type)t), count[t]);
        p.suffix = names;
    }
    hm_spec s = spec("Plan budgets B[l][j]", "KV head j", "layer l", "budget (tokens)", &p, 1,
                     CMAP_VIRIDIS);
    s.subtitle = sub;
    if (names) s.subtitle2 = sub2;
    s.annotate = 1;
    s.ann_fmt = "%.0f";
    int rc = render(&s, path, err);
    free(names);
    return rc;
}

static int sens_ok(const ki_file *f) {
    const ki_dset *kl = ki_dset_find(f, "/sensitivity/kl");
    const ki_dset *dn = ki_dset_find(f, "/sensitivity/delta_nll");
    const ki_dset *lt = ki_dset_find(f, "/sensitivity/level_tokens");
    if (!kl || !kl->v || !dn || !dn->v || !lt || !lt->v || kl->rank < 3 || kl->rank > 5) return 0;
    size_t q = 1; /* the policy and KV type axes between head and level */
    for (int d = 2; d + 1 < kl->rank; d++) q *= (size_t)kl->dims[d];
    return kl->count == dn->count && lt->count > 0 &&
           (size_t)kl->dims[0] * kl->dims[1] * q * lt->count == kl->count;
}

/* The loss curves as a [head x level] heat map (first candidate policy), the chosen budget
 * of each head dotted (the measured level nearest to it). */
static int png_sensitivity(const ki_file *f, const char *path, kv_error *err) {
    const ki_dset *kl = ki_dset_find(f, "/sensitivity/kl");
    const ki_dset *dn = ki_dset_find(f, "/sensitivity/delta_nll");
    const ki_dset *lt = ki_dset_find(f, "/sensitivity/level_tokens");
    const ki_dset *bu = ki_dset_find(f, "/sensitivity/budget");
    int L = (int)kl->dims[0], H = (int)kl->dims[1], K = (int)lt->count;
    int Q = 1, n = L * H; /* curve (policy, type) pairs per head: the first is drawn */
    for (int d = 2; d + 1 < kl->rank; d++) Q *= (int)kl->dims[d];
    const char *obj = ki_attr_str(f, "/sensitivity", "objective");
    int use_kl = !obj || strcmp(obj, "nll") != 0;
    double base_kl = ki_attr_num(f, "/sensitivity", "base_kl", 0.0);
    double *v = kv_malloc((size_t)n * K * sizeof *v, "sensitivity picture", err);
    char *dots = kv_calloc((size_t)n * K, 1, "sensitivity picture", err);
    double *yv = kv_malloc((size_t)n * sizeof *yv, "sensitivity picture", err);
    if (!v || !dots || !yv) {
        free(v);
        free(dots);
        free(yv);
        return KV_EINTERNAL;
    }
    for (int h = 0; h < n; h++) {
        yv[h] = h;
        int best = -1;
        for (int k = 0; k < K; k++) {
            size_t i = (size_t)h * Q * K + k;
            v[(size_t)h * K + k] = 1e3 * (use_kl ? kl->v[i] - base_kl : dn->v[i]);
            if (bu && bu->v && (int)bu->count == n &&
                (best < 0 || fabs(lt->v[k] - bu->v[h]) < fabs(lt->v[best] - bu->v[h])))
                best = k;
        }
        if (best >= 0) dots[(size_t)h * K + best] = 1;
    }
    hm_panel p = panel(v, n, K, NULL);
    p.dots = dots;
    hm_spec s = spec("Per-head loss curves", "budget level (tokens)", "head (layer-major l*H_kv+j)",
                     use_kl ? "KL to full cache - uniform's (x 1e-3 nats)"
                            : "change of mean NLL (x 1e-3 nats/token)",
                     &p, 1, CMAP_DIVERGING);
    char sub[200];
    snprintf(sub, sizeof sub,
             "one KV head at a budget level, every other head at the uniform R = %.3g; "
             "%.0f calibration tokens",
             ki_attr_num(f, "/sensitivity", "ratio", NAN),
             ki_attr_num(f, "/sensitivity", "calibration_tokens", NAN));
    s.subtitle = sub;
    s.xvals = lt->v;
    s.xscale = 1;
    s.xfmt = "%.0f";
    s.yvals = yv;
    s.yscale = 1;
    s.yfmt = "%.0f";
    s.dot_legend = "dot: chosen budget";
    int rc = render(&s, path, err);
    free(v);
    free(dots);
    free(yv);
    return rc;
}

int ki_write_pngs(const ki_file *f, const char *dir, FILE *log, int *n_written, kv_error *err) {
    *n_written = 0;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return kv_fail(err, KV_EINPUT, "%s: cannot create the directory: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kv_fail(err, KV_EINPUT, "%s: not a directory", dir);
    int L = 0, hkv = 0;
    const ki_dset *tc = ki_dset_find(f, "/heads/token_cos");
    ki_grid g;
    const struct {
        const char *name;
        int ok;
        int (*fn)(const ki_file *, const char *, kv_error *);
    } pics[] = {
        {"head_importance.png",
         ki_matrix(f, "/heads/importance", 0, &L, &hkv) != NULL ||
             ki_matrix(f, "/heads/similarity", 0, &L, &hkv) != NULL,
         png_importance},
        {"token_cos.png", tc && tc->v && tc->rank == 3 && tc->count > 0, png_token_cos},
        {"layer_similarity.png",
         ki_matrix(f, "/layers/cos_attn", 0, &L, &hkv) ||
             ki_matrix(f, "/layers/cos_block", 0, &L, &hkv) ||
             ki_matrix(f, "/layers/similarity", 1, &L, &hkv),
         png_layers},
        {"consistency.png",
         ki_matrix(f, "/consistency/kendall_tau", 0, &L, &hkv) != NULL && L == hkv,
         png_consistency},
        {"search_perplexity.png", ki_search_grid(f, &g), png_search},
        {"budget_tokens.png", ki_matrix(f, "/budget/tokens", 0, &L, &hkv) != NULL, png_budget},
        {"sensitivity.png", sens_ok(f), png_sensitivity},
        {"retrieval_heads.png",
         ki_matrix(f, "/heads/retrieval", 0, &L, &hkv) != NULL ||
             ki_matrix(f, "/search/retrieval/heads", 0, &L, &hkv) != NULL,
         png_retrieval},
    };
    for (size_t i = 0; i < sizeof pics / sizeof pics[0]; i++) {
        if (!pics[i].ok) continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, pics[i].name);
        int rc = pics[i].fn(f, path, err);
        if (rc) return rc;
        (*n_written)++;
        if (log) fprintf(log, "wrote %s\n", path);
    }
    return KV_OK;
}
