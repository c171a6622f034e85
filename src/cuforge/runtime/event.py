"""``Event``: a CUDA event for ordering and timing.

Guarantees: ``e2 - e1`` is the elapsed time in milliseconds between two completed,
timing-enabled events; ``is_done`` never blocks; events are destroyed by ``close()`` or
collection (not during interpreter shutdown) and may be shared between threads.
Failure modes: timing a non-timing event -> ValueError; timing an event whose work
has not completed -> CUDAError(CUDA_ERROR_NOT_READY); a closed event -> ValueError.
"""

from __future__ import annotations

import sys

from cuforge.runtime import capture_guard
from cuforge.runtime.device import Device
from cuforge.runtime.errors import check, error_for

TYPE_CHECKING = False  # typing and dataclasses cost a cold process ~10 ms: not at run time
if TYPE_CHECKING:
    from dataclasses import dataclass
    from typing import Any

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver
    from cuforge._fields import dataclass  # dataclasses' frozen class, without its import

# Driver API values, written out so that importing this module loads no driver
# bindings; tests/test_runtime_nodriver.py checks them against cuda.bindings.
_DISABLE_TIMING = 2  # CUevent_flags.CU_EVENT_DISABLE_TIMING
_BLOCKING_SYNC = 1  # CUevent_flags.CU_EVENT_BLOCKING_SYNC
_NOT_READY = 600  # CUresult.CUDA_ERROR_NOT_READY (CUresult compares as an int)


@dataclass(frozen=True)
class EventOptions:
    """How to create an event.

    ``enable_timing``: the event records a timestamp (needed for subtraction).
    ``busy_waited_sync``: ``sync()`` spins instead of yielding the CPU thread.
    """

    enable_timing: bool = False
    busy_waited_sync: bool = False


class Event:
    """A CUDA event; make one with ``Device.create_event()`` or ``Stream.record()``."""

    __slots__ = ("__weakref__", "_device", "_handle", "_timing")
    _device: Device
    _handle: driver.CUevent | None
    _timing: bool

    def __init__(self) -> None:
        raise TypeError("use Device.create_event() or Stream.record()")

    @classmethod
    def _create(cls, device: Device, options: EventOptions | None) -> Event:
        opts = options if options is not None else EventOptions()
        if not isinstance(opts, EventOptions):
            raise TypeError(f"options must be EventOptions, not {type(opts).__name__}")
        flags = 0 if opts.enable_timing else _DISABLE_TIMING
        if not opts.busy_waited_sync:
            flags |= _BLOCKING_SYNC
        with device._scope():
            handle = check(driver.cuEventCreate(flags), "cuEventCreate")
        self = object.__new__(cls)
        self._handle = handle
        self._device = device
        self._timing = bool(opts.enable_timing)
        return self

    @property
    def handle(self) -> driver.CUevent:
        if self._handle is None:
            raise ValueError("event is closed")
        return self._handle

    @property
    def device(self) -> Device:
        return self._device

    @property
    def is_timing_disabled(self) -> bool:
        return not self._timing

    @property
    def is_done(self) -> bool:
        """True once the work captured by the last record has completed (or never recorded)."""
        err = driver.cuEventQuery(self.handle)[0]
        if err == _NOT_READY:
            return False
        check((err,), "cuEventQuery")
        return True

    def sync(self) -> None:
        """Block until the work captured by the last record has completed."""
        check(driver.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def __sub__(self, other: Event) -> float:
        """Milliseconds from ``other`` to ``self`` (both recorded, completed, timing)."""
        if not isinstance(other, Event):
            return NotImplemented
        if not (self._timing and other._timing):
            raise ValueError(
                "elapsed time needs timing events: create both with "
                "EventOptions(enable_timing=True)"
            )
        ms = check(
            driver.cuEventElapsedTime(other.handle, self.handle),
            "elapsed time between events (both must be recorded and completed)",
        )
        return float(ms)

    def close(self) -> None:
        """Destroy the event (idempotent)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            # Queued while a capture forbids it (see capture_guard).
            err = capture_guard.destroy(b"cuEventDestroy", int(handle))
            if err > 0:
                raise error_for(driver.CUresult(err), "cuEventDestroy")

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is None or sys.is_finalizing():
            return
        try:  # a finaliser must never raise (no contextlib: ~1 ms of import)  # noqa: SIM105
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else hex(int(self._handle))
        return f"<Event {state}{' timing' if self._timing else ''}>"

    def __reduce__(self) -> Any:
        raise TypeError("Event objects cannot be pickled")
