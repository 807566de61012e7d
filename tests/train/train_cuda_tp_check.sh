#!/bin/bash
# zero-train's tensor parallelism on CUDA (meson suite 'gpu'; tests/gpu/run_gpu_tests.sh
# runs it; CI has no GPU):  tests/train/train_cuda_tp_check.sh ZERO_TRAIN [cpu]
# With `cpu` the same runs go through the CPU stage and the MPI comm (CI runs
# that as train_tp_vs_single_np4: the script's logic, and the grids' losses
# against the single-rank run within the same tolerances).
#
# 4 ranks on one GPU (STAGED comm: device buffers, host-staged MPI), the CUDA
# GPT's tp blocks (gpt_cuda_workspace_create_tp), 4 blocks, 4 heads, ZeRO
# stage 1, 16 sequences a step, against the single-rank CUDA run of the same
# model and data (grad accumulation 4: the same samples per step, the same
# initial weights), 6 steps each (4 with `cpu`):
#   tp 2 x pp 2 (1f1b; 4 micro-batches a step through the pipeline) and
#   tp 2 x dp 2 (grad accumulation 2 on each dp rank), fp32 and bf16:
#   fp32: every step's loss within 2e-3 relative of the single-rank run's.
#         Why not bitwise: the row-parallel products are summed as two
#         halves plus the all-reduce, the pipeline accumulates micro-batches
#         in its own buffers, the CUDA GPT's bias / LayerNorm / embedding
#         reductions use atomics (gpt_cuda.h); zero-train's CUDA matmuls
#         round inputs to bf16 in both runs (the pp check's bound).
#   bf16: within 2e-2 relative (bf16 weights and gradients; the tp blocks'
#         column-parallel input gradients are summed in fp32, the single
#         rank rounds them to bf16 once; the pp check's bf16 bound).
# The losses must also fall (the last step's below the first's).
#   zb-h1 (the split backward: B with the tp all-reduces, W from the stash at
#   this rank's widths) at tp 2 x pp 2, fp32 (and bf16 on CUDA): within the
#   same tolerance of the single-rank run as 1f1b; fp32 also within 1e-4
#   relative of 1f1b (the pp check's zb-h1 bound: the same gemms, the
#   reductions' atomics on CUDA; equal on the CPU, where every schedule's
#   gradients are bitwise GPipe's).
# Exit 77 when no GPU is visible (or the build has no CUDA) or no mpirun.
set -euo pipefail
. "$(dirname "$0")/mp_check_lib.sh" # the set-up, run1, runmp and mp_compare (losses, close) shared with the pp check
mp_check_init cuda-tp "$@"

run4() { runmp 4 "$@"; } # name, extra args...: 4 ranks sharing the GPU
tppp=(--set model.tp=2 --set model.pp=2 --set gradient_accumulation_steps=4)
tpdp=(--set model.tp=2 --set gradient_accumulation_steps=2)
run1 ref32
run4 tppp32 "${tppp[@]}"
run4 tpdp32 "${tpdp[@]}"
run1 ref16 --set bf16.enabled=true
run4 tppp16 "${tppp[@]}" --set bf16.enabled=true
run4 tpdp16 "${tpdp[@]}" --set bf16.enabled=true
run4 tpppzb32 "${tppp[@]}" --set model.pp_schedule=zb-h1
if [ "$dev" = cuda ]; then run4 tpppzb16 "${tppp[@]}" --set model.pp_schedule=zb-h1 --set bf16.enabled=true; fi
grep -h "model parallel:" "$work"/tppp32.out "$work"/tpdp32.out || true

mp_compare <<'PY'
for n, grid in (("tppp32", "tp 2 x cp 1 x pp 2 x dp 1"), ("tpdp32", "tp 2 x cp 1 x pp 1 x dp 2")):
    assert grid in open(os.path.join(w, n + ".out")).read(), f"{n}: no '{grid}' in its summary"
figs = {}
r32, r16 = losses("ref32"), losses("ref16")
figs["tp2_pp2_fp32_rel"] = close(losses("tppp32"), r32, 2e-3, dev + " tp 2 x pp 2 fp32 vs 1 rank")
figs["tp2_dp2_fp32_rel"] = close(losses("tpdp32"), r32, 2e-3, dev + " tp 2 x dp 2 fp32 vs 1 rank")
figs["tp2_pp2_bf16_rel"] = close(losses("tppp16"), r16, 2e-2, dev + " tp 2 x pp 2 bf16 vs 1 rank")
figs["tp2_dp2_bf16_rel"] = close(losses("tpdp16"), r16, 2e-2, dev + " tp 2 x dp 2 bf16 vs 1 rank")
figs["tp2_pp2_zbh1_fp32_rel"] = close(losses("tpppzb32"), r32, 2e-3, dev + " tp 2 x pp 2 zb-h1 fp32 vs 1 rank")
figs["tp2_pp2_zbh1_vs_1f1b_fp32"] = close(losses("tpppzb32"), losses("tppp32"), 1e-4,
                                          dev + " tp 2 x pp 2 zb-h1 fp32 vs 1f1b")
if dev == "cuda":
    figs["tp2_pp2_zbh1_bf16_rel"] = close(losses("tpppzb16"), r16, 2e-2, dev + " tp 2 x pp 2 zb-h1 bf16 vs 1 rank")
print("FIGURES " + json.dumps(figs))
PY
echo "ok: zero-train tensor parallelism on $dev (tp 2 x pp 2 with 1f1b and zb-h1, tp 2 x dp 2; fp32 and bf16)" \
  "against the single-rank run"
