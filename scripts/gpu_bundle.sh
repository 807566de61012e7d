#!/bin/bash
# Download, on this machine (it reaches Debian's archive), the Debian 12 packages
# that a bare CUDA machine lacks for building and running libzero, so that a
# GPU run there (tests/gpu/run_gpu_tests.sh, docs/gpu-run.md) finds them:
#
#   scripts/gpu_bundle.sh [BUNDLE_DIR]        (default .gpu-bundle, gitignored)
#
# BUNDLE_DIR/debs/ gets the .deb files named in tests/gpu/bundle_packages.txt,
# BUNDLE_DIR/MANIFEST one line per package: name version size sha256 file.
# Only the .deb files travel (compressed, about 18 MiB): unpacked, OpenBLAS
# alone is over 40 MiB, and the device tool carries at most 64 MiB in all.
# tests/gpu/bundle_env.sh unpacks them there with dpkg-deb -x into a prefix.
#
# Environment: ZERO_BUNDLE_MAX_MIB (default 40) refuses a bundle larger than
# that; ZERO_BUNDLE_NO_UPDATE=1 skips `apt-get update`; ZERO_BUNDLE_LIST is
# another package list; ZERO_BUNDLE_FROM=DIR takes the .deb files from DIR
# instead of downloading them (tests/core/test_gpu_bundle.sh, no network).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/.gpu-bundle}
max_mib=${ZERO_BUNDLE_MAX_MIB:-40}
list=${ZERO_BUNDLE_LIST:-$src/tests/gpu/bundle_packages.txt}
mapfile -t pkgs < <(sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$list")
[ ${#pkgs[@]} -gt 0 ] || { echo "gpu_bundle: no packages in $list"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zero-bundle-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -n "${ZERO_BUNDLE_FROM:-}" ]; then
  for p in "${pkgs[@]}"; do cp "$ZERO_BUNDLE_FROM"/"${p}"_*.deb "$tmp"/ 2>/dev/null || true; done
else
  [ "${ZERO_BUNDLE_NO_UPDATE:-0}" = 1 ] || apt-get update -qq
  # _apt cannot write into a private temporary directory: let it.
  chmod 755 "$tmp"; chown _apt "$tmp" 2>/dev/null || true
  (cd "$tmp" && apt-get download -qq "${pkgs[@]}")
fi

# Exactly one .deb per listed package, nothing else.
manifest=$tmp/MANIFEST
: > "$manifest"
for p in "${pkgs[@]}"; do
  f=$(ls "$tmp"/"${p}"_*.deb 2>/dev/null || true)
  [ "$(printf '%s\n' "$f" | grep -c .)" = 1 ] || { echo "gpu_bundle: expected one .deb for $p, got: ${f:-none}"; exit 1; }
  name=$(dpkg-deb -f "$f" Package) ver=$(dpkg-deb -f "$f" Version)
  [ "$name" = "$p" ] || { echo "gpu_bundle: $f is package $name, not $p"; exit 1; }
  printf '%s %s %s %s %s\n' "$p" "$ver" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)" \
    "$(basename "$f")" >> "$manifest"
done
bytes=$(awk '{s += $3} END {print s}' "$manifest")
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if awk -v b="$bytes" -v m="$max_mib" 'BEGIN { exit !(b > m * 1048576) }'; then
  echo "gpu_bundle: $mib MiB is over the $max_mib MiB budget (ZERO_BUNDLE_MAX_MIB)"; exit 1
fi

rm -rf "$out"
mkdir -p "$out/debs"
mv "$tmp"/*.deb "$out/debs/"
mv "$manifest" "$out/MANIFEST"
echo "gpu_bundle: ${#pkgs[@]} packages, $mib MiB in $out (carry it as '${out#"$src"/}')"
