/* KVPR executor on a CUDA device (runtime/backend/kvcuda.h; KVPR, Jiang et al., §3.2-3.3, Eq.
 * 6-11): the device half of runtime/offload/kvpr_exec.c's rebuild. For each offloaded layer (host
 * memory, kv_kvpr_layer) with split l over s' tokens:
 *   copy stream:     K[l:s'], V[l:s'] host -> device (Eq. 6, M_KV = 2 (s' - l) h_kv p bytes),
 *   compute stream:  X[0:l] host -> device, K[0:l] = X W_K^T (+ b_K, RoPE at 0..l-1),
 *                    V[0:l] = X W_V^T (+ b_V) (Eq. 7), W_K / W_V on the device in their file's
 *                    type and multiplied as the CUDA backend does (cuda/matmul.h: FP32 GEMM,
 *                    typed GEMV, 16-bit tensor-core GEMM or dequantised tiles),
 *   download stream: waits for both, then K, V [0:s'] device -> pinned staging.
 * Layers are double-buffered: layer i uses buffer set i % 2. Every copy touches only pinned
 * memory, so queuing never waits: layer i+1's transfer and recomputation are queued while layer
 * i is still in flight. The host waits only when it reuses a set (layer i+2 waits for layer i's
 * download, then copies layer i's K, V from the set's pinned staging to the caller's arrays and
 * refills the set's input staging) and for the last two layers: n host waits for n >= 1 layers.
 * t_transfer and t_recompute are the CUDA events' elapsed times around each part (Eq. 9 and
 * M_KV / v_com), t_total the host wall time of the call divided evenly over the layers.
 * An error mid-call leaves the executor reusable: what was queued finishes and no buffer set
 * keeps naming a layer of the failed call. The conformance suite compares it with
 * kv_kvpr_rebuild on a GPU and on the fake CUDA runtime (tests/cuda_fake/), where
 * tests/test_cuda_fake.c also fails its GEMMs and allocations and counts its host waits. */
#include "kernels.h"
#include "matmul.h"

#include "backend/kvcuda.h"
#include "kvplan/quant.h"
#include "model/tensors.h"

extern "C" {
#include "../runtime/backend/ops.h" /* kv_op_rope_tables */
}
#include "offload/kvpr_exec.h"
#include "kvplan/model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <math.h>
#include <new>
#include <stdlib.h>
#include <string.h>

namespace {

struct kset {                   /* one buffer set */
    float *d_x, *d_k, *d_v;     /* [max_ctx, dim], [max_ctx, kvw] x 2 */
    float *h_x, *h_k, *h_v;     /* pinned input staging, same sizes */
    float *o_k, *o_v;           /* pinned output staging [max_ctx, kvw] x 2 */
    cudaEvent_t c0, c1, r0, r1; /* copy start/end, recompute start/end */
    cudaEvent_t done;           /* the download of the set's layer finished */
    int layer; /* index in the caller's arrays whose K, V and timings are pending, or -1 */
};

} // namespace

struct kv_cuda_kvpr {
    const kv_model *m;
    int max_ctx;
    cudaStream_t compute, copy, down;
    cublasHandle_t blas;
    /* [n_layers * KV_ROLE_COUNT] by layer and role (model/tensors.h): the K and V projections
     * in their file's type (mat) and their biases (vec, NULL when the model has none); the
     * other roles stay empty */
    kvcu::dev_weight *mat;
    float **vec;
    kvcu::dev_scratch tile;     /* matmul scratch (compute stream) */
    float *rope_cos, *rope_sin; /* [max_ctx, d_h / 2] */
    int *d_pos;                 /* 0 .. max_ctx - 1 */
    kset set[2];
};

namespace {

int fail(kv_error *err, cudaError_t e, const char *what) {
    return kv_fail(err, KV_EINTERNAL, "CUDA KVPR: %s: %s", what, cudaGetErrorString(e));
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return fail(err, e_, #call);                                        \
    } while (0)

int up(float **dst, const float *src, size_t n, kv_error *err) {
    *dst = nullptr;
    if (!src) return KV_OK;
    CK(cudaMalloc(dst, n * sizeof(float)));
    CK(cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
    return KV_OK;
}

/* Elapsed seconds between two recorded events. */
double secs(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? ms * 1e-3 : NAN;
}

void fill_timing(const kv_cuda_kvpr *e, const kset &s, const kv_kvpr_layer &lc, kv_kvpr_timing *t) {
    const kv_config *c = &e->m->cfg;
    double p = (double)sizeof(float), l = lc.split, h = c->dim, hkv = lc.kv_width;
    t->t_transfer = lc.split < lc.seq ? secs(s.c0, s.c1) : 0.0;
    t->t_recompute = lc.split > 0 ? secs(s.r0, s.r1) : 0.0;
    t->bytes_activations = l * h * p;
    t->bytes_kv = 2.0 * (lc.seq - lc.split) * hkv * p;
    t->flops = 4.0 * l * h * hkv;
}

} // namespace

extern "C" void kv_cuda_kvpr_free(kv_cuda_kvpr *e) {
    if (!e) return;
    if (e->compute) cudaStreamSynchronize(e->compute);
    if (e->copy) cudaStreamSynchronize(e->copy);
    if (e->down) cudaStreamSynchronize(e->down);
    int L = e->m->cfg.n_layers;
    for (int i = 0; i < L * KV_ROLE_COUNT; i++) {
        if (e->mat) cudaFree(e->mat[i].p);
        if (e->vec) cudaFree(e->vec[i]);
    }
    delete[] e->mat;
    free(e->vec);
    cudaFree(e->rope_cos);
    cudaFree(e->rope_sin);
    cudaFree(e->d_pos);
    cudaFree(e->tile.p);
    for (kset &s : e->set) {
        cudaFree(s.d_x);
        cudaFree(s.d_k);
        cudaFree(s.d_v);
        cudaFreeHost(s.h_x);
        cudaFreeHost(s.h_k);
        cudaFreeHost(s.h_v);
        cudaFreeHost(s.o_k);
        cudaFreeHost(s.o_v);
        cudaEvent_t evs[5] = {s.c0, s.c1, s.r0, s.r1, s.done};
        for (cudaEvent_t ev : evs)
            if (ev) cudaEventDestroy(ev);
    }
    if (e->blas) cublasDestroy(e->blas);
    if (e->compute) cudaStreamDestroy(e->compute);
    if (e->copy) cudaStreamDestroy(e->copy);
    if (e->down) cudaStreamDestroy(e->down);
    delete e;
}

namespace {

/* The roles the executor recomputes K and V with. */
int kv_role(kv_role_id id) {
    return id == KV_ROLE_WK || id == KV_ROLE_WV || id == KV_ROLE_BK || id == KV_ROLE_BV;
}

/* Uploads one tensor of the table's walk (model/tensors.h) when it is a K/V role. */
struct kv_walk {
    kv_cuda_kvpr *e;
    kv_error *err;
};
int upload_kv_role(const kv_role_tensor *t, void *user) {
    const kv_walk *w = static_cast<const kv_walk *>(user);
    if (!kv_role(t->id)) return KV_OK;
    size_t i = (size_t)t->layer * KV_ROLE_COUNT + t->id;
    if (t->mat)
        return kvcu::upload_weight(&w->e->mat[i], *t->mat, (size_t)t->rows, (size_t)t->cols,
                                   "CUDA KVPR", w->err);
    return up(&w->e->vec[i], *t->vec, (size_t)t->cols, w->err);
}

int setup(kv_cuda_kvpr *e, kv_error *err) {
    const kv_config *c = &e->m->cfg;
    int L = c->n_layers, hd = c->head_dim;
    size_t dim = (size_t)c->dim, kvw = (size_t)c->n_kv_heads * hd, ctx = (size_t)e->max_ctx;
    CK(cudaStreamCreateWithFlags(&e->compute, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&e->copy, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&e->down, cudaStreamNonBlocking));
    /* default math mode, as the CUDA backend: FP32 GEMMs stay FP32 (TF32 only when asked),
     * 16-bit weights use the tensor cores */
    if (cublasCreate(&e->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(e->blas, e->compute) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(e->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)
        return kv_fail(err, KV_EINTERNAL, "CUDA KVPR: cuBLAS initialisation failed");
    e->mat = new (std::nothrow) kvcu::dev_weight[(size_t)L * KV_ROLE_COUNT];
    e->vec = static_cast<float **>(calloc((size_t)L * KV_ROLE_COUNT, sizeof(float *)));
    if (!e->mat || !e->vec) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA KVPR weights)");
    kv_walk w = {e, err};
    int rc = kv_layer_roles_each(c, e->m->layers, upload_kv_role, &w);
    if (rc) return rc;
    /* RoPE tables as the CPU computes them (kv_op_rope_tables: double angles, float tables) */
    size_t half = (size_t)hd / 2, nt = ctx * half;
    float *cs = static_cast<float *>(malloc(nt * sizeof(float)));
    float *sn = static_cast<float *>(malloc(nt * sizeof(float)));
    int *pos = static_cast<int *>(malloc(ctx * sizeof(int)));
    if (!cs || !sn || !pos) {
        free(cs);
        free(sn);
        free(pos);
        return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA KVPR RoPE tables)");
    }
    kv_op_rope_tables(c, (int)ctx, cs, sn);
    for (size_t p = 0; p < ctx; p++) pos[p] = (int)p;
    rc = up(&e->rope_cos, cs, nt, err);
    if (!rc) rc = up(&e->rope_sin, sn, nt, err);
    if (!rc) {
        cudaError_t ce = cudaMalloc(&e->d_pos, ctx * sizeof(int));
        if (ce == cudaSuccess)
            ce = cudaMemcpy(e->d_pos, pos, ctx * sizeof(int), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess) rc = fail(err, ce, "positions");
    }
    free(cs);
    free(sn);
    free(pos);
    if (rc) return rc;
    for (kset &s : e->set) {
        s.layer = -1;
        CK(cudaMalloc(&s.d_x, ctx * dim * sizeof(float)));
        CK(cudaMalloc(&s.d_k, ctx * kvw * sizeof(float)));
        CK(cudaMalloc(&s.d_v, ctx * kvw * sizeof(float)));
        CK(cudaHostAlloc(&s.h_x, ctx * dim * sizeof(float), cudaHostAllocDefault));
        CK(cudaHostAlloc(&s.h_k, ctx * kvw * sizeof(float), cudaHostAllocDefault));
        CK(cudaHostAlloc(&s.h_v, ctx * kvw * sizeof(float), cudaHostAllocDefault));
        CK(cudaHostAlloc(&s.o_k, ctx * kvw * sizeof(float), cudaHostAllocDefault));
        CK(cudaHostAlloc(&s.o_v, ctx * kvw * sizeof(float), cudaHostAllocDefault));
        CK(cudaEventCreate(&s.c0));
        CK(cudaEventCreate(&s.c1));
        CK(cudaEventCreate(&s.r0));
        CK(cudaEventCreate(&s.r1));
        CK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
    return KV_OK;
}

} // namespace

extern "C" int kv_cuda_kvpr_new(const struct kv_model *m, int max_ctx, kv_cuda_kvpr **out,
                                kv_error *err) {
    *out = nullptr;
    char why[256] = "";
    if (kv_cuda_device_count(why) <= 0)
        return kv_fail(err, KV_EINPUT, "CUDA KVPR: no CUDA device here (%s)",
                       why[0] ? why : "none found");
    if (max_ctx < 1) return kv_fail(err, KV_EINPUT, "CUDA KVPR: max_ctx must be at least 1");
    kv_cuda_kvpr *e = new (std::nothrow) kv_cuda_kvpr();
    if (!e) return kv_fail(err, KV_EINTERNAL, "out of memory (CUDA KVPR)");
    e->m = m;
    e->max_ctx = max_ctx;
    int rc = setup(e, err);
    if (rc) {
        kv_cuda_kvpr_free(e);
        return rc;
    }
    *out = e;
    return KV_OK;
}

namespace {

/* Wait for set s's download, then hand its layer's K, V (pinned staging) and timings to the
 * caller's arrays; the set is free afterwards. */
int finish_set(kv_cuda_kvpr *e, kset &s, const kv_kvpr_layer *layers, float *const *k_out,
               float *const *v_out, kv_kvpr_timing *t, kv_error *err) {
    if (s.layer < 0) return KV_OK;
    CK(cudaEventSynchronize(s.done));
    const kv_kvpr_layer &lc = layers[s.layer];
    size_t n = (size_t)lc.seq * lc.kv_width * sizeof(float);
    memcpy(k_out[s.layer], s.o_k, n);
    memcpy(v_out[s.layer], s.o_v, n);
    if (t) fill_timing(e, s, lc, &t[s.layer]);
    s.layer = -1;
    return KV_OK;
}

/* Queue the n layers (rebuild's loop) and collect them; on an error returns at once, with
 * work possibly still queued and sets naming layers of this call (the caller cleans up). */
int queue_layers(kv_cuda_kvpr *e, const kv_kvpr_layer *layers, int n, float *const *k_out,
                 float *const *v_out, kv_kvpr_timing *t, kv_error *err) {
    const kv_config *c = &e->m->cfg;
    int dim = c->dim, hd = c->head_dim, Hkv = c->n_kv_heads, kvw = Hkv * hd;
    int layout = c->rope_layout == KV_ROPE_ADJACENT ? KV_K_ROPE_ADJACENT : KV_K_ROPE_HALF;
    for (int i = 0; i < n; i++) {
        const kv_kvpr_layer &lc = layers[i];
        kset &s = e->set[i % 2];
        int l = lc.split, tail = lc.seq - lc.split;
        /* the set's previous layer (i - 2) has been downloaded: nothing queued reads or writes
         * the set's buffers any more */
        int rc = finish_set(e, s, layers, k_out, v_out, t, err);
        if (rc) return rc;
        s.layer = i;
        /* (x is NULL at split 0, k and v at split s': memcpy takes no NULL even for 0 bytes) */
        if (l > 0) memcpy(s.h_x, lc.x, (size_t)l * dim * sizeof(float));
        if (tail > 0) {
            memcpy(s.h_k, lc.k, (size_t)tail * kvw * sizeof(float));
            memcpy(s.h_v, lc.v, (size_t)tail * kvw * sizeof(float));
        }
        /* copy stream: the transferred part K, V [l:s'] */
        CK(cudaEventRecord(s.c0, e->copy));
        CK(cudaMemcpyAsync(s.d_k + (size_t)l * kvw, s.h_k, (size_t)tail * kvw * sizeof(float),
                           cudaMemcpyHostToDevice, e->copy));
        CK(cudaMemcpyAsync(s.d_v + (size_t)l * kvw, s.h_v, (size_t)tail * kvw * sizeof(float),
                           cudaMemcpyHostToDevice, e->copy));
        CK(cudaEventRecord(s.c1, e->copy));
        /* compute stream: the recomputed part K, V [0:l] */
        CK(cudaMemcpyAsync(s.d_x, s.h_x, (size_t)l * dim * sizeof(float), cudaMemcpyHostToDevice,
                           e->compute));
        CK(cudaEventRecord(s.r0, e->compute));
        if (l > 0) {
            rc = kvcu::matmul(e->blas, e->compute, &e->tile, s.d_k, s.d_x,
                              e->mat[(size_t)lc.layer * KV_ROLE_COUNT + KV_ROLE_WK], l, dim, kvw,
                              "CUDA KVPR", err);
            if (!rc)
                rc = kvcu::matmul(e->blas, e->compute, &e->tile, s.d_v, s.d_x,
                                  e->mat[(size_t)lc.layer * KV_ROLE_COUNT + KV_ROLE_WV], l, dim,
                                  kvw, "CUDA KVPR", err);
            if (rc) return rc;
            CK(kvcu::add_bias(s.d_k, e->vec[(size_t)lc.layer * KV_ROLE_COUNT + KV_ROLE_BK], l, kvw,
                              e->compute));
            CK(kvcu::add_bias(s.d_v, e->vec[(size_t)lc.layer * KV_ROLE_COUNT + KV_ROLE_BV], l, kvw,
                              e->compute));
            CK(kvcu::rope(s.d_k, l, kvw, Hkv, hd, e->d_pos, e->rope_cos, e->rope_sin, layout,
                          e->compute));
        }
        CK(cudaEventRecord(s.r1, e->compute));
        /* download stream: the merged K, V [0:s'] to the set's pinned staging, after both */
        CK(cudaStreamWaitEvent(e->down, s.c1, 0));
        CK(cudaStreamWaitEvent(e->down, s.r1, 0));
        CK(cudaMemcpyAsync(s.o_k, s.d_k, (size_t)lc.seq * kvw * sizeof(float),
                           cudaMemcpyDeviceToHost, e->down));
        CK(cudaMemcpyAsync(s.o_v, s.d_v, (size_t)lc.seq * kvw * sizeof(float),
                           cudaMemcpyDeviceToHost, e->down));
        CK(cudaEventRecord(s.done, e->down));
    }
    /* the last two layers, oldest first */
    for (int i = n - 2 < 0 ? 0 : n - 2; i < n; i++) {
        int rc = finish_set(e, e->set[i % 2], layers, k_out, v_out, t, err);
        if (rc) return rc;
    }
    return KV_OK;
}

} // namespace

extern "C" int kv_cuda_kvpr_rebuild(kv_cuda_kvpr *e, const struct kv_kvpr_layer *layers, int n,
                                    float *const *k_out, float *const *v_out,
                                    struct kv_kvpr_timing *t, kv_error *err) {
    const kv_config *c = &e->m->cfg;
    int dim = c->dim, hd = c->head_dim, Hkv = c->n_kv_heads, kvw = Hkv * hd;
    for (int i = 0; i < n; i++) { /* check everything before queuing anything */
        const kv_kvpr_layer &lc = layers[i];
        if (lc.layer < 0 || lc.layer >= c->n_layers || lc.dim != dim || lc.kv_width != kvw ||
            lc.split < 0 || lc.split > lc.seq || lc.seq > e->max_ctx || (lc.split > 0 && !lc.x) ||
            (lc.split < lc.seq && (!lc.k || !lc.v)) || !k_out[i] || !v_out[i])
            return kv_fail(err, KV_EINPUT,
                           "CUDA KVPR: layer entry %d is inconsistent with the model or the "
                           "executor (layer %d, split %d of %d, max %d)",
                           i, lc.layer, lc.split, lc.seq, e->max_ctx);
    }
    double t0 = kv_now();
    int rc = queue_layers(e, layers, n, k_out, v_out, t, err);
    if (rc) {
        /* an error mid-loop: let what was queued finish (it writes only the executor's own
         * buffers) and forget this call's layers, so the next call never reads or writes past
         * its own arrays through a stale set[].layer; k_out, v_out and t are then unspecified */
        cudaStreamSynchronize(e->compute);
        cudaStreamSynchronize(e->copy);
        cudaStreamSynchronize(e->down);
        for (kset &s : e->set) s.layer = -1;
        return rc;
    }
    double wall = kv_now() - t0;
    if (t)
        for (int i = 0; i < n; i++) t[i].t_total = wall / n;
    return KV_OK;
}
