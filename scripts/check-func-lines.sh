#!/usr/bin/env bash
# Fails when a function of the product's code (cli/, planner/, profiler/, runtime/, cuda/,
# include/) is longer than 100 lines, signature to closing brace (scripts/func-lines.sh counts
# them: top-level functions whose body closes at column 0).
# Usage: scripts/check-func-lines.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
max=100
shopt -s nullglob
files=(cli/*.c cli/*.h planner/*.c planner/*.h profiler/*.c profiler/*.h runtime/*/*.c
    runtime/*/*.h include/kvplan/*.h cuda/*.cu cuda/*.h cuda/kernels/*.cuh)
rc=0 n=0
while read -r lines name where; do
    [ "$lines" -gt "$max" ] || continue
    echo "check-func-lines: $name $where: $lines lines (at most $max)" >&2
    rc=1
done < <(scripts/func-lines.sh '.*' "${files[@]}")
n=$(scripts/func-lines.sh '.*' "${files[@]}" | wc -l)
if [ "$rc" = 0 ]; then
    echo "check-func-lines: $n functions in ${#files[@]} files, none over $max lines"
fi
exit $rc
