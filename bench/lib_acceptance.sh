# The common part of bench/acceptance_*.sh, sourced by them (not run on its own). After it:
#   root     the repository (also the working directory), shared = ../shared or $KVPLAN_SHARED
#   kv       build/kvplan (built first when missing)
#   work     a temporary directory, removed when the script exits
# OpenMP and OpenBLAS at one thread (the searches and evals set their own --threads), and
#   acc_eval MODEL ARGS...    kvplan eval at C = 512: its JSON line
#   acc_ppl MODEL ARGS...     the perplexity of that line
#   acc_ids MODEL TEXT        the token ids of TEXT under MODEL's tokenizer, one a line
#   acc_model NAME            the path of a bundled model (stories260K, tinystories-656k)
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
shared=${KVPLAN_SHARED:-$root/../shared}
kv=build/kvplan
[ -x "$kv" ] || scripts/build.sh build >&2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

acc_eval() { "$kv" eval "$@" --context 512 --json --quiet; }
acc_ppl() { acc_eval "$@" | sed -n 's/.*"perplexity":\([0-9.eE+-]*\).*/\1/p'; }
acc_ids() { "$kv" tokenize "$1" --text "$2" | tr ' ' '\n' | grep .; }
acc_model() {
    case $1 in
    stories260K) echo "$shared/models/stories260K/stories260K.bin" ;;
    tinystories-656k) echo "$shared/models/tinystories-656k" ;;
    *) echo "unknown model '$1' (stories260K, tinystories-656k)" >&2; return 1 ;;
    esac
}
