#!/usr/bin/env bash
# Install missing Debian packages, then configure and build kvplan.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]   (default BUILD_DIR: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}
shift || true
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$root/$dir" -j "$(nproc)"
