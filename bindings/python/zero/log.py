"""libzero's diagnostics routed to Python (libzero never prints itself)."""
import logging

from ._ffi import ffi, lib

LEVELS = {"error": lib.ZERO_LOG_ERROR, "warn": lib.ZERO_LOG_WARN, "info": lib.ZERO_LOG_INFO,
          "debug": lib.ZERO_LOG_DEBUG}
_NAMES = {v: k for k, v in LEVELS.items()}
_PY_LEVELS = {"error": logging.ERROR, "warn": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
_handler = None


@ffi.def_extern()
def _zero_py_log(level, message, user):  # may run on any libzero thread; cffi takes the GIL
    h = _handler
    if h is not None:
        h(_NAMES.get(level, "error"), ffi.string(message).decode("utf-8", "replace"))


def set_log_handler(fn, level="warn"):
    """Call fn(level_name, message) for libzero messages at `level` or more
    severe; None removes the handler (libzero is then silent)."""
    global _handler
    _handler = fn
    if fn is None:
        lib.zero_set_log_handler(ffi.NULL, LEVELS["error"], ffi.NULL)
    else:
        lib.zero_set_log_handler(lib._zero_py_log, LEVELS[level], ffi.NULL)


def log_to_logging(level="warn", logger="zero"):
    """Route libzero's messages to the `logging` logger named `logger`."""
    log = logging.getLogger(logger)
    set_log_handler(lambda lvl, msg: log.log(_PY_LEVELS[lvl], msg), level)
