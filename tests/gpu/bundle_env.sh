# shellcheck shell=bash
# Sourced (bash) on the machine that runs the GPU checks, by
# tests/gpu/run_gpu_tests.sh:
#
#   . tests/gpu/bundle_env.sh BUNDLE_DIR PREFIX
#
# unpacks the .deb files that scripts/gpu_bundle.sh put in BUNDLE_DIR/debs
# into PREFIX (dpkg-deb -x; once: a stamp remembers which bundle is unpacked
# there), and exports what finds them there instead of in /usr:
#   PATH             PREFIX/usr/bin first (mpirun, orted, pkg-config, ninja)
#   LD_LIBRARY_PATH  the bundle's library folders first
#   OPAL_PREFIX      Open MPI relocated: its components, help texts, wrappers
#   PMIX_INSTALL_PREFIX  the same for PMIx
#   PKG_CONFIG_LIBDIR    only the bundle's .pc files (rewritten to PREFIX), so
#                        a system copy of a library is never picked up
#   CPATH            the multiarch header folder, which no .pc file names
#   OMPI_MCA_plm=isolated  where there is no ssh (a bare machine)
# Returns non-zero, with a message, when something is missing.
#
# It also defines bundle_ldd_bad FILE: the libraries FILE loads (ldd) that
# resolve neither inside PREFIX nor to one a CUDA machine always has (glibc,
# the GCC runtimes, zlib, CUDA's and the driver's), one "soname => path" a
# line, "not found" included. Empty output means the file is closed over the
# bundle. Components of Open MPI and PMIx for which it is not empty (UCX,
# libfabric, verbs, PSM: interconnects a one-machine run does not use) are
# removed at unpack, so nothing tries to load them.

bundle_base_re='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl'
bundle_base_re+='|libstdc\+\+|libgcc_s|libatomic|libgomp|libz'
bundle_base_re+='|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvrtc|libnvJitLink|libnvidia-[a-z-]+)\.so'

bundle_ldd_bad() { # file [another folder whose libraries count as inside, e.g. the build]
  local out
  # ldd fails outright when a library it reaches is no ELF file (or when the
  # rehearsal hid it): that counts as not found.
  out=$(ldd "$1" 2>&1) || { echo "ldd failed: $(printf '%s\n' "$out" | tail -n 1)"; return 0; }
  printf '%s\n' "$out" | awk -v p="$ZERO_GPU_PREFIX/" -v q="${2:-$ZERO_GPU_PREFIX}/" -v re="$bundle_base_re" '
    $2 == "=>" {
      if ($3 == "not") { print $1 " => not found"; next }
      if (index($3, p) == 1 || index($3, q) == 1 || $1 ~ re) next
      print $1 " => " $3
    }'
}

bundle_unpack_deb() { # deb dest: dpkg-deb where it exists, else Python reads the ar archive
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
  else
    python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not a .deb (ar archive)"
pos = 8
while pos < len(data):
    name, size = data[pos:pos + 16].decode().strip().rstrip("/"), int(data[pos + 48:pos + 58])
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
        break
    pos += 60 + size + (size & 1)
else:
    sys.exit("no data.tar in " + sys.argv[1])
PY
  fi
}

bundle_env_main() {
  local bundle=$1 prefix=$2
  [ -f "$bundle/MANIFEST" ] || { echo "bundle: $bundle/MANIFEST missing (run scripts/gpu_bundle.sh here first)"; return 1; }
  mkdir -p "$prefix" || return 1
  prefix=$(cd "$prefix" && pwd)
  # It is emptied below: only a folder of its own (empty, or a bundle's).
  if [ "$prefix" = / ] || { [ -n "$(ls -A "$prefix")" ] && [ ! -f "$prefix/.bundle-stamp" ]; }; then
    echo "bundle: $prefix is neither empty nor an unpacked bundle; not touching it"; return 1
  fi
  export ZERO_GPU_PREFIX=$prefix
  local usr=$prefix/usr lib=$prefix/usr/lib/x86_64-linux-gnu
  local stamp
  stamp=$(cat "$bundle/MANIFEST" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
  export PATH=$usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib/openmpi/lib:$lib/pmix2/lib:$lib/openblas-pthread:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$usr
  export PMIX_INSTALL_PREFIX=$lib/pmix2
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$lib/openmpi/lib/pkgconfig:$lib/openblas-pthread/pkgconfig
  # Debian's multiarch headers (hwloc's autogen/config.h) are found through
  # the compiler's default /usr/include/x86_64-linux-gnu, not the .pc files.
  export CPATH=$usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
  unset PKG_CONFIG_PATH
  # Debian's openmpi-bin depends on ssh; a bare image has none, and mpirun's
  # rsh launcher then refuses to start at all ("plm_rsh_agent: ssh : rsh ...
  # could not be found"), local ranks and singletons too: launch locally.
  local a p have_agent=0
  for a in ssh rsh; do
    p=$(command -v "$a") && [ -f "$p" ] && [ -x "$p" ] && have_agent=1
  done
  [ $have_agent = 1 ] || export OMPI_MCA_plm=isolated

  if [ "$(cat "$prefix/.bundle-stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "bundle: $prefix already holds this bundle"
    return 0
  fi
  local t0=$SECONDS n=0 pkg ver sha file
  find "$prefix" -mindepth 1 -delete
  while read -r pkg ver _ sha file; do
    [ -n "$pkg" ] || continue
    [ "$(sha256sum "$bundle/debs/$file" 2>/dev/null | cut -d' ' -f1)" = "$sha" ] ||
      { echo "bundle: $bundle/debs/$file missing or not the one in MANIFEST ($pkg $ver)"; return 1; }
    bundle_unpack_deb "$bundle/debs/$file" "$prefix" || { echo "bundle: unpacking $file failed"; return 1; }
    n=$((n + 1))
  done < "$bundle/MANIFEST"
  # What no program here reads: documentation, static archives, Fortran modules.
  rm -rf "$usr/share/doc" "$usr/share/man" "$usr/share/info" "$usr/share/lintian" "$lib/fortran"
  find "$prefix" -name '*.a' -delete
  # Debian makes these names with update-alternatives at install, not in the packages.
  local b
  for b in mpirun mpiexec mpicc; do
    [ -e "$usr/bin/$b.openmpi" ] && ln -sf "$b.openmpi" "$usr/bin/$b"
  done
  # The .pc files name /usr: point them at the prefix (each file once: some
  # names are links to others).
  find "$prefix" -name '*.pc' -type f -exec sed -i "s#/usr#$usr#g" {} +
  # Libraries whose own needs are not in the bundle: nothing of ours loads
  # them, and Open MPI would warn about each component it cannot open.
  local pruned=() f
  while IFS= read -r f; do
    if [ -n "$(bundle_ldd_bad "$f")" ]; then pruned+=("${f##*/}"); rm -f "$f"; fi
  done < <(find "$lib" -name '*.so*' -type f)
  echo "bundle: unpacked $n packages into $prefix in $((SECONDS - t0)) s ($(du -sm "$prefix" | cut -f1) MiB);" \
       "removed ${#pruned[@]} libraries that need what no bundle brings: ${pruned[*]:-none}"
  echo "$stamp" > "$prefix/.bundle-stamp"
}

bundle_env_main "$@"
