#!/usr/bin/env bash
# Wall time of the demo's search (scripts/demo.sh step 2: stories260K, R = 1/8, successive
# halving over BaKlaVa's t x r x p grid, then sensitivity planning; issue 15 "Benchmark") run
# by one process and under `mpirun -np N`, with the load average before and after each run
# (other jobs on the machine make the figures noisy: read them with the load).
#
# Usage: bench/bench_mpi.sh [NP ...]          (default: 1 2; needs build/kvplan with MPI)
# Environment: KVPLAN_SHARED (default ../shared), BUILD (default build), REPEATS (default 1),
#   THREADS_PER_RANK (default 1 for N > 1: one core's worth per rank, as docs/design.md advises;
#   the one-process run keeps the engine's default threads unless OMP_NUM_THREADS is set),
#   BIND (mpirun --bind-to; default none: Open MPI 4 pins each of 2 ranks to one core, and on
#   a machine shared with other jobs a pinned rank waits behind them while the other core may
#   be free; the one-process run is not pinned either).
# Every run's plan must equal the first run's (datasets bit for bit, h5diff): printed as "same".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
shared=${KVPLAN_SHARED:-$root/../shared}
export KVPLAN_SHARED=$shared
build=${BUILD:-build}
kv=$root/$build/kvplan
repeats=${REPEATS:-1}
bind=${BIND:-none}
nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(1 2)
model=$shared/models/stories260K/stories260K.bin
tok=$shared/models/stories260K/tok512.bin
text=$shared/text/tinystories_val_head.txt
for f in "$kv" "$model" "$tok" "$text"; do
    [ -e "$f" ] || { echo "bench_mpi: $f is missing (build first: scripts/build.sh)" >&2; exit 1; }
done
mpirun=$(command -v mpirun || true)
[ -n "$mpirun" ] || { echo "bench_mpi: no mpirun (apt-get install openmpi-bin)" >&2; exit 1; }
# as root in a container, more ranks than cores allowed, shared memory, yield while idle
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
    OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d /tmp/kvplan-bench-mpi.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "profiling (not timed) ..." >&2
"$kv" profile "$model" --tokenizer "$tok" --text "$text" --quick-hw --quiet -o "$work/profile.h5"
search=(search --profile "$work/profile.h5" --model "$model" --tokenizer "$tok" --text "$text"
    --ratio 0.125 --evict-block 4 --block-size 8 --p-grid 0.5,1 --halving 3 --quiet)

load1() { cut -d' ' -f1 /proc/loadavg; }
# h5diff lists only the attributes a run may change (command, created, timings)
same() {
    local d
    d=$(h5diff "$1" "$2" 2>&1 || true)
    ! printf '%s\n' "$d" | grep -E '^(dataset|group):|Not comparable|^attribute:' |
        grep -vqE '<(command|created) of|seconds of'
}

echo "mpirun --bind-to $bind" >&2
printf '%-4s %-8s %-6s %10s %8s %10s %10s %6s\n' np threads run wall_s ratio load_before \
    load_after plan
ref="" t1=""
for np in "${nps[@]}"; do
    for r in $(seq 1 "$repeats"); do
        out=$work/plan-np$np-$r.h5
        if [ "$np" -eq 1 ]; then
            thr=${OMP_NUM_THREADS:-default}
            cmd=("$kv" "${search[@]}" -o "$out")
        else
            thr=${THREADS_PER_RANK:-1}
            cmd=("$mpirun" --noprefix --oversubscribe --bind-to "$bind" -np "$np"
                -x OMP_NUM_THREADS="$thr"
                -x OPENBLAS_NUM_THREADS="$thr" "$kv" "${search[@]}" -o "$out")
        fi
        lb=$(load1)
        t0=$(date +%s.%N)
        "${cmd[@]}" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
        t=$(echo "$(date +%s.%N) - $t0" | bc -l)
        la=$(load1)
        [ -n "$t1" ] || t1=$t
        ok=same
        if [ -z "$ref" ]; then ref=$out; elif ! same "$ref" "$out"; then ok=DIFFERS; fi
        printf '%-4s %-8s %-6s %10.1f %8.2f %10s %10s %6s\n' "$np" "$thr" "$r" "$t" \
            "$(echo "$t1 / $t" | bc -l)" "$lb" "$la" "$ok"
    done
done
echo "ratio = first run's wall time / this run's (> 1: faster); $(nproc) cores"
