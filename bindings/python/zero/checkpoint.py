"""Checkpoints (zero/checkpoint.h): save and load with an Engine, and the
offline tools: resolve, inspect, verify, consolidate, reshard."""
import dataclasses
import json

from ._ffi import ffi, lib, string
from .errors import check

AVAILABLE = hasattr(lib, "zero_checkpoint_save")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What a load found (zero_checkpoint_loaded)."""
    step: int        # the step it was saved at
    world_size: int  # of the run that saved it
    stage: int       # of the run that saved it
    user: dict       # the stored user object ({} if none)
    path: str        # the step directory that was loaded


def _need():
    if not AVAILABLE:
        from .errors import ZeroUnsupportedError
        raise ZeroUnsupportedError("checkpoints: this build of the bindings has no zero/checkpoint.h")


def save(engine, directory, step=None, user=None, keep_last=0, durable=True, comm=None):
    _need()
    opts = ffi.new("zero_checkpoint_options *")
    lib.zero_py_init_zero_checkpoint_options(opts)  # ZERO_CHECKPOINT_OPTIONS_INIT
    opts.keep_last = keep_last
    opts.durable = 1 if durable else 0
    if step is None:
        step = engine.scalars()["step"]
    comm = comm or engine.comm
    user_json = json.dumps(user).encode() if user is not None else ffi.NULL
    # Checkpoint calls report on the calling thread (zero_last_error), not on
    # the engine handle, whose message may be stale: plain check() reads the former.
    check(lib.zero_checkpoint_save(engine._live_handle(), comm._live_handle(), str(directory).encode(),
                                   int(step), user_json, opts))
    return resolve(directory)


def load(engine, path, comm=None):
    _need()
    comm = comm or engine.comm
    out = ffi.new("zero_checkpoint_loaded *")
    check(lib.zero_checkpoint_load(engine._live_handle(), comm._live_handle(), str(path).encode(), out))
    try:
        user = json.loads(string(out.user_json) or "{}")
        return Loaded(out.step, out.world_size, out.stage, user, string(out.path))
    finally:
        lib.zero_checkpoint_loaded_free(out)


def resolve(path):
    """The step directory `path` denotes (itself, or what path/latest names)."""
    _need()
    buf = ffi.new("char[]", 4096)
    check(lib.zero_checkpoint_resolve(str(path).encode(), buf, len(buf)))
    return string(buf)


def inspect(path):
    """meta.json of the checkpoint, checked, as a dict."""
    _need()
    out = ffi.new("char **")
    check(lib.zero_checkpoint_inspect(str(path).encode(), out))
    try:
        return json.loads(string(out[0]))
    finally:
        lib.zero_checkpoint_free(out[0])


def verify(path):
    """Check every file and checksum; raises ZeroCorruptError & co."""
    _need()
    check(lib.zero_checkpoint_verify(str(path).encode()))


def consolidate(path, out_file):
    """Every parameter's full fp32 weights into one safetensors file."""
    _need()
    check(lib.zero_checkpoint_consolidate(str(path).encode(), str(out_file).encode()))


def reshard(path, out_dir, world_size):
    _need()
    check(lib.zero_checkpoint_reshard(str(path).encode(), str(out_dir).encode(), int(world_size)))
