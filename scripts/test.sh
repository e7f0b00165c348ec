#!/usr/bin/env bash
# Set up, build and run every test: the CUnit suites under ctest, once in a release build and
# once in an AddressSanitizer + UndefinedBehaviorSanitizer build.
# Usage: scripts/test.sh [--no-sanitize]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
scripts/build.sh build
(cd build && ctest --output-on-failure -j 2)
if [ "${1:-}" != "--no-sanitize" ]; then
    scripts/build.sh build-asan -DKVPLAN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
    (cd build-asan && ctest --output-on-failure -j 2)
fi
