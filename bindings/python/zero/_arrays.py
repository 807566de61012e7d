"""numpy <-> C buffers: zero-copy, typed, checked."""
import numpy as np

from ._ffi import ffi, lib
from .errors import ZeroInvalidArgumentError

# numpy dtype -> (zero_dtype, the C element type for ffi.from_buffer)
_NUMPY_TO_ZERO = {
    np.dtype(np.float32): (lib.ZERO_F32, "float[]"),
    np.dtype(np.float16): (lib.ZERO_F16, "uint16_t[]"),
    np.dtype(np.float64): (lib.ZERO_F64, "double[]"),
    np.dtype(np.int32): (lib.ZERO_I32, "int32_t[]"),
    np.dtype(np.int64): (lib.ZERO_I64, "int64_t[]"),
    np.dtype(np.uint8): (lib.ZERO_U8, "uint8_t[]"),
}

_DTYPE_NAMES = {"f32": lib.ZERO_F32, "f16": lib.ZERO_F16, "bf16": lib.ZERO_BF16, "i32": lib.ZERO_I32,
                "i64": lib.ZERO_I64, "u8": lib.ZERO_U8, "f64": lib.ZERO_F64,
                "float32": lib.ZERO_F32, "float16": lib.ZERO_F16, "bfloat16": lib.ZERO_BF16}

# zero_dtype -> numpy dtype of a view. bf16 has no numpy dtype: its views are
# uint16 bit patterns (bf16_to_f32 converts).
ZERO_TO_NUMPY = {lib.ZERO_F32: np.dtype(np.float32), lib.ZERO_F16: np.dtype(np.float16),
                 lib.ZERO_BF16: np.dtype(np.uint16), lib.ZERO_F64: np.dtype(np.float64),
                 lib.ZERO_I32: np.dtype(np.int32), lib.ZERO_I64: np.dtype(np.int64),
                 lib.ZERO_U8: np.dtype(np.uint8)}


def zero_dtype(value):
    """A zero_dtype from "f32"/"bf16"/..., a numpy dtype, or the code itself."""
    if isinstance(value, str):
        try:
            return _DTYPE_NAMES[value.lower()]
        except KeyError:
            raise ZeroInvalidArgumentError(f"unknown dtype {value!r}; one of {sorted(_DTYPE_NAMES)}") from None
    if isinstance(value, int):
        return value
    try:
        return _NUMPY_TO_ZERO[np.dtype(value)][0]
    except (KeyError, TypeError):
        raise ZeroInvalidArgumentError(f"dtype {value!r} has no libzero equivalent; "
                                       f"one of {sorted(_DTYPE_NAMES)}") from None


def as_c_buffer(arr, what, dtype=None, writable=False, count=None):
    """(cdata, zero_dtype, numel) over `arr`'s memory without copying.

    `arr` must be a C-contiguous numpy array; with `dtype` (a numpy dtype) it
    must have exactly that dtype (no silent conversion: a copy would break
    in-place semantics and hide a wrong dtype). ffi.from_buffer keeps the
    array alive for as long as the cdata lives and bounds-checks indexing."""
    if not isinstance(arr, np.ndarray):
        raise ZeroInvalidArgumentError(f"{what}: expected a numpy array, got {type(arr).__name__}")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise ZeroInvalidArgumentError(f"{what}: expected dtype {np.dtype(dtype)}, got {arr.dtype}")
    if arr.dtype not in _NUMPY_TO_ZERO:
        raise ZeroInvalidArgumentError(f"{what}: dtype {arr.dtype} has no libzero equivalent")
    if not arr.flags.c_contiguous:
        raise ZeroInvalidArgumentError(f"{what}: array must be C-contiguous (use np.ascontiguousarray)")
    if writable and not arr.flags.writeable:
        raise ZeroInvalidArgumentError(f"{what}: array is read-only")
    if count is not None and arr.size != count:
        raise ZeroInvalidArgumentError(f"{what}: expected {count} elements, got {arr.size} (shape {arr.shape})")
    zdt, ctype = _NUMPY_TO_ZERO[arr.dtype]
    return ffi.from_buffer(ctype, arr, require_writable=writable), zdt, arr.size


def bf16_to_f32(bits):
    """uint16 bf16 bit patterns (a bf16 view) -> float32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """float32 values -> bf16 bit patterns (uint16), rounded to nearest even
    like libzero's casts (NaN stays a quiet NaN)."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), ((bits >> 16) | 0x40).astype(np.uint16), rounded)
