"""``ObjectCode``: compiled bytes plus what is needed to find kernels in them.

Guarantees:
- ``.code`` is always the raw, non-empty image bytes (cubin, PTX text without a
  trailing NUL, LTO-IR, fatbin, object or library), never a path or a wrapper.
- Path-backed constructors read the file once, at construction: later changes to
  or removal of the file do not affect the object, and a missing file fails there
  (FileNotFoundError), not at load time.
- Nothing here touches the driver; ``get_kernel`` imports the runtime layer only
  when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from cuforge.runtime.module import Kernel

#: The code types ObjectCode can hold (the runtime contract's list).
CODE_TYPES = ("cubin", "ptx", "ltoir", "fatbin", "object", "library")

# A PEP 604 union: typing.Union with a string member compiled a ForwardRef when a
# process's first compile(cache=) imported this module.
Source = bytes | bytearray | memoryview | str | os.PathLike[str]


class ObjectCode:
    """Compiled device code. Build one with ``Program.compile``, ``Linker.link`` or a
    ``from_*`` constructor.

    Raises:
        TypeError: ``code`` is not bytes-like, a name/mapping has the wrong type.
        ValueError: unknown ``code_type`` or empty ``code``.
    """

    # __weakref__: the runtime caches loaded libraries per ObjectCode via weak references.
    __slots__ = ("__weakref__", "_code", "_code_type", "_name", "_symbol_mapping")

    def __init__(
        self,
        code: bytes | bytearray | memoryview,
        code_type: str,
        *,
        name: str = "",
        symbol_mapping: Mapping[str | bytes, str] | None = None,
    ) -> None:
        if not isinstance(code, (bytes, bytearray, memoryview)):
            raise TypeError(f"code must be bytes, got {type(code).__name__}")
        if code_type not in CODE_TYPES:
            raise ValueError(
                f"unknown code_type {code_type!r}; valid ones are {', '.join(CODE_TYPES)}"
            )
        code = bytes(code)
        if not code:
            raise ValueError(f"ObjectCode of type {code_type!r} must not be empty")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        mapping = dict(symbol_mapping or {})
        for key, value in mapping.items():
            if not isinstance(key, (str, bytes)) or not isinstance(value, str):
                raise TypeError("symbol_mapping must map str/bytes name expressions to str")
        self._code = code
        self._code_type = code_type
        self._name = name
        self._symbol_mapping = mapping

    @classmethod
    def _trusted(
        cls, code: bytes, code_type: str, name: str, mapping: dict[str | bytes, str]
    ) -> ObjectCode:
        """An ObjectCode from values already validated (the cache hit path)."""
        obj = cls.__new__(cls)
        obj._code = code
        obj._code_type = code_type
        obj._name = name
        obj._symbol_mapping = mapping
        return obj

    @classmethod
    def _from_source(
        cls,
        source: Source,
        code_type: str,
        name: str | None,
        symbol_mapping: Mapping[str | bytes, str] | None,
    ) -> ObjectCode:
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            with open(path, "rb") as f:
                data = f.read()
            default_name = os.path.basename(path)
        elif isinstance(source, (bytes, bytearray, memoryview)):
            data, default_name = bytes(source), ""
        else:
            raise TypeError(
                f"{code_type} must be bytes or a path (str/os.PathLike), "
                f"got {type(source).__name__}"
            )
        return cls(
            data,
            code_type,
            name=default_name if name is None else name,
            symbol_mapping=symbol_mapping,
        )

    @classmethod
    def from_cubin(
        cls, module: Source, *, name: str | None = None, symbol_mapping: Any = None
    ) -> ObjectCode:
        """A cubin from bytes, or from a file path (read now; name defaults to its
        basename)."""
        return cls._from_source(module, "cubin", name, symbol_mapping)

    @classmethod
    def from_ptx(
        cls, module: Source, *, name: str | None = None, symbol_mapping: Any = None
    ) -> ObjectCode:
        """PTX from bytes (the text, encoded) or a file path. A str is a path."""
        obj = cls._from_source(module, "ptx", name, symbol_mapping)
        obj._code = obj._code.rstrip(b"\0") or obj._code
        return obj

    @classmethod
    def from_ltoir(
        cls, module: Source, *, name: str | None = None, symbol_mapping: Any = None
    ) -> ObjectCode:
        """LTO-IR from bytes or a file path."""
        return cls._from_source(module, "ltoir", name, symbol_mapping)

    @classmethod
    def from_fatbin(
        cls, module: Source, *, name: str | None = None, symbol_mapping: Any = None
    ) -> ObjectCode:
        """A fatbin from bytes or a file path."""
        return cls._from_source(module, "fatbin", name, symbol_mapping)

    @classmethod
    def from_object(
        cls, module: Source, *, name: str | None = None, symbol_mapping: Any = None
    ) -> ObjectCode:
        """A host object file with embedded device code, from bytes or a path."""
        return cls._from_source(module, "object", name, symbol_mapping)

    @classmethod
    def from_library(
        cls, module: Source, *, name: str | None = None, symbol_mapping: Any = None
    ) -> ObjectCode:
        """A static library with embedded device code, from bytes or a path."""
        return cls._from_source(module, "library", name, symbol_mapping)

    @property
    def code(self) -> bytes:
        """The raw image bytes."""
        return self._code

    @property
    def code_type(self) -> str:
        """One of ``CODE_TYPES``."""
        return self._code_type

    @property
    def name(self) -> str:
        """A label for logs and errors ("" when none was given)."""
        return self._name

    @property
    def symbol_mapping(self) -> dict[str | bytes, str]:
        """Name expression -> mangled name (a copy; mutate freely)."""
        return dict(self._symbol_mapping)

    def get_kernel(self, name: str | bytes) -> Kernel:
        """Load this code (once per context, by the runtime) and return kernel ``name``.

        ``name`` is looked up in ``symbol_mapping`` first (a name expression given to
        ``Program.compile``), else used as the symbol itself. Needs a CUDA driver;
        failures to load or find the symbol raise from the runtime layer.
        """
        if not isinstance(name, (str, bytes)):
            raise TypeError(f"kernel name must be str or bytes, got {type(name).__name__}")
        mangled = self._symbol_mapping.get(name)
        if mangled is None:
            mangled = name.decode() if isinstance(name, bytes) else name
        # Deferred import: compile-only users never load the driver (layer contract).
        from cuforge.runtime.module import load_kernel

        return load_kernel(self, mangled)

    def __repr__(self) -> str:
        label = f" {self._name!r}" if self._name else ""
        return f"<ObjectCode{label} {self._code_type}, {len(self._code)} bytes>"


__all__ = ["CODE_TYPES", "ObjectCode"]
