"""Exceptions: one class per zero_status, each carrying libzero's message.

A call that returns a status other than ZERO_OK raises the class of that
status; its text is the detailed message libzero left for the call (the
handle's last error, else zero_last_error()). Classes also derive from the
closest built-in exception, so `except TimeoutError` catches
ZeroTimeoutError and `except ValueError` catches ZeroConfigError.
"""
from ._ffi import lib, string


class ZeroError(Exception):
    """Base class. `status` is the zero_status code, `status_name` its name
    ("ZERO_TIMEOUT"), and str(exc) libzero's detailed message."""
    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def status_name(self):
        return string(lib.zero_status_name(self.status)) if self.status is not None else "ZERO_UNKNOWN_STATUS"

    @property
    def message(self):
        return str(self)


class ZeroInvalidArgumentError(ZeroError, ValueError):
    status = lib.ZERO_INVALID_ARGUMENT


class ZeroOutOfMemoryError(ZeroError, MemoryError):
    status = lib.ZERO_OUT_OF_MEMORY


class ZeroTimeoutError(ZeroError, TimeoutError):
    status = lib.ZERO_TIMEOUT


class ZeroPeerFailureError(ZeroError, ConnectionError):
    status = lib.ZERO_PEER_FAILURE


class ZeroMismatchError(ZeroError):
    status = lib.ZERO_MISMATCH


class ZeroInvalidStateError(ZeroError, RuntimeError):
    status = lib.ZERO_INVALID_STATE


class ZeroUnsupportedError(ZeroError, NotImplementedError):
    status = lib.ZERO_UNSUPPORTED


class ZeroBackendError(ZeroError, RuntimeError):
    status = lib.ZERO_BACKEND


class ZeroIOError(ZeroError, OSError):
    status = lib.ZERO_IO


class ZeroCorruptError(ZeroError):
    status = lib.ZERO_CORRUPT


class ZeroNotFoundError(ZeroError, LookupError):
    status = lib.ZERO_NOT_FOUND


class ZeroConfigError(ZeroError, ValueError):
    status = lib.ZERO_CONFIG


class ZeroInternalError(ZeroError):
    status = lib.ZERO_INTERNAL


ERROR_CLASSES = {cls.status: cls for cls in (
    ZeroInvalidArgumentError, ZeroOutOfMemoryError, ZeroTimeoutError, ZeroPeerFailureError,
    ZeroMismatchError, ZeroInvalidStateError, ZeroUnsupportedError, ZeroBackendError, ZeroIOError,
    ZeroCorruptError, ZeroNotFoundError, ZeroConfigError, ZeroInternalError)}


def error_for(status, message):
    """The exception for `status` carrying `message` (not raised)."""
    cls = ERROR_CLASSES.get(status)
    if cls is None:
        return ZeroError(f"{message} ({string(lib.zero_status_name(status))} {status})", status)
    return cls(message)


def check(status, last_error=None):
    """Raise for a non-OK status. `last_error` returns the handle's message
    (a C string); zero_last_error() is the fallback. Read at once: both are
    only valid until the next libzero call."""
    if status == lib.ZERO_OK:
        return
    msg = ""
    if last_error is not None:
        msg = string(last_error())
    if not msg:
        msg = string(lib.zero_last_error())
    if not msg:
        msg = string(lib.zero_strerror(status))
    raise error_for(status, msg)
