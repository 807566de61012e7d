#!/bin/bash
# Activation checkpointing through zero-train and the engine, on real ranks:
#   tests/model/train_actckpt.sh BUILD_ROOT RANKS STAGE [extra zero-train args...]
# Trains a few steps without and with activation_checkpointing (every block
# recomputed, inputs partitioned over tp when model.tp > 1; then
# number_checkpoints 2: recomputing one block saves nothing, its set is the
# shared one) and requires the per-step losses
# (the metrics file prints them with %.17g) and the final master weights and
# moments (zero-ckpt diff) to be BITWISE equal; the summary's activation
# bytes without checkpointing to equal the plain run's, and to be larger.
set -euo pipefail
build=$1 ranks=$2 stage=$3
shift 3
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=$build/tools/train/zero-train
work=$(mktemp -d /tmp/zero-actckpt-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# The frozen corpus (tests/python/train_helpers.py corpus()): the live zero/*.c changed the data
# with every source edit - adding one file made the 5-step loss of train_moe_np1_ep1 not fall.
gzip -dc "$src/tests/python/data/corpus.txt.gz" > "$work/corpus.txt"
common=(--plain --data "$work/corpus.txt" --stage "$stage" --micro-batch 2 --log-every 100 --steps 3
        --set model.n_layer=3 --set model.n_head=2 --set model.d_model=32 --set model.seq_len=16
        --set optimizer.params.lr=0.01 --set scheduler.params.total_num_steps=3
        --set scheduler.params.warmup_num_steps=1 "$@")
run() {
  if [ "$ranks" = 1 ]; then "$exe" "${common[@]}" "$@"
  else "$src/tests/mpirun.sh" "$ranks" "$exe" "${common[@]}" "$@"; fi
}
run --metrics "$work/plain.jsonl" --checkpoint-dir "$work/plain" > "$work/plain.log"
run --metrics "$work/all.jsonl" --checkpoint-dir "$work/all" \
    --set 'activation_checkpointing={"partition_activations": true, "cpu_checkpointing": false}' > "$work/all.log"
run --metrics "$work/one.jsonl" --checkpoint-dir "$work/one" \
    --set 'activation_checkpointing={"number_checkpoints": 2}' > "$work/one.log"

loss() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$1"; }
bytes() { sed -n "s/^summary: rank 0 activations: \([0-9]*\) bytes.*/\1/p" "$1"; }
without() { sed -n "s/.*blocks: \([0-9]*\) bytes without.*/\1/p" "$1"; }
[ "$(loss "$work/plain.jsonl" | wc -l)" = 3 ] || { echo "FAIL: no losses"; cat "$work/plain.log"; exit 1; }
for v in all one; do
  diff <(loss "$work/plain.jsonl") <(loss "$work/$v.jsonl") || { echo "FAIL: losses differ ($v)"; exit 1; }
  subs=$(cd "$work/plain" && ls -d tp*-pp* 2>/dev/null || echo .)  # model.tp / pp: one directory per position
  for d in $subs; do
    "$build/tools/ckpt/zero-ckpt" diff "$work/plain/$d" "$work/$v/$d" >/dev/null ||
      { echo "FAIL: final states differ ($v, $d)"; exit 1; }
  done
  p=$(bytes "$work/plain.log") c=$(bytes "$work/$v.log") w=$(without "$work/$v.log")
  [ -n "$p" ] && [ "$w" = "$p" ] && [ "$c" -lt "$p" ] ||
    { echo "FAIL: activation bytes ($v): plain $p, checkpointed $c, 'without' $w"; grep summary "$work/$v.log"; exit 1; }
done
echo "ok: ranks $ranks stage $stage $*: losses and final states bitwise equal with checkpointing;" \
     "activations $(bytes "$work/plain.log") -> $(bytes "$work/one.log") (2 blocks) -> $(bytes "$work/all.log") bytes (all)"
