#!/usr/bin/env bash
# kvplan serve under load (docs/serve.md "Benchmark"): for the full F16 cache and the bundled
# stories260K plans at R = 1/4 and 1/8, all under the same --kv-mem (8 full-context requests of
# the full cache), a fresh server on 127.0.0.1 and bench/serve_load.mjs at concurrency 1, 8,
# 32, 128 (each client streams completions one after another for SECONDS; temperature 0.8).
# Two workloads: "short" (prompts: the openings of TinyStories lines, 24-60 bytes; max_tokens
# MAX_TOKENS) and "long" (bench/serve_prompts.mjs: 64 pieces of the TinyStories text of 256 to
# 384 tokens, max_tokens = min(256, 512 - prompt tokens): prompt + answer fill the context).
# Prints a markdown table per workload: generated tokens/s, prompt tokens prefilled per second,
# p50/p99 time to first token and inter-token latency (client side), the most sequences
# admitted at once and the KV bytes peak (the server's /metrics), the engine's CPU time per
# generated token (engine_cpu below: prefill included), the attention work per generated token
# (kvplan_attention_entries_total: query row x KV head x cached entry), and the load average;
# the JSON lines go to bench/out/serve.jsonl.
# Usage: bench/serve.sh [BUILD_DIR]   Environment: WORKLOADS (default "short long"),
# SECONDS_PER_POINT (default 6), WARMUP_SECONDS (default 4: the clients run that long before
# the measured window, whose counts, histograms and engine CPU exclude the warm-up, so the
# long prompts' first wave of prefill does not stand for the steady state), MAX_TOKENS (short
# workload, default 448), CONCURRENCY
# (default "1 8 32 128"), GROUP (--group, default 0: all), THREADS
# (--threads, default: the server's default), REPEAT (default 1: each point that many times,
# the configurations interleaved; the table shows the run of median tokens/s and the range),
# DEVICE (--device: cpu, cuda; default auto).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/kvplan
shared=${KVPLAN_SHARED:-$root/../shared}
model=$shared/models/stories260K/stories260K.bin
secs=${SECONDS_PER_POINT:-6}
warmup=${WARMUP_SECONDS:-4}
max_tokens=${MAX_TOKENS:-448}
concs=${CONCURRENCY:-"1 8 32 128"}
group=${GROUP:-0}
[ -x "$bin" ] || { echo "bench/serve.sh: build kvplan first (scripts/build.sh build)" >&2; exit 1; }
command -v node >/dev/null || { echo "bench/serve.sh: node is needed" >&2; exit 1; }
mkdir -p "$root/bench/out"
out=$root/bench/out/serve.jsonl
: >"$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# short: 64 openings of TinyStories lines (24-60 bytes)
awk 'length($0) > 80 { print substr($0, 1, 24 + (NR % 37)); if (++n == 64) exit }' \
    "$shared/text/tinystories_val_head.txt" >"$work/short.txt"
# long: 64 pieces of 256-384 tokens, each with max_tokens = min(256, 512 - its tokens)
case " ${WORKLOADS:-short long} " in *" long "*)
    node "$root/bench/serve_prompts.mjs" "$bin" "$model" "$shared/text/tinystories_val_head.txt" \
        64 256 384 512 256 >"$work/long.txt" ;;
esac
# --kv-mem: 8 requests of the full cache at the full context (the scheduler's reservation:
# L * H_kv * ceil(C / b_s) blocks of 2 * b_s * 2 d_h bytes = 327680 bytes for stories260K)
kv_mem=$((8 * 327680))
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
[ -n "${DEVICE:-}" ] && threads+=(--device "$DEVICE")

# CPU time of the server's busiest thread (the scheduler's: the engine runs on it with
# --threads 1) and the generated tokens so far: "TICKS GENERATED". Their differences over the
# window give the engine's CPU per generated token (prefill included), in microseconds: what a
# token costs the engine, whatever else the machine runs (wall-clock tokens/s moves with the
# load of a shared machine).
engine_ticks() { # pid, port
    local gen ticks=0 t c
    gen=$(curl -s "http://127.0.0.1:$2/metrics" | awk '/^kvplan_generated_tokens_total/ { print $2 }')
    for t in /proc/"$1"/task/*; do
        c=$(awk '{ print $14 + $15 }' "$t/stat" 2>/dev/null || echo 0)
        [ "${c:-0}" -gt "$ticks" ] && ticks=$c
    done
    echo "$ticks ${gen:-0}"
}
engine_cpu() { # "TICKS GENERATED" at the window's start and end
    awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(a, x, " "); split(b, y, " "); g = y[2] - x[2]
        if (g > 0) printf "%.1f", (y[1] - x[1]) / hz * 1e6 / g; else printf "null" }'
}

run_point() { # label, conc, plan args...
    local label=$1 conc=$2
    shift 2
    # emptied here, not by the child's redirection: the loop below must not find the previous
    # server's port while the new one has not yet started (a refused connection on a loaded
    # machine)
    : >"$work/err"
    "$bin" serve "$model" --kv-mem "$kv_mem" --port 0 --max-queue 1024 --group "$group" \
        "${threads[@]}" --quiet "$@" 2>"$work/err" &
    local pid=$! port=""
    for _ in $(seq 100); do
        port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/err" | grep -o '[0-9]*$' || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { cat "$work/err" >&2; kill "$pid"; exit 1; }
    local cpu t0
    node "$root/bench/serve_load.mjs" "http://127.0.0.1:$port" "$conc" "$secs" \
        "$max_tokens" "$work/$workload.txt" "$warmup" >"$work/line" &
    local lp=$!
    sleep "$warmup"
    t0=$(engine_ticks "$pid" "$port")
    wait "$lp"
    cpu=$(engine_cpu "$t0" "$(engine_ticks "$pid" "$port")")
    local line
    line=$(cat "$work/line")
    kill -TERM "$pid"
    wait "$pid"
    echo "{\"workload\":\"$workload\",\"cache\":\"$label\",\"engine_us_per_token\":$cpu,${line#\{}" >>"$out"
    echo "$workload $label c=$conc: $line" >&2
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for _ in $(seq "${REPEAT:-1}"); do
    for workload in ${WORKLOADS:-short long}; do
    for c in $concs; do
        for cfg in "full" "R=1/4:$root/plans/stories260K.r1-4.h5" \
            "R=1/8:$root/plans/stories260K.r1-8.h5"; do
            label=${cfg%%:*}
            args=()
            [ "$cfg" != full ] && args=(--plan "${cfg#*:}")
            run_point "$label" "$c" "${args[@]}"
        done
    done
    done
done

node -e '
const all = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
const f = (x, d = 1) => (x === null || x === undefined ? "-" : x.toFixed(d));
const order = ["full", "R=1/4", "R=1/8"];
for (const wl of [...new Set(all.map((r) => r.workload))]) {
  const groups = new Map();
  for (const r of all.filter((x) => x.workload === wl)) {
    const k = `${r.cache}|${r.concurrency}`;
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(r);
  }
  const rows = [...groups.values()].map((g) => {
    const s = [...g].sort((a, b) => a.tokens_per_s - b.tokens_per_s);
    return { ...s[Math.floor((s.length - 1) / 2)], lo: s[0].tokens_per_s, hi: s[s.length - 1].tokens_per_s, runs: s.length };
  });
  rows.sort((a, b) => order.indexOf(a.cache) - order.indexOf(b.cache) || a.concurrency - b.concurrency);
  const mt = wl === "long" ? "min(256, 512 - prompt tokens), prompts of 256-384 tokens" : process.argv[3];
  console.log(`\nworkload ${wl}: --kv-mem ${rows[0].kv_capacity} bytes; ${process.argv[2]} s per point after ${rows[0].warmup_s} s of warm-up, max_tokens ${mt}, ${rows[0].runs} run(s) per point`);
  console.log("| cache | clients | tokens/s (median) | range | prompt tok/s | engine CPU us/token | attended / token | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | peak admitted | KV bytes peak |");
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
  for (const r of rows)
    console.log(`| ${r.cache} | ${r.concurrency} | ${f(r.tokens_per_s, 0)} | ${f(r.lo, 0)}-${f(r.hi, 0)} | ${f(r.prompt_tokens_per_s, 0)} | ${f(r.engine_us_per_token)} | ${f(r.attended_per_token, 0)} | ${f(r.ttft_p50_ms)} | ${f(r.ttft_p99_ms)} | ${f(r.itl_p50_ms, 2)} | ${f(r.itl_p99_ms, 2)} | ${r.peak_running} | ${r.kv_peak} |`);
  const at = (c, n) => rows.find((r) => r.cache === c && r.concurrency === n);
  const hi = Math.max(...rows.map((r) => r.concurrency));
  const a = at("full", hi), b = at("R=1/8", hi);
  if (a && b)
    console.log(`\n${wl}, at ${hi} clients, R=1/8 vs full: ${(b.peak_running / a.peak_running).toFixed(2)}x sequences admitted, ` +
      `${(b.tokens_per_s / a.tokens_per_s).toFixed(2)}x generated tokens/s (medians), ` +
      `${(a.engine_us_per_token / b.engine_us_per_token).toFixed(2)}x tokens per engine CPU second, ` +
      `${(a.attended_per_token / b.attended_per_token).toFixed(2)}x less attention work per generated token`);
}
' "$out" "$secs" "$max_tokens"
echo "load average (1, 5, 15 min): $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after"
