"""The compile layer's exception types.

Guarantee: every failure *inside* a compiler backend (NVRTC, nvJitLink, libNVVM, the
driver linker) surfaces as ``CompileError`` with the backend's complete log and the
exact flag list it received. Mistakes the caller can see without compiling (wrong
option type or value, unsupported code_type/target pair) are TypeError/ValueError
instead, raised before any backend runs. A compiler library that is missing, or of
another CUDA major than cuda-bindings, is ``ToolkitNotFoundError`` (naming the pip
extra that installs it), raised by the first compile that needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuforge._cuda import ToolkitNotFoundError
from cuforge._names import shown


class CompileError(RuntimeError):
    """A compiler backend rejected the input.

    Attributes:
        backend: ``"NVRTC"``, ``"nvJitLink"``, ``"libNVVM"`` or ``"driver linker"``.
        log: the backend's full log text (may be empty if the backend gave none).
        options: the flags the backend received, as str, in order (bytes that are
            not UTF-8, from a path such as ``-I`` of a folder so named, as lone
            surrogates: ``os.fsencode`` gives them back).
        status: the backend's status name (e.g. ``"NVRTC_ERROR_COMPILATION"``).
        name: the program or link name.

    The message shows a name's or flag's bytes that are not UTF-8 as ``\\xNN``
    (``cuforge._names``), so it prints on any stream.
    """

    def __init__(
        self,
        backend: str,
        status: str,
        log: str,
        options: Sequence[str | bytes],
        name: str = "",
    ) -> None:
        self.backend = backend
        self.status = status
        self.log = log
        self.options = tuple(
            o.decode("utf-8", "surrogateescape") if isinstance(o, bytes) else o for o in options
        )
        self.name = name
        said = shown(name)
        what = "" if not name else f" of {name!r}" if said is name else f" of '{said}'"
        message = f"{backend} compilation{what} failed ({status})"
        if log.strip():
            message += ":\n" + log.rstrip()
        message += "\noptions: " + " ".join(shown(o) for o in self.options)
        super().__init__(message)


def decode_log(raw: bytes | bytearray) -> str:
    """Compiler log bytes as text: NULs stripped, a byte that is not UTF-8 (a file
    name's, ``k\\xfc.cu(3): error ...``) written ``\\xNN``."""
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", errors="backslashreplace")


__all__ = ["CompileError", "ToolkitNotFoundError", "decode_log"]
