#!/bin/bash
# Configure and build libzero:  scripts/build.sh [BUILD_DIR [extra meson args...]]
# BUILD_DIR defaults to build/. Re-running reconfigures an existing directory.
#
# Jobs: ZERO_BUILD_JOBS if set, else the CPUs this process may run on plus one
# (nproc honours the affinity mask and cgroup cpusets). The compiles are
# CPU-bound and small: the largest, nvcc on model/gpt_cuda.cu, takes 4.5 s of
# CPU and 0.2 GB peak RSS (/usr/bin/time -v, measured 2026-12-02), so memory
# never limits the count and one job beyond the cores covers the waits on
# ccache, the linker and the disk. On CI's 2-core machine that is 3 jobs, what
# ninja guesses there itself (it says 2 cores + 2 in general, but 3 for 2
# cores); written out so the count does not hang on ninja's heuristic and so a
# shared machine can ask for fewer (ZERO_BUILD_JOBS=1: every core taken by
# others' builds already, more jobs only make all of them slower).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
if [ -f "$dir/build.ninja" ]; then
  meson setup --reconfigure "$dir" "$@" >/dev/null
else
  meson setup "$dir" "$@"
fi
jobs=${ZERO_BUILD_JOBS:-$(( $(nproc) + 1 ))}
ninja -C "$dir" -j "$jobs"
