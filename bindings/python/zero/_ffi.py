"""The compiled cffi extension (zero._zero): `ffi` and `lib`."""
try:
    from ._zero import ffi, lib  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on how it was installed
    raise ImportError(
        "zero: the compiled extension zero._zero is missing or cannot load libzero "
        f"({exc}). Build it with meson (ninja -C build; then put build/bindings/python on "
        "sys.path) or install with pip (see docs/python.md).") from exc


def string(cdata):
    """A C string (const char *) as str; '' for NULL."""
    return ffi.string(cdata).decode("utf-8", "replace") if cdata != ffi.NULL else ""
