"""pip install of the `zero` package: setuptools + cffi's cffi_modules.

    ZERO_BUILD_ROOT=$PWD/build python3 -m pip install --no-build-isolation ./bindings/python
    # or, after `meson install`: python3 -m pip install --no-build-isolation ./bindings/python

zero_build.py derives the cdef from the headers it finds (ZERO_BUILD_ROOT,
ZERO_INCLUDE_DIRS/ZERO_LIBRARY_DIRS, or pkg-config zero) and links the
extension against that libzero with an rpath to it. docs/python.md says why
setuptools rather than meson-python.
"""
import os
import re
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ZERO_CFFI_NO_DEFAULT", "0")
import zero_build  # noqa: E402


def libzero_version():
    for d in zero_build.locate()[0]:
        path = os.path.join(d, "zero", "version.h")
        if os.path.exists(path):
            text = open(path, encoding="utf-8").read()
            parts = [re.search(rf"#define ZERO_VERSION_{k} (\d+)", text).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
            return ".".join(parts)
    return "0.0.0"


setup(
    name="zero",
    version=libzero_version(),
    description="Python bindings of libzero: ZeRO-style sharding of training state (cffi, API mode)",
    license="Apache-2.0",
    packages=["zero"],
    python_requires=">=3.9",
    setup_requires=["cffi>=1.15"],
    install_requires=["cffi>=1.15", "numpy"],
    cffi_modules=["zero_build.py:ffibuilder"],
    zip_safe=False,
)
