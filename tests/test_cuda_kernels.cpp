/* The CUDA backend's kernel bodies (cuda/kernels/kv_kernels.cuh), run on this machine through
 * the host shim (tests/support/cuda_shim.hpp: each block's threads on host threads, shared memory,
 * barriers and warp shuffles), compared with the CPU backend at small sizes on real inputs:
 * activations of stories260K (adjacent RoPE, d_h 8, GQA g = 2) and TinyStories-656K (Hugging
 * Face, half RoPE, d_h 16), text from tinystories_val_head.txt.
 *
 * What each comparison expects:
 *  - row gather, bias, cache write, KV gather: exact (pure copies or one addition); the cache
 *    write and the gather in every KV storage type (f32, f16, q8, q4), byte for byte.
 *  - RMSNorm, RoPE, SwiGLU: the same float expressions as runtime/backend/ops.c; a relative 1e-6
 *    bound leaves room for libm's expf and the double sum's association.
 *  - attention: the kernel sums q.k with a warp butterfly and the softmax with a block tree,
 *    the CPU left to right. A score's rounding (~1e-7 of |q||k|, scores reach ~30 here) moves
 *    its weight by that much relatively, so outputs are bounded by 1e-5 of the step's largest
 *    output (measured: <= 3e-6), statistics within 1e-5 absolute (weights <= 1 summed over a
 *    few dozen queries; measured <= 4e-6).
 *    In f16 / q8 / q4 the CPU reference reads the same stored rows (kv_head_read), so the bound
 *    is the same.
 * Each launch uses blocks of 32, 64 or 96 threads so the reductions cross warps. */
#include "cuda_shim.hpp"

#include "../cuda/kernels/kv_kernels.cuh"
#include "../cuda/kernels/kv_flash.cuh"
#include "../cuda/kernels/kv_quant.cuh"
#include "../cuda/kernels/kv_prefill.cuh"
#include "../cuda/kernels/kv_evict.cuh"

extern "C" {
#include "kvplan/kvcache.h"
#include "kvplan/quant.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"
#include "runtime/backend/ops.h"
#include "quant/quant_dot.h" /* kv_qmatmul_int: the CPU's integer dots */
#include "testutil.h"
}

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

/* The fp32 data of a weight of the (fp32) bundled llama2.c checkpoints. */
static const float *f32(kv_weight w) {
    return static_cast<const float *>(w.data);
}

namespace {

const char *const M260 = "models/stories260K/stories260K.bin";
const char *const TOK260 = "models/stories260K/tok512.bin";
const char *const M656 = "models/tinystories-656k";

kv_model *load(const char *rel) {
    kv_model *m = nullptr;
    kv_error err = {};
    int rc = kv_model_load(tu_shared(rel), &m, &err);
    if (rc) std::fprintf(stderr, "%s: %s\n", rel, err.msg);
    CU_ASSERT_FATAL(rc == KV_OK);
    return m;
}

/* Token ids of the first `bytes` bytes of the validation text (stories260K's tokenizer,
 * 512 pieces; ids_for folds them into another model's vocabulary). */
std::vector<int> text_ids(size_t bytes) {
    int n = 0;
    int *ids = tu_text_tokens(nullptr, tu_shared(TOK260), bytes, &n);
    std::vector<int> out(ids, ids + n);
    std::free(ids);
    return out;
}

/* Token ids valid for any model: the text's ids folded into its vocabulary. */
std::vector<int> ids_for(const kv_model *m, const std::vector<int> &ids) {
    std::vector<int> out(ids);
    for (int &t : out) t %= m->cfg.vocab_size;
    return out;
}

/* Embedding rows of `ids` then RMSNorm with layer 0's attention norm: real layer inputs. */
std::vector<float> layer_input(const kv_model *m, const std::vector<int> &ids) {
    int dim = m->cfg.dim;
    std::vector<float> x(ids.size() * (size_t)dim), xb(x.size());
    for (size_t r = 0; r < ids.size(); r++)
        std::memcpy(&x[r * dim], f32(m->tok_emb) + (size_t)ids[r] * dim, sizeof(float) * dim);
    kv_op_rmsnorm(xb.data(), x.data(), m->layers[0].attn_norm, (int)ids.size(), dim,
                  m->cfg.norm_eps);
    return xb;
}

int launch(int grid, int block, size_t shm, const std::function<void()> &body) {
    int rc = kv_shim_launch(grid, 1, block, shm, body);
    CU_ASSERT(rc == 0);
    return rc;
}

/* Largest |a - b| / (|b| + floor) over n elements. */
double max_rel(const float *a, const float *b, size_t n, double floor) {
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = std::fabs((double)a[i] - (double)b[i]) / (std::fabs((double)b[i]) + floor);
        if (!(d <= w)) w = d; /* NaN propagates as a failure */
    }
    return w;
}

double max_abs(const float *a, const float *b, size_t n) {
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = std::fabs((double)a[i] - (double)b[i]);
        if (!(d <= w)) w = d;
    }
    return w;
}

/* ---------------- elementwise and row kernels ---------------- */

void test_rmsnorm() {
    const char *models[2] = {M260, M656};
    for (int mi = 0; mi < 2; mi++) {
        kv_model *m = load(models[mi]);
        std::vector<int> ids = ids_for(m, text_ids(400));
        int rows = (int)ids.size(), dim = m->cfg.dim;
        std::vector<float> x(ids.size() * (size_t)dim);
        for (int r = 0; r < rows; r++)
            std::memcpy(&x[(size_t)r * dim], f32(m->tok_emb) + (size_t)ids[r] * dim,
                        sizeof(float) * dim);
        const float *w = m->layers[m->cfg.n_layers - 1].ffn_norm;
        float eps = m->cfg.norm_eps;
        std::vector<float> want(x.size()), got(x.size(), NAN);
        kv_op_rmsnorm(want.data(), x.data(), w, rows, dim, eps);
        for (int block : {32, 96}) {
            std::fill(got.begin(), got.end(), NAN);
            launch(rows, block, 0,
                   [&] { kv_k_rmsnorm(got.data(), x.data(), nullptr, w, dim, eps); });
            double e = max_rel(got.data(), want.data(), got.size(), 1e-30);
            std::printf("\n    rmsnorm %s dim %d rows %d block %d: max rel diff %.3g", models[mi],
                        dim, rows, block, e);
            CU_ASSERT(e <= 1e-6);
        }
        /* the logits form: only the rows idx[] (the last token of each sequence) */
        int idx[3] = {rows - 1, 5, 0};
        std::vector<float> sel(3 * (size_t)dim), ref(3 * (size_t)dim);
        for (int r = 0; r < 3; r++)
            kv_op_rmsnorm(&ref[(size_t)r * dim], &x[(size_t)idx[r] * dim], m->final_norm, 1, dim,
                          eps);
        launch(3, 64, 0, [&] { kv_k_rmsnorm(sel.data(), x.data(), idx, m->final_norm, dim, eps); });
        CU_ASSERT(max_rel(sel.data(), ref.data(), sel.size(), 1e-30) <= 1e-6);
        kv_model_free(m);
    }
}

void test_rope_both_layouts() {
    const char *models[2] = {M260, M656};
    for (int mi = 0; mi < 2; mi++) {
        kv_model *m = load(models[mi]);
        const kv_config *c = &m->cfg;
        std::vector<int> ids = ids_for(m, text_ids(300));
        int rows = (int)ids.size(), hd = c->head_dim, H = c->n_heads, half = hd / 2;
        int qd = H * hd, dim = c->dim;
        std::vector<float> xb = layer_input(m, ids), q(ids.size() * (size_t)qd);
        kv_op_matmul(q.data(), xb.data(), m->layers[0].wq, rows, dim, qd, nullptr);
        int n_pos = 300 + rows;
        std::vector<float> cs((size_t)n_pos * half), sn((size_t)n_pos * half);
        kv_op_rope_tables(c, n_pos, cs.data(), sn.data());
        std::vector<int> pos((size_t)rows);
        for (int r = 0; r < rows; r++) pos[(size_t)r] = r % 2 ? 300 + r : r; /* near and far */
        for (int layout = 0; layout < 2; layout++) {
            std::vector<float> want(q), got(q);
            for (int r = 0; r < rows; r++)
                kv_op_rope_row(&want[(size_t)r * qd], H, hd, &cs[(size_t)pos[(size_t)r] * half],
                               &sn[(size_t)pos[(size_t)r] * half], (kv_rope_layout)layout);
            /* 3 blocks of 64 for rows * H * half pairs: the grid-stride loop wraps */
            launch(3, 64, 0, [&] {
                kv_k_rope(got.data(), rows, qd, H, hd, pos.data(), cs.data(), sn.data(), layout);
            });
            double e = max_rel(got.data(), want.data(), got.size(), 1e-6);
            std::printf("\n    rope %s layout %s: max rel diff %.3g", models[mi],
                        layout == KV_K_ROPE_ADJACENT ? "adjacent" : "half", e);
            CU_ASSERT(e <= 1e-6);
            CU_ASSERT(max_abs(got.data(), q.data(), q.size()) > 1e-3); /* it did rotate */
        }
        kv_model_free(m);
    }
}

/* SwiGLU and the residual add, composed into the FFN sub-block with the CPU's GEMMs and
 * compared with the CPU's kv_op_ffn_residual on every layer of stories260K. */
void test_swiglu_residual_ffn() {
    kv_model *m = load(M260);
    const kv_config *c = &m->cfg;
    std::vector<int> ids = text_ids(300);
    int rows = (int)ids.size(), dim = c->dim, hid = c->hidden_dim;
    std::vector<float> x0 = layer_input(m, ids);
    for (int l = 0; l < c->n_layers; l++) {
        const kv_layer_weights *w = &m->layers[l];
        std::vector<float> want(x0), xb(x0.size()), hb((size_t)rows * hid), hb2(hb.size());
        kv_op_ffn_residual(w, c, want.data(), xb.data(), hb.data(), hb2.data(), rows, nullptr);
        std::vector<float> got(x0);
        launch(rows, 64, 0, [&] {
            kv_k_rmsnorm(xb.data(), got.data(), nullptr, w->ffn_norm, dim, c->norm_eps);
        });
        kv_op_matmul(hb.data(), xb.data(), w->w_gate, rows, dim, hid, nullptr);
        kv_op_matmul(hb2.data(), xb.data(), w->w_up, rows, dim, hid, nullptr);
        launch(4, 32, 0, [&] { kv_k_swiglu(hb.data(), hb2.data(), hb.size()); });
        kv_op_matmul(xb.data(), hb.data(), w->w_down, rows, hid, dim, nullptr);
        launch(2, 64, 0, [&] { kv_k_add(got.data(), xb.data(), got.size()); });
        double e = max_rel(got.data(), want.data(), got.size(), 1e-6);
        std::printf("\n    ffn layer %d (rmsnorm, swiglu, residual): max rel diff %.3g", l, e);
        CU_ASSERT(e <= 1e-6);
    }
    kv_model_free(m);
}

void test_bias_and_gather() {
    kv_model *m = load(M260);
    std::vector<int> ids = text_ids(300);
    int rows = (int)ids.size(), dim = m->cfg.dim;
    /* gather: the embedding lookup of forward.c (memcpy of each token's row) */
    std::vector<float> want(ids.size() * (size_t)dim), got(want.size(), NAN);
    for (int r = 0; r < rows; r++)
        std::memcpy(&want[(size_t)r * dim], f32(m->tok_emb) + (size_t)ids[(size_t)r] * dim,
                    sizeof(float) * dim);
    launch(rows, 32, 0, [&] { kv_k_gather_rows(got.data(), f32(m->tok_emb), ids.data(), dim); });
    CU_ASSERT(std::memcmp(got.data(), want.data(), sizeof(float) * want.size()) == 0);
    /* bias: stories260K has none; a real weight row serves as the bias vector */
    const float *b = f32(m->layers[1].wq) + 3 * (size_t)dim;
    std::vector<float> cpu(want), dev(want);
    kv_op_add_bias(cpu.data(), b, rows, dim);
    launch(3, 64, 0, [&] { kv_k_add_bias(dev.data(), b, rows, dim); });
    CU_ASSERT(std::memcmp(cpu.data(), dev.data(), sizeof(float) * cpu.size()) == 0);
    CU_ASSERT(std::memcmp(cpu.data(), want.data(), sizeof(float) * cpu.size()) != 0);
    kv_model_free(m);
}

/* ---------------- paged KV: append, attention with statistics, compaction ---------------- */

/* Real q, k, v of layer 0 for `ids` (RoPE at position t for token t), with the KV heads cut
 * to n_kv (g = H / n_kv) by keeping the first n_kv of the model's KV heads. */
struct qkv {
    int T, H, n_kv, hd, g;
    std::vector<float> q, k, v; /* [T, H*hd], [T, n_kv*hd] */
};

qkv real_qkv(const kv_model *m, const std::vector<int> &ids, int n_kv) {
    const kv_config *c = &m->cfg;
    qkv r;
    r.T = (int)ids.size();
    r.H = c->n_heads;
    r.n_kv = n_kv;
    r.hd = c->head_dim;
    r.g = r.H / n_kv;
    int dim = c->dim, qd = r.H * r.hd, mkvd = c->n_kv_heads * r.hd, half = r.hd / 2;
    std::vector<float> xb = layer_input(m, ids), k((size_t)r.T * mkvd), v(k.size());
    r.q.resize((size_t)r.T * qd);
    kv_op_matmul(r.q.data(), xb.data(), m->layers[0].wq, r.T, dim, qd, nullptr);
    kv_op_matmul(k.data(), xb.data(), m->layers[0].wk, r.T, dim, mkvd, nullptr);
    kv_op_matmul(v.data(), xb.data(), m->layers[0].wv, r.T, dim, mkvd, nullptr);
    std::vector<float> cs((size_t)r.T * half), sn(cs.size());
    kv_op_rope_tables(c, r.T, cs.data(), sn.data());
    for (int t = 0; t < r.T; t++) {
        kv_op_rope_row(&r.q[(size_t)t * qd], r.H, r.hd, &cs[(size_t)t * half],
                       &sn[(size_t)t * half], c->rope_layout);
        kv_op_rope_row(&k[(size_t)t * mkvd], c->n_kv_heads, r.hd, &cs[(size_t)t * half],
                       &sn[(size_t)t * half], c->rope_layout);
    }
    r.k.resize((size_t)r.T * n_kv * r.hd);
    r.v.resize(r.k.size());
    for (int t = 0; t < r.T; t++) {
        std::memcpy(&r.k[(size_t)t * n_kv * r.hd], &k[(size_t)t * mkvd],
                    sizeof(float) * n_kv * r.hd);
        std::memcpy(&r.v[(size_t)t * n_kv * r.hd], &v[(size_t)t * mkvd],
                    sizeof(float) * n_kv * r.hd);
    }
    return r;
}

/* CPU reference of one (sequence, KV head) attention step, the semantics of attend_task_hd in
 * runtime/backend/backend_cpu.c (whose activations are private to the CPU backend, so its op cannot
 * be fed these q rows directly): query i of the n new ones attends entries 0 .. len - n + i;
 * statistics per entry in query-head order. q/o rows of stride H*hd starting at row0. */
void cpu_attend(kv_cache *c, kv_head *h, int j, int g, int hd, int n, const float *q, float *o,
                int q_stride, int row0) {
    const kv_pool *p = c->pool;
    int base = h->len - n;
    float inv = 1.0f / std::sqrt((float)hd);
    std::vector<float> s((size_t)h->len), kr((size_t)h->len * hd), vr(kr.size());
    for (int e = 0; e < h->len; e++) /* the stored rows, dequantised (any type) */
        kv_head_read(p, h, e, &kr[(size_t)e * hd], &vr[(size_t)e * hd]);
    for (int i = 0; i < n; i++) {
        int n_ent = base + i + 1, qpos = h->pos[base + i];
        for (int gh = 0; gh < g; gh++) {
            const float *qq = q + (size_t)(row0 + i) * q_stride + (size_t)(j * g + gh) * hd;
            float *oo = o + (size_t)(row0 + i) * q_stride + (size_t)(j * g + gh) * hd;
            float mx = -INFINITY;
            for (int e = 0; e < n_ent; e++) {
                const float *kk = &kr[(size_t)e * hd];
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot += qq[d] * inv * kk[d];
                s[(size_t)e] = dot;
                mx = dot > mx ? dot : mx;
            }
            float sum = 0.0f;
            for (int e = 0; e < n_ent; e++) sum += s[(size_t)e] = std::exp(s[(size_t)e] - mx);
            for (int e = 0; e < n_ent; e++) s[(size_t)e] /= sum;
            for (int d = 0; d < hd; d++) {
                float a = 0.0f;
                for (int e = 0; e < n_ent; e++) a += s[(size_t)e] * vr[(size_t)e * hd + d];
                oo[d] = a;
            }
            if (h->track_stats)
                for (int e = 0; e < n_ent; e++) {
                    float w = s[(size_t)e];
                    h->acc[e] += w;
                    if (qpos - h->pos[e] >= KV_K_L2_WINDOW) h->acc2[e] += w * w;
                }
        }
    }
}

/* The device's view of a set of CPU caches at one step: the pool storage (copied before the
 * step's writes), the block tables flattened, the entries' metadata flattened per task, one
 * task per (sequence, KV head), and the step's cache writes. */
struct mirror {
    std::vector<unsigned char> pool; /* the storage bytes */
    std::vector<float> acc, acc2;
    std::vector<int> pos, tables;
    std::vector<kv_k_attn_task> tasks;
    std::vector<kv_k_write> writes;
};

void mirror_tasks(mirror &d, const kv_pool *p, kv_cache *const *seqs, int n_seqs, int n) {
    d.tables.clear();
    d.tasks.clear();
    d.pos.clear();
    d.acc.clear();
    d.acc2.clear();
    d.writes.clear();
    for (int s = 0; s < n_seqs; s++)
        for (int j = 0; j < seqs[s]->n_kv_heads; j++) {
            kv_head *h = kv_cache_head(seqs[s], 0, j);
            kv_k_attn_task t = {
                s * n, n, j, h->len, (int)d.tables.size(), (int)d.pos.size(), h->track_stats};
            d.tables.insert(d.tables.end(), h->table, h->table + h->n_blocks);
            d.pos.insert(d.pos.end(), h->pos, h->pos + h->len);
            if (h->track_stats) { /* an untracked head keeps no sums: zeros, never added to */
                d.acc.insert(d.acc.end(), h->acc, h->acc + h->len);
                d.acc2.insert(d.acc2.end(), h->acc2, h->acc2 + h->len);
            } else {
                d.acc.insert(d.acc.end(), (size_t)h->len, 0.0f);
                d.acc2.insert(d.acc2.end(), (size_t)h->len, 0.0f);
            }
            d.tasks.push_back(t);
            for (int i = 0; i < n; i++)
                d.writes.push_back(kv_k_write{
                    s * n + i, j, kv_slot_of_entry(h->table, h->len - n + i, p->block_size)});
        }
}

/* The kernels' view (kv_k_pool) of a host pool's block ranges over storage `data`. */
kv_k_pool view(const kv_pool *p, void *data) {
    kv_k_pool v;
    std::memset(&v, 0, sizeof v); /* no per-slot metadata */
    v.data = static_cast<unsigned char *>(data);
    v.bs = p->block_size;
    v.hd = p->head_dim;
    for (int t = 0; t <= KV_CACHE_TYPES; t++) {
        v.type_first[t] = p->type_first[t];
        v.type_offset[t] = p->type_offset[t];
    }
    return v;
}

/* kv_k_flash_decode for K/V type ty at the pool's d_h (D: the power of two from 8 to 256 at
 * or above it), grid (n_tasks, parts), as the launcher (cuda/kernels.cu flash_type) picks it;
 * the pool's block size a power of two. */
template <int TY>
int flash_launch_t(const kv_k_pool &P, const int *tables, const kv_k_attn_task *tasks, int n_tasks,
                   const float *q, int q_stride, int g, int part, int parts, float *scratch,
                   int stride, float *pm, float *ps, float *po, int block) {
    int sh = 0;
    while ((1 << sh) < P.bs) sh++;
    size_t shm = kv_k_fd_shm(block, g, P.hd, part, sh);
    auto run = [&](auto kernel) {
        return kv_shim_launch(n_tasks, parts, block, shm, [&] {
            kernel(P, tables, tasks, q, q_stride, g, part, parts, sh, scratch, stride, pm, ps, po);
        });
    };
    if (P.hd <= 8) return run(kv_k_flash_decode<TY, 8>);
    if (P.hd <= 16) return run(kv_k_flash_decode<TY, 16>);
    if (P.hd <= 32) return run(kv_k_flash_decode<TY, 32>);
    if (P.hd <= 64) return run(kv_k_flash_decode<TY, 64>);
    if (P.hd <= 128) return run(kv_k_flash_decode<TY, 128>);
    return run(kv_k_flash_decode<TY, 256>);
}

int flash_launch(kv_cache_type ty, const kv_k_pool &P, const int *tables,
                 const kv_k_attn_task *tasks, int n_tasks, const float *q, int q_stride, int g,
                 int part, int parts, float *scratch, int stride, float *pm, float *ps, float *po,
                 int block) {
    switch (ty) {
    case KV_TYPE_F16:
        return flash_launch_t<KV_TYPE_F16>(P, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                           scratch, stride, pm, ps, po, block);
    case KV_TYPE_Q8:
        return flash_launch_t<KV_TYPE_Q8>(P, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                          scratch, stride, pm, ps, po, block);
    case KV_TYPE_Q4:
        return flash_launch_t<KV_TYPE_Q4>(P, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                          scratch, stride, pm, ps, po, block);
    default:
        return flash_launch_t<KV_TYPE_F32>(P, tables, tasks, n_tasks, q, q_stride, g, part, parts,
                                           scratch, stride, pm, ps, po, block);
    }
}

/* Flash-decoding of one decode step's tasks (the mirror d, queries q [tasks' rows, qd]) with
 * partitions of `part` entries, merged (kv_k_decode_merge) into the returned output; with
 * track, kv_k_decode_stats_raw adds the weights into acc / acc2. scratch: the raw scores. */
std::vector<float> flash_step(kv_cache_type ty, const kv_k_pool &P, const mirror &d,
                              const std::vector<float> &q, int qd, int g, int part, int longest,
                              int block, int track, std::vector<float> &scratch,
                              std::vector<float> &acc, std::vector<float> &acc2) {
    int n_tasks = (int)d.tasks.size(), hd = P.hd, parts = (longest + part - 1) / part;
    size_t fp = (size_t)n_tasks * parts * g;
    std::vector<float> fpart(fp * (size_t)(hd + 2), NAN), o(q.size(), NAN);
    float *fm = fpart.data(), *fs = fm + fp, *fo = fs + fp;
    std::fill(scratch.begin(), scratch.end(), NAN);
    CU_ASSERT_FATAL(flash_launch(ty, P, d.tables.data(), d.tasks.data(), n_tasks, q.data(), qd, g,
                                 part, parts, scratch.data(), longest, fm, fs, fo, block) == 0);
    launch(n_tasks, block, 0,
           [&] { kv_k_decode_merge(d.tasks.data(), g, hd, parts, fm, fs, fo, o.data(), qd); });
    if (track)
        CU_ASSERT_FATAL(kv_shim_launch(n_tasks, parts, block, 2 * (size_t)g * sizeof(float), [&] {
                            kv_k_decode_stats_raw(d.tasks.data(), g, part, parts, scratch.data(),
                                                  longest, fm, fs, d.tables.data(), P.bs,
                                                  d.pos.data(), acc.data(), acc2.data());
                        }) == 0);
    return o;
}

/* Steps of (new tokens per sequence): a prefill block, decode, a second block, decode. */
const int kSteps[] = {6, 1, 1, 3, 1, 1, 1, 5, 1, 1, 1, 1, 2, 1, 1, 1};

/* Three sequences of one layer on a shared pool (block size 4), unequal per-head budgets so
 * the heads' tables differ in length and interleave in the pool, policy `pol`. Each step:
 * CPU eviction (kv_head_make_room) and the CPU append and reference attention, against the
 * cache-write and attention kernels on a mirror of the state after eviction. */
void run_attention_case(const kv_model *m, int n_kv, kv_policy pol, int track, int block,
                        kv_cache_type ty = KV_TYPE_F32) {
    qkv a = real_qkv(m, ids_for(m, text_ids(600)), n_kv);
    const int n_seqs = 3, bs = 4, hd = a.hd, qd = a.H * hd, kvd = n_kv * hd;
    kv_error err = {};
    kv_pool pool;
    int counts[KV_CACHE_TYPES] = {0, 0, 0, 0};
    counts[ty] = 64; /* every block in the case's type */
    CU_ASSERT_FATAL(kv_pool_init_typed(&pool, counts, bs, hd, &err) == KV_OK);
    kv_cache seqs[n_seqs];
    kv_cache *sp[n_seqs];
    for (int s = 0; s < n_seqs; s++) {
        std::vector<int> budget((size_t)n_kv);
        for (int j = 0; j < n_kv; j++) budget[(size_t)j] = 10 + 5 * ((s + 2 * j) % 4) + s;
        CU_ASSERT_FATAL(kv_cache_init(&seqs[s], &pool, 1, n_kv, budget.data(), pol, &err) == KV_OK);
        for (int j = 0; j < n_kv; j++) {
            kv_cache_head(&seqs[s], 0, j)->track_stats = track;
            kv_cache_head(&seqs[s], 0, j)->type = ty;
        }
        sp[s] = &seqs[s];
    }
    size_t pool_bytes = kv_pool_storage_bytes(&pool);
    const unsigned char *host = reinterpret_cast<const unsigned char *>(pool.data);
    int t_used = 0, checked = 0, steps = 0;
    double worst_o = 0.0, worst_stat = 0.0, worst_split = 0.0, worst_split_stat = 0.0;
    double worst_flash = 0.0, worst_flash_stat = 0.0;
    int split_steps = 0;
    for (int n : kSteps) {
        int rows = n_seqs * n;
        std::vector<float> q((size_t)rows * qd), k((size_t)rows * kvd), v(k.size());
        for (int s = 0; s < n_seqs; s++)
            for (int i = 0; i < n; i++) {
                int r = s * n + i, tok = (t_used + i + 11 * s) % a.T;
                std::memcpy(&q[(size_t)r * qd], &a.q[(size_t)tok * qd], sizeof(float) * qd);
                std::memcpy(&k[(size_t)r * kvd], &a.k[(size_t)tok * kvd], sizeof(float) * kvd);
                std::memcpy(&v[(size_t)r * kvd], &a.v[(size_t)tok * kvd], sizeof(float) * kvd);
            }
        /* eviction on the CPU (shared policy and schedule), storage snapshot, then append */
        for (int s = 0; s < n_seqs; s++)
            for (int j = 0; j < n_kv; j++)
                CU_ASSERT_FATAL(kv_head_make_room(&seqs[s], kv_cache_head(&seqs[s], 0, j), n,
                                                  seqs[s].n_past + n - 1, &err) == KV_OK);
        mirror d;
        d.pool.assign(host, host + pool_bytes);
        for (int s = 0; s < n_seqs; s++)
            for (int j = 0; j < n_kv; j++)
                for (int i = 0; i < n; i++) {
                    size_t r = (size_t)(s * n + i);
                    CU_ASSERT_FATAL(kv_head_append(&seqs[s], kv_cache_head(&seqs[s], 0, j),
                                                   &k[r * kvd + (size_t)j * hd],
                                                   &v[r * kvd + (size_t)j * hd], seqs[s].n_past + i,
                                                   &err) == KV_OK);
                }
        mirror_tasks(d, &pool, sp, n_seqs, n);
        int n_tasks = (int)d.tasks.size(), n_writes = (int)d.writes.size();
        kv_k_pool P = view(&pool, d.pool.data());
        launch(2, block, 0, [&] {
            kv_k_cache_write(P, d.writes.data(), n_writes, k.data(), v.data(), kvd, nullptr);
        });
        /* the storage after the writes equals the CPU's, every byte of every slot */
        CU_ASSERT(std::memcmp(d.pool.data(), host, pool_bytes) == 0);
        int longest = 0;
        for (const kv_k_attn_task &t : d.tasks) longest = t.len > longest ? t.len : longest;
        std::vector<float> o_cpu((size_t)rows * qd, NAN), o_dev(o_cpu);
        std::vector<float> scratch((size_t)n_tasks * a.g * longest);
        for (int s = 0; s < n_seqs; s++)
            for (int j = 0; j < n_kv; j++)
                cpu_attend(&seqs[s], kv_cache_head(&seqs[s], 0, j), j, a.g, hd, n, q.data(),
                           o_cpu.data(), qd, s * n);
        std::vector<float> acc_split(d.acc), acc2_split(d.acc2); /* before this step */
        std::vector<float> acc_flash(d.acc), acc2_flash(d.acc2);
        launch(n_tasks, block, (size_t)a.g * hd * sizeof(float), [&] {
            kv_k_paged_attention(P, d.tables.data(), d.tasks.data(), d.pos.data(), d.acc.data(),
                                 d.acc2.data(), q.data(), o_dev.data(), qd, a.g, scratch.data(),
                                 longest);
        });
        /* error against the step's largest output (a near-zero output is a cancellation) */
        double omax = 0.0;
        for (float x : o_cpu) omax = std::fmax(omax, std::fabs((double)x));
        double eo = max_abs(o_dev.data(), o_cpu.data(), o_dev.size()) / omax;
        worst_o = eo > worst_o ? eo : worst_o;
        CU_ASSERT(eo <= 1e-5);
        bool split_done = false;
        if (n == 1) {
            /* split-sequence decode as on a device of 4 SMs per task: up to 8 chunks per task
             * of a block or more, tasks of unequal length (some chunks empty), merged; with
             * statistics, kv_k_decode_stats adds each entry's merged weights */
            kv_k_split sp = kv_k_split_plan(n_tasks, longest, bs, 4 * n_tasks);
            CU_ASSERT(sp.chunks > 1);
            size_t parts = (size_t)n_tasks * sp.chunks * a.g;
            std::vector<float> part(parts * (size_t)(hd + 2), NAN), o_split(o_cpu.size(), NAN);
            float *pm = part.data(), *ps = pm + parts, *po = ps + parts;
            std::fill(scratch.begin(), scratch.end(), NAN);
            CU_ASSERT_FATAL(
                kv_shim_launch(n_tasks, sp.chunks, block, (size_t)a.g * hd * sizeof(float), [&] {
                    kv_k_decode_split(P, d.tables.data(), d.tasks.data(), q.data(), qd, a.g,
                                      sp.chunk, sp.chunks, scratch.data(), longest, pm, ps, po);
                }) == 0);
            launch(n_tasks, block, 0, [&] {
                kv_k_decode_merge(d.tasks.data(), a.g, hd, sp.chunks, pm, ps, po, o_split.data(),
                                  qd);
            });
            if (track)
                CU_ASSERT_FATAL(
                    kv_shim_launch(n_tasks, sp.chunks, block, (size_t)a.g * sizeof(float), [&] {
                        kv_k_decode_stats(d.tasks.data(), a.g, sp.chunk, sp.chunks, scratch.data(),
                                          longest, pm, ps, d.tables.data(), P.bs, d.pos.data(),
                                          acc_split.data(), acc2_split.data());
                    }) == 0);
            split_done = true;
            double es = max_abs(o_split.data(), o_cpu.data(), o_split.size()) / omax;
            worst_split = es > worst_split ? es : worst_split;
            CU_ASSERT(es <= 1e-5);
            split_steps++;
            /* flash-decoding with partitions of one block (several per task, some empty) */
            std::vector<float> o_flash = flash_step(ty, P, d, q, qd, a.g, bs, longest, block, track,
                                                    scratch, acc_flash, acc2_flash);
            double ef = max_abs(o_flash.data(), o_cpu.data(), o_flash.size()) / omax;
            worst_flash = ef > worst_flash ? ef : worst_flash;
            CU_ASSERT(ef <= 1e-5);
        }
        /* statistics within 1e-5 (untracked: the kernels' stay 0) */
        for (const kv_k_attn_task &t : d.tasks) {
            kv_head *h = kv_cache_head(&seqs[t.row0 / n], 0, t.kv_head);
            for (int e = 0; e < t.len; e++) {
                size_t me = (size_t)(t.meta_off + e);
                if (!track) { /* the kernels add nothing; the head keeps no sums (kvcache.h) */
                    CU_ASSERT(d.acc[me] == 0.0f && d.acc2[me] == 0.0f);
                    checked++;
                    continue;
                }
                double ds = std::fabs(d.acc[me] - h->acc[e]);
                ds = std::fmax(ds, std::fabs(d.acc2[me] - h->acc2[e]));
                if (split_done) { /* the split kernels' statistics as well */
                    double dsp = std::fmax(std::fabs(acc_split[me] - h->acc[e]),
                                           std::fabs(acc2_split[me] - h->acc2[e]));
                    worst_split_stat = dsp > worst_split_stat ? dsp : worst_split_stat;
                    ds = std::fmax(ds, dsp);
                    double dfl = std::fmax(std::fabs(acc_flash[me] - h->acc[e]),
                                           std::fabs(acc2_flash[me] - h->acc2[e]));
                    worst_flash_stat = dfl > worst_flash_stat ? dfl : worst_flash_stat;
                    ds = std::fmax(ds, dfl);
                }
                worst_stat = ds > worst_stat ? ds : worst_stat;
                CU_ASSERT(ds <= 1e-5);
                checked++;
            }
        }
        for (int s = 0; s < n_seqs; s++) seqs[s].n_past += n;
        t_used += n;
        steps++;
    }
    /* the budgets made the tables unequal and forced evictions */
    int lens[2] = {kv_cache_head(&seqs[0], 0, 0)->len, kv_cache_head(&seqs[2], 0, n_kv - 1)->len};
    CU_ASSERT(lens[0] != lens[1]);
    CU_ASSERT(seqs[0].n_past > kv_cache_head(&seqs[0], 0, 0)->budget);
    std::printf("\n    attention %s g=%d %s stats %s block %d: %d steps, %d entries checked, "
                "max diff o %.3g of the largest output, max abs diff acc/acc2 %.3g",
                kv_type_name(ty), a.g, kv_policy_name(pol), track ? "on" : "off", block, steps,
                checked, worst_o, worst_stat);
    if (split_steps)
        std::printf(", split decode (%d steps) max diff %.3g, its acc/acc2 %.3g; flash-decoding "
                    "max diff %.3g, its acc/acc2 %.3g",
                    split_steps, worst_split, worst_split_stat, worst_flash, worst_flash_stat);
    CU_ASSERT(split_steps > 0);
    for (int s = 0; s < n_seqs; s++) kv_cache_destroy(&seqs[s]);
    kv_pool_destroy(&pool);
}

/* kv_k_split_plan: the grid reaches 2 x the SMs whenever the longest task allows, chunks are
 * whole blocks and cover the longest task exactly (no chunk past it), and the cases worked by
 * hand from its definition. */
void test_split_plan() {
    int checked = 0;
    for (int n_tasks : {1, 8, 32, 256, 1024})
        for (int longest : {1, 15, 16, 17, 100, 1024, 4096, 32768})
            for (int bs : {4, 16, 32})
                for (int sms : {1, 2, 108, 132}) {
                    kv_k_split p = kv_k_split_plan(n_tasks, longest, bs, sms);
                    CU_ASSERT(p.chunk >= bs && p.chunk % bs == 0);
                    CU_ASSERT((long)p.chunks * p.chunk >= longest);
                    CU_ASSERT((long)(p.chunks - 1) * p.chunk < longest);
                    CU_ASSERT(p.grid == (long)n_tasks * p.chunks);
                    long blocks_max = (long)n_tasks * ((longest + bs - 1) / bs);
                    long want = 2L * sms < blocks_max ? 2L * sms : blocks_max;
                    CU_ASSERT(p.grid >= want);
                    checked++;
                }
    /* Llama-2-7B shape with 8 KV heads on an H100 (132 SMs), block size 16: 264 blocks wanted,
     * 33 chunks per task; 4096 / 33 = 124 -> 112 entries (7 blocks), ceil(4096 / 112) = 37 */
    kv_k_split a = kv_k_split_plan(8, 4096, 16, 132);
    CU_ASSERT(a.chunk == 112 && a.chunks == 37 && a.grid == 296);
    kv_k_split b = kv_k_split_plan(8, 1024, 16, 132); /* 1024 / 33 = 31 -> 16 */
    CU_ASSERT(b.chunk == 16 && b.chunks == 64 && b.grid == 512);
    kv_k_split c = kv_k_split_plan(256, 4096, 16, 132); /* batch 32: 2 chunks per task */
    CU_ASSERT(c.chunk == 2048 && c.chunks == 2 && c.grid == 512);
    kv_k_split d = kv_k_split_plan(300, 100, 16, 132); /* enough tasks: no split */
    CU_ASSERT(d.chunks == 1 && d.chunk == 112);
    std::printf("\n    %d plans checked; 7B at 4k, batch 1: chunk %d, grid %ld", checked, a.chunk,
                a.grid);
}

void test_attention_g2() {
    kv_model *m = load(M260);
    run_attention_case(m, 4, KV_POLICY_H2O, 1, 64);
    run_attention_case(m, 4, KV_POLICY_SINK, 0, 32);
    run_attention_case(m, 4, KV_POLICY_H2O, 1, 64, KV_TYPE_F16);
    run_attention_case(m, 4, KV_POLICY_SINK, 0, 32, KV_TYPE_Q8);
    kv_model_free(m);
}

void test_attention_g4() {
    kv_model *m = load(M260);
    run_attention_case(m, 2, KV_POLICY_L2ATTN, 1, 96);
    run_attention_case(m, 2, KV_POLICY_AVGATTN, 1, 32);
    run_attention_case(m, 2, KV_POLICY_SINK, 0, 64, KV_TYPE_Q4);
    kv_model_free(m);
}

/* d_h 16 and the other RoPE layout (the K rows come from TinyStories-656K). */
void test_attention_656k() {
    kv_model *m = load(M656);
    run_attention_case(m, 4, KV_POLICY_H2O, 1, 64);
    run_attention_case(m, 4, KV_POLICY_L2ATTN, 1, 32, KV_TYPE_Q4);
    run_attention_case(m, 4, KV_POLICY_SINK, 0, 64, KV_TYPE_F16);
    kv_model_free(m);
}

/* The same launch twice gives the same bits (fixed-order reductions, no atomics). */
void test_attention_reproducible() {
    kv_model *m = load(M260);
    qkv a = real_qkv(m, text_ids(600), 2);
    const int bs = 4, hd = a.hd, n = 4, len = 37, qd = a.H * hd;
    mirror d;
    int n_blocks = kv_blocks_for(len, bs);
    std::vector<float> fpool((size_t)n_blocks * 2 * bs * hd, 0.0f); /* all f32 */
    kv_k_pool P = {
        reinterpret_cast<unsigned char *>(fpool.data()), bs, hd, {}, {}, nullptr, nullptr, nullptr};
    for (int t = 1; t <= KV_CACHE_TYPES; t++) {
        P.type_first[t] = n_blocks;
        P.type_offset[t] = fpool.size() * sizeof(float);
    }
    for (int b = 0; b < n_blocks; b++) d.tables.push_back(n_blocks - 1 - b); /* reversed */
    for (int e = 0; e < len; e++) {
        int slot = kv_slot_of_entry(d.tables.data(), e, bs);
        std::memcpy(&fpool[kv_slot_k_offset(slot, bs, hd)], &a.k[(size_t)e * 2 * hd],
                    sizeof(float) * hd);
        std::memcpy(&fpool[kv_slot_v_offset(slot, bs, hd)], &a.v[(size_t)e * 2 * hd],
                    sizeof(float) * hd);
        d.pos.push_back(e);
    }
    d.tasks.push_back(kv_k_attn_task{0, n, 1, len, 0, 0, 1});
    std::vector<float> o1((size_t)n * qd, 0.0f), o2(o1), scratch((size_t)a.g * len);
    std::vector<float> acc_first;
    for (int run = 0; run < 2; run++) {
        d.acc.assign((size_t)len, 0.0f);
        d.acc2.assign((size_t)len, 0.0f);
        launch(1, 64, (size_t)a.g * hd * sizeof(float), [&] {
            kv_k_paged_attention(P, d.tables.data(), d.tasks.data(), d.pos.data(), d.acc.data(),
                                 d.acc2.data(), &a.q[(size_t)(len - n) * qd],
                                 run ? o2.data() : o1.data(), qd, a.g, scratch.data(), len);
        });
        if (run == 0) acc_first = d.acc;
    }
    CU_ASSERT(std::memcmp(o1.data(), o2.data(), sizeof(float) * o1.size()) == 0);
    CU_ASSERT(std::memcmp(acc_first.data(), d.acc.data(), sizeof(float) * d.acc.size()) == 0);
    /* each query's weights sum to 1 over g heads: the accumulated total is n * g */
    double total = 0.0;
    for (float x : d.acc) total += x;
    CU_ASSERT(std::fabs(total - (double)n * a.g) <= 1e-4);
    kv_model_free(m);
}

/* Run a move list through kv_k_split_moves and the two gather kernels per pass. */
int shim_gather(const kv_pool *hp, std::vector<unsigned char> &pool,
                const std::vector<kv_k_move> &mv, int n_slots) {
    kv_k_pool P = view(hp, pool.data());
    int hd = hp->head_dim;
    std::vector<int> stamp((size_t)n_slots, 0), start(mv.size() + 1);
    int gen = 1;
    int passes = kv_k_split_moves(mv.data(), (int)mv.size(), stamp.data(), &gen, start.data());
    std::vector<unsigned char> scratch(mv.size() * 8 * hd);
    for (int p = 0; p < passes; p++) {
        const kv_k_move *pm = mv.data() + start[(size_t)p];
        int n = start[(size_t)p + 1] - start[(size_t)p];
        launch(3, 64, 0, [&] { kv_k_gather_read(P, pm, n, scratch.data()); });
        launch(2, 32, 0, [&] { kv_k_gather_write(P, pm, n, scratch.data()); });
    }
    return passes;
}

/* One launch of kv_k_evict over the heads of c (head j keeps nk[j] of its len entries at
 * curr_pos under policy pol) on a copy of the host pool `pool` with per-slot metadata taken
 * from the heads' host arrays; against kv_policy_select on the same arrays: the first nk[j]
 * entries of each head on the device must be the kept entries in order (position, acc, acc2
 * bit for bit, K and V bytes). Returns the entries that differ; *kept counts those compared. */
long evict_check(kv_cache *c, int n_heads, kv_policy pol, const int *nk, int curr_pos, long *kept) {
    kv_pool *p = c->pool;
    int bs = p->block_size, n_slots = p->n_blocks * bs;
    const unsigned char *hostb = reinterpret_cast<const unsigned char *>(p->data);
    std::vector<unsigned char> dev(hostb, hostb + kv_pool_storage_bytes(p));
    std::vector<int> dpos((size_t)n_slots, -1), tab;
    std::vector<float> dacc((size_t)n_slots, NAN), dacc2((size_t)n_slots, NAN);
    std::vector<kv_evict> ev;
    for (int j = 0; j < n_heads; j++) {
        kv_head *h = kv_cache_head(c, 0, j);
        for (int i = 0; i < h->len; i++) {
            int slot = kv_head_slot(p, h, i);
            dpos[(size_t)slot] = h->pos[i];
            dacc[(size_t)slot] = h->acc[i];
            dacc2[(size_t)slot] = h->acc2[i];
        }
        ev.push_back(kv_evict{(int)tab.size(), h->len, nk[j], (int)pol, curr_pos});
        tab.insert(tab.end(), h->table, h->table + h->n_blocks);
    }
    kv_k_pool P = view(p, dev.data());
    P.pos = dpos.data();
    P.acc = dacc.data();
    P.acc2 = dacc2.data();
    std::vector<float> score(tab.size() * (size_t)bs);
    std::vector<unsigned char> mask(score.size());
    size_t shm = (size_t)KV_K_EV_CHUNK * 2 * 4 * (size_t)p->head_dim;
    CU_ASSERT_FATAL(launch((int)ev.size(), KV_K_EV_THREADS, shm, [&] {
                        kv_k_evict(P, ev.data(), tab.data(), score.data(), mask.data());
                    }) == 0);
    long bad = 0;
    for (int j = 0; j < n_heads; j++) {
        kv_head *h = kv_cache_head(c, 0, j);
        std::vector<int> keep((size_t)h->len);
        kv_policy_select(pol, h->pos, h->acc, h->acc2, h->len, nk[j], curr_pos, keep.data());
        size_t rb = kv_type_row_bytes(h->type, p->head_dim);
        for (int i = 0; i < nk[j]; i++) {
            int d = kv_head_slot(p, h, i), s = kv_head_slot(p, h, keep[(size_t)i]);
            int same = dpos[(size_t)d] == h->pos[keep[(size_t)i]] &&
                       std::memcmp(&dacc[(size_t)d], &h->acc[keep[(size_t)i]], 4) == 0 &&
                       std::memcmp(&dacc2[(size_t)d], &h->acc2[keep[(size_t)i]], 4) == 0;
            for (int which = 0; which < 2; which++)
                same &= std::memcmp(dev.data() + (kv_pool_slot_row(p, d, which) - hostb),
                                    kv_pool_slot_row(p, s, which), rb) == 0;
            bad += !same;
        }
        *kept += nk[j];
    }
    return bad;
}

/* Statistics of the policy test: real ones (adv 0) as they are; adv 1 exact ties (a few
 * distinct values; avgattn: acc proportional to its denominator, so every score is 0.125);
 * adv 2 zeros of both signs. */
void evict_stats(kv_head *h, int adv, int curr_pos) {
    for (int i = 0; adv && i < h->len; i++) {
        if (adv == 1) {
            h->acc[i] = h->policy == KV_POLICY_AVGATTN ? 0.125f * (float)(curr_pos + 1 - h->pos[i])
                                                       : 0.5f * (float)(i % 3);
            h->acc2[i] = 0.25f * (float)((i * 7) % 4);
        } else {
            h->acc[i] = h->acc2[i] = (i & 1) ? -0.0f : 0.0f;
        }
    }
}

/* Eviction on the device (kv_evict.cuh kv_k_evict) against the host's kv_policy_select: four
 * heads of stories260K's real K/V (one per KV type: f32, f16, q8, q4) at ascending positions
 * with gaps, their statistics from real attention (cpu_attend) or adversarial (evict_stats:
 * exact ties, signed zeros), for h2o, avgattn and l2attn, each head keeping len - 1 (one
 * evicted: the argmin), 3/5, 1/3 and 2 of its entries (l2attn: more protected entries than
 * kept). Every kept set, order, metadata and row is identical. */
void test_evict_select() {
    kv_model *m = load(M260);
    qkv a = real_qkv(m, text_ids(600), 4);
    const int bs = 4, hd = a.hd, n_kv = 4, kvd = n_kv * hd;
    kv_error err = {};
    kv_pool pool;
    const int counts[KV_CACHE_TYPES] = {24, 24, 24, 24};
    CU_ASSERT_FATAL(kv_pool_init_typed(&pool, counts, bs, hd, &err) == KV_OK);
    const kv_policy pols[3] = {KV_POLICY_H2O, KV_POLICY_AVGATTN, KV_POLICY_L2ATTN};
    long bad = 0, kept = 0, records = 0;
    for (kv_policy pol : pols)
        for (int adv = 0; adv < 3; adv++) {
            kv_cache c;
            CU_ASSERT_FATAL(kv_cache_init(&c, &pool, 1, n_kv, nullptr, pol, &err) == KV_OK);
            const int lens[n_kv] = {41, 29, 33, 18};
            for (int j = 0; j < n_kv; j++) kv_cache_head(&c, 0, j)->type = (kv_cache_type)j;
            for (int t = 0; t < 41; t++)
                for (int j = 0; j < n_kv; j++) {
                    if (t >= lens[j]) continue;
                    kv_head *h = kv_cache_head(&c, 0, j);
                    h->track_stats = 1;
                    CU_ASSERT_FATAL(kv_head_append(&c, h, &a.k[(size_t)t * kvd + j * hd],
                                                   &a.v[(size_t)t * kvd + j * hd], t + t / 3,
                                                   &err) == KV_OK);
                }
            int curr_pos = 41 + 41 / 3 + 2;
            for (int j = 0; j < n_kv; j++) {
                kv_head *h = kv_cache_head(&c, 0, j);
                std::vector<float> o((size_t)h->len * a.H * hd);
                cpu_attend(&c, h, j, a.g, hd, h->len, a.q.data(), o.data(), a.H * hd, 0);
                evict_stats(h, adv, curr_pos);
            }
            for (int v = 0; v < 4; v++) {
                int nk[n_kv];
                for (int j = 0; j < n_kv; j++) {
                    int len = lens[j], k = (j + v) % 4;
                    nk[j] = k == 0 ? len - 1 : k == 1 ? len * 3 / 5 : k == 2 ? len / 3 : 2;
                }
                bad += evict_check(&c, n_kv, pol, nk, curr_pos, &kept);
                records += n_kv;
            }
            kv_cache_destroy(&c);
        }
    std::printf("\n    %ld evictions (h2o, avgattn, l2attn; real, tied and zero statistics): "
                "%ld kept entries compared, %ld differ from kv_policy_select's",
                records, kept, bad);
    CU_ASSERT(bad == 0);
    CU_ASSERT(kept > 1000);
    kv_pool_destroy(&pool);
    kv_model_free(m);
}

/* Gather: the eviction schedule's move lists (kv_head_schedule_room: a policy's survivors
 * moved forward through several heads' tables, interleaved in the pool) and a list with
 * chains, repeats and swaps, against the CPU's kv_pool_apply_moves_host. */
void test_gather() {
    kv_model *m = load(M260);
    qkv a = real_qkv(m, text_ids(600), 4);
    const int bs = 4, hd = a.hd, n_kv = 4, kvd = n_kv * hd;
    kv_error err = {};
    kv_pool pool;
    /* 24 blocks of each type; KV head j stores type j, so one move list crosses all four */
    const int counts[KV_CACHE_TYPES] = {24, 24, 24, 24};
    CU_ASSERT_FATAL(kv_pool_init_typed(&pool, counts, bs, hd, &err) == KV_OK);
    size_t pool_bytes = kv_pool_storage_bytes(&pool);
    const unsigned char *hostb = reinterpret_cast<const unsigned char *>(pool.data);
    int n_slots = pool.n_blocks * bs, total_moves = 0;
    const kv_policy pols[3] = {KV_POLICY_H2O, KV_POLICY_SINK, KV_POLICY_L2ATTN};
    for (kv_policy pol : pols) {
        kv_cache c;
        CU_ASSERT_FATAL(kv_cache_init(&c, &pool, 1, n_kv, nullptr, pol, &err) == KV_OK);
        for (int j = 0; j < n_kv; j++) kv_cache_head(&c, 0, j)->type = (kv_cache_type)j;
        /* fill the heads unevenly, interleaved so their blocks interleave in the pool */
        int lens[n_kv] = {41, 29, 33, 18};
        for (int t = 0; t < 41; t++)
            for (int j = 0; j < n_kv; j++) {
                if (t >= lens[j]) continue;
                kv_head *h = kv_cache_head(&c, 0, j);
                h->track_stats = 1;
                CU_ASSERT_FATAL(kv_head_append(&c, h, &a.k[(size_t)t * kvd + j * hd],
                                               &a.v[(size_t)t * kvd + j * hd], t, &err) == KV_OK);
            }
        /* statistics from real attention: every entry's row attends as a query */
        for (int j = 0; j < n_kv; j++) {
            kv_head *h = kv_cache_head(&c, 0, j);
            std::vector<float> o((size_t)h->len * a.H * hd);
            cpu_attend(&c, h, j, a.g, hd, h->len, a.q.data(), o.data(), a.H * hd, 0);
        }
        /* the schedule: each head keeps 3/5 of its entries for 4 new tokens */
        kv_moves mv = {};
        for (int j = 0; j < n_kv; j++) {
            kv_head *h = kv_cache_head(&c, 0, j);
            h->budget = h->len * 3 / 5 + 4;
            CU_ASSERT_FATAL(kv_head_schedule_room(&c, h, 4, 44, &mv, &err) == KV_OK);
        }
        std::vector<kv_k_move> list;
        for (int i = 0; i < mv.n; i++) list.push_back(kv_k_move{mv.v[i].src, mv.v[i].dst});
        std::vector<unsigned char> dev(hostb, hostb + pool_bytes);
        kv_pool_apply_moves_host(&pool, mv.v, mv.n);
        int passes = shim_gather(&pool, dev, list, n_slots);
        CU_ASSERT(passes == 1); /* survivors move forward: one read-then-write pass */
        CU_ASSERT(mv.n > 0);
        CU_ASSERT(std::memcmp(dev.data(), hostb, pool_bytes) == 0);
        total_moves += mv.n;
        kv_moves_free(&mv);
        kv_cache_destroy(&c);
    }
    /* chains (a slot written then read), repeats (a slot written twice), swaps */
    /* (f32 slots 2-40, f16 slots from 96, q8 from 192 and q4 from 288) */
    std::vector<unsigned char> dev(hostb, hostb + pool_bytes);
    std::vector<kv_k_move> list = {{5, 9},     {9, 13},    {13, 5},    {7, 7},     {20, 21},
                                   {22, 21},   {30, 31},   {31, 30},   {40, 2},    {2, 40},
                                   {3, 4},     {4, 3},     {100, 120}, {120, 100}, {200, 201},
                                   {201, 230}, {300, 301}, {301, 300}, {333, 290}};
    std::vector<kv_move> host;
    for (const kv_k_move &x : list) host.push_back(kv_move{x.src, x.dst});
    kv_pool_apply_moves_host(&pool, host.data(), (int)host.size());
    int passes = shim_gather(&pool, dev, list, n_slots);
    CU_ASSERT(passes > 1);
    CU_ASSERT(std::memcmp(hostb, dev.data(), pool_bytes) == 0);
    std::printf("\n    gather, heads of f32/f16/q8/q4 in one pool: h2o, sink, l2attn schedules "
                "(%d moves) in one pass each, exact; "
                "a list of chains and swaps in %d passes, exact",
                total_moves, passes);
    kv_pool_destroy(&pool);
    kv_model_free(m);
}

/* y [rows, out] of the typed GEMV kernel for weight type t at R (rows <= R), as kvcu::gemv
 * launches it: kv_k_gemv_f16 (F16), kv_k_quantize_q8 + kv_k_gemv_q (Q8_0, Q4_0),
 * kv_k_quantize_q8k + kv_k_gemv_q4k (Q4_K) or kv_k_gemv_qk (Q6_K), on a grid of 3 blocks (Q4_K:
 * 1 block of 8 output rows), so the grid-stride loops run. */
template <int R>
std::vector<float> typed_gemv(kv_dtype t, const std::vector<unsigned char> &W, size_t rb,
                              const std::vector<float> &x, int rows, int in, int out) {
    std::vector<float> y((size_t)rows * out, NAN);
    if (t == KV_DT_F16) {
        launch(3, KV_K_GEMV_THREADS, 0,
               [&] { kv_k_gemv_f16<R>(W.data(), x.data(), y.data(), rows, in, out); });
        return y;
    }
    int qk = t == KV_DT_Q4_K || t == KV_DT_Q6_K ? 256 : 32;
    size_t nb = (size_t)rows * (size_t)(in / qk);
    std::vector<signed char> q(qk * nb);
    std::vector<float> d(nb, NAN);
    std::vector<int> s(nb);
    std::vector<short> s16(16 * nb);
    if (qk == 32)
        launch(3, 64, 0,
               [&] { kv_k_quantize_q8(x.data(), rows, in, q.data(), d.data(), s.data()); });
    else
        launch(3, 64, 0,
               [&] { kv_k_quantize_q8k(x.data(), rows, in, q.data(), d.data(), s16.data()); });
    const unsigned char *w = W.data();
    int threads = t == KV_DT_Q4_K ? KV_K_GEMV_Q4K_THREADS : KV_K_GEMV_THREADS;
    launch(t == KV_DT_Q4_K ? 1 : 3, threads, 0, [&] {
        if (t == KV_DT_Q8_0)
            kv_k_gemv_q<kv_q8_0_dot, R>(w, rb, q.data(), d.data(), s.data(), y.data(), rows, in,
                                        out);
        else if (t == KV_DT_Q4_0)
            kv_k_gemv_q<kv_q4_0_dot, R>(w, rb, q.data(), d.data(), s.data(), y.data(), rows, in,
                                        out);
        else if (t == KV_DT_Q4_K)
            kv_k_gemv_q4k<R>(w, rb, q.data(), d.data(), s16.data(), y.data(), rows, in, out);
        else
            kv_k_gemv_qk<kv_q6k_lane, R>(w, rb, q.data(), d.data(), s16.data(), y.data(), rows, in,
                                         out);
    });
    return y;
}

/* typed_gemv for the kernel the launcher picks at `rows` of the test's (1, 3, 8, 13, 32): R =
 * rows up to 8, else 16 or 32. */
std::vector<float> typed_gemv_rows(kv_dtype t, const std::vector<unsigned char> &W, size_t rb,
                                   const std::vector<float> &x, int rows, int in, int out) {
    return rows == 1    ? typed_gemv<1>(t, W, rb, x, rows, in, out)
           : rows == 3  ? typed_gemv<3>(t, W, rb, x, rows, in, out)
           : rows == 8  ? typed_gemv<8>(t, W, rb, x, rows, in, out)
           : rows == 13 ? typed_gemv<16>(t, W, rb, x, rows, in, out)
                        : typed_gemv<32>(t, W, rb, x, rows, in, out);
}

/* KV_K_GEMV_ROWS rows of x, in wide, from real layer inputs of stories260K: row r is the layer
 * inputs of tokens 5r, 5r + 1, ... (mod the text's) side by side. */
std::vector<float> gemv_inputs(const kv_model *m, int in) {
    std::vector<float> xin = layer_input(m, text_ids(600));
    size_t dim = (size_t)m->cfg.dim, ntok = xin.size() / dim;
    CU_ASSERT_FATAL(ntok >= 50);
    std::vector<float> x((size_t)KV_K_GEMV_ROWS * in);
    for (size_t r = 0; r < (size_t)KV_K_GEMV_ROWS; r++)
        for (size_t i = 0; i < (size_t)in; i++)
            x[r * in + i] = xin[((5 * r + i / dim) % ntok) * dim + i % dim];
    return x;
}

/* The typed GEMV kernels of decode against the CPU, for 1, 3, 8, 13 and 32 rows (13: the R = 16
 * kernel with 3 rows idle; 32 the widest batch): F16 against the double
 * product of the weights (within 1e-5 of sum |w x|, fp32 sums in another order); Q8_0 and Q4_0
 * (activations quantised to 8 bits once, dp4a) against the CPU's integer dots
 * (kv_qmatmul_int: the same quantised activations and per-block terms, so they differ by the
 * order of the fp32 additions only: within 1e-6 of sum |w x|). */
void typed_gemv_case(kv_dtype t, const std::vector<unsigned char> &W, size_t rb,
                     const std::vector<float> &wf, const std::vector<float> &x, int in, int out) {
    double worst = 0.0;
    for (int rows : {1, 3, 8, 13, KV_K_GEMV_ROWS}) {
        std::vector<float> y = typed_gemv_rows(t, W, rb, x, rows, in, out);
        std::vector<float> ref((size_t)rows * out, NAN);
        if (t != KV_DT_F16) {
            std::vector<unsigned char> act((size_t)rows * kv_qdot_act_bytes(t, in));
            kv_qmatmul_int(ref.data(), x.data(), W.data(), t, rows, in, out, act.data());
        }
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < out; o++) {
                double dref = 0.0, mag = 0.0;
                for (int i = 0; i < in; i++) {
                    double p = (double)wf[(size_t)o * in + i] * x[(size_t)r * in + i];
                    dref += p;
                    mag += std::fabs(p);
                }
                double want = t == KV_DT_F16 ? dref : (double)ref[(size_t)r * out + o];
                double e = std::fabs((double)y[(size_t)r * out + o] - want) / mag;
                if (!(e <= worst)) worst = e;
            }
    }
    std::printf(", typed kernel %.3g of sum |w x| (vs %s)", worst,
                t == KV_DT_F16 ? "the double product" : "the CPU's integer dots");
    CU_ASSERT(worst <= (t == KV_DT_F16 ? 1e-5 : 1e-6));
}

/* Weights in their type (kv_quant.cuh) for every weight type kvplan reads: a [6, 512] matrix of
 * stories260K's embedding values (a real weight distribution) quantised by kv_quantize_row;
 *  - kv_k_dequant_rows vs the CPU's kv_dequantize_row: the same floats (the decoders use the
 *    CPU's expressions; 1e-6 of the row's largest value leaves room for a contracted
 *    multiply-add in the CPU's AVX2 build);
 *  - kv_k_gather_rows_typed (embedding lookup) vs kv_weight_row, the same bound;
 *  - kv_k_gemv for 1, 3 and 32 rows of x (real layer inputs, repeated to 512 wide) vs the
 *    double-precision product with the dequantised rows: within 1e-5 of sum |w x| (fp32
 *    accumulation over 512 terms in a warp's order);
 *  - kv_k_gemv_f16 and kv_k_gemv_q (Q8_0, Q4_0) for 1, 3, 8, 13, 32 rows (typed_gemv_case);
 *  - kv_k_to_16: binary16 and bfloat16 bits equal kv_quantize_row's. */
void test_typed_weights() {
    kv_model *m = load(M260);
    const int out = 6, in = 512;
    const float *src = f32(m->tok_emb);
    std::vector<float> x = gemv_inputs(m, in);
    kv_error err = {};
    int types = 0;
    for (kv_dtype t : kv_dtype_all) {
        size_t rb = 0;
        CU_ASSERT_FATAL(kv_dtype_row_bytes(t, in, "test", &rb, &err) == KV_OK);
        std::vector<unsigned char> W((size_t)out * rb);
        for (int o = 0; o < out; o++)
            CU_ASSERT_FATAL(
                kv_quantize_row(t, src + (size_t)o * in, &W[(size_t)o * rb], in, &err) == KV_OK);
        std::vector<float> cpu((size_t)out * in), dev(cpu.size(), NAN);
        for (int o = 0; o < out; o++)
            CU_ASSERT_FATAL(
                kv_dequantize_row(t, &W[(size_t)o * rb], &cpu[(size_t)o * in], in, &err) == KV_OK);
        double wmax = 0.0;
        for (float v : cpu) wmax = std::fmax(wmax, std::fabs((double)v));
        launch(3, 64, 0, [&] { kv_k_dequant_rows(W.data(), t, rb, in, 1, out - 1, dev.data()); });
        double ed = max_abs(dev.data(), &cpu[(size_t)in], (size_t)(out - 1) * in) / wmax;
        CU_ASSERT(ed <= 1e-6);
        /* embedding rows 5, 0, 3 */
        std::vector<int> idx = {5, 0, 3};
        std::vector<float> g(3 * (size_t)in, NAN), gw(g.size());
        launch(3, 32, 0,
               [&] { kv_k_gather_rows_typed(g.data(), W.data(), t, rb, idx.data(), in); });
        for (int r = 0; r < 3; r++)
            kv_weight_row(kv_weight{W.data(), t}, in, idx[(size_t)r], &gw[(size_t)r * in]);
        double eg = max_abs(g.data(), gw.data(), g.size()) / wmax;
        CU_ASSERT(eg <= 1e-6);
        double eworst = 0.0;
        for (int rows : {1, 3, KV_K_GEMV_ROWS}) {
            std::vector<float> y((size_t)rows * out, NAN);
            launch(2, 64, 0,
                   [&] { kv_k_gemv(W.data(), t, rb, x.data(), y.data(), rows, in, out); });
            for (int r = 0; r < rows; r++)
                for (int o = 0; o < out; o++) {
                    double ref = 0.0, mag = 0.0;
                    for (int i = 0; i < in; i++) {
                        double p = (double)cpu[(size_t)o * in + i] * x[(size_t)r * in + i];
                        ref += p;
                        mag += std::fabs(p);
                    }
                    double e = std::fabs((double)y[(size_t)r * out + o] - ref) / mag;
                    if (!(e <= eworst)) eworst = e;
                }
        }
        CU_ASSERT(eworst <= 1e-5);
        std::printf("\n    %-5s dequant %.3g, gather %.3g, gemv (1/3/32 rows) %.3g of sum |w x|",
                    kv_dtype_name(t), ed, eg, eworst);
        if (t == KV_DT_F16 || t == KV_DT_Q8_0 || t == KV_DT_Q4_0)
            typed_gemv_case(t, W, rb, cpu, x, in, out);
        types++;
    }
    CU_ASSERT(types == KV_DT_COUNT);
    /* activations to 16 bits, as the 16-bit GEMMs take them */
    for (kv_dtype t : {KV_DT_F16, KV_DT_BF16}) {
        std::vector<uint16_t> got(x.size()), want(x.size());
        std::vector<float> big(x); /* and values past the binary16 range */
        big[3] = 1e6f;
        big[4] = -7e4f;
        if (t == KV_DT_F16) {
            for (size_t i = 0; i < big.size(); i++) want[i] = kv_f32_to_f16(big[i]);
        } else {
            CU_ASSERT_FATAL(
                kv_quantize_row(t, big.data(), want.data(), (int64_t)big.size(), &err) == KV_OK);
        }
        launch(2, 32, 0, [&] { kv_k_to_16(big.data(), got.data(), big.size(), t); });
        CU_ASSERT(std::memcmp(got.data(), want.data(), 2 * got.size()) == 0);
    }
    kv_model_free(m);
}

/* Flash-decoding at the d_h of real 7B-class models (64, 128, 256: 2, 4 and 8 dimensions a
 * lane) and a GQA group of 8, where no small model reaches: three tasks of 300, 517 and 1
 * entries on shuffled tables of a pool of f16 or q8 blocks (K, V and queries from a fixed
 * pseudo-random sequence), partitions of 64 entries, against the one-block kernel
 * kv_k_paged_attention (checked against the CPU above): outputs within 1e-5 of the largest,
 * the tracked task's statistics within 1e-5. */
void test_flash_wide_heads() {
    const int bs = 16, g = 8, part = 64, lens[3] = {300, 517, 1}, n_tasks = 3;
    double worst_o = 0.0, worst_s = 0.0;
    uint32_t st = 12345u;
    auto rnd = [&st] {
        st = st * 1664525u + 1013904223u;
        return (float)((st >> 8) & 0xffff) / 32768.0f - 1.0f;
    };
    for (int hd : {64, 128, 256})
        for (kv_cache_type ty : {KV_TYPE_F16, KV_TYPE_Q8}) {
            kv_error err = {};
            kv_pool pool;
            int counts[KV_CACHE_TYPES] = {0, 0, 0, 0};
            counts[ty] = 64;
            CU_ASSERT_FATAL(kv_pool_init_typed(&pool, counts, bs, hd, &err) == KV_OK);
            std::vector<unsigned char> data(kv_pool_storage_bytes(&pool));
            kv_k_pool P = view(&pool, data.data());
            size_t rb = kvt_row_bytes(ty, hd);
            std::vector<float> row((size_t)hd);
            for (int slot = 0; slot < 64 * bs; slot++)
                for (int which = 0; which < 2; which++) {
                    for (float &x : row) x = rnd();
                    kvt_encode(ty, hd, row.data(), kv_k_row(P, ty, rb, slot, which));
                }
            std::vector<int> tables, pos;
            std::vector<kv_k_attn_task> tasks;
            int next = 0;
            for (int i = 0; i < n_tasks; i++) {
                kv_k_attn_task t = {i, 1, 0, lens[i], (int)tables.size(), (int)pos.size(), i == 1};
                for (int b = 0; b < (lens[i] + bs - 1) / bs; b++)
                    tables.push_back(counts[ty] - 1 - (next++ * 7) % counts[ty] +
                                     pool.type_first[ty]);
                for (int e = 0; e < lens[i]; e++) pos.push_back(e);
                tasks.push_back(t);
            }
            int qd = g * hd, parts = (517 + part - 1) / part;
            std::vector<float> q((size_t)n_tasks * qd), o_ref(q.size(), NAN), o_fl(q.size(), NAN);
            for (float &x : q) x = 2.0f * rnd();
            std::vector<float> acc(pos.size(), 0.0f), acc2(acc), acc_f(acc), acc2_f(acc);
            std::vector<float> scratch((size_t)n_tasks * g * 517, NAN);
            launch(n_tasks, 128, (size_t)qd * sizeof(float), [&] {
                kv_k_paged_attention(P, tables.data(), tasks.data(), pos.data(), acc.data(),
                                     acc2.data(), q.data(), o_ref.data(), qd, g, scratch.data(),
                                     517);
            });
            size_t fp = (size_t)n_tasks * parts * g;
            std::vector<float> fpart(fp * (size_t)(hd + 2), NAN);
            float *fm = fpart.data(), *fs = fm + fp, *fo = fs + fp;
            CU_ASSERT_FATAL(flash_launch(ty, P, tables.data(), tasks.data(), n_tasks, q.data(), qd,
                                         g, part, parts, scratch.data(), 517, fm, fs, fo,
                                         128) == 0);
            launch(n_tasks, 128, 0, [&] {
                kv_k_decode_merge(tasks.data(), g, hd, parts, fm, fs, fo, o_fl.data(), qd);
            });
            CU_ASSERT_FATAL(kv_shim_launch(n_tasks, parts, 128, 2 * (size_t)g * sizeof(float), [&] {
                                kv_k_decode_stats_raw(tasks.data(), g, part, parts, scratch.data(),
                                                      517, fm, fs, tables.data(), bs, pos.data(),
                                                      acc_f.data(), acc2_f.data());
                            }) == 0);
            double omax = 0.0;
            for (float x : o_ref) omax = std::fmax(omax, std::fabs((double)x));
            double eo = max_abs(o_fl.data(), o_ref.data(), o_fl.size()) / omax;
            double es = std::fmax(max_abs(acc_f.data(), acc.data(), acc.size()),
                                  max_abs(acc2_f.data(), acc2.data(), acc2.size()));
            CU_ASSERT(eo <= 1e-5 && es <= 1e-5);
            worst_o = eo > worst_o ? eo : worst_o;
            worst_s = es > worst_s ? es : worst_s;
            kv_pool_destroy(&pool);
        }
    std::printf("\n    d_h 64/128/256, g 8, f16/q8: outputs within %.3g of the largest, "
                "statistics within %.3g",
                worst_o, worst_s);
}

/* The K-quant decode GEMVs (kv_k_quantize_q8k + kv_k_gemv_q4k for Q4_K, kv_k_gemv_qk for Q6_K)
 * against the CPU's integer dots (kv_qmatmul_int) on a [12, 2560] matrix of stories260K's
 * embedding values quantised by kv_quantize_row (10 super-blocks a row: lanes / groups 0 and 1
 * of the kernels take two, the others one, so the CPU's 8 block lanes and its final sum order
 * are all exercised; Q4_K's second pass over output rows has 4 idle rows) and 1,
 * 3, 8 rows of real layer inputs (repeated to 2560 wide; and 13 and 32 rows, the batched
 * kernels): the same quantised activations, the same exact integers per super-block, the
 * same fp32 expression, accumulators and final order, so the results are **bit-identical**
 * (memcmp), and the quantised activation bytes and sums equal the CPU's. */
void test_qk_gemv_bits() {
    kv_model *m = load(M260);
    const int out = 12, in = 2560, maxr = KV_K_GEMV_ROWS;
    const float *src = f32(m->tok_emb);
    CU_ASSERT_FATAL((size_t)m->cfg.vocab_size * m->cfg.dim >= (size_t)out * in);
    std::vector<float> x = gemv_inputs(m, in);
    kv_error err = {};
    for (kv_dtype t : {KV_DT_Q4_K, KV_DT_Q6_K}) {
        size_t rb = 0;
        CU_ASSERT_FATAL(kv_dtype_row_bytes(t, in, "test", &rb, &err) == KV_OK);
        std::vector<unsigned char> W((size_t)out * rb);
        for (int o = 0; o < out; o++)
            CU_ASSERT_FATAL(
                kv_quantize_row(t, src + (size_t)o * in, &W[(size_t)o * rb], in, &err) == KV_OK);
        int same = 0, total = 0;
        for (int rows : {1, 3, 8, 13, maxr}) {
            std::vector<float> y = typed_gemv_rows(t, W, rb, x, rows, in, out);
            std::vector<float> ref((size_t)rows * out, NAN);
            std::vector<unsigned char> act((size_t)rows * kv_qdot_act_bytes(t, in));
            kv_qmatmul_int(ref.data(), x.data(), W.data(), t, rows, in, out, act.data());
            for (size_t k = 0; k < ref.size(); k++, total++)
                same += std::memcmp(&y[k], &ref[k], sizeof(float)) == 0;
            CU_ASSERT(std::memcmp(y.data(), ref.data(), ref.size() * sizeof(float)) == 0);
        }
        std::printf("\n    %s [%d, %d], rows 1/3/8/13/32: %d of %d outputs bit-identical to the "
                    "CPU's integer dots",
                    kv_dtype_name(t), out, in, same, total);
    }
    /* the activation quantiser alone: bytes, scales and 16-sums equal the CPU's layout K */
    size_t ab = kv_qdot_act_bytes(KV_DT_Q4_K, in);
    std::vector<unsigned char> act(ab);
    kv_qdot_quantize_act(KV_DT_Q4_K, x.data(), in, act.data());
    std::vector<signed char> q((size_t)in);
    std::vector<float> d((size_t)in / 256);
    std::vector<short> s16((size_t)in / 16);
    launch(2, 64, 0, [&] { kv_k_quantize_q8k(x.data(), 1, in, q.data(), d.data(), s16.data()); });
    size_t doff = ((size_t)in + 63) / 64 * 64, soff = doff + d.size() * sizeof(float);
    CU_ASSERT(std::memcmp(q.data(), act.data(), q.size()) == 0);
    CU_ASSERT(std::memcmp(d.data(), act.data() + doff, d.size() * sizeof(float)) == 0);
    CU_ASSERT(std::memcmp(s16.data(), act.data() + soff, s16.size() * sizeof(short)) == 0);
    kv_model_free(m);
}

/* Tiled prefill attention (kv_k_prefill_tiled + kv_k_prefill_stats, tensor-core tiles in
 * binary16) against the one-block kernel kv_k_paged_attention (checked against the CPU
 * above), on shuffled tables of an f16 pool (K, V, queries from a fixed pseudo-random
 * sequence, queries uniform in +-6, so the scores have a standard deviation of about 2): three
 * tasks, a first prefill of 70 tokens, a chunk of 40 tokens after 60 cached entries (tracked:
 * h2o/l2attn statistics) and 5 after 32, at d_h 16 / 64 / 128 and GQA groups 1 and 4 (query tiles
 * of 64 rows cut across tokens and heads). The queries and P are rounded to binary16 (2^-11
 * relative): outputs within 2e-3 of the largest |o|, statistics within 2e-3 absolute (each a sum of
 * up to 160 weights). */
void test_prefill_tiled() {
    const int bs = 16, n_tasks = 3, ns[3] = {70, 40, 5}, lens[3] = {70, 100, 37};
    double worst_o = 0.0, worst_s = 0.0;
    uint32_t st = 777u;
    auto rnd = [&st] {
        st = st * 1664525u + 1013904223u;
        return (float)((st >> 8) & 0xffff) / 32768.0f - 1.0f;
    };
    for (int hd : {16, 64, 128})
        for (int g : {1, 4}) {
            kv_error err = {};
            kv_pool pool;
            int counts[KV_CACHE_TYPES] = {0, 24, 0, 0};
            CU_ASSERT_FATAL(kv_pool_init_typed(&pool, counts, bs, hd, &err) == KV_OK);
            std::vector<unsigned char> data(kv_pool_storage_bytes(&pool));
            kv_k_pool P = view(&pool, data.data());
            size_t rb = kvt_row_bytes(KV_TYPE_F16, hd);
            std::vector<float> row((size_t)hd);
            for (int slot = 0; slot < 24 * bs; slot++)
                for (int which = 0; which < 2; which++) {
                    for (float &x : row) x = rnd();
                    kvt_encode(KV_TYPE_F16, hd, row.data(),
                               kv_k_row(P, KV_TYPE_F16, rb, slot, which));
                }
            std::vector<int> tables, pos;
            std::vector<kv_k_attn_task> tasks;
            int next = 0, rows = 0;
            for (int i = 0; i < n_tasks; i++) {
                kv_k_attn_task t = {rows, ns[i], 0, lens[i], (int)tables.size(), (int)pos.size(),
                                    i < 2};
                for (int b = 0; b < (lens[i] + bs - 1) / bs; b++)
                    tables.push_back(23 - (next++ * 7) % 24 + pool.type_first[KV_TYPE_F16]);
                for (int e = 0; e < lens[i]; e++) pos.push_back(e);
                tasks.push_back(t);
                rows += ns[i];
            }
            int qd = g * hd, max_rows = 70 * g;
            const float qscale = 6.0f; /* scores q.k / sqrt(d_h) of standard deviation ~2 */
            std::vector<float> q((size_t)rows * qd), o_ref(q.size(), NAN), o_t(q.size(), NAN);
            for (float &x : q) x = qscale * rnd();
            std::vector<float> acc(pos.size(), 0.0f), acc2(acc), acc_t(acc), acc2_t(acc);
            std::vector<float> scratch((size_t)n_tasks * g * 100, NAN);
            std::vector<float> ml((size_t)n_tasks * 2 * max_rows, NAN);
            launch(n_tasks, 128, (size_t)qd * sizeof(float), [&] {
                kv_k_paged_attention(P, tables.data(), tasks.data(), pos.data(), acc.data(),
                                     acc2.data(), q.data(), o_ref.data(), qd, g, scratch.data(),
                                     100);
            });
            int qt = (max_rows + KV_K_PT_BQ - 1) / KV_K_PT_BQ, kt = (100 + KV_K_PT_BK - 1) / 32;
            auto pass1 = [&] {
                if (hd == 16)
                    kv_k_prefill_tiled<16>(P, tables.data(), tasks.data(), q.data(), o_t.data(), qd,
                                           g, ml.data(), max_rows);
                else if (hd == 64)
                    kv_k_prefill_tiled<64>(P, tables.data(), tasks.data(), q.data(), o_t.data(), qd,
                                           g, ml.data(), max_rows);
                else
                    kv_k_prefill_tiled<128>(P, tables.data(), tasks.data(), q.data(), o_t.data(),
                                            qd, g, ml.data(), max_rows);
            };
            auto pass2 = [&] {
                if (hd == 16)
                    kv_k_prefill_stats<16>(P, tables.data(), tasks.data(), q.data(), qd, g,
                                           ml.data(), max_rows, pos.data(), acc_t.data(),
                                           acc2_t.data());
                else if (hd == 64)
                    kv_k_prefill_stats<64>(P, tables.data(), tasks.data(), q.data(), qd, g,
                                           ml.data(), max_rows, pos.data(), acc_t.data(),
                                           acc2_t.data());
                else
                    kv_k_prefill_stats<128>(P, tables.data(), tasks.data(), q.data(), qd, g,
                                            ml.data(), max_rows, pos.data(), acc_t.data(),
                                            acc2_t.data());
            };
            CU_ASSERT_FATAL(kv_shim_launch(n_tasks, qt, KV_K_PT_THREADS, KV_K_PT_SHM(hd), pass1) ==
                            0);
            CU_ASSERT_FATAL(
                kv_shim_launch(n_tasks, kt, KV_K_PT_THREADS, KV_K_PT_STATS_SHM(hd), pass2) == 0);
            double omax = 0.0;
            for (float x : o_ref) omax = std::fmax(omax, std::fabs((double)x));
            double eo = max_abs(o_t.data(), o_ref.data(), o_t.size()) / omax;
            double es = std::fmax(max_abs(acc_t.data(), acc.data(), acc.size()),
                                  max_abs(acc2_t.data(), acc2.data(), acc2.size()));
            double amax = 0.0;
            for (float x : acc) amax = std::fmax(amax, (double)x);
            CU_ASSERT(eo <= 2e-3 && es <= 2e-3);
            CU_ASSERT(amax > 1.0); /* the statistics were accumulated, not left at 0 */
            worst_o = eo > worst_o ? eo : worst_o;
            worst_s = es > worst_s ? es : worst_s;
            kv_pool_destroy(&pool);
        }
    std::printf("\n    d_h 16/64/128, g 1/4, f16: outputs within %.3g of the largest, "
                "statistics within %.3g",
                worst_o, worst_s);
}

/* The shim itself: warp shuffles and block reductions give CUDA's answers. */
void test_shim_primitives() {
    std::vector<float> sums(96), maxes(96), downs(96), bsum(96);
    launch(1, 96, 0, [&] {
        int t = kv_tid();
        sums[(size_t)t] = kv_warp_sum((float)t);
        maxes[(size_t)t] = kv_warp_max((float)((t * 37) % 96));
        downs[(size_t)t] = kv_shfl_down((float)t, 5);
        KV_SHARED_ARRAY(float, red, 32);
        bsum[(size_t)t] = kv_block_sum(1.0f + (float)t, red);
    });
    for (int t = 0; t < 96; t++) {
        int w = t / 32, lane = t % 32;
        float want_sum = 0, want_max = 0;
        for (int l = 0; l < 32; l++) {
            want_sum += (float)(w * 32 + l);
            float x = (float)(((w * 32 + l) * 37) % 96);
            want_max = x > want_max ? x : want_max;
        }
        CU_ASSERT(sums[(size_t)t] == want_sum);
        CU_ASSERT(maxes[(size_t)t] == want_max);
        CU_ASSERT(downs[(size_t)t] == (float)(lane + 5 < 32 ? t + 5 : t));
        CU_ASSERT(bsum[(size_t)t] == 96.0f * 97.0f / 2.0f);
    }
    CU_ASSERT(kv_shim_launch(1, 1, 48, 0, [] {}) != 0); /* not a multiple of 32 */
}

} // namespace

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"shim primitives (shuffles, block reductions)", test_shim_primitives},
        {"rmsnorm kernel vs kv_op_rmsnorm", test_rmsnorm},
        {"rope kernel, adjacent and half layouts, vs kv_op_rope_row", test_rope_both_layouts},
        {"swiglu + residual kernels in the FFN vs kv_op_ffn_residual", test_swiglu_residual_ffn},
        {"bias and row-gather kernels", test_bias_and_gather},
        {"cache write + paged attention, g=2, unequal tables, stats on/off", test_attention_g2},
        {"cache write + paged attention, g=4, l2attn/avgattn stats", test_attention_g4},
        {"cache write + paged attention, TinyStories-656K d_h 16, f32/q4/f16", test_attention_656k},
        {"paged attention is reproducible, weights sum to 1", test_attention_reproducible},
        {"gather (eviction move lists) vs the CPU", test_gather},
        {"eviction on the device: kv_policy_select's kept sets", test_evict_select},
        {"split-sequence decode launch plan", test_split_plan},
        {"typed weights: dequant, gather, gemv, 16-bit activations", test_typed_weights},
        {"flash-decoding at d_h 64/128/256, g 8", test_flash_wide_heads},
        {"K-quant GEMV (Q4_K, Q6_K): the CPU's integer-dot bits", test_qk_gemv_bits},
        {"tiled prefill attention (binary16 tensor-core tiles) vs the one-block kernel",
         test_prefill_tiled},
    };
    return tu_main(argc, argv, "cuda_kernels", tests, sizeof tests / sizeof tests[0]);
}
