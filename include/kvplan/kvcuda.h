/* kvplan CUDA backend: the C face of cuda/ (device query, hardware probes, and later the GPU
 * forward operations). Built by nvcc when a CUDA toolkit is present; otherwise cuda/none.c
 * provides the same functions, which report that no CUDA backend was built.
 * Every function returns KV_OK, or an error code with a message; none exits.
 */
#ifndef KVPLAN_KVCUDA_H
#define KVPLAN_KVCUDA_H

#include "kvplan/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_cuda_device {
    char name[256];
    size_t total_mem;      /* bytes */
    int cc_major, cc_minor;
    int multiprocessors;
    double mem_bus_bw;     /* theoretical device memory bandwidth, bytes/s (0 if unknown) */
} kv_cuda_device;

/* 1 when this build contains the CUDA backend. */
int kv_cuda_built(void);
/* Number of usable CUDA devices (0 when none, or when no backend was built). Never fails:
 * a driver without devices counts as 0 and `why` (may be NULL, 256 bytes) says why. */
int kv_cuda_device_count(char *why);
int kv_cuda_device_info(int dev, kv_cuda_device *out, kv_error *err);

#ifdef __cplusplus
}
#endif
#endif
