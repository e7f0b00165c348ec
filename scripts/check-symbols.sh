#!/usr/bin/env bash
# The public face of libkvplan, checked (run after a build; scripts/test.sh runs it):
#  1. every header of include/kvplan/ compiles alone, as C11 (-pedantic) and as C++17, with
#     -Wall -Wextra -Werror, as the first and only include of a file;
#  2. the umbrella kvplan/kvplan.h includes every other header of include/kvplan/;
#  3. the dynamic symbols libkvplan.so defines are exactly the functions and objects those
#     headers declare (static inline helpers excepted): nothing internal leaks out (the library
#     is built with -fvisibility=hidden; the headers' KV_API_BEGIN/KV_API_END give their
#     declarations default visibility), and nothing declared is missing.
# The declared functions come from gcc's -aux-info (every prototype of the translation unit
# with the file that declares it); the declared objects from the headers' `extern` lines.
# Usage: scripts/check-symbols.sh [BUILD_DIR]   (default build)
set -euo pipefail
export LC_ALL=C
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
lib=$build/libkvplan.so
[ -e "$lib" ] || { echo "check-symbols: $lib missing: build first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inc=$root/include
rc=0

# 1. each header alone; the prototypes it declares into aux
: >"$tmp/aux"
for h in "$inc"/kvplan/*.h; do
    name=kvplan/$(basename "$h")
    printf '#include "%s"\n' "$name" >"$tmp/one.c"
    if ! gcc -std=c11 -Wall -Wextra -Werror -pedantic -I"$inc" -c "$tmp/one.c" -o "$tmp/one.o" \
        -aux-info "$tmp/one.aux" 2>"$tmp/err"; then
        echo "check-symbols: $name does not compile alone (C11):" >&2
        sed 's/^/  /' "$tmp/err" >&2
        rc=1
        continue
    fi
    cat "$tmp/one.aux" >>"$tmp/aux"
    cp "$tmp/one.c" "$tmp/one.cpp"
    # (search.h's inline kv_search_engine names some kv_engine_opts members only)
    if ! g++ -std=c++17 -Wall -Wextra -Werror -Wno-missing-field-initializers -I"$inc" \
        -fsyntax-only "$tmp/one.cpp" 2>"$tmp/err"; then
        echo "check-symbols: $name does not compile alone (C++17):" >&2
        sed 's/^/  /' "$tmp/err" >&2
        rc=1
    fi
done

# 2. the umbrella includes them all
for h in "$inc"/kvplan/*.h; do
    b=$(basename "$h")
    [ "$b" = kvplan.h ] && continue
    if ! grep -q "^#include \"kvplan/$b\"" "$inc/kvplan/kvplan.h"; then
        echo "check-symbols: include/kvplan/kvplan.h does not include kvplan/$b" >&2
        rc=1
    fi
done

# 3. declared == exported. aux lines: /* /path/include/kvplan/x.h:12:NC */ extern int f (..);
grep -F "/* $inc/kvplan/" "$tmp/aux" | sed 's|^/\* [^ ]* \*/ ||' | grep -v '^static ' |
    sed 's/ (.*$//; s/.*[ *]//' >"$tmp/declared"
grep -h '^extern ' "$inc"/kvplan/*.h | grep -v '"C"' | grep -v '(' |
    sed 's/[[;=].*$//; s/[[:space:]]*$//; s/.*[ *]//' >>"$tmp/declared"
sort -u "$tmp/declared" -o "$tmp/declared"
nm -D --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[TDRBVWGS]$/ {print $3}' | sort -u \
    >"$tmp/exported"
comm -13 "$tmp/declared" "$tmp/exported" >"$tmp/leaked"
comm -23 "$tmp/declared" "$tmp/exported" >"$tmp/missing"
if [ -s "$tmp/leaked" ]; then
    echo "check-symbols: libkvplan.so exports $(wc -l <"$tmp/leaked") symbols no public header" \
        "declares (declare them in include/kvplan/ or keep them out of KV_API_BEGIN/END):" >&2
    sed 's/^/  /' "$tmp/leaked" >&2
    rc=1
fi
if [ -s "$tmp/missing" ]; then
    echo "check-symbols: $(wc -l <"$tmp/missing") functions or objects declared in" \
        "include/kvplan/ are not exported by libkvplan.so (undefined, or declared outside" \
        "KV_API_BEGIN/END):" >&2
    sed 's/^/  /' "$tmp/missing" >&2
    rc=1
fi
if [ "$rc" = 0 ]; then
    echo "check-symbols: $(ls "$inc"/kvplan/*.h | wc -l) public headers compile alone and the" \
        "umbrella includes them; libkvplan.so exports exactly their $(wc -l <"$tmp/declared")" \
        "declarations"
fi
exit $rc
