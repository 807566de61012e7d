#!/bin/bash
# zero-train's pipeline on CUDA (meson suite 'gpu'; tests/gpu/run_gpu_tests.sh
# runs it; CI has no GPU):  tests/train/train_cuda_pp_check.sh ZERO_TRAIN [cpu]
# With `cpu` the same runs go through the CPU stage and the MPI comm (CI runs
# that as train_pp_vs_single_np2: the script's logic and the pipeline's
# losses against the single-rank run, with the same tolerances).
#
# 2 ranks on one GPU (STAGED comm: device buffers, host-staged MPI), model.pp
# 2 (4 blocks: 2 per stage), 4 micro-batches per step, ZeRO stage 1, against
# the single-rank CUDA run of the same model and data (grad accumulation 4:
# the same 4 micro-batches per step, the same initial weights), 6 steps each
# (4 with `cpu`):
#   fp32: schedules 1f1b and zb-h1 (B/W split) - every step's loss within
#         2e-3 relative of the single-rank run's. Why not bitwise: the
#         single rank accumulates each micro-batch's gradient through the
#         engine, the pipeline in its own buffers, and the CUDA GPT's bias /
#         LayerNorm / embedding reductions use atomics (gpt_cuda.h); the
#         matmuls round inputs to bf16 in both runs.
#   bf16: 1f1b - within 2e-2 relative (bf16 weights and gradients; the
#         pipeline adds the tied wte gradient of the two stages in bf16).
#   1f1b and zb-h1 (fp32) against each other: within 1e-4 relative (the same
#         gemms per micro-batch; only atomics' order differs); on CUDA also
#         zb-h2 (3 slots per stage) and interleaved (2 chunks of 1 block per
#         stage) against 1f1b, and zb-h1 in bf16 (the split in the bf16
#         activation mode: no fp32 fallback, no note printed) within 2e-2 of
#         the single-rank bf16 run.
#   activation checkpointing (every block recomputed) on the stages, 1f1b
#         fp32, against 1f1b without: within 1e-4 relative (the recomputation
#         runs the forward's kernels again; only atomics' order differs); on
#         CUDA also with the recomputed inputs in pinned host memory
#         (cpu_checkpointing).
#   MoE blocks (4 experts, top-2; on CUDA one MoE layer per slot and block),
#         1f1b fp32, against the single-rank MoE run: within 2e-3 relative,
#         the dense fp32 tolerance; on CUDA also zb-h1 with MoE blocks (the
#         experts' weight gradients deferred to W in their layers) against
#         1f1b with them: within 1e-4 relative (the CPU's is bitwise:
#         test_train_parallel.py::test_moe_pp2_ep2_zb_h1_is_1f1b).
# The losses must also fall (the last step's below the first's).
# Exit 77 when no GPU is visible (or the build has no CUDA) or no mpirun.
set -euo pipefail
. "$(dirname "$0")/mp_check_lib.sh" # the set-up, run1, runmp and mp_compare (losses, close) shared with the tp check
mp_check_init cuda-pp "$@"

runpp() { # name, schedule, extra args...: pp 2 on 2 ranks sharing the GPU
  local n=$1 s=$2; shift 2
  runmp 2 "$n" --set model.pp=2 --set model.pp_schedule="$s" --set gradient_accumulation_steps=4 "$@"
}
run1 ref32
runpp f1b32 1f1b
runpp zbh132 zb-h1
run1 ref16 --set bf16.enabled=true
runpp f1b16 1f1b --set bf16.enabled=true
run1 refmoe --set 'model.moe={"experts": 4, "top_k": 2}'
runpp moe32 1f1b --set 'model.moe={"experts": 4, "top_k": 2}'
runpp ck32 1f1b --set 'activation_checkpointing={"partition_activations": true, "cpu_checkpointing": false}'
if [ "$dev" = cuda ]; then # the CPU stage runs these schedules in tests/model_parallel and test_train_pipeline.py
  runpp zbh232 zb-h2
  runpp il32 interleaved --set model.pp_virtual=2 # 2 chunks of 1 block per stage
  runpp zbh116 zb-h1 --set bf16.enabled=true # the split in the bf16 activation mode
  runpp ckoff32 1f1b --set 'activation_checkpointing={"partition_activations": true, "cpu_checkpointing": true}'
  runpp moezb32 zb-h1 --set 'model.moe={"experts": 4, "top_k": 2}' # the MoE split backward
fi
grep -h "pipeline:" "$work"/*.out || true

mp_compare <<'PY'
figs = {}
r32, r16 = losses("ref32"), losses("ref16")
figs["pp2_1f1b_fp32_rel"] = close(losses("f1b32"), r32, 2e-3, dev + " pp 2 1f1b fp32 vs 1 rank")
figs["pp2_zbh1_fp32_rel"] = close(losses("zbh132"), r32, 2e-3, dev + " pp 2 zb-h1 fp32 vs 1 rank")
figs["pp2_zbh1_vs_1f1b_rel"] = close(losses("zbh132"), losses("f1b32"), 1e-4, dev + " pp 2 zb-h1 vs 1f1b fp32")
figs["pp2_1f1b_bf16_rel"] = close(losses("f1b16"), r16, 2e-2, dev + " pp 2 1f1b bf16 vs 1 rank")
figs["pp2_moe_1f1b_fp32_rel"] = close(losses("moe32"), losses("refmoe"), 2e-3, dev + " pp 2 1f1b fp32 MoE vs 1 rank")
figs["pp2_ckpt_vs_1f1b_rel"] = close(losses("ck32"), losses("f1b32"), 1e-4,
                                     dev + " pp 2 1f1b fp32 with activation checkpointing vs without")
if dev == "cuda":
    figs["pp2_zbh2_vs_1f1b_rel"] = close(losses("zbh232"), losses("f1b32"), 1e-4, dev + " pp 2 zb-h2 vs 1f1b fp32")
    figs["pp2_interleaved_vs_1f1b_rel"] = close(losses("il32"), losses("f1b32"), 1e-4,
                                                dev + " pp 2 interleaved (2 chunks) vs 1f1b fp32")
    figs["pp2_zbh1_bf16_rel"] = close(losses("zbh116"), r16, 2e-2, dev + " pp 2 zb-h1 bf16 (bf16 activations) vs 1 rank")
    assert "keeps fp32 activations" not in open(os.path.join(w, "zbh116.out")).read(), "the bf16 split fell back"
    figs["pp2_ckpt_offload_vs_1f1b_rel"] = close(losses("ckoff32"), losses("f1b32"), 1e-4,
                                                 dev + " pp 2 1f1b fp32 with cpu_checkpointing vs without")
    figs["pp2_moe_zbh1_vs_1f1b_rel"] = close(losses("moezb32"), losses("moe32"), 1e-4,
                                             dev + " pp 2 zb-h1 fp32 MoE vs 1f1b MoE")
print("FIGURES " + json.dumps(figs))
PY
echo "ok: zero-train pipeline on $dev (pp 2, 1f1b and zb-h1, fp32 and bf16, activation checkpointing) against the single-rank run"
