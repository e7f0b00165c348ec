#include "naive_ref.h"

#include <math.h>
#include <stdlib.h>

/* The weight matrix [rows, cols] in fp32 (dequantised when the model keeps another type);
 * caller frees. */
static float *deq(kv_weight w, int rows, int cols) {
    float *p = malloc((size_t)rows * cols * sizeof *p);
    if (p) kv_dequantize_row(w.type, w.data, p, (int64_t)rows * cols, NULL);
    return p;
}

void tu_naive_forward(const kv_model *m, const int *tokens, int T, float *out, tu_capture *cap) {
    const kv_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, Hk = c->n_kv_heads, hd = c->head_dim, F = c->hidden_dim;
    int g = H / Hk, V = c->vocab_size;
    double *x = calloc((size_t)T * D, sizeof *x);
    double *K = calloc((size_t)c->n_layers * T * Hk * hd, sizeof *K);
    double *Vv = calloc((size_t)c->n_layers * T * Hk * hd, sizeof *Vv);
    double *xn = malloc((size_t)D * sizeof *xn), *q = malloc((size_t)H * hd * sizeof *q);
    double *att = malloc((size_t)H * hd * sizeof *att), *hb = malloc((size_t)F * sizeof *hb);
    double *sc = malloc((size_t)T * sizeof *sc);
    float *emb = deq(m->tok_emb, V, D), *cls = deq(m->classifier, V, D);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) x[t * D + i] = emb[(size_t)tokens[t] * D + i];
    for (int l = 0; l < c->n_layers; l++) {
        const kv_layer_weights *w = &m->layers[l];
        float *wq = deq(w->wq, H * hd, D), *wk = deq(w->wk, Hk * hd, D),
              *wv = deq(w->wv, Hk * hd, D), *wo = deq(w->wo, D, H * hd),
              *w_gate = deq(w->w_gate, F, D), *w_up = deq(w->w_up, F, D),
              *w_down = deq(w->w_down, D, F);
        for (int t = 0; t < T; t++) { /* token by token, causal */
            double *xt = x + (size_t)t * D, ss = 0;
            for (int i = 0; i < D; i++) ss += xt[i] * xt[i];
            double r = 1.0 / sqrt(ss / D + c->norm_eps);
            for (int i = 0; i < D; i++) xn[i] = xt[i] * r * w->attn_norm[i];
            for (int o = 0; o < H * hd; o++) {
                double a = 0;
                for (int i = 0; i < D; i++) a += wq[(size_t)o * D + i] * xn[i];
                q[o] = a + (w->bq ? w->bq[o] : 0.0);
            }
            double *kt = K + ((size_t)l * T + t) * Hk * hd,
                   *vt = Vv + ((size_t)l * T + t) * Hk * hd;
            for (int o = 0; o < Hk * hd; o++) {
                double a = 0, b = 0;
                for (int i = 0; i < D; i++) {
                    a += wk[(size_t)o * D + i] * xn[i];
                    b += wv[(size_t)o * D + i] * xn[i];
                }
                kt[o] = a + (w->bk ? w->bk[o] : 0.0);
                vt[o] = b + (w->bv ? w->bv[o] : 0.0);
            }
            /* RoPE: pairs (2i, 2i+1) or (i, i + d_h/2) per the model's layout */
            for (int hh = 0; hh < H; hh++)
                for (int i = 0; i < hd / 2; i++) {
                    int a0 = c->rope_layout == KV_ROPE_ADJACENT ? 2 * i : i;
                    int a1 = c->rope_layout == KV_ROPE_ADJACENT ? 2 * i + 1 : i + hd / 2;
                    double ang = t * pow(c->rope_theta, -2.0 * i / hd), cs = cos(ang),
                           sn = sin(ang);
                    double *qq = q + hh * hd, a = qq[a0], b = qq[a1];
                    qq[a0] = a * cs - b * sn;
                    qq[a1] = a * sn + b * cs;
                    if (hh < Hk) {
                        double *kk = kt + hh * hd;
                        a = kk[a0];
                        b = kk[a1];
                        kk[a0] = a * cs - b * sn;
                        kk[a1] = a * sn + b * cs;
                    }
                }
            if (cap) {
                for (int i = 0; i < D; i++) cap->x_in[((size_t)l * T + t) * D + i] = xt[i];
                for (int i = 0; i < Hk * hd; i++) cap->v[((size_t)l * T + t) * Hk * hd + i] = vt[i];
            }
            for (int h = 0; h < H; h++) {
                int j = h / g;
                double mx = -1e300;
                for (int u = 0; u <= t; u++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += q[h * hd + i] * K[((size_t)l * T + u) * Hk * hd + j * hd + i];
                    sc[u] = d / sqrt((double)hd);
                    if (sc[u] > mx) mx = sc[u];
                }
                double sum = 0;
                for (int u = 0; u <= t; u++) sum += (sc[u] = exp(sc[u] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int u = 0; u <= t; u++)
                        a += sc[u] / sum * Vv[((size_t)l * T + u) * Hk * hd + j * hd + i];
                    att[h * hd + i] = a;
                }
            }
            if (cap)
                for (int i = 0; i < H * hd; i++) cap->o[((size_t)l * T + t) * H * hd + i] = att[i];
            for (int o = 0; o < D; o++) {
                double a = 0;
                for (int i = 0; i < H * hd; i++) a += wo[(size_t)o * H * hd + i] * att[i];
                if (cap) cap->attn_out[((size_t)l * T + t) * D + o] = a;
                xt[o] += a;
            }
            ss = 0;
            for (int i = 0; i < D; i++) ss += xt[i] * xt[i];
            r = 1.0 / sqrt(ss / D + c->norm_eps);
            for (int i = 0; i < D; i++) xn[i] = xt[i] * r * w->ffn_norm[i];
            for (int f = 0; f < F; f++) {
                double a = 0, b = 0;
                for (int i = 0; i < D; i++) {
                    a += w_gate[(size_t)f * D + i] * xn[i];
                    b += w_up[(size_t)f * D + i] * xn[i];
                }
                hb[f] = a / (1 + exp(-a)) * b;
            }
            for (int o = 0; o < D; o++) {
                double a = 0;
                for (int f = 0; f < F; f++) a += w_down[(size_t)o * F + f] * hb[f];
                xt[o] += a;
            }
            if (cap)
                for (int i = 0; i < D; i++) cap->x_out[((size_t)l * T + t) * D + i] = xt[i];
        }
        free(wq), free(wk), free(wv), free(wo), free(w_gate), free(w_up), free(w_down);
    }
    for (int t = 0; t < T && out; t++) {
        double *xt = x + (size_t)t * D, ss = 0;
        for (int i = 0; i < D; i++) ss += xt[i] * xt[i];
        double r = 1.0 / sqrt(ss / D + c->norm_eps);
        for (int i = 0; i < D; i++) xn[i] = xt[i] * r * m->final_norm[i];
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int i = 0; i < D; i++) a += cls[(size_t)v * D + i] * xn[i];
            out[(size_t)t * V + v] = (float)a;
        }
    }
    free(x), free(K), free(Vv), free(xn), free(q), free(att), free(hb), free(sc);
    free(emb), free(cls);
}
