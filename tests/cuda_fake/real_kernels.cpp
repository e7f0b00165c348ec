/* cuda/kernels.cu, unchanged, compiled by the host C++ compiler against the fake CUDA runtime
 * (tests/cuda_fake/include first on the include path). */
#include "../../cuda/kernels.cu"

/* The host function of the attention kernel of a decode step (split or not), as KV_LAUNCH
 * above names it: for kvfake_watch_grid (cuda_fake.h). */
extern "C" const void *kvfake_paged_attention_kernel(int split) {
    return split ? reinterpret_cast<const void *>(&kv_k_decode_split)
                 : reinterpret_cast<const void *>(&kv_k_paged_attention);
}
