#!/usr/bin/env bash
# Fails when the product's code depends in a circle:
#  - between two source files: A -> B when an object of A uses a symbol that B defines (nm over
#    the built objects), or when A calls a static inline function that a header of B defines
#    (the calls nm cannot see; a header belongs to the source file of its name:
#    include/kvplan/search.h to planner/search.c);
#  - between two of the libraries (the runtime's rooms, profiler, planner, cli): those calls,
#    and a file of one including a header of the other;
#  - between headers: their #include graph.
# Usage: scripts/check-deps.sh [BUILD_DIR]   (default build; run after a build)
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
libs=(util quant model tokenizer cache backend engine offload profiler planner cli)
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
# includes: the quoted includes of every product source and header, resolved as the build does
# (the file's directory, include/, runtime/, the root)
cd "$root"
shopt -s nullglob
for f in cli/*.[ch] planner/*.[ch] profiler/*.[ch] runtime/*/*.[ch] include/kvplan/*.h; do
    echo "$f"
done >"$tmp/files"
# "file unit lib": a header's unit is the source file of its name (include/kvplan/search.h:
# planner/search.c), "-" when there is none; its library that of its unit, else that of its
# directory ("-" for a public header of no source file)
awk -F/ '
  { path[NR] = $0; split($NF, a, "."); if ($NF ~ /\.c$/) unit_of_base[a[1]] = $0 }
  END {
    for (i = 1; i <= NR; i++) {
      p = path[i]; m = split(p, q, "/"); split(q[m], a, "."); u = "-"
      if (p ~ /\.c$/) u = p
      else if (a[1] in unit_of_base) u = unit_of_base[a[1]]
      split(u != "-" ? u : p, r, "/"); lib = r[1] == "runtime" ? r[2] : r[1]
      print p, u, (lib == "include" ? "-" : lib)
    }
  }' "$tmp/files" >"$tmp/units"
while read -r f _ _; do
    d=$(dirname "$f")
    sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f" | while read -r h; do
        for c in "$d/$h" "include/$h" "runtime/$h" "$h"; do
            if [ -f "$c" ]; then echo "$f ${c#./}"; break; fi
        done
    done
done <"$tmp/units" >"$tmp/includes"
# header -> header includes (their own graph), and library -> library includes
awk 'NR == FNR { l[$1] = $3; next }
     $1 ~ /\.h$/ && $2 ~ /\.h$/ { print $1, $2 >"'"$tmp"'/header_edges" }
     ($2 in l) && l[$1] != "-" && l[$2] != "-" && l[$1] != l[$2] {
       print l[$1], l[$2] >"'"$tmp"'/inc_lib_edges" }' "$tmp/units" "$tmp/includes"
# calls that nm cannot see: the static inline functions a header defines, called from a
# source file other than the header's unit
: >"$tmp/inline_edges"
while read -r h u _; do
    case "$h" in *.h) ;; *) continue ;; esac
    [ "$u" = - ] && continue
    sed -n 's/^static inline [^(]*[ *]\([a-zA-Z_][a-zA-Z0-9_]*\)(.*/\1/p' "$h" | while read -r fn; do
        grep -lw "$fn" $(awk '$1 ~ /\.c$/ {print $1}' "$tmp/units") | grep -vx "$u" |
            sed "s|\$| $u|" || true
    done
done <"$tmp/units" >>"$tmp/inline_edges"
touch "$tmp/header_edges" "$tmp/inc_lib_edges"
sort -k1,1 "$tmp/def" >"$tmp/def.s"
sort -k1,1 "$tmp/use" >"$tmp/use.s"
# join on the symbol: user lib/file -> definer lib/file
join "$tmp/use.s" "$tmp/def.s" >"$tmp/edges"
{ awk '$3 != $5 {print $3, $5}' "$tmp/edges"; cat "$tmp/inline_edges"; } | sort -u \
    >"$tmp/file_edges"
{ awk '$2 != $4 {print $2, $4}' "$tmp/edges"; cat "$tmp/inc_lib_edges"; } | sort -u \
    >"$tmp/lib_edges"
rc=0
sort -u "$tmp/header_edges" -o "$tmp/header_edges"
for kind in file lib header; do
    if ! tsort "$tmp/${kind}_edges" >/dev/null 2>"$tmp/${kind}_loop"; then
        echo "check-deps: a cycle between ${kind}s:" >&2
        grep -v "input contains a loop" "$tmp/${kind}_loop" | sed 's/^tsort: /  /' >&2
        rc=1
    fi
done
if [ "$rc" = 0 ]; then
    echo "check-deps: no cycle between $(awk '{print $1; print $2}' "$tmp/file_edges" |
        sort -u | wc -l) files ($(wc -l <"$tmp/inline_edges") through inline functions)," \
        "${#libs[@]} libraries ($(wc -l <"$tmp/lib_edges") edges, calls and includes) or" \
        "$(awk '{print $1; print $2}' "$tmp/header_edges" | sort -u | wc -l) headers"
fi
exit $rc
