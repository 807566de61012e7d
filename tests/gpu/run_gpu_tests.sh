#!/bin/bash
# GPU checks that CI (no GPU) can only compile: run on a machine with a CUDA
# device after building, e.g.  tests/gpu/run_gpu_tests.sh build
# Each area appends its own section below; the script ends with a summary and
# exits non-zero if any check failed (77 = skipped counts as not run).
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
pass=0 fail=0 skip=0
gpu_check() { # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  "$@"
  local rc=$?
  case $rc in
    0) pass=$((pass + 1)); echo "--- $name: PASS" ;;
    77) skip=$((skip + 1)); echo "--- $name: SKIP" ;;
    *) fail=$((fail + 1)); echo "--- $name: FAIL (rc $rc)" ;;
  esac
}
# The summary runs at exit, so sections can simply be appended below.
trap 'echo "GPU checks: $pass passed, $fail failed, $skip skipped"; [ $fail -eq 0 ] || exit 1' EXIT

# ---------------------------------------------------------------- collectives
# NCCL at world size 1 (one rank per GPU), STAGED at world size 2 (two ranks
# sharing GPU 0 through pinned host memory over MPI).
gpu_check coll_nccl_np1 tests/mpirun.sh 1 "$build/tests/collectives/test_coll_gpu" nccl
gpu_check coll_staged_np2 tests/mpirun.sh 2 "$build/tests/collectives/test_coll_gpu" staged

# ---------------------------------------------------------------- model (GPT CUDA path)
# The CUDA GPT against the CPU GPT: fp32 math tightly (kernels), bf16 math and
# bf16 params within stated bf16 tolerances (see tests/model/test_gpt_cuda.c).
gpu_check model_gpt_cuda "$build/tests/model/test_gpt_cuda"
