#!/usr/bin/env bash
# Re-make the plans shipped in plans/: for each bundled model, a profile (similarity only,
# no hardware figures, so the plans are reproducible on any machine), then `kvplan search` with
# its defaults at R = 1/4, 1/8 and 1/16 with the sink policy at context 512: sensitivity
# planning (measured per-head loss curves, sparse: docs/planner-search.md; knapsack, refinement)
# and the BaKlaVa grid (190 points by successive halving); the better on the search tokens is the
# plan. The block size and the
# Batch-Max eviction block are the search's defaults, chosen from R and C (b_s = p = 4 at
# R = 1/16, 8 at 1/8, 16 at 1/4 for C = 512), so budget can move between heads at every ratio;
# the plan's eviction block is then measured among p, p/2, ..., 1 on the search tokens.
# Calibration is on two texts (bench/robust_texts.sh builds them in a temporary
# directory): the TinyStories text and the plain text of three of the papers in ../shared/papers
# (000-002). Profile and search share their prompts and tokens evenly between the two; the
# search's guard then checks the plan against the uniform cache (b_s = p = 1) on each text's
# calibration and held-out chunks and falls back towards uniform where it loses
# (/search/texts). Papers 003-004, the vocab test strings and the end of the TinyStories text
# stay unseen for bench/acceptance_robust.sh.
# Usage: scripts/make-plans.sh [OUT_DIR]  (default plans/; about 40 minutes on 2 cores)
# Environment: RATIOS (default "4 8 16": the 1/R made), MODELS (default "stories260K
# tinystories-656k"), SEARCH_ARGS (extra `kvplan search` options, e.g. a coarser grid for a
# quick check; the shipped plans use none).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
shared=${KVPLAN_SHARED:-$root/../shared}
scripts/build.sh build
kv=build/kvplan
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
out_dir=${1:-plans}
mkdir -p "$out_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bench/robust_texts.sh "$work/texts" > "$work/calib.list"
texts=()
while read -r t; do texts+=(--text "$t"); done < "$work/calib.list"
declare -A model_of=([stories260K]=$shared/models/stories260K/stories260K.bin
                     [tinystories-656k]=$shared/models/tinystories-656k)
read -r -a extra <<< "${SEARCH_ARGS:-}"
for name in ${MODELS:-stories260K tinystories-656k}; do
    model=${model_of[$name]:?unknown model $name (stories260K or tinystories-656k)}
    $kv profile "$model" "${texts[@]}" --no-hw --quiet -o "$work/$name.profile.h5"
    for r in ${RATIOS:-4 8 16}; do
        ratio=$(awk "BEGIN { print 1 / $r }")
        out=$out_dir/$name.r1-$r.h5
        echo "== $name, R = 1/$r -> $out" >&2
        $kv search --profile "$work/$name.profile.h5" --model "$model" "${texts[@]}" \
            --ratio "$ratio" --policy sink --context 512 --quiet "${extra[@]}" -o "$out"
    done
done
