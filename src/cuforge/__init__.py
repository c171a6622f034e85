"""cuforge: JIT-compile CUDA through a cache that is never wrong, and build CUDA
graphs that never touch freed memory.

Public names mirror ``cuda.core`` so code ports by changing the import.  Names are
resolved lazily: ``import cuforge`` loads no CUDA library and never touches the
driver, so compile-and-cache users on machines without a GPU pay nothing for the
runtime layer.
"""

from __future__ import annotations

from cuforge import _lazy, _log

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    # What __getattr__ resolves, spelled out for type checkers (tests/test_typing.py
    # checks that this block and _EXPORTS agree).
    from cuforge._warm import compiles_after_warm as compiles_after_warm
    from cuforge._warm import mark_warm as mark_warm
    from cuforge.compile.errors import CompileError as CompileError
    from cuforge.compile.linker import Linker as Linker
    from cuforge.compile.linker import LinkerOptions as LinkerOptions
    from cuforge.compile.object_code import ObjectCode as ObjectCode
    from cuforge.compile.options import ProgramOptions as ProgramOptions
    from cuforge.compile.program import Program as Program
    from cuforge.runtime.device import Device as Device
    from cuforge.runtime.errors import CUDAError as CUDAError
    from cuforge.runtime.event import Event as Event
    from cuforge.runtime.event import EventOptions as EventOptions
    from cuforge.runtime.launch import LaunchConfig as LaunchConfig
    from cuforge.runtime.launch import launch as launch
    from cuforge.runtime.memory import Buffer as Buffer
    from cuforge.runtime.memory import DeviceMemoryResource as DeviceMemoryResource
    from cuforge.runtime.memory import MemoryResource as MemoryResource
    from cuforge.runtime.memory import PinnedMemoryResource as PinnedMemoryResource
    from cuforge.runtime.module import Kernel as Kernel
    from cuforge.runtime.stream import Stream as Stream
    from cuforge.runtime.stream import StreamOptions as StreamOptions

# A library configures no logging: records go nowhere unless the application asks.
# logging itself is not imported for this (a cold process would pay ~5 ms): the
# handler goes on now if the application already imported logging, else when a
# cuforge logger is first used (cuforge._log).
_log.null_handler_if_loaded()

# The one version source: the build reads it (pyproject.toml, tool.setuptools.dynamic)
# and the installed metadata carries it.
__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # compile layer
    "Program": "cuforge.compile.program",
    "ProgramOptions": "cuforge.compile.options",
    "ObjectCode": "cuforge.compile.object_code",
    "Linker": "cuforge.compile.linker",
    "LinkerOptions": "cuforge.compile.linker",
    "CompileError": "cuforge.compile.errors",
    # runtime layer
    "CUDAError": "cuforge.runtime.errors",
    "Device": "cuforge.runtime.device",
    "Stream": "cuforge.runtime.stream",
    "StreamOptions": "cuforge.runtime.stream",
    "Event": "cuforge.runtime.event",
    "EventOptions": "cuforge.runtime.event",
    "Buffer": "cuforge.runtime.memory",
    "MemoryResource": "cuforge.runtime.memory",
    "DeviceMemoryResource": "cuforge.runtime.memory",
    "PinnedMemoryResource": "cuforge.runtime.memory",
    "Kernel": "cuforge.runtime.module",
    "LaunchConfig": "cuforge.runtime.launch",
    "launch": "cuforge.runtime.launch",
    # compiles after warm-up (serving processes)
    "mark_warm": "cuforge._warm",
    "compiles_after_warm": "cuforge._warm",
}

__all__ = sorted([*_EXPORTS, "__version__"])


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
