#!/usr/bin/env bash
# Installs the Debian packages kvplan builds and tests with, only when some are missing.
# Usage: scripts/install-deps.sh [--fuzz] [--lint]   (root, or sudo available)
#   --fuzz  also clang and its libFuzzer / sanitizer runtime (scripts/fuzz.sh, the CI fuzz runs)
#   --lint  also clang-format (scripts/check-style.sh, run by scripts/test.sh)
set -euo pipefail
pkgs=(build-essential cmake pkg-config
      libopenblas-dev libhdf5-dev hdf5-tools libgsl-dev libglpk-dev libcunit1-dev
      libcjson-dev libmicrohttpd-dev libpcre2-dev libpng-dev libcairo2-dev libssl-dev zlib1g-dev
      libopenmpi-dev openmpi-bin time
      clang) # clang: the CUDA performance model's load tracer (tests/cuda_model/kprobe.cpp)
for a in "$@"; do
    case "$a" in
        # Debian 12: clang is clang 14; libFuzzer (libclang_rt.fuzzer) is in libclang-rt-14-dev
        --fuzz) pkgs+=(clang libclang-rt-14-dev libomp-dev) ;;
        --lint) pkgs+=(clang-format) ;; # 14 on Debian 12, the version .clang-format is written for
        *) echo "usage: scripts/install-deps.sh [--fuzz] [--lint]" >&2; exit 1 ;;
    esac
done
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
