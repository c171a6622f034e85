"""cuforge.compile: CUDA C++, PTX and NVVM IR to cubin/PTX/LTO-IR, with no driver.

Public names mirror cuda.core's. Importing this package loads no CUDA library;
NVRTC, nvJitLink and libNVVM are loaded on first compile or link. Names resolve on
first use, so importing one submodule (the identity store, the key code) does not
import the rest.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any

_EXPORTS = {
    "SUPPORTED_TARGETS": "cuforge.compile.targets",
    "CompileError": "cuforge.compile.errors",
    "Linker": "cuforge.compile.linker",
    "LinkerOptions": "cuforge.compile.linker",
    "ObjectCode": "cuforge.compile.object_code",
    "Program": "cuforge.compile.program",
    "ProgramOptions": "cuforge.compile.options",
    "ToolkitNotFoundError": "cuforge.compile.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
