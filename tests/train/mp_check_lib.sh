# Sourced by zero-train's model-parallel checks (train_cuda_pp_check.sh,
# train_cuda_tp_check.sh): the set-up they share, the single-rank reference
# run, the multi-rank run, and the loss comparison, written once.
#
#   . "$(dirname "$0")/mp_check_lib.sh"
#   mp_check_init NAME ZERO_TRAIN [cpu]
#
# mp_check_init sets py, exe, dev (cuda, or cpu: the CPU stage and the MPI
# comm), steps (6; 4 on the CPU, CI's time), src, mpirun_sh, work (a
# temporary folder, removed on exit), common (the model and data: 4 blocks,
# d_model 64, 4 heads, seq 64, micro-batch 2, ZeRO stage 1, the frozen
# corpus) and backend (the STAGED comm on CUDA: device buffers, host-staged
# MPI); it exits 77 when no GPU is visible (or the build has no CUDA) or
# there is no mpirun, 1 when zero-train fails otherwise.

mp_check_init() { # name (of the temporary folder), zero-train, [cpu]
  py=$(command -v /usr/bin/python3 || command -v python3)
  exe=$2
  dev=${3:-cuda}
  steps=6
  [ "$dev" = cpu ] && steps=4 # CI's time; the CPU stage's differences are at rounding level from step 1
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mpirun_sh="$src/tests/mpirun.sh"
  work=$(mktemp -d "/tmp/zero-train-$1-XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # The frozen corpus (tests/python/train_helpers.py corpus(), as train_moe.sh and train_resume.sh
  # since e7229c0), not the live zero/*.c: an edit anywhere in zero/ changed these checks' data, so
  # their losses, and so their outcome, moved with unrelated commits.
  # Unpacked by the Python these checks need anyway: one tool fewer to ask of the GPU image.
  "$py" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$src/tests/python/data/corpus.txt.gz" "$work/corpus.txt"
  common=(--plain --data "$work/corpus.txt" --micro-batch 2 --log-every 1 --steps $steps --stage 1 --device $dev
          --set model.n_layer=4 --set model.d_model=64 --set model.n_head=4 --set model.seq_len=64
          --set scheduler.params.total_num_steps=$steps --set scheduler.params.warmup_num_steps=1)

  if ! "$exe" "${common[@]}" --steps 1 --set gradient_accumulation_steps=4 >/dev/null 2>"$work/err"; then
    if grep -q "no CUDA GPU is visible\|this build has no CUDA" "$work/err"; then cat "$work/err"; exit 77; fi
    cat "$work/err"; exit 1
  fi
  command -v mpirun >/dev/null 2>&1 || { echo "no mpirun: skipped"; exit 77; }
  backend=()
  [ "$dev" = cuda ] && backend=(--set train.comm_backend=staged)
  return 0
}

run1() { # name, extra args...: the single-rank reference (grad accumulation 4: the samples of a multi-rank step)
  local n=$1; shift
  "$exe" "${common[@]}" --set gradient_accumulation_steps=4 "$@" --metrics "$work/$n.jsonl" >"$work/$n.out"
}

runmp() { # ranks, name, extra args...: that many ranks sharing the GPU; their output shown when they fail
  local np=$1 n=$2; shift 2
  "$mpirun_sh" "$np" "$exe" "${common[@]}" "${backend[@]}" "$@" --metrics "$work/$n.jsonl" \
    >"$work/$n.out" 2>&1 || { cat "$work/$n.out"; exit 1; }
}

# The caller's checks, Python on stdin, run after these definitions:
#   w, dev, steps   the work folder, the device, the steps each run logs;
#   losses(n)       the losses run n logged (its metrics file), in step order;
#   close(a, b, tol, what)  asserts both ran `steps` steps, every step of a within tol
#                   relative of b's, and a's loss falling (last below first); prints the
#                   largest difference and both series; returns that difference.
mp_compare() {
  local prelude
  prelude=$(cat <<'PY'
import json, os, sys
w, dev, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(n):
    rows = [json.loads(l) for l in open(os.path.join(w, n + ".jsonl"))]
    return [r["loss"] for r in rows if "loss" in r]
def close(a, b, tol, what):
    assert len(a) == len(b) == steps, f"{what}: {len(a)} and {len(b)} steps logged, {steps} expected"
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    print(f"{what}: largest relative loss difference {worst:.2e} (tolerance {tol:g})")
    print("  " + " ".join(f"{x:.5f}/{y:.5f}" for x, y in zip(a, b)))
    assert worst <= tol, f"{what}: {worst:.3e} > {tol:g}"
    assert a[-1] < a[0], f"{what}: the loss did not fall"
    return worst
PY
)
  "$py" -c "$prelude
$(cat)" "$work" "$dev" "$steps"
}
