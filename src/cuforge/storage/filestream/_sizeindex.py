"""The size ledger: one running byte total shared by every process of a cache.

A 24-byte file (``magic | total u64 | open handles u64``) updated under an
exclusive file lock, so a write under a size cap costs one lock + read + write
instead of a directory scan. Every handle on the directory adds its own deltas,
so all processes see one total and a cap holds across them. The total is a
running estimate: races (a delete overlapping an eviction scan, files changed
behind the cache's back) can make it drift, and each eviction scan resets it to
what the disk holds. It is clamped at zero: an undercount only delays eviction
until the next scan, while a negative total would disable eviction for good.

Crash recovery: a process killed between publishing an entry and adding its size
leaves the total short. Every open handle is counted in the record and holds a
shared lock on ``<ledger>.users`` for its lifetime. A handle that opens when no
other handle is alive (it can take that lock exclusively) and finds the count
above zero knows some handle died without closing: it rescans, so after the next
open following a crash the total agrees with the disk again. A clean close (or
interpreter exit) takes the handle off the count, so opening after clean exits
never scans.

Held locks: every wait for the ledger's lock is bounded (``BoundedWait``: 0.25 s,
then 10 ms waits for a while). A handle that cannot take it keeps its deltas
pending and applies them with the next update that can; opening while another
process holds the lock for good returns at once, unregistered, and registers on
the first update that gets the lock. ``on_busy`` is told each time, so the cache
can count and warn; the total it answers meanwhile is its last view plus its own
pending deltas.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
import struct
import sys
import threading
from collections.abc import Callable

from .._filelock import try_lock, unlock
from .._fsutil import O_NOFOLLOW, PRIVATE_FILE, read_at0, write_at0
from ._locking import BoundedWait
from ._owned import LEDGER_NAMES, unlink_special

__all__ = ["SizeLedger"]

_MAGIC = b"CFLEDG02"  # 01 (16 bytes, no handle count) reads as unreadable: rescanned once
_RECORD = struct.Struct("<8sQQ")
_FLAGS = os.O_RDWR | os.O_CREAT | O_NOFOLLOW | getattr(os, "O_BINARY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _try_exclusive(fd: int) -> bool:
    """The users file exclusively: no other handle alive (never on Windows: there
    recovery is by eviction scans)."""
    return sys.platform != "win32" and try_lock(fd)


def _share(fd: int) -> None:
    try_lock(fd, exclusive=False)


class SizeLedger:
    """Shared running total of a cache directory's bytes (see module docstring).

    ``seed`` is called (under the lock) to compute the total by scanning when the
    ledger file is new or unreadable, or when a handle died without closing.
    ``recovered`` tells whether this handle's registration did that. ``on_busy`` is
    called (holding no lock) each time another process held the ledger's lock past
    the bound. ``owned`` (the cache root's proof, ``_owned``) lets a FIFO or device
    planted at the ledger's name be replaced; without it the ledger is unusable then.
    """

    def __init__(
        self,
        path: str,
        file_mode: int | None,
        seed: Callable[[], int],
        on_busy: Callable[[], None] | None = None,
        *,
        owned: bool = False,
    ) -> None:
        self._path = path
        self._owned = owned
        self._file_mode = file_mode
        self._seed = seed
        self._on_busy = on_busy
        self._wait = BoundedWait()
        self._mutex = threading.Lock()  # flock does not exclude threads sharing the fd
        self._fd = self._ufd = -1
        self._closed = False
        self._registered = False
        self._pending = 0  # deltas not yet in the file: its lock was held elsewhere
        self._last = 0  # the total this handle last read or wrote
        self.recovered = False
        with self._mutex:
            busy = not self._open()
        if busy:
            self._busy()

    def _open_file(self, path: str) -> int:
        """Open (creating) ``path``; a FIFO or device planted there (the ledger could
        not be read: no size accounting, no cap) is replaced by a new file."""
        mode = PRIVATE_FILE if self._file_mode is None else self._file_mode
        fd = os.open(path, _FLAGS | _NONBLOCK, mode)
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            os.close(fd)
            unlink_special(self._owned, path, LEDGER_NAMES.__contains__, path, st.st_ino)
            fd = os.open(path, _FLAGS | _NONBLOCK, mode)  # ours, or a peer's new file
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(f"{path} is not a regular file")
        if self._file_mode is not None:
            with contextlib.suppress(OSError, AttributeError):
                os.fchmod(fd, self._file_mode)
        return fd

    def _open(self) -> bool:
        """Open (creating) the ledger and register this handle if its lock can be
        had within the bound (False: not registered yet); the caller holds ``_mutex``."""
        self._registered = False
        self._fd = self._open_file(self._path)
        try:
            self._ufd = self._open_file(self._path + ".users")
        except OSError:
            self._ufd = -1  # cannot register: counted in no one's favour, just no recovery
        if not self._wait.acquire(self._fd):
            return False
        try:
            self._register_locked()
        finally:
            unlock(self._fd)
        return True

    def _register_locked(self) -> bool:
        """Count this handle in the record (seeding it when needed); whether it seeded."""
        record = self._read_locked()
        # Under the ledger lock no other opener is between these two steps, so
        # "exclusive" means: no live handle at all.
        alone = self._ufd >= 0 and _try_exclusive(self._ufd)
        seeded = record is None or (alone and record[1] > 0)
        if record is None or seeded:
            record = (max(0, self._seed()), 0)
            self.recovered = True
        if self._ufd >= 0:
            _share(self._ufd)  # downgrade (or join): held while this handle lives
            record = (record[0], record[1] + 1)
        self._write_locked(*record)
        self._registered = True
        self._last = record[0]
        return seeded

    def reopen(self) -> None:
        """Take fresh descriptors and register as a handle of its own (after fork:
        inherited ones share the parent's locks, and the parent's registration)."""
        self._mutex = threading.Lock()
        self._wait = BoundedWait()
        self._drop_descriptors()
        self._pending = 0
        with self._mutex:
            busy = not self._open()
        if busy:
            self._busy()

    def _read_locked(self) -> tuple[int, int] | None:
        data = read_at0(self._fd, _RECORD.size)
        if len(data) != _RECORD.size:
            return None
        magic, total, handles = _RECORD.unpack(data)
        return (total, handles) if magic == _MAGIC else None

    def _write_locked(self, total: int, handles: int) -> None:
        write_at0(self._fd, _RECORD.pack(_MAGIC, max(0, total), max(0, handles)))

    def _busy(self) -> None:
        if self._on_busy is not None:
            self._on_busy()

    def _update(
        self, delta: int = 0, scan: tuple[int, int] | None = None, handles_delta: int = 0
    ) -> int:
        with self._mutex:
            fresh = False
            if self._fd < 0 or os.fstat(self._fd).st_nlink == 0:
                # The cache was deleted under us (or a reopen failed): a new ledger
                # where the cache now is, seeded by a scan that sees every write so far.
                self._drop_descriptors()
                self._pending = 0
                fresh = self._open()  # OSError: still closed, the next update tries again
                if fresh and handles_delta == 0:
                    return self._last
            if not self._wait.acquire(self._fd):
                if scan is None and handles_delta == 0:
                    self._pending += delta
                busy = True
            else:
                busy = False
                try:
                    return self._update_locked(delta, scan, handles_delta)
                finally:
                    unlock(self._fd)
        if busy:
            self._busy()
        return max(0, self._last + self._pending)

    def _update_locked(self, delta: int, scan: tuple[int, int] | None, handles_delta: int) -> int:
        if not self._registered and self._register_locked():
            # the seeding scan saw every file this handle wrote, pending ones included
            self._pending = delta = 0
        record = self._read_locked()
        if record is None:  # damaged behind our back: rebuild from the disk,
            # which already holds whatever the caller is accounting for
            total = max(0, self._seed())
            self._write_locked(total, 1 + handles_delta)
            self._pending = 0
            self._last = total
            return total
        current = record[0] if scan is None else record[0] - scan[0] + scan[1]
        new = max(0, current + delta + self._pending)
        self._write_locked(new, record[1] + handles_delta)
        self._pending = 0
        self._last = new
        return new

    def add(self, delta: int) -> int:
        """Add ``delta`` (may be negative) and return the new total, never below 0."""
        return self._update(delta)

    def total(self) -> int:
        return self._update()

    def reconcile(self, total_at_scan: int, scanned: int) -> int:
        """Replace the part of the total that a scan measured with what it found.

        ``total_at_scan`` is the ledger total read just before scanning; deltas
        other writers added since are kept on top of ``scanned``. Dropped when the
        lock is busy (the next scan measures again).
        """
        return self._update(scan=(total_at_scan, scanned))

    def _drop_descriptors(self) -> None:
        for fd in (self._ufd, self._fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._ufd = -1

    def close(self) -> None:
        """Take this handle off the count and release the files. Idempotent. With the
        lock held elsewhere the count stays one high: the next lone opener rescans."""
        if self._closed:
            return
        self._closed = True
        if self._fd < 0:
            return
        if self._ufd >= 0 and self._registered:
            with contextlib.suppress(OSError):
                self._update(handles_delta=-1)
        self._drop_descriptors()

    def __del__(self) -> None:  # a handle dropped without close() is a clean exit too
        with contextlib.suppress(Exception):
            self.close()
