#!/usr/bin/env bash
# The acceptance table of sensitivity planning (issue 13), from the plans a default search
# makes: for each bundled model and R = 1/4, 1/8, 1/16 (sink, C = 512), held-out perplexity
# on the last 2048 tokens of the shared TinyStories text (text no search sees: the search
# reads its first 8192 + 4096 tokens) of
#   plan     the plan, evaluated with its own b_s and p (kvplan eval --plan)
#   uniform  the strongest uniform cache: every head R * C tokens, token by token (b_s = p = 1)
#   full     the full cache
#   grid     the BaKlaVa grid's best cell (t, r from the plan's /search record, re-made with
#            kvplan plan --allocation baklava) at the plan's b_s and p
# and the share of the uniform -> full gap the plan closes.
# Usage: bench/acceptance_sensitivity.sh [PLAN_DIR]   (default: plans/, the shipped plans)
set -euo pipefail
. "$(dirname "$0")/lib_acceptance.sh"
plans=${1:-plans}
text=$shared/text/tinystories_val_head.txt

printf '%-18s %-5s %-6s %-9s %-9s %-9s %-9s %-8s\n' model R "b_s/p" plan uniform full grid \
    "closed"
for name in stories260K tinystories-656k; do
    model=$(acc_model "$name")
    acc_ids "$model" "$text" | tail -n 2048 > "$work/$name.heldout"
    ho=$work/$name.heldout
    full=$(acc_ppl "$model" --tokens "$ho")
    prof=$work/$name.profile.h5
    "$kv" profile "$model" --text "$text" --no-hw --quiet -o "$prof"
    for r in 4 8 16; do
        plan=$plans/$name.r1-$r.h5
        ratio=$(awk "BEGIN { print 1 / $r }")
        p=$(acc_ppl "$model" --tokens "$ho" --plan "$plan")
        u=$(acc_ppl "$model" --tokens "$ho" --ratio "$ratio" --allocation uniform --block-size 1 \
            --evict-block 1)
        js=$("$kv" inspect "$plan" --json)
        bs=$(grep -o '"block_size":[0-9]*' <<<"$js" | head -1 | cut -d: -f2)
        pe=$(grep -o '"evict_block":[0-9]*' <<<"$js" | head -1 | cut -d: -f2)
        best=$(grep -o '"best":{"t":[0-9.eE+-]*,"r":[0-9.eE+-]*' <<<"$js" | head -1)
        gt=$(sed 's/.*"t":\([^,]*\),.*/\1/' <<<"$best")
        gr=$(sed 's/.*"r":\(.*\)/\1/' <<<"$best")
        "$kv" plan --profile "$prof" --model "$model" --ratio "$ratio" --allocation baklava \
            --t "$gt" --r "$gr" --context 512 --block-size "$bs" --evict-block "$pe" --quiet \
            -o "$work/grid.h5" >/dev/null
        grid=$(acc_ppl "$model" --tokens "$ho" --plan "$work/grid.h5")
        closed=$(awk -v p="$p" -v u="$u" -v f="$full" \
            'BEGIN { if (u > f) printf "%.0f%%", 100 * (u - p) / (u - f); else print "-" }')
        printf '%-18s 1/%-3s %-6s %-9.4f %-9.4f %-9.4f %-9.4f %-8s\n' "$name" "$r" "$bs/$pe" \
            "$p" "$u" "$full" "$grid" "$closed"
    done
done
