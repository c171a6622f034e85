"""cuforge.compile: CUDA C++, PTX and NVVM IR to cubin/PTX/LTO-IR, with no driver.

Public names mirror cuda.core's. Importing this package loads no CUDA library;
NVRTC, nvJitLink and libNVVM are loaded on first compile or link. Names resolve on
first use, so importing one submodule (the identity store, the key code) does not
import the rest.
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    # What __getattr__ resolves, spelled out for type checkers (tests/test_typing.py
    # checks that this block and _EXPORTS agree).
    from cuforge.compile.errors import CompileError as CompileError
    from cuforge.compile.errors import ToolkitNotFoundError as ToolkitNotFoundError
    from cuforge.compile.fatbin import pack_fatbin as pack_fatbin
    from cuforge.compile.linker import Linker as Linker
    from cuforge.compile.linker import LinkerOptions as LinkerOptions
    from cuforge.compile.object_code import ObjectCode as ObjectCode
    from cuforge.compile.options import ProgramOptions as ProgramOptions
    from cuforge.compile.program import Program as Program
    from cuforge.compile.targets import SUPPORTED_TARGETS as SUPPORTED_TARGETS

_EXPORTS = {
    "SUPPORTED_TARGETS": "cuforge.compile.targets",
    "CompileError": "cuforge.compile.errors",
    "Linker": "cuforge.compile.linker",
    "LinkerOptions": "cuforge.compile.linker",
    "ObjectCode": "cuforge.compile.object_code",
    "Program": "cuforge.compile.program",
    "ProgramOptions": "cuforge.compile.options",
    "ToolkitNotFoundError": "cuforge.compile.errors",
    "pack_fatbin": "cuforge.compile.fatbin",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
