/* kvplan CPU backend: BLAS GEMMs and C kernels for the layer-step ops of kvplan/backend.h.
 * Architecture: Llama (Touvron et al. 2023) — RMSNorm, RoPE (Su et al. 2021), SwiGLU FFN,
 * grouped-query attention (Ainslie et al. 2023) over the paged per-(layer, KV head) cache
 * (KV-Compress §3). One persistent worker pool (kvplan/workers.h) runs the matmuls' chunks and
 * the attention tasks. The same bits for every thread count: a matmul's chunks do not depend on
 * the threads (kv_qmatmul_pool), each attention task writes only its own rows and head, and the
 * statistics of a head are summed in one fixed order. The attention runs AVX2 + F16C loops where
 * the CPU has them (the same operations in the same order as its portable loops, hence the same
 * bits; test_workers compares them); the environment variable KVPLAN_PORTABLE_ATTENTION, read
 * when a backend is made, selects the portable loops (for that comparison). */
#include "backend/backend_impl.h"

#include "backend/ops.h"
#include "cache/kvslot.h"
#include "cache/kvtype.h"
#include "kvplan/quant.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

typedef struct cpu_backend {
    kv_backend base;
    float *x, *xb, *xb2, *xin;  /* [rows, dim] */
    float *q;                   /* [rows, H*d_h] */
    float *k, *v;               /* [rows, H_kv*d_h] */
    float *o;                   /* [rows, H*d_h] attention output before W_o */
    float *hb, *hb2;            /* [rows, hidden] */
    float *rope_cos, *rope_sin; /* [max_ctx, d_h/2] */
    kv_workers *pool;           /* owned; the matmuls' and attention's threads */
    int n_threads;
    int vec;          /* the AVX2 + F16C attention (the same bits as the portable loops) */
    float *scores;    /* [n_threads, g, max_ctx] (g = query heads per KV head) */
    float *gather;    /* [rows, dim] rows selected for logits */
    kv_op_scratch mm; /* typed matmuls: dequantised weight tiles (prefill) or quantised
                       * activation rows (integer dots) */
} cpu_backend;

static cpu_backend *cpu(kv_backend *b) {
    return (cpu_backend *)b;
}

static void cpu_destroy(kv_backend *b) {
    cpu_backend *c = cpu(b);
    free(c->x);
    free(c->xb);
    free(c->xb2);
    free(c->xin);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->o);
    free(c->hb);
    free(c->hb2);
    free(c->rope_cos);
    free(c->rope_sin);
    free(c->scores);
    free(c->gather);
    free(c->mm.p);
    kv_workers_free(c->pool);
    free(c);
}

static int cpu_storage_alloc(kv_backend *b, kv_pool *p, kv_error *err) {
    (void)b;
    p->window_ring = 1; /* host storage: the attention below reads window rings */
    p->data = kv_malloc(kv_pool_storage_bytes(p), "KV block pool", err);
    return p->data ? KV_OK : KV_EINTERNAL;
}

static void cpu_storage_free(kv_backend *b, kv_pool *p) {
    (void)b;
    free(p->data);
    p->data = NULL;
}

/* The matmuls' scratch, on the per-row paths while the engine asks for batch-invariant rows. */
static const kv_op_scratch *mm_of(kv_backend *b) {
    cpu_backend *c = cpu(b);
    c->mm.rowwise = b->rowwise;
    return &c->mm;
}

static int cpu_embed(kv_backend *b, const int *tokens, int rows, kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    const kv_model *m = b->model;
    int dim = m->cfg.dim;
    for (int r = 0; r < rows; r++) /* the row in the embedding's own type, dequantised */
        kv_weight_row(m->tok_emb, dim, tokens[r], c->x + (size_t)r * dim);
    return KV_OK;
}

static int cpu_qkv(kv_backend *b, int layer, int rows, const int *pos, kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    const kv_config *cfg = &b->model->cfg;
    const kv_layer_weights *w = &b->model->layers[layer];
    int dim = cfg->dim, hd = cfg->head_dim, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    int qd = H * hd, kvd = Hkv * hd, half = hd / 2;
    kv_op_rmsnorm(c->xb, c->x, w->attn_norm, rows, dim, cfg->norm_eps);
    kv_op_matmul(c->q, c->xb, w->wq, rows, dim, qd, mm_of(b));
    kv_op_matmul(c->k, c->xb, w->wk, rows, dim, kvd, mm_of(b));
    kv_op_matmul(c->v, c->xb, w->wv, rows, dim, kvd, mm_of(b));
    kv_op_add_bias(c->q, w->bq, rows, qd);
    kv_op_add_bias(c->k, w->bk, rows, kvd);
    kv_op_add_bias(c->v, w->bv, rows, kvd);
    for (int r = 0; r < rows; r++) {
        const float *cs = c->rope_cos + (size_t)pos[r] * half;
        const float *sn = c->rope_sin + (size_t)pos[r] * half;
        kv_op_rope_row(c->q + (size_t)r * qd, H, hd, cs, sn, cfg->rope_layout);
        kv_op_rope_row(c->k + (size_t)r * kvd, Hkv, hd, cs, sn, cfg->rope_layout);
    }
    return KV_OK;
}

static int cpu_gather(kv_backend *b, kv_pool *p, const kv_move *moves, int n, kv_error *err) {
    (void)b;
    (void)err;
    kv_pool_apply_moves_host(p, moves, n);
    return KV_OK;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* kvt_encode's f16 row by F16C, the same bytes: round to nearest even as kv_f32_to_f16, which
 * saturates |x| >= 65504 (infinities included) to 65504, hence the clamp; a row holding a NaN
 * takes the scalar encoder (its NaN bytes). Returns 0 when it left the row to the caller. */
__attribute__((target("avx2,f16c"))) static int encode_f16_f16c(int hd, const float *x,
                                                                unsigned char *dst) {
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    int nan = 0;
    for (int d = 0; d < hd; d += 8) {
        __m256 v = _mm256_loadu_ps(x + d);
        nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (nan) return 0;
    for (int d = 0; d < hd; d += 8) {
        __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(x + d), lo), hi);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * d),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return 1;
}
#endif

static void cache_encode(const cpu_backend *c, kv_cache_type t, int hd, const float *x,
                         unsigned char *dst) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (c->vec && t == KV_TYPE_F16 && hd % 8 == 0 && encode_f16_f16c(hd, x, dst)) return;
#else
    (void)c;
#endif
    kvt_encode(t, hd, x, dst);
}

static int cpu_cache_write(kv_backend *b, kv_pool *p, const kv_slot_write *w, int n,
                           kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    int hd = p->head_dim, kvd = b->model->cfg.n_kv_heads * hd;
    for (int i = 0; i < n; i++) {
        /* the new row in the head's stored type (its block's range) */
        kv_cache_type t = kv_pool_block_type(p, w[i].slot / p->block_size);
        size_t src = (size_t)w[i].row * kvd + (size_t)w[i].kv_head * hd;
        cache_encode(c, t, hd, c->k + src, kv_pool_slot_row(p, w[i].slot, 0));
        cache_encode(c, t, hd, c->v + src, kv_pool_slot_row(p, w[i].slot, 1));
    }
    return KV_OK;
}

/* Attention multiply-adds (all heads of a layer) below which the layer runs on the calling
 * thread: handing tasks to the pool's (already running) threads costs a few microseconds, so
 * only tiny layers stay serial. (With an OpenMP region forked per layer the threshold was
 * 8.4M: measured on 2 loaded cores, that fork made decode at context 2048 2-3x slower.) */
#define KV_ATTN_PARALLEL_MACS 262144.0

/* A run of a task's entries stored one after another inside one block: logical entries
 * [e, e + n); K rows from k, each V row bs * rb bytes after its K row. */
typedef struct attn_chunk {
    const unsigned char *k;
    int e, n;
} attn_chunk;

/* Most chunks a task can have: one per block it holds, plus the cuts of a window ring. */
static inline int task_max_chunks(const kv_pool *p, const kv_attn_task *t) {
    return (t->wrot ? t->n_blocks : (t->len + p->block_size - 1) / p->block_size) + 3;
}

/* Entries [0, t->len) of task t in logical order (the order of the compacted layout, whatever
 * the head's window ring) as chunks into ch [task_max_chunks]; rb: bytes of a stored row.
 * Returns the number of chunks. */
static int task_chunks(const kv_pool *p, const kv_attn_task *t, size_t rb, attn_chunk *ch) {
    int first[3], phys[3], count[3], bs = p->block_size, nc = 0;
    int nr =
        kv_ring_runs(t->len, t->wbase, t->wrot, t->n_blocks * bs - t->wbase, first, phys, count);
    for (int r = 0; r < nr; r++)
        for (int k = 0; k < count[r];) {
            int ph = phys[r] + k, off = ph % bs, m = count[r] - k;
            if (m > bs - off) m = bs - off;
            ch[nc++] = (attn_chunk){kv_pool_block_ptr(p, t->table[ph / bs]) + (size_t)off * rb,
                                    first[r] + k, m};
            k += m;
        }
    return nc;
}

/* Attention of one (sequence, KV head) task: n new queries per query head of the group over
 * the head's first `len - n + i + 1` entries for query i (retained + causal new). Rows are
 * read in the head's stored type `ty` (the range of its blocks): f32 in place, the others
 * decoded one row at a time into a [d_h] stack array (runtime/cache/kvtype.h), so no fp32
 * copy of the cache exists and the weights (and the h2o / l2attn statistics) are exact
 * functions of the stored values. Each row is read (decoded) once per query for all g query
 * heads of the GQA group; per head the arithmetic and its order are those of a head-by-head
 * loop. scores: [g][stride] floats of the calling thread. */
static inline __attribute__((always_inline)) void
attend_task_hd(const cpu_backend *c, const kv_pool *p, const kv_attn_task *t, float *scores,
               size_t stride, const int hd, const kv_cache_type ty) {
    const kv_config *cfg = &c->base.model->cfg;
    const int g = cfg->n_heads / cfg->n_kv_heads;
    int qd = cfg->n_heads * hd, j = t->kv_head;
    int base = t->len - t->n, bs = p->block_size;
    size_t rb = kvt_row_bytes(ty, hd);
    float inv = 1.0f / sqrtf((float)hd);
    float qv[g][hd], acc[g][hd], mx[g], rs[g];
    attn_chunk ch[task_max_chunks(p, t)];
    int nch = task_chunks(p, t, rb, ch);
    for (int i = 0; i < t->n; i++) {
        int n_ent = base + i + 1;
        int qpos = t->pos[base + i];
        for (int gh = 0; gh < g; gh++) {
            const float *q = c->q + (size_t)(t->row0 + i) * qd + (size_t)(j * g + gh) * hd;
            for (int d = 0; d < hd; d++) qv[gh][d] = q[d] * inv;
            mx[gh] = -INFINITY;
        }
        for (int ci = 0; ci < nch && ch[ci].e < n_ent; ci++) {
            const unsigned char *kb = ch[ci].k;
            int e0 = ch[ci].e, cnt = n_ent - e0 < ch[ci].n ? n_ent - e0 : ch[ci].n;
            for (int e = 0; e < cnt; e++) {
                float kr[hd];
                const float *kk = kr;
                if (ty == KV_TYPE_F32)
                    kk = (const float *)(const void *)(kb + (size_t)e * rb);
                else
                    kvt_decode(ty, hd, kb + (size_t)e * rb, kr);
                for (int gh = 0; gh < g; gh++) {
                    /* 8 partial sums: a fixed association order, vectorisable. Written as
                     * 8-lane chunks: `part[d & 7]` in one loop compiled to a scalar
                     * store-to-load chain through the stack (perf: ~60% of prefill attention
                     * time); this form keeps the same order of additions, so the same bits. */
                    const float *qh = qv[gh];
                    float part[8] = {0};
                    int d = 0;
                    for (; d + 8 <= hd; d += 8)
                        for (int u = 0; u < 8; u++) part[u] += qh[d + u] * kk[d + u];
                    for (; d < hd; d++) part[d & 7] += qh[d] * kk[d];
                    float dot = ((part[0] + part[4]) + (part[1] + part[5])) +
                                ((part[2] + part[6]) + (part[3] + part[7]));
                    scores[(size_t)gh * stride + (size_t)(e0 + e)] = dot;
                    mx[gh] = dot > mx[gh] ? dot : mx[gh];
                }
            }
        }
        for (int gh = 0; gh < g; gh++) {
            float *sc = scores + (size_t)gh * stride, sum = 0.0f;
            for (int e = 0; e < n_ent; e++) {
                sc[e] = expf(sc[e] - mx[gh]);
                sum += sc[e];
            }
            rs[gh] = 1.0f / sum;
            for (int d = 0; d < hd; d++) acc[gh][d] = 0.0f;
        }
        for (int ci = 0; ci < nch && ch[ci].e < n_ent; ci++) {
            const unsigned char *vb = ch[ci].k + (size_t)bs * rb;
            int e0 = ch[ci].e, cnt = n_ent - e0 < ch[ci].n ? n_ent - e0 : ch[ci].n;
            for (int e = 0; e < cnt; e++) {
                float vr[hd];
                const float *vv = vr;
                if (ty == KV_TYPE_F32)
                    vv = (const float *)(const void *)(vb + (size_t)e * rb);
                else
                    kvt_decode(ty, hd, vb + (size_t)e * rb, vr);
                for (int gh = 0; gh < g; gh++) {
                    float *sc = scores + (size_t)gh * stride;
                    float w = sc[e0 + e] * rs[gh];
                    sc[e0 + e] = w;
                    for (int d = 0; d < hd; d++) acc[gh][d] += w * vv[d];
                }
            }
        }
        for (int gh = 0; gh < g; gh++) {
            float *o = c->o + (size_t)(t->row0 + i) * qd + (size_t)(j * g + gh) * hd;
            for (int d = 0; d < hd; d++) o[d] = acc[gh][d];
            if (t->acc) { /* per entry: head 0, 1, ... of the group, as head by head */
                const float *sc = scores + (size_t)gh * stride;
                for (int e = 0; e < n_ent; e++) {
                    float w = sc[e];
                    t->acc[e] += w;
                    if (qpos - t->pos[e] >= KV_L2_EXCLUDED_WINDOW) t->acc2[e] += w * w;
                }
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_ATTN_X86 1
#include <immintrin.h>
#define KV_ATTN_AVX2 __attribute__((target("avx2,f16c")))
#define KV_ATTN_AVX512 __attribute__((target("avx2,f16c,avx512f,avx512vl")))

/* Elements 8c .. 8c + 7 of a stored row of type ty as floats: the values kvt_decode writes
 * (f16 by F16C, which is exact; q8 s * q and q4 m + s * q by one mul / one mul and one add, as
 * the scalar decoder; s and m are the row's decoded scales). */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) __m256
kv8(const unsigned char *row, int c, kv_cache_type ty, __m256 s, __m256 m) {
    switch (ty) {
    case KV_TYPE_F32:
        return _mm256_loadu_ps((const float *)(const void *)(row + 32 * (size_t)c));
    case KV_TYPE_F16:
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(row + 16 * (size_t)c)));
    case KV_TYPE_Q8: {
        __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(row + 2 + 8 * (size_t)c));
        return _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    case KV_TYPE_Q4: {
        uint32_t w;
        memcpy(&w, row + 4 + 4 * (size_t)c, 4);
        __m256i n =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                             _mm256_set1_epi32(15));
        return _mm256_add_ps(m, _mm256_mul_ps(s, _mm256_cvtepi32_ps(n)));
    }
    }
    return _mm256_setzero_ps();
}

/* The binary16 at p broadcast to 8 floats by F16C: kvt_h2f's value (the conversion is exact)
 * in one instruction instead of its integer decode, once per row and query head. */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) __m256 h2f8(const unsigned char *p) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)kv_load_u16le(p)));
}

/* The row's scale and minimum (q8: s; q4: s, m) broadcast, for kv8. */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) void
kv_scales(const unsigned char *row, kv_cache_type ty, __m256 *s, __m256 *m) {
    *s = _mm256_setzero_ps();
    *m = _mm256_setzero_ps();
    if (ty == KV_TYPE_Q8 || ty == KV_TYPE_Q4) *s = h2f8(row);
    if (ty == KV_TYPE_Q4) *m = h2f8(row + 2);
}

/* One stored row's d_h elements as nc = d_h / 8 vectors (kv8 with the row's scales). */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) void
kv_row8(const unsigned char *row, const int nc, kv_cache_type ty, __m256 *out) {
    __m256 s, m;
    kv_scales(row, ty, &s, &m);
    for (int k = 0; k < nc; k++) out[k] = kv8(row, k, ty, s, m);
}

/* The 8 partial sums of q . k for one decoded entry (lane u: d = u mod 8, in d order), from
 * zero, halves added: (p0 + p4, p1 + p5, p2 + p6, p3 + p7). */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) __m128
kv_dot_parts(const float *q, const __m256 *kr, const int nc) {
    __m256 part = _mm256_setzero_ps();
    for (int k = 0; k < nc; k++)
        part = _mm256_add_ps(part, _mm256_mul_ps(_mm256_loadu_ps(q + 8 * k), kr[k]));
    return _mm_add_ps(_mm256_castps256_ps128(part), _mm256_extractf128_ps(part, 1));
}

/* Scores of the g query heads qv [g][hd] (scaled) over n_ent entries into scores [g][stride],
 * and each head's maximum mx [g]. Each row is decoded once for the g heads; per head the
 * operations and their order are those of a head-by-head pass (4 entries share the horizontal
 * adds; the maximum kept lane by lane, then folded). */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) void
vec_scores(const attn_chunk *ch, int nch, int n_ent, size_t rb, const int hd,
           const kv_cache_type ty, int g, const float *qv, float *scores, size_t stride,
           float *mx) {
    const int nc = hd / 8;
    __m128 mx4[g];
    for (int gh = 0; gh < g; gh++) {
        mx4[gh] = _mm_set1_ps(-INFINITY);
        mx[gh] = -INFINITY;
    }
    for (int ci = 0; ci < nch && ch[ci].e < n_ent; ci++) {
        const unsigned char *kb = ch[ci].k;
        int e0 = ch[ci].e, cnt = n_ent - e0 < ch[ci].n ? n_ent - e0 : ch[ci].n, e = 0;
        for (; e + 4 <= cnt; e += 4) {
            __m256 kr[4][hd / 8];
            for (int u = 0; u < 4; u++) kv_row8(kb + (size_t)(e + u) * rb, nc, ty, kr[u]);
            for (int gh = 0; gh < g; gh++) {
                const float *q = qv + (size_t)gh * hd;
                __m128 a0 = kv_dot_parts(q, kr[0], nc), a1 = kv_dot_parts(q, kr[1], nc);
                __m128 a2 = kv_dot_parts(q, kr[2], nc), a3 = kv_dot_parts(q, kr[3], nc);
                __m128 dots = _mm_hadd_ps(_mm_hadd_ps(a0, a1), _mm_hadd_ps(a2, a3));
                _mm_storeu_ps(scores + (size_t)gh * stride + e0 + e, dots);
                mx4[gh] = _mm_max_ps(dots, mx4[gh]); /* dot > mx ? dot : mx, lane by lane */
            }
        }
        for (; e < cnt; e++) {
            __m256 kr[hd / 8];
            kv_row8(kb + (size_t)e * rb, nc, ty, kr);
            for (int gh = 0; gh < g; gh++) {
                __m128 a = kv_dot_parts(qv + (size_t)gh * hd, kr, nc);
                a = _mm_hadd_ps(a, a);
                float dot = _mm_cvtss_f32(_mm_hadd_ps(a, a));
                scores[(size_t)gh * stride + (size_t)(e0 + e)] = dot;
                mx[gh] = dot > mx[gh] ? dot : mx[gh];
            }
        }
    }
    for (int gh = 0; gh < g; gh++) {
        float l4[4];
        _mm_storeu_ps(l4, mx4[gh]);
        for (int k = 0; k < 4; k++) mx[gh] = l4[k] > mx[gh] ? l4[k] : mx[gh];
    }
}

/* out [g][hd] = sum over entries of w [g][stride] * V, per head entry after entry (acc += w * v:
 * a mul and an add), each V row decoded once for the g heads. */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) void
vec_values(const attn_chunk *ch, int nch, int n_ent, int bs, size_t rb, const int hd,
           const kv_cache_type ty, int g, const float *scores, size_t stride, float *out) {
    const int nc = hd / 8;
    __m256 acc[g][hd / 8];
    for (int gh = 0; gh < g; gh++)
        for (int k = 0; k < nc; k++) acc[gh][k] = _mm256_setzero_ps();
    for (int ci = 0; ci < nch && ch[ci].e < n_ent; ci++) {
        const unsigned char *vb = ch[ci].k + (size_t)bs * rb;
        int e0 = ch[ci].e, cnt = n_ent - e0 < ch[ci].n ? n_ent - e0 : ch[ci].n;
        for (int e = 0; e < cnt; e++) {
            __m256 vr[hd / 8];
            kv_row8(vb + (size_t)e * rb, nc, ty, vr);
            for (int gh = 0; gh < g; gh++) {
                __m256 w = _mm256_set1_ps(scores[(size_t)gh * stride + (size_t)(e0 + e)]);
                for (int k = 0; k < nc; k++)
                    acc[gh][k] = _mm256_add_ps(acc[gh][k], _mm256_mul_ps(w, vr[k]));
            }
        }
    }
    for (int gh = 0; gh < g; gh++)
        for (int k = 0; k < nc; k++) _mm256_storeu_ps(out + (size_t)gh * hd + 8 * k, acc[gh][k]);
}

/* attend_task_hd with 8-wide vectors, for d_h a multiple of 8: the same operations in the same
 * order per (query, head, entry, element), hence the same bits (test_workers, test_forward): the
 * 8 partial sums of a score are one vector; its tree ((p0 + p4) + (p1 + p5)) + ((p2 + p6) +
 * (p3 + p7)) is one add of the halves and two horizontal adds (four entries share them);
 * the softmax stays scalar (expf, the sum in entry order); V is accumulated per head, entry
 * after entry, acc += w * v with a mul and an add. Each K and V row is decoded once per query
 * for all g heads of the GQA group (vec_scores, vec_values). */
KV_ATTN_AVX2 static inline __attribute__((always_inline)) void
attend_vec_hd(const cpu_backend *c, const kv_pool *p, const kv_attn_task *t, float *scores,
              size_t stride, const int hd, const kv_cache_type ty) {
    const kv_config *cfg = &c->base.model->cfg;
    const int g = cfg->n_heads / cfg->n_kv_heads;
    int qd = cfg->n_heads * hd, j = t->kv_head;
    int base = t->len - t->n, bs = p->block_size;
    size_t rb = kvt_row_bytes(ty, hd);
    float inv = 1.0f / sqrtf((float)hd);
    float qv[g * hd], mx[g];
    /* the rows' addresses, looked up once per task rather than per block, head and pass */
    attn_chunk ch[task_max_chunks(p, t)];
    int nch = task_chunks(p, t, rb, ch);
    for (int i = 0; i < t->n; i++) {
        int n_ent = base + i + 1;
        int qpos = t->pos[base + i];
        const float *q = c->q + (size_t)(t->row0 + i) * qd + (size_t)(j * g) * hd;
        for (int d = 0; d < g * hd; d++) qv[d] = q[d] * inv;
        vec_scores(ch, nch, n_ent, rb, hd, ty, g, qv, scores, stride, mx);
        for (int gh = 0; gh < g; gh++) {
            float *sc = scores + (size_t)gh * stride, sum = 0.0f;
            for (int e = 0; e < n_ent; e++) {
                sc[e] = expf(sc[e] - mx[gh]);
                sum += sc[e];
            }
            float rs = 1.0f / sum;
            for (int e = 0; e < n_ent; e++) sc[e] = sc[e] * rs;
        }
        vec_values(ch, nch, n_ent, bs, rb, hd, ty, g, scores, stride,
                   c->o + (size_t)(t->row0 + i) * qd + (size_t)(j * g) * hd);
        if (t->acc) /* per entry: head 0, 1, ... of the group, as head by head */
            for (int gh = 0; gh < g; gh++) {
                const float *sc = scores + (size_t)gh * stride;
                for (int e = 0; e < n_ent; e++) {
                    float w = sc[e];
                    t->acc[e] += w;
                    if (qpos - t->pos[e] >= KV_L2_EXCLUDED_WINDOW) t->acc2[e] += w * w;
                }
            }
    }
}

#define ATTN_VEC_FN(name, attr, ty)                                                                \
    attr static void name(const cpu_backend *c, const kv_pool *p, const kv_attn_task *t,           \
                          float *scores) {                                                         \
        size_t stride = (size_t)c->base.max_ctx;                                                   \
        switch (c->base.model->cfg.head_dim) {                                                     \
        case 64:                                                                                   \
            attend_vec_hd(c, p, t, scores, stride, 64, ty);                                        \
            break;                                                                                 \
        case 128:                                                                                  \
            attend_vec_hd(c, p, t, scores, stride, 128, ty);                                       \
            break;                                                                                 \
        case 32:                                                                                   \
            attend_vec_hd(c, p, t, scores, stride, 32, ty);                                        \
            break;                                                                                 \
        case 16:                                                                                   \
            attend_vec_hd(c, p, t, scores, stride, 16, ty);                                        \
            break;                                                                                 \
        default:                                                                                   \
            attend_vec_hd(c, p, t, scores, stride, 8, ty);                                         \
            break;                                                                                 \
        }                                                                                          \
    }
ATTN_VEC_FN(attend_vec_f32, KV_ATTN_AVX2, KV_TYPE_F32)
ATTN_VEC_FN(attend_vec_f16, KV_ATTN_AVX2, KV_TYPE_F16)
ATTN_VEC_FN(attend_vec_q8, KV_ATTN_AVX2, KV_TYPE_Q8)
ATTN_VEC_FN(attend_vec_q4, KV_ATTN_AVX2, KV_TYPE_Q4)
#endif

/* One specialisation per common head size so the d_h loops unroll and vectorise. */
static inline __attribute__((always_inline)) void
attend_task_ty(const cpu_backend *c, const kv_pool *p, const kv_attn_task *t, float *scores,
               const kv_cache_type ty) {
    size_t stride = (size_t)c->base.max_ctx;
    switch (c->base.model->cfg.head_dim) {
    case 8:
        attend_task_hd(c, p, t, scores, stride, 8, ty);
        break;
    case 16:
        attend_task_hd(c, p, t, scores, stride, 16, ty);
        break;
    case 32:
        attend_task_hd(c, p, t, scores, stride, 32, ty);
        break;
    case 64:
        attend_task_hd(c, p, t, scores, stride, 64, ty);
        break;
    case 128:
        attend_task_hd(c, p, t, scores, stride, 128, ty);
        break;
    default:
        attend_task_hd(c, p, t, scores, stride, c->base.model->cfg.head_dim, ty);
        break;
    }
}

/* ... and per stored type (the type of the head's blocks). */
static void attend_task(const cpu_backend *c, const kv_pool *p, const kv_attn_task *t,
                        float *scores) {
    kv_cache_type ty = kv_pool_block_type(p, t->table[0]);
#ifdef KV_ATTN_X86
    int hd = c->base.model->cfg.head_dim;
    if (c->vec && (hd == 8 || hd == 16 || hd == 32 || hd == 64 || hd == 128)) {
        switch (ty) {
        case KV_TYPE_F32:
            attend_vec_f32(c, p, t, scores);
            return;
        case KV_TYPE_F16:
            attend_vec_f16(c, p, t, scores);
            return;
        case KV_TYPE_Q8:
            attend_vec_q8(c, p, t, scores);
            return;
        case KV_TYPE_Q4:
            attend_vec_q4(c, p, t, scores);
            return;
        }
    }
#endif
    switch (ty) {
    case KV_TYPE_F32:
        attend_task_ty(c, p, t, scores, KV_TYPE_F32);
        break;
    case KV_TYPE_F16:
        attend_task_ty(c, p, t, scores, KV_TYPE_F16);
        break;
    case KV_TYPE_Q8:
        attend_task_ty(c, p, t, scores, KV_TYPE_Q8);
        break;
    case KV_TYPE_Q4:
        attend_task_ty(c, p, t, scores, KV_TYPE_Q4);
        break;
    }
}

typedef struct attn_job {
    const cpu_backend *c;
    const kv_pool *p;
    const kv_attn_task *tasks;
} attn_job;

/* One task of the pool: its thread's score rows. */
static void attend_chunk(void *ctx, int i, int tid) {
    const attn_job *j = ctx;
    const kv_config *cfg = &j->c->base.model->cfg;
    float *scores = j->c->scores + (size_t)tid * (size_t)(cfg->n_heads / cfg->n_kv_heads) *
                                       (size_t)j->c->base.max_ctx;
    attend_task(j->c, j->p, &j->tasks[i], scores);
}

static int cpu_attention(kv_backend *b, const kv_pool *p, const kv_attn_task *tasks, int n_tasks,
                         kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    const kv_config *cfg = &b->model->cfg;
    /* Fork threads only when the attention work amortises the fork/join: a parallel region
     * per layer for a few thousand multiply-adds costs more than it saves, and on a loaded
     * machine spinning OpenMP threads starve the BLAS threads (measured: 94 vs 7450 tokens/s
     * for stories260K decode with 2 threads at load 10). The estimate uses KV head 0 of each
     * sequence, as before the backend split. */
    double macs = 0.0;
    for (int i = 0; i < n_tasks; i++)
        if (tasks[i].kv_head == 0) macs += (double)tasks[i].n * (double)tasks[i].len;
    macs *= 2.0 * (double)cfg->n_heads * (double)cfg->head_dim;
    attn_job j = {c, p, tasks};
    kv_workers_run(macs >= KV_ATTN_PARALLEL_MACS ? c->pool : NULL, n_tasks, attend_chunk, &j);
    return KV_OK;
}

static int cpu_out_residual(kv_backend *b, int layer, int rows, const kv_hooks *hooks,
                            kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    const kv_config *cfg = &b->model->cfg;
    int dim = cfg->dim, qd = cfg->n_heads * cfg->head_dim;
    kv_op_matmul(c->xb2, c->o, b->model->layers[layer].wo, rows, qd, dim, mm_of(b));
    if (hooks && hooks->after_attn) {
        memcpy(c->xin, c->x, (size_t)rows * dim * sizeof(float));
        hooks->after_attn(hooks->user, layer, rows, c->xin, c->o, c->v, c->xb2);
    }
    for (size_t i = 0; i < (size_t)rows * dim; i++) c->x[i] += c->xb2[i];
    return KV_OK;
}

static int cpu_ffn(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    kv_op_ffn_residual(&b->model->layers[layer], &b->model->cfg, c->x, c->xb, c->hb, c->hb2, rows,
                       mm_of(b));
    if (hooks && hooks->after_block) hooks->after_block(hooks->user, layer, rows, c->x);
    return KV_OK;
}

static int cpu_logits(kv_backend *b, const int *rows, int n_sel, float *out, kv_error *err) {
    (void)err;
    cpu_backend *c = cpu(b);
    const kv_model *m = b->model;
    int dim = m->cfg.dim;
    /* consecutive rows 0..n-1 are normalised in one call (the same arithmetic per row) */
    int contiguous = 1;
    for (int i = 0; i < n_sel; i++) contiguous &= rows[i] == i;
    if (contiguous)
        kv_op_rmsnorm(c->gather, c->x, m->final_norm, n_sel, dim, m->cfg.norm_eps);
    else
        for (int i = 0; i < n_sel; i++)
            kv_op_rmsnorm(c->gather + (size_t)i * dim, c->x + (size_t)rows[i] * dim, m->final_norm,
                          1, dim, m->cfg.norm_eps);
    kv_op_matmul(out, c->gather, m->classifier, n_sel, dim, m->cfg.vocab_size, mm_of(b));
    return KV_OK;
}

static const kv_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .storage_alloc = cpu_storage_alloc,
    .storage_free = cpu_storage_free,
    .embed = cpu_embed,
    .qkv = cpu_qkv,
    .gather = cpu_gather,
    .cache_write = cpu_cache_write,
    .attention = cpu_attention,
    .out_residual = cpu_out_residual,
    .ffn = cpu_ffn,
    .logits = cpu_logits,
};

int kv_backend_cpu_new(const kv_model *m, int max_rows, int max_ctx, int n_threads,
                       kv_backend **out, kv_error *err) {
    *out = NULL;
    cpu_backend *c = kv_calloc(1, sizeof *c, "CPU backend", err);
    if (!c) return KV_EINTERNAL;
    int rc = kv_backend_base_init(&c->base, &cpu_ops, m, KV_DEVICE_CPU, max_rows, max_ctx, err);
    if (rc) {
        free(c);
        return rc;
    }
    const kv_config *cfg = &m->cfg;
    if ((rc = kv_workers_new(n_threads, &c->pool, err))) {
        kv_backend_free(&c->base);
        return rc;
    }
    c->n_threads = kv_workers_count(c->pool);
    c->vec = kv_isa_available(KV_ISA_AVX2) && !getenv("KVPLAN_PORTABLE_ATTENTION");
    /* The pool splits every GEMM itself (chunks of outputs); OpenBLAS's own threads would
     * compete with it for the cores, so OpenBLAS runs each call on its caller's thread. A
     * process-wide setting: the backend is what runs BLAS here. */
    openblas_set_num_threads(1);
    size_t R = (size_t)max_rows, d = (size_t)cfg->dim, qd = (size_t)cfg->n_heads * cfg->head_dim,
           kvd = (size_t)cfg->n_kv_heads * cfg->head_dim, hid = (size_t)cfg->hidden_dim,
           half = (size_t)cfg->head_dim / 2;
    c->x = malloc(R * d * sizeof(float));
    c->xb = malloc(R * d * sizeof(float));
    c->xb2 = malloc(R * d * sizeof(float));
    c->xin = malloc(R * d * sizeof(float));
    c->gather = malloc(R * d * sizeof(float));
    c->q = malloc(R * qd * sizeof(float));
    c->o = malloc(R * qd * sizeof(float));
    c->k = malloc(R * kvd * sizeof(float));
    c->v = malloc(R * kvd * sizeof(float));
    c->hb = malloc(R * hid * sizeof(float));
    c->hb2 = malloc(R * hid * sizeof(float));
    c->rope_cos = malloc((size_t)max_ctx * half * sizeof(float));
    c->rope_sin = malloc((size_t)max_ctx * half * sizeof(float));
    c->scores = malloc((size_t)c->n_threads * (size_t)(cfg->n_heads / cfg->n_kv_heads) *
                       (size_t)max_ctx * sizeof(float));
    c->mm.n = kv_model_matmul_scratch_threads(m, max_rows, c->n_threads);
    c->mm.pool = c->pool;
    c->mm.p = c->mm.n ? malloc(c->mm.n * sizeof(float)) : NULL;
    if (!c->x || !c->xb || !c->xb2 || !c->xin || !c->gather || !c->q || !c->o || !c->k || !c->v ||
        !c->hb || !c->hb2 || !c->rope_cos || !c->rope_sin || !c->scores || (c->mm.n && !c->mm.p)) {
        kv_backend_free(&c->base);
        return kv_fail(err, KV_EINTERNAL, "out of memory (CPU backend, %d rows)", max_rows);
    }
    kv_op_rope_tables(cfg, max_ctx, c->rope_cos, c->rope_sin);
    c->base.rowwise_capable = 1; /* kv_qmatmul_rowwise_pool; attention is per row already */
    *out = &c->base;
    return KV_OK;
}
