#!/usr/bin/env bash
# Build kvplan (release) and run the engine/runtime benchmark: one table with the machine,
# stories260K and a synthetic 768d/12-layer model (built in memory, never written) — prefill and
# decode tokens/s, bytes per decoded token, GB/s against memcpy, and decode at long context
# for R = 1, 1/4, 1/16 with the largest batch that fits a KV memory budget; then the profiler's
# overhead against plain prefill, and successive halving against the exhaustive search grid;
# then the CUDA backend's device rows where a GPU is present (bench_cuda).
# Usage: scripts/bench.sh [BUILD_DIR] [bench_engine options: --long-context N --kv-mib M
#                          --max-batch B --quick]        (default BUILD_DIR: build)
# Timings depend on the machine's load: the table prints the load average at start and end;
# run it on an idle machine for numbers worth comparing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then dir=$1; shift; fi
case "$dir" in /*) out=$dir ;; *) out=$root/$dir ;; esac
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$out" -j "$(nproc)" --target bench_engine bench_profile bench_search bench_quant \
    bench_cuda
echo "uptime: $(uptime)"
"$out/bench_engine" --shared "${KVPLAN_SHARED:-$root/../shared}" "$@"
echo
echo "== profiler collectors vs plain prefill =="
"$out/bench_profile"
echo
echo "== search: successive halving vs the exhaustive BaKlaVa grid =="
"$out/bench_search"
echo
echo "== weights in their own type: F32 / F16 / BF16 / Q8_0 / Q4_K =="
"$out/bench_quant"
echo
# device rows: decode bytes/s and prefill FLOP/s of the CUDA backend against the device's
# measured bandwidth and cuBLAS probe, R = 1, 1/4, 1/16 (prints "skipped" without a GPU)
"$out/bench_cuda"
echo "uptime: $(uptime)"
