"""Views of an engine's CUDA device memory for CUDA array libraries.

A DeviceArray is what Engine.param_data_device / param_grad_device return:
a pointer, a shape and a dtype published through __cuda_array_interface__
(version 3, https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html),
which torch.as_tensor, CuPy and Numba take zero-copy. Nothing here imports
torch or a CUDA package: `import zero` stays free of both.

Lifetime: a DeviceArray holds a lease on its engine like a numpy view
(engine.py's module doc): the engine's memory outlives it, and a call that
would free the memory under it (a stage-3 release, a stage-2/3 grads_ready)
raises while it is referenced. A consumer that keeps the object (torch
keeps it for as long as the tensor's storage lives) extends that to its own
tensor.

Stream: the "stream" entry is the engine's compute stream (the stream the
data is valid on; engine.h "streams"): the cudaStream_t as an int, or 1 for
the legacy default stream (the interface reserves 0). A consumer that
computes on another stream must order itself after it.
"""
from ._ffi import ffi, lib

# zero_dtype -> the interface's typestr (numpy's array-interface codes).
# bf16 has none: its arrays are uint16 bit patterns, as the numpy views are
# (zero.torch reinterprets them with .view(torch.bfloat16)).
TYPESTR = {lib.ZERO_F32: "<f4", lib.ZERO_F16: "<f2", lib.ZERO_BF16: "<u2", lib.ZERO_F64: "<f8",
           lib.ZERO_I32: "<i4", lib.ZERO_I64: "<i8", lib.ZERO_U8: "|u1"}
ITEMSIZE = {k: int(v[2:]) for k, v in TYPESTR.items()}

LEGACY_DEFAULT_STREAM = 1  # the interface's value for the legacy default stream


def interface_stream(cuda_stream):
    """The interface's "stream" entry for a cudaStream_t given as an int (0: the default stream)."""
    return int(cuda_stream) or LEGACY_DEFAULT_STREAM


class DeviceArray:
    """A C-contiguous array in CUDA device memory of an engine (see the module doc).

    ptr: the device address (int); shape: a tuple; zero_dtype: the element
    type (a zero_dtype); stream: the cudaStream_t it is valid on (int, 0 =
    the default stream); writable: the interface's read-only flag inverted;
    owner: what keeps the memory (the engine lease) alive."""
    __slots__ = ("ptr", "shape", "zero_dtype", "stream", "writable", "_owner")

    def __init__(self, ptr, shape, zero_dtype, stream=0, writable=False, owner=None):
        self.ptr, self.shape, self.zero_dtype = int(ptr), tuple(int(s) for s in shape), zero_dtype
        self.stream, self.writable, self._owner = int(stream), bool(writable), owner

    @property
    def typestr(self):
        return TYPESTR[self.zero_dtype]

    @property
    def itemsize(self):
        return ITEMSIZE[self.zero_dtype]

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self):
        return self.size * self.itemsize

    @property
    def __cuda_array_interface__(self):
        # strides None: C-contiguous. data (ptr, read-only flag). A
        # zero-element array may carry any pointer; 0 is the convention.
        return {"version": 3, "shape": self.shape, "typestr": self.typestr,
                "data": (self.ptr if self.size else 0, not self.writable), "strides": None,
                "stream": interface_stream(self.stream)}

    def __repr__(self):
        return (f"<zero.DeviceArray {self.typestr} {self.shape} at {self.ptr:#x} stream "
                f"{self.stream:#x}{'' if self.writable else ' read-only'}>")


def stream_handle(zero_stream):
    """The cudaStream_t (int) behind a zero_stream * (0 for NULL or a CPU device's)."""
    if zero_stream == ffi.NULL:
        return 0
    return int(ffi.cast("uintptr_t", lib.zero_py_stream_get_cuda(zero_stream)))
