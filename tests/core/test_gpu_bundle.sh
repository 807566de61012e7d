#!/bin/bash
# The GPU run's bundle logic (docs/gpu-run.md) on a fake bundle, without
# network or GPU: scripts/gpu_bundle.sh builds the manifest from local .deb
# files (ZERO_BUNDLE_FROM) and enforces its budget; tests/gpu/bundle_env.sh
# checks each .deb against the manifest, points .pc files into the prefix
# exactly once (a name that is a link to another included), makes Debian's
# alternatives links, drops docs, static archives and libraries that need what
# no bundle brings (bundle_ldd_bad), skips a second unpack of the same bundle,
# and never empties a folder that is not a bundle's.
#   tests/core/test_gpu_bundle.sh SOURCE_ROOT
# Exit 77 without dpkg-deb or a C compiler.
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
command -v dpkg-deb >/dev/null && command -v cc >/dev/null || { echo "needs dpkg-deb and cc"; exit 77; }
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
check() { # description command...
  if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}

# Two packages: a fake mpirun.openmpi; a .pc file (and a link to it), docs, an
# archive, a library closed over the bundle and one that needs libjansson,
# which no bundle of this test brings.
mk() { mkdir -p "$t/$1/DEBIAN" && printf 'Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: t\nDescription: t\n' \
         "$1" > "$t/$1/DEBIAN/control"; }
mk zfake-bin
mkdir -p "$t/zfake-bin/usr/bin"
printf '#!/bin/sh\necho fake-mpirun\n' > "$t/zfake-bin/usr/bin/mpirun.openmpi"
chmod +x "$t/zfake-bin/usr/bin/mpirun.openmpi"
mk zfake-dev
l=$t/zfake-dev/usr/lib/x86_64-linux-gnu
mkdir -p "$l/pkgconfig" "$l/zfake/pkgconfig" "$t/zfake-dev/usr/share/doc/zfake"
printf 'prefix=/usr\nlibdir=${prefix}/lib/x86_64-linux-gnu\nincludedir=/usr/include\nName: zfake\nDescription: t\nVersion: 1\nLibs: -L${libdir} -lzfake\nCflags: -I${includedir}\n' \
  > "$l/pkgconfig/zfake.pc"
ln -s ../../pkgconfig/zfake.pc "$l/zfake/pkgconfig/zfake-link.pc"
echo doc > "$t/zfake-dev/usr/share/doc/zfake/README"
echo 'int zfake(void) { return 1; }' > "$t/z.c"
echo 'void *json_object(void); void *zfake(void) { return json_object(); }' > "$t/zj.c"
cc -shared -fPIC -o "$l/libzfake_ok.so.1" "$t/z.c"
cc -shared -fPIC -o "$l/libzfake_out.so.1" "$t/zj.c" -Wl,--no-as-needed -ljansson
cc -c -o "$t/z.o" "$t/z.c" && ar rc "$l/libzfake.a" "$t/z.o"
mkdir -p "$t/debs"
for p in zfake-bin zfake-dev; do dpkg-deb --build --root-owner-group "$t/$p" "$t/debs/${p}_1.0_all.deb" >/dev/null; done
printf '# test\nzfake-bin\nzfake-dev  # with a comment\n' > "$t/list.txt"

# ---------------------------------------------------------------- gpu_bundle.sh
export ZERO_BUNDLE_LIST=$t/list.txt ZERO_BUNDLE_FROM=$t/debs
quiet() { "$@" > "$t/out.log" 2>&1 || { cat "$t/out.log"; return 1; }; }
check "gpu_bundle.sh builds the bundle" quiet bash "$src/scripts/gpu_bundle.sh" "$t/bundle"
manifest_ok() {
  (cd "$t/bundle/debs" && [ "$(wc -l < ../MANIFEST)" = 2 ] &&
   awk '{ print $4 "  " $5 }' ../MANIFEST | sha256sum -c --quiet &&
   [ "$(awk '$1 == "zfake-bin" { print $3 }' ../MANIFEST)" = "$(stat -c %s zfake-bin_1.0_all.deb)" ])
}
check "MANIFEST: one line per package, the files' sizes and sha256" manifest_ok
check "a bundle over the budget is refused" \
  bash -c '! ZERO_BUNDLE_MAX_MIB=0.001 bash "$1/scripts/gpu_bundle.sh" "$2/b2" >/dev/null 2>&1 && [ ! -e "$2/b2" ]' _ "$src" "$t"
check "a listed package without its .deb is refused by name" \
  bash -c 'echo zfake-gone >> "$2/list.txt"; out=$(bash "$1/scripts/gpu_bundle.sh" "$2/b3" 2>&1); rc=$?;
           sed -i /zfake-gone/d "$2/list.txt"; [ $rc != 0 ] && [[ $out == *zfake-gone* ]]' _ "$src" "$t"
unset ZERO_BUNDLE_LIST ZERO_BUNDLE_FROM

# ---------------------------------------------------------------- bundle_env.sh
env_in() { # prefix: source bundle_env.sh in a subshell, then run the rest there
  local p=$1; shift
  (PATH=/usr/bin:/bin; . "$src/tests/gpu/bundle_env.sh" "$t/bundle" "$p" >"$t/env.log" 2>&1 || exit 9; "$@")
}
P=$t/prefix
check "unpacks into the prefix" env_in "$P" true
cp "$t/env.log" "$t/first.log"
check ".pc prefix points into the prefix exactly once" \
  grep -qx "prefix=$P/usr" "$P/usr/lib/x86_64-linux-gnu/pkgconfig/zfake.pc"
check ".pc absolute paths too" grep -qx "includedir=$P/usr/include" "$P/usr/lib/x86_64-linux-gnu/pkgconfig/zfake.pc"
check "a .pc name that is a link stays a link to the edited file" \
  bash -c '[ -L "$1" ] && grep -qx "prefix=$2/usr" "$1"' _ "$P/usr/lib/x86_64-linux-gnu/zfake/pkgconfig/zfake-link.pc" "$P"
pc_only_bundle() { [ "$(pkg-config --variable=libdir zfake)" = "$P/usr/lib/x86_64-linux-gnu" ] && ! pkg-config --exists jansson; }
check "pkg-config finds only the bundle's .pc" env_in "$P" pc_only_bundle
mpirun_link() { [ "$(readlink "$P/usr/bin/mpirun")" = mpirun.openmpi ] && [ "$(mpirun)" = fake-mpirun ]; }
check "mpirun is made as a link to mpirun.openmpi and found first on PATH" env_in "$P" mpirun_link
env_points() {
  [ "$OPAL_PREFIX" = "$P/usr" ] && [[ $PMIX_INSTALL_PREFIX == "$P"/* ]] && [[ $LD_LIBRARY_PATH == "$P"/* ]] &&
    [[ $CPATH == "$P"/* ]] && [[ $PKG_CONFIG_LIBDIR == "$P"/* ]]
}
check "OPAL_PREFIX, PMIX_INSTALL_PREFIX, LD_LIBRARY_PATH, CPATH, PKG_CONFIG_LIBDIR point into the prefix" env_in "$P" env_points
check "docs and static archives are dropped" \
  bash -c '[ ! -e "$1/usr/share/doc" ] && [ ! -e "$1/usr/lib/x86_64-linux-gnu/libzfake.a" ]' _ "$P"
check "a library closed over the bundle is kept" test -f "$P/usr/lib/x86_64-linux-gnu/libzfake_ok.so.1"
check "a library that needs what no bundle brings is dropped, by name" \
  bash -c '[ ! -e "$1/usr/lib/x86_64-linux-gnu/libzfake_out.so.1" ] && grep -q "libzfake_out.so.1" "$2"' _ "$P" "$t/first.log"
ldd_bad_names() {
  cc -shared -fPIC -o "$t/out.so" "$t/zj.c" -Wl,--no-as-needed -ljansson && bundle_ldd_bad "$t/out.so" | grep -q '^libjansson'
}
check "bundle_ldd_bad names a library resolved outside the prefix" env_in "$P" ldd_bad_names
ldd_bad_silent() { [ -z "$(bundle_ldd_bad "$P/usr/lib/x86_64-linux-gnu/libzfake_ok.so.1")" ]; }
check "bundle_ldd_bad is silent for a library closed over the bundle" env_in "$P" ldd_bad_silent
touch "$P/marker"
again() { env_in "$P" true && [ -e "$P/marker" ] && grep -q "already holds" "$t/env.log"; }
check "the same bundle again is not unpacked again" again
check "a .deb that differs from MANIFEST is refused by name" \
  bash -c 'cp -r "$1/bundle" "$1/bad" && echo x >> "$1/bad/debs/zfake-dev_1.0_all.deb" &&
           ! (. "$2/tests/gpu/bundle_env.sh" "$1/bad" "$1/p2" > "$1/bad.log" 2>&1) &&
           grep -q "zfake-dev_1.0_all.deb missing or not the one in MANIFEST" "$1/bad.log"' _ "$t" "$src"
mkdir -p "$t/mine" && echo keep > "$t/mine/file"
check "a folder that is not a bundle's is refused and left as it was" \
  bash -c '! (. "$2/tests/gpu/bundle_env.sh" "$1/bundle" "$1/mine" >/dev/null 2>&1) && [ "$(cat "$1/mine/file")" = keep ]' _ "$t" "$src"

[ $fails = 0 ] || { echo "$fails failed"; exit 1; }
echo "all bundle checks passed"
