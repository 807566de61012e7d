"""Shared by tests/python/test_bench_*.py: where zero-bench is and how to run it."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build_root():
    env = os.environ.get("ZERO_BUILD_ROOT")
    return pathlib.Path(env) if env else ROOT / "build"


def zero_bench():
    path = build_root() / "benchmarks" / "memory" / "zero-bench"
    if not path.exists():
        if os.environ.get("ZERO_BUILD_ROOT"):
            pytest.fail(f"{path} was not built")
        pytest.skip(f"{path} not built (set ZERO_BUILD_ROOT to the build directory)")
    return path


def run(args, world=0, ok=(0,), timeout=180):
    """Run zero-bench with `args` (under tests/mpirun.sh when world > 0)."""
    cmd = [str(zero_bench())] + [str(a) for a in args]
    if world:
        cmd = [str(ROOT / "tests" / "mpirun.sh"), str(world)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode in ok, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def plot(json_path, png_path):
    proc = subprocess.run(["/usr/bin/python3", str(ROOT / "benchmarks" / "plot_memory.py"), str(json_path),
                           str(png_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"plot_memory.py failed:\n{proc.stdout}\n{proc.stderr}"
