#!/usr/bin/env bash
# kvplan search --estimate against the search it projects, on this machine: for each case, the
# estimate (--json) and right after it the same search under /usr/bin/time, with the load
# average before and after; then per stage the estimate's CPU and wall seconds beside the
# search's /search/timing record and the totals (bench/estimate_accuracy.py).
# Usage: bench/estimate_accuracy.sh [CASE...]   CASE: MODEL:R[:extra search flags, comma-separated]
#   (default: stories260K:16 stories260K:8 tinystories-656k:16). REPEAT=n runs each case n times;
#   KVPLAN_BIN: the kvplan binary (default build/kvplan).
set -euo pipefail
. "$(dirname "$0")/lib_acceptance.sh"
kv=${KVPLAN_BIN:-$kv} # a copy of the binary, to rebuild meanwhile
export KVPLAN_BIN=$kv
text=$shared/text/tinystories_val_head.txt
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(stories260K:16 stories260K:8 tinystories-656k:16)
load() { cut -d' ' -f1 /proc/loadavg; }
for c in "${cases[@]}"; do
    IFS=: read -r name r extra <<<"$c"
    model=$(acc_model "$name")
    prof=$work/$name.profile.h5
    [ -f "$prof" ] || "$kv" profile "$model" --text "$text" --no-hw --quiet -o "$prof"
    ratio=$(awk "BEGIN { print 1 / $r }")
    # shellcheck disable=SC2206
    flags=(--profile "$prof" --model "$model" --text "$text" --ratio "$ratio" --policy sink
        --context 512 ${extra//,/ })
    for i in $(seq 1 "${REPEAT:-1}"); do
        l0=$(load)
        "$kv" search --estimate "${flags[@]}" --json > "$work/est.json"
        /usr/bin/time -f "%e %U %S" -o "$work/time" "$kv" search "${flags[@]}" --quiet \
            -o "$work/plan.h5" > /dev/null
        l1=$(load)
        python3 "$root/bench/estimate_accuracy.py" "$work/est.json" "$work/plan.h5" \
            "$work/time" "$l0" "$l1" "$name R 1/$r ${extra//,/ } (run $i)"
        echo
    done
done
