"""Whole-file advisory locks that die with their holder.

POSIX uses ``fcntl.flock`` and Windows ``msvcrt.locking`` on one byte far past the
end of the file (so locked files stay readable). Both are released by the OS when
the holding process exits or is killed, which is how a dead holder is detected:
no pid files, no heartbeats.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from .._fsutil import O_NOFOLLOW, PRIVATE_FILE, make_dir

__all__ = ["FileKeyLock", "lock_fd", "try_lock_fd", "unlock_fd"]

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    _WIN_LOCK_OFFSET = 0x7FFFFFF0

    def try_lock_fd(fd: int) -> bool:
        os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def unlock_fd(fd: int) -> None:
        os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def lock_fd(fd: int, timeout: float | None = None) -> bool:
        return _poll(fd, timeout)

else:
    import fcntl

    def try_lock_fd(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

    def lock_fd(fd: int, timeout: float | None = None) -> bool:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return True
        return _poll(fd, timeout)


def _poll(fd: int, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.0005
    while not try_lock_fd(fd):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


class FileKeyLock:
    """Cross-process per-key locks: one lock file per key in ``directory``.

    The holder deletes its lock file before releasing (POSIX), so lock files do
    not pile up; a waiter that wins a lock on a file that was deleted meanwhile
    notices (the path no longer names its inode) and tries again.
    """

    def __init__(self, directory: str, dir_mode: int | None, file_mode: int | None) -> None:
        self._dir = directory
        self._dir_mode = dir_mode
        self._file_mode = file_mode

    @contextmanager
    def hold(self, name: str, timeout: float | None) -> Iterator[bool]:
        path = os.path.join(self._dir, name + ".lock")
        fd = self._acquire(path, timeout)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                if os.name != "nt":
                    with suppress(OSError):
                        os.unlink(path)
                try:
                    unlock_fd(fd)
                finally:
                    os.close(fd)

    def _acquire(self, path: str, timeout: float | None) -> int | None:
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
                    make_dir(self._dir, self._dir_mode)
                    continue
                except OSError:
                    return None
            except OSError:
                return None  # cannot lock here (read-only cache...): fall through
            if self._file_mode is not None:
                with suppress(OSError, AttributeError):
                    os.fchmod(fd, self._file_mode)
            if try_lock_fd(fd):
                if os.name == "nt" or _names_inode(path, fd):
                    return fd
                unlock_fd(fd)
                os.close(fd)
                continue  # won a lock on a deleted file: retry at once
            os.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _names_inode(path: str, fd: int) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except OSError:
        return False
