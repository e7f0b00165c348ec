/* Load/store tracer of kernels run on the host shim (tests/support/cuda_shim.hpp), for the
 * performance model (kmodel.h). Internal to tests/cuda_model/.
 *
 * Code compiled with clang's -fsanitize-coverage=trace-pc-guard,trace-loads,trace-stores
 * (kprobe.cpp) calls __sanitizer_cov_load{1,2,4,8,16}(addr) before every load and
 * __sanitizer_cov_store{...}(addr) before every store; ktrace.cpp defines them. While a tracer
 * is active on the calling thread, an access inside one of its registered buffers (the
 * kernel's global memory) is recorded under its site (the call's return address: one load or
 * store instruction of the host code), the block, the warp and the lane (kv_shim_self()): the
 * k-th access of a site by each lane of a warp forms the warp's k-th request at that site
 * (the lanes of a warp run as separate fibers on the shim, so the order interleaves; the
 * counting pairs them up). Per request: the distinct 32-byte sectors and the bytes asked for.
 * Per launch: the distinct sectors of each buffer (every byte fetched from DRAM once).
 * Requests are folded into the totals when a block ends (the shim runs blocks one after
 * another), so memory stays bounded by one block's accesses.
 *
 * The coverage callbacks carry no context, so the active tracer is found through a
 * thread-local pointer set by km_tracer::begin and cleared by end (the one piece of
 * thread state; one tracer per thread at a time). */
#ifndef KVPLAN_TESTS_KTRACE_HPP
#define KVPLAN_TESTS_KTRACE_HPP

#include "kmodel.h"

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

class km_tracer {
  public:
    /* How a buffer's distinct bytes scale to the full grid: STREAM, each block reads its own
     * part (weights, the K/V pool, outputs): scaled with the blocks; SHARED, every block reads
     * the same bytes (x, the queries): fetched once whatever the grid. */
    enum role { STREAM = 0, SHARED = 1 };

    /* Register [p, p + bytes) as global memory of the next launches, with its role. */
    void buffer(const void *p, size_t bytes, role r);
    /* Trace this thread's accesses from now until end(); folds what came before away. */
    void begin();
    /* Stop tracing and fold the last block's requests into the totals. */
    void end();
    /* The totals since the first begin, as a launch of `blocks` blocks of `threads` threads
     * with `dyn_smem` dynamic shared bytes whose traced part ran `traced_blocks` of them: counts
     * scaled by blocks / traced_blocks, SHARED buffers' distinct bytes counted once; path 1
     * (the probe sets the share of the loop's optional code its shape runs). */
    km_trace result(double blocks, double traced_blocks, int threads, size_t dyn_smem) const;

    /* The distinct bytes of role r's buffers touched since the first begin (unscaled). */
    double distinct_bytes(role r) const;

    /* Called by the shim's MMA emulation (kv_prefill.cuh, through kv_shim_mma_hook): one lane
     * of a warp ran one 16 x 16 x 16 MMA. */
    void mma() {
        mma_lanes_ += 1;
    }

    /* Called by the coverage callbacks (ktrace.cpp): one access of `bytes` at p from `site`. */
    void access(const void *p, int bytes, uintptr_t site, bool store);

  private:
    struct range {
        uintptr_t lo, hi;
        role r;
    };
    struct request {
        std::vector<uint64_t> sectors;
        double bytes = 0;
        bool store = false;
    };
    void flush();
    std::vector<range> ranges_;
    long block_ = -1;                                   /* the block whose requests are pending */
    std::unordered_map<uint64_t, uint32_t> lane_count_; /* (tid, site) -> accesses so far */
    std::unordered_map<uint64_t, request> pending_;     /* (warp, site, k) -> its request */
    std::unordered_map<uintptr_t, uint32_t> sites_;     /* return address -> site id */
    std::unordered_set<uint64_t> distinct_[2];          /* sectors per role */
    double requests_ = 0, sectors_ = 0, req_bytes_ = 0, stores_ = 0, mma_lanes_ = 0;
};

#endif
