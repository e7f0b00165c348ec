#!/usr/bin/env bash
# The calibration and held-out texts of the multi-text search (issue 24), built from ../shared
# into DIR (nothing is copied into the repository):
#   calibration  ../shared/text/tinystories_val_head.txt (used in place: the search reads its
#                first tokens) and DIR/papers_calib.txt = papers 000 + 001 + 002 of
#                ../shared/papers (Batch-Max, KV-Compress, KVPR: technical English)
#   held-out     DIR/papers_article.txt = paper 003 (the KV-cache article),
#                DIR/papers_baklava.txt = paper 004 (BaKlaVa), DIR/vocab_tests.txt = llama.cpp's
#                tokenizer test strings (../shared/vocab/ggml-vocab-llama-spm.gguf.inp; the six
#                .inp files there are identical), and the last tokens of the TinyStories text
#                (the acceptance script cuts those from the token ids).
# Usage: bench/robust_texts.sh DIR   (prints the calibration texts, one path a line)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${KVPLAN_SHARED:-$root/../shared}
dir=${1:?usage: bench/robust_texts.sh DIR}
mkdir -p "$dir"
p=$shared/papers
cat "$p"/000_*.txt "$p"/001_*.txt "$p"/002_*.txt > "$dir/papers_calib.txt"
cp "$p"/003_*.txt "$dir/papers_article.txt"
cp "$p"/004_*.txt "$dir/papers_baklava.txt"
cp "$shared/vocab/ggml-vocab-llama-spm.gguf.inp" "$dir/vocab_tests.txt"
printf '%s\n' "$shared/text/tinystories_val_head.txt" "$dir/papers_calib.txt"
