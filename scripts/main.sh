#!/bin/bash
# The main job on a fresh Debian 12 machine (as root):
#   set up, build, then train the small GPT of zero-train's built-in config
#   (4 layers, 4 heads, d_model 128, seq 64, byte-level) on the default corpus
#   (this machine's Python standard library sources) on 2 CPU ranks with ZeRO
#   stage 3, printing the loss as it falls. A few minutes on 2 cores.
# Extra arguments go to zero-train (e.g. --steps 100, --stage 1, --config FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build

out=build/main-run
rm -rf "$out"
mkdir -p "$out"
# One thread per rank: two ranks share the two cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# Open MPI hands ranks a pseudo-terminal, so ask for plain lines when our own
# output is not a terminal.
plain=()
[ -t 1 ] || plain=(--plain)
echo "main: tests/mpirun.sh 2 build/tools/train/zero-train --checkpoint-dir $out/ckpt --metrics $out/metrics.jsonl $*"
start=$(date +%s.%N)
tests/mpirun.sh 2 build/tools/train/zero-train "${plain[@]}" --checkpoint-dir "$out/ckpt" \
  --metrics "$out/metrics.jsonl" "$@"
end=$(date +%s.%N)

/usr/bin/python3 - "$out/metrics.jsonl" "$start" "$end" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
wall = float(sys.argv[3]) - float(sys.argv[2])
first = sum(r["loss"] for r in rows[:10]) / min(10, len(rows))
last = sum(r["loss"] for r in rows[-10:]) / min(10, len(rows))
print(f"main: {len(rows)} steps; mean loss of the first 10 steps {first:.3f}, of the last 10 {last:.3f} "
      f"(uniform over 256 bytes: 5.545); {wall:.0f} s wall including start-up")
if not last < first - 0.5:
    print("main: the loss did not fall as expected")
    sys.exit(1)
PY
echo "main: checkpoint: build/tools/ckpt/zero-ckpt inspect $out/ckpt"
