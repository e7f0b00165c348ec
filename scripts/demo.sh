#!/usr/bin/env bash
# kvplan's main job on the bundled default model (stories260K from ../shared/models):
# set up and build the kvplan binary alone, profile the model, search per-head KV budgets at 1/8
# of the full cache, then run the plan: generation and perplexity under the budgets, and a look at
# the files.
# Usage: scripts/demo.sh [RATIO]      (outputs in out/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
ratio=${1:-0.125}
shared=${KVPLAN_SHARED:-$root/../shared}
model=$shared/models/stories260K/stories260K.bin
tok=$shared/models/stories260K/tok512.bin
text=$shared/text/tinystories_val_head.txt
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
# only what the demo runs: the kvplan binary, and the CUDA plugin where kvplan would open it (an
# NVIDIA driver is present, as runtime/backend/cuda_loader.c decides); scripts/test.sh builds
# the rest (tests, benchmarks, libkvplan.so)
targets=kvplan
if [ -e /dev/nvidiactl ] || [ -e /proc/driver/nvidia/version ]; then
    targets="kvplan kvplan_cuda_if_built"
fi
KVPLAN_TARGETS=$targets scripts/build.sh build
kv=build/kvplan
mkdir -p out
echo "== 1. profile (head and layer similarity, hardware) =="
$kv profile "$model" --tokenizer "$tok" --text "$text" -o out/profile.h5
echo
echo "== 2. search per-head budgets at ratio $ratio (successive halving over BaKlaVa's t x r grid) =="
# 8-token blocks and eviction every p = 4 tokens leave room to move budgets between heads
# even at small ratios (each head keeps at least 4 sinks + p); squeeze p in {0.5, 1}.
$kv search --profile out/profile.h5 --model "$model" --tokenizer "$tok" --text "$text" \
    --ratio "$ratio" --evict-block 4 --block-size 8 --p-grid 0.5,1 --halving 3 -o out/plan.h5
echo
echo "== 3. run the plan =="
$kv run "$model" --tokenizer "$tok" --plan out/plan.h5 --temperature 0 -n 120 \
    --prompt "Once upon a time, there was a little dog"
echo
echo "== 4. perplexity: full cache vs the plan (first 16 chunks of 512 tokens) =="
$kv eval "$model" --tokenizer "$tok" --text "$text" --max-tokens 8192 --quiet | grep -E 'perplexity|kv bytes'
$kv eval "$model" --tokenizer "$tok" --text "$text" --max-tokens 8192 --plan out/plan.h5 --quiet \
    | grep -E 'cache|perplexity|kv bytes'
echo
echo "== 5. inspect =="
mkdir -p out/pictures
$kv inspect out/plan.h5 --png out/pictures > out/plan.txt
sed -n 1,40p out/plan.txt
echo "(the whole summary in out/plan.txt, pictures in out/pictures)"
