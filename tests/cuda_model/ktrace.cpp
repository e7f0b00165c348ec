/* The load/store tracer (ktrace.hpp) and the coverage callbacks clang's
 * -fsanitize-coverage=trace-pc-guard,trace-loads,trace-stores calls from kprobe.cpp. This file
 * itself is compiled without coverage. */
#include "ktrace.hpp"

#include "cuda_shim.hpp"

#include <algorithm>

namespace {

thread_local km_tracer *t_active = nullptr; /* the tracer of this thread's running probe */

constexpr int kSectorShift = 5; /* 32-byte sectors */

inline void record(const void *p, int bytes, uintptr_t site, bool store) {
    if (t_active) t_active->access(p, bytes, site, store);
}

} // namespace

void km_tracer::buffer(const void *p, size_t bytes, role r) {
    uintptr_t lo = reinterpret_cast<uintptr_t>(p);
    ranges_.push_back({lo, lo + bytes, r});
}

void km_tracer::begin() {
    block_ = -1;
    t_active = this;
}

void km_tracer::end() {
    t_active = nullptr;
    flush();
}

void km_tracer::access(const void *p, int bytes, uintptr_t site, bool store) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const range *hit = nullptr;
    for (const range &r : ranges_)
        if (a >= r.lo && a < r.hi) hit = &r;
    if (!hit) return; /* stack, shared memory, the shim's own state: not global memory */
    const kv_shim_thread_ctx &self = kv_shim_self();
    long block = (long)self.bid_y * self.gdim + self.bid;
    if (block != block_) {
        flush();
        block_ = block;
    }
    auto s = sites_.emplace(site, (uint32_t)sites_.size()).first->second;
    uint32_t &k = lane_count_[(uint64_t)self.tid << 32 | s];
    uint64_t key = (uint64_t)(self.tid / 32) << 58 | (uint64_t)s << 40 | k++;
    request &q = pending_[key];
    q.store = store;
    q.bytes += bytes;
    for (uint64_t sec = a >> kSectorShift; sec <= (a + bytes - 1) >> kSectorShift; sec++) {
        q.sectors.push_back(sec);
        distinct_[hit->r].insert(sec);
    }
}

void km_tracer::flush() {
    for (auto &kv : pending_) {
        request &q = kv.second;
        if (q.store) {
            stores_ += 1;
            continue;
        }
        std::sort(q.sectors.begin(), q.sectors.end());
        auto n = std::unique(q.sectors.begin(), q.sectors.end()) - q.sectors.begin();
        requests_ += 1;
        sectors_ += (double)n;
        req_bytes_ += q.bytes;
    }
    pending_.clear();
    lane_count_.clear();
}

km_trace km_tracer::result(double blocks, double traced_blocks, int threads,
                           size_t dyn_smem) const {
    double f = blocks / traced_blocks;
    km_trace t;
    t.blocks = blocks;
    t.threads = threads;
    t.dyn_smem = dyn_smem;
    t.requests = requests_ * f;
    t.sectors = sectors_ * f;
    t.req_bytes = req_bytes_ * f;
    t.store_requests = stores_ * f;
    t.path = 1.0;
    t.mma_flops = mma_lanes_ / 32.0 * (2.0 * 16 * 16 * 16) * f; /* a warp MMA: 16^3 FMAs */
    t.dram_bytes = 32.0 * ((double)distinct_[STREAM].size() * f + (double)distinct_[SHARED].size());
    return t;
}

double km_tracer::distinct_bytes(role r) const {
    return 32.0 * (double)distinct_[r].size();
}

/* ---- the coverage callbacks (clang SanitizerCoverage, "Tracing data flow": trace-loads /
 * trace-stores need a base mode, trace-pc-guard here, whose guards are left alone) ---- */
extern "C" {

void kv_shim_mma_hook(void) {
    if (t_active) t_active->mma();
}

void __sanitizer_cov_trace_pc_guard_init(uint32_t *, uint32_t *) {}
void __sanitizer_cov_trace_pc_guard(uint32_t *) {}

#define KM_TRACE_FN(kind, n, T, store)                                                             \
    void __sanitizer_cov_##kind##n(T *p) {                                                         \
        record(p, n, reinterpret_cast<uintptr_t>(__builtin_return_address(0)), store);             \
    }
KM_TRACE_FN(load, 1, uint8_t, false)
KM_TRACE_FN(load, 2, uint16_t, false)
KM_TRACE_FN(load, 4, uint32_t, false)
KM_TRACE_FN(load, 8, uint64_t, false)
KM_TRACE_FN(load, 16, __int128, false)
KM_TRACE_FN(store, 1, uint8_t, true)
KM_TRACE_FN(store, 2, uint16_t, true)
KM_TRACE_FN(store, 4, uint32_t, true)
KM_TRACE_FN(store, 8, uint64_t, true)
KM_TRACE_FN(store, 16, __int128, true)
#undef KM_TRACE_FN
}
