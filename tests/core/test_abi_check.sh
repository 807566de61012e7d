#!/bin/bash
# The ABI check (scripts/abi_check.sh, docs/abi.md) on this build:
#   - the committed dump abi/libzero.abi matches the stable surface (nothing removed or changed);
#   - a function removed from the stable surface fails the check, naming it: the dump is given
#     one function more (a copy of zero_version's entry, renamed) than the library has.
# Skipped (77) where abigail-tools are missing or in a sanitizer build, as the check itself.
set -uo pipefail
build=$1 src=$2
out=$(bash "$src/scripts/abi_check.sh" "$build" 2>&1); rc=$?
echo "$out" | tail -5
[ $rc -eq 77 ] && exit 77
fail=0
[ $rc -eq 0 ] || { echo "FAIL: the stable surface differs from abi/libzero.abi (exit $rc)"; fail=1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$src/abi/libzero.abi" "$tmp/removed.abi" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
sym = re.search(r"\n(\s*<elf-symbol name='zero_version' [^\n]*)", text).group(1)
decl = re.search(r"\n(\s*<function-decl name='zero_version' .*?</function-decl>)", text, re.S).group(1)
text = text.replace(sym, sym + "\n" + sym.replace("'zero_version'", "'zero_removed_for_test'"), 1)
text = text.replace(decl, decl + "\n" + decl.replace("'zero_version'", "'zero_removed_for_test'"), 1)
open(sys.argv[2], "w").write(text)
PY
out=$(ZERO_ABI_DUMP=$tmp/removed.abi bash "$src/scripts/abi_check.sh" "$build" 2>&1); rc=$?
if [ $rc -eq 0 ] || ! echo "$out" | grep -q "zero_removed_for_test"; then
  echo "FAIL: a function removed from the stable surface passed the check (exit $rc):"; echo "$out" | tail -20; fail=1
fi
exit $fail
