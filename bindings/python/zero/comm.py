"""Process groups: Comm (world, split, grid), collectives on numpy arrays,
byte counters; Device."""
import numpy as np

from ._arrays import as_c_buffer
from ._ffi import ffi, lib, string
from ._resource import _Resource
from .errors import ZeroInvalidArgumentError, check

BACKENDS = {"auto": lib.ZERO_BACKEND_AUTO, "mpi": lib.ZERO_BACKEND_MPI, "nccl": lib.ZERO_BACKEND_NCCL,
            "staged": lib.ZERO_BACKEND_STAGED, "local": lib.ZERO_BACKEND_LOCAL}
_BACKEND_NAMES = {v: k for k, v in BACKENDS.items()}
OPS = {"sum": lib.ZERO_SUM, "max": lib.ZERO_MAX}
OP_KINDS = {"allreduce": lib.ZERO_OP_ALLREDUCE, "reduce_scatter": lib.ZERO_OP_REDUCE_SCATTER,
            "allgather": lib.ZERO_OP_ALLGATHER, "broadcast": lib.ZERO_OP_BROADCAST, "send": lib.ZERO_OP_SEND,
            "recv": lib.ZERO_OP_RECV, "barrier": lib.ZERO_OP_BARRIER}

# The first world comm that initialised MPI is kept (closed or not) until
# exit: destroying the last world comm finalises MPI, and MPI can be
# initialised only once per process, so a later Comm.world() would fail.
_mpi_anchor = None


class Comm(_Resource):
    """A process group (zero_comm). Create the world with Comm.world(); derive
    groups with split() and grid(). Use as a context manager or close()."""
    _kind = "comm"

    def __init__(self, handle, parents=(), owned=True):
        super().__init__(handle, parents)
        self._owned = owned

    @classmethod
    def world(cls, backend="auto", timeout=60.0, device=-1):
        """The world group. backend: "auto" (MPI when launched with more
        than one rank, else local; initialises MPI), "mpi", "local", "nccl",
        "staged". timeout: the deadline of every blocking op, seconds."""
        global _mpi_anchor
        if backend not in BACKENDS:
            raise ZeroInvalidArgumentError(f"Comm.world: unknown backend {backend!r}; one of {sorted(BACKENDS)}")
        cfg = ffi.new("zero_comm_config *")
        lib.zero_py_init_zero_comm_config(cfg)  # ZERO_COMM_CONFIG_INIT
        cfg.backend = BACKENDS[backend]
        cfg.device = device
        cfg.timeout_s = timeout
        out = ffi.new("zero_comm **")
        check(lib.zero_comm_create_world(out, cfg))
        comm = cls(out[0])
        if backend != "local" and _mpi_anchor is None:
            _mpi_anchor = comm
            comm._deps += 1  # released only by the atexit hook
        return comm

    def _destroy(self, h):
        if self._owned:
            lib.zero_comm_destroy(h)

    def _check(self, status):
        check(status, lambda: lib.zero_comm_last_error(self._h) if self._h is not None else ffi.NULL)

    # ------------------------------------------------------------ properties
    @property
    def rank(self):
        return lib.zero_comm_get_rank(self._live_handle())

    @property
    def size(self):
        return lib.zero_comm_get_size(self._live_handle())

    @property
    def world_rank(self):
        return lib.zero_comm_get_world_rank(self._live_handle())

    def world_rank_of(self, rank):
        return lib.zero_comm_get_world_rank_of(self._live_handle(), rank)

    @property
    def backend(self):
        return _BACKEND_NAMES.get(lib.zero_comm_get_backend(self._live_handle()), "unknown")

    @property
    def name(self):
        return string(lib.zero_comm_get_name(self._live_handle()))

    @name.setter
    def name(self, value):
        self._check(lib.zero_comm_set_name(self._live_handle(), value.encode()))

    @property
    def timeout(self):
        return lib.zero_comm_get_timeout(self._live_handle())

    @timeout.setter
    def timeout(self, seconds):
        self._check(lib.zero_comm_set_timeout(self._live_handle(), float(seconds)))

    @property
    def last_error(self):
        return string(lib.zero_comm_last_error(self._live_handle()))

    def __repr__(self):
        if self._h is None or self._closed:
            return "<zero.Comm closed>"
        return f"<zero.Comm {self.name!r} rank {self.rank}/{self.size} {self.backend}>"

    # ------------------------------------------------------------ groups
    def split(self, color, key=0):
        """Like MPI_Comm_split; collective over this comm."""
        out = ffi.new("zero_comm **")
        self._check(lib.zero_comm_split(self._live_handle(), color, key, out))
        return Comm(out[0])

    def grid(self, tp=1, pp=1):
        """Megatron's tp x dp x pp grid of this (world) comm; dp = size/(tp*pp)."""
        return Grid(self, tp, pp)

    # ------------------------------------------------------------ collectives
    def _io(self, send, recv, what, send_count, recv_count):
        s, zdt, _ = as_c_buffer(send, f"{what} send", count=send_count)
        if recv is send:
            return s, s, zdt
        r, rdt, _ = as_c_buffer(recv, f"{what} recv", dtype=send.dtype, writable=True, count=recv_count)
        return s, r, zdt

    def allreduce(self, send, recv=None, op="sum"):
        """recv = op over ranks of send (a new array when recv is None;
        in place when recv is send). Returns recv."""
        if recv is None:
            recv = np.empty_like(send)
        s, r, zdt = self._io(send, recv, "allreduce", None, send.size)
        self._check(lib.zero_allreduce(self._live_handle(), s, r, send.size, zdt, OPS[op]))
        return recv

    def reduce_scatter(self, send, op="sum"):
        """This rank's chunk (send.size // size elements) of the reduction."""
        n = self.size
        if send.size % n:
            raise ZeroInvalidArgumentError(f"reduce_scatter: {send.size} elements do not split into {n} ranks")
        recv = np.empty(send.size // n, dtype=send.dtype)
        s, r, zdt = self._io(send, recv, "reduce_scatter", None, send.size // n)
        self._check(lib.zero_reduce_scatter(self._live_handle(), s, r, send.size // n, zdt, OPS[op]))
        return recv

    def allgather(self, send):
        """Every rank's `send` concatenated in rank order (a new 1-D array)."""
        recv = np.empty(send.size * self.size, dtype=send.dtype)
        s, r, zdt = self._io(send, recv, "allgather", None, recv.size)
        self._check(lib.zero_allgather(self._live_handle(), s, r, send.size, zdt))
        return recv

    def broadcast(self, arr, root=0):
        """In place: every rank's `arr` gets root's values. Returns arr."""
        b, zdt, n = as_c_buffer(arr, "broadcast", writable=True)
        self._check(lib.zero_broadcast(self._live_handle(), b, b, n, zdt, root))
        return arr

    def barrier(self):
        self._check(lib.zero_barrier(self._live_handle()))

    # ------------------------------------------------------------ counters
    def counters(self):
        """{op: {"sent": bytes, "recv": bytes, "calls": n}} since creation
        or the last reset (ring-volume accounting, see comm.h)."""
        c = ffi.new("zero_comm_counters *")
        self._check(lib.zero_comm_get_counters(self._live_handle(), c))
        return {name: {"sent": int(c.bytes_sent[k]), "recv": int(c.bytes_recv[k]), "calls": int(c.calls[k])}
                for name, k in OP_KINDS.items()}

    def reset_counters(self):
        lib.zero_comm_reset_counters(self._live_handle())


class Grid(_Resource):
    """tp/dp/pp sub-groups of a world comm (zero_grid). grid.tp, grid.dp and
    grid.pp are Comms borrowed from the grid: the grid is destroyed only
    once it is closed and none of them is referenced any more."""
    _kind = "grid"

    def __init__(self, world, tp=1, pp=1):
        g = ffi.new("zero_grid *")
        check(lib.zero_grid_create(world._live_handle(), tp, pp, g),
              lambda: lib.zero_comm_last_error(world._h))
        super().__init__(g, parents=(world,))
        self.tp_size, self.dp_size, self.pp_size = g.tp_size, g.dp_size, g.pp_size
        self.tp_rank, self.dp_rank, self.pp_rank = g.tp_rank, g.dp_rank, g.pp_rank
        self.tp = Comm(g.tp, parents=(self,), owned=False)
        self.dp = Comm(g.dp, parents=(self,), owned=False)
        self.pp = Comm(g.pp, parents=(self,), owned=False)

    def close(self):
        # The borrowed comms hold the grid: closing it closes them too.
        for c in (self.tp, self.dp, self.pp):
            c.close()
        super().close()

    def _destroy(self, g):
        lib.zero_grid_destroy(g)

    def __repr__(self):
        return (f"<zero.Grid tp {self.tp_rank}/{self.tp_size} dp {self.dp_rank}/{self.dp_size} "
                f"pp {self.pp_rank}/{self.pp_size}>")


class Device(_Resource):
    """A zero_device: Device("cpu") (the default of an Engine) or
    Device("cuda", ordinal) (-1: local rank modulo the GPU count)."""
    _kind = "device"

    def __init__(self, kind="cpu", ordinal=-1):
        kinds = {"cpu": lib.ZERO_DEVICE_CPU, "cuda": lib.ZERO_DEVICE_CUDA}
        if kind not in kinds:
            raise ZeroInvalidArgumentError(f"Device: unknown kind {kind!r}; 'cpu' or 'cuda'")
        out = ffi.new("zero_device **")
        check(lib.zero_device_create(out, kinds[kind], ordinal))
        super().__init__(out[0])
        self.kind = kind

    def _destroy(self, h):
        lib.zero_device_destroy(h)

    @property
    def ordinal(self):
        return lib.zero_device_get_ordinal(self._live_handle())

    def __repr__(self):
        return f"<zero.Device {self.kind}>"


def cuda_available():
    return bool(lib.zero_cuda_available())
