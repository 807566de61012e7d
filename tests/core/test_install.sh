#!/bin/bash
# The installed library as a consumer sees it:
#   - `meson install` lays out libzero.so.<major> with a versioned SONAME, the
#     public headers under include/zero/ and zero.pc;
#   - a C program builds against it through `pkg-config zero` alone and runs;
#   - zero.pc points into the destdir it was installed to: relocatable
#     (prefix=${pcfiledir}/..., the default since meson.build sets
#     pkgconfig.relocatable) or, in a build directory configured before that,
#     through PKG_CONFIG_SYSROOT_DIR; and it names no library by absolute file
#     path (libnccl.so used to be), only -L/-l flags;
#   - the exported symbols are exactly the functions the headers mark ZERO_API;
#   - zero.pc names no CUDA library, and a CUDA build's libzero-cuda is installed
#     beside libzero and found there (device/cuda_module.h);
#   - zero.h is the stable surface alone: the consumer above builds without
#     ZERO_EXPERIMENTAL, and zero/experimental.h (with offload.h, topo.h)
#     refuses to compile unless it is defined (docs/abi.md).
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null
prefix=$(meson introspect "$build" --buildoptions | /usr/bin/python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
root=$tmp/root$prefix
pc=$(find "$root" -name zero.pc | head -1)
[ -n "$pc" ] || { bad "zero.pc not installed"; exit 1; }
lib=$(find "$root" -name 'libzero.so.*.*.*' | head -1)
[ -n "$lib" ] || { bad "libzero.so.X.Y.Z not installed"; exit 1; }
major=$(grep -m1 "version:" "$src/meson.build" | sed -E "s/.*'([0-9]+)\..*/\1/")
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[ "$soname" = "libzero.so.$major" ] || bad "SONAME is '$soname', expected libzero.so.$major"
for h in zero.h status.h comm.h device.h engine.h checkpoint.h version.h; do
  [ -f "$root/include/zero/$h" ] || bad "include/zero/$h not installed"
done

# A consumer that knows nothing but pkg-config.
cat > "$tmp/consumer.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <zero/zero.h>
int main(void)
{
    zero_config cfg = ZERO_CONFIG_INIT;
    if (zero_version() != ZERO_VERSION) return 1;
    if (zero_config_from_json(&cfg, "{\"zero_optimization\": {\"stage\": 2}}") != ZERO_OK || cfg.stage != 2) return 2;
    if (zero_config_from_json(&cfg, "{\"zero_optimization\": {\"stage\": 7}}") != ZERO_CONFIG) return 3;
    if (!strstr(zero_last_error(), "zero_optimization.stage")) return 4;
    puts(zero_version_string());
    return 0;
}
C
# Relocatable: ${pcfiledir} finds the tree wherever it lies. An older build
# directory's pc names the configured prefix: the sysroot maps it into the destdir.
export PKG_CONFIG_PATH=$(dirname "$pc")
if grep -q '^prefix=${pcfiledir}' "$pc"; then mode=relocatable
else mode=sysroot; export PKG_CONFIG_SYSROOT_DIR=$tmp/root; fi
flags=$(pkg-config --cflags --libs zero)
# zero's own -I and -L come first; both must lie inside the destdir.
inc=$(pkg-config --cflags-only-I zero | awk '{print $1}'); inc=${inc#-I}
libd=$(pkg-config --libs-only-L zero | awk '{print $1}'); libd=${libd#-L}
[ "$(realpath -m "$inc")" = "$(realpath "$root/include")" ] \
  || bad "pkg-config --cflags ($mode) gives -I$inc, not the destdir's $root/include"
[ "$(realpath -m "$libd")" = "$(realpath "$(dirname "$lib")")" ] \
  || bad "pkg-config --libs ($mode) gives -L$libd, not the destdir's $(dirname "$lib")"
# No library named by absolute file path (only -L<dir> -l<name>), in Libs or Libs.private.
abs=$(grep -E '^Libs' "$pc" | tr ' ' '\n' | grep -E '^/.*\.(so|a)(\.[0-9]+)*$' || true)
[ -z "$abs" ] || bad "zero.pc names libraries by absolute path: $(echo $abs)"
# libzero links no CUDA library (the CUDA module does: docs/device.md), so zero.pc names none.
cudalibs=$(grep -E '^Libs' "$pc" | tr ' ' '\n' | grep -E '^-l(cudart|cublas|cublasLt|nccl|cuda)$' || true)
[ -z "$cudalibs" ] || bad "zero.pc names CUDA libraries: $(echo $cudalibs)"
# A sanitizer build's library needs the sanitizer runtime in the program too.
san=$(meson introspect "$build" --buildoptions | /usr/bin/python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="b_sanitize"))')
[ "$san" = none ] || flags="$flags -fsanitize=$san"
cc -std=c11 -Wall -Wextra -Werror "$tmp/consumer.c" -o "$tmp/consumer" $flags
LD_LIBRARY_PATH=$(dirname "$lib") "$tmp/consumer" >/dev/null || bad "consumer built via pkg-config failed (exit $?)"

# A CUDA build installs the CUDA module beside libzero, and the installed (moved: destdir)
# libzero finds it there: opening a CUDA device gets past the load (to "no usable CUDA
# device" without a GPU, or a device with one), never "could not be loaded".
if [ -n "$(find "$build" -maxdepth 1 -name 'libzero-cuda.so.*')" ]; then
  [ -f "$(dirname "$lib")/libzero-cuda.so.$major" ] || bad "libzero-cuda.so.$major not installed beside $lib"
  printf '#include <stdio.h>\n#include <string.h>\n#include <zero/zero.h>\nint main(void) { zero_device *d = 0;\n'\
'  zero_status st = zero_device_create(&d, ZERO_DEVICE_CUDA, 0); zero_device_destroy(d);\n'\
'  if (st == ZERO_OK) return 0;\n  puts(zero_last_error());\n'\
'  return st == ZERO_UNSUPPORTED && strstr(zero_last_error(), "no usable CUDA device") ? 0 : 1; }\n' > "$tmp/cuda_open.c"
  cc -std=c11 -Wall -Werror "$tmp/cuda_open.c" -o "$tmp/cuda_open" $flags
  LD_LIBRARY_PATH=$(dirname "$lib") "$tmp/cuda_open" || bad "the installed libzero did not load its CUDA module"
fi

# The ABI is exactly the header: every ZERO_API function exported, nothing else.
grep -hoE '^ZERO_API[^;(]*\b[a-z_][a-z0-9_]*\(' "$root"/include/zero/*.h \
  | sed -E 's/.*\b([a-z_][a-z0-9_]*)\($/\1/' | sort -u > "$tmp/declared"
nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | sort -u > "$tmp/exported"
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
[ -z "$extra" ] || bad "exported but not declared ZERO_API: $(echo $extra)"
[ -z "$missing" ] || bad "declared ZERO_API but not exported: $(echo $missing)"
# The names renamed at 1.0 still compile (deprecated macros, docs/abi.md) unless ZERO_NO_DEPRECATED.
printf '#include <zero/zero.h>\nint main(void) { zero_device *d = 0; zero_device_open(&d, ZERO_DEVICE_CPU, 0);\n'\
'  zero_device_close(d); return 0; }\n' > "$tmp/old_names.c"
cc -std=c11 -fsyntax-only -Wall -Werror $(pkg-config --cflags zero) "$tmp/old_names.c" \
  || bad "a deprecated name (zero_device_open) does not compile"
if cc -std=c11 -fsyntax-only -Werror -DZERO_NO_DEPRECATED $(pkg-config --cflags zero) "$tmp/old_names.c" 2>/dev/null; then
  bad "ZERO_NO_DEPRECATED still accepts the deprecated zero_device_open"
fi
nm -D --defined-only "$lib" | grep -qw zero_device_open && bad "the deprecated name zero_device_open is exported"

# The experimental surface is opt-in.
exp_headers="experimental.h offload.h topo.h"
for h in $exp_headers; do
  printf '#include <zero/%s>\nint main(void) { return 0; }\n' "$h" > "$tmp/exp.c"
  if cc -std=c11 -fsyntax-only $(pkg-config --cflags zero) "$tmp/exp.c" 2>/dev/null; then
    bad "zero/$h compiles without ZERO_EXPERIMENTAL"
  fi
  cc -std=c11 -fsyntax-only -DZERO_EXPERIMENTAL $(pkg-config --cflags zero) "$tmp/exp.c" \
    || bad "zero/$h does not compile with ZERO_EXPERIMENTAL"
done
grep -hoE '^ZERO_API[^;(]*\b[a-z_][a-z0-9_]*\(' $(for h in $exp_headers; do echo "$root/include/zero/$h"; done) \
  | sed -E 's/.*\b([a-z_][a-z0-9_]*)\($/\1/' | sort -u > "$tmp/experimental"
echo "install: SONAME $soname; $(comm -23 "$tmp/exported" "$tmp/experimental" | wc -l) stable +" \
     "$(wc -l < "$tmp/experimental") experimental functions; pc $mode; $(wc -l < "$tmp/exported") functions exported, $(wc -l < "$tmp/declared") declared ZERO_API"
exit $fail
