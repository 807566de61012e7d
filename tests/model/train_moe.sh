#!/bin/bash
# Mixture of experts through zero-train and the engine, on real ranks:
#   tests/model/train_moe.sh BUILD_ROOT RANKS EP
# Trains 5 steps (DeepSpeed's warm-up: the first update has lr 0) of an MoE GPT (4 experts, top-2, capacity factor 1.0) with
# expert parallelism model.moe.ep = EP at ZeRO stages 0-3 and requires
#   - the per-step losses (printed with %.17g) to be BITWISE equal across the
#     stages: the engine's dense and expert shards reduce and step alike;
#   - the losses to equal, within 2e-6 relative, those of the same model
#     with every expert on every rank (model.moe.ep 1, the plain
#     data-parallel MoE model): the ep run's gradients (dense summed over
#     ep, all of loss / ep) are the data-parallel average. SGD, whose step
#     is proportional to the gradient (AdamW's is not: a gradient off by a
#     factor would not show); once without clipping (the gradients' scale)
#     and once clipped to a norm of 0.05 (the global norm over edp x ep,
#     the dense tensors counted once);
#   - the loss to fall (unclipped), and the run to say how it laid the groups out.
set -euo pipefail
build=$1 ranks=$2 ep=$3
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=$build/tools/train/zero-train
work=$(mktemp -d /tmp/zero-moe-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# The frozen corpus (tests/python/train_helpers.py corpus()): the live zero/*.c changed the data
# with every source edit - adding one file made the 5-step loss of train_moe_np1_ep1 not fall.
gzip -dc "$src/tests/python/data/corpus.txt.gz" > "$work/corpus.txt"
common=(--plain --data "$work/corpus.txt" --micro-batch 2 --log-every 100 --steps 5
        --set model.n_layer=2 --set model.n_head=2 --set model.d_model=32 --set model.seq_len=16
        --set 'optimizer={"type": "SGD", "params": {"lr": 0.5}}' --set gradient_clipping=0
        --set scheduler.params.total_num_steps=5
        --set scheduler.params.warmup_num_steps=2
        --set 'model.moe={"experts": 4, "top_k": 2, "capacity_factor": 1.0, "aux_loss_coef": 0.01}')
run() {
  if [ "$ranks" = 1 ]; then "$exe" "${common[@]}" "$@"
  else "$src/tests/mpirun.sh" "$ranks" "$exe" "${common[@]}" "$@"; fi
}
loss() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$1"; }
for stage in 0 1 2 3; do
  run --stage "$stage" --set model.moe.ep="$ep" --metrics "$work/s$stage.jsonl" > "$work/s$stage.log" ||
    { echo "FAIL: stage $stage"; cat "$work/s$stage.log"; exit 1; }
done
[ "$(loss "$work/s0.jsonl" | wc -l)" = 5 ] || { echo "FAIL: no losses"; cat "$work/s0.log"; exit 1; }
for stage in 1 2 3; do
  diff <(loss "$work/s0.jsonl") <(loss "$work/s$stage.jsonl") ||
    { echo "FAIL: losses of stage $stage differ from stage 0's (ep $ep)"; exit 1; }
done
grep -q "expert parallel $ep x expert-data-parallel $((ranks / ep))" "$work/s0.log" ||
  { echo "FAIL: the run does not report its groups"; grep moe "$work/s0.log"; exit 1; }
close() { # $1 $2: metrics files of the ep run and the ep-1 run
  paste <(loss "$1") <(loss "$2") | awk -v ep="$ep" -v what="$3" -v fall="$4" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 2e-6 * $2) { printf "FAIL: %s: step %d loss %s (ep %s), %s (ep 1)\n", what, NR, $1, ep, $2; bad = 1 } }
    NR == 1 { first = $1 } END { if (!bad && fall && !($1 < first)) { printf "FAIL: %s: the loss did not fall\n", what; bad = 1 } exit bad }'
}
run --stage 1 --set model.moe.ep=1 --metrics "$work/dp.jsonl" > "$work/dp.log" ||
  { echo "FAIL: ep 1"; cat "$work/dp.log"; exit 1; }
close "$work/s0.jsonl" "$work/dp.jsonl" "unclipped" 1
for e in "$ep" 1; do
  run --stage 2 --set model.moe.ep="$e" --set gradient_clipping=0.05 --metrics "$work/clip$e.jsonl" \
    > "$work/clip$e.log" || { echo "FAIL: clipped ep $e"; cat "$work/clip$e.log"; exit 1; }
done
close "$work/clip$ep.jsonl" "$work/clip1.jsonl" "clipped to 0.05" ""
echo "ok: ranks $ranks ep $ep: losses bitwise equal at stages 0-3 and within 2e-6 of the ep-1 model's" \
     "(unclipped and clipped):" $(loss "$work/s0.jsonl" | tr '\n' ' ')
