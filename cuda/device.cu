/* CUDA device query (runtime/backend/kvcuda.h). */
#include "backend/kvcuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" int kv_cuda_built(void) {
    return 1;
}

extern "C" int kv_cuda_device_count(char *why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) snprintf(why, 256, "CUDA runtime: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why) snprintf(why, 256, "no CUDA device present");
    return n;
}

extern "C" int kv_cuda_device_info(int dev, kv_cuda_device *out, kv_error *err) {
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess)
        return kv_fail(err, KV_EINPUT, "CUDA device %d: %s", dev, cudaGetErrorString(e));
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->total_mem = prop.totalGlobalMem;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->multiprocessors = prop.multiProcessorCount;
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    out->mem_bus_bw = 2.0 * (double)clock_khz * 1e3 * (double)bus_bits / 8.0;
    return KV_OK;
}
