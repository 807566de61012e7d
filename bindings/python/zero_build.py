"""cffi builder of `zero._zero` (API mode), shared by meson and setup.py.

The cdef comes from zero_cdef.py (derived from include/zero/*.h at build
time); the extension's source is `#include <zero/...>` of the same headers,
so the C compiler checks every declaration and fills in every `...`.

Where the headers and the library are found (first match wins):
  1. ZERO_INCLUDE_DIRS / ZERO_LIBRARY_DIRS (os.pathsep-separated lists);
  2. ZERO_BUILD_ROOT: a meson build directory of this repository
     (headers from <repo>/include and <build>/include, the library from <build>);
  3. pkg-config zero (an installed libzero: `meson install`).
setup.py's `cffi_modules = ["zero_build.py:ffibuilder"]` reads `ffibuilder`.
"""
import os
import shlex
import subprocess
import sys

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zero_cdef  # noqa: E402

REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def _pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "zero"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


def locate():
    """(include_dirs, library_dirs) of libzero, as the module docstring says."""
    inc = os.environ.get("ZERO_INCLUDE_DIRS")
    lib = os.environ.get("ZERO_LIBRARY_DIRS")
    if inc:
        return inc.split(os.pathsep), (lib.split(os.pathsep) if lib else [])
    build = os.environ.get("ZERO_BUILD_ROOT")
    if build:
        build = os.path.abspath(build)
        return [os.path.join(REPO, "include"), os.path.join(build, "include")], [build]
    cflags = _pkg_config("--cflags-only-I")
    libs = _pkg_config("--libs-only-L")
    if cflags is not None:
        return [f[2:] for f in cflags], [f[2:] for f in libs or []]
    raise SystemExit("zero_build: libzero not found: set ZERO_BUILD_ROOT to a meson build directory of "
                     "this repository, or ZERO_INCLUDE_DIRS/ZERO_LIBRARY_DIRS, or install libzero so that "
                     "`pkg-config zero` finds it")


def make_ffibuilder(include_dirs, library_dirs=(), cc=None):
    cdef, prelude, _ = zero_cdef.generate(include_dirs, cc)
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(
        "zero._zero",
        prelude,
        libraries=["zero"],
        include_dirs=list(include_dirs),
        library_dirs=list(library_dirs),
        # the extension finds libzero where it was linked from (a build
        # tree or a non-system prefix) without LD_LIBRARY_PATH
        runtime_library_dirs=list(library_dirs),
    )
    return ffi


# For setup.py (cffi_modules). zero_cdef --emit-c (meson) imports this module
# with ZERO_CFFI_NO_DEFAULT=1 and passes its own directories instead.
if os.environ.get("ZERO_CFFI_NO_DEFAULT") != "1":
    ffibuilder = make_ffibuilder(*locate())

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
