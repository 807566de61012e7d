#!/bin/bash
# Install what libzero needs on a fresh Debian 12 machine (run as root).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is optional: found, it is built too.
set -euo pipefail
packages=(
  build-essential meson ninja-build pkg-config
  libopenmpi-dev openmpi-bin            # MPI: launcher and host collectives
  libhwloc-dev                          # topology, binding, NUMA-local memory
  liburing-dev                          # NVMe offload I/O
  libopenblas-dev                       # CPU sgemm
  libjansson-dev                        # JSON configs
  clang libclang-rt-14-dev              # the libFuzzer targets of tests/fuzz (docs/fuzzing.md)
  python3 python3-dev python3-numpy python3-cffi python3-pytest
  python3-pip python3-setuptools python3-wheel   # the bindings' pip-wheel test
  python3-torch                         # the correctness reference (CPU)
  python3-matplotlib                    # benchmark charts
  iproute2                              # tests/multihost: network namespaces joined by veth
  abigail-tools                         # abidw/abidiff: the ABI check of the stable surface (docs/abi.md)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all system packages present"
fi
