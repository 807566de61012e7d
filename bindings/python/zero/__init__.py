"""libzero from Python: ZeRO-style sharding of training state (cffi, API mode).

    import zero
    with zero.Comm.world() as world:
        eng = zero.Engine(world, {"zero_optimization": {"stage": 3}})
        ...

See docs/python.md. Every failing libzero call raises a ZeroError subclass
(ZeroTimeoutError, ZeroConfigError, ...) carrying libzero's message.
"""
from . import checkpoint, init
from ._arrays import bf16_to_f32, f32_to_bf16
from ._device_arrays import DeviceArray
from ._ffi import ffi, lib, string
from .comm import Comm, Device, Grid, cuda_available
from .config import Config
from .engine import Engine, Module, ModuleViews, Param, StepResult, memory_estimate
from .errors import (ZeroBackendError, ZeroConfigError, ZeroCorruptError, ZeroError, ZeroInternalError,
                     ZeroInvalidArgumentError, ZeroInvalidStateError, ZeroIOError, ZeroMismatchError,
                     ZeroNotFoundError, ZeroOutOfMemoryError, ZeroPeerFailureError, ZeroTimeoutError,
                     ZeroUnsupportedError)
from .log import log_to_logging, set_log_handler

__version__ = string(lib.zero_version_string())
#: The version the bindings were compiled against (ZERO_VERSION encoding).
COMPILED_VERSION = lib.ZERO_VERSION


def cuda_handles_available():
    """True when the loaded libzero has zero_cuda.h's functions (a CUDA
    build): Engine.set_compute_stream with a CUDA stream needs them."""
    return bool(lib.zero_py_cuda_handles())


def version():
    """The loaded libzero's version (ZERO_VERSION encoding, MAJOR*10000+MINOR*100+PATCH)."""
    return lib.zero_version()


__all__ = [
    "Comm", "Grid", "Device", "DeviceArray", "Engine", "Config", "Module", "Param", "ModuleViews", "StepResult",
    "memory_estimate", "checkpoint", "init", "cuda_available", "cuda_handles_available", "bf16_to_f32", "f32_to_bf16", "set_log_handler", "log_to_logging",
    "version", "COMPILED_VERSION", "ffi", "lib",
    "ZeroError", "ZeroInvalidArgumentError", "ZeroOutOfMemoryError", "ZeroTimeoutError", "ZeroPeerFailureError",
    "ZeroMismatchError", "ZeroInvalidStateError", "ZeroUnsupportedError", "ZeroBackendError", "ZeroIOError",
    "ZeroCorruptError", "ZeroNotFoundError", "ZeroConfigError", "ZeroInternalError",
]
