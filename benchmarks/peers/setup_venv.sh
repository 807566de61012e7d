#!/usr/bin/env bash
# Creates the peer benchmark's virtual environment: a recent torch and
# DeepSpeed from PyPI. They are never a dependency of libzero, its bindings
# or its tests; only benchmarks/peers/bench_peers.py uses this environment.
#
#   bash benchmarks/peers/setup_venv.sh [VENV]      (default /work/venv-peers,
#                                                    or $ZERO_PEERS_VENV)
# Idempotent: an existing environment with both packages is left as is.
# PyPI's torch wheel for x86_64 pulls its CUDA runtime wheels (a few GB);
# nothing of CUDA is used (the benchmark runs on CPU, gloo).
set -euo pipefail
VENV=${1:-${ZERO_PEERS_VENV:-/work/venv-peers}}
PY=${PYTHON:-python3}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch, deepspeed, cffi" 2>/dev/null; then
    echo "setup_venv: $VENV already has torch and deepspeed"; exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip wheel setuptools
"$VENV/bin/python" -m pip install -q torch numpy cffi   # cffi: libzero's bindings (zero.torch, the init values)
# DeepSpeed's setup.py imports torch: build it against the torch just installed,
# with no C++/CUDA op prebuilt (the CPU run needs none: torch's AdamW is the optimizer).
DS_BUILD_OPS=0 "$VENV/bin/python" -m pip install -q --no-build-isolation deepspeed
"$VENV/bin/python" -c "import torch, deepspeed; print('setup_venv: torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
