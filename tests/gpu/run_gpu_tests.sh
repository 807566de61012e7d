#!/bin/bash
# Build libzero with CUDA and run every test that needs a GPU (meson suite
# 'gpu'), then print "N passed, N failed, N skipped".
#
#   tests/gpu/run_gpu_tests.sh [build-dir]       (default: build-gpu)
#
# Environment:
#   ZERO_CUDA_ARCH   e.g. sm_90: compile device code for that GPU
#                    (default: nvcc's default target, JIT-compiled from PTX)
#   ZERO_GPU_SETUP   extra `meson setup` options, e.g. "-Dnccl=disabled"
#
# On a GPU machine a skipped GPU test is a failure (it means the GPU was not
# seen), so the exit status is 0 only when every GPU test passed. Without a
# GPU the script says so and exits 77.
#
# To add GPU tests from another area, give them suite 'gpu' in meson
# (suite: ['<area>', 'gpu']); they are picked up here. Area-specific extra
# steps go in the marked section below.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run_gpu_tests: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to run"
  echo "0 passed, 0 failed, 0 skipped"
  exit 77
fi
nvidia-smi -L

setup_args=(-Dcuda=enabled)
[ -n "${ZERO_CUDA_ARCH:-}" ] && setup_args+=("-Dcuda_args=-arch=${ZERO_CUDA_ARCH}")
# shellcheck disable=SC2206
[ -n "${ZERO_GPU_SETUP:-}" ] && setup_args+=(${ZERO_GPU_SETUP})
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" "${setup_args[@]}" >/dev/null || exit 1
else
  meson setup "$build" "${setup_args[@]}" >/dev/null || { echo "meson setup failed"; exit 1; }
fi
ninja -C "$build" -j"$(nproc)" || { echo "build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

status=0
meson test -C "$build" --suite gpu --print-errorlogs --num-processes 1 || status=1

# ---- extra GPU checks from other areas go here (append, keep each short) ----

# ---- summary ----
/usr/bin/python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0}
for line in open(sys.argv[1]):
    t = json.loads(line)
    r = t.get("result", "")
    key = "OK" if r in ("OK", "EXPECTEDFAIL") else "SKIP" if r == "SKIP" else "FAIL"
    counts[key] += 1
    if key != "OK":
        print(f"  {r}: {t['name']}")
print(f"{counts['OK']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
sys.exit(1 if counts["FAIL"] or counts["SKIP"] else 0)
PY
rc=$?
[ $status -eq 0 ] && [ $rc -eq 0 ]
