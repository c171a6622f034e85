"""cuforge.compile: CUDA C++, PTX and NVVM IR to cubin/PTX/LTO-IR, with no driver.

Public names mirror cuda.core's. Importing this package loads no CUDA library;
NVRTC, nvJitLink and libNVVM are loaded on first compile or link.
"""

from cuforge.compile.errors import CompileError, ToolkitNotFoundError
from cuforge.compile.linker import Linker, LinkerOptions
from cuforge.compile.object_code import ObjectCode
from cuforge.compile.options import ProgramOptions
from cuforge.compile.program import Program
from cuforge.compile.targets import SUPPORTED_TARGETS

__all__ = [
    "SUPPORTED_TARGETS",
    "CompileError",
    "Linker",
    "LinkerOptions",
    "ObjectCode",
    "Program",
    "ProgramOptions",
    "ToolkitNotFoundError",
]
