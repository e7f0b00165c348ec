/* Dense kernels of the Llama layer shared inside runtime/ (see ops.h). */
#include "backend/ops.h"

#include <math.h>

void kv_op_rope_tables(const kv_config *c, int n_pos, float *cos_out, float *sin_out) {
    size_t half = (size_t)c->head_dim / 2;
    for (int p = 0; p < n_pos; p++)
        for (size_t i = 0; i < half; i++) {
            double freq = pow((double)c->rope_theta, -2.0 * (double)i / (double)c->head_dim);
            double a = (double)p * freq;
            cos_out[(size_t)p * half + i] = (float)cos(a);
            sin_out[(size_t)p * half + i] = (float)sin(a);
        }
}

void kv_op_rope_row(float *v, int n_heads, int hd, const float *cs, const float *sn,
                    kv_rope_layout layout) {
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (int i = 0; i < half; i++) {
            int a = layout == KV_ROPE_ADJACENT ? 2 * i : i;
            int b = layout == KV_ROPE_ADJACENT ? 2 * i + 1 : i + half;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * cs[i] - x1 * sn[i];
            x[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

void kv_op_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0.0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int i = 0; i < dim; i++) o[i] = xr[i] * scale * w[i];
    }
}

void kv_op_matmul(float *y, const float *x, kv_weight w, int rows, int in, int out,
                  const kv_op_scratch *s) {
    if (s && s->rowwise)
        kv_qmatmul_rowwise_pool(y, x, w.data, w.type, rows, in, out, s->p, s->n, s->pool);
    else
        kv_qmatmul_pool(y, x, w.data, w.type, rows, in, out, s ? s->p : NULL, s ? s->n : 0,
                        s ? s->pool : NULL);
}

void kv_op_add_bias(float *y, const float *b, int rows, int n) {
    if (!b) return;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] += b[i];
}

void kv_op_ffn_residual(const kv_layer_weights *w, const kv_config *c, float *x, float *xb,
                        float *hb, float *hb2, int rows, const kv_op_scratch *s) {
    int dim = c->dim, hid = c->hidden_dim;
    kv_op_rmsnorm(xb, x, w->ffn_norm, rows, dim, c->norm_eps);
    kv_op_matmul(hb, xb, w->w_gate, rows, dim, hid, s);
    kv_op_matmul(hb2, xb, w->w_up, rows, dim, hid, s);
    for (size_t i = 0; i < (size_t)rows * hid; i++) {
        float a = hb[i];
        hb[i] = a / (1.0f + expf(-a)) * hb2[i];
    }
    kv_op_matmul(xb, hb, w->w_down, rows, hid, dim, s);
    for (size_t i = 0; i < (size_t)rows * dim; i++) x[i] += xb[i];
}
