#!/bin/bash
# CUDA as a module that a CPU-only consumer never loads (device/cuda_module.h,
# docs/device.md "The CUDA module"):
#   (a) libzero.so has no DT_NEEDED on libcudart, libcublas, libnccl or libcuda;
#       in a CUDA build libzero-cuda.so.<major> lies beside it, needs libcudart
#       and exports one symbol, its table;
#   (b) a CPU-only consumer runs, and maps no CUDA library, with CUDA's
#       libraries off the loader's path: ld.so --inhibit-cache (so
#       /etc/ld.so.cache cannot supply them) and a --library-path of the
#       system's library directories without any CUDA one;
#   (c) CUDA build: opening a CUDA device loads the module and, without a GPU,
#       is ZERO_UNSUPPORTED "no usable CUDA device" (a NCCL comm too);
#   (d) CUDA build: ZERO_CUDA_MODULE=<missing file> makes it ZERO_UNSUPPORTED
#       naming that file, and with CUDA's libraries off the loader's path
#       (as in (b)) naming the libcudart the module could not load.
# Usage: test_cuda_module.sh BUILD_DIR TEST_PROGRAM HAVE_CUDA(0|1)
set -uo pipefail
build=$1 prog=$2 have_cuda=$3
fail=0
bad() { echo "FAIL: $*"; fail=1; }

version=$(meson introspect "$build" --projectinfo | /usr/bin/python3 -c \
  'import json,sys; print(json.load(sys.stdin)["version"])')
lib=$build/libzero.so.$version
module=$build/libzero-cuda.so.${version%%.*}
[ -f "$lib" ] || { echo "FAIL: no $lib"; exit 1; }
cuda_re='lib(cudart|cublas|cublasLt|nccl|cuda)\.so'

# (a)
needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {gsub(/[][]/, "", $NF); print $NF}')
echo "libzero NEEDED: $(echo $needed)"
echo "$needed" | grep -E "$cuda_re" && bad "libzero.so needs a CUDA library (above)"
if [ "$have_cuda" = 1 ]; then
  if [ -f "$module" ]; then
    mneeded=$(readelf -d "$module" | awk '/\(NEEDED\)/ {gsub(/[][]/, "", $NF); print $NF}')
    echo "libzero-cuda NEEDED: $(echo $mneeded)"
    echo "$mneeded" | grep -q libcudart || bad "libzero-cuda does not need libcudart: is the runtime linked in?"
    exported=$(nm -D --defined-only "$module" | awk '$2 ~ /^[TDRB]$/ {print $3}')
    [ "$exported" = zero_cuda_module_table ] || bad "libzero-cuda exports '$(echo $exported)', not just zero_cuda_module_table"
  else
    bad "CUDA build without $module"
  fi
fi

# (b) The system's library directories (ld.so.conf and the defaults), leaving out every one
# that holds a CUDA library (CUDA's own, and e.g. /usr/local/lib with links into it).
dirs=$build
for d in $(cat /etc/ld.so.conf /etc/ld.so.conf.d/*.conf 2>/dev/null | grep -vE '^\s*(#|include|$)') \
         /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /lib /usr/lib; do
  [ -d "$d" ] || continue
  ls "$d" | grep -qE "^$cuda_re" && continue
  dirs=$dirs:$d
done
echo "loader path without CUDA: $dirs"
ldso=$(readelf -l "$prog" | sed -nE 's/.*interpreter: ([^]]+)\]/\1/p')
[ -x "$ldso" ] || { echo "FAIL: no program interpreter for $prog"; exit 1; }
nocuda() { env -u LD_LIBRARY_PATH -u LD_PRELOAD "$ldso" --inhibit-cache --library-path "$dirs" "$@"; }
nocuda "$prog" cpu || bad "the CPU-only consumer failed with CUDA's libraries off the loader's path (exit $?)"
# Sanity: that path really lacks them (else (b) would prove nothing).
if [ "$have_cuda" = 1 ] && nocuda --list "$module" 2>&1 | grep -qE 'libcudart[^ ]* => /'; then
  bad "the restricted loader path still finds libcudart: $(nocuda --list "$module" 2>&1 | grep libcudart)"
fi

if [ "$have_cuda" = 1 ]; then
  # (c)
  "$prog" cuda || bad "opening CUDA with the module present (exit $?)"
  # (d)
  missing=$(mktemp -u /tmp/zero-no-such-dir-XXXXXX)/libzero-cuda.so.1
  ZERO_CUDA_MODULE=$missing "$prog" missing || bad "ZERO_CUDA_MODULE=$missing (exit $?)"
  nocuda "$prog" nolibs || bad "the module with CUDA's libraries off the loader's path (exit $?)"
else
  echo "(c), (d): a CPU-only build, nothing to load"
fi
exit $fail
