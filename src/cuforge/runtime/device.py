"""``Device``: one CUDA device, its primary context, and the factories hanging off it.

Guarantees:
- ``Device(i)`` is one shared object per ordinal (``Device(0) is Device(0)``), safe to
  use from any thread; ``Device()`` is the device current on *this* thread (device 0
  when the thread has no current context), as in cuda.core.
- The current device is per thread (CUDA's current context is per thread):
  ``set_current()`` affects only the calling thread.
- Methods that create resources (streams, events, memory) always act on *this* device:
  on a thread with no current context they make this device current; on a thread where
  another context is current they push this device's primary context for the call.
- Failure modes: no driver or no device -> CUDAError; an ordinal that does not exist
  -> CUDAError(CUDA_ERROR_INVALID_DEVICE); a non-int ordinal -> TypeError.
"""

from __future__ import annotations

import collections
import threading

from cuforge.runtime.errors import CUDAError, check
from cuforge.runtime.init import ensure_initialized

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any, NamedTuple

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver


if TYPE_CHECKING:
    from cuforge.graph import GraphBuilder
    from cuforge.runtime.event import Event, EventOptions
    from cuforge.runtime.memory import Buffer, MemoryResource
    from cuforge.runtime.stream import Stream, StreamOptions


if TYPE_CHECKING:

    class ComputeCapability(NamedTuple):
        major: int
        minor: int

else:  # the same named tuple, without importing typing (~5 ms of a cold process)
    ComputeCapability = collections.namedtuple("ComputeCapability", ["major", "minor"])


class DeviceProperties:
    """Device attributes, read lazily from the driver and cached.

    Any ``CU_DEVICE_ATTRIBUTE_<NAME>`` is available as ``properties.<name>`` (lower
    case), e.g. ``multiprocessor_count``, ``max_threads_per_block``,
    ``max_shared_memory_per_block_optin``. Unknown names raise AttributeError.
    """

    def __init__(self, device: Device) -> None:
        self._device = device
        self._cache: dict[str, int] = {}

    def __getattr__(self, name: str) -> int:
        if name.startswith("_"):
            raise AttributeError(name)
        cache: dict[str, int] = self.__dict__["_cache"]
        value = cache.get(name)
        if value is None:
            attr = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name.upper()}", None)
            if attr is None:
                raise AttributeError(f"no device attribute named {name!r}")
            value = int(
                check(driver.cuDeviceGetAttribute(attr, self._device._cu_device), f"read {name}")
            )
            cache[name] = value
        return value

    def __dir__(self) -> list[str]:
        prefix = "CU_DEVICE_ATTRIBUTE_"
        return sorted(
            n[len(prefix) :].lower() for n in dir(driver.CUdevice_attribute) if n.startswith(prefix)
        )


class ContextScope:
    """Make a device's primary context current for a block, restoring afterwards."""

    __slots__ = ("_ctx", "_pushed")

    def __init__(self, ctx: driver.CUcontext) -> None:
        self._ctx = ctx
        self._pushed = False

    def __enter__(self) -> None:
        cur = check(driver.cuCtxGetCurrent())
        if int(cur) == int(self._ctx):
            return
        if int(cur) == 0:
            # A thread with no context adopts this device, like an implicit set_current().
            check(driver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
            return
        check(driver.cuCtxPushCurrent(self._ctx), "cuCtxPushCurrent")
        self._pushed = True

    def __exit__(self, *exc: object) -> None:
        if self._pushed:
            self._pushed = False
            check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")


# CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, written out (no driver import at
# import time; tests/test_runtime_nodriver.py checks it). CUresult compares as an int.
_ALREADY_ENABLED = 704


def _as_device(obj: Device | int) -> Device:
    if isinstance(obj, Device):
        return obj
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise TypeError(f"expected a Device or a device ordinal, got {type(obj).__name__}")
    return Device(obj)


_instances: dict[int, Device] = {}
_instances_lock = threading.Lock()


def primary_context_device(ctx: int) -> int | None:
    """The ordinal of the device whose primary context (one this process holds
    through a Device) has handle value ``ctx``; None when no Device holds it.
    No driver call: graph code maps a context to its device with it."""
    for dev in tuple(_instances.values()):
        primary = dev._ctx
        if primary is not None and int(primary) == ctx:
            return dev._id
    return None


def _current_device_id() -> int:
    ctx = check(driver.cuCtxGetCurrent())
    if int(ctx) == 0:
        return 0
    return int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))


class Device:
    """A CUDA device (see the module docstring for the guarantees)."""

    __slots__ = (
        "__weakref__",
        "_ctx",
        "_cu_device",
        "_default_stream",
        "_id",
        "_lock",
        "_mr",
        "_props",
    )
    _ctx: driver.CUcontext | None
    _cu_device: driver.CUdevice
    _default_stream: Stream | None
    _id: int
    _lock: threading.Lock
    _mr: MemoryResource | None
    _props: DeviceProperties | None

    def __new__(cls, device_id: int | None = None) -> Device:
        ensure_initialized()
        if device_id is None:
            device_id = _current_device_id()
        elif isinstance(device_id, bool) or not isinstance(device_id, int):
            raise TypeError(f"device_id must be an int or None, not {type(device_id).__name__}")
        dev = _instances.get(device_id)
        if dev is not None:
            return dev
        with _instances_lock:
            dev = _instances.get(device_id)
            if dev is None:
                count = int(check(driver.cuDeviceGetCount()))
                if not 0 <= device_id < count:
                    raise CUDAError(
                        f"invalid device id {device_id}: this machine has {count} CUDA "
                        f"device(s), valid ids are 0..{count - 1}",
                        driver.CUresult.CUDA_ERROR_INVALID_DEVICE,
                    )
                dev = object.__new__(cls)
                dev._id = device_id
                dev._cu_device = check(driver.cuDeviceGet(device_id), "cuDeviceGet")
                dev._ctx = None
                dev._lock = threading.Lock()
                dev._mr = None
                dev._props = None
                dev._default_stream = None
                _instances[device_id] = dev
        return dev

    # --- identity -------------------------------------------------------------------
    @property
    def device_id(self) -> int:
        return self._id

    def __repr__(self) -> str:
        return f"<Device {self._id} ({self.name})>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._id == self._id

    def __hash__(self) -> int:
        return hash(("cuforge.Device", self._id))

    def __reduce__(self) -> Any:
        raise TypeError("Device objects cannot be pickled")

    @property
    def name(self) -> str:
        raw: bytes = check(driver.cuDeviceGetName(256, self._cu_device), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode()

    @property
    def uuid(self) -> str:
        """The device UUID as ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
        raw = check(driver.cuDeviceGetUuid(self._cu_device), "cuDeviceGetUuid").bytes
        h = (raw.encode("latin-1") if isinstance(raw, str) else bytes(raw)).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    @property
    def compute_capability(self) -> ComputeCapability:
        p = self.properties
        return ComputeCapability(p.compute_capability_major, p.compute_capability_minor)

    @property
    def arch(self) -> str:
        """``"90"`` for sm_90: the compute capability digits, as NVRTC's -arch uses them."""
        major, minor = self.compute_capability
        return f"{major}{minor}"

    @property
    def properties(self) -> DeviceProperties:
        props = self._props
        if props is None:
            props = self._props = DeviceProperties(self)
        return props

    # --- context --------------------------------------------------------------------
    @property
    def context(self) -> driver.CUcontext:
        """This device's primary context (retained once, held for the process)."""
        ctx = self._ctx
        if ctx is None:
            with self._lock:
                ctx = self._ctx
                if ctx is None:
                    ctx = check(
                        driver.cuDevicePrimaryCtxRetain(self._cu_device), "cuDevicePrimaryCtxRetain"
                    )
                    self._ctx = ctx
        return ctx

    def set_current(self) -> None:
        """Make this device's primary context current on the calling thread."""
        check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def _scope(self) -> ContextScope:
        return ContextScope(self.context)

    def sync(self) -> None:
        """Block until all work on this device's primary context has finished."""
        with self._scope():
            check(driver.cuCtxSynchronize(), "cuCtxSynchronize")

    # --- factories ------------------------------------------------------------------
    @property
    def default_stream(self) -> Stream:
        """The legacy default stream of this device."""
        s = self._default_stream
        if s is None:
            from cuforge.runtime.stream import Stream

            s = self._default_stream = Stream._legacy_default(self)
        return s

    def create_stream(self, obj: Any = None, options: StreamOptions | None = None) -> Stream:
        """A new stream on this device, or a wrapper of ``obj``'s ``__cuda_stream__``."""
        from cuforge.runtime.stream import Stream

        if obj is not None:
            if options is not None:
                raise ValueError("options apply to new streams, not to a wrapped one")
            return Stream.from_foreign(obj)
        return Stream._create(self, options)

    def create_event(self, options: EventOptions | None = None) -> Event:
        """A new (unrecorded) event on this device."""
        from cuforge.runtime.event import Event

        return Event._create(self, options)

    @property
    def memory_resource(self) -> MemoryResource:
        """The resource ``allocate`` uses; a DeviceMemoryResource on the device's pool."""
        mr = self._mr
        if mr is None:
            from cuforge.runtime.memory import DeviceMemoryResource

            with self._lock:
                if self._mr is None:
                    self._mr = DeviceMemoryResource(self)
                mr = self._mr
        return mr

    @memory_resource.setter
    def memory_resource(self, mr: MemoryResource) -> None:
        from cuforge.runtime.memory import MemoryResource

        if not isinstance(mr, MemoryResource):
            raise TypeError(f"expected a MemoryResource, got {type(mr).__name__}")
        self._mr = mr

    def allocate(self, size: int, stream: Stream | None = None) -> Buffer:
        """``size`` bytes from ``memory_resource``, ordered on ``stream`` (default: legacy)."""
        return self.memory_resource.allocate(size, stream)

    # --- peer access ----------------------------------------------------------------
    def can_access_peer(self, peer: Device | int) -> bool:
        """Whether work running on this device can read and write memory that lives
        on ``peer`` (``cuDeviceCanAccessPeer``); a device can always access its own.

        Capability only: access must still be granted -- for pool memory
        (``Device.allocate``) by the pool, ``Device(peer).memory_resource.peer_accessible_by``;
        for other device memory by ``enable_peer_access``.
        """
        other = _as_device(peer)
        if other._id == self._id:
            return True
        res = driver.cuDeviceCanAccessPeer(self._cu_device, other._cu_device)
        return bool(check(res, "cuDeviceCanAccessPeer"))

    def enable_peer_access(self, peer: Device | int) -> None:
        """Let kernels and copies running on this device access ``peer``'s memory from
        plain allocations (``cuCtxEnablePeerAccess``; memory of other libraries, e.g.
        ``cudaMalloc``). Pool memory -- what ``Device.allocate`` returns -- is granted
        by its pool instead: ``Device(peer).memory_resource.peer_accessible_by``.
        Idempotent; ValueError when ``can_access_peer(peer)`` is False."""
        other = _as_device(peer)
        if other._id == self._id:
            return
        if not self.can_access_peer(other):
            raise ValueError(
                f"device {self._id} cannot access device {other._id}'s memory "
                "(cuDeviceCanAccessPeer is 0): copy through host memory instead"
            )
        with self._scope():
            err = driver.cuCtxEnablePeerAccess(other.context, 0)[0]
        if err not in (driver.CUresult.CUDA_SUCCESS, _ALREADY_ENABLED):
            check((err,), f"enable access from device {self._id} to device {other._id}")

    def create_graph_builder(self) -> GraphBuilder:
        """A ``cuforge.graph.GraphBuilder`` capturing on a new stream of this device.

        The builder holds the new Stream, so the stream lives as long as the builder.
        """
        return self.create_stream().create_graph_builder()
