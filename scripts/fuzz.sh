#!/bin/bash
# The longer fuzzing run (docs/fuzzing.md): build the libFuzzer targets of
# tests/fuzz in BUILD_DIR (default build/), then run each for SECONDS
# (default 600) on a working corpus seeded from the committed one, with
# JOBS parallel workers each (default 1).
#   scripts/fuzz.sh [SECONDS [BUILD_DIR [JOBS [TARGET...]]]]
# Working corpora persist in BUILD_DIR/fuzz-corpus/<target> between runs; a
# failing input is saved as BUILD_DIR/fuzz-artifacts/<target>-crash-*. Add
# new interesting inputs to tests/fuzz/corpus/<target> by hand (libFuzzer's
# -merge=1 keeps only the ones adding coverage).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
dir=${2:-build}
jobs=${3:-1}
shift $(( $# < 3 ? $# : 3 ))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config_json train_config ckpt_meta ckpt_shard ckpt_dir)
[ -f "$dir/build.ninja" ] || bash scripts/build.sh "$dir" -Dcuda=disabled
for t in "${targets[@]}"; do
  ninja -C "$dir" "tests/fuzz/fuzz_$t" >/dev/null || { echo "fuzz.sh: cannot build fuzz_$t (needs clang + libFuzzer)"; exit 1; }
done
mkdir -p "$dir/fuzz-artifacts"
status=0
for t in "${targets[@]}"; do
  work="$dir/fuzz-corpus/$t"
  mkdir -p "$work"
  echo "== fuzz_$t: $seconds s, $jobs job(s), corpus $work + tests/fuzz/corpus/$t"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$dir/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -jobs="$jobs" -workers="$jobs" -artifact_prefix="$dir/fuzz-artifacts/$t-" \
    "$work" "tests/fuzz/corpus/$t" 2>&1 | grep -E "^(#[0-9]+ +DONE|stat::|==[0-9]+==ERROR|SUMMARY|fuzz property)" || true
  if ls "$dir/fuzz-artifacts/$t-"* >/dev/null 2>&1; then
    echo "fuzz_$t: FAILED, inputs in $dir/fuzz-artifacts/"
    status=1
  fi
done
exit $status
