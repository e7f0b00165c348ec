#!/usr/bin/env bash
# Build kvplan's libFuzzer targets (tests/fuzz/: clang, ASan + UBSan with float-cast-overflow)
# in build-fuzz/ and run each for SECONDS (default 300) on its growing corpus
# (build-fuzz/corpus/TARGET, started from the seeds the build generates).
# A finding (crash-*, leak-*, timeout-*, oom-*) is kept in build-fuzz/findings/TARGET/ and makes
# the script exit 1; reproduce it with: build-fuzz/fuzz_TARGET FILE
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#   targets: llama2c gguf tokenizer_bin tokenizer_json hf h5 tasklog (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama2c gguf tokenizer_bin tokenizer_json hf h5 tasklog)
"$root/scripts/install-deps.sh" --fuzz
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKVPLAN_FUZZ=ON -DKVPLAN_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz --target fuzz_all -j "$(nproc)" >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
failed=()
for t in "${targets[@]}"; do
    corpus=build-fuzz/corpus/$t findings=build-fuzz/findings/$t
    mkdir -p "$corpus" "$findings"
    log=build-fuzz/fuzz-$t.log
    set +e
    "build-fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$findings/" \
        "$corpus" "build-fuzz/fuzz-seeds/$t" >"$log" 2>&1
    rc=$?
    set -e
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    n_find=$(find "$findings" -type f | wc -l)
    echo "fuzz $t: ${secs}s, $runs executions, ${cov:-cov ?}, exit $rc, $n_find finding(s)"
    if [ "$rc" -ne 0 ] || [ "$n_find" -gt 0 ]; then
        failed+=("$t")
        grep -m 30 -E 'ERROR|runtime error|SUMMARY|#[0-9]+ 0x' "$log" | head -30 >&2 || true
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: findings in ${failed[*]} (see build-fuzz/findings/ and build-fuzz/fuzz-*.log)" >&2
    exit 1
fi
