// kvplan CUDA backend entry point (kvplan/kvcuda.h). The device ops table is not part of this
// build yet: a present device is reported and the engine falls back to the CPU only when the
// user asked for --device auto.
#include "kvplan/kvcuda.h"

extern "C" int kv_backend_cuda_new(const struct kv_model *m, int max_rows, int max_ctx,
                                   struct kv_backend **out, kv_error *err) {
    (void)m;
    (void)max_rows;
    (void)max_ctx;
    *out = nullptr;
    char why[256] = "";
    if (kv_cuda_device_count(why) <= 0)
        return kv_fail(err, KV_EINPUT, "--device cuda: no CUDA device is available (%s); use --device cpu",
                       why);
    return kv_fail(err, KV_EINPUT,
                   "--device cuda: this build has no CUDA engine backend yet; use --device cpu");
}
