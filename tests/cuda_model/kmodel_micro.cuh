/* Micro-kernels whose memory behaviour is known, for the CUDA performance model's tests
 * (tests/test_kmodel.cpp) and its table of compiled code (scripts/kernel-table.py): written
 * with cuda/kernels/kv_defs.cuh's names, so the same source runs on the host shim (traced) and
 * compiles under nvcc for sm_90 (registers, loop instructions, loads in flight).
 * Include kv_defs.cuh (or, on the shim, tests/support/cuda_shim.hpp then kv_defs.cuh) first. */
#ifndef KVPLAN_TESTS_KMODEL_MICRO_CUH
#define KVPLAN_TESTS_KMODEL_MICRO_CUH

#include "kernels/kv_defs.cuh"

/* y[i] = x[i * stride] for i < n, a grid-stride loop, one float per thread per iteration:
 * stride 1 is a coalesced copy (a warp's 32 lanes read 128 consecutive bytes: 4 sectors of
 * 32 B), stride 8 reads one float from each of 32 sectors per warp request (8x the sectors
 * for the same bytes requested). x: n * stride floats, y: n floats. */
KV_GLOBAL void km_copy(const float *x, float *y, int n, int stride) {
    for (int i = kv_bid() * kv_bdim() + kv_tid(); i < n; i += kv_gdim() * kv_bdim())
        y[i] = x[(size_t)i * (size_t)stride];
}

/* Pointer chase: each thread starts at its global index and follows next[] `hops` times, one
 * dependent load after another (exactly one load in flight per warp: latency-bound), then
 * stores where it ended. next: a permutation of the launch's threads' indices (or any array
 * whose values index it), out: one int per thread. */
KV_GLOBAL void km_chase(const int *next, int *out, int hops) {
    int self = kv_bid() * kv_bdim() + kv_tid(), i = self;
    for (int h = 0; h < hops; h++) i = next[i];
    out[self] = i;
}

#endif
