"""Lifetime of native handles: parents outlive children, close() defers.

Every wrapper of a libzero handle (Comm, Grid, Device, Engine) is a
_Resource. A resource that borrows another (an engine borrows its comm and
device; a grid's comms are borrowed from the grid; a numpy view borrows its
engine) registers as a *dependent*: the parent's native handle is destroyed
only once it is closed (close(), the `with` block's end, or garbage
collection) AND no dependent is left. So close() never leaves a dangling
pointer behind: it marks the object closed at once (every further call
raises ZeroInvalidStateError) and the destroy happens when the last
dependent goes away.

At interpreter exit every live handle is destroyed, children first
(reverse creation order), so MPI is finalised before mpirun notices.
"""
import atexit
import itertools
import weakref

from .errors import ZeroInvalidStateError

_order = itertools.count()
_live = weakref.WeakValueDictionary()  # creation number -> resource
_exiting = False


class _Resource:
    _kind = "handle"

    def __init__(self, handle, parents=()):
        self._h = handle
        self._closed = False
        self._deps = 0
        self._parents = []
        for p in parents:
            p._add_dep()
            self._parents.append(p)
        self._serial = next(_order)
        _live[self._serial] = self

    # ------------------------------------------------------------ dependents
    def _add_dep(self):
        self._live_handle()  # a closed parent takes no new dependents
        self._deps += 1

    def _drop_dep(self):
        self._deps -= 1
        self._maybe_free()

    # ------------------------------------------------------------ state
    def _live_handle(self):
        if self._closed or self._h is None:
            raise ZeroInvalidStateError(f"{self._kind} is closed")
        return self._h

    @property
    def closed(self):
        """True after close() (the native handle may still live on while
        dependents, e.g. numpy views, hold it)."""
        return self._closed

    @property
    def native_alive(self):
        """True while the libzero handle exists (closed or not)."""
        return self._h is not None

    def close(self):
        """Close now; the native destroy waits for dependents (see module doc)."""
        self._closed = True
        self._maybe_free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _maybe_free(self, force=False):
        if self._h is None or not (force or (self._closed and self._deps <= 0)):
            return
        h, self._h = self._h, None
        self._closed = True
        self._destroy(h)
        parents, self._parents = self._parents, []
        for p in parents:
            p._drop_dep()

    def _destroy(self, handle):  # pragma: no cover - overridden
        raise NotImplementedError

    def __del__(self):
        # Nothing references us any more, so no dependent is left either
        # (they hold us); at exit the atexit hook may already have freed us.
        try:
            if self._h is not None:
                self._closed = True
                self._maybe_free(force=True)
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass


@atexit.register
def _close_all_at_exit():
    global _exiting
    _exiting = True
    for serial in sorted(list(_live.keys()), reverse=True):
        r = _live.get(serial)
        if r is not None and r._h is not None:
            try:
                r._maybe_free(force=True)
            except Exception:  # noqa: BLE001
                pass
