#!/usr/bin/env bash
# Fails when the product's code calls in a circle: between two source files, or between two of
# the libraries (the runtime's rooms, profiler, planner, cli). An edge A -> B means an object of
# A uses a symbol that B defines (nm over the built objects, so it sees calls, not includes).
# Usage: scripts/check-deps.sh [BUILD_DIR]   (default build; run after a build)
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
libs=(util model tokenizer cache backend engine offload profiler planner cli)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# defined symbols: "symbol lib file"; undefined: "symbol lib file"
for lib in "${libs[@]}"; do
    dir=$build/CMakeFiles/kvplan_$lib.dir
    [ -d "$dir" ] || { echo "check-deps: $dir missing: build first" >&2; exit 1; }
    while IFS= read -r -d '' o; do
        f=${o#"$dir/"}
        f=${f%.o}
        nm --defined-only -g "$o" | awk -v l="$lib" -v f="$f" 'NF == 3 && $2 ~ /[TDBRVW]/ {print $3, l, f}' >>"$tmp/def"
        nm -u "$o" | awk -v l="$lib" -v f="$f" '{print $NF, l, f}' >>"$tmp/use"
    done < <(find "$dir" -name '*.o' -print0)
done
sort -k1,1 "$tmp/def" >"$tmp/def.s"
sort -k1,1 "$tmp/use" >"$tmp/use.s"
# join on the symbol: user lib/file -> definer lib/file
join "$tmp/use.s" "$tmp/def.s" >"$tmp/edges"
awk '$3 != $5 {print $3, $5}' "$tmp/edges" | sort -u >"$tmp/file_edges"
awk '$2 != $4 {print $2, $4}' "$tmp/edges" | sort -u >"$tmp/lib_edges"
rc=0
for kind in file lib; do
    if ! tsort "$tmp/${kind}_edges" >/dev/null 2>"$tmp/${kind}_loop"; then
        echo "check-deps: a call cycle between ${kind}s:" >&2
        grep -v "input contains a loop" "$tmp/${kind}_loop" | sed 's/^tsort: /  /' >&2
        rc=1
    fi
done
if [ "$rc" = 0 ]; then
    echo "check-deps: no cycle between $(awk '{print $1; print $2}' "$tmp/file_edges" | sort -u | wc -l) files or ${#libs[@]} libraries ($(wc -l <"$tmp/lib_edges") library edges)"
fi
exit $rc
