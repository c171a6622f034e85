"""Bounded waits for a FileStream cache's file locks, and its per-key lock files.

The locks themselves (whole-file, released by the OS with their holder) are the
core's ``_filelock``; here is how long an operation waits for one another process
holds (:class:`BoundedWait`) and the single-flight lock files (:class:`FileKeyLock`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from .._filelock import try_lock, unlock, wait_lock
from .._fsutil import O_NOFOLLOW, PRIVATE_FILE, fingerprint
from ._owned import is_lock_file, remake_dir, unlink_owned

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")

__all__ = ["LOCK_WAIT_S", "BoundedWait", "FileKeyLock"]

#: The longest a cache operation waits for a lock another process holds (the size
#: ledger, ``evict.lock``) before it degrades instead: see :class:`BoundedWait`.
LOCK_WAIT_S = 0.25
#: After one wait timed out, later attempts wait only 10 ms for this long.
LOCK_BACKOFF_S = 2.0


class BoundedWait:
    """Take a file lock that another process may hold for good (stopped, hung on
    NFS, a debugger): wait at most ``bound`` seconds; after a wait timed out, wait
    only ``QUIET_WAIT_S`` for the next ``backoff`` seconds, so a holder that never
    lets go costs a compile one bound, then milliseconds, not a bound per operation.
    The first success ends the back-off (the holder went away). Polls at most every
    ``POLL_MAX_S``: the locks it guards are held for microseconds by live peers, so
    contention resolves in the first polls and never reads as a stuck holder. Never
    raises for a busy lock; the caller degrades (defers, skips) when it answers False.
    """

    QUIET_WAIT_S = 0.01
    POLL_MAX_S = 0.002

    __slots__ = ("_backoff", "_bound", "_quiet_until")

    def __init__(self, bound: float = LOCK_WAIT_S, backoff: float = LOCK_BACKOFF_S) -> None:
        self._bound = bound
        self._backoff = backoff
        self._quiet_until = 0.0

    def acquire(self, fd: int) -> bool:
        """Lock ``fd`` exclusively within the bound; False when another holds it."""
        if try_lock(fd):  # the common case: one call, no clock read
            self._quiet_until = 0.0
            return True
        now = time.monotonic()
        quiet = bool(self._quiet_until) and now < self._quiet_until
        deadline = now + (self.QUIET_WAIT_S if quiet else self._bound)
        delay = 0.0002
        while time.monotonic() < deadline:
            time.sleep(delay)
            if try_lock(fd):
                self._quiet_until = 0.0
                return True
            delay = min(delay * 2, self.POLL_MAX_S)
        if not quiet:
            self._quiet_until = time.monotonic() + self._backoff
        return False


class FileKeyLock:
    """Cross-process per-key locks: one lock file per key in ``directory``.

    The holder deletes its lock file before releasing (POSIX), so lock files do
    not pile up; a waiter that wins a lock on a file that was deleted meanwhile
    notices (the path no longer names its inode) and tries again. The deletion goes
    through the ownership gate (``owned``: the root's proof; the name must be
    ``<64 hex>.lock``); when it is refused the file stays, which costs nothing.

    A waiter blocks in the kernel (POSIX: ``flock`` in a helper thread, bounded by
    the timeout), so it takes the lock the moment its holder lets go -- the ranks of
    a host that wait for one compile pass the lock on in microseconds each, without
    polling; at the timeout it gives up (the helper lets go of a lock it gets later).
    Windows polls, 0.5 ms apart at first, doubling to 50 ms.

    :meth:`claim` is the same lock for a caller that waits for a holder's result:
    a lock won on a file its holder deleted means that holder finished, so it is let
    go at once (the next waiter's turn) and ``look()`` asked; what it finds is the
    answer, held by nobody, and only when it finds nothing does the waiter take the
    lock again. The waiters of one holder so leave in a cascade instead of taking the
    lock in turn, each making and deleting a lock file of its own.
    """

    def __init__(
        self, directory: str, dir_mode: int | None, file_mode: int | None, *, owned: bool
    ) -> None:
        self._dir = directory
        self._dir_mode = dir_mode
        self._file_mode = file_mode
        self._owned = owned

    @contextmanager
    def hold(self, name: str, timeout: float | None) -> Iterator[bool]:
        """The lock of ``name``; yields whether it is held (False at the timeout, or
        where no lock file can be made)."""
        with self.claim(name, timeout, None) as (held, _):
            yield held

    @contextmanager
    def claim(
        self, name: str, timeout: float | None, look: Callable[[], T] | None
    ) -> Iterator[tuple[bool, T | None]]:
        """The lock of ``name``, yielding ``(held, found)``: ``(True, None)`` while it is
        held; ``(False, found)`` when a holder finished while this one waited and
        ``look()`` (None: never asked) then found something (a true value), held by
        nobody; ``(False, None)`` at the timeout."""
        path = os.path.join(self._dir, name + ".lock")
        fd, found = self._acquire(path, timeout, look)
        try:
            yield fd is not None, found
        finally:
            if fd is not None:
                if os.name != "nt":
                    with suppress(OSError):  # the file we hold, if it still stands there
                        held = fingerprint(os.fstat(fd))
                        unlink_owned(self._owned, path, held, None, _lock_name, self._dir)
                try:
                    unlock(fd)
                finally:
                    os.close(fd)

    def _acquire(
        self, path: str, timeout: float | None, look: Callable[[], T] | None
    ) -> tuple[int | None, T | None]:
        """The locked descriptor of ``path`` (None: not had), or what ``look()`` found
        once a holder finished (see :meth:`claim`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while True:
            try:
                fd = os.open(
                    path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW,
                    PRIVATE_FILE if self._file_mode is None else self._file_mode,
                )  # fmt: skip
            except FileNotFoundError:
                try:
                    remake_dir(self._dir, os.path.dirname(self._dir), self._dir_mode,
                               self._file_mode)  # fmt: skip
                    continue
                except OSError:
                    return None, None
            except OSError:
                return None, None  # cannot lock here (read-only cache...): fall through
            if self._file_mode is not None:
                with suppress(OSError, AttributeError):
                    os.fchmod(fd, self._file_mode)
            got = try_lock(fd)
            if not got and os.name != "nt":
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    os.close(fd)
                    return None, None
                if not wait_lock(fd, left):
                    return None, None  # the helper closes fd
                got = True
            if got:
                if os.name == "nt" or _names_inode(path, fd):
                    return fd, None
                unlock(fd)  # won a lock on a file its holder deleted: it finished
                os.close(fd)
                if look is not None:
                    found = look()
                    if found:
                        return None, found
                continue  # retry at once
            os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                return None, None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _names_inode(path: str, fd: int) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except OSError:
        return False


def _lock_name(path: str) -> bool:
    return is_lock_file(os.path.basename(path))
