#!/usr/bin/env bash
# The acceptance table of plans that choose tokens and KV storage types per head (issue 22),
# from fresh default searches into a temporary directory: for each bundled model and
# R = 1/16, 1/8, 1/4 of the full F16 cache's bytes (sink, C = 512), held-out perplexity on the
# last 2048 tokens of the shared TinyStories text (no search sees them: a search reads its first
# 8192 + 4096 tokens) of
#   plan     the searched plan (kvplan eval --plan: its own b_s, p and per-head KV types)
#   uniform  tokens-only F16, every head R * C tokens, token by token (b_s = p = 1)
#   q8, q4   the same uniform cache stored in q8 / q4 at the same bytes (more tokens per head)
#   full     the full F16 cache
# the share of the uniform -> full gap the plan closes, the plan's heads per type, its bytes
# (kvplan inspect) and the engine's peak bytes while evaluating it, and whether the peak is
# within the plan's bytes plus one block per head.
# Usage: bench/acceptance_kvtypes.sh [MODEL...]   (stories260K, tinystories-656k; default both)
# Environment: RATIOS (default "16 8 4"), KEEP_DIR (keep the plans there), REUSE (with KEEP_DIR:
# take a plan already there instead of searching again), SEARCH_FLAGS (extra search options;
# empty = the defaults).
set -euo pipefail
. "$(dirname "$0")/lib_acceptance.sh"
text=$shared/text/tinystories_val_head.txt
out_dir=${KEEP_DIR:-$work}
mkdir -p "$out_dir"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(stories260K tinystories-656k)


printf '%-16s %-5s %-5s %-8s %-8s %-8s %-8s %-8s %-7s %-17s %-13s %s\n' model R "b_s/p" plan \
    uniform q8 q4 full closed "types f16/q8/q4" "bytes plan" "peak (<= +1 blk/head)"
for name in "${models[@]}"; do
    model=$(acc_model "$name")
    acc_ids "$model" "$text" | tail -n 2048 > "$work/$name.heldout"
    ho=$work/$name.heldout
    full=$(acc_ppl "$model" --tokens "$ho")
    prof=$work/$name.profile.h5
    "$kv" profile "$model" --text "$text" --no-hw --quiet -o "$prof"
    for r in ${RATIOS:-16 8 4}; do
        ratio=$(awk "BEGIN { print 1 / $r }")
        plan=$out_dir/$name.r1-$r.h5
        if [ -n "${REUSE:-}" ] && [ -f "$plan" ]; then
            echo "acceptance_kvtypes.sh: reusing $plan (REUSE set)" >&2
        else
        # shellcheck disable=SC2086
        "$kv" search --profile "$prof" --model "$model" --text "$text" --ratio "$ratio" \
            --policy sink --context 512 --quiet ${SEARCH_FLAGS:-} -o "$plan" > "$work/search.out"
        fi
        pj=$(acc_eval "$model" --tokens "$ho" --plan "$plan")
        p=$(sed -n 's/.*"perplexity":\([0-9.eE+-]*\).*/\1/p' <<<"$pj")
        peak=$(grep -o '"kv_bytes_peak":[0-9]*' <<<"$pj" | cut -d: -f2)
        uni="--ratio $ratio --allocation uniform --block-size 1 --evict-block 1"
        # shellcheck disable=SC2086
        u=$(acc_ppl "$model" --tokens "$ho" $uni)
        # shellcheck disable=SC2086
        u8=$(acc_ppl "$model" --tokens "$ho" $uni --kv-type q8)
        # shellcheck disable=SC2086
        u4=$(acc_ppl "$model" --tokens "$ho" $uni --kv-type q4)
        js=$("$kv" inspect "$plan" --json)
        bs=$(grep -o '"block_size":[0-9]*' <<<"$js" | head -1 | cut -d: -f2)
        pe=$(grep -o '"evict_block":[0-9]*' <<<"$js" | head -1 | cut -d: -f2)
        bytes=$(grep -o '"kv_bytes":[0-9]*' <<<"$js" | head -1 | cut -d: -f2)
        types=$(grep -o '"kv_types":\[\[[^]]*\]\(,\[[^]]*\]\)*\]' <<<"$js" | head -1)
        n16=$( (grep -o '"f16"' <<<"$types" || true) | wc -l)
        n8=$( (grep -o '"q8"' <<<"$types" || true) | wc -l)
        n4=$( (grep -o '"q4"' <<<"$types" || true) | wc -l)
        # one block per head: b_s tokens of the plan's widest stored type (f16 here)
        heads=$(( n16 + n8 + n4 ))
        hd=$(grep -o '"model_head_dim":[0-9]*' <<<"$js" | head -1 | cut -d: -f2)
        slack=$(( heads * bs * 4 * hd ))
        ok=$(awk -v a="$peak" -v b="$bytes" -v s="$slack" 'BEGIN { print (a <= b + s) ? "yes" : "NO" }')
        closed=$(awk -v p="$p" -v u="$u" -v f="$full" \
            'BEGIN { if (u > f) printf "%.0f%%", 100 * (u - p) / (u - f); else print "-" }')
        printf '%-16s 1/%-3s %-5s %-8.4f %-8.4f %-8.4f %-8.4f %-8.4f %-7s %-17s %-13s %s %s\n' \
            "$name" "$r" "$bs/$pe" "$p" "$u" "$u8" "$u4" "$full" "$closed" "$n16/$n8/$n4" \
            "$bytes" "$peak" "$ok"
    done
done
