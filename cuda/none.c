/* Stand-in for the CUDA backend when no CUDA toolkit was found at build time: every query
 * answers "no device" so the CPU paths run. See include/kvplan/kvcuda.h. */
#include "kvplan/kvcuda.h"

#include <stdio.h>

int kv_cuda_built(void) {
    return 0;
}

int kv_cuda_device_count(char *why) {
    if (why) snprintf(why, 256, "kvplan was built without a CUDA toolkit");
    return 0;
}

int kv_cuda_device_info(int dev, kv_cuda_device *out, kv_error *err) {
    (void)dev;
    (void)out;
    return kv_fail(err, KV_EINPUT, "no CUDA backend in this build (no CUDA toolkit was found)");
}
