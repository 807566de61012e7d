#!/bin/bash
# Configure and build libzero:  scripts/build.sh [BUILD_DIR [extra meson args...]]
# BUILD_DIR defaults to build/. Re-running reconfigures an existing directory.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
if [ -f "$dir/build.ninja" ]; then
  meson setup --reconfigure "$dir" "$@" >/dev/null
else
  meson setup "$dir" "$@"
fi
ninja -C "$dir"
