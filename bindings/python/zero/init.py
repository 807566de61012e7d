"""Initial values described instead of given (zero_init_spec, engine.h).

    eng.add_param(m, "w", init=zero.init.normal(std=0.02, seed=1), shape=(768, 768))

Each rank computes, at finalize, only the elements it keeps (its shard at
stage 3), from (spec, parameter name, element index) alone: identical at
every world size and stage, and nothing held before finalize. A numpy array
given as init instead is copied and held whole on every rank until finalize
(4 bytes x numel per rank): fine for small models.

`generate(spec, name, begin, end)` computes the same values without an
engine (a slice of a tensor, or the reference another framework needs).
"""
import dataclasses

import numpy as np

from ._ffi import ffi, lib
from .errors import ZeroInvalidArgumentError, check

KINDS = {"zeros": lib.ZERO_INIT_ZEROS, "ones": lib.ZERO_INIT_ONES, "constant": lib.ZERO_INIT_CONSTANT,
         "normal": lib.ZERO_INIT_NORMAL, "uniform": lib.ZERO_INIT_UNIFORM}


@dataclasses.dataclass(frozen=True)
class Init:
    """One init spec; build it with zeros(), ones(), constant(), normal(), uniform()."""
    kind: str
    value: float = 0.0
    mean: float = 0.0
    std: float = 1.0
    lo: float = 0.0
    hi: float = 1.0
    seed: int = 0

    def c_spec(self):
        """A zero_init_spec * with these values (libzero validates them)."""
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
