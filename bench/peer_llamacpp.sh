#!/usr/bin/env bash
# The peer benchmark (issue 23 item 5): kvplan against llama.cpp's own CPU build on the same
# GGUF files, on this machine. Not part of CI.
#
#   bench/peer_llamacpp.sh [--pairs N] [--threads N] [--types F32,F16,Q8_0,Q4_0,Q4_K]
#                          [--prompt T] [--decode D] [--ppl TOKENS] [--build DIR]
#
# llama.cpp: the prebuilt CPU libraries of the npm package @node-llama-cpp/linux-x64 3.22.1
# (libllama, libggml, libggml-base; the CPU backend variants libggml-cpu-*.so are loaded from
# GGML_BACKEND_DIR), installed with node-llama-cpp 3.22.1 into ${KVPLAN_PEERS:-~/.cache/
# kvplan-peers} when missing, outside the repository (NODE_LLAMA_CPP_SKIP_DOWNLOAD=true, install
# scripts off: nothing is compiled or downloaded by the package). The headers come from the
# llama.cpp source node-llama-cpp bundles (llama/gitRelease.bundle, a git bundle). Our own
# driver, bench/peer_llamacpp.c, is compiled against them there (never through Node: its
# one-token decodes run 2.5-4x slower). kvplan's side is build/bench_quant --peer.
#
# The model: bench_quant's synthetic 768-dim, 12-layer, GQA 12/4, FFN 2048, vocab 32000 model,
# written in each type by kvplan's GGUF writer (bench_quant --write-gguf). Per type, N pairs of
# runs interleaved (kvplan, llama.cpp, kvplan, llama.cpp, ...): a 512-token prefill and 128
# greedy decode steps each, the same token ids, K/V in F16 for both (their defaults), flash
# attention off; printed: the median ratio kvplan / llama.cpp of tokens per second over the
# pairs with min and max (> 1: kvplan faster). Then the perplexity agreement row per type:
# mean next-token NLL of both over --ppl tokens (chunks of 512) with an F32 KV cache.
#
# llama.cpp's 2-thread decode collapses when anything else runs on a 2-core machine (its
# threads spin-wait at barriers): the load average is printed before and after; time on an idle
# machine for figures to quote.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pairs=5 threads=2 types=F32,F16,Q8_0,Q4_0,Q4_K prompt=512 decode=128 ppl=2048
build=$root/build
while [ $# -gt 0 ]; do
    case $1 in
    --pairs) pairs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --ppl) ppl=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--pairs N] [--threads N] [--types LIST] [--prompt T] [--decode D] [--ppl TOKENS] [--build DIR]" >&2; exit 1 ;;
    esac
done

peers=${KVPLAN_PEERS:-$HOME/.cache/kvplan-peers}
version=3.22.1
pkg=$peers/node_modules/node-llama-cpp
bins=$peers/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
case $peers in "$root"/*) echo "KVPLAN_PEERS must be outside the repository" >&2; exit 1 ;; esac
mkdir -p "$peers"

# 1. the package, when missing (or another version)
have=$(node -p "require('$pkg/package.json').version" 2>/dev/null || true)
if [ "$have" != "$version" ] || [ ! -d "$bins" ]; then
    command -v npm >/dev/null || { echo "npm is needed (apt-get install npm)" >&2; exit 1; }
    echo "installing node-llama-cpp@$version into $peers" >&2
    NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix "$peers" --no-audit --no-fund \
        --ignore-scripts --omit=optional "node-llama-cpp@$version" \
        "@node-llama-cpp/linux-x64@$version" >&2
fi
lib() { # the one library matching $1 in $bins (versioned names: libllama.v0.5.0.so)
    local f
    f=$(ls "$bins"/$1 2>/dev/null | head -1)
    [ -n "$f" ] || { echo "no $1 in $bins" >&2; exit 1; }
    echo "$f"
}
libllama=$(lib 'libllama.*so') libggml=$(lib 'libggml.*so') libbase=$(lib 'libggml-base.so')

# 2. the headers of the bundled llama.cpp source
if [ ! -f "$peers/include/llama.h" ] || [ ! -f "$peers/ggml/include/ggml.h" ]; then
    tmp=$(mktemp -d)
    git clone -q --no-checkout "$pkg/llama/gitRelease.bundle" "$tmp/src"
    git -C "$tmp/src" archive HEAD include/llama.h ggml/include | tar -x -C "$peers"
    rm -rf "$tmp"
fi

# 3. the driver
drv=$peers/peer_llamacpp
if [ ! -x "$drv" ] || [ "$root/bench/peer_llamacpp.c" -nt "$drv" ] ||
    [ "$root/bench/peer_workload.h" -nt "$drv" ]; then
    cc -std=c11 -O2 -Wall -Wextra -I "$peers/include" -I "$peers/ggml/include" \
        "$root/bench/peer_llamacpp.c" -o "$drv" "$libllama" "$libggml" "$libbase" -lm \
        -Wl,-rpath,"$bins"
fi
export GGML_BACKEND_DIR=$bins

# 4. the models
bq=$build/bench_quant
[ -x "$bq" ] || { echo "$bq is missing: scripts/build.sh first" >&2; exit 1; }
models=${KVPLAN_PEER_MODELS:-$peers/models}
mkdir -p "$models"
for t in ${types//,/ }; do
    [ -f "$models/syn-$t.gguf" ] || "$bq" --write-gguf "$models" --types "$t" >/dev/null
done

load() { cut -d' ' -f1-3 /proc/loadavg; }
field() { # value after key $1 in line $2
    echo "$2" | awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'
}
stats() { # median min max of the numbers on stdin
    sort -g | awk '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
        printf "%.3f (%.2f-%.2f)", m, v[1], v[NR]}'
}

echo "peer benchmark: kvplan vs llama.cpp (node-llama-cpp $version prebuilt CPU libraries)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs available; load average before: $(load)"
echo "workload: synthetic 768-dim 12-layer GQA 12/4 FFN 2048 vocab 32000; prompt $prompt, $decode greedy decode steps; $threads threads each; K/V F16; $pairs interleaved pairs"
printf "%-5s %-26s %-26s %14s %14s %14s %14s\n" type "decode kvplan/llama.cpp" "prefill kvplan/llama.cpp" \
    "kv dec t/s" "llama dec t/s" "kv pf t/s" "llama pf t/s"
for t in ${types//,/ }; do
    f=$models/syn-$t.gguf
    rd=() rp=() kd=() ld=() kp=() lp=()
    for ((p = 0; p < pairs; p++)); do
        a=$(nice -n 0 "$bq" --peer "$f" --threads "$threads" --prompt "$prompt" --decode "$decode")
        b=$(nice -n 0 "$drv" "$f" --threads "$threads" --prompt "$prompt" --decode "$decode")
        kd+=("$(field decode_tps "$a")") ld+=("$(field decode_tps "$b")")
        kp+=("$(field prefill_tps "$a")") lp+=("$(field prefill_tps "$b")")
        rd+=("$(awk -v x="${kd[-1]}" -v y="${ld[-1]}" 'BEGIN {print x / y}')")
        rp+=("$(awk -v x="${kp[-1]}" -v y="${lp[-1]}" 'BEGIN {print x / y}')")
    done
    printf "%-5s %-26s %-26s %14s %14s %14s %14s\n" "$t" \
        "$(printf '%s\n' "${rd[@]}" | stats)" "$(printf '%s\n' "${rp[@]}" | stats)" \
        "$(printf '%s\n' "${kd[@]}" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')" \
        "$(printf '%s\n' "${ld[@]}" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')" \
        "$(printf '%s\n' "${kp[@]}" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')" \
        "$(printf '%s\n' "${lp[@]}" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
done
echo "load average after: $(load)"

if [ "$ppl" -gt 0 ]; then
    echo
    echo "perplexity agreement: mean next-token NLL over $ppl tokens (chunks of 512), K/V F32, flash attention off"
    printf "%-5s %14s %14s %14s %14s %12s\n" type "kvplan nll" "llama.cpp nll" "kvplan ppl" "llama.cpp ppl" "rel. diff"
    for t in ${types//,/ }; do
        f=$models/syn-$t.gguf
        a=$(field nll "$("$bq" --peer "$f" --threads "$threads" --kv f32 --ppl "$ppl")")
        b=$(field nll "$("$drv" "$f" --threads "$threads" --kv f32 --ppl "$ppl")")
        awk -v t="$t" -v a="$a" -v b="$b" 'BEGIN {pa = exp(a); pb = exp(b);
            printf "%-5s %14.6f %14.6f %14.4f %14.4f %12.2e\n", t, a, b, pa, pb, (pa - pb) / pb}'
    done
fi
