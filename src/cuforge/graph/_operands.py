"""Turn user-facing operands into driver parameters plus the owners they need.

Every resolver returns the raw value CUDA gets and a tuple of owners: the objects
that must stay alive for as long as a graph may use that value. The node code
packs those owners into an immutable bundle (:mod:`cuforge.graph._owners`).

Failure modes: a wrong operand type raises TypeError, an owner combined with an
operand that already owns its memory raises ValueError, a closed Buffer raises
ValueError; nothing is retained when resolution fails.
"""

from __future__ import annotations

import ctypes
import threading
from _ctypes import CFuncPtr as _CFuncPtr  # ctypes._CFuncPtr: every function pointer's base
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver

from cuforge._native import _release as _native
from cuforge.runtime.args import pack_args
from cuforge.runtime.errors import CUDAError, check
from cuforge.runtime.interop import contiguous_nbytes, dlpack_extent
from cuforge.runtime.launch import validate_args
from cuforge.runtime.memory import Buffer

if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._typing import DevicePointer, IsStreamT, ReadableBuffer
    from cuforge.runtime.event import Event

_TRAMPOLINE = _native.host_trampoline_address()


def current_context() -> driver.CUcontext:
    """The calling thread's current context; CUDAError if there is none."""
    ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        raise CUDAError(
            "no current CUDA context on this thread: call Device(...).set_current() first"
        )
    return ctx


def context_device(ctx: driver.CUcontext) -> int:
    """The device ordinal of ``ctx`` (primary contexts cuforge holds: no driver call)."""
    from cuforge.runtime.device import ContextScope, primary_context_device

    found = primary_context_device(int(ctx))
    if found is not None:
        return found
    with ContextScope(ctx):
        return int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))


def resolve_pointer(
    obj: DevicePointer, owner: object, what: str, nbytes: int = 0
) -> tuple[int, tuple[Any, ...]]:
    """A device/host address for a copy operand, and what keeps it valid.

    Buffer -> its allocation; an array with ``__cuda_array_interface__`` or
    ``__dlpack__`` (torch, CuPy) -> the array itself; int -> nothing, unless
    ``owner`` names something to keep alive (a Buffer owner: its allocation, so
    closing that Buffer later frees nothing; a closed one is a ValueError).
    ``nbytes`` is the extent the node touches: more than a Buffer or a contiguous
    array holds raises ValueError.
    """
    if isinstance(obj, bool):
        raise TypeError(f"{what}: expected a Buffer or an int address, got bool")
    if isinstance(obj, int):
        if owner is None:
            return obj, ()
        if isinstance(owner, Buffer):  # the wrapper alone would not keep the memory
            if owner._alloc is None:
                raise ValueError(f"{what}: the owner Buffer is closed")
            owner = owner._alloc
        return obj, (owner,)
    if owner is not None:
        raise ValueError(
            f"{what}: an owner may only accompany a raw int address; a "
            f"{type(obj).__name__} operand is kept alive by the graph itself"
        )
    if isinstance(obj, Buffer):
        allocation = obj._alloc
        if allocation is None:
            raise ValueError(f"{what}: the Buffer is closed")
        _check_extent(what, nbytes, obj.size)
        return obj.handle, (allocation,)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        _check_extent(what, nbytes, _cai_nbytes(cai))
        return int(cai["data"][0]), (obj,)
    if hasattr(obj, "__dlpack__"):
        try:
            ptr, size = dlpack_extent(obj)
        except Exception as exc:
            raise TypeError(f"{what}: {type(obj).__name__} is not CUDA memory ({exc})") from exc
        _check_extent(what, nbytes, size)
        return ptr, (obj,)
    raise TypeError(
        f"{what}: expected a Buffer, an array with __cuda_array_interface__ or __dlpack__, "
        f"or an int address, got {type(obj).__name__}"
    )


def _cai_nbytes(cai: dict[str, Any]) -> int | None:
    """Byte size of a C-contiguous ``__cuda_array_interface__`` array, else None."""
    itemsize = int(str(cai.get("typestr", "|u1"))[2:] or 1)
    strides = cai.get("strides")
    return contiguous_nbytes(
        tuple(cai.get("shape", ())), itemsize, None if strides is None else tuple(strides)
    )


def _check_extent(what: str, nbytes: int, size: int | None) -> None:
    if size is not None and nbytes > size:
        raise ValueError(f"{what}: the node touches {nbytes} bytes but the operand holds {size}")


_local = threading.local()


def _node_params_for(config: Any) -> driver.CUDA_KERNEL_NODE_PARAMS:
    """A per-thread parameter struct with ``config``'s dimensions already set.

    The driver copies node parameters during the add/set call, so one struct per
    (thread, config) is reused: only the kernel and argument fields change per node.
    """
    cache = getattr(_local, "params", None)
    if cache is None:
        cache = _local.params = {}
    entry = cache.get(id(config))
    if entry is not None and entry[0] is config:
        return entry[1]
    try:
        grid, block, shmem = config.grid_in_blocks, config.block, config.shmem_size
    except AttributeError:
        raise TypeError(f"config must be a LaunchConfig, got {type(config).__name__}") from None
    p = driver.CUDA_KERNEL_NODE_PARAMS()
    p.gridDimX, p.gridDimY, p.gridDimZ = grid
    p.blockDimX, p.blockDimY, p.blockDimZ = block
    p.sharedMemBytes = shmem
    if len(cache) >= 64:
        cache.clear()
    cache[id(config)] = (config, p)  # holding config keeps its id from being reused
    return p


_ATTR = driver.CUkernelNodeAttrID
_CLUSTER = _ATTR.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_COOPERATIVE = _ATTR.CU_LAUNCH_ATTRIBUTE_COOPERATIVE


def node_launch_attributes(node: driver.CUgraphNode) -> tuple[tuple[int, int, int], bool]:
    """A kernel node's (cluster dims, cooperative); (0, 0, 0) means no cluster."""
    v = check(driver.cuGraphKernelNodeGetAttribute(node, _CLUSTER), "cuGraphKernelNodeGetAttribute")
    cluster = (int(v.clusterDim.x), int(v.clusterDim.y), int(v.clusterDim.z))
    v = check(driver.cuGraphKernelNodeGetAttribute(node, _COOPERATIVE), "cuGraphKernelNodeGetAttribute")  # fmt: skip  # noqa: E501
    return cluster, bool(v.cooperative)


def config_launch_attributes(config: Any) -> tuple[tuple[int, int, int], bool]:
    """What ``config`` asks for, in node_launch_attributes' terms."""
    return (config.cluster or (0, 0, 0)), bool(config.cooperative_launch)


def set_kernel_node_attributes(
    node: driver.CUgraphNode, config: Any, current: tuple[Any, bool] | None = None
) -> None:
    """Give ``node`` the cluster dims and cooperative flag of ``config``.

    ``current`` (the node's present attributes) lets an update reset what the new
    config no longer asks for; a new node starts with none.
    """
    cluster, coop = config_launch_attributes(config)
    have_cluster, have_coop = current if current is not None else ((0, 0, 0), False)
    if cluster != have_cluster:
        v = driver.CUkernelNodeAttrValue()
        v.clusterDim.x, v.clusterDim.y, v.clusterDim.z = cluster
        check(driver.cuGraphKernelNodeSetAttribute(node, _CLUSTER, v),
              "cuGraphKernelNodeSetAttribute(cluster)")  # fmt: skip
    if coop != have_coop:
        v = driver.CUkernelNodeAttrValue()
        v.cooperative = int(coop)
        check(driver.cuGraphKernelNodeSetAttribute(node, _COOPERATIVE, v),
              "cuGraphKernelNodeSetAttribute(cooperative)")  # fmt: skip


def kernel_params(
    config: Any, kernel: Any, args: tuple[Any, ...]
) -> tuple[driver.CUDA_KERNEL_NODE_PARAMS, tuple[Any, ...]]:
    """Kernel-node parameters and owners: the kernel, the args and their allocations.

    The returned struct is reused by the next call on this thread: pass it to the
    driver at once.
    """
    p = _node_params_for(config)
    handle = getattr(kernel, "handle", None)
    if isinstance(handle, driver.CUkernel):
        # A CUkernel runs in the current context: no per-node cuKernelGetFunction.
        if int(p.func):
            p.func = None
        p.kern = handle
    elif isinstance(kernel, driver.CUfunction):
        p.kern = None
        p.func = kernel
    else:
        raise TypeError(f"kernel must be a Kernel, got {type(kernel).__name__}")
    packed = pack_args(args)
    if isinstance(handle, driver.CUkernel):
        # The same count/width check launch() makes: a bad node must not be built.
        validate_args(kernel, packed, len(args))
    p.kernelParams = packed.params
    # packed is kept too: its params memory must outlive the driver call, and the
    # bundle is the cheapest place that is guaranteed to.
    return p, (kernel, args, packed, *packed.owners)


def memset_value(value: int | ReadableBuffer) -> tuple[int, int]:
    """(value, element size) for a memset: an int byte, or 1/2/4 raw bytes."""
    if isinstance(value, bool):
        raise TypeError("memset value must be an int or 1, 2 or 4 bytes, not bool")
    if isinstance(value, int):
        if not 0 <= value <= 0xFF:
            raise ValueError(
                "an int memset value is one byte (0..255); pass 2 or 4 bytes for wider elements"
            )
        return value, 1
    try:
        raw = memoryview(value).tobytes()
    except TypeError:
        raise TypeError(
            f"memset value must be an int or a bytes-like object, got {type(value).__name__}"
        ) from None
    if len(raw) not in (1, 2, 4):
        raise ValueError(f"memset value must be 1, 2 or 4 bytes long, got {len(raw)}")
    return int.from_bytes(raw, "little"), len(raw)


def memset_params(
    dst: int, value: int | ReadableBuffer, width: int, height: int, pitch: int
) -> driver.CUDA_MEMSET_NODE_PARAMS:
    """Memset-node parameters (width in elements, pitch in bytes)."""
    val, elem = memset_value(value)
    if width <= 0 or height <= 0:
        raise ValueError("memset width and height must be positive")
    p = driver.CUDA_MEMSET_NODE_PARAMS()
    p.dst = dst
    p.value = val
    p.elementSize = elem
    p.width = width
    p.height = height
    p.pitch = pitch if pitch else width * elem
    return p


def memcpy_params(dst: int, src: int, size: int) -> driver.CUDA_MEMCPY3D:
    """A 1-D copy of ``size`` bytes between two unified (UVA) addresses."""
    if size <= 0:
        raise ValueError("memcpy size must be positive")
    p = driver.CUDA_MEMCPY3D()
    unified = driver.CUmemorytype.CU_MEMORYTYPE_UNIFIED
    p.srcMemoryType = unified
    p.srcDevice = src
    p.dstMemoryType = unified
    p.dstDevice = dst
    p.WidthInBytes = size
    p.Height = 1
    p.Depth = 1
    return p


def explain_copy_failure(exc: CUDAError, device_id: int, p: Any) -> CUDAError:
    """``exc`` (a refused memcpy node add/update) with what to call when an operand
    lives on another device that may not access it (see ``peer_access_hint``)."""
    from cuforge.runtime.memory import peer_access_hint

    hint = peer_access_hint(device_id, (int(p.srcDevice), int(p.dstDevice)))
    if not hint:
        return exc
    out = CUDAError(f"{exc} ({hint})", exc.result)
    out.__cause__ = exc
    return out


def host_callback(
    fn: Callable[..., object],
    user_data: Any,  # int | ReadableBuffer | None, checked here
) -> tuple[driver.CUDA_HOST_NODE_PARAMS, tuple[Any, ...]]:
    """Host-node parameters for ``fn`` and the owners that keep fn/user_data valid.

    A Python callable takes no arguments and runs with the GIL through the C
    trampoline; ``user_data`` is then refused. A ctypes function pointer is passed
    to CUDA as is; an int ``user_data`` is a raw pointer the caller keeps valid,
    bytes-like ``user_data`` is copied into memory the bundle owns.
    """
    p = driver.CUDA_HOST_NODE_PARAMS()
    if isinstance(fn, _CFuncPtr):
        # CUDA calls it as void (*)(void *): another prototype would corrupt the call.
        argtypes = getattr(fn, "argtypes", None)
        if getattr(fn, "restype", None) is not None or (
            argtypes is not None and tuple(argtypes) not in ((ctypes.c_void_p,), ())
        ):
            raise TypeError(
                "callback: a ctypes function pointer must have the CUhostFn prototype "
                "CFUNCTYPE(None, ctypes.c_void_p)"
            )
        address = ctypes.cast(fn, ctypes.c_void_p).value
        if not address:
            raise ValueError("callback: the ctypes function pointer is NULL")
        owners: tuple[Any, ...] = (fn,)
        if user_data is None:
            data = 0
        elif isinstance(user_data, int) and not isinstance(user_data, bool):
            data = user_data
        else:
            try:
                raw = memoryview(user_data).tobytes()
            except TypeError:
                raise TypeError(
                    "callback user_data must be None, an int address or bytes-like, "
                    f"got {type(user_data).__name__}"
                ) from None
            copy = ctypes.create_string_buffer(raw, max(len(raw), 1))
            data = ctypes.addressof(copy)
            owners = (fn, copy)
        p.fn = driver.CUhostFn(address)
        p.userData = data
        return p, owners
    if not callable(fn):
        raise TypeError(
            f"callback fn must be callable or a ctypes function pointer, got {type(fn).__name__}"
        )
    if user_data is not None:
        raise ValueError(
            "user_data is only for ctypes function pointers; bind data into the Python "
            "callable instead (functools.partial or a closure)"
        )
    p.fn = driver.CUhostFn(_TRAMPOLINE)
    p.userData = id(fn)  # borrowed by the trampoline; the bundle holds the reference
    return p, (fn,)


def stream_handle(stream: IsStreamT | driver.CUstream) -> driver.CUstream:
    """A CUstream from a cuforge Stream, a GraphBuilder, ``__cuda_stream__`` or CUstream."""
    if isinstance(stream, driver.CUstream):
        return stream
    handle = getattr(stream, "handle", None)
    if isinstance(handle, driver.CUstream):
        return handle
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        info = proto() if callable(proto) else proto
        return driver.CUstream(int(info[1]))
    raise TypeError(f"expected a stream, got {type(stream).__name__}")


def event_handle(event: Event | driver.CUevent) -> driver.CUevent:
    """A CUevent from a cuforge Event or a raw CUevent."""
    if isinstance(event, driver.CUevent):
        return event
    handle = getattr(event, "handle", None)
    if isinstance(handle, driver.CUevent):
        return handle
    raise TypeError(f"expected an Event, got {type(event).__name__}")
