"""Shared helpers of the binding tests: find the build tree's `zero` package
(ZERO_BUILD_ROOT/bindings/python) and run scripts on real ranks.

scripts/test.sh builds first and sets ZERO_BUILD_ROOT, so nothing here skips
in CI; run by hand without a build, every test skips with the reason."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def _build_root():
    root = os.environ.get("ZERO_BUILD_ROOT")
    if not root:
        return None, "ZERO_BUILD_ROOT is not set (run through scripts/test.sh)"
    pkg = os.path.join(root, "bindings", "python")
    if not glob.glob(os.path.join(pkg, "zero", "_zero*.so")):
        return None, f"{pkg}/zero/_zero*.so is not built (meson found no python3-dev/cffi, or not built yet)"
    if not glob.glob(os.path.join(root, "libzero.so*")):
        return None, f"libzero is not built in {root}"
    return os.path.abspath(root), None


BUILD_ROOT, SKIP_REASON = _build_root()
PYTHONPATH = os.path.join(BUILD_ROOT, "bindings", "python") if BUILD_ROOT else None
if PYTHONPATH and PYTHONPATH not in sys.path:
    sys.path.insert(0, PYTHONPATH)


@pytest.fixture(scope="session")
def zero_mod():
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    import zero
    return zero


@pytest.fixture
def world(zero_mod):
    with zero_mod.Comm.world(backend="local") as w:
        yield w


def run_ranks(n, script, *args, timeout=180):
    """Run `script` on n real ranks (tests/mpirun.sh); returns {rank: result dict}.
    Each rank writes its result to $ZERO_RESULT_DIR/rank-<r>.json (mpirun may
    interleave long stdout lines of two ranks)."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    with tempfile.TemporaryDirectory(prefix="zero_ranks_") as rdir:
        env = dict(os.environ, PYTHONPATH=PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   ZERO_RESULT_DIR=rdir)
        cmd = [os.path.join(REPO, "tests", "mpirun.sh"), str(n), sys.executable, script, *map(str, args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        results = {}
        for f in glob.glob(os.path.join(rdir, "rank-*.json")):
            with open(f) as fh:
                r = json.load(fh)
            results[r["rank"]] = r
    assert proc.returncode == 0 and len(results) == n, (
        f"{' '.join(cmd)} -> rc {proc.returncode}, {len(results)}/{n} results\n"
        f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return results
