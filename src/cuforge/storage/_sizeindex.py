"""The size ledger: one running byte total shared by every process of a cache.

A 16-byte file (``magic | total u64``) updated under an exclusive file lock, so a
write under a size cap costs one lock + read + write instead of a directory
scan. Every handle on the directory adds its own deltas, so all processes see
one total and a cap holds across them. The total is a running estimate: races
(a delete overlapping an eviction scan, files changed behind the cache's back)
can make it drift, and each eviction scan resets it to what the disk holds. It is
clamped at zero: an undercount only delays eviction until the next scan, while a
negative total would disable eviction for good.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Callable

from ._fsutil import read_at0, write_at0
from ._locking import lock_fd, unlock_fd

__all__ = ["SizeLedger"]

_MAGIC = b"CFLEDG01"
_RECORD = struct.Struct("<8sQ")


class SizeLedger:
    """Shared running total of a cache directory's bytes (see module docstring).

    ``seed`` is called (under the lock) to compute the total by scanning when the
    ledger file is new or unreadable.
    """

    def __init__(self, path: str, file_mode: int | None, seed: Callable[[], int]) -> None:
        self._path = path
        self._file_mode = file_mode
        self._seed = seed
        self._mutex = threading.Lock()  # flock does not exclude threads sharing the fd
        self._fd = -1
        self._open()

    def _open(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
        if self._file_mode is not None:
            with contextlib.suppress(OSError, AttributeError):
                os.fchmod(fd, self._file_mode)
        self._fd = fd
        with self._mutex:
            lock_fd(fd)
            try:
                if self._read_locked() is None:
                    self._write_locked(max(0, self._seed()))
            finally:
                unlock_fd(fd)

    def reopen(self) -> None:
        """Take a fresh descriptor (after fork: an inherited one shares its lock)."""
        self._mutex = threading.Lock()
        self.close()
        self._open()

    def _read_locked(self) -> int | None:
        data = read_at0(self._fd, _RECORD.size)
        if len(data) != _RECORD.size:
            return None
        magic, total = _RECORD.unpack(data)
        return total if magic == _MAGIC else None

    def _write_locked(self, total: int) -> None:
        write_at0(self._fd, _RECORD.pack(_MAGIC, max(0, total)))

    def _update(self, fn: Callable[[int], int]) -> int:
        with self._mutex:
            lock_fd(self._fd)
            try:
                current = self._read_locked()
                if current is None:  # damaged behind our back: rebuild
                    current = max(0, self._seed())
                new = max(0, fn(current))
                self._write_locked(new)
                return new
            finally:
                unlock_fd(self._fd)

    def add(self, delta: int) -> int:
        """Add ``delta`` (may be negative) and return the new total, never below 0."""
        return self._update(lambda cur: cur + delta)

    def total(self) -> int:
        return self._update(lambda cur: cur)

    def reconcile(self, total_at_scan: int, scanned: int) -> int:
        """Replace the part of the total that a scan measured with what it found.

        ``total_at_scan`` is the ledger total read just before scanning; deltas
        other writers added since are kept on top of ``scanned``.
        """
        return self._update(lambda cur: cur - total_at_scan + scanned)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
