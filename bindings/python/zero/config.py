"""Engine configuration: a zero_config built from C defaults, a dict, a
DeepSpeed-style JSON document (text or file) and/or keyword overrides."""
import json
import os

from ._arrays import zero_dtype
from ._ffi import ffi, lib, string
from .errors import ZeroConfigError, check

OPTIMIZERS = {"adamw": lib.ZERO_OPTIM_ADAMW, "sgd": lib.ZERO_OPTIM_SGD}
_OPTIMIZER_NAMES = {v: k for k, v in OPTIMIZERS.items()}
_HIDDEN = ("size", "version")


def _fields():
    return [name for name, _ in ffi.typeof("zero_config").fields if name not in _HIDDEN]


class Config:
    """A zero_config. Starts from ZERO_CONFIG_INIT (C's defaults, via the
    generated zero_py_init_zero_config helper), then applies `source` through
    zero_config_from_json:

      * a dict: a DeepSpeed-style document {"zero_optimization": {...},
        "optimizer": {...}, "bf16": {...}, ...} (dumped to JSON);
      * a str or os.PathLike naming a .json file, or JSON text;

    then keyword overrides of the struct's fields by their C names
    (stage=3, lr=1e-2, optimizer="sgd", compute_dtype="bf16", ...).
    Errors raise ZeroConfigError with libzero's message, which names the key
    path (`zero_optimization.stage: expected an integer 0..3, got "three"`)."""

    def __init__(self, source=None, **fields):
        object.__setattr__(self, "_c", ffi.new("zero_config *"))
        lib.zero_py_init_zero_config(self._c)
        if source is not None:
            self.update_json(source)
        for k, v in fields.items():
            setattr(self, k, v)

    @classmethod
    def from_json_file(cls, path, **fields):
        with open(path, encoding="utf-8") as f:
            return cls(f.read(), **fields)

    def update_json(self, source):
        """Apply a dict, a JSON file path or JSON text (zero_config_from_json)."""
        if isinstance(source, dict):
            text = json.dumps(source)
        elif isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
            with open(source, encoding="utf-8") as f:
                text = f.read()
        elif isinstance(source, str):
            text = source
        else:
            raise ZeroConfigError(f"config: expected a dict, a JSON file path or JSON text, got "
                                  f"{type(source).__name__}")
        check(lib.zero_config_from_json(self._c, text.encode("utf-8")))
        return self

    def __getattr__(self, name):
        if name.startswith("_") or name not in _fields():
            raise AttributeError(f"zero_config has no field {name!r}")
        v = getattr(self._c, name)
        if name == "optimizer":
            return _OPTIMIZER_NAMES.get(v, v)
        if name == "compute_dtype":
            return string(lib.zero_dtype_name(v))
        if isinstance(v, ffi.CData) and ffi.typeof(v).kind == "array":  # char[N] (offload_nvme_path)
            return ffi.string(v).decode("utf-8")
        return v

    def __setattr__(self, name, value):
        if name not in _fields():
            raise ZeroConfigError(f"config: unknown field {name!r}; fields: {', '.join(_fields())}")
        if name == "optimizer" and isinstance(value, str):
            if value.lower() not in OPTIMIZERS:
                raise ZeroConfigError(f"config: optimizer: expected one of {sorted(OPTIMIZERS)}, got {value!r}")
            value = OPTIMIZERS[value.lower()]
        elif name == "compute_dtype":
            value = zero_dtype(value)
        elif isinstance(value, str):  # a char[N] field (offload_nvme_path)
            value = value.encode("utf-8")
        try:
            setattr(self._c, name, value)
        except (TypeError, OverflowError) as exc:
            raise ZeroConfigError(f"config: {name}: {exc}") from None

    def to_dict(self):
        """The struct's fields by C name (enums as names)."""
        return {name: getattr(self, name) for name in _fields()}

    def copy(self):
        c = Config()
        c._c[0] = self._c[0]
        return c

    def __repr__(self):
        return "zero.Config(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"


def as_config(config):
    """A Config from a Config (copied), dict, path, JSON text or None."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config.copy()
    return Config(config)
