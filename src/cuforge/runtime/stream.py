"""``Stream``: a CUDA stream, created here or wrapped from another library.

Guarantees:
- A stream cuforge created is destroyed by ``close()`` or when the object is collected
  (not during interpreter shutdown); a wrapped (foreign) stream is never destroyed by
  cuforge, and the foreign object is kept alive as long as the wrapper.
- ``Stream`` objects may be shared between threads: operations on them are single
  driver calls, and CUDA streams are thread safe.
- Anything exposing ``__cuda_stream__() -> (version, handle)`` (PyTorch, CuPy,
  cuda.core streams) is accepted wherever a stream is, and ``Stream`` exposes it too.
- Failure modes: driver failures -> CUDAError; using a closed stream -> ValueError;
  an object without ``__cuda_stream__`` -> TypeError.
"""

from __future__ import annotations

import sys

from cuforge.runtime import capture_guard
from cuforge.runtime.device import Device
from cuforge.runtime.errors import check, error_for
from cuforge.runtime.init import ensure_initialized

TYPE_CHECKING = False  # typing and dataclasses cost a cold process ~10 ms: not at run time
if TYPE_CHECKING:
    from dataclasses import dataclass
    from typing import Any

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver
    from cuforge._fields import dataclass  # dataclasses' frozen class, without its import


if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._typing import IsStreamT
    from cuforge.graph import GraphBuilder
    from cuforge.runtime.event import Event, EventOptions


_call1: Callable[[int, int], int] | None
try:
    from cuforge._native._launch import call1 as _call1
except ImportError:  # no C helpers built: the bindings are used
    _call1 = None
_sync_entry: int | None = None  # cuStreamSynchronize's address; 0: use the bindings


def _resolve_sync() -> int:
    global _sync_entry
    _sync_entry = capture_guard.entry(b"cuStreamSynchronize") if _call1 is not None else 0
    return _sync_entry


# Driver API values, written out so that importing this module loads no driver
# bindings; tests/test_runtime_nodriver.py checks them against cuda.bindings.
_LEGACY = 1  # CU_STREAM_LEGACY
_PER_THREAD = 2  # CU_STREAM_PER_THREAD
_NON_BLOCKING = 1  # CUstream_flags.CU_STREAM_NON_BLOCKING
_DEFAULT_FLAGS = 0  # CUstream_flags.CU_STREAM_DEFAULT


@dataclass(frozen=True)
class StreamOptions:
    """How to create a stream.

    ``nonblocking``: does not synchronise with the legacy default stream (default).
    ``priority``: lower numbers are higher priority; None is the device default.
    """

    nonblocking: bool = True
    priority: int | None = None


class Stream:
    """A CUDA stream; make one with ``Device.create_stream()``."""

    __slots__ = ("__weakref__", "_device", "_handle", "_handle_int", "_owned", "_owner")
    _device: Device | None
    _handle: driver.CUstream | None
    _handle_int: int
    _owned: bool
    _owner: object

    def __init__(self) -> None:
        raise TypeError(
            "use Device.create_stream() (or Stream.from_handle / Device.create_stream(obj) "
            "to wrap an existing stream)"
        )

    @classmethod
    def _new(cls, handle: int, device: Device | None, owned: bool, owner: object) -> Stream:
        self = object.__new__(cls)
        self._handle = driver.CUstream(handle)
        self._handle_int = handle
        self._device = device
        self._owned = owned
        self._owner = owner
        return self

    @classmethod
    def _create(cls, device: Device, options: StreamOptions | None) -> Stream:
        opts = options if options is not None else StreamOptions()
        if not isinstance(opts, StreamOptions):
            raise TypeError(f"options must be StreamOptions, not {type(opts).__name__}")
        flags = _NON_BLOCKING if opts.nonblocking else _DEFAULT_FLAGS
        with device._scope():
            if opts.priority is None:
                handle = check(driver.cuStreamCreate(flags), "cuStreamCreate")
            else:
                handle = check(
                    driver.cuStreamCreateWithPriority(flags, int(opts.priority)),
                    "cuStreamCreateWithPriority",
                )
        return cls._new(int(handle), device, True, None)

    @classmethod
    def _legacy_default(cls, device: Device) -> Stream:
        return cls._new(_LEGACY, device, False, None)

    @classmethod
    def legacy_default(cls, device: Device | None = None) -> Stream:
        """The legacy default stream (synchronises with blocking streams)."""
        return (device if device is not None else Device()).default_stream

    @classmethod
    def per_thread_default(cls, device: Device | None = None) -> Stream:
        """The calling thread's per-thread default stream."""
        return cls._new(_PER_THREAD, device if device is not None else Device(), False, None)

    @classmethod
    def from_handle(cls, handle: int, owner: object = None) -> Stream:
        """Wrap a raw ``CUstream`` (int); cuforge never destroys it; ``owner`` is kept alive."""
        ensure_initialized()
        return cls._new(int(handle), None, False, owner)

    @classmethod
    def from_foreign(cls, obj: IsStreamT) -> Stream:
        """Wrap anything with ``__cuda_stream__`` (returns ``obj`` itself if a Stream)."""
        if isinstance(obj, Stream):
            return obj
        proto = getattr(obj, "__cuda_stream__", None)
        if proto is None:
            raise TypeError(
                f"{type(obj).__name__} is not a stream: it has no __cuda_stream__ protocol"
            )
        info = proto() if callable(proto) else proto
        try:
            version, handle = info
        except (TypeError, ValueError):
            msg = f"__cuda_stream__ must return (version, handle), got {info!r}"
            raise TypeError(msg) from None
        if version != 0:
            raise TypeError(f"unsupported __cuda_stream__ version {version}")
        return cls.from_handle(int(handle), owner=obj)

    # --- properties -----------------------------------------------------------------
    @property
    def handle(self) -> driver.CUstream:
        if self._handle is None:
            raise ValueError("stream is closed")
        return self._handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, int(self.handle))

    @property
    def device(self) -> Device:
        dev = self._device
        if dev is None:
            cu_dev = check(driver.cuStreamGetDevice(self.handle), "cuStreamGetDevice")
            dev = self._device = Device(int(cu_dev))
        return dev

    @property
    def is_nonblocking(self) -> bool:
        flags = check(driver.cuStreamGetFlags(self.handle), "cuStreamGetFlags")
        return bool(int(flags) & _NON_BLOCKING)

    @property
    def priority(self) -> int:
        return int(check(driver.cuStreamGetPriority(self.handle), "cuStreamGetPriority"))

    @property
    def is_done(self) -> bool:
        """True when all work submitted so far has completed."""
        err = driver.cuStreamQuery(self.handle)[0]
        if err == driver.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuStreamQuery")
        return True

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else hex(self._handle_int)
        return f"<Stream {state}{'' if self._owned else ' (borrowed)'}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle_int == self._handle_int

    def __hash__(self) -> int:
        return hash(("cuforge.Stream", self._handle_int))

    def __reduce__(self) -> Any:
        raise TypeError("Stream objects cannot be pickled")

    # --- operations -----------------------------------------------------------------
    def sync(self) -> None:
        """Block until all work submitted to this stream so far has completed."""
        if self._handle is None:
            raise ValueError("stream is closed")
        entry = _sync_entry if _sync_entry is not None else _resolve_sync()
        if entry and _call1 is not None:  # a non-zero entry implies the C helper
            err = _call1(entry, self._handle_int)
        else:
            err = int(driver.cuStreamSynchronize(self._handle_int)[0])
        if err:
            raise error_for(driver.CUresult(err), "cuStreamSynchronize")

    def record(self, event: Event | None = None, options: EventOptions | None = None) -> Event:
        """Record ``event`` (a new one made with ``options`` when None) here; return it."""
        if event is None:
            event = self.device.create_event(options)
        check(driver.cuEventRecord(event.handle, self.handle), "cuEventRecord")
        return event

    def wait(self, event_or_stream: Event | IsStreamT) -> None:
        """Make later work on this stream wait for an event, or for another stream's
        work submitted so far (any ``__cuda_stream__`` object)."""
        from cuforge.runtime.event import Event, EventOptions

        if isinstance(event_or_stream, Event):
            check(driver.cuStreamWaitEvent(self.handle, event_or_stream.handle, 0), "wait")
            return
        other = Stream.from_foreign(event_or_stream)
        if other._handle_int == self._handle_int:
            return
        event = other.record(options=EventOptions(enable_timing=False))
        check(driver.cuStreamWaitEvent(self.handle, event.handle, 0), "cuStreamWaitEvent")
        event.close()

    def close(self) -> None:
        """Destroy a stream cuforge created (pending work still completes); forget a
        borrowed one. Idempotent; a no-op on the legacy/per-thread default streams,
        which are shared and never go away."""
        if not self._owned and self._handle_int in (_LEGACY, _PER_THREAD):
            return
        handle, self._handle = self._handle, None
        self._owner = None
        if handle is not None and self._owned:
            # Queued while a capture forbids it (see capture_guard).
            err = capture_guard.destroy(b"cuStreamDestroy", self._handle_int)
            if err > 0:
                raise error_for(driver.CUresult(err), "cuStreamDestroy")

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is None or not self._owned or sys.is_finalizing():
            return
        try:  # a finaliser must never raise (no contextlib: ~1 ms of import)  # noqa: SIM105
            self.close()
        except Exception:
            pass

    def create_graph_builder(self) -> GraphBuilder:
        """A ``cuforge.graph.GraphBuilder`` that captures work on this stream."""
        from cuforge.graph import GraphBuilder

        return GraphBuilder(self)
