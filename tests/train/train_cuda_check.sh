#!/bin/bash
# zero-train on a GPU (run by tests/gpu/run_gpu_tests.sh; CI has no GPU):
#   tests/train/train_cuda_check.sh BUILD_DIR
# 1. world 1 (NCCL), fp32 and bf16, stage 3: the loss falls, and the first
#    step's loss is the CPU run's within 2e-3 (fp32 params; the CUDA model's
#    matmuls round inputs to bf16);
# 2. world 2 on one GPU (STAGED comm), stage 3 bf16: 8 steps straight vs
#    4 + resume + 4: the first loss after the resume equals the straight
#    run's within 1e-6 relative (weights and moments come back bitwise; cuBLAS
#    may reorder sums between runs), and the checkpoint verifies and
#    consolidates.
# 3. MoE (model.moe: 4 experts, top-2, capacity factor 1.0; SGD, as
#    tests/model/train_moe.sh): world 1 fp32: the first step's loss is the
#    CPU run's within 5e-3 relative (bf16 tensor-core products may flip a
#    near-tie routing choice; the loss averages it over the micro-batch);
#    world 2 on one GPU (STAGED), stage 2, model.moe.ep 2 (each rank holds 2
#    experts, all-to-all-v of device buffers, dense gradients summed over
#    ep): every step's loss within 1e-3 relative of the same run at ep 1
#    (every expert on both ranks: the plain data-parallel MoE
#    model), and falling.
# Exit 77 when no GPU is visible.
set -euo pipefail
# stdlib-only checks: any python3 (the GPU image has no /usr/bin/python3)
py=$(command -v /usr/bin/python3 || command -v python3)
build=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
exe=$build/tools/train/zero-train
ckpt=$build/tools/ckpt/zero-ckpt
work=$(mktemp -d /tmp/zero-train-cuda-XXXXXX)
trap 'rm -rf "$work"' EXIT
# The frozen corpus (tests/python/train_helpers.py corpus(), as train_moe.sh and train_resume.sh
# since e7229c0), not the live zero/*.c: an edit anywhere in zero/ changed this check's data, so
# its thresholds (the loss falling, the first loss against the CPU's) moved with unrelated commits.
# Unpacked by the Python this check needs anyway: one tool fewer to ask of the GPU image.
"$py" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  "$src/tests/python/data/corpus.txt.gz" "$work/corpus.txt"
common=(--plain --data "$work/corpus.txt" --micro-batch 8 --log-every 10 --set model.n_layer=2
        --set model.d_model=64 --set scheduler.params.total_num_steps=40 --set scheduler.params.warmup_num_steps=4)
loss() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$1"; }

if ! "$exe" "${common[@]}" --device cuda --steps 1 >/dev/null 2>"$work/err"; then
  if grep -q "no CUDA GPU is visible\|this build has no CUDA" "$work/err"; then cat "$work/err"; exit 77; fi
  cat "$work/err"; exit 1
fi
"$exe" "${common[@]}" --device cpu --steps 1 --metrics "$work/cpu.jsonl" >/dev/null
for prec in fp32 bf16; do
  extra=()
  [ "$prec" = bf16 ] && extra=(--set bf16.enabled=true)
  "$exe" "${common[@]}" "${extra[@]}" --device cuda --steps 40 --metrics "$work/$prec.jsonl"
  "$py" - "$work/$prec.jsonl" "$work/cpu.jsonl" "$prec" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cpu = json.loads(open(sys.argv[2]).readline())["loss"]
first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
print(f"cuda {sys.argv[3]}: first loss {first:.6f} (cpu {cpu:.6f}), last 5 mean {last:.4f}")
assert last < first - 1.0, "the loss did not fall"
if sys.argv[3] == "fp32":
    assert abs(first - cpu) <= 2e-3 * abs(cpu), "first loss differs from the CPU run"
PY
done

c2=("${common[@]}" --device cuda --set train.comm_backend=staged --stage 3 --set bf16.enabled=true)
"$src/tests/mpirun.sh" 2 "$exe" "${c2[@]}" --steps 8 --metrics "$work/a.jsonl" --checkpoint-dir "$work/a" >/dev/null
"$src/tests/mpirun.sh" 2 "$exe" "${c2[@]}" --steps 4 --checkpoint-dir "$work/b" >/dev/null
"$src/tests/mpirun.sh" 2 "$exe" "${c2[@]}" --steps 8 --metrics "$work/b.jsonl" --checkpoint-dir "$work/b" \
  --resume auto >/dev/null
"$ckpt" verify "$work/b"
"$ckpt" consolidate "$work/b" "$work/b.safetensors"
"$py" - "$(loss "$work/a.jsonl" | sed -n 5p)" "$(loss "$work/b.jsonl" | head -n 1)" <<'PY'
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
print(f"cuda staged 2 ranks: step 5 loss straight {a!r}, after resume {b!r}")
assert abs(a - b) <= 1e-6 * abs(a), "the resumed run differs"
PY
mc=(--plain --data "$work/corpus.txt" --micro-batch 2 --log-every 100 --steps 5
    --set model.n_layer=2 --set model.n_head=2 --set model.d_model=32 --set model.seq_len=16
    --set 'optimizer={"type": "SGD", "params": {"lr": 0.5}}' --set gradient_clipping=0
    --set scheduler.params.total_num_steps=5 --set scheduler.params.warmup_num_steps=2
    --set 'model.moe={"experts": 4, "top_k": 2, "capacity_factor": 1.0, "aux_loss_coef": 0.01}')
"$exe" "${mc[@]}" --device cpu --metrics "$work/moe_cpu.jsonl" >/dev/null
"$exe" "${mc[@]}" --device cuda --metrics "$work/moe_cuda.jsonl" >/dev/null
for e in 1 2; do
  "$src/tests/mpirun.sh" 2 "$exe" "${mc[@]}" --device cuda --set train.comm_backend=staged --stage 2 \
    --set model.moe.ep=$e --metrics "$work/moe_ep$e.jsonl" >/dev/null
done
"$py" - "$work" <<'PY'
import json, sys
w = sys.argv[1]
rd = lambda f: [json.loads(l)["loss"] for l in open(f"{w}/{f}.jsonl")]
cpu, cuda, ep1, ep2 = rd("moe_cpu"), rd("moe_cuda"), rd("moe_ep1"), rd("moe_ep2")
print(f"cuda moe: first loss {cuda[0]:.6f} (cpu {cpu[0]:.6f}); 2 ranks ep 2 {ep2} vs ep 1 {ep1}")
assert abs(cuda[0] - cpu[0]) <= 5e-3 * abs(cpu[0]), "the CUDA MoE model's first loss differs from the CPU's"
assert len(ep2) == len(ep1) == 5, "missing steps"
assert all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(ep2, ep1)), "ep 2 differs from ep 1"
assert ep2[-1] < ep2[0], "the loss did not fall"
PY
echo "ok: zero-train on CUDA"
