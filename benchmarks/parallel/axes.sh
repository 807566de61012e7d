#!/bin/bash
# The five parallel axes side by side (docs/sequence-parallel.md, "Memory and traffic of the five
# axes"): zero-train at one small size on 1 rank and on 4 ranks split as dp 4, tp 2 x dp 2,
# tp 2 + SP x dp 2, cp 2 x dp 2, pp 2 x dp 2, and the MoE model at ep 1 and ep 2 x dp 2; prints each
# run's summary lines: rank 0's activation bytes by kind, engine memory and bytes sent per step
# per group (comm byte counters). Bytes and memory are deterministic (not timings).
#   benchmarks/parallel/axes.sh [BUILD_DIR]
set -eu
B=${1:-build}
here=$(cd "$(dirname "$0")/../.." && pwd)
train="$B/tools/train/zero-train"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
head -c 300000 /dev/urandom | base64 > "$data/corpus.txt" # any bytes: only sizes matter here
common=(--plain --data "$data/corpus.txt" --steps 2 --stage 1 --micro-batch 4
        --set model.n_layer=2 --set model.n_head=4 --set model.d_model=64 --set model.seq_len=32)
run() {
    local name=$1 np=$2
    shift 2
    echo "== $name (np $np): $*"
    OMP_NUM_THREADS=1 "$here/tests/mpirun.sh" "$np" "$train" "${common[@]}" "$@" 2>&1 |
        grep -E "^summary: rank 0 (activations|engine memory|bytes sent)" || echo "(failed)"
}
run "1 rank" 1 --grad-accum 8
run "dp 4" 4 --grad-accum 2
run "tp 2 x dp 2" 4 --grad-accum 4 --set model.tp=2
run "tp 2 + SP x dp 2" 4 --grad-accum 4 --set model.tp=2 --set model.sequence_parallel=true
run "cp 2 x dp 2" 4 --grad-accum 4 --set model.cp=2
run "pp 2 x dp 2" 4 --grad-accum 4 --set model.pp=2
run "MoE, ep 1 x dp 4" 4 --grad-accum 2 --set model.moe.experts=4
run "MoE, ep 2 x edp 2" 4 --grad-accum 2 --set model.moe.experts=4 --set model.moe.ep=2
