#!/bin/bash
# Rehearse, on this machine (no GPU), the GPU run exactly as the device tool
# would start it on a bare CUDA machine (docs/gpu-run.md):
#
#   scripts/gpu_rehearse.sh [BUNDLE_DIR]       (default .gpu-bundle; needs root)
#   ZERO_REHEARSE_DIR=DIR scripts/gpu_rehearse.sh   (again, in DIR: see below)
#
# 1. copies what the device tool sends: the tracked and the untracked,
#    not-ignored files, plus the carried bundle, into a fresh directory;
# 2. in a private mount namespace, hides every file that this machine's own
#    copies of the bundled packages installed (Open MPI, PMIx, hwloc,
#    jansson, liburing, OpenBLAS, ...: /dev/null bound over each), and ssh,
#    which a bare machine lacks too: a program that reached for the system's
#    copy instead of the bundle's would fail, not pass quietly;
# 3. runs tests/gpu/run_gpu_tests.sh there under `env -i` (only PATH, HOME and
#    ZERO_GPU_REHEARSE=1), so it builds libzero against the bundle, runs the
#    multi-rank CPU checks under the bundled mpirun, and skips the GPU checks
#    (ZERO_REHEARSE_NCCL_WHEEL=1: with NCCL only as PyTorch's wheel, below).
# The log and the JSON summary stay in the printed directory.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(cd "${1:-$src/.gpu-bundle}" && pwd)
[ "$(id -u)" = 0 ] || { echo "gpu_rehearse: needs root (a mount namespace)"; exit 77; }
# ZERO_REHEARSE_DIR=an earlier rehearsal's directory: the tree is copied over
# it and its build-gpu/ and .gpu-deps/ are reused, as on a warm GPU machine.
work=${ZERO_REHEARSE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/zero-gpu-rehearsal-XXXXXX")}
repo=$work/repo
mkdir -p "$repo"
rm -rf "$repo/.gpu-bundle" "$work/wheel" "$work"/orig-* "$work"/shadow-*
(cd "$src" && git ls-files -z -co --exclude-standard | xargs -0 -I{} sh -c '[ -e "$1" ] && printf "%s\0" "$1"' _ {} |
   tar --null -T - -cf -) | tar -C "$repo" -xf -
cp -r "$bundle" "$repo/.gpu-bundle"
echo "gpu_rehearse: tree and bundle in $repo ($(du -sm --exclude=build-gpu --exclude=.gpu-deps --exclude=.gpu-local "$repo" | cut -f1) MiB travel; the device tool's limit is 64)"

# The files this machine's copies of the bundled packages own.
hide=$work/hidden.txt
: > "$hide"
for p in $(sed 's/#.*//; /^[[:space:]]*$/d' "$src/tests/gpu/bundle_packages.txt"); do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || continue
  dpkg -L "$p" | while IFS= read -r f; do if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f"; fi; done >> "$hide"
done
for f in /usr/bin/ssh /usr/bin/rsh /usr/bin/slogin; do if [ -e "$f" ]; then readlink -f "$f" >> "$hide"; fi; done
echo "gpu_rehearse: hiding $(wc -l < "$hide") files of this machine's own copies"

# ZERO_REHEARSE_NCCL_WHEEL=1: NCCL is hidden from the toolkit's folders and
# offered only as PyTorch's nvidia-nccl wheel lays it out (lib/libnccl.so.2
# and include/, no libnccl.so), on PYTHONPATH: run_gpu_tests.sh must find it
# there, as it will on an image whose only NCCL is that wheel.
nccl_wheel=${ZERO_REHEARSE_NCCL_WHEEL:-0}
t0=$(date +%s)
set +e
unshare -m --propagation private bash -c '
  set -e
  while IFS= read -r f; do mount --bind /dev/null "$f"; done < "$1"
  pythonpath=
  if [ "$4" = 1 ]; then
    w=$3/wheel/nvidia/nccl
    mkdir -p "$w"
    # A folder without its nccl* entries (absent, not empty: an empty nccl.h
    # earlier on the include path would still be found): the original moves
    # to $3/orig-<name>, a folder of links to all else takes its place.
    for d in lib64 include; do
      real=$(readlink -f "/usr/local/cuda/$d")
      mkdir -p "$3/orig-$d" "$3/shadow-$d"
      mount --bind "$real" "$3/orig-$d"
      for f in "$3/orig-$d"/*; do case ${f##*/} in *nccl*) ;; *) ln -s "$f" "$3/shadow-$d/";; esac; done
      mount --bind "$3/shadow-$d" "$real"
    done
    mkdir -p "$w/lib" "$w/include"
    ln -s "$3/orig-lib64/libnccl.so.2" "$w/lib/"
    cp -r "$3"/orig-include/nccl* "$w/include/"
    pythonpath=$3/wheel
    echo "gpu_rehearse: NCCL only as a wheel in $w"
  fi
  cd "$2" && exec env -i PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME="$HOME" ${pythonpath:+PYTHONPATH=$pythonpath} ZERO_GPU_REHEARSE=1 ZERO_GPU_JSON="$3/gpu_checks.json" \
    bash tests/gpu/run_gpu_tests.sh build-gpu
' _ "$hide" "$repo" "$work" "$nccl_wheel" 2>&1 | tee "$work/log"
rc=${PIPESTATUS[0]}
set -e
echo "gpu_rehearse: rc $rc, $(( $(date +%s) - t0 )) s wall; log $work/log, summary $work/gpu_checks.json"
exit "$rc"
