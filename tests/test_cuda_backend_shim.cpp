/* The CUDA backend's structure run end to end on this machine: a backend ops table
 * (include/kvplan/backend.h) built like cuda/backend_cuda.cu — the same kernels
 * (cuda/kernels/kv_kernels.cuh, run on the host shim), the same packing of each attention
 * step's tasks into one mirrored buffer (cuda/kernels/kv_pack.h), the same split of the
 * eviction schedule's move list into gather passes, K/V storage that only the kernels touch
 * (pool->data stays NULL) — with the CPU's GEMM (kv_op_matmul) standing in for cuBLAS. The
 * engine's driver (kv_forward) runs it and the CPU backend side by side on stories260K:
 *  - every layer's attention output, W_o output and block output through the hooks, and the
 *    logits, within 1e-5 of each array's largest magnitude;
 *  - greedy decoding from BOS: the same 40 tokens (8 under ASan);
 *  - a budgeted chunk (192 tokens, every head 48, p = 4; 40 / 16 under ASan; h2o and l2attn:
 * statistics, evictions, gathers every step): the summed NLL within 1e-5 relative and the K/V bytes
 * in use equal after every step. What this cannot show (the conformance suite does, on a device):
 * cuBLAS, the CUDA runtime calls, streams and events, device memory. */
#include "cuda_shim.hpp"

#include "../cuda/kernels/kv_kernels.cuh"
#include "../cuda/kernels/kv_pack.h"

extern "C" {
#include "kvplan/backend.h"
#include "kvplan/forward.h"
#include "kvplan/kvcache.h"
#include "kvplan/model.h"
#include "kvplan/tokenizer.h"
#include "runtime/backend/ops.h"
#include "testutil.h"
}

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace {

const char *const M260 = "models/stories260K/stories260K.bin";
const char *const TOK260 = "models/stories260K/tok512.bin";
const char *const TEXT = "text/tinystories_val_head.txt";
const int kThreads = 32; /* one warp per block: the fewest host threads per launch */
#if defined(__SANITIZE_ADDRESS__)
/* Under ASan the shim switches fibers with swapcontext (a system call each): shorter runs of
 * the same checks (the chunk still evicts: 64 tokens against 16 per head). */
const int kGreedy = 8, kPrefill = 16, kChunk = 40, kBudget = 16;
#else
const int kGreedy = 40, kPrefill = 64, kChunk = 192, kBudget = 48;
#endif

struct shim_backend {
    kv_backend base; /* first: the driver sees a kv_backend */
    std::vector<float> x, xb, xb2, q, k, v, o, hb, hb2, sel, cs, sn, scores, move_scratch;
    std::vector<int> idx, stamp, pass_start;
    std::vector<char> dev_meta; /* the device's copy of the packed attention buffer */
    int gen;
    long launches;
};

shim_backend *sb(kv_backend *b) {
    return reinterpret_cast<shim_backend *>(b);
}

void launch(shim_backend *c, int grid, size_t shm, const std::function<void()> &body) {
    c->launches++;
    if (kv_shim_launch(grid, 1, kThreads, shm, body)) std::abort();
}

/* Blocks of a grid-stride launch, as cuda/kernels.cu sizes them (capped low here). */
int grid_for(size_t n) {
    size_t b = (n + kThreads - 1) / kThreads;
    return b > 8 ? 8 : (b ? (int)b : 1);
}

float *storage(const kv_pool *p) {
    return static_cast<float *>(p->storage);
}

void shim_destroy(kv_backend *b) {
    delete sb(b);
}

int shim_storage_alloc(kv_backend *b, kv_pool *p, kv_error *err) {
    shim_backend *c = sb(b);
    size_t floats = (size_t)p->n_blocks * 2 * (size_t)p->block_size * (size_t)p->head_dim;
    p->storage = calloc(floats, sizeof(float));
    p->data = nullptr; /* nothing but the kernels may touch the K/V */
    if (!p->storage) return kv_fail(err, KV_EINTERNAL, "out of memory (shim storage)");
    c->stamp.assign((size_t)p->n_blocks * p->block_size, 0);
    c->gen = 1;
    return KV_OK;
}

void shim_storage_free(kv_backend *b, kv_pool *p) {
    (void)b;
    free(p->storage);
    p->storage = nullptr;
}

int shim_embed(kv_backend *b, const int *tokens, int rows, kv_error *err) {
    shim_backend *c = sb(b);
    int dim = b->model->cfg.dim;
    if (b->model->tok_emb.type != KV_DT_F32)
        return kv_fail(err, KV_EINPUT, "shim backend: fp32 embeddings only");
    const float *emb = static_cast<const float *>(b->model->tok_emb.data);
    launch(c, rows, 0, [&] { kv_k_gather_rows(c->x.data(), emb, tokens, dim); });
    return KV_OK;
}

int shim_qkv(kv_backend *b, int layer, int rows, const int *pos, kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    const kv_config *cfg = &b->model->cfg;
    const kv_layer_weights *w = &b->model->layers[layer];
    int dim = cfg->dim, hd = cfg->head_dim, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    int qd = H * hd, kvd = Hkv * hd;
    float eps = cfg->norm_eps;
    launch(c, rows, 0,
           [&] { kv_k_rmsnorm(c->xb.data(), c->x.data(), nullptr, w->attn_norm, dim, eps); });
    kv_op_matmul(c->q.data(), c->xb.data(), w->wq, rows, dim, qd, nullptr);
    kv_op_matmul(c->k.data(), c->xb.data(), w->wk, rows, dim, kvd, nullptr);
    kv_op_matmul(c->v.data(), c->xb.data(), w->wv, rows, dim, kvd, nullptr);
    if (w->bq) {
        launch(c, grid_for((size_t)rows * qd), 0,
               [&] { kv_k_add_bias(c->q.data(), w->bq, rows, qd); });
        launch(c, grid_for((size_t)rows * kvd), 0,
               [&] { kv_k_add_bias(c->k.data(), w->bk, rows, kvd); });
        launch(c, grid_for((size_t)rows * kvd), 0,
               [&] { kv_k_add_bias(c->v.data(), w->bv, rows, kvd); });
    }
    int layout = cfg->rope_layout == KV_ROPE_ADJACENT ? KV_K_ROPE_ADJACENT : KV_K_ROPE_HALF;
    launch(c, grid_for((size_t)rows * H * hd / 2), 0, [&] {
        kv_k_rope(c->q.data(), rows, qd, H, hd, pos, c->cs.data(), c->sn.data(), layout);
    });
    launch(c, grid_for((size_t)rows * Hkv * hd / 2), 0, [&] {
        kv_k_rope(c->k.data(), rows, kvd, Hkv, hd, pos, c->cs.data(), c->sn.data(), layout);
    });
    return KV_OK;
}

int shim_gather(kv_backend *b, kv_pool *p, const kv_move *moves, int n, kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    if (n <= 0) return KV_OK;
    c->pass_start.resize((size_t)n + 1);
    const kv_k_move *mv = reinterpret_cast<const kv_k_move *>(moves);
    int passes = kv_k_split_moves(mv, n, c->stamp.data(), &c->gen, c->pass_start.data());
    int hd = p->head_dim, bs = p->block_size;
    c->move_scratch.resize((size_t)n * 2 * hd);
    for (int i = 0; i < passes; i++) {
        const kv_k_move *pm = mv + c->pass_start[(size_t)i];
        int cnt = c->pass_start[(size_t)i + 1] - c->pass_start[(size_t)i];
        int grid = grid_for((size_t)cnt * 2 * hd);
        launch(c, grid, 0,
               [&] { kv_k_gather_read(storage(p), pm, cnt, c->move_scratch.data(), hd, bs); });
        launch(c, grid, 0,
               [&] { kv_k_gather_write(storage(p), pm, cnt, c->move_scratch.data(), hd, bs); });
    }
    return KV_OK;
}

int shim_cache_write(kv_backend *b, kv_pool *p, const kv_slot_write *w, int n, kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    int hd = p->head_dim, bs = p->block_size, kvd = b->model->cfg.n_kv_heads * hd;
    const kv_k_write *kw = reinterpret_cast<const kv_k_write *>(w);
    launch(c, grid_for((size_t)n * hd), 0,
           [&] { kv_k_cache_write(storage(p), kw, n, c->k.data(), c->v.data(), kvd, hd, bs); });
    return KV_OK;
}

int shim_attention(kv_backend *b, const kv_pool *p, const kv_attn_task *tasks, int n_tasks,
                   kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    const kv_config *cfg = &b->model->cfg;
    if (n_tasks <= 0) return KV_OK;
    int bs = p->block_size, hd = cfg->head_dim, g = cfg->n_heads / cfg->n_kv_heads;
    kv_k_meta_layout L;
    kv_k_meta_plan(tasks, n_tasks, bs, &L);
    std::vector<char> host(L.total);
    kv_k_meta_pack(tasks, n_tasks, bs, &L, host.data());
    /* the one mirror copy of the step (statistics sections only when some head tracks) */
    c->dev_meta.assign(L.total, 0);
    std::memcpy(c->dev_meta.data(), host.data(), L.tracked ? L.total : L.o_acc);
    c->scores.resize((size_t)n_tasks * g * L.longest);
    char *d = c->dev_meta.data();
    launch(c, n_tasks, (size_t)g * hd * sizeof(float), [&] {
        kv_k_paged_attention(
            storage(p), reinterpret_cast<const int *>(d + L.o_tab),
            reinterpret_cast<const kv_k_attn_task *>(d), reinterpret_cast<const int *>(d + L.o_pos),
            reinterpret_cast<float *>(d + L.o_acc), reinterpret_cast<float *>(d + L.o_acc2),
            c->q.data(), c->o.data(), cfg->n_heads * hd, g, hd, bs, c->scores.data(), L.longest);
    });
    if (!L.tracked) return KV_OK;
    std::memcpy(host.data() + L.o_acc, d + L.o_acc, L.total - L.o_acc);
    kv_k_meta_unpack_stats(tasks, n_tasks, &L, host.data());
    return KV_OK;
}

int shim_out_residual(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    const kv_config *cfg = &b->model->cfg;
    int dim = cfg->dim, qd = cfg->n_heads * cfg->head_dim;
    kv_op_matmul(c->xb2.data(), c->o.data(), b->model->layers[layer].wo, rows, qd, dim, nullptr);
    if (hooks && hooks->after_attn)
        hooks->after_attn(hooks->user, layer, rows, c->x.data(), c->o.data(), c->v.data(),
                          c->xb2.data());
    launch(c, grid_for((size_t)rows * dim), 0,
           [&] { kv_k_add(c->x.data(), c->xb2.data(), (size_t)rows * dim); });
    return KV_OK;
}

int shim_ffn(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    const kv_config *cfg = &b->model->cfg;
    const kv_layer_weights *w = &b->model->layers[layer];
    int dim = cfg->dim, hid = cfg->hidden_dim;
    float eps = cfg->norm_eps;
    launch(c, rows, 0,
           [&] { kv_k_rmsnorm(c->xb.data(), c->x.data(), nullptr, w->ffn_norm, dim, eps); });
    kv_op_matmul(c->hb.data(), c->xb.data(), w->w_gate, rows, dim, hid, nullptr);
    kv_op_matmul(c->hb2.data(), c->xb.data(), w->w_up, rows, dim, hid, nullptr);
    launch(c, grid_for((size_t)rows * hid), 0,
           [&] { kv_k_swiglu(c->hb.data(), c->hb2.data(), (size_t)rows * hid); });
    kv_op_matmul(c->xb.data(), c->hb.data(), w->w_down, rows, hid, dim, nullptr);
    launch(c, grid_for((size_t)rows * dim), 0,
           [&] { kv_k_add(c->x.data(), c->xb.data(), (size_t)rows * dim); });
    if (hooks && hooks->after_block) hooks->after_block(hooks->user, layer, rows, c->x.data());
    return KV_OK;
}

int shim_logits(kv_backend *b, const int *rows, int n_sel, float *out, kv_error *err) {
    (void)err;
    shim_backend *c = sb(b);
    const kv_model *m = b->model;
    int dim = m->cfg.dim;
    float eps = m->cfg.norm_eps;
    launch(c, n_sel, 0,
           [&] { kv_k_rmsnorm(c->sel.data(), c->x.data(), rows, m->final_norm, dim, eps); });
    kv_op_matmul(out, c->sel.data(), m->classifier, n_sel, dim, m->cfg.vocab_size, nullptr);
    return KV_OK;
}

const kv_backend_ops shim_ops = {
    "cuda-shim", shim_destroy,     shim_storage_alloc, shim_storage_free, shim_embed, shim_qkv,
    shim_gather, shim_cache_write, shim_attention,     shim_out_residual, shim_ffn,   shim_logits,
};

kv_backend *shim_backend_new(const kv_model *m, int max_rows, int max_ctx) {
    shim_backend *c = new shim_backend();
    kv_error err = {};
    CU_ASSERT_FATAL(kv_backend_base_init(&c->base, &shim_ops, m, KV_DEVICE_CUDA, max_rows, max_ctx,
                                         &err) == KV_OK);
    const kv_config *cfg = &m->cfg;
    size_t R = (size_t)max_rows, d = (size_t)cfg->dim, qd = (size_t)cfg->n_heads * cfg->head_dim,
           kvd = (size_t)cfg->n_kv_heads * cfg->head_dim, hid = (size_t)cfg->hidden_dim;
    for (auto *v : {&c->x, &c->xb, &c->xb2, &c->sel}) v->assign(R * d, 0.0f);
    for (auto *v : {&c->q, &c->o}) v->assign(R * qd, 0.0f);
    for (auto *v : {&c->k, &c->v}) v->assign(R * kvd, 0.0f);
    for (auto *v : {&c->hb, &c->hb2}) v->assign(R * hid, 0.0f);
    size_t half = (size_t)cfg->head_dim / 2;
    c->cs.resize((size_t)max_ctx * half);
    c->sn.resize(c->cs.size());
    kv_op_rope_tables(cfg, max_ctx, c->cs.data(), c->sn.data());
    return &c->base;
}

/* ---- the two backends side by side ---- */

kv_model *g_model;

struct side {
    kv_backend *b = nullptr;
    kv_pool pool = {};
    kv_cache cache = {};
};

/* A backend with one sequence: budgets per head (NULL: full), policy, block size 8. */
void open_side(side &s, bool shim, const int *budget, kv_policy pol, int ctx, int p) {
    const kv_config *cfg = &g_model->cfg;
    kv_error err = {};
    if (shim)
        s.b = shim_backend_new(g_model, ctx, ctx);
    else
        CU_ASSERT_FATAL(kv_backend_cpu_new(g_model, ctx, ctx, &s.b, &err) == KV_OK);
    long blocks = kv_cache_blocks_needed(cfg->n_layers, cfg->n_kv_heads, budget, ctx, p, 8);
    CU_ASSERT_FATAL(kv_backend_pool_init(s.b, &s.pool, (int)blocks, 8, cfg->head_dim, &err) ==
                    KV_OK);
    CU_ASSERT_FATAL(kv_cache_init(&s.cache, &s.pool, cfg->n_layers, cfg->n_kv_heads, nullptr, pol,
                                  &err) == KV_OK);
    CU_ASSERT_FATAL(kv_cache_set_budgets(&s.cache, budget, nullptr, ctx, &err) == KV_OK);
}

void close_side(side &s) {
    kv_cache_destroy(&s.cache);
    kv_backend_pool_destroy(s.b, &s.pool);
    kv_backend_free(s.b);
}

int step(side &s, const int *tok, int n, kv_logits_mode mode, float *logits,
         const kv_hooks *hooks) {
    kv_error err = {};
    kv_cache *cp = &s.cache;
    int rc = kv_forward(g_model, s.b, &cp, 1, tok, n, mode, logits, hooks, &err);
    if (rc) std::fprintf(stderr, "forward: %s\n", err.msg);
    return rc;
}

std::vector<int> text_ids(int max_n) {
    int n = 0;
    int *ids = tu_text_tokens(nullptr, tu_shared(TOK260), 4000, &n);
    std::vector<int> out(ids, ids + (n < max_n ? n : max_n));
    std::free(ids);
    return out;
}

double rel_to_max(const float *a, const float *b, size_t n) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = std::fabs((double)a[i] - (double)b[i]);
        if (!(x <= d)) d = x;
        m = std::fmax(m, std::fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

struct capture {
    std::vector<float> o, attn, out;
    int qd, dim;
};

void cap_attn(void *u, int layer, int rows, const float *, const float *o_heads, const float *,
              const float *attn_out) {
    capture *c = static_cast<capture *>(u);
    c->o.insert(c->o.end(), o_heads, o_heads + (size_t)rows * c->qd);
    c->attn.insert(c->attn.end(), attn_out, attn_out + (size_t)rows * c->dim);
    (void)layer;
}

void cap_block(void *u, int layer, int rows, const float *x_out) {
    capture *c = static_cast<capture *>(u);
    c->out.insert(c->out.end(), x_out, x_out + (size_t)rows * c->dim);
    (void)layer;
}

void test_layer_ops() {
    const kv_config *cfg = &g_model->cfg;
    std::vector<int> ids = text_ids(kPrefill);
    int n = (int)ids.size(), ctx = 128;
    capture cap[2];
    std::vector<float> logits[2];
    for (int d = 0; d < 2; d++) {
        cap[d].qd = cfg->n_heads * cfg->head_dim;
        cap[d].dim = cfg->dim;
        logits[d].assign((size_t)n * cfg->vocab_size, 0.0f);
        side s;
        open_side(s, d == 1, nullptr, KV_POLICY_H2O, ctx, 16);
        kv_hooks h = {&cap[d], cap_attn, cap_block};
        CU_ASSERT_FATAL(step(s, ids.data(), n, KV_LOGITS_ALL, logits[d].data(), &h) == KV_OK);
        if (d == 1)
            std::printf("\n    %ld shim launches for one %d-token prefill", sb(s.b)->launches, n);
        close_side(s);
    }
    size_t lo = (size_t)n * cap[0].qd, ld = (size_t)n * cfg->dim;
    for (int l = 0; l < cfg->n_layers; l++) {
        double eo = rel_to_max(&cap[1].o[l * lo], &cap[0].o[l * lo], lo);
        double ea = rel_to_max(&cap[1].attn[l * ld], &cap[0].attn[l * ld], ld);
        double ex = rel_to_max(&cap[1].out[l * ld], &cap[0].out[l * ld], ld);
        std::printf("\n    layer %d: attention %.3g, W_o %.3g, block out %.3g", l, eo, ea, ex);
        CU_ASSERT(eo <= 1e-5 && ea <= 1e-5 && ex <= 1e-5);
    }
    double el = rel_to_max(logits[1].data(), logits[0].data(), logits[0].size());
    std::printf("\n    logits: %.3g", el);
    CU_ASSERT(el <= 1e-5);
}

void test_greedy() {
    const kv_config *cfg = &g_model->cfg;
    const int steps = kGreedy;
    std::vector<int> toks[2];
    for (int d = 0; d < 2; d++) {
        side s;
        open_side(s, d == 1, nullptr, KV_POLICY_SINK, 64, 16);
        std::vector<float> logits((size_t)cfg->vocab_size);
        int tok = cfg->bos_id >= 0 ? cfg->bos_id : 1;
        for (int i = 0; i < steps; i++) {
            CU_ASSERT_FATAL(step(s, &tok, 1, KV_LOGITS_LAST, logits.data(), nullptr) == KV_OK);
            int best = 0;
            for (int v = 1; v < cfg->vocab_size; v++)
                if (logits[(size_t)v] > logits[(size_t)best]) best = v;
            toks[d].push_back(best);
            tok = best;
        }
        close_side(s);
    }
    int same = 0;
    while (same < steps && toks[0][(size_t)same] == toks[1][(size_t)same]) same++;
    std::printf("\n    greedy from BOS: %d of %d tokens equal", same, steps);
    CU_ASSERT(same == steps);
}

/* log-softmax NLL of `next` under logits [vocab] */
double nll(const float *logits, int vocab, int next) {
    double mx = logits[0];
    for (int v = 1; v < vocab; v++) mx = std::fmax(mx, (double)logits[v]);
    double z = 0.0;
    for (int v = 0; v < vocab; v++) z += std::exp((double)logits[v] - mx);
    return std::log(z) + mx - (double)logits[next];
}

void budgeted_case(kv_policy pol) {
    const kv_config *cfg = &g_model->cfg;
    const int ctx = kChunk, p = 4, V = cfg->vocab_size;
    std::vector<int> ids = text_ids(ctx);
    CU_ASSERT_FATAL((int)ids.size() == ctx);
    std::vector<int> budget((size_t)cfg->n_layers * cfg->n_kv_heads, kBudget);
    side s[2];
    for (int d = 0; d < 2; d++) open_side(s[d], d == 1, budget.data(), pol, ctx, p);
    double sum[2] = {0.0, 0.0};
    int bytes_equal = 1, evicted = 0;
    std::vector<float> logits((size_t)p * V);
    for (int t0 = 0; t0 < ctx; t0 += p) {
        int n = ctx - t0 < p ? ctx - t0 : p;
        for (int d = 0; d < 2; d++) {
            CU_ASSERT_FATAL(
                step(s[d], &ids[(size_t)t0], n, KV_LOGITS_ALL, logits.data(), nullptr) == KV_OK);
            for (int i = 0; i < n && t0 + i + 1 < ctx; i++)
                sum[d] += nll(&logits[(size_t)i * V], V, ids[(size_t)(t0 + i + 1)]);
        }
        bytes_equal &= kv_pool_bytes_in_use(&s[0].pool) == kv_pool_bytes_in_use(&s[1].pool);
    }
    evicted = kv_cache_head(&s[1].cache, 0, 0)->len < ctx;
    double rel = std::fabs(sum[1] - sum[0]) / sum[0];
    std::printf(
        "\n    %s, every head %d of %d, p = %d: NLL cpu %.6f shim %.6f (rel %.3g); bytes in "
        "use %zu / %zu, equal after every step: %s",
        kv_policy_name(pol), kBudget, ctx, p, sum[0], sum[1], rel, kv_pool_bytes_in_use(&s[0].pool),
        kv_pool_bytes_in_use(&s[1].pool), bytes_equal ? "yes" : "no");
    CU_ASSERT(rel <= 1e-5);
    CU_ASSERT(bytes_equal);
    CU_ASSERT(evicted);
    for (int d = 0; d < 2; d++) close_side(s[d]);
}

void test_budgeted_h2o() {
    budgeted_case(KV_POLICY_H2O);
}

void test_budgeted_l2attn() {
    budgeted_case(KV_POLICY_L2ATTN);
}

} // namespace

/* Suite fixture: stories260K (g_model). */
static int model_init(void) {
    kv_error err = {};
    if (kv_model_load(tu_shared(M260), &g_model, &err) == KV_OK) return 0;
    std::fprintf(stderr, "%s\n", err.msg);
    return 1;
}

static int model_cleanup(void) {
    kv_model_free(g_model);
    g_model = nullptr;
    return 0;
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {
        {"every layer-step op vs the CPU backend (hooks, logits)", test_layer_ops},
        {"greedy tokens equal to the CPU backend", test_greedy},
        {"budgeted chunk, h2o: NLL and bytes in use", test_budgeted_h2o},
        {"budgeted chunk, l2attn: NLL and bytes in use", test_budgeted_l2attn},
    };
    static const tu_suite suite = {"cuda_backend_shim", model_init, model_cleanup, tests,
                                   sizeof tests / sizeof tests[0]};
    return tu_main_suites(argc, argv, &suite, 1);
}
