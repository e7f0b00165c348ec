/* kvplan CUDA backend: the engine's layer-step ops (include/kvplan/backend.h) on one CUDA
 * device, with the driver, block-table metadata, policies and eviction schedule shared with the
 * CPU backend (runtime/engine/forward.c, runtime/cache/kvcache.c).
 *
 * - Weights are uploaded once at creation in their file's type (include/kvplan/quant.h: F32,
 *   F16, BF16 and the ggml block types as their blocks), so the device holds the file's
 *   tensor bytes. A matmul (kvcu::matmul in cuda/matmul.cu, shared with the KVPR executor)
 *   of up to KV_K_GEMV_ROWS rows (decode) is the typed GEMV kernel (cuda/kernels/kv_quant.cuh:
 *   each weight row read once in its type, decoded in registers, fp32 activations); above
 *   that (prefill) F32 weights go to cublasGemmEx in fp32, F16/BF16 weights to cublasGemmEx
 *   with the activations rounded to the weights' 16-bit type (FP32 compute, default math
 *   mode: tensor cores), and block types are dequantised a tile of rows at a time into fp32
 *   scratch for an fp32 GEMM, as the CPU's kv_qmatmul does. FP32 GEMMs stay FP32: the default
 *   math mode uses TF32 only when asked.
 * - The K/V block storage lives on the device in the CPU layout and in each head's stored type
 *   (f32, f16, q8, q4: runtime/cache/kvtype.h, the same codec on both devices), so the bytes
 *   in use equal the CPU backend's; attention decodes rows as it reads them (no fp32 copy of
 *   the cache). Beside them, by slot, each entry's position and attention sums (pos, acc,
 *   acc2: the pool has device_meta): the cache write sets them, the attention kernels of
 *   tracked heads accumulate there, the gather moves them with the rows, and the evictions of
 *   h2o / avgattn / l2attn heads are chosen and compacted on the device (cuda_evict,
 *   kernels/kv_evict.cuh: kv_policy_select's choice). The free list and block tables stay on
 *   the host.
 * - Block tables are resident on the device, one array per layer (task i's table at a fixed
 *   stride): per attention step the tasks, the table entries the engine marked dirty since the
 *   copy was made (kv_table_mirror; kv_pack.h, scattered by kv_k_table_patch) are packed into
 *   pinned host memory and mirrored to the device with one asynchronous copy on the copy
 *   stream; the compute stream waits for it on an event. A decode step that opens no block
 *   uploads no table entry; an evicting one uploads its eviction records (the heads' tables
 *   before the eviction), never per-entry positions or statistics, and nothing comes back.
 * - Host-to-device staging (token ids, positions, cache-write and move lists, attention
 *   metadata) goes to a bounded pinned arena (kStageBound) that is only appended to within a
 *   step and rewound where
 *   the host has waited for the compute stream anyway (the logits, a read-back, a hook): no
 *   staging buffer is rewritten while a queued copy may still read it, without a wait per
 *   copy. The positions of a step are uploaded once, not once per layer. A decode step of an
 *   tracked or untracked policy therefore waits for the device once (the logits), see
 *   bench_cuda_fake.
 * - Kernels: cuda/kernels/kv_kernels.cuh (checked against the CPU on the host shim by
 *   tests/test_cuda_kernels.cpp).
 * Errors: every CUDA / cuBLAS failure becomes KV_EINTERNAL naming the call; nothing exits.
 */
#include "kernels.h"
#include "kernels/kv_pack.h"
#include "matmul.h"

#include "backend/backend_impl.h"
#include "backend/kvcuda.h"
#include "cache/kvslot.h"
#include "kvplan/model.h"
#include "kvplan/quant.h"
#include "model/tensors.h"

extern "C" {
#include "backend/ops.h" /* kv_op_rope_tables: the CPU backend's tables, the same floats */
}

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <new>
#include <stdlib.h>
#include <string.h>

static_assert(sizeof(kv_slot_write) == sizeof(kv_k_write), "kv_slot_write layout");
static_assert(sizeof(kv_move) == sizeof(kv_k_move), "kv_move layout");

namespace {

using kvcu::dev_weight;

/* A layer on the device, by role (model/tensors.h, kv_role_id): the fp32 vectors in vec (a
 * matrix role's entry and an absent bias nullptr), the matrices in their type in mat. */
struct dev_layer {
    float *vec[KV_ROLE_COUNT];
    dev_weight mat[KV_ROLE_COUNT];
};

/* A device buffer and a pinned host buffer that grow on demand (bytes). */
struct dbuf {
    void *p = nullptr;
    size_t cap = 0;
};

struct cuda_backend {
    kv_backend base; /* first: the engine sees a kv_backend */
    int dev;
    cudaStream_t compute, copy;
    cudaEvent_t meta_ready, attn_done;
    cublasHandle_t blas;
    /* weights */
    dev_layer *layers;
    dev_weight tok_emb, classifier; /* classifier may alias tok_emb (the same p) */
    float *final_norm;
    kvcu::dev_scratch d_wtile; /* prefill: a dequantised tile of weight rows, or x in 16 bits */
    /* activations [max_rows, ...] */
    float *x, *xb, *xb2, *q, *k, *v, *o, *hb, *hb2, *sel;
    float *rope_cos, *rope_sin; /* [max_ctx, d_h / 2] */
    int *d_rows;                /* [max_rows] token ids / selected rows */
    int *d_pos;                 /* [max_rows] positions of the step's rows */
    int *last_pos;              /* host [max_rows]: what d_pos holds (last_rows of them) */
    int last_rows;              /* -1: d_pos holds nothing known */
    /* per-step staging, grown on demand */
    dbuf stage; /* pinned staging arena, stage_used bytes queued since the rewind */
    size_t stage_used;
    dbuf d_meta;         /* attention: tasks | tables | pos | acc | acc2 */
    dbuf d_scores;       /* attention scores */
    dbuf d_part;         /* split decode attention: per-chunk max, sum, output */
    int sms;             /* the device's multiprocessors (split decode attention's grid) */
    dbuf d_list;         /* cache writes / moves */
    dbuf d_move_scratch; /* gather pass scratch */
    dbuf h_out;          /* logits and hook copies */
    dbuf h_logits;       /* the caller's logits buffer (cuda_out_buffer): copied into directly */
    int *stamp;          /* [n_slots] for kv_k_split_moves */
    int stamp_slots, stamp_gen;
    int *pass_start; /* [cap + 1] */
    int pass_cap;
    dbuf d_evict;   /* eviction records and their block tables */
    dbuf d_ev_work; /* eviction scores and masks */
    /* block tables resident on the device, per layer: task i's table at i * tab_stride of
     * d_tabs[l]; tab_owner[l][i] is the head mirror (kv_table_mirror) that copy was uploaded
     * for (NULL: unknown), for tab_cap[l] tasks; a step uploads only the entries the engine
     * marked dirty (kv_pack.h) */
    int cur_layer; /* the layer of the step's ops (qkv sets it) */
    int tab_stride;
    dbuf *d_tabs;
    kv_table_mirror ***tab_owner;
    int *tab_cap;
};

cuda_backend *cb(kv_backend *b) {
    return reinterpret_cast<cuda_backend *>(b);
}

int cuda_fail(kv_error *err, cudaError_t e, const char *what) {
    return kv_fail(err, KV_EINTERNAL, "CUDA backend: %s: %s", what, cudaGetErrorString(e));
}

int blas_fail(kv_error *err, cublasStatus_t s, const char *what) {
    return kv_fail(err, KV_EINTERNAL, "CUDA backend: %s: %s", what, cublasGetStatusString(s));
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cuda_fail(err, e_, #call);                                   \
    } while (0)

#define CKB(call)                                                                                  \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) return blas_fail(err, s_, #call);                         \
    } while (0)

int grow_dev(dbuf &b, size_t bytes, kv_error *err) {
    if (bytes <= b.cap) return KV_OK;
    size_t cap = b.cap ? b.cap : 4096;
    while (cap < bytes) cap *= 2;
    if (b.p) cudaFree(b.p);
    b.p = nullptr;
    b.cap = 0;
    CK(cudaMalloc(&b.p, cap));
    b.cap = cap;
    return KV_OK;
}

int grow_pinned(dbuf &b, size_t bytes, kv_error *err) {
    if (bytes <= b.cap) return KV_OK;
    size_t cap = b.cap ? b.cap : 4096;
    while (cap < bytes) cap *= 2;
    if (b.p) cudaFreeHost(b.p);
    b.p = nullptr;
    b.cap = 0;
    CK(cudaHostAlloc(&b.p, cap, cudaHostAllocDefault));
    b.cap = cap;
    return KV_OK;
}

void stage_rewind(cuda_backend *c);

/* The staging arena grows (doubling) up to this many bytes; past it, a full arena is reused from
 * the start after a wait instead of growing. Only one request larger than this (one layer's
 * eviction records of very many heads) makes it larger, to that request's size. */
constexpr size_t kStageBound = (size_t)64 << 20;

/* `bytes` of the pinned staging arena (16-byte aligned) at *out, filled from src unless src is
 * NULL. The arena is only appended to until stage_rewind; when it is full the host waits for
 * both streams (every queued copy from it has run) and starts over from the beginning, in an
 * arena twice as large while that stays within kStageBound (or as large as the request): its
 * pinned bytes stay at most max(kStageBound, the largest request) whatever the batch and
 * context. */
int stage(cuda_backend *c, const void *src, size_t bytes, char **out, kv_error *err) {
    size_t off = (c->stage_used + 15) / 16 * 16;
    if (off + bytes > c->stage.cap) {
        CK(cudaStreamSynchronize(c->compute));
        CK(cudaStreamSynchronize(c->copy));
        stage_rewind(c);
        size_t want = 2 * (off + bytes) < kStageBound ? 2 * (off + bytes) : kStageBound;
        int rc = grow_pinned(c->stage, want > bytes ? want : bytes, err);
        if (rc) return rc;
        off = 0;
    }
    *out = static_cast<char *>(c->stage.p) + off;
    if (src) memcpy(*out, src, bytes);
    c->stage_used = off + bytes;
    return KV_OK;
}

/* The host waited for the compute stream: every copy from the arena has run (copy-stream
 * copies are all awaited by compute-stream work), so the arena can be reused from the start. */
void stage_rewind(cuda_backend *c) {
    c->stage_used = 0;
}

/* Upload n floats (NULL stays NULL). */
int upload(float **dst, const float *src, size_t n, kv_error *err) {
    *dst = nullptr;
    if (!src) return KV_OK;
    CK(cudaMalloc(dst, n * sizeof(float)));
    CK(cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
    return KV_OK;
}

/* A weight [rows, cols] uploaded as its file stores it (kvcu::upload_weight). */
int upload_weight(dev_weight *dst, kv_weight w, size_t rows, size_t cols, kv_error *err) {
    return kvcu::upload_weight(dst, w, rows, cols, "CUDA backend", err);
}

/* y[rows, out] = x[rows, in] W^T on the compute stream, W in its type (kvcu::matmul). */
int gemm(cuda_backend *c, float *y, const float *x, const dev_weight &w, int rows, int in, int out,
         kv_error *err) {
    return kvcu::matmul(c->blas, c->compute, &c->d_wtile, y, x, w, rows, in, out, "CUDA backend",
                        err);
}

void free_layers(cuda_backend *c) {
    if (!c->layers) return;
    for (int l = 0; l < c->base.model->cfg.n_layers; l++) {
        dev_layer &d = c->layers[l];
        for (int k = 0; k < KV_ROLE_COUNT; k++) {
            cudaFree(d.vec[k]);
            cudaFree(d.mat[k].p);
        }
    }
    free(c->layers);
    c->layers = nullptr;
}

void cuda_destroy(kv_backend *b) {
    cuda_backend *c = cb(b);
    if (c->compute) cudaStreamSynchronize(c->compute);
    if (c->copy) cudaStreamSynchronize(c->copy);
    free_layers(c);
    if (c->classifier.p != c->tok_emb.p) cudaFree(c->classifier.p);
    cudaFree(c->tok_emb.p);
    cudaFree(c->d_wtile.p);
    cudaFree(c->final_norm);
    float *acts[] = {c->x, c->xb, c->xb2, c->q,   c->k,        c->v,
                     c->o, c->hb, c->hb2, c->sel, c->rope_cos, c->rope_sin};
    for (float *p : acts) cudaFree(p);
    cudaFree(c->d_rows);
    cudaFree(c->d_pos);
    free(c->last_pos);
    cudaFreeHost(c->stage.p);
    cudaFree(c->d_meta.p);
    cudaFree(c->d_scores.p);
    cudaFree(c->d_part.p);
    cudaFree(c->d_list.p);
    cudaFree(c->d_move_scratch.p);
    cudaFree(c->d_evict.p);
    cudaFree(c->d_ev_work.p);
    cudaFreeHost(c->h_out.p);
    cudaFreeHost(c->h_logits.p);
    free(c->stamp);
    free(c->pass_start);
    if (c->d_tabs && c->tab_owner)
        for (int l = 0; l < c->base.model->cfg.n_layers; l++) {
            cudaFree(c->d_tabs[l].p);
            free(c->tab_owner[l]);
        }
    delete[] c->d_tabs;
    free(c->tab_owner);
    free(c->tab_cap);
    if (c->blas) cublasDestroy(c->blas);
    if (c->meta_ready) cudaEventDestroy(c->meta_ready);
    if (c->attn_done) cudaEventDestroy(c->attn_done);
    if (c->compute) cudaStreamDestroy(c->compute);
    if (c->copy) cudaStreamDestroy(c->copy);
    delete c;
}

/* Bytes of a pool's K/V storage, 16-byte aligned: the per-slot metadata follow. */
size_t meta_at(const kv_pool *p) {
    return kv_k_align16(kv_pool_storage_bytes(p));
}

/* The pool's K/V storage on the device: every block of every type at its stored bytes
 * (kv_pool_storage_bytes, the CPU's layout), so bytes in use equal the CPU backend's; then the
 * per-slot metadata (pos, acc, acc2: 12 bytes a slot; kv_k_pool), so the pool has device_meta:
 * positions and statistics never travel per step and the evictions run here (cuda_evict). */
int cuda_storage_alloc(kv_backend *b, kv_pool *p, kv_error *err) {
    cuda_backend *c = cb(b);
    void *s = nullptr;
    size_t n_slots = (size_t)p->n_blocks * (size_t)p->block_size;
    CK(cudaMalloc(&s, meta_at(p) + n_slots * (sizeof(int) + 2 * sizeof(float))));
    p->storage = s;
    p->data = nullptr;
    p->device_meta = 1;
    int slots = p->n_blocks * p->block_size;
    if (slots > c->stamp_slots) {
        int *st = static_cast<int *>(calloc((size_t)slots, sizeof(int)));
        if (!st) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend move stamps)");
        free(c->stamp);
        c->stamp = st;
        c->stamp_slots = slots;
        c->stamp_gen = 1;
    }
    return KV_OK;
}

void cuda_storage_free(kv_backend *b, kv_pool *p) {
    (void)b;
    cudaFree(p->storage);
    p->storage = nullptr;
}

/* The kernels' view of the pool (kv_k_pool): device storage, block ranges per type. */
kv_k_pool dev_pool(const kv_pool *p) {
    kv_k_pool d;
    d.data = static_cast<unsigned char *>(p->storage);
    d.bs = p->block_size;
    d.hd = p->head_dim;
    for (int t = 0; t <= KV_CACHE_TYPES; t++) {
        d.type_first[t] = p->type_first[t];
        d.type_offset[t] = p->type_offset[t];
    }
    size_t slots = (size_t)p->n_blocks * (size_t)p->block_size;
    d.pos = reinterpret_cast<int *>(d.data + meta_at(p));
    d.acc = reinterpret_cast<float *>(d.pos + slots);
    d.acc2 = d.acc + slots;
    return d;
}

int cuda_embed(kv_backend *b, const int *tokens, int rows, kv_error *err) {
    cuda_backend *c = cb(b);
    char *h = nullptr;
    int rc = stage(c, tokens, (size_t)rows * sizeof(int), &h, err);
    if (rc) return rc;
    CK(cudaMemcpyAsync(c->d_rows, h, (size_t)rows * sizeof(int), cudaMemcpyHostToDevice,
                       c->compute));
    CK(kvcu::gather_rows_typed(c->x, c->tok_emb.p, c->tok_emb.type, c->tok_emb.row_bytes, c->d_rows,
                               rows, b->model->cfg.dim, c->compute));
    return KV_OK;
}

int cuda_qkv(kv_backend *b, int layer, int rows, const int *pos, kv_error *err) {
    cuda_backend *c = cb(b);
    const kv_config *cfg = &b->model->cfg;
    const dev_layer &w = c->layers[layer];
    int dim = cfg->dim, hd = cfg->head_dim, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    int qd = H * hd, kvd = Hkv * hd;
    c->cur_layer = layer;
    size_t pbytes = (size_t)rows * sizeof(int);
    if (rows != c->last_rows || memcmp(pos, c->last_pos, pbytes)) { /* once per step */
        char *h = nullptr;
        c->last_rows = -1;
        int rc = stage(c, pos, pbytes, &h, err);
        if (rc) return rc;
        CK(cudaMemcpyAsync(c->d_pos, h, pbytes, cudaMemcpyHostToDevice, c->compute));
        memcpy(c->last_pos, pos, pbytes);
        c->last_rows = rows;
    }
    CK(kvcu::rmsnorm(c->xb, c->x, nullptr, w.vec[KV_ROLE_ATTN_NORM], rows, dim, cfg->norm_eps,
                     c->compute));
    int rc = gemm(c, c->q, c->xb, w.mat[KV_ROLE_WQ], rows, dim, qd, err);
    if (!rc) rc = gemm(c, c->k, c->xb, w.mat[KV_ROLE_WK], rows, dim, kvd, err);
    if (!rc) rc = gemm(c, c->v, c->xb, w.mat[KV_ROLE_WV], rows, dim, kvd, err);
    if (rc) return rc;
    CK(kvcu::add_bias(c->q, w.vec[KV_ROLE_BQ], rows, qd, c->compute));
    CK(kvcu::add_bias(c->k, w.vec[KV_ROLE_BK], rows, kvd, c->compute));
    CK(kvcu::add_bias(c->v, w.vec[KV_ROLE_BV], rows, kvd, c->compute));
    int layout = cfg->rope_layout == KV_ROPE_ADJACENT ? KV_K_ROPE_ADJACENT : KV_K_ROPE_HALF;
    CK(kvcu::rope(c->q, rows, qd, H, hd, c->d_pos, c->rope_cos, c->rope_sin, layout, c->compute));
    CK(kvcu::rope(c->k, rows, kvd, Hkv, hd, c->d_pos, c->rope_cos, c->rope_sin, layout,
                  c->compute));
    return KV_OK;
}

/* Stage a host list and copy it to the device list buffer on the compute stream (after the
 * kernels that read the previous list, in stream order). */
int stage_list(cuda_backend *c, const void *src, size_t bytes, kv_error *err) {
    int rc = grow_dev(c->d_list, bytes, err);
    char *h = nullptr;
    if (!rc) rc = stage(c, src, bytes, &h, err);
    if (rc) return rc;
    CK(cudaMemcpyAsync(c->d_list.p, h, bytes, cudaMemcpyHostToDevice, c->compute));
    return KV_OK;
}

int cuda_gather(kv_backend *b, kv_pool *p, const kv_move *moves, int n, kv_error *err) {
    cuda_backend *c = cb(b);
    if (n <= 0) return KV_OK;
    if (n + 1 > c->pass_cap) {
        int cap = n + 1;
        int *ps = static_cast<int *>(realloc(c->pass_start, (size_t)cap * sizeof(int)));
        if (!ps) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend gather)");
        c->pass_start = ps;
        c->pass_cap = cap;
    }
    if (c->stamp_gen > 0x3fffffff - n) { /* restart the generations before they overflow */
        memset(c->stamp, 0, (size_t)c->stamp_slots * sizeof(int));
        c->stamp_gen = 1;
    }
    const kv_k_move *mv = reinterpret_cast<const kv_k_move *>(moves);
    int passes = kv_k_split_moves(mv, n, c->stamp, &c->stamp_gen, c->pass_start);
    int rc = stage_list(c, moves, (size_t)n * sizeof(kv_move), err);
    if (!rc) rc = grow_dev(c->d_move_scratch, kvcu::gather_scratch_bytes(n, p->head_dim), err);
    if (rc) return rc;
    const kv_k_move *dmv = static_cast<const kv_k_move *>(c->d_list.p);
    kv_k_pool dp = dev_pool(p);
    for (int i = 0; i < passes; i++)
        CK(kvcu::gather_pass(dp, dmv + c->pass_start[i], c->pass_start[i + 1] - c->pass_start[i],
                             c->d_move_scratch.p, c->compute));
    return KV_OK;
}

int cuda_cache_write(kv_backend *b, kv_pool *p, const kv_slot_write *w, int n, kv_error *err) {
    cuda_backend *c = cb(b);
    if (n <= 0) return KV_OK;
    int rc = stage_list(c, w, (size_t)n * sizeof(kv_slot_write), err);
    if (rc) return rc;
    int kvd = b->model->cfg.n_kv_heads * p->head_dim;
    CK(kvcu::cache_write(dev_pool(p), static_cast<const kv_k_write *>(c->d_list.p), n, c->k, c->v,
                         kvd, c->d_pos, c->compute));
    return KV_OK;
}

/* Layer l's resident table array for n tasks: grown when n exceeds what it holds (its owners
 * then start unknown, so the next step uploads every entry). */
int tab_reserve(cuda_backend *c, int l, int n, kv_error *err) {
    if (n <= c->tab_cap[l]) return KV_OK;
    int cap = n > 2 * c->tab_cap[l] ? n : 2 * c->tab_cap[l];
    size_t ints = (size_t)cap * (size_t)c->tab_stride;
    free(c->tab_owner[l]);
    c->tab_cap[l] = 0;
    c->tab_owner[l] =
        static_cast<kv_table_mirror **>(calloc((size_t)cap, sizeof(kv_table_mirror *)));
    if (!c->tab_owner[l]) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA block tables)");
    int rc = grow_dev(c->d_tabs[l], ints * sizeof(int), err);
    if (rc) return rc;
    c->tab_cap[l] = cap;
    return KV_OK;
}

int attention_queue(cuda_backend *c, const kv_pool *p, const kv_attn_task *tasks, int n_tasks,
                    int l, kv_error *err);

int cuda_attention(kv_backend *b, const kv_pool *p, const kv_attn_task *tasks, int n_tasks,
                   kv_error *err) {
    cuda_backend *c = cb(b);
    if (n_tasks <= 0) return KV_OK;
    int l = c->cur_layer;
    if (l < 0 || l >= b->model->cfg.n_layers) l = -1; /* no layer known: whole tables */
    if (l >= 0 && !c->tab_stride) c->tab_stride = kv_blocks_for(b->max_ctx, p->block_size) + 1;
    if (l >= 0) {
        int rc = tab_reserve(c, l, n_tasks, err);
        if (rc) return rc;
    }
    int rc = attention_queue(c, p, tasks, n_tasks, l, err);
    if (!rc) return KV_OK;
    /* the next step's metadata copy waits for attn_done: recorded after whatever this step
     * queued on the compute stream (a table patch may still read the buffer), so that copy
     * cannot overwrite what queued work reads */
    cudaEventRecord(c->attn_done, c->compute);
    if (l >= 0) /* the owners may claim copies whose patch never ran */
        for (int i = 0; i < c->tab_cap[l]; i++) c->tab_owner[l][i] = nullptr;
    return rc;
}

/* Whether a prefill step takes the tiled kernel: d_h 16 / 32 / 64 / 128 and every task's head
 * f16 (the kernel reads f16 rows as binary16 MMA operands, exactly). */
bool prefill_tiled_ok(const kv_pool *p, const kv_attn_task *tasks, int n_tasks, int hd) {
    if (!kvcu::prefill_tiled_fits(hd)) return false;
    for (int i = 0; i < n_tasks; i++)
        if (kv_pool_block_type(p, tasks[i].table[0]) != KV_TYPE_F16) return false;
    return true;
}

/* The attention kernels of one step, on its metadata uploaded to d (layout L; tables: the
 * block tables the kernels read): flash-decoding or split decode for decode steps; for
 * prefill, the tiled tensor-core kernel (kv_prefill.cuh) when every head is f16 and d_h is 16,
 * 32, 64 or 128, else the one-block kernel. */
int attention_launch(cuda_backend *c, const kv_pool *p, const kv_attn_task *tasks, int n_tasks,
                     const kv_k_meta_layout &L, const int *tables, char *d, kv_error *err) {
    const kv_config *cfg = &c->base.model->cfg;
    int bs = p->block_size, hd = cfg->head_dim, g = cfg->n_heads / cfg->n_kv_heads, rc = KV_OK;
    /* a decode step: split each task's entries into chunks so that the grid fills the device
     * (kv_k_split_plan; tracked heads get their statistics from kv_k_decode_stats); else one
     * block per task */
    int decode = 1;
    for (int i = 0; i < n_tasks && decode; i++) decode = tasks[i].n == 1;
    kv_k_split sp = kv_k_split_plan(n_tasks, L.longest, bs, c->sms);
    const kv_k_attn_task *d_tasks = reinterpret_cast<const kv_k_attn_task *>(d);
    kv_k_pool dp = dev_pool(p); /* slot_meta: the kernels read the pool's per-slot metadata */
    const int *d_pos = L.slot_meta ? dp.pos : reinterpret_cast<const int *>(d + L.o_pos);
    float *d_acc = L.slot_meta ? dp.acc : reinterpret_cast<float *>(d + L.o_acc);
    float *d_acc2 = L.slot_meta ? dp.acc2 : reinterpret_cast<float *>(d + L.o_acc2);
    if (decode && kvcu::flash_decode_fits(g, hd, bs)) {
        /* flash-decoding: fixed partitions of KV_K_FD_PART entries, one launch per K/V type */
        int parts = (L.longest + KV_K_FD_PART - 1) / KV_K_FD_PART;
        unsigned types = 0;
        for (int i = 0; i < n_tasks; i++) types |= 1u << kv_pool_block_type(p, tasks[i].table[0]);
        rc = grow_dev(c->d_part, (size_t)n_tasks * parts * g * (size_t)(hd + 2) * sizeof(float),
                      err);
        if (rc) return rc;
        CK(kvcu::flash_decode(dev_pool(p), tables, d_tasks, n_tasks, c->q, c->o, cfg->n_heads * hd,
                              g, KV_K_FD_PART, parts, types, static_cast<float *>(c->d_scores.p),
                              L.longest, static_cast<float *>(c->d_part.p), d_pos,
                              L.tracked ? d_acc : nullptr, d_acc2, c->compute));
    } else if (decode && sp.chunks > 1) {
        rc = grow_dev(c->d_part, (size_t)n_tasks * sp.chunks * g * (size_t)(hd + 2) * sizeof(float),
                      err);
        if (rc) return rc;
        CK(kvcu::decode_attention_split(dev_pool(p), tables, d_tasks, n_tasks, c->q, c->o,
                                        cfg->n_heads * hd, g, sp.chunk, sp.chunks,
                                        static_cast<float *>(c->d_scores.p), L.longest,
                                        static_cast<float *>(c->d_part.p), d_pos,
                                        L.tracked ? d_acc : nullptr, d_acc2, c->compute));
    } else if (!decode && prefill_tiled_ok(p, tasks, n_tasks, hd)) {
        int max_rows = 0;
        for (int i = 0; i < n_tasks; i++)
            max_rows = tasks[i].n * g > max_rows ? tasks[i].n * g : max_rows;
        rc = grow_dev(c->d_part, (size_t)n_tasks * 2 * (size_t)max_rows * sizeof(float), err);
        if (rc) return rc;
        CK(kvcu::prefill_tiled(dev_pool(p), tables, d_tasks, n_tasks, max_rows, L.longest, c->q,
                               c->o, cfg->n_heads * hd, g, static_cast<float *>(c->d_part.p), d_pos,
                               L.tracked ? d_acc : nullptr, d_acc2, c->compute));
    } else {
        CK(kvcu::paged_attention(dev_pool(p), tables, d_tasks, n_tasks, d_pos, d_acc, d_acc2, c->q,
                                 c->o, cfg->n_heads * hd, g, static_cast<float *>(c->d_scores.p),
                                 L.longest, c->compute));
    }
    return KV_OK;
}

/* One attention step on layer l's resident tables (l < 0, or a table longer than the stride:
 * every table uploaded whole, as the step's own). */
int attention_queue(cuda_backend *c, const kv_pool *p, const kv_attn_task *tasks, int n_tasks,
                    int l, kv_error *err) {
    kv_backend *b = &c->base;
    const kv_config *cfg = &b->model->cfg;
    int bs = p->block_size, g = cfg->n_heads / cfg->n_kv_heads;
    long changes =
        l >= 0 ? kv_k_table_dirty(tasks, n_tasks, bs, c->tab_stride, c->tab_owner[l]) : -1;
    kv_k_meta_layout L;
    if (changes >= 0)
        kv_k_meta_plan_resident(tasks, n_tasks, bs, changes, p->device_meta, &L);
    else
        kv_k_meta_plan(tasks, n_tasks, bs, p->device_meta, &L);
    int rc = grow_dev(c->d_meta, L.total, err);
    if (!rc) rc = grow_dev(c->d_scores, (size_t)n_tasks * g * L.longest * sizeof(float), err);
    char *h = nullptr;
    if (!rc) rc = stage(c, nullptr, L.total, &h, err);
    if (rc) return rc;
    long patches = 0;
    if (changes >= 0)
        patches =
            kv_k_meta_pack_resident(tasks, n_tasks, bs, c->tab_stride, c->tab_owner[l], &L, h);
    else
        kv_k_meta_pack(tasks, n_tasks, bs, &L, h);
    /* one mirror copy per step on the copy stream, after the previous step's attention has
     * read the device buffer; compute waits for it */
    /* positions and statistics only where a head tracks them and the pool has no per-slot
     * metadata (never for the pools of cuda_storage_alloc): the RoPE positions are d_pos */
    size_t up = L.tracked ? L.total : L.o_pos;
    CK(cudaStreamWaitEvent(c->copy, c->attn_done, 0));
    CK(cudaMemcpyAsync(c->d_meta.p, h, up, cudaMemcpyHostToDevice, c->copy));
    CK(cudaEventRecord(c->meta_ready, c->copy));
    CK(cudaStreamWaitEvent(c->compute, c->meta_ready, 0));
    char *d = static_cast<char *>(c->d_meta.p);
    const int *tables = reinterpret_cast<const int *>(d + L.o_tab);
    if (changes >= 0) { /* the changed entries into the layer's resident tables */
        int *tabs = static_cast<int *>(c->d_tabs[l].p);
        CK(kvcu::table_patch(tabs, tables, patches, c->compute));
        tables = tabs;
    }
    rc = attention_launch(c, p, tasks, n_tasks, L, tables, d, err);
    if (rc) return rc;
    CK(cudaEventRecord(c->attn_done, c->compute));
    /* the statistics stay where they were accumulated: by slot in the pool, for cuda_evict */
    if (L.tracked && !L.slot_meta)
        return kv_fail(err, KV_EINTERNAL,
                       "CUDA backend: tracked heads on a pool without "
                       "per-slot metadata");
    return KV_OK;
}

/* Copy device activations to the pinned output buffer: n arrays of floats. */
int to_host(cuda_backend *c, const float *const *src, const size_t *n, float **dst, int count,
            kv_error *err) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += n[i];
    CK(cudaStreamSynchronize(c->compute));
    int rc = grow_pinned(c->h_out, total * sizeof(float), err);
    if (rc) return rc;
    float *h = static_cast<float *>(c->h_out.p);
    for (int i = 0; i < count; i++) {
        CK(cudaMemcpyAsync(h, src[i], n[i] * sizeof(float), cudaMemcpyDeviceToHost, c->compute));
        dst[i] = h;
        h += n[i];
    }
    CK(cudaStreamSynchronize(c->compute));
    stage_rewind(c);
    return KV_OK;
}

int cuda_out_residual(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err) {
    cuda_backend *c = cb(b);
    const kv_config *cfg = &b->model->cfg;
    int dim = cfg->dim, qd = cfg->n_heads * cfg->head_dim, kvd = cfg->n_kv_heads * cfg->head_dim;
    int rc = gemm(c, c->xb2, c->o, c->layers[layer].mat[KV_ROLE_WO], rows, qd, dim, err);
    if (rc) return rc;
    if (hooks && hooks->after_attn) {
        const float *src[4] = {c->x, c->o, c->v, c->xb2};
        size_t n[4] = {(size_t)rows * dim, (size_t)rows * qd, (size_t)rows * kvd,
                       (size_t)rows * dim};
        float *h[4] = {nullptr, nullptr, nullptr, nullptr};
        rc = to_host(c, src, n, h, 4, err);
        if (rc) return rc;
        hooks->after_attn(hooks->user, layer, rows, h[0], h[1], h[2], h[3]);
    }
    CK(kvcu::add(c->x, c->xb2, (size_t)rows * dim, c->compute));
    return KV_OK;
}

int cuda_ffn(kv_backend *b, int layer, int rows, const kv_hooks *hooks, kv_error *err) {
    cuda_backend *c = cb(b);
    const kv_config *cfg = &b->model->cfg;
    const dev_layer &w = c->layers[layer];
    int dim = cfg->dim, hid = cfg->hidden_dim;
    CK(kvcu::rmsnorm(c->xb, c->x, nullptr, w.vec[KV_ROLE_FFN_NORM], rows, dim, cfg->norm_eps,
                     c->compute));
    int rc = gemm(c, c->hb, c->xb, w.mat[KV_ROLE_W_GATE], rows, dim, hid, err);
    if (!rc) rc = gemm(c, c->hb2, c->xb, w.mat[KV_ROLE_W_UP], rows, dim, hid, err);
    if (rc) return rc;
    CK(kvcu::swiglu(c->hb, c->hb2, (size_t)rows * hid, c->compute));
    rc = gemm(c, c->xb, c->hb, w.mat[KV_ROLE_W_DOWN], rows, hid, dim, err);
    if (rc) return rc;
    CK(kvcu::add(c->x, c->xb, (size_t)rows * dim, c->compute));
    if (hooks && hooks->after_block) {
        const float *src[1] = {c->x};
        size_t n[1] = {(size_t)rows * dim};
        float *h[1] = {nullptr};
        rc = to_host(c, src, n, h, 1, err);
        if (rc) return rc;
        hooks->after_block(hooks->user, layer, rows, h[0]);
    }
    return KV_OK;
}

int cuda_logits(kv_backend *b, const int *rows, int n_sel, float *out, kv_error *err) {
    cuda_backend *c = cb(b);
    const kv_model *m = b->model;
    int dim = m->cfg.dim, V = m->cfg.vocab_size;
    char *h = nullptr;
    int rc = stage(c, rows, (size_t)n_sel * sizeof(int), &h, err);
    if (rc) return rc;
    CK(cudaMemcpyAsync(c->d_rows, h, (size_t)n_sel * sizeof(int), cudaMemcpyHostToDevice,
                       c->compute));
    CK(kvcu::rmsnorm(c->sel, c->x, c->d_rows, c->final_norm, n_sel, dim, m->cfg.norm_eps,
                     c->compute));
    /* the logits reuse the hidden buffers: [n_sel, vocab] fits hb when vocab <= hidden, else
     * the scores buffer grown for it */
    rc = grow_dev(c->d_scores, (size_t)n_sel * V * sizeof(float), err);
    if (rc) return rc;
    float *dl = static_cast<float *>(c->d_scores.p);
    rc = gemm(c, dl, c->sel, c->classifier, n_sel, dim, V, err);
    if (rc) return rc;
    /* through pinned memory: a copy to the caller's pageable buffer would be a second wait;
     * into out itself when it is the pinned buffer cuda_out_buffer gave (no host copy) */
    size_t lb = (size_t)n_sel * V * sizeof(float);
    bool direct = out == c->h_logits.p && lb <= c->h_logits.cap;
    if (!direct && (rc = grow_pinned(c->h_out, lb, err))) return rc;
    void *land = direct ? static_cast<void *>(out) : c->h_out.p;
    CK(cudaMemcpyAsync(land, dl, lb, cudaMemcpyDeviceToHost, c->compute));
    CK(cudaStreamSynchronize(c->compute));
    if (!direct) memcpy(out, c->h_out.p, lb);
    stage_rewind(c);
    return KV_OK;
}

/* A pinned logits buffer of n floats for the caller (kv_backend_ops.out_buffer): cuda_logits
 * copies into it from the device directly. Grown (and so moved) only by a larger request. */
float *cuda_out_buffer(kv_backend *b, size_t n, kv_error *err) {
    cuda_backend *c = cb(b);
    if (grow_pinned(c->h_logits, n * sizeof(float), err)) return nullptr;
    return static_cast<float *>(c->h_logits.p);
}

/* The layer's evictions (kv_head_schedule_room's records on a device_meta pool): the records
 * and their tables staged and copied up in one copy, then kv_k_evict, one block per record,
 * on the compute stream before the layer's gather and cache writes. No wait. */
int cuda_evict(kv_backend *b, kv_pool *p, const kv_evict *ev, int n, const int *tab,
               kv_error *err) {
    cuda_backend *c = cb(b);
    if (n <= 0) return KV_OK;
    long n_tab = 0;
    for (int i = 0; i < n; i++) {
        long end = ev[i].tab_off + kv_blocks_for(ev[i].len, p->block_size);
        n_tab = end > n_tab ? end : n_tab;
    }
    size_t eb = kv_k_align16((size_t)n * sizeof(kv_evict)), tb = (size_t)n_tab * sizeof(int);
    size_t work = (size_t)n_tab * (size_t)p->block_size;
    int rc = grow_dev(c->d_evict, eb + tb, err);
    if (!rc) rc = grow_dev(c->d_ev_work, work * (sizeof(float) + 1), err);
    char *h = nullptr;
    if (!rc) rc = stage(c, nullptr, eb + tb, &h, err);
    if (rc) return rc;
    memcpy(h, ev, (size_t)n * sizeof(kv_evict));
    memcpy(h + eb, tab, tb);
    CK(cudaMemcpyAsync(c->d_evict.p, h, eb + tb, cudaMemcpyHostToDevice, c->compute));
    char *d = static_cast<char *>(c->d_evict.p);
    float *score = static_cast<float *>(c->d_ev_work.p);
    unsigned char *mask = reinterpret_cast<unsigned char *>(score + work);
    CK(kvcu::evict(dev_pool(p), reinterpret_cast<const kv_evict *>(d), n,
                   reinterpret_cast<const int *>(d + eb), score, mask, c->compute));
    return KV_OK;
}

/* Head h's per-slot positions and statistics into its host arrays (kv_backend_read_head_meta):
 * each of its blocks' pos / acc / acc2 copied into pinned memory, one wait, then its len
 * entries taken from their slots. */
int cuda_read_meta(kv_backend *b, const kv_pool *p, kv_head *h, kv_error *err) {
    cuda_backend *c = cb(b);
    int bs = p->block_size, nb = kv_blocks_for(h->len, bs);
    size_t per = (size_t)nb * (size_t)bs;
    int rc = grow_pinned(c->h_out, per * 3 * sizeof(float), err);
    if (rc) return rc;
    kv_k_pool dp = dev_pool(p);
    int *hp = static_cast<int *>(c->h_out.p);
    float *ha = reinterpret_cast<float *>(hp + per), *ha2 = ha + per;
    size_t fb = (size_t)bs * sizeof(float);
    for (int k = 0; k < nb; k++) {
        size_t s0 = (size_t)h->table[k] * (size_t)bs, o = (size_t)k * (size_t)bs;
        CK(cudaMemcpyAsync(hp + o, dp.pos + s0, fb, cudaMemcpyDeviceToHost, c->compute));
        CK(cudaMemcpyAsync(ha + o, dp.acc + s0, fb, cudaMemcpyDeviceToHost, c->compute));
        CK(cudaMemcpyAsync(ha2 + o, dp.acc2 + s0, fb, cudaMemcpyDeviceToHost, c->compute));
    }
    CK(cudaStreamSynchronize(c->compute));
    stage_rewind(c);
    memcpy(h->pos, hp, (size_t)h->len * sizeof(int));
    memcpy(h->acc, ha, (size_t)h->len * sizeof(float));
    memcpy(h->acc2, ha2, (size_t)h->len * sizeof(float));
    return KV_OK;
}

const kv_backend_ops cuda_ops = {
    "cuda",      cuda_destroy,     cuda_storage_alloc, cuda_storage_free, cuda_embed, cuda_qkv,
    cuda_gather, cuda_cache_write, cuda_attention,     cuda_out_residual, cuda_ffn,   cuda_logits,
    nullptr,     cuda_evict,       cuda_read_meta,     cuda_out_buffer,
};

/* The layers' weights uploaded role by role from the table (model/tensors.h). */
struct upload_walk {
    dev_layer *layers;
    kv_error *err;
};
int upload_role(const kv_role_tensor *t, void *user) {
    const upload_walk *u = static_cast<const upload_walk *>(user);
    dev_layer &d = u->layers[t->layer];
    if (t->mat)
        return upload_weight(&d.mat[t->id], *t->mat, (size_t)t->rows, (size_t)t->cols, u->err);
    return upload(&d.vec[t->id], *t->vec, (size_t)t->cols, u->err);
}

int setup(cuda_backend *c, const kv_model *m, int max_rows, int max_ctx, kv_error *err) {
    const kv_config *cfg = &m->cfg;
    int n_dev = 0;
    CK(cudaGetDeviceCount(&n_dev));
    c->dev = 0;
    CK(cudaSetDevice(c->dev));
    CK(cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->dev));
    CK(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&c->meta_ready, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&c->attn_done, cudaEventDisableTiming));
    CK(cudaEventRecord(c->attn_done, c->compute));
    CKB(cublasCreate(&c->blas));
    CKB(cublasSetStream(c->blas, c->compute));
    /* the default math mode: tensor cores for the 16-bit GEMMs; FP32 GEMMs stay FP32 (TF32
     * only with CUBLAS_TF32_TENSOR_OP_MATH) */
    CKB(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    size_t dim = (size_t)cfg->dim, hd = (size_t)cfg->head_dim, qd = (size_t)cfg->n_heads * hd,
           kvd = (size_t)cfg->n_kv_heads * hd, hid = (size_t)cfg->hidden_dim,
           V = (size_t)cfg->vocab_size;
    /* weights, once */
    c->layers = static_cast<dev_layer *>(calloc((size_t)cfg->n_layers, sizeof(dev_layer)));
    if (!c->layers) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend layers)");
    upload_walk uw = {c->layers, err};
    int rc = kv_layer_roles_each(cfg, m->layers, upload_role, &uw);
    if (!rc) rc = upload_weight(&c->tok_emb, m->tok_emb, V, dim, err);
    if (!rc) rc = upload(&c->final_norm, m->final_norm, dim, err);
    if (rc) return rc;
    if (m->classifier.data == m->tok_emb.data)
        c->classifier = c->tok_emb;
    else if ((rc = upload_weight(&c->classifier, m->classifier, V, dim, err)))
        return rc;
    /* activations */
    size_t R = (size_t)max_rows;
    CK(cudaMalloc(&c->x, R * dim * sizeof(float)));
    CK(cudaMalloc(&c->xb, R * dim * sizeof(float)));
    CK(cudaMalloc(&c->xb2, R * dim * sizeof(float)));
    CK(cudaMalloc(&c->sel, R * dim * sizeof(float)));
    CK(cudaMalloc(&c->q, R * qd * sizeof(float)));
    CK(cudaMalloc(&c->o, R * qd * sizeof(float)));
    CK(cudaMalloc(&c->k, R * kvd * sizeof(float)));
    CK(cudaMalloc(&c->v, R * kvd * sizeof(float)));
    CK(cudaMalloc(&c->hb, R * hid * sizeof(float)));
    CK(cudaMalloc(&c->hb2, R * hid * sizeof(float)));
    CK(cudaMalloc(&c->d_rows, R * sizeof(int)));
    CK(cudaMalloc(&c->d_pos, R * sizeof(int)));
    c->last_rows = -1;
    c->cur_layer = -1;
    c->d_tabs = new (std::nothrow) dbuf[cfg->n_layers];
    c->tab_owner =
        static_cast<kv_table_mirror ***>(calloc((size_t)cfg->n_layers, sizeof(kv_table_mirror **)));
    c->tab_cap = static_cast<int *>(calloc((size_t)cfg->n_layers, sizeof(int)));
    if (!c->d_tabs || !c->tab_owner || !c->tab_cap)
        return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend block tables)");
    c->last_pos = static_cast<int *>(malloc(R * sizeof(int)));
    if (!c->last_pos) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend positions)");
    /* the staging arena: room for a step's lists and metadata to start with */
    if ((rc = grow_pinned(c->stage, (size_t)1 << 16, err))) return rc;
    /* RoPE tables: the CPU's (kv_op_rope_tables arithmetic, computed in double) */
    size_t half = hd / 2, nt = (size_t)max_ctx * half;
    float *cs = static_cast<float *>(malloc(nt * sizeof(float)));
    float *sn = static_cast<float *>(malloc(nt * sizeof(float)));
    if (!cs || !sn) {
        free(cs);
        free(sn);
        return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend RoPE tables)");
    }
    kv_op_rope_tables(cfg, max_ctx, cs, sn);
    rc = upload(&c->rope_cos, cs, nt, err);
    if (!rc) rc = upload(&c->rope_sin, sn, nt, err);
    free(cs);
    free(sn);
    return rc;
}

} // namespace

extern "C" int kv_backend_cuda_new(const struct kv_model *m, int max_rows, int max_ctx,
                                   struct kv_backend **out, kv_error *err) {
    *out = nullptr;
    char why[256] = "";
    if (kv_cuda_device_count(why) <= 0)
        return kv_fail(err, KV_EINPUT, "--device cuda: no CUDA device here (%s); use --device cpu",
                       why[0] ? why : "none found");
    cuda_backend *c = new (std::nothrow) cuda_backend();
    if (!c) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA backend)");
    int rc = kv_backend_base_init(&c->base, &cuda_ops, m, KV_DEVICE_CUDA, max_rows, max_ctx, err);
    if (rc) {
        delete c;
        return rc;
    }
    rc = setup(c, m, max_rows, max_ctx, err);
    if (rc) {
        kv_backend_free(&c->base);
        return rc;
    }
    *out = &c->base;
    return KV_OK;
}
