/* cuda/kernels.cu, unchanged, compiled by the host C++ compiler against the fake CUDA runtime
 * (tests/cuda_fake/include first on the include path). */
#include <cstring>

#include "../../cuda/kernels.cu"

/* The host function of the attention kernel of a decode step (split or not), as KV_LAUNCH
 * above names it: for kvfake_watch_grid (cuda_fake.h). */
extern "C" const void *kvfake_paged_attention_kernel(int split) {
    return split ? reinterpret_cast<const void *>(&kv_k_decode_split)
                 : reinterpret_cast<const void *>(&kv_k_paged_attention);
}

/* The flash-decoding kernel the launcher picks for K/V type kv_type and head dimension hd. */
extern "C" const void *kvfake_flash_decode_kernel(int kv_type, int hd) {
#define KV_FD_PICK(TY)                                                                             \
    (hd <= 8     ? reinterpret_cast<const void *>(&kv_k_flash_decode<TY, 8>)                       \
     : hd <= 16  ? reinterpret_cast<const void *>(&kv_k_flash_decode<TY, 16>)                      \
     : hd <= 32  ? reinterpret_cast<const void *>(&kv_k_flash_decode<TY, 32>)                      \
     : hd <= 64  ? reinterpret_cast<const void *>(&kv_k_flash_decode<TY, 64>)                      \
     : hd <= 128 ? reinterpret_cast<const void *>(&kv_k_flash_decode<TY, 128>)                     \
                 : reinterpret_cast<const void *>(&kv_k_flash_decode<TY, 256>))
    switch (kv_type) {
    case KV_TYPE_F16:
        return KV_FD_PICK(KV_TYPE_F16);
    case KV_TYPE_Q8:
        return KV_FD_PICK(KV_TYPE_Q8);
    case KV_TYPE_Q4:
        return KV_FD_PICK(KV_TYPE_Q4);
    default:
        return KV_FD_PICK(KV_TYPE_F32);
    }
#undef KV_FD_PICK
}

extern "C" const void *kvfake_prefill_tiled_kernel(int hd) {
    return hd == 16   ? reinterpret_cast<const void *>(&kv_k_prefill_tiled<16>)
           : hd == 32 ? reinterpret_cast<const void *>(&kv_k_prefill_tiled<32>)
           : hd == 64 ? reinterpret_cast<const void *>(&kv_k_prefill_tiled<64>)
                      : reinterpret_cast<const void *>(&kv_k_prefill_tiled<128>);
}

extern "C" const void *kvfake_prefill_stats_kernel(int hd) {
    return hd == 16   ? reinterpret_cast<const void *>(&kv_k_prefill_stats<16>)
           : hd == 32 ? reinterpret_cast<const void *>(&kv_k_prefill_stats<32>)
           : hd == 64 ? reinterpret_cast<const void *>(&kv_k_prefill_stats<64>)
                      : reinterpret_cast<const void *>(&kv_k_prefill_stats<128>);
}

extern "C" int kvfake_probe_wide_group(int g, int hd, int split, double *max_err) {
    const int bs = 16;
    size_t row = (size_t)hd * sizeof(float), block = 2 * (size_t)bs * row, gw = (size_t)g * hd;
    kv_k_pool P;
    std::memset(&P, 0, sizeof P);
    P.bs = bs;
    P.hd = hd;
    for (int t = 0; t <= KV_CACHE_TYPES; t++) {
        P.type_first[t] = t ? 1 : 0;
        P.type_offset[t] = t ? block : 0;
    }
    float *hk = new float[2 * (size_t)hd + gw], *ho = new float[gw];
    for (int d = 0; d < 2 * hd; d++) hk[d] = 0.25f * (float)((d * 7) % 13) - 1.5f; /* K | V */
    for (size_t x = 0; x < gw; x++) hk[2 * hd + x] = 0.01f * (float)(x % 17);      /* q */
    kv_k_attn_task t = {0, 1, 0, 1, 0, 0, 0};
    int table = 0;
    void *pool = nullptr, *dq = nullptr, *dout = nullptr, *dsc = nullptr, *dpart = nullptr,
         *dtask = nullptr, *dtab = nullptr;
    cudaError_t e = cudaMalloc(&pool, block);
    if (!e) e = cudaMalloc(&dq, gw * sizeof(float));
    if (!e) e = cudaMalloc(&dout, gw * sizeof(float));
    if (!e) e = cudaMalloc(&dsc, (size_t)g * sizeof(float));
    if (!e) e = cudaMalloc(&dpart, (size_t)g * (hd + 2) * sizeof(float));
    if (!e) e = cudaMalloc(&dtask, sizeof t);
    if (!e) e = cudaMalloc(&dtab, sizeof table);
    if (!e) e = cudaMemcpy(pool, hk, row, cudaMemcpyHostToDevice);                         /* K 0 */
    if (!e) e = cudaMemcpy((char *)pool + bs * row, hk + hd, row, cudaMemcpyHostToDevice); /* V 0 */
    if (!e) e = cudaMemcpy(dq, hk + 2 * hd, gw * sizeof(float), cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dtask, &t, sizeof t, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(dtab, &table, sizeof table, cudaMemcpyHostToDevice);
    P.data = static_cast<unsigned char *>(pool);
    const kv_k_attn_task *tk = static_cast<const kv_k_attn_task *>(dtask);
    const int *tb = static_cast<const int *>(dtab);
    float *q = static_cast<float *>(dq), *o = static_cast<float *>(dout);
    float *sc = static_cast<float *>(dsc), *part = static_cast<float *>(dpart);
    if (!e && split)
        e = kvcu::decode_attention_split(P, tb, tk, 1, q, o, (int)gw, g, bs, 1, sc, 1, part,
                                         nullptr, nullptr, nullptr, nullptr);
    else if (!e)
        e = kvcu::paged_attention(P, tb, tk, 1, nullptr, nullptr, nullptr, q, o, (int)gw, g, sc, 1,
                                  nullptr);
    if (!e) e = cudaMemcpy(ho, dout, gw * sizeof(float), cudaMemcpyDeviceToHost);
    double worst = 0.0;
    for (size_t x = 0; x < gw && !e; x++) {
        double d = fabs((double)ho[x] - (double)hk[hd + x % (size_t)hd]);
        worst = d > worst || d != d ? d : worst;
    }
    *max_err = worst;
    for (void *p : {pool, dq, dout, dsc, dpart, dtask, dtab}) cudaFree(p);
    delete[] hk;
    delete[] ho;
    return (int)e;
}
