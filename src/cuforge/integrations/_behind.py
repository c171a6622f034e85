"""Write-behind: the integrations' stores land after the compile that made them.

A JIT's store (a Triton file, an Inductor value) is handed to one writer thread per
process and the compile goes on at once; the thread makes the stores in the order
they came, each through the cache's own ``set_entry`` (framing, integrity, signing
and counting as ever), then runs what waited for it: a Triton kernel's single-flight
lock is let go only once the kernel's files are stored, so a peer that waited for
the lock finds them.

- **Read your writes.** A lookup in this process sees a store that has not landed
  (:func:`pending`), so a process never compiles again what it just compiled.
- **Flushed before the process ends**: at interpreter exit (``atexit``, registered
  when the first store is queued, so it runs before the caches' own exit hooks,
  registered when they opened), at the end of a ``multiprocessing`` child (its
  finalizers: a pool worker leaves through ``os._exit``, which runs no ``atexit``),
  when a pool worker is sent SIGTERM (how Inductor's compile-worker pool ends its
  workers; see :func:`_hook_terminate`), and by :func:`flush`.
- **A crash loses, never damages.** A process killed otherwise (SIGKILL, a crash,
  SIGTERM to a process that is not a pool worker) loses the stores still queued --
  the next process that misses them compiles again -- and leaves no damaged entry:
  each store is the backend's atomic one, which a reader sees whole or not at all,
  and a lookup verifies what it reads.
- **Bounded.** Past ``MAX_QUEUED_BYTES`` of queued payload a store waits for room,
  so a slow medium slows the compile as it did before rather than filling memory.
  The thread ends after ``IDLE_S`` without work (and starts again at the next store),
  so a process that has stopped compiling forks without it.
- **fork.** The fork waits for the store in hand (never more than ``FORK_WAIT_S``),
  so no cache handle is copied mid-store; the child starts with an empty queue:
  what the parent queued is the parent's, so the child never stores it nor runs what
  waited for it (a parent's lock is never let go by its child); those callbacks are
  kept alive, unrun, in the child (:data:`orphans`).
- A store that raises is dropped: ``on_error`` (the integration's warning) is told,
  as a synchronous store's failure was. Nothing raises into the compile.
- **When.** By default (``$CUFORGE_WRITE_BEHIND`` unset or ``auto``) a store to a
  cache with a level on a server (Redis, S3: ``storage.tiered.reach``) is written
  behind, and one to a cache on this host (a directory, SQLite) is made at once, in
  the compiling thread: it costs a fraction of a millisecond, less than handing it to
  a thread does (the hand-overs of the GIL, with the compile's own threads waiting);
  one that waits on a network is worth taking off the compile. ``1`` writes every
  store behind (a directory on a slow network file system), ``0`` none (the thread is
  then never started). Another value is one :class:`CacheWriteWarning` naming the
  variable, and the default.

What it costs: the writer is a Python thread, so its work needs the GIL; it runs in
the compile's waits (``ptxas``, file and process waits) and otherwise takes the GIL
for a slice every switch interval. Its system calls -- most of a directory store --
overlap the compile, its Python does not; a store that waits on a network or a slow
disk is taken off the compile whole. docs/performance.md, "The first compile".
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import os
import queue
import sys
import threading
import time
import warnings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cuforge.storage.base import ProgramCacheResource

__all__ = [
    "ENV",
    "MAX_QUEUED_BYTES",
    "enabled",
    "flush",
    "orphans",
    "pending",
    "queued",
    "submit",
    "writer_ident",
]

#: Queued payload bytes past which a new store waits for the writer.
MAX_QUEUED_BYTES = 64 << 20
#: The longest a fork waits for the store the writer has in hand.
FORK_WAIT_S = 10.0
#: The longest a pool worker sent SIGTERM waits for its queue before it dies.
TERM_FLUSH_S = 10.0
#: Seconds without work after which the writer thread ends.
IDLE_S = 1.0
#: ``auto`` (default): behind for a cache that reaches a server; ``1``: every store
#: behind; ``0``: every store at once, in the caller's thread.
ENV = "CUFORGE_WRITE_BEHIND"
_AUTO = {"", "auto"}
_ON = {"1", "on", "yes", "true"}
_OFF = {"0", "off", "no", "false"}
_warned: set[str] = set()


def _auto(cache: ProgramCacheResource | None) -> bool:
    """(auto) Whether ``cache`` reaches a server: read from its classes, a few
    ``isinstance`` tests per store (no cache of it: an id outlives its object)."""
    from cuforge.storage.tiered.reach import reaches_server

    return reaches_server(cache)


def enabled(cache: ProgramCacheResource | None = None) -> bool:
    """Whether a store to ``cache`` is written behind (``$CUFORGE_WRITE_BEHIND``; read
    at every store, so a test or a session can change it): ``auto`` (the default) when
    the cache has a level on a server. A value that is not a switch is one warning per
    value, and the default."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in _AUTO:
        return _auto(cache)
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    if raw not in _warned:
        _warned.add(raw)
        from cuforge._stack import outside_level
        from cuforge.storage.base import CacheWriteWarning

        warnings.warn(
            f"${ENV}={os.environ.get(ENV)!r} is not auto, 0 or 1; stores to a server "
            "are written behind (the default, auto)",
            CacheWriteWarning,
            stacklevel=outside_level(),
        )
    return _auto(cache)


class _Item:
    """One store and what runs once it is made."""

    __slots__ = ("after", "cache", "data", "key", "meta", "on_error")

    def __init__(
        self,
        cache: ProgramCacheResource,
        key: bytes,
        data: bytes,
        meta: bytes,
        on_error: Callable[[Exception], None],
        after: Callable[[], None] | None,
    ) -> None:
        self.cache, self.key, self.data, self.meta = cache, key, data, meta
        self.on_error, self.after = on_error, after


class _State:
    """This process's queue, its writer and what it has not stored yet.

    The compiling threads never wait for a lock the writer holds while storing: a
    store is put on a ``SimpleQueue`` under ``submit_lock``, which only submitting
    threads take (and the writer, when it ends idle). A thread blocked on a lock
    another thread holds while that one waits for the GIL would pay a GIL hand-over
    per store, which on a busy machine costs more than the store itself.
    """

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self.submit_lock = threading.Lock()
        #: Progress: the writer notifies under it once a store is done, when a
        #: :func:`flush` or a store waiting for room is waiting (``waiters``).
        self.done_cv = threading.Condition(threading.Lock())
        self.waiters = 0
        #: Held while the writer makes a store and runs its callback: fork takes it.
        self.busy = threading.Lock()
        self.submitted = self.submitted_bytes = 0  # under ``submit_lock``
        self.done = self.done_bytes = 0  # the writer's alone
        #: The writer's thread id (``threading.get_ident``), None when it is not running.
        self.thread: int | None = None
        self.hooked = False  # exit hooks registered in this process

    def unfinished(self) -> int:
        return self.submitted - self.done


_state = _State()
#: (id(cache), key) -> the newest store of that key queued and not yet made (read
#: your writes); empty when nothing is queued, so a lookup tests it before calling
#: :func:`pending`. A queued item holds its cache, so the id is not reused meanwhile.
queued: dict[tuple[int, bytes], _Item] = {}
#: What must outlive a fork unrun: in a forked child, the parent's queued stores and
#: callbacks, and its kernel locks (their finalizers would let go of the parent's).
orphans: list[object] = []


def pending(cache: ProgramCacheResource, key: bytes) -> tuple[bytes, bytes] | None:
    """``(data, meta)`` of the newest store of ``key`` in ``cache`` this process has
    queued and not yet made, or None."""
    item = queued.get((id(cache), key))
    return None if item is None else (item.data, item.meta)


def submit(
    cache: ProgramCacheResource,
    key: bytes,
    data: bytes,
    meta: bytes,
    on_error: Callable[[Exception], None],
    after: Callable[[], None] | None = None,
) -> None:
    """Queue ``cache.set_entry(key, data, meta)``; ``after`` runs once it is made (or
    dropped). Waits only while more than ``MAX_QUEUED_BYTES`` are queued. Makes the
    store (and runs ``after``) now where :func:`enabled` says not to write it behind."""
    item = _Item(cache, key, data, meta, on_error, after)
    if not enabled(cache):
        _store(item)
        return
    st = _state
    if st.submitted_bytes - st.done_bytes > MAX_QUEUED_BYTES:
        _wait(st, lambda: st.submitted_bytes - st.done_bytes <= MAX_QUEUED_BYTES, None)
    with st.submit_lock:
        behind = st.thread is not None or _start(st)
        if behind:
            queued[(id(cache), key)] = item
            st.submitted += 1
            st.submitted_bytes += len(data)
            st.queue.put(item)
    if not behind:  # no thread can start (interpreter shutdown): stored here, now
        _store(item)


def flush(timeout: float | None = None) -> bool:
    """Wait until every store the integrations of this process queued has landed (or
    was dropped, with its warning) and what waited for it ran; True then, False when
    ``timeout`` seconds passed first. Called for you at exit; call it before another
    process must see this one's stores, or before reading a cache's counters that
    should include them."""
    st = _state
    if st.thread == threading.get_ident():  # a callback of the writer itself
        return st.unfinished() == 0
    target = st.submitted
    return _wait(st, lambda: st.done >= target, timeout)


def _wait(st: _State, ready: Callable[[], bool], timeout: float | None) -> bool:
    """Wait for the writer's progress to make ``ready()`` true, or for ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with st.done_cv:
        st.waiters += 1
        try:
            while not ready():
                if st.thread is None and st.unfinished():  # the writer died: nothing comes
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                st.done_cv.wait(0.5 if left is None else min(left, 0.5))
        finally:
            st.waiters -= 1
    return True


def _start(st: _State) -> bool:
    """Start the writer thread, and register the hooks that flush before the process
    ends (the caller holds ``st.submit_lock``); False when no thread can start
    (interpreter shutdown). A bare ``_thread`` thread: ``threading.Thread.start``
    waits until the new thread runs, which on a busy machine costs the compile
    milliseconds; this one never waits (and, like a daemon thread, is not joined at
    exit -- the exit hooks wait for the queue instead)."""
    try:
        with _born_deaf():
            st.thread = _thread.start_new_thread(_write, (st,))
    except RuntimeError:
        return False
    if not st.hooked:
        st.hooked = True
        atexit.register(flush)
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:  # a pool worker ends with os._exit: its finalizers run
            mp_util.Finalize(None, flush, exitpriority=0)
        _hook_terminate()
    return True


def writer_ident() -> int | None:
    """The writer thread's id (``threading.get_ident()``), None when none runs."""
    return _state.thread


def _write(st: _State) -> None:
    """The writer: each store in order, then its callback, then the next; ends after
    ``IDLE_S`` with nothing queued (or, should anything escape, at once: a waiter
    then sees no writer and stops waiting)."""
    me = threading.get_ident()
    _not_here()
    try:
        while True:
            try:
                item = st.queue.get(timeout=IDLE_S)
            except queue.Empty:
                with st.submit_lock:  # a submitter sees the thread gone, or this its item
                    if st.queue.empty():
                        st.thread = None
                        return
                continue
            with st.busy:
                try:
                    _store(item)
                finally:
                    _retire(item)
                    st.done += 1
                    st.done_bytes += len(item.data)
                    if st.waiters:
                        with st.done_cv:
                            st.done_cv.notify_all()
    finally:
        with st.submit_lock:
            if st.thread == me:
                st.thread = None
        with st.done_cv:
            st.done_cv.notify_all()


@contextlib.contextmanager
def _born_deaf() -> Any:
    """Block SIGTERM and SIGINT in this thread while it starts the writer, which
    inherits the mask: closes the race of a signal that arrived after the writer
    existed but before it ran :func:`_not_here` -- on a busy machine a new thread
    can wait a while for its first slice -- and was handled in the writer, where it
    interrupts nothing (a pool worker sent SIGTERM then slept on, its handler not run:
    the flush and exit came only when the main thread's blocking call returned). A
    signal arriving meanwhile stays pending for this thread, which takes it once
    the mask is restored."""
    import signal

    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    try:
        old = mask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    except (OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


def _not_here() -> None:
    """Block SIGTERM and SIGINT in the writer thread, so the kernel delivers them to a
    thread that handles them: one delivered here would not interrupt the main thread's
    blocking call (a pool worker waiting for its next job), and Python would run its
    handler -- the exit flush of :func:`_hook_terminate`, a KeyboardInterrupt -- only
    when that call returned."""
    import signal

    if hasattr(signal, "pthread_sigmask"):
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


def _retire(item: _Item) -> None:
    """Forget ``item``'s read-your-writes slot, unless a newer store of its key took
    it. Without a lock, so the writer never holds one a compiling thread waits for
    (a thread blocked on a lock whose holder waits for the GIL pays a GIL hand-over,
    measured at ~0.7 ms a store on a busy machine): a newer item popped by mistake is
    put back at once; a lookup in between reads the cache, which holds this store of
    the same key."""
    slot = (id(item.cache), item.key)
    if queued.get(slot) is item:
        popped = queued.pop(slot, None)
        if popped is not None and popped is not item:
            queued.setdefault(slot, popped)


def _store(item: _Item) -> None:
    """Make one store and run what waited for it; nothing raises out."""
    try:
        item.cache.set_entry(item.key, item.data, item.meta)
    except Exception as exc:  # dropped, as a synchronous store would have been
        with contextlib.suppress(Exception):
            item.on_error(exc)
    if item.after is not None:
        with contextlib.suppress(Exception):
            item.after()


def _hook_terminate() -> None:
    """In a ``multiprocessing`` child's main thread whose SIGTERM does what it does by
    default (end the process), flush for at most ``TERM_FLUSH_S`` on SIGTERM, then end
    the process by the same signal (its parent sees what it would have seen).

    Inductor's compile-worker pool ends its idle workers with SIGTERM; without this,
    the stores of the last kernels a worker compiled could be lost on every run that
    ends soon after compiling. Any other disposition (the host's own handler, ignored)
    is left alone, and so is every process that is not a pool worker: there, SIGTERM
    loses the queue like a crash (module docstring). The wait polls rather than taking
    the queue's lock, which the interrupted main thread may hold.
    """
    import signal

    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_terminate)


def _on_terminate(signum: int, frame: Any) -> None:
    import signal

    deadline = time.monotonic() + TERM_FLUSH_S
    while _state.unfinished() and time.monotonic() < deadline:
        time.sleep(0.002)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_fork_held = False  # the fork's thread took ``busy`` (it did not time out)


def _before_fork() -> None:
    global _fork_held
    if _state.thread is not None:  # a hung store: fork anyway after the bound
        _fork_held = _state.busy.acquire(timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _fork_held
    if _fork_held:
        _fork_held = False
        _state.busy.release()


def _after_fork_in_child() -> None:
    global _state, _fork_held
    _fork_held = False
    old = _state
    with contextlib.suppress(queue.Empty):
        while True:  # the parent's stores: never made, never called back here
            orphans.append(old.queue.get_nowait())
    queued.clear()
    _state = _State()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
