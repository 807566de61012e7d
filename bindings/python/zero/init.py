"""Initial values described instead of given (zero_init_spec, engine.h).

    eng.add_param(m, "w", init=zero.init.normal(std=0.02, seed=1), shape=(768, 768))

Each rank computes, at finalize, only the elements it keeps (its shard at
stage 3), from (spec, parameter name, element index) alone: identical at
every world size and stage, and nothing held before finalize. A numpy array
given as init instead is copied and held whole on every rank until finalize
(4 bytes x numel per rank): fine for small models.

`generate(spec, name, begin, end)` computes the same values without an
engine (a slice of a tensor, or the reference another framework needs).
`callback(fn)` lets a Python function fill the ranges a rank keeps.
"""
import dataclasses

import numpy as np

from ._ffi import ffi, lib
from .errors import ZeroInvalidArgumentError, check

KINDS = {"zeros": lib.ZERO_INIT_ZEROS, "ones": lib.ZERO_INIT_ONES, "constant": lib.ZERO_INIT_CONSTANT,
         "normal": lib.ZERO_INIT_NORMAL, "uniform": lib.ZERO_INIT_UNIFORM}


@dataclasses.dataclass(frozen=True)
class Init:
    """One init spec; build it with zeros(), ones(), constant(), normal(), uniform(), callback()."""
    kind: str
    value: float = 0.0
    mean: float = 0.0
    std: float = 1.0
    lo: float = 0.0
    hi: float = 1.0
    seed: int = 0
    fn: object = None  # callback: fn(name, begin, end) -> end - begin float32 values

    def c_spec(self, keep=None):
        """A zero_init_spec * with these values (libzero validates them). A
        callback's handle is appended to `keep`, which must outlive finalize."""
        if self.kind == "callback":
            if keep is None:
                raise ZeroInvalidArgumentError("a callback init needs an engine (it has no values of its own)")
            s = ffi.new("zero_init_spec *")
            lib.zero_py_init_zero_init_spec(s)
            holder = _Fill(self.fn)
            handle = ffi.new_handle(holder)
            keep.append((holder, handle))
            s.kind = lib.ZERO_INIT_CALLBACK
            s.fill = lib._zero_py_init_fill
            s.user = handle
            s.seed = int(self.seed)
            return s
        if self.kind not in KINDS:
            raise ZeroInvalidArgumentError(f"init kind '{self.kind}': one of {sorted(KINDS)}")
        s = ffi.new("zero_init_spec *")
        lib.zero_py_init_zero_init_spec(s)
        s.kind = KINDS[self.kind]
        s.value, s.mean, s.std, s.lo, s.hi = self.value, self.mean, self.std, self.lo, self.hi
        if not 0 <= int(self.seed) < 2 ** 64:
            raise ZeroInvalidArgumentError(f"init seed {self.seed}: must be in [0, 2^64)")
        s.seed = int(self.seed)
        return s


def zeros():
    return Init("zeros")


def ones():
    return Init("ones")


def constant(value):
    return Init("constant", value=float(value))


def normal(std=1.0, mean=0.0, seed=0):
    """N(mean, std^2) from Philox4x32-10 and Box-Muller (engine.h gives the exact definition)."""
    return Init("normal", mean=float(mean), std=float(std), seed=int(seed))


def uniform(lo=0.0, hi=1.0, seed=0):
    return Init("uniform", lo=float(lo), hi=float(hi), seed=int(seed))


def callback(fn, seed=0):
    """fn(name, begin, end) returns elements [begin, end) of the parameter `name`
    (end - begin numbers, cast to float32). It must be a pure function of
    (name, index): finalize calls it with the ranges this rank keeps, plus
    single-element probes for the cross-rank check (dp size > 1). `seed` is a
    tag the check compares across ranks. An exception in fn fails finalize and
    is re-raised from it."""
    if not callable(fn):
        raise ZeroInvalidArgumentError(f"callback: {type(fn).__name__} is not callable")
    return Init("callback", seed=int(seed), fn=fn)


class _Fill:
    """A callback init's function and the first exception it raised."""

    def __init__(self, fn):
        self.fn, self.error = fn, None


@ffi.def_extern()
def _zero_py_init_fill(user, param, name, begin, end, out):
    holder = ffi.from_handle(user)
    try:
        n = end - begin
        values = np.ascontiguousarray(holder.fn(ffi.string(name).decode(), int(begin), int(end)), np.float32)
        if values.size != n:
            raise ZeroInvalidArgumentError(f"init callback for '{ffi.string(name).decode()}' returned "
                                           f"{values.size} values for [{begin}, {end}), expected {n}")
        ffi.memmove(out, ffi.from_buffer("float[]", values.ravel()), 4 * n)
        return lib.ZERO_OK
    except BaseException as exc:  # noqa: B902 - carried to finalize, which re-raises it
        if holder.error is None:
            holder.error = exc
        return lib.ZERO_INVALID_ARGUMENT


def generate(spec, name, begin, end):
    """Elements [begin, end) of the values `spec` gives the parameter called `name`
    (zero_init_generate), as a float32 array."""
    if not isinstance(spec, Init):
        raise ZeroInvalidArgumentError(f"generate: spec must be a zero.init.Init, got {type(spec).__name__}")
    begin, end = int(begin), int(end)
    if not 0 <= begin <= end:
        raise ZeroInvalidArgumentError(f"generate: need 0 <= begin <= end, got [{begin}, {end})")
    out = np.empty(end - begin, np.float32)
    check(lib.zero_init_generate(spec.c_spec(), name.encode(), begin, end, ffi.from_buffer("float[]", out)))
    return out
