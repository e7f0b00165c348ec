#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (H100 / sm_90 in mind): build kvplan for sm_90, run the CUDA
# conformance suite on the device, then time each kernel with CUDA events next to the
# performance model's prediction (bench_kernels: GEMV F16 / Q8_0 / Q4_0 / Q4_K at batch 1,
# decode attention at 1k / 4k, batch 1 / 32, prefill attention at 4k; achieved GB/s and TFLOP/s
# beside the modelled ones, docs/cuda-kernels.md), then the engine's rows of bench_cuda
# (prefill TFLOP/s and decode GB/s on the device) and the count-only twin on the fake runtime
# with the model's per-kernel and per-step figures. Prints one table per step; meant to finish
# in under 5 minutes (only the targets it runs are built).
# Usage: bench/device.sh [BUILD_DIR (build-sm90)]
# Without a GPU it stops at once with a one-line reason and exit status 2: nothing here can be
# measured on the fake runtime (bench_cuda_fake is the count-only twin, docs/cuda-kernels.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build-sm90}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "bench/device.sh: no NVIDIA GPU here (nvidia-smi lists none); run it on a GPU machine" >&2
    exit 2
fi
nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
if [ ! -x "$nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then
    echo "bench/device.sh: no nvcc ($nvcc); install the CUDA toolkit or set CUDACXX" >&2
    exit 2
fi

echo "== device =="
nvidia-smi --query-gpu=name,compute_cap,memory.total,clocks.max.sm,clocks.max.mem --format=csv

echo "== build for sm_90 ($dir) =="
t0=$(date +%s)
KVPLAN_TARGETS="kvplan kvplan_cuda test_cuda_conformance bench_kernels bench_cuda bench_cuda_fake" \
    "$root/scripts/build.sh" "$dir" -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
echo "built in $(( $(date +%s) - t0 )) s"

echo "== conformance on the device (test_cuda_conformance) =="
(cd "$root/$dir" && ctest -R '^test_cuda_conformance$' --output-on-failure)

echo "== kernels on the device (bench_kernels: measured with CUDA events, next to the model) =="
"$root/$dir/bench_kernels"

echo "== engine on the device (bench_cuda: measured with the device's own timers) =="
"$root/$dir/bench_cuda" --context 4096 --decode 64

echo "== the count-only twin on the fake runtime (modelled, not measured) =="
"$root/$dir/bench_cuda_fake"
