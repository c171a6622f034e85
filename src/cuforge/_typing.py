"""Types for annotations only: cuforge imports this module under ``if TYPE_CHECKING:``
and never at run time (``typing`` costs a cold process ~5 ms, and the CLI's hit path
avoids it), so ``typing_extensions`` -- which the type checkers ship -- is not a
run-time dependency.

- ``ReadableBuffer``: any object with the buffer protocol (PEP 688's
  ``collections.abc.Buffer``), for arguments read through ``memoryview(x)``: ``bytes``,
  ``bytearray``, ``memoryview``, ``array.array``, NumPy arrays, ...
- ``BytesLike``: exactly ``bytes | bytearray | memoryview``, for arguments cuforge
  checks to be one of those three (other buffers are refused with a TypeError).
- ``StrPath``: a filesystem path as ``str`` or ``os.PathLike[str]``.
- ``SupportsWrite``: anything with ``write(str)`` (a file opened for text, ``sys.stderr``,
  ``io.StringIO``), for compile logs.
- ``ObjectCodeLike``: what a program cache stores besides bytes: an object with
  ``code`` (bytes-like, or a path to the binary) and ``code_type`` (cuforge's or
  cuda.core's ``ObjectCode``; storage duck-types it, never importing the compile layer).
- ``IsStreamT``: anything with ``__cuda_stream__() -> (version, handle)`` (cuforge,
  cuda.core, CuPy and PyTorch streams).
- ``CudaArrayLike`` / ``DLPackLike``: arrays exporting ``__cuda_array_interface__`` or
  ``__dlpack__`` (CuPy, PyTorch, Numba); ``DevicePointer``: what graph copy and memset
  nodes take as an address (a Buffer, such an array, or an int address).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, Union

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer
if sys.version_info >= (3, 11):
    from typing import Self as Self
else:
    from typing_extensions import Self as Self

if TYPE_CHECKING:
    from cuforge.runtime.memory import Buffer as DeviceBuffer

ReadableBuffer: TypeAlias = Buffer
BytesLike: TypeAlias = bytes | bytearray | memoryview
StrPath: TypeAlias = str | os.PathLike[str]


class SupportsWrite(Protocol):
    """A text sink: ``write(text)``; what it returns is ignored."""

    def write(self, text: str, /) -> object: ...


class ObjectCodeLike(Protocol):
    """An ObjectCode as storage sees it: ``code`` and ``code_type``."""

    @property
    def code(self) -> bytes | bytearray | memoryview | str | os.PathLike[str]: ...
    @property
    def code_type(self) -> str: ...


class IsStreamT(Protocol):
    """A stream from any library: ``__cuda_stream__()`` returns ``(0, CUstream as int)``."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class CudaArrayLike(Protocol):
    """An array exporting CUDA memory through ``__cuda_array_interface__`` (v3)."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]: ...


class DLPackLike(Protocol):
    """An array exporting its memory through ``__dlpack__``."""

    def __dlpack__(self) -> object: ...


DevicePointer: TypeAlias = Union["DeviceBuffer", int, CudaArrayLike, DLPackLike]
