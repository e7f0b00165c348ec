#!/usr/bin/env bash
# What an outside user of kvplan gets: `cmake --install` into a fresh prefix, then the example
# program (examples/plan_budgets.c) built against it twice, with pkg-config and with CMake's
# find_package, and run on a shipped plan; and the CPU binary's footprint: no CUDA library
# linked, `kvplan --help` under 40 MB peak RSS (the CUDA backend is a plugin, opened only for a
# CUDA run). Usage: scripts/check-install.sh [BUILD_DIR]   (after a build; default build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check-install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(cd "$tmp/prefix" && ls -d lib*/pkgconfig | head -1 | xargs dirname)
export PKG_CONFIG_PATH="$tmp/prefix/$libdir/pkgconfig" LD_LIBRARY_PATH="$tmp/prefix/$libdir"
plan="$root/plans/stories260K.r1-8.h5"

# 1. pkg-config
cc -std=c11 -Wall -Wextra -Werror "$root/examples/plan_budgets.c" \
    $(pkg-config --cflags --libs kvplan) -o "$tmp/plan_budgets_pc"
"$tmp/plan_budgets_pc" "$plan" >"$tmp/out_pc"
# 2. CMake package
cmake -S "$root/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/ex" >/dev/null
"$tmp/ex/plan_budgets" "$plan" >"$tmp/out_cmake"
cmp -s "$tmp/out_pc" "$tmp/out_cmake" || fail "the two example builds print different plans"
# the example's budgets are the ones kvplan inspect reads from the same file
layers=$(grep -c '^layer ' "$tmp/out_pc")
want=$(h5dump -d /budget/tokens -H "$plan" | sed -n 's/.*DATASPACE  SIMPLE { ( \([0-9]*\), .*/\1/p')
[ "$layers" = "$want" ] || fail "example printed $layers layers, the plan has $want"
total=$(sed -n 's/^total \([0-9]*\) tokens.*/\1/p' "$tmp/out_pc")
sum=$(h5dump -d /budget/tokens -w 0 "$plan" | sed -n '/   DATA {/,/^   }/p' |
    sed 's/([0-9,]*)://g' | grep -o '[0-9][0-9]*' | awk '{s += $1} END {print s}')
[ "$total" = "$sum" ] || fail "example's total $total tokens != the file's $sum"
echo "check-install: example built with pkg-config and CMake: $layers layers, $total tokens"

# 3. the CPU binary links no CUDA library and starts small
if ldd "$tmp/prefix/bin/kvplan" | grep -Ei 'libcuda|libcublas'; then
    fail "the kvplan binary links a CUDA library (it must come through the plugin)"
fi
rss=$(/usr/bin/time -f '%M' "$tmp/prefix/bin/kvplan" --help 2>&1 >/dev/null | tail -1)
[ "$rss" -le 40960 ] || fail "kvplan --help peaks at $rss KiB (limit 40960)"
echo "check-install: installed kvplan links no CUDA library; --help peak RSS $rss KiB"
