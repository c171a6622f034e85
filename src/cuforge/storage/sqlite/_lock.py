"""Cross-process locks of a SQLite cache: record locks on one file beside the database.

``<db>.lock`` carries POSIX record locks (``lockf``) on single bytes:

- byte 0, shared, held by every process that has the database open. A process that
  wants to move a damaged database aside takes it exclusively, which succeeds only
  while no other process uses the database (SQLite must never see its file renamed
  under an open connection: the last one to close would delete the new file's WAL).
- one byte per key (1 MiB + 48 bits of the key digest), exclusive, held while the
  key is being filled (single-flight).

The OS drops record locks when their process exits or is killed, so a dead holder
never blocks anyone. Record locks belong to the process, not to a descriptor: two
threads of one process would both "hold" one byte, and closing any descriptor of
the file drops every lock the process has on it. Hence one descriptor per lock
file and process, shared (and counted) by every handle on that database, and an
in-process lock per key in front of each byte lock.

Windows has no shared record locks: there, byte 0 is not used (a database that is
open elsewhere cannot be renamed anyway) and key bytes use ``msvcrt.locking``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from .. import ownership
from .._filelock import poll, try_lock, unlock
from ..base import KeyLocks
from ..handle import LIVE

__all__ = ["LockFile", "reset_after_fork"]

_KEY_BASE = 1 << 20

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class _Shared:
    """The process-wide state of one lock file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.users = 0
        self.mutex = threading.Lock()
        self.key_locks = KeyLocks()
        self.using = False  # this process holds byte 0 shared
        flags = os.O_RDWR | getattr(os, "O_BINARY", 0)
        self.created = False
        try:
            try:
                self.fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
                self.created = True
            except FileExistsError:
                self.fd = os.open(path, flags | _NOFOLLOW)
        except OSError:
            self.fd = -1  # read-only directory: no cross-process locking


_REGISTRY: dict[str, _Shared] = {}
_REGISTRY_MUTEX = threading.Lock()


class LockFile:
    """One cache handle's share of ``<db>.lock`` (see the module docstring)."""

    def __init__(self, db_path: str) -> None:
        path = os.path.realpath(db_path) + ".lock"
        with _REGISTRY_MUTEX:
            shared = _REGISTRY.get(path)
            if shared is None:
                shared = _REGISTRY[path] = _Shared(path)
            shared.users += 1
        self._shared: _Shared | None = shared

    @property
    def path(self) -> str:
        assert self._shared is not None
        return self._shared.path

    def use(self, timeout: float) -> bool:
        """Take byte 0 shared for this process (waits while someone repairs the file)."""
        s = self._shared
        assert s is not None
        if s.fd < 0:
            return False
        with s.mutex:
            if not s.using:
                s.using = poll(lambda: try_lock(s.fd, 0, False), timeout)
            return s.using

    def alone_in_process(self) -> bool:
        """Whether no other handle of this process has the database open."""
        s = self._shared
        assert s is not None
        with _REGISTRY_MUTEX:
            return s.users == 1

    def try_exclusive(self) -> bool:
        """Take byte 0 exclusively if this handle alone uses the database, in this
        process and all others; held until :meth:`share`, and every other opener's
        :meth:`use` waits meanwhile. Windows: True (renaming an open file fails there)."""
        s = self._shared
        assert s is not None
        if os.name == "nt":
            return True
        if s.fd < 0 or not self.alone_in_process():
            return False
        with s.mutex:
            return try_lock(s.fd, 0, True)

    def unuse(self) -> None:
        """Drop this process's hold of byte 0 (only when this handle is alone)."""
        s = self._shared
        assert s is not None
        if s.fd >= 0 and os.name != "nt" and self.alone_in_process():
            with s.mutex:
                with contextlib.suppress(OSError):
                    unlock(s.fd, 0)
                s.using = False

    def share(self) -> None:
        """Turn an exclusive hold of byte 0 back into this process's shared one."""
        s = self._shared
        assert s is not None
        if s.fd >= 0 and os.name != "nt":
            with s.mutex:
                s.using = try_lock(s.fd, 0, False)

    @contextlib.contextmanager
    def hold(self, key_digest: bytes, timeout: float | None) -> Iterator[bool]:
        """Hold ``key_digest``'s lock against every thread and process; yields held.

        Yields False once ``timeout`` (seconds, None: no limit) passes, or at once
        when the lock file could not be created.
        """
        s = self._shared
        if s is None:
            raise ValueError("operation on a closed SQLiteProgramCache")
        start = time.monotonic()
        with s.key_locks.hold(key_digest, timeout) as in_process:
            if not in_process or s.fd < 0:
                yield False
                return
            offset = _KEY_BASE + int.from_bytes(key_digest[:6], "little")
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            held = poll(lambda: try_lock(s.fd, offset, True), left)
            try:
                yield held
            finally:
                if held:
                    with contextlib.suppress(OSError):
                        unlock(s.fd, offset)

    def release(self, remove_if_created: bool = False) -> None:
        """This handle's share ends; the last one closes the file (dropping its locks)
        and, with ``remove_if_created``, deletes it through the ownership gate if it is
        provably this process's alone: this process created it (``O_EXCL``) and no other
        process holds byte 0 (so a refused database is left as it was found, and a lock
        file peers are using is never pulled from under them)."""
        s, self._shared = self._shared, None
        if s is None:
            return
        with _REGISTRY_MUTEX:
            s.users -= 1
            if s.users > 0:
                return
            del _REGISTRY[s.path]
        if s.fd >= 0:
            if remove_if_created:

                def alone(_path: str) -> bool:
                    return s.created and try_lock(s.fd, 0, True)

                ownership.delete_owned([s.path], alone, _unlink, where=s.path)
            os.close(s.fd)


def _unlink(paths: list[str]) -> int:
    removed = 0
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed


def reset_after_fork() -> None:
    """In a forked child: record locks are not inherited; drop the parent's claims."""
    global _REGISTRY_MUTEX
    _REGISTRY_MUTEX = threading.Lock()
    for s in _REGISTRY.values():
        s.mutex = threading.Lock()
        s.key_locks = KeyLocks()
        s.using = False


LIVE.first_in_child(reset_after_fork)  # before any handle's own hook
