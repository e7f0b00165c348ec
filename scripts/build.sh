#!/usr/bin/env bash
# Install missing Debian packages, then configure and build kvplan.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]   (default BUILD_DIR: build)
# KVPLAN_TARGETS="t1 t2": build only those targets (default: everything, tests included);
# scripts/demo.sh builds `kvplan` alone this way.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}
shift || true
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=()
for t in ${KVPLAN_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$root/$dir" -j "$(nproc)" "${targets[@]}"
