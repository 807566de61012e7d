#!/bin/sh
# zero-topo runs and prints what it should:
#  - on this machine, the summary line and one plan line per local rank;
#  - on a synthetic 4-node machine, exactly the expected plan.
set -u
tool=$1
fail=0
out=$("$tool" --local-size 2 2>&1)
rc=$?
case "$out" in *"built without hwloc"*) echo "SKIP: $out"; exit 77;; esac
[ $rc = 0 ] || { echo "zero-topo failed: $out"; exit 1; }
echo "$out"
echo "$out" | grep -Eq '^  packages [0-9]+, NUMA nodes [1-9][0-9]*, cores [1-9][0-9]*, PUs [1-9][0-9]*, GPUs [0-9]+$' \
  || { echo "FAIL: no summary line"; fail=1; }
for r in 0 1; do
  echo "$out" | grep -Eq "^  local rank $r: PUs [0-9]" || { echo "FAIL: no plan for local rank $r"; fail=1; }
done
[ "$(echo "$out" | grep -c '^  local rank')" = 2 ] || { echo "FAIL: not exactly 2 plan lines"; fail=1; }

out=$("$tool" --synthetic "pack:2 numa:2 core:4 pu:2" --local-size 4) || { echo "zero-topo failed: $out"; exit 1; }
echo "$out"
expected='  local rank 0: PUs 0-7 (4 cores, near NUMA node 0, exclusive)
  local rank 1: PUs 8-15 (4 cores, near NUMA node 1, exclusive)
  local rank 2: PUs 16-23 (4 cores, near NUMA node 2, exclusive)
  local rank 3: PUs 24-31 (4 cores, near NUMA node 3, exclusive)'
[ "$(echo "$out" | grep '^  local rank')" = "$expected" ] || { echo "FAIL: synthetic plan differs from:"; echo "$expected"; fail=1; }

# bad arguments are refused with status 2
"$tool" --local-size 0 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: --local-size 0 accepted"; fail=1; }
exit $fail
