/* The thin layer under kvplan's kernel bodies (cuda/kernels/kv_kernels.cuh): the same source
 * compiles under nvcc for the device and under a C++ compiler for the host shim the tests use
 * (tests/support/cuda_shim.hpp), which runs a kernel's grid on host threads.
 *
 * Kernel bodies use only these names for CUDA's built-ins:
 *   KV_GLOBAL / KV_DEVICE          kernel / device-function qualifiers
 *   kv_tid(), kv_bid(), kv_bid_y(), kv_bdim(), kv_gdim()   threadIdx.x, blockIdx.x,
 *                                  blockIdx.y, blockDim.x, gridDim.x (blocks are 1-D)
 *   KV_SHARED_ARRAY(T, name, n)    a fixed-size __shared__ array
 *   KV_DYNAMIC_SHARED(T, name)     the launch's dynamic shared memory as T*
 *   kv_syncthreads()               __syncthreads()
 *   kv_shfl_xor(v, m), kv_shfl_down(v, d)   full-warp shuffles (__shfl_*_sync, mask all 32)
 *   KV_UNROLL                      #pragma unroll before a loop (nothing on the shim)
 *   kv_ld_u16(p)                   the 16-bit little-endian word at p (2-byte aligned on the
 *                                  device: one ld.global.u16, not two byte loads)
 *   kv_dp4a(a, b, c)               c + the dot of a's and b's four signed bytes (__dp4a)
 *   kv_load16(p, v)                16 bytes at p (16-byte aligned on the device) into
 *                                  uint32_t v[4]: one 128-bit load (ld.global.v4)
 *   kv_ld_u32(p)                   the 32-bit little-endian word at p (4-byte aligned on the
 *                                  device: one ld.global.u32)
 *   kv_fmul_rn(a, b), kv_fadd_rn(a, b), kv_fsub_rn(a, b)   one fp32 operation rounded to
 *                                  nearest even that nvcc may not fuse into an FMA (__fmul_rn
 *                                  ...): where a kernel must give the CPU's bits (the CPU
 *                                  library is built without contraction)
 *   kv_fdiv_rn(a, b)               an IEEE fp32 division rounded to nearest even (__fdiv_rn:
 *                                  the host's a / b whatever the compiler's -prec-div)
 * and launchers (cuda/kernels.cu) write kernel<<<grid, block, shm, stream>>>(args) as
 *   KV_LAUNCH(kernel, grid, block, shm, stream)(args)
 * which is the triple-chevron launch under nvcc and, on the fake CUDA runtime
 * (tests/cuda_fake/), a deferred launch on the fake stream that runs the grid on the shim.
 * Rules the kernels follow (and the shim enforces by deadlocking otherwise): blockDim.x is a
 * multiple of 32; every thread of a block reaches every kv_syncthreads(); every lane of a
 * warp reaches every shuffle.
 *
 * Under the shim, the file that includes the kernels must include
 * tests/support/cuda_shim.hpp first (it defines KV_HOST_SHIM and the kv_shim_* functions used
 * below).
 */
#ifndef KVPLAN_CUDA_KV_DEFS_CUH
#define KVPLAN_CUDA_KV_DEFS_CUH

#define KV_WARP 32

#if defined(__CUDACC__)

#define KV_GLOBAL __global__
#define KV_DEVICE static __device__ __forceinline__
#define kv_tid() ((int)threadIdx.x)
#define kv_bid() ((int)blockIdx.x)
#define kv_bid_y() ((int)blockIdx.y)
#define kv_bdim() ((int)blockDim.x)
#define kv_gdim() ((int)gridDim.x)
#define KV_SHARED_ARRAY(T, name, n) __shared__ T name[n]
#define KV_DYNAMIC_SHARED(T, name)                                                                 \
    extern __shared__ __align__(16) unsigned char kv_dynamic_smem[];                               \
    T *name = reinterpret_cast<T *>(kv_dynamic_smem)
#define kv_syncthreads() __syncthreads()
#define kv_shfl_xor(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define kv_shfl_down(v, d) __shfl_down_sync(0xffffffffu, (v), (d))
#define KV_LAUNCH(k, grid, block, shm, s) k<<<(grid), (block), (shm), (s)>>>
#define KV_UNROLL _Pragma("unroll")
static __device__ __forceinline__ unsigned kv_ld_u16(const void *p) {
    return *reinterpret_cast<const unsigned short *>(p);
}
#define kv_dp4a(a, b, c) __dp4a((int)(a), (int)(b), (int)(c))
static __device__ __forceinline__ void kv_load16(const void *p, unsigned *v) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
}
static __device__ __forceinline__ unsigned kv_ld_u32(const void *p) {
    return *reinterpret_cast<const unsigned *>(p);
}
#define kv_fmul_rn(a, b) __fmul_rn((a), (b))
#define kv_fadd_rn(a, b) __fadd_rn((a), (b))
#define kv_fsub_rn(a, b) __fsub_rn((a), (b))
#define kv_fdiv_rn(a, b) __fdiv_rn((a), (b))

#elif defined(KV_HOST_SHIM)

#include <math.h>

#define KV_GLOBAL static inline
#define KV_DEVICE static inline
#define kv_tid() (kv_shim_self().tid)
#define kv_bid() (kv_shim_self().bid)
#define kv_bid_y() (kv_shim_self().bid_y)
#define kv_bdim() (kv_shim_self().bdim)
#define kv_gdim() (kv_shim_self().gdim)
#define KV_SHARED_ARRAY(T, name, n)                                                                \
    T *name = static_cast<T *>(kv_shim_static_shared(sizeof(T) * (n)))
#define KV_DYNAMIC_SHARED(T, name) T *name = static_cast<T *>(kv_shim_dynamic_shared())
#define kv_syncthreads() kv_shim_syncthreads()
#define kv_shfl_xor(v, m) kv_shim_shfl_xor((v), (m))
#define kv_shfl_down(v, d) kv_shim_shfl_down((v), (d))
#if defined(KVPLAN_FAKE_CUDA_RUNTIME_H)
#define KV_LAUNCH(k, grid, block, shm, s) kvfake_kernel(k, grid, block, shm, s)
#endif
#include <string.h>
#define KV_UNROLL
/* One 2-byte load, as on the device (the performance model's load tracer counts requests per
 * load instruction); the host is little-endian, as the device. */
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the host shim needs a little-endian host");
static inline unsigned kv_ld_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline int kv_dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; k++)
        c += (int)(signed char)(unsigned char)((unsigned)a >> (8 * k)) *
             (int)(signed char)(unsigned char)((unsigned)b >> (8 * k));
    return c;
}
/* One 16-byte load, as on the device (a 16-byte memcpy would stay a call to the compiler's
 * memcpy expansion, which the performance model's load tracer does not see). */
typedef unsigned kv_shim_u32x4 __attribute__((vector_size(16), may_alias, aligned(1)));
static inline void kv_load16(const void *p, unsigned *v) {
    kv_shim_u32x4 u = *static_cast<const kv_shim_u32x4 *>(p);
    __asm__("" : "+x"(u)); /* the whole vector used: the load is not split into four */
    v[0] = u[0], v[1] = u[1], v[2] = u[2], v[3] = u[3];
}
/* One 4-byte load, as on the device (kv_ld_u16's reason). */
static inline unsigned kv_ld_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
/* plain operations on the shim: its x86-64 build targets no FMA instruction (no -mfma or
 * -march), so each is rounded once, as in the CPU library */
static inline float kv_fmul_rn(float a, float b) {
    return a * b;
}
static inline float kv_fadd_rn(float a, float b) {
    return a + b;
}
static inline float kv_fsub_rn(float a, float b) {
    return a - b;
}
static inline float kv_fdiv_rn(float a, float b) {
    return a / b;
}

#else
#error "cuda/kernels/kv_defs.cuh: compile with nvcc, or include tests/support/cuda_shim.hpp first"
#endif

/* ---- reductions shared by the kernels (fixed order: the same result on every run) ---- */

/* Sum over the 32 lanes of a warp; every lane receives the same value (butterfly). */
template <typename T> KV_DEVICE T kv_warp_sum(T v) {
    for (int m = KV_WARP / 2; m > 0; m /= 2) v += kv_shfl_xor(v, m);
    return v;
}

template <typename T> KV_DEVICE T kv_warp_max(T v) {
    for (int m = KV_WARP / 2; m > 0; m /= 2) {
        T o = kv_shfl_xor(v, m);
        v = o > v ? o : v;
    }
    return v;
}

/* Sum over the whole block; every thread receives the same value. `red` is shared scratch of
 * at least blockDim.x / 32 elements; the leading barrier lets callers reuse it back to back.
 * The warp totals are added in warp order by every thread, so the result is reproducible. */
template <typename T> KV_DEVICE T kv_block_sum(T v, T *red) {
    v = kv_warp_sum(v);
    kv_syncthreads();
    if ((kv_tid() & (KV_WARP - 1)) == 0) red[kv_tid() / KV_WARP] = v;
    kv_syncthreads();
    T t = red[0];
    for (int w = 1; w < kv_bdim() / KV_WARP; w++) t += red[w];
    return t;
}

template <typename T> KV_DEVICE T kv_block_max(T v, T *red) {
    v = kv_warp_max(v);
    kv_syncthreads();
    if ((kv_tid() & (KV_WARP - 1)) == 0) red[kv_tid() / KV_WARP] = v;
    kv_syncthreads();
    T t = red[0];
    for (int w = 1; w < kv_bdim() / KV_WARP; w++) t = red[w] > t ? red[w] : t;
    return t;
}

#endif
