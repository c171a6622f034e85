"""Deferred release: freeing or destroying anything never breaks a stream capture.

CUDA forbids "potentially unsafe" calls (synchronous frees, graph, executable-graph
and library destruction, context synchronisation, ...) while a stream capture binds
the calling thread, and such a call *invalidates* that capture. Python releases
objects whenever their last reference goes or the garbage collector runs, so every
release cuforge makes (Buffer memory, graphs, executable graphs, events, streams,
loaded libraries) goes through this module:

- **Captures cuforge began** (``GraphBuilder.begin_building``) are tracked with their
  mode and thread. While one of them forbids unsafe calls on the releasing thread --
  a *global* capture on any thread, or a *global* or *thread_local* one on this
  thread (CUDA's rules, with this thread in the default global interaction mode) --
  the release is queued instead of run. *Relaxed* captures forbid nothing.
- **A stream-ordered free on a capturing stream** (a pool Buffer whose free stream
  is being captured, by cuforge or anyone else) would be recorded into the capture:
  it is queued too. So is a free that needs a context synchronisation while any
  cuforge capture is active.
- **Captures cuforge cannot see** (begun by another library or through
  cuda.bindings): every driver release call runs with the calling thread's capture
  interaction mode switched to *relaxed* for that one call (``_native/guard.c``), which
  CUDA documents as lifting the prohibition for this thread. A release through a
  user-written ``MemoryResource.deallocate`` gets the tracked-capture deferral only.

The queue is drained -- never leaked -- when the capture that blocked it ends, at the
next release made outside any blocking capture, by :func:`drain` (also called by
``cuforge.graph.drain_released``), and at interpreter exit (``atexit``). A release
that fails reports through ``sys.unraisablehook``, as a finaliser would.

Cost when no capture is active: one module-level integer test per release.
Thread safety: the capture table is guarded by a lock; the queue is a deque; one
drain runs at a time (a nested or concurrent drain returns at once).
"""

from __future__ import annotations

import atexit
import collections
import sys
import threading
import time

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_lock = threading.Lock()
_drain_lock = threading.Lock()
_active = 0  # captures cuforge began and has not seen end (fast path: 0)
_global = 0  # of which begun in global mode
_by_thread: dict[int, int] = {}  # thread ident -> its global/thread-local captures
_records: set[Capture] = set()
_queue: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
_next_auto_drain = 0.0
_AUTO_DRAIN_EVERY = 0.01  # seconds between drains triggered by ordinary releases
DEFERRED = -1  # what release calls return when they queued instead of running

GLOBAL, THREAD_LOCAL, RELAXED = "global", "thread_local", "relaxed"


class Capture:
    """One capture cuforge began: its stream, mode and thread, until :func:`end`."""

    __slots__ = ("__weakref__", "ended", "mode", "stream", "thread")

    def __init__(self, stream: int, mode: str, thread: int) -> None:
        self.stream = stream
        self.mode = mode
        self.thread = thread
        self.ended = False

    def __repr__(self) -> str:
        state = "ended" if self.ended else "active"
        return f"<Capture {self.mode} stream={self.stream:#x} thread={self.thread} {state}>"


def begin(stream: int, mode: str) -> Capture:
    """Record that this thread began a capture on ``stream`` in ``mode``."""
    global _active, _global
    if mode not in (GLOBAL, THREAD_LOCAL, RELAXED):
        raise ValueError(f"unknown capture mode {mode!r}")
    rec = Capture(int(stream), mode, threading.get_ident())
    with _lock:
        _records.add(rec)
        _active += 1
        if mode == GLOBAL:
            _global += 1
        if mode != RELAXED:
            _by_thread[rec.thread] = _by_thread.get(rec.thread, 0) + 1
    return rec


def end(rec: Capture | None) -> None:
    """Record that ``rec``'s capture is over (idempotent), then drain what it held."""
    global _active, _global
    if rec is None:
        return
    with _lock:
        if rec.ended:
            return
        rec.ended = True
        _records.discard(rec)
        _active -= 1
        if rec.mode == GLOBAL:
            _global -= 1
        if rec.mode != RELAXED:
            left = _by_thread.get(rec.thread, 0) - 1
            if left > 0:
                _by_thread[rec.thread] = left
            else:
                _by_thread.pop(rec.thread, None)
    if _queue:
        drain()


def blocked() -> bool:
    """True while a capture cuforge began forbids unsafe calls on this thread."""
    if not _active:
        return False
    return _global > 0 or threading.get_ident() in _by_thread


def any_active() -> bool:
    """True while any capture cuforge began is in progress (any mode or thread)."""
    return _active > 0


def active_captures() -> list[Capture]:
    """The captures cuforge began that have not ended (for tests and diagnostics)."""
    with _lock:
        return list(_records)


def pending() -> int:
    """How many releases are queued."""
    return len(_queue)


def defer(fn: Callable[..., Any], *args: Any) -> int:
    """Queue ``fn(*args)`` for the next drain; returns :data:`DEFERRED`."""
    _queue.append((fn, args))
    return DEFERRED


def release(fn: Callable[..., Any], *args: Any) -> None:
    """Run the release ``fn(*args)`` now, or queue it while a capture forbids it.

    Exceptions are reported through ``sys.unraisablehook`` (this runs from finalisers).
    """
    if _active and blocked():
        _queue.append((fn, args))
        return
    if _queue:
        _maybe_drain()
    _run(fn, args)


def _run(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        fn(*args)
    except Exception as exc:  # a release must not raise into arbitrary code
        sys.unraisablehook(_Unraisable(exc, fn))


def _maybe_drain() -> None:
    global _next_auto_drain
    now = time.monotonic()
    if now >= _next_auto_drain:
        _next_auto_drain = now + _AUTO_DRAIN_EVERY
        drain()


def drain() -> int:
    """Run every queued release that is allowed now; returns how many ran.

    Releases still forbidden (a capture still blocks, or their stream still
    captures) stay queued. One drain at a time: a nested or concurrent call returns 0.
    """
    if not _drain_lock.acquire(blocking=False):
        return 0
    ran = 0
    try:
        # Only the items present now: a release that re-queues itself waits for the next drain.
        for _ in range(len(_queue)):
            if _active and blocked():
                break
            try:
                fn, args = _queue.popleft()
            except IndexError:
                break
            _run(fn, args)
            ran += 1
    finally:
        _drain_lock.release()
    return ran


# --- driver calls in relaxed capture mode --------------------------------------------
_entries: dict[bytes, int] = {}
_guard: Any = None  # the C helper, or False when it is not built


def _native() -> Any:
    global _guard
    if _guard is None:
        try:
            from cuforge._native import _guard as g
        except ImportError:  # no C helpers built: fall back to cuda.bindings
            _guard = False
            return _guard
        from cuforge.runtime.init import driver_entry

        g.set_entries(
            driver_entry(b"cuThreadExchangeStreamCaptureMode"),
            driver_entry(b"cuStreamIsCapturing"),
        )
        _guard = g
    return _guard


def entry(name: bytes) -> int:
    """The driver's address for ``name`` (cached); 0 when unavailable."""
    addr = _entries.get(name)
    if addr is None:
        from cuforge.runtime.init import driver_entry

        addr = _entries[name] = driver_entry(name)
    return addr


def call(name: bytes, *args: int) -> int:
    """``name(*args)`` (one or two pointer-sized ints) with this thread in relaxed
    capture mode; returns the CUresult as an int."""
    g = _native()
    addr = entry(name) if g else 0
    if g and addr:
        err: int = g.relaxed_call(addr, *args)
        return err
    return _call_bindings(name, args)


def _call_bindings(name: bytes, args: tuple[int, ...]) -> int:
    from cuda.bindings import driver

    fn = getattr(driver, name.decode())
    relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    err, old = driver.cuThreadExchangeStreamCaptureMode(relaxed)
    try:
        return int(fn(*args)[0])
    finally:
        if err == 0:
            driver.cuThreadExchangeStreamCaptureMode(old)


def stream_capturing(stream: int) -> bool:
    """True when ``stream`` is capturing, or its capture state cannot be read (the
    legacy stream while a blocking stream captures counts as capturing)."""
    g = _native()
    if g:
        status: int = g.stream_capturing(int(stream))
        return status != 0
    from cuda.bindings import driver

    err, status = driver.cuStreamIsCapturing(int(stream))
    none = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
    return bool(err != 0 or status != none)


def free_on_stream(name: bytes, ptr: int, stream: int) -> int:
    """The stream-ordered free ``name(ptr, stream)`` in relaxed mode, or
    :data:`DEFERRED` (nothing done) when ``stream`` is capturing."""
    g = _native()
    addr = entry(name) if g else 0
    if g and addr:
        freed: int = g.free_on_stream(addr, ptr, stream)
        return freed
    if stream_capturing(stream):
        return DEFERRED
    return _call_bindings(name, (ptr, stream))


def destroy(name: bytes, handle: int) -> int:
    """Destroy ``handle`` with the driver's ``name`` now (returns the CUresult), or
    queue it while a capture forbids it (returns :data:`DEFERRED`); a queued call that
    fails later is reported through ``sys.unraisablehook``."""
    if _active and blocked():
        _queue.append((_destroy_later, (name, handle)))
        return DEFERRED
    if _queue:
        _maybe_drain()
    g = _guard
    if g:  # the common case, without the lookups of call()
        addr = _entries.get(name)
        if addr:
            err: int = g.relaxed_call(addr, handle)
            return err
    return call(name, handle)


def _destroy_later(name: bytes, handle: int) -> None:
    err = call(name, handle)
    if err:
        from cuda.bindings import driver

        from cuforge.runtime.errors import error_for

        raise error_for(driver.CUresult(err), f"deferred {name.decode()}")


class _Unraisable:
    def __init__(self, exc: BaseException, obj: object) -> None:
        self.exc_type = type(exc)
        self.exc_value: BaseException | None = exc
        self.exc_traceback = exc.__traceback__
        self.err_msg: str | None = "cuforge: a deferred release failed"
        self.object = obj


def _at_exit() -> None:
    # Runs before interpreter finalisation, with the driver still usable. Releases
    # still forbidden by an unfinished capture stay unreleased: the exit reclaims them.
    drain()


atexit.register(_at_exit)
