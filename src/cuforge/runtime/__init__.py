"""cuforge's runtime layer on ``cuda.bindings.driver``: devices, streams, events,
memory, kernel loading and launch. Importing it loads no driver; the first call that
needs one initialises CUDA (see :mod:`cuforge.runtime.init`).

Thread safety: every public object may be used from several Python threads. The
current device/context is per thread, as in CUDA; resource-creating methods always
act on their own device whatever is current (see :mod:`cuforge.runtime.device`).
"""

from __future__ import annotations

from cuforge.runtime.args import PackedArgs, pack_args
from cuforge.runtime.device import Device, DeviceProperties
from cuforge.runtime.errors import CUDAError
from cuforge.runtime.event import Event, EventOptions
from cuforge.runtime.launch import LaunchConfig, launch
from cuforge.runtime.memory import (
    Allocation,
    Buffer,
    DeviceMemoryResource,
    MemoryResource,
    PinnedMemoryResource,
)
from cuforge.runtime.module import Kernel, KernelAttributes, load_kernel
from cuforge.runtime.stream import Stream, StreamOptions

__all__ = [
    "Allocation",
    "Buffer",
    "CUDAError",
    "Device",
    "DeviceMemoryResource",
    "DeviceProperties",
    "Event",
    "EventOptions",
    "Kernel",
    "KernelAttributes",
    "LaunchConfig",
    "MemoryResource",
    "PackedArgs",
    "PinnedMemoryResource",
    "Stream",
    "StreamOptions",
    "launch",
    "load_kernel",
    "pack_args",
]
