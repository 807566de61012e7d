#!/bin/bash
# Every benchmark whose figures docs/BENCHMARKS.md quotes, in one go, on the CPU:
#   bash benchmarks/run_all.sh [BUILD_DIR]      (default build/; results in BUILD_DIR/bench/)
# Each benchmark compares against a peer or a physical limit measured in the same run
# and prints the ratio; the JSON files beside the logs hold the full tables.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build}
out=$b/bench
mkdir -p "$out"
run() { local name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$out/$name.log"; }

run coll_f32   tests/mpirun.sh 2 "$b/benchmarks/collectives/zero-bench-coll" --max-bytes 64M --json "$out/coll_f32.json"
run coll_bf16  tests/mpirun.sh 2 "$b/benchmarks/collectives/zero-bench-coll" --max-bytes 64M --dtype bf16 --json "$out/coll_bf16.json"
run estimate   "$b/benchmarks/memory/zero-bench" estimate --params 7.5e9 --dp 64 --json "$out/estimate.json"
run memory     tests/mpirun.sh 2 "$b/benchmarks/memory/zero-bench" memory --params 1e7 --world 2 --json "$out/memory.json"
/usr/bin/python3 benchmarks/plot_memory.py "$out/memory.json" "$out/memory.png" || true
run steptime   tests/mpirun.sh 2 "$b/benchmarks/memory/zero-bench" steptime --json "$out/steptime.json"
# TORCH_PYTHONS: more interpreters whose torch is a peer too (e.g. a venv with a current torch from PyPI)
peers=(); for p in ${TORCH_PYTHONS:-}; do peers+=(--torch-python "$p"); done
[ ${#peers[@]} -gt 0 ] && peers=(--torch-python /usr/bin/python3 "${peers[@]}")
run train      /usr/bin/python3 benchmarks/train/bench_train.py --build "$b" --steps 40 --repeats 3 "${peers[@]}" --json "$out/train.json"
run gemm       /usr/bin/python3 benchmarks/gemm/bench_gemm.py --build "$b" --rounds 3 --json "$out/gemm.json"
mkdir -p "${TMPDIR:-/tmp}/zero-bench-offload"
run offload    "$b/benchmarks/offload/zero-bench-offload" --dir "${TMPDIR:-/tmp}/zero-bench-offload" --json "$out/offload.json"
echo "results: $out"
