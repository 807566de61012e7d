#!/bin/bash
# The whole test suite on a fresh machine: set up, build (a normal build, an
# AddressSanitizer + UndefinedBehaviorSanitizer build, and a ThreadSanitizer
# build of the async-device tests), run every test, and end
# with the line "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

status=0
bash scripts/build.sh build || status=1
# CUDA is left out of the sanitizer build: nvcc objects carry no ASan
# instrumentation; the normal build compiles and links every CUDA source.
bash scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled \
  || status=1

# ThreadSanitizer over the asynchronous CPU device (a worker thread per
# stream) and the engine's stream hand-offs: only the programs of meson suite
# 'tsan' are built and run (tens of seconds, not a third build of everything).
tsan_targets=(tests/device/test_device_async tests/engine/test_engine_stream tests/collectives/test_coll_stream)
if { [ -f build-tsan/build.ninja ] || meson setup build-tsan -Db_sanitize=thread -Db_lundef=false -Dcuda=disabled \
       >/dev/null; } && ninja -C build-tsan "${tsan_targets[@]}"; then :; else status=1; fi

logs=()
for dir in build build-asan; do
  if [ -f "$dir/build.ninja" ]; then
    meson test -C "$dir" --print-errorlogs --num-processes 2 --timeout-multiplier 3 || true
    logs+=("$dir/meson-logs/testlog.json")
  fi
done
if [ -f build-tsan/build.ninja ]; then
  # OpenMP's runtime is not instrumented: one thread per team keeps it out.
  OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1" meson test -C build-tsan --no-rebuild --suite tsan \
    --print-errorlogs --num-processes 2 --timeout-multiplier 3 || true
  logs+=("build-tsan/meson-logs/testlog.json")
fi

# Python tests (bindings, model and optimizer against PyTorch) run on the
# project interpreter against the normal build.
py=$(meson introspect build --buildoptions 2>/dev/null | /usr/bin/python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="python"))' \
  2>/dev/null || echo /usr/bin/python3)
pydirs=()
for d in tests/python bindings/python/tests; do
  compgen -G "$d/test_*.py" >/dev/null && pydirs+=("$d")
done
if [ ${#pydirs[@]} -gt 0 ]; then
  ZERO_BUILD_ROOT=$root/build "$py" -m pytest -q -p no:cacheprovider \
    --junitxml="$root/build/pytest-junit.xml" "${pydirs[@]}" || true
  logs+=("build/pytest-junit.xml")
fi

# A failed build counts as one failed test, so the count line stays last.
[ $status -eq 0 ] || echo "test.sh: a build failed (see above)"
"$py" scripts/summarize_tests.py --extra-failed $status "${logs[@]}"
