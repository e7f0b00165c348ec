#!/usr/bin/env bash
# The acceptance table of issue 24 (plans that hold off their calibration text): for each
# bundled model and R = 1/16, 1/8, 1/4 (sink, C = 512), `kvplan eval` perplexity on texts no
# search sees (the searches of scripts/make-plans.sh read the first 4096 + 2048 tokens of the
# TinyStories text and of papers 000-002, bench/robust_texts.sh):
#   ts_tail         the last 2048 tokens of ../shared/text/tinystories_val_head.txt
#   paper_article   the first 2048 tokens of ../shared/papers/003_* (the KV-cache article)
#   paper_baklava   the first 2048 tokens of ../shared/papers/004_* (BaKlaVa)
#   vocab_tests     llama.cpp's tokenizer test strings (../shared/vocab/*.inp), whole chunks
# of
#   plan     the plan, with its own b_s and p (kvplan eval --plan)
#   uniform  the strongest uniform cache: --ratio R --allocation uniform --block-size 1
#            --evict-block 1
#   full     the full cache
# the ratio plan / uniform (acceptance: <= 1.005 on every text) and the share of the
# uniform -> full gap the plan closes where uniform is worse than full by more than 0.5% ("-"
# where the full cache is the worse one or the gap is too small to be a share of anything).
# Usage: bench/acceptance_robust.sh [PLAN_DIR]  (default: fresh plans from scripts/make-plans.sh
# in a temporary directory, about 40 minutes on 2 cores; SEARCH_ARGS is passed on to it)
set -euo pipefail
. "$(dirname "$0")/lib_acceptance.sh"
plans=${1:-}
if [ -z "$plans" ]; then
    plans=$work/plans
    scripts/make-plans.sh "$plans" >&2
fi
bench/robust_texts.sh "$work/texts" > /dev/null


printf '%-17s %-5s %-14s %-6s %-10s %-10s %-10s %-9s %-7s\n' model R text tokens plan uniform \
    full plan/unif closed
for name in stories260K tinystories-656k; do
    model=$(acc_model "$name")
    acc_ids "$model" "$shared/text/tinystories_val_head.txt" | tail -n 2048 > "$work/ts_tail"
    acc_ids "$model" "$work/texts/papers_article.txt" > "$work/all"
    head -n 2048 "$work/all" > "$work/paper_article"
    acc_ids "$model" "$work/texts/papers_baklava.txt" > "$work/all"
    head -n 2048 "$work/all" > "$work/paper_baklava"
    acc_ids "$model" "$work/texts/vocab_tests.txt" > "$work/vocab_all"
    n=$(wc -l < "$work/vocab_all")
    head -n $((n / 512 * 512)) "$work/vocab_all" > "$work/vocab_tests"
    for text in ts_tail paper_article paper_baklava vocab_tests; do
        f=$work/$text
        full=$(acc_ppl "$model" --tokens "$f")
        for r in 16 8 4; do
            plan=$plans/$name.r1-$r.h5
            [ -f "$plan" ] || { printf '%-17s 1/%-3s %-14s (no plan %s)\n' "$name" "$r" "$text" "$plan"; continue; }
            ratio=$(awk "BEGIN { print 1 / $r }")
            p=$(acc_ppl "$model" --tokens "$f" --plan "$plan")
            u=$(acc_ppl "$model" --tokens "$f" --ratio "$ratio" --allocation uniform \
                --block-size 1 --evict-block 1)
            awk -v m="$name" -v r="1/$r" -v t="$text" -v n="$(wc -l < "$f")" -v p="$p" \
                -v u="$u" -v f="$full" 'BEGIN {
                    c = u > 1.005 * f ? sprintf("%.0f%%", 100 * (u - p) / (u - f)) : "-";
                    printf "%-17s %-5s %-14s %-6s %-10.4f %-10.4f %-10.4f %-9.4f %-7s%s\n",
                        m, r, t, n, p, u, f, p / u, c, p <= 1.005 * u ? "" : "  > 1.005 x uniform" }'
        done
    done
done
