"""``Buffer`` and memory resources, with memory owned by a separate allocation object.

Ownership: a :class:`Buffer` is a claim on an :class:`Allocation`; the allocation owns
the memory. ``Buffer.close()`` drops the buffer's claim only. The memory is freed when
the last Python reference to the allocation goes -- so the graph layer (or anything
else) can keep memory valid after the user closed the Buffer by holding
``buffer.allocation``. Pool memory is freed stream-ordered on the stream given to
``close(stream=)`` (else the stream it was allocated on); if that stream was closed in
the meantime, the device is synchronised first. During interpreter shutdown nothing is
freed (the process exit reclaims it), so finalisers never call into a dying driver.

Failure modes: using a closed Buffer -> ValueError; driver failures (out of memory,
...) -> CUDAError; bad sizes/arguments -> ValueError/TypeError. Double close is a no-op.
Thread safety: buffers and resources may be shared between threads; close() from two
threads at once frees exactly once (the allocation, not the Buffer, frees).
"""

from __future__ import annotations

import abc
import sys
import weakref

from cuforge.runtime import capture_guard
from cuforge.runtime.device import Device
from cuforge.runtime.errors import check, error_for
from cuforge.runtime.stream import Stream

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver


if TYPE_CHECKING:
    from collections.abc import Iterable

    from cuforge._typing import IsStreamT


def _as_stream(stream: IsStreamT | None, device: Device | None) -> Stream:
    if stream is None:
        return (device if device is not None else Device()).default_stream
    return Stream.from_foreign(stream)


class Allocation:
    """Owns one block of memory; frees it through its resource when collected.

    ``ptr``/``size`` describe the block; ``owner`` is an object kept alive with it
    (foreign memory). Not created by users: resources make them.
    """

    __slots__ = ("__weakref__", "_free_stream", "device_id", "mr", "owner", "ptr", "size")

    def __init__(
        self,
        ptr: int,
        size: int,
        mr: MemoryResource | None,
        stream: Stream | None = None,
        owner: object = None,
        device_id: int | None = None,
    ) -> None:
        self.ptr = ptr
        self.size = size
        self.mr = mr
        self.owner = owner
        self.device_id = device_id
        self._free_stream = stream

    def set_free_stream(self, stream: Stream | None) -> None:
        """Order the eventual free on ``stream`` (kept alive until then)."""
        if stream is not None:
            self._free_stream = stream

    def __del__(self) -> None:
        # Interpreter shutdown: leak rather than call into a driver being torn down.
        if sys.is_finalizing() or self.mr is None or not self.ptr:
            return
        # Never during a capture that forbids it (queued until the capture ends).
        capture_guard.release(_free, self.mr, self.ptr, self.size, self._free_stream)

    def __repr__(self) -> str:
        return f"<Allocation {self.ptr:#x} size={self.size}>"


def _free(mr: MemoryResource, ptr: int, size: int, stream: Stream | None) -> None:
    try:
        mr.deallocate(ptr, size, stream)
    except Exception as exc:  # a finaliser must not raise; report like CPython does
        sys.unraisablehook(_Unraisable(exc, f"<Allocation {ptr:#x} size={size}>"))


def _copy(dst: int, src: int, size: int, stream: Stream) -> None:
    err = driver.cuMemcpyAsync(dst, src, size, stream.handle)[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        hint = peer_access_hint(stream.device.device_id, (src, dst))
        raise error_for(err, f"copy of {size} bytes" + (f" ({hint})" if hint else ""))


class _Unraisable:
    def __init__(self, exc: BaseException, obj: object) -> None:
        self.exc_type = type(exc)
        self.exc_value: BaseException | None = exc
        self.exc_traceback = exc.__traceback__
        self.err_msg: str | None = "cuforge: failed to free an allocation"
        self.object = obj


class WeakHandle:
    """Observe an allocation without keeping it alive (for tests)."""

    __slots__ = ("_ref",)

    def __init__(self, allocation: Allocation) -> None:
        self._ref = weakref.ref(allocation)

    @property
    def alive(self) -> bool:
        return self._ref() is not None


def weak_handle(obj: Buffer | Allocation) -> WeakHandle:
    """A test-only observer: ``weak_handle(buf).alive`` is False once memory is freed."""
    alloc = obj.allocation if isinstance(obj, Buffer) else obj
    if not isinstance(alloc, Allocation):
        raise TypeError(f"expected a Buffer or Allocation, got {type(obj).__name__}")
    return WeakHandle(alloc)


class MemoryResource(abc.ABC):
    """Where Buffers come from. Subclasses allocate and deallocate raw memory."""

    @abc.abstractmethod
    def allocate(self, size: int, stream: IsStreamT | None = None) -> Buffer:
        """Return a Buffer of ``size`` bytes, ordered on ``stream`` where meaningful."""

    @abc.abstractmethod
    def deallocate(self, ptr: int, size: int, stream: IsStreamT | None = None) -> None:
        """Free ``ptr`` (called once, by its allocation's finaliser)."""

    @property
    @abc.abstractmethod
    def is_device_accessible(self) -> bool: ...

    @property
    @abc.abstractmethod
    def is_host_accessible(self) -> bool: ...

    @property
    @abc.abstractmethod
    def device_id(self) -> int: ...


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, not {type(size).__name__}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    return size


class DeviceMemoryResource(MemoryResource):
    """Stream-ordered device memory from the device's current memory pool
    (cuMemAllocFromPoolAsync / cuMemFreeAsync)."""

    def __init__(self, device: Device | int | None = None) -> None:
        self._device = device if isinstance(device, Device) else Device(device)
        self._pool = check(driver.cuDeviceGetMemPool(self._device._cu_device), "cuDeviceGetMemPool")

    def allocate(self, size: int, stream: IsStreamT | None = None) -> Buffer:
        """``size`` bytes of the device's pool, ordered on ``stream``. RuntimeError on a
        capturing stream: the allocation would become graph memory, which lives only
        while the graph runs, not a Buffer's memory."""
        _check_size(size)
        s = _as_stream(stream, self._device)
        if capture_guard.stream_capturing(s._handle_int):
            raise RuntimeError(
                "cannot allocate from the device memory pool on a capturing stream: "
                "allocate before begin_building(), or add graph memory with "
                "GraphDefinition.allocate()"
            )
        ptr = 0
        if size:
            with self._device._scope():
                ptr = int(
                    check(
                        driver.cuMemAllocFromPoolAsync(size, self._pool, s.handle),
                        f"allocate {size} bytes on device {self._device.device_id}",
                    )
                )
        return Buffer._wrap(Allocation(ptr, size, self, s, device_id=self._device.device_id))

    def deallocate(self, ptr: int, size: int, stream: IsStreamT | None = None) -> None:
        """Free ``ptr`` ordered on ``stream``; queued (see ``capture_guard``) while that
        stream is capturing, or while a capture forbids the synchronisation a closed
        ``stream`` needs."""
        s = _as_stream(stream, self._device)
        with self._device._scope():
            if s._handle is None:  # the free stream was closed: order after everything
                if capture_guard.any_active():  # a context sync is invalid during capture
                    capture_guard.defer(self.deallocate, ptr, size, stream)
                    return
                check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
                s = self._device.default_stream
            err = capture_guard.free_on_stream(b"cuMemFreeAsync", ptr, s._handle_int)
        if err == capture_guard.DEFERRED:  # recorded into that capture otherwise
            capture_guard.defer(self.deallocate, ptr, size, s)
        elif err:
            raise error_for(driver.CUresult(err), "cuMemFreeAsync")

    @property
    def is_device_accessible(self) -> bool:
        return True

    @property
    def is_host_accessible(self) -> bool:
        return False

    @property
    def device_id(self) -> int:
        return self._device.device_id

    @property
    def device(self) -> Device:
        return self._device

    @property
    def peer_accessible_by(self) -> tuple[int, ...]:
        """Ordinals of the other devices whose kernels and copies may access memory of
        this pool (``cuMemPoolGetAccess``), sorted.

        Set it to a sequence of Devices or ordinals (``cuMemPoolSetAccess``): devices
        added get read-write access, devices left out lose it; every allocation of the
        pool, past and future, follows. The pool is the device's current one, shared
        by every DeviceMemoryResource of the device. ValueError for this device itself
        or one that cannot access it (``Device.can_access_peer``).
        """
        from cuforge.runtime.init import device_count

        own = self._device.device_id
        out = []
        for i in range(device_count()):
            if i == own:
                continue
            flags = check(driver.cuMemPoolGetAccess(self._pool, _location(i)), "cuMemPoolGetAccess")
            if flags != driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE:
                out.append(i)
        return tuple(out)

    @peer_accessible_by.setter
    def peer_accessible_by(self, devices: Iterable[Device | int]) -> None:
        own = self._device.device_id
        want = set()
        for d in devices:
            i = d.device_id if isinstance(d, Device) else d
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"peer_accessible_by takes Devices or ordinals, got {d!r}")
            if i == own:
                raise ValueError(f"device {own} always accesses its own pool; list other devices")
            if not Device(i).can_access_peer(own):
                raise ValueError(
                    f"device {i} cannot access device {own}'s memory (cuDeviceCanAccessPeer is 0)"
                )
            want.add(i)
        have = set(self.peer_accessible_by)
        descs = []
        access = driver.CUmemAccess_flags
        changes = [(i, access.CU_MEM_ACCESS_FLAGS_PROT_READWRITE) for i in sorted(want - have)]
        changes += [(i, access.CU_MEM_ACCESS_FLAGS_PROT_NONE) for i in sorted(have - want)]
        for i, flags in changes:
            desc = driver.CUmemAccessDesc()
            desc.location = _location(i)
            desc.flags = flags
            descs.append(desc)
        if descs:
            with self._device._scope():
                check(
                    driver.cuMemPoolSetAccess(self._pool, descs, len(descs)), "cuMemPoolSetAccess"
                )


class PinnedMemoryResource(MemoryResource):
    """Page-locked host memory (cuMemHostAlloc), usable by every device (UVA).

    Frees are synchronous; a free with a stream first waits for that stream.
    """

    def __init__(self, device: Device | int | None = None) -> None:
        self._device = device if isinstance(device, Device) else Device(device)

    def allocate(self, size: int, stream: IsStreamT | None = None) -> Buffer:
        _check_size(size)
        ptr = 0
        if size:
            flags = int(driver.CU_MEMHOSTALLOC_PORTABLE)
            with self._device._scope():
                ptr = int(check(driver.cuMemHostAlloc(size, flags), f"pin {size} bytes"))
        s = Stream.from_foreign(stream) if stream is not None else None
        return Buffer._wrap(Allocation(ptr, size, self, s, device_id=self._device.device_id))

    def deallocate(self, ptr: int, size: int, stream: IsStreamT | None = None) -> None:
        """Free ``ptr`` after ``stream``'s work; queued (see ``capture_guard``) while
        that stream is capturing."""
        if stream is not None:
            s = Stream.from_foreign(stream)
            if s._handle is not None:
                if capture_guard.stream_capturing(s._handle_int):
                    capture_guard.defer(self.deallocate, ptr, size, stream)
                    return
                # The host memory may still be read by queued copies.
                err = capture_guard.call(b"cuStreamSynchronize", s._handle_int)
                if err:
                    raise error_for(driver.CUresult(err), "cuStreamSynchronize")
        with self._device._scope():
            err = capture_guard.call(b"cuMemFreeHost", ptr)
        if err:
            raise error_for(driver.CUresult(err), "cuMemFreeHost")

    @property
    def is_device_accessible(self) -> bool:
        return True

    @property
    def is_host_accessible(self) -> bool:
        return True

    @property
    def device_id(self) -> int:
        return self._device.device_id


class Buffer:
    """A claim on device or host memory; see the module docstring for ownership."""

    __slots__ = ("__weakref__", "_alloc", "_ptr", "_size")
    _alloc: Allocation | None
    _ptr: int
    _size: int

    def __init__(self) -> None:
        raise TypeError("use a MemoryResource, Device.allocate() or Buffer.from_handle()")

    @classmethod
    def _wrap(cls, alloc: Allocation) -> Buffer:
        self = object.__new__(cls)
        self._alloc = alloc
        self._ptr = alloc.ptr
        self._size = alloc.size
        return self

    @classmethod
    def from_handle(
        cls, ptr: int, size: int, mr: MemoryResource | None = None, owner: object = None
    ) -> Buffer:
        """Wrap memory cuforge did not allocate. ``owner`` is kept alive as long as the
        memory is claimed; with ``mr`` the memory is freed through ``mr.deallocate``,
        without it never."""
        _check_size(size)
        if mr is not None and not isinstance(mr, MemoryResource):
            raise TypeError(f"mr must be a MemoryResource, not {type(mr).__name__}")
        dev_id = mr.device_id if mr is not None else None
        return cls._wrap(Allocation(int(ptr), size, mr, None, owner=owner, device_id=dev_id))

    def _live(self) -> Allocation:
        alloc = self._alloc
        if alloc is None:
            raise ValueError("Buffer is closed")
        return alloc

    @property
    def handle(self) -> int:
        """The pointer (device or pinned host), as an int."""
        if self._alloc is None:
            raise ValueError("Buffer is closed")
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def allocation(self) -> Allocation:
        """The object owning the memory; hold it to keep the memory valid."""
        return self._live()

    @property
    def is_closed(self) -> bool:
        return self._alloc is None

    @property
    def memory_resource(self) -> MemoryResource | None:
        return self._live().mr

    @property
    def device_id(self) -> int:
        alloc = self._live()
        if alloc.device_id is None:
            alloc.device_id = _pointer_device(alloc.ptr)
        return alloc.device_id

    @property
    def device(self) -> Device:
        return Device(self.device_id)

    @property
    def is_device_accessible(self) -> bool:
        mr = self._live().mr
        return True if mr is None else mr.is_device_accessible

    @property
    def is_host_accessible(self) -> bool:
        mr = self._live().mr
        return False if mr is None else mr.is_host_accessible

    def close(self, stream: IsStreamT | None = None) -> None:
        """Drop this Buffer's claim; the memory goes (ordered on ``stream``) once nothing
        else holds the allocation. Idempotent."""
        alloc, self._alloc = self._alloc, None
        if alloc is not None and stream is not None:
            alloc.set_free_stream(Stream.from_foreign(stream))

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._alloc is None:
            return "<Buffer closed>"
        return f"<Buffer {self._ptr:#x} size={self._size}>"

    def __reduce__(self) -> Any:
        raise TypeError("Buffer objects cannot be pickled")

    # --- data movement --------------------------------------------------------------
    def copy_to(self, dst: Buffer | None = None, *, stream: IsStreamT) -> Buffer:
        """Copy all bytes into ``dst`` (a new buffer from the same resource when None)."""
        alloc = self._live()
        s = Stream.from_foreign(stream)
        if dst is None:
            if alloc.mr is None:
                raise ValueError("a foreign Buffer has no resource to allocate dst from")
            dst = alloc.mr.allocate(self._size, s)
        if dst.size != self._size:
            raise ValueError(f"size mismatch: {self._size} bytes into {dst.size}")
        if self._size:
            _copy(dst.handle, self._ptr, self._size, s)
        return dst

    def copy_from(self, src: Buffer, *, stream: IsStreamT) -> None:
        """Copy all of ``src`` (same size) into this buffer."""
        self._live()
        if src.size != self._size:
            raise ValueError(f"size mismatch: {src.size} bytes into {self._size}")
        s = Stream.from_foreign(stream)
        if self._size:
            _copy(self._ptr, src.handle, self._size, s)

    def fill(self, value: int, *, stream: IsStreamT, width: int = 1) -> None:
        """Set every ``width``-byte element (1, 2 or 4) to ``value``."""
        self._live()
        if width not in (1, 2, 4):
            raise ValueError(f"width must be 1, 2 or 4, got {width}")
        if self._size % width:
            raise ValueError(f"size {self._size} is not a multiple of width {width}")
        if not 0 <= value < (1 << (8 * width)):
            raise ValueError(f"value {value} does not fit in {width} byte(s)")
        h = Stream.from_foreign(stream).handle
        n = self._size // width
        fn = {1: driver.cuMemsetD8Async, 2: driver.cuMemsetD16Async, 4: driver.cuMemsetD32Async}
        check(fn[width](self._ptr, value, n, h), "fill")

    # --- interop --------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self.is_device_accessible:
            raise AttributeError("host-only memory has no __cuda_array_interface__")
        return {
            "shape": (self._size,),
            "typestr": "|u1",
            "data": (self.handle, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        from cuforge.runtime.interop import dlpack_device

        return dlpack_device(self)

    def __dlpack__(self, *, stream: object = None, **kwargs: Any) -> Any:
        """A 1-D uint8 DLPack capsule; the consumer keeps the allocation alive. The
        caller orders access (no stream synchronisation is inserted)."""
        from cuforge.runtime.interop import to_dlpack

        return to_dlpack(self, **kwargs)


def _location(device_id: int) -> driver.CUmemLocation:
    loc = driver.CUmemLocation()
    loc.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = device_id
    return loc


def peer_access_hint(device_id: int, pointers: Iterable[int]) -> str:
    """What to call so that work on ``device_id`` may use ``pointers`` (device
    addresses, possibly of other devices); "" when nothing is missing that cuforge
    can tell. Used to explain a refused copy between devices."""
    hints = []
    for ptr in pointers:
        try:
            owner = _pointer_device(ptr)
        except Exception:  # host or unknown memory: nothing to say
            continue
        if owner == device_id:
            continue
        if not Device(device_id).can_access_peer(owner):
            hints.append(
                f"device {device_id} cannot access device {owner}'s memory at all "
                "(cuDeviceCanAccessPeer is 0): copy through host memory"
            )
            continue
        attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
        err, pool = driver.cuPointerGetAttribute(attr, ptr)
        if err == driver.CUresult.CUDA_SUCCESS and int(pool):
            mr = Device(owner).memory_resource
            if isinstance(mr, DeviceMemoryResource) and device_id in mr.peer_accessible_by:
                continue
            hints.append(
                f"{ptr:#x} is pool memory of device {owner}: grant device {device_id} access "
                f"with Device({owner}).memory_resource.peer_accessible_by = [{device_id}] "
                "(keeping any device already listed)"
            )
        else:
            hints.append(
                f"{ptr:#x} is memory of device {owner}: call "
                f"Device({device_id}).enable_peer_access({owner})"
            )
    return "; ".join(hints)


def _pointer_device(ptr: int) -> int:
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(driver.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute"))
