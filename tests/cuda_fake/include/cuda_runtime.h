/* Fake CUDA runtime (tests only): the cudart entry points kvplan's cuda/backend_cuda.cu,
 * cuda/kvpr_cuda.cu, cuda/kernels.cu and cuda/device.cu call, declared with the CUDA runtime
 * API's names and signatures (CUDA Runtime API reference, "Stream Management", "Event
 * Management", "Memory Management"), implemented on the host by tests/cuda_fake/fake_runtime.cpp.
 * Those files compile unchanged with the host C++ compiler when this folder comes first on the
 * include path; kernel launches (KV_LAUNCH in cuda/kernels/kv_defs.cuh) become deferred stream
 * operations that run the kernel bodies on the host shim (tests/support/cuda_shim.hpp).
 * Semantics the fake keeps (and a real device has): see tests/cuda_fake/cuda_fake.h. */
#ifndef KVPLAN_FAKE_CUDA_RUNTIME_H
#define KVPLAN_FAKE_CUDA_RUNTIME_H

#include "cuda_shim.hpp" /* the kernels' host model (defines KV_HOST_SHIM) */

#include <cstddef>
#include <functional>

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
    cudaErrorInvalidConfiguration = 9,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

struct kvfake_stream;
struct kvfake_event;
typedef kvfake_stream *cudaStream_t;
typedef kvfake_event *cudaEvent_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int major, minor;
    int multiProcessorCount;
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int dev);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int dev);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s = nullptr);

template <typename T> cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void **>(p), bytes);
}
template <typename T> cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned flags) {
    return cudaHostAlloc(reinterpret_cast<void **>(p), bytes, flags);
}
template <typename T> cudaError_t cudaMallocHost(T **p, size_t bytes) {
    return cudaMallocHost(reinterpret_cast<void **>(p), bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t *ev);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
cudaError_t cudaEventQuery(cudaEvent_t ev);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);

/* Opt a kernel into more dynamic shared memory than the default 48 KiB (static + dynamic). */
cudaError_t kvfake_func_set_max_dynamic_shared(const void *func, int bytes);
template <typename F> cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return kvfake_func_set_max_dynamic_shared(reinterpret_cast<const void *>(func), value);
}

/* The launch behind KV_LAUNCH: queue `body` (the kernel over the grid) on stream s. Returns the
 * launch's error (also kept for cudaGetLastError): a bad configuration fails here, as on a
 * device. */
cudaError_t kvfake_launch(cudaStream_t s, dim3 grid, dim3 block, size_t dyn_shared,
                          const void *func, std::function<void()> body);

/* kernel<<<grid, block, shm, stream>>>(args...) as KV_LAUNCH(kernel, grid, block, shm,
 * stream)(args...): the arguments are captured by value at the launch, as CUDA does. */
template <typename F> struct kvfake_launcher {
    F *func;
    dim3 grid, block;
    size_t shm;
    cudaStream_t s;
    template <typename... A> void operator()(A... args) const {
        F *f = func;
        kvfake_launch(s, grid, block, shm, reinterpret_cast<const void *>(f),
                      [f, args...]() { f(args...); });
    }
};
template <typename F>
kvfake_launcher<F> kvfake_kernel(F *func, dim3 grid, dim3 block, size_t shm, cudaStream_t s) {
    return kvfake_launcher<F>{func, grid, block, shm, s};
}

#endif
