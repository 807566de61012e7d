"""pip builds an installable wheel from bindings/python (setuptools +
cffi_modules), offline, and the installed package works on its own.

Nothing is installed system-wide: the wheel is built in a temporary
directory and unpacked into another one that a fresh interpreter imports."""
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from zero_testlib import BUILD_ROOT, REPO, SKIP_REASON


def test_pip_wheel_builds_and_imports(tmp_path):
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "bindings", "python"), src,
                    ignore=shutil.ignore_patterns("tests", "examples", "build", "*.egg-info", "__pycache__",
                                                  "meson.build"))
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               ZERO_INCLUDE_DIRS=os.pathsep.join([os.path.join(REPO, "include"), os.path.join(BUILD_ROOT, "include")]),
               ZERO_LIBRARY_DIRS=BUILD_ROOT)
    env.pop("ZERO_BUILD_ROOT", None)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                           str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list((tmp_path / "wheel").glob("zero-*.whl"))
    assert len(wheels) == 1, wheels
    site = tmp_path / "site"
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        z.extractall(site)
    assert any(n.startswith("zero/_zero") and n.endswith(".so") for n in names), names
    code = ("import zero, numpy as np\n"
            "print(zero.__file__)\n"
            "w = zero.Comm.world(backend='local')\n"
            "e = zero.Engine(w, stage=3)\n"
            "m = e.add_module('m', {'w': np.ones(4, np.float32)})\n"
            "e.finalize()\n"
            "with e.gathered(m) as P: s = float(P['w'].sum())\n"
            "print(zero.__version__, s)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(env, PYTHONPATH=str(site)), timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("\n")
    assert lines[0].startswith(str(site)), lines  # the installed copy, not the build tree's
    text = open(os.path.join(BUILD_ROOT, "include", "zero", "version.h")).read()
    version = ".".join(re.search(rf"#define ZERO_VERSION_{k} (\d+)", text).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    assert lines[1].split()[0] == version
    assert f"zero-{version}-" in wheels[0].name  # setup.py took the version from the headers
    assert lines[1].split()[1] == "4.0"
