/* The table libkvplan-cuda.so exports (runtime/backend/cuda_plugin.h): the only symbol the
 * plugin shows; the main library reaches every CUDA entry point through it. */
#include "../runtime/backend/cuda_plugin.h"

static const kv_cuda_plugin kv_cuda_plugin_table = {
    KV_CUDA_PLUGIN_ABI, sizeof(kv_cuda_plugin), kv_cuda_device_count, kv_cuda_device_info,
    kv_cuda_probe_copy, kv_cuda_probe_gemm,     kv_backend_cuda_new,  kv_cuda_kvpr_new,
    kv_cuda_kvpr_free,  kv_cuda_kvpr_rebuild,
};

extern "C" __attribute__((visibility("default"))) const kv_cuda_plugin *
kvplan_cuda_plugin_v1(void) {
    return &kv_cuda_plugin_table;
}
