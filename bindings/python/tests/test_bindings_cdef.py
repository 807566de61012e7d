"""The cdef is derived from the headers, not copied: every ZERO_API function
of include/zero/*.h is in `lib`, enum values come from the compiler, and the
generator picks up a header change by itself."""
import os
import re
import shutil
import sys

import pytest

from zero_testlib import BUILD_ROOT, REPO

# appended, not prepended: the source tree's zero/ has no compiled extension
sys.path.append(os.path.join(REPO, "bindings", "python"))
import zero_cdef  # noqa: E402

WRAPPED = sorted(h for h in os.listdir(os.path.join(REPO, "include", "zero"))
                 if h.endswith(".h") and h not in zero_cdef.EXCLUDED)


def header_functions():
    names = set()
    for h in WRAPPED:
        text = open(os.path.join(REPO, "include", "zero", h)).read()
        names |= set(re.findall(r"ZERO_API\s+[^;(]*?\b(zero_\w+)\s*\(", text))
    return names


def test_every_public_function_is_wrapped(zero_mod):
    funcs = header_functions()
    assert len(funcs) > 100, funcs  # the parse found the API
    missing = sorted(f for f in funcs if not hasattr(zero_mod.lib, f))
    assert not missing, f"in the headers but not in zero.lib: {missing}"


def test_every_header_of_the_umbrella_is_wrapped():
    umbrella = open(os.path.join(REPO, "include", "zero", "zero.h")).read()
    parts = set(re.findall(r"#include <zero/(\w+\.h)>", umbrella)) - {"version.h"}  # version.h is generated
    assert parts and parts <= set(WRAPPED), parts - set(WRAPPED)
    # the experimental surface (docs/abi.md) is not wrapped: Python builds on the stable one only
    assert not {"experimental.h", "offload.h", "topo.h"} & set(WRAPPED)


def test_enum_values_come_from_the_compiler(zero_mod):
    lib = zero_mod.lib
    # the X-macro status table: values and names agree with the library
    text = open(os.path.join(REPO, "include", "zero", "status.h")).read()
    table = re.findall(r"X\((\w+),\s*(\d+),", text)
    assert len(table) >= 14
    for name, value in table:
        assert getattr(lib, "ZERO_" + name) == int(value)
        assert zero_mod.ffi.string(lib.zero_status_name(int(value))).decode() == "ZERO_" + name
        cls = zero_mod.errors.ERROR_CLASSES.get(int(value))
        assert (cls is None) == (name == "OK"), name
        if cls:
            assert cls.__name__.lower() == "zero" + name.replace("_", "").lower() + "error", cls
    assert lib.ZERO_MAX_DIMS == 8 and lib.ZERO_CONFIG_VERSION == 5
    assert lib.ZERO_VERSION == zero_mod.version()


def test_init_macros_become_helpers(zero_mod):
    ffi, lib = zero_mod.ffi, zero_mod.lib
    c = ffi.new("zero_config *")
    lib.zero_py_init_zero_config(c)
    assert c.size == ffi.sizeof("zero_config") and c.version == lib.ZERO_CONFIG_VERSION
    # the documented DeepSpeed defaults of ZERO_CONFIG_INIT
    assert (c.stage, c.reduce_bucket_size, c.stage3_param_persistence_threshold, c.lr, c.beta2,
            c.gradient_accumulation_steps, c.initial_scale_power) == (0, 500000000, 100000, 1e-3, 0.999, 1, 16)
    assert zero_mod.Config().to_dict()["compute_dtype"] == "f32"


def test_generator_follows_a_header_change(tmp_path):
    if BUILD_ROOT is None:
        pytest.skip("needs the generated version.h of a build")
    inc = tmp_path / "include"
    shutil.copytree(os.path.join(REPO, "include"), inc)
    shutil.copy(os.path.join(BUILD_ROOT, "include", "zero", "version.h"), inc / "zero" / "version.h")
    dtype_h = inc / "zero" / "dtype.h"
    text = dtype_h.read_text().replace(
        "ZERO_API size_t zero_dtype_size(zero_dtype dtype);",
        "ZERO_API size_t zero_dtype_size(zero_dtype dtype);\n"
        "typedef enum zero_new_enum { ZERO_NEW_A = 40, ZERO_NEW_B = ZERO_NEW_A + 2 } zero_new_enum;\n"
        "#define ZERO_NEW_LIMIT (ZERO_MAX_DIMS_X * 2u)\n#define ZERO_MAX_DIMS_X 3\n"
        "typedef struct zero_new_thing { int v[ZERO_NEW_B]; double x; } zero_new_thing;\n"
        "#define ZERO_NEW_THING_INIT { {0}, 1.5 }\n"
        "ZERO_API int zero_new_function(const zero_new_thing *t, char *buf, size_t len);")
    dtype_h.write_text(text)
    cdef, source, headers = zero_cdef.generate([str(inc)])
    assert "int zero_new_function(const zero_new_thing *t, char *buf, size_t len);" in cdef
    assert "ZERO_NEW_A = ...," in cdef and "ZERO_NEW_B = ..." in cdef   # values left to the compiler
    assert "int v[...];" in cdef                                          # enum-sized array
    assert "#define ZERO_NEW_LIMIT ..." in cdef and "#define ZERO_MAX_DIMS_X ..." in cdef
    assert "void zero_py_init_zero_new_thing(zero_new_thing *out);" in cdef
    assert "zero_new_thing v = ZERO_NEW_THING_INIT;" in source
    assert "ZERO_API" not in cdef and "#include" not in cdef and "extern \"C\"" not in cdef
    # cffi accepts it (parsing is enough; compiling is what meson does)
    import cffi
    cffi.FFI().cdef(cdef)


def cuda_header_functions():
    text = open(os.path.join(REPO, "include", "zero", zero_cdef.CUDA_HEADER)).read()
    return set(re.findall(r"ZERO_API\s+[^;(]*?\b(zero_\w+)\s*\(", text))


def test_cuda_header_reached_through_weak_wrappers(zero_mod):
    """zero_cuda.h is not in the cdef (CUDA's types), but each of its
    functions is, as zero_py_<f> with CUDA handles as void *; they work
    against a libzero with or without CUDA: zero_py_cuda_handles() says
    which this build is, and without CUDA the wrappers refuse instead of
    calling a missing symbol."""
    ffi, lib = zero_mod.ffi, zero_mod.lib
    funcs = cuda_header_functions()
    assert funcs == {"zero_stream_get_cuda", "zero_stream_wrap_cuda", "zero_event_get_cuda"}, funcs
    for f in funcs:
        assert hasattr(lib, "zero_py_" + f[len("zero_"):]), f
        assert not hasattr(lib, f), f  # never the bare symbol: a CPU-only libzero has none
    assert ffi.typeof(lib.zero_py_stream_wrap_cuda).args[1] == ffi.typeof("void *")
    conf = open(os.path.join(BUILD_ROOT, "zero_build_config.h")).read()
    have_cuda = re.search(r"#define ZERO_HAVE_CUDA (\d)", conf).group(1) == "1"
    assert bool(lib.zero_py_cuda_handles()) == have_cuda == zero_mod.cuda_handles_available()
    assert lib.zero_py_stream_get_cuda(ffi.NULL) == ffi.NULL and lib.zero_py_event_get_cuda(ffi.NULL) == ffi.NULL
    with zero_mod.Device("cpu") as dev:
        out = ffi.new("zero_stream **")
        st = lib.zero_py_stream_wrap_cuda(dev._live_handle(), ffi.cast("void *", 0x1000), out)
        if have_cuda:  # the library's own check
            assert st == lib.ZERO_INVALID_ARGUMENT and out[0] == ffi.NULL
            assert b"not a CUDA device" in ffi.string(lib.zero_device_last_error(dev._live_handle()))
        else:
            assert st == lib.ZERO_UNSUPPORTED


def test_cuda_wrappers_follow_the_header(tmp_path):
    """A function added to zero_cuda.h gets its wrapper without an edit here."""
    inc = tmp_path / "include"
    shutil.copytree(os.path.join(REPO, "include"), inc)
    h = inc / "zero" / zero_cdef.CUDA_HEADER
    h.write_text(h.read_text().replace("ZERO_EXTERN_C_END", "ZERO_API zero_status zero_new_cuda(cudaStream_t a,\n"
                                       "    const cudaEvent_t *b, int n);\nZERO_EXTERN_C_END"))
    fns = zero_cdef.cuda_functions([str(inc)])
    assert ("zero_status", "zero_new_cuda", [("void *", "a"), ("const void * *", "b"), ("int", "n")]) in fns
    cdef, src = zero_cdef.cuda_handle_wrappers(fns)
    assert "zero_status zero_py_new_cuda(void * a, const void * * b, int n);" in cdef
    assert "zero_new_cuda ? zero_new_cuda(a, b, n) : ZERO_UNSUPPORTED" in src
    assert "__attribute__((weak))" in src and "cudaStream_t" not in cdef + src


def test_pip_build_locates_libzero(monkeypatch, tmp_path):
    """zero_build.locate(): explicit dirs, then a build tree, then pkg-config."""
    monkeypatch.setenv("ZERO_CFFI_NO_DEFAULT", "1")
    import zero_build
    monkeypatch.setenv("ZERO_INCLUDE_DIRS", os.pathsep.join(["/a/include", "/b/include"]))
    monkeypatch.setenv("ZERO_LIBRARY_DIRS", "/b")
    assert zero_build.locate() == (["/a/include", "/b/include"], ["/b"])
    monkeypatch.delenv("ZERO_INCLUDE_DIRS")
    monkeypatch.setenv("ZERO_BUILD_ROOT", str(tmp_path))
    assert zero_build.locate() == ([os.path.join(REPO, "include"), os.path.join(str(tmp_path), "include")],
                                   [str(tmp_path)])
