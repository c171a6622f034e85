"""Advisory file locks that die with their holder, for the backends on local files.

Two kinds, one set of calls: a whole-file lock (``offset`` None: ``flock`` on POSIX,
which threads sharing a descriptor share; FileStream's lock files, ledger and
records) and a one-byte record lock at ``offset`` (``lockf``: SQLite's lock file,
one byte per key, byte 0 shared by every process using the database). Windows has
``msvcrt.locking`` on one byte (whole-file locks take a byte far past the end, so
locked files stay readable) and no shared locks: a shared one is always granted.

The OS drops every one of them when its process exits or is killed, which is how a
dead holder is detected: no pid files, no heartbeats. :func:`poll` waits for one by
trying again; :func:`wait_lock` (POSIX, whole-file) blocks in the kernel until the
holder lets go, with a timeout.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["poll", "try_lock", "unlock", "wait_lock"]

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    _WIN_WHOLE_FILE = 0x7FFFFFF0

    def try_lock(fd: int, offset: int | None = None, exclusive: bool = True) -> bool:
        """Take the lock without waiting; whether it is held now."""
        if not exclusive:
            return True
        os.lseek(fd, _WIN_WHOLE_FILE if offset is None else offset, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def unlock(fd: int, offset: int | None = None) -> None:
        os.lseek(fd, _WIN_WHOLE_FILE if offset is None else offset, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def wait_lock(fd: int, timeout: float | None) -> bool:
        """As on POSIX, by trying again (``poll``); at the timeout ``fd`` is closed."""
        if poll(lambda: try_lock(fd), timeout):
            return True
        os.close(fd)
        return False

else:
    import fcntl

    def try_lock(fd: int, offset: int | None = None, exclusive: bool = True) -> bool:
        """Take the lock without waiting; whether it is held now."""
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        try:
            if offset is None:
                fcntl.flock(fd, mode)
            else:
                fcntl.lockf(fd, mode, 1, offset)
        except OSError:  # EWOULDBLOCK, EACCES, EAGAIN: another process holds it
            return False
        return True

    def unlock(fd: int, offset: int | None = None) -> None:
        if offset is None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)

    import _thread

    def wait_lock(fd: int, timeout: float | None) -> bool:
        """Take the whole-file exclusive lock on ``fd``, waiting for its holder at most
        ``timeout`` seconds (None: no limit) without polling: a daemon thread blocks in
        ``flock`` (a lock belongs to the open file, not to a thread). True: held, and
        ``fd`` is the caller's. False at the timeout: ``fd`` is no longer the caller's
        (the thread closes it, releasing the lock if it got it later). POSIX only.

        The threads are kept and reused (:class:`_Blocker`): starting one per wait
        cost a waiter 90-200 us of CPU, handing the wait to an idle one ~20 us."""
        with _guard[0]:
            blocker = _idle.pop() if _idle else None
        if blocker is None:
            blocker = _Blocker()
        wait = _Wait(fd)
        blocker.take(wait)
        wait.done.acquire(True, -1 if timeout is None else max(0.0, timeout))
        with _guard[0]:
            if wait.state == _HELD:
                return True
            wait.state = _LEFT
            return False

    _WAITING, _HELD, _LEFT = 0, 1, 2

    class _Wait:
        """One wait handed to a blocker: ``fd``; ``state`` (under ``_guard``): whether
        the blocker got the lock for the caller (``_HELD``) or the caller left first
        (``_LEFT``: the blocker closes ``fd``); ``done``, released once ``flock``
        returned."""

        __slots__ = ("done", "fd", "state")

        def __init__(self, fd: int) -> None:
            self.fd = fd
            self.state = _WAITING
            self.done = _thread.allocate_lock()
            self.done.acquire()

    class _Blocker:
        """A daemon thread that blocks in ``flock`` for one :class:`_Wait` at a time and
        then waits, idle in ``_idle``, for the next. One that never gets its lock (a
        holder stopped for good) stays blocked, as a thread per wait did: the next
        wait takes another."""

        __slots__ = ("_go", "_wait")

        def __init__(self) -> None:
            import threading

            self._go = _thread.allocate_lock()
            self._go.acquire()
            self._wait: _Wait | None = None
            threading.Thread(target=self._run, name="cuforge-file-lock", daemon=True).start()

        def take(self, wait: _Wait) -> None:
            self._wait = wait
            self._go.release()

        def _run(self) -> None:
            while True:
                self._go.acquire()
                wait = self._wait
                assert wait is not None
                try:
                    fcntl.flock(wait.fd, fcntl.LOCK_EX)
                    ok = True
                except OSError:  # EBADF...: not had
                    ok = False
                with _guard[0]:
                    if wait.state == _LEFT or not ok:
                        os.close(wait.fd)  # not the caller's any more: let go at once
                    else:
                        wait.state = _HELD
                    wait.done.release()
                    self._wait = None
                    _idle.append(self)

    #: Idle blockers, and the lock over them and every wait's state (one list, one
    #: lock per process: a forked child starts with none, its parent's threads gone).
    _idle: list[_Blocker] = []
    _guard = [_thread.allocate_lock()]

    def _forget_blockers() -> None:
        _idle.clear()
        _guard[0] = _thread.allocate_lock()

    os.register_at_fork(after_in_child=_forget_blockers)


def poll(attempt: Callable[[], bool], timeout: float | None) -> bool:
    """Call ``attempt()`` until it returns True (True) or ``timeout`` seconds (None: no
    limit) pass (False): 0.5 ms apart at first, doubling up to 50 ms."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.0005
    while not attempt():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True
