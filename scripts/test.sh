#!/usr/bin/env bash
# The gates first: clang-format, no issue numbers in the product's comments, functions of at
# most 100 lines (scripts/check-style.sh, check-func-lines.sh); after the build, no cycle of
# calls or includes (check-deps.sh) and the library's exports equal to the public headers'
# declarations (check-symbols.sh). Then set up, build and run every test: the CUnit suites
# under ctest, once in a release build and
# once in an AddressSanitizer + UndefinedBehaviorSanitizer build; then every libFuzzer target
# of tests/fuzz/ for a short fixed time in the clang sanitizer build (scripts/fuzz.sh; any
# finding fails the run). Every ctest label runs (docs/design.md "Testing"); --unit runs only the quick
# tier (ctest -L unit) of the release build, without the sanitizer build and the fuzzers.
# Usage: scripts/test.sh [--no-sanitize] [--no-fuzz] [--unit]   (KVPLAN_FUZZ_SECONDS, default 20)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sanitize=1 fuzz=1 labels=()
for a in "$@"; do
    case "$a" in
        --no-sanitize) sanitize=0 ;;
        --no-fuzz) fuzz=0 ;;
        --unit) labels=(-L unit) sanitize=0 fuzz=0 ;;
        *) echo "usage: scripts/test.sh [--no-sanitize] [--no-fuzz] [--unit]" >&2; exit 1 ;;
    esac
done
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
# the gates on the sources: clang-format, no issue numbers in comments, functions <= 100 lines
scripts/install-deps.sh --lint
scripts/check-style.sh
scripts/check-func-lines.sh
scripts/build.sh build
scripts/check-deps.sh build   # no cycle of calls or includes between files, libraries, headers
scripts/check-symbols.sh build # libkvplan.so exports exactly the public headers' declarations
scripts/check-install.sh build # install + the example program; the CPU binary's footprint
(cd build && ctest --output-on-failure -j 2 "${labels[@]}")
if [ "$sanitize" = 1 ]; then
    scripts/build.sh build-asan -DKVPLAN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
    # every label, the fake CUDA runtime's suites (cuda-fake) included: the host shim's fiber
    # switch is a few instructions under ASan too (tests/support/cuda_shim.cpp)
    (cd build-asan && ctest --output-on-failure -j 2)
fi
if [ "$fuzz" = 1 ]; then
    scripts/fuzz.sh "${KVPLAN_FUZZ_SECONDS:-20}"
fi
