#!/bin/bash
# zero-train end to end on real ranks, small enough for the sanitizer build:
#   tests/train/train_resume.sh BUILD_ROOT RANKS STAGE
# Runs S steps straight, then S/2 + resume + S/2 in a fresh directory, and
# requires the per-step losses after the resume point to be bitwise equal to
# the straight run's (the metrics file prints them with %.17g, which
# round-trips a double), the final master weights and moments of both runs
# to be bitwise equal (zero-ckpt diff), and the loss to fall.
set -euo pipefail
build=$1 ranks=$2 stage=$3
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=$build/tools/train/zero-train
work=$(mktemp -d /tmp/zero-train-resume-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# a deterministic corpus: this repository's C sources of the engine
# The frozen corpus (tests/python/train_helpers.py corpus()), not the live zero/*.c (which
# changed the data with every source edit).
gzip -dc "$src/tests/python/data/corpus.txt.gz" > "$work/corpus.txt"
common=(--plain --data "$work/corpus.txt" --stage "$stage" --micro-batch 4 --log-every 100
        --set model.n_layer=1 --set model.n_head=2 --set model.d_model=32 --set model.seq_len=16
        --set optimizer.params.lr=0.01 --set scheduler.params.total_num_steps=8
        --set scheduler.params.warmup_num_steps=2)
run() {
  if [ "$ranks" = 1 ]; then "$exe" "${common[@]}" "$@"   # also in builds without MPI
  else "$src/tests/mpirun.sh" "$ranks" "$exe" "${common[@]}" "$@"; fi
}

run --steps 8 --metrics "$work/straight.jsonl" --checkpoint-dir "$work/a" >/dev/null
run --steps 4 --metrics "$work/first.jsonl" --checkpoint-dir "$work/b" >/dev/null
run --steps 8 --metrics "$work/second.jsonl" --checkpoint-dir "$work/b" --resume auto > "$work/second.log"
grep -q "resumed from" "$work/second.log" || { echo "FAIL: no resume message"; cat "$work/second.log"; exit 1; }

loss() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$1"; }
if ! diff <(loss "$work/straight.jsonl" | tail -n 4) <(loss "$work/second.jsonl"); then
  echo "FAIL: losses after the resume differ from the straight run"
  exit 1
fi
if ! diff <(loss "$work/straight.jsonl" | head -n 4) <(loss "$work/first.jsonl"); then
  echo "FAIL: the first halves differ"
  exit 1
fi
"$build/tools/ckpt/zero-ckpt" verify "$work/b" >/dev/null
# the final states of both runs: master weights and moments bitwise equal
"$build/tools/ckpt/zero-ckpt" diff "$work/a" "$work/b" || { echo "FAIL: final checkpoints differ"; exit 1; }
first=$(loss "$work/straight.jsonl" | head -n 1) last=$(loss "$work/straight.jsonl" | tail -n 1)
awk -v f="$first" -v l="$last" 'BEGIN { if (!(l < f - 0.3)) { print "FAIL: loss " f " -> " l " did not fall"; exit 1 } }'
echo "ok: ranks $ranks stage $stage: losses after resume bitwise equal; loss $first -> $last"
