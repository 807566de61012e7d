#!/bin/bash
# The stable surface's ABI against the committed dump (docs/abi.md, "ABI check").
#
#   scripts/abi_check.sh BUILD_DIR            compare BUILD_DIR's libzero with abi/libzero.abi
#   scripts/abi_check.sh BUILD_DIR --update   rewrite abi/libzero.abi from BUILD_DIR (on purpose)
#
# abidw/abidiff (Debian's abigail-tools) read the library's DWARF. Left out on both sides: the
# experimental surface and the CUDA-only functions (zero/experimental.h, offload.h, topo.h,
# zero_cuda.h: a CPU-only build has no zero_cuda.h functions), and types the public headers do not
# define (the opaque handles' insides). Allowed: added functions (reported), and fields appended at
# the end of a versioned struct (zero_config, zero_comm_config, zero_checkpoint_options,
# zero_init_spec, zero_group_hparams: the version field tells old callers' structs apart).
# Fails: a removed or changed function or variable of the stable surface, a changed type it uses.
# Exit 77 (skipped) without abigail-tools or in a sanitizer build.
set -uo pipefail
build=$1 mode=${2:-check}
src=$(cd "$(dirname "$0")/.." && pwd)
dump=${ZERO_ABI_DUMP:-$src/abi/libzero.abi}   # ZERO_ABI_DUMP: another dump (tests)
if ! command -v abidw >/dev/null || ! command -v abidiff >/dev/null; then
  echo "abi_check: abidw/abidiff not found (apt-get install abigail-tools; scripts/setup.sh does)"; exit 77
fi
san=$(meson introspect "$build" --buildoptions 2>/dev/null | /usr/bin/python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="b_sanitize"))' 2>/dev/null)
if [ -n "$san" ] && [ "$san" != none ]; then echo "abi_check: skipped in a sanitizer build"; exit 77; fi
# The project's version names the library (an older version's file may linger in the build directory).
version=$(meson introspect "$build" --projectinfo 2>/dev/null | /usr/bin/python3 -c \
  'import json,sys; print(json.load(sys.stdin)["version"])' 2>/dev/null)
lib=$build/libzero.so.$version
[ -f "$lib" ] || { echo "abi_check: no $lib (build it first)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

left_out=$(grep -hoE '^ZERO_API[^;(]*\b[a-z_][a-z0-9_]*\(' \
             "$src"/include/zero/{experimental,offload,topo,zero_cuda}.h \
           | sed -E 's/.*\b([a-z_][a-z0-9_]*)\($/\1/' | sort -u | paste -sd'|')
cat > "$tmp/supp" <<SUPP
[suppress_function]
  symbol_name_regexp = ^($left_out)\$
  drop = yes

[suppress_type]
  name_regexp = ^zero_(config|comm_config|checkpoint_options|init_spec|group_hparams)\$
  has_data_member_inserted_at = end
SUPP
hd=(--headers-dir "$src/include/zero" --headers-dir "$build/include/zero")

if [ "$mode" = --update ]; then
  abidw --suppressions "$tmp/supp" --exported-interfaces-only --drop-private-types "${hd[@]}" \
    --no-corpus-path --no-comp-dir-path --no-show-locs --out-file "$dump" "$lib" || exit 1
  echo "abi_check: wrote $dump: $(grep -c '<elf-symbol ' "$dump") stable functions of $(basename "$lib")"
  exit 0
fi
[ -f "$dump" ] || { echo "abi_check: $dump missing (scripts/abi_check.sh BUILD --update writes it)"; exit 1; }

abidiff --suppressions "$tmp/supp" --drop-private-types --hd2 "$src/include/zero" --hd2 "$build/include/zero" \
  --no-show-locs "$dump" "$lib" > "$tmp/report"
rc=$?
cat "$tmp/report"
# abidiff's exit bits: 1 error, 2 usage, 4 ABI change, 8 incompatible change. A changed function
# only sets 4, like an added one, so the summary lines decide.
fail=0
[ $((rc & 3)) -eq 0 ] || { echo "abi_check: abidiff failed (exit $rc)"; fail=1; }
[ $((rc & 8)) -eq 0 ] || fail=1
if grep -E '^(Functions|Variables) changes summary:' "$tmp/report" \
   | grep -vqE ' 0 Removed(\s*\([^)]*\))?, 0 Changed'; then
  fail=1
fi
if [ $fail -ne 0 ]; then
  echo "abi_check: FAIL: the stable surface changed incompatibly (above). If that is on purpose (a major"
  echo "version), rewrite the dump: scripts/abi_check.sh $build --update, and commit abi/libzero.abi."
  exit 1
fi
added=$(sed -nE 's/^Functions changes summary:.* ([0-9]+) Added.*/\1/p' "$tmp/report")
echo "abi_check: OK: the stable surface ($(grep -c '<elf-symbol ' "$dump") functions in the dump) is intact;" \
     "${added:-0} functions added since the dump (update it at the release)"
