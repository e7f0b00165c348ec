#!/usr/bin/env bash
# Fails when the product's code (cli/, planner/, profiler/, runtime/, cuda/, include/) is not in
# the .clang-format style (clang-format --dry-run -Werror), or when a comment of the product
# (those files, CMakeLists.txt, scripts/) cites "issue N" of a tracker outside the repository:
# a comment says what the code does and why, and docs/ keeps the records.
# Usage: scripts/check-style.sh     (clang-format: scripts/install-deps.sh --lint)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v clang-format >/dev/null ||
    { echo "check-style: clang-format missing: run scripts/install-deps.sh --lint" >&2; exit 1; }
shopt -s nullglob
files=(cli/*.c cli/*.h planner/*.c planner/*.h profiler/*.c profiler/*.h runtime/*/*.c
    runtime/*/*.h include/kvplan/*.h cuda/*.cu cuda/*.h cuda/kernels/*.cuh)
rc=0 bad=()
for f in "${files[@]}"; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "check-style: ${#bad[@]} of ${#files[@]} files are not formatted (clang-format -i FILE;" \
        "clang-format --dry-run FILE shows where):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    rc=1
fi
# this script names the pattern, so it is left out
if grep -nE '[Ii]ssues? ?#?[0-9]+' "${files[@]}" CMakeLists.txt \
    $(ls scripts/* | grep -v '^scripts/check-style.sh$') >&2; then
    echo "check-style: the comments above cite an issue number; say what the code does instead" >&2
    rc=1
fi
if [ "$rc" = 0 ]; then
    echo "check-style: ${#files[@]} files formatted; no issue numbers in the product's comments"
fi
exit $rc
