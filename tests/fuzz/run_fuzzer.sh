#!/bin/bash
# Run one libFuzzer target for a fixed time on its committed seed corpus:
#   run_fuzzer.sh TARGET CORPUS_DIR SECONDS [libFuzzer flags...]
# The committed corpus is read, never written: new inputs go to a scratch
# directory that is removed afterwards. A crash, a leak, a sanitizer report
# or a failed property fails the test and leaves the input in
# $ZERO_FUZZ_ARTIFACTS (default: the build's meson-logs/fuzz-artifacts).
# Exit 77 (skipped) when the target was not built (no clang/libFuzzer).
set -u
target=$1 corpus=$2 seconds=$3
shift 3
if [ ! -x "$target" ]; then
  echo "skip: $target was not built (needs clang with libFuzzer; see docs/fuzzing.md)"
  exit 77
fi
name=$(basename "$target")
artifacts=${ZERO_FUZZ_ARTIFACTS:-${ZERO_BUILD_ROOT:-.}/meson-logs/fuzz-artifacts}
mkdir -p "$artifacts"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/$name-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# detect_leaks: the library must not leak on any input either.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$target" -seed="${ZERO_FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$artifacts/$name-" "$@" "$scratch" "$corpus" 2>&1 | tail -n 40
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "$name: failed (exit $rc); the input is in $artifacts"
  exit 1
fi
echo "$name: ${seconds} s on $(ls "$corpus" | wc -l) seeds, no failure"
