"""Repeat hits of a file-stream handle from memory, and its access-time bumps.

A handle remembers the bytes it verified for an entry together with the payload
file's fingerprint (inode, size, mtime). A repeat hit serves them after one
``stat`` shows the same file still stands at the entry's path, and only while no
access-time bump is due (a bump rereads and reverifies, so every entry is fully
checked at least once per interval). Replaced, deleted or resized files never
match, so memory never serves what the disk no longer holds. :meth:`HitMemo.read`
is the driver's read: the memo first, else ``slow`` (the verified read of the pair).

Bounded: at most ``MAX_ENTRIES`` entries and ``MAX_BYTES`` bytes (payload +
metadata + a per-entry overhead) are remembered, and at most ``MAX_ENTRIES``
bump times; past a bound the table starts over.
"""

from __future__ import annotations

import contextlib
import os
import time

from .._fsutil import UTIME_BY_FD, Fingerprint, fingerprint
from ..entry import CacheEntry

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..driver import Found
    from ._pairread import PairNames

__all__ = ["HitMemo", "LookingMemo"]

_OVERHEAD = 256  # dict slot, key string, tuples: what a tiny entry costs beyond its bytes


class HitMemo:
    """See the module docstring. Not thread-safe by itself: a lost update costs a
    reread, never a wrong answer (every served entry passes the fingerprint check)."""

    MAX_ENTRIES = 4096
    MAX_BYTES = 32 << 20

    def __init__(self, interval_ns: int, slow: Callable[[PairNames], Found]) -> None:
        self.interval_ns = interval_ns
        self._slow = slow
        self._entries: dict[str, tuple[Fingerprint, CacheEntry]] = {}
        self._bytes = 0
        self._bumped: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def read(self, names: PairNames) -> Found:
        """The remembered entry if the same file still stands at its path and no bump
        is due; else the verified read of the pair (``slow``). The hit path of a
        FileStream cache: one dict probe, one clock read, one ``stat``."""
        path = names.payload
        memo = self._entries.get(path)
        if memo is not None:
            last = self._bumped.get(path)
            if last is not None and time.monotonic_ns() - last < self.interval_ns:
                try:
                    st = os.stat(path)
                    fp = memo[0]  # compared field by field: no Fingerprint built per hit
                    if (
                        st.st_ino == fp.ino
                        and st.st_size == fp.size
                        and st.st_mtime_ns == fp.mtime_ns
                    ):
                        return memo[1]
                except OSError:
                    pass
                self.forget(path)
        return self._slow(names)

    def remember(self, path: str, fp: Fingerprint, entry: CacheEntry) -> None:
        size = len(entry.data) + len(entry.meta) + _OVERHEAD
        if size > self.MAX_BYTES // 8:
            return
        self.forget(path)
        if self._bytes + size > self.MAX_BYTES or len(self._entries) >= self.MAX_ENTRIES:
            self.clear()
        self._entries[path] = (fp, entry)
        self._bytes += size

    def forget(self, path: str) -> None:
        old = self._entries.pop(path, None)
        if old is not None:
            self._bytes -= len(old[1].data) + len(old[1].meta) + _OVERHEAD

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def bump_atime(self, fd: int, path: str) -> os.stat_result | None:
        """Bump the entry's atime at most once per interval per entry and process (a
        hit in a tight loop costs no extra syscall; LRU order stays exact to the
        interval). Returns the payload's stat when it made one, for ``remember``."""
        now = time.monotonic_ns()
        last = self._bumped.get(path)
        if last is not None and now - last < self.interval_ns:
            return None
        if len(self._bumped) >= self.MAX_ENTRIES:
            self._bumped.clear()
        self._bumped[path] = now
        # Explicit times keep mtime, so stat guards still recognise the file; by fd,
        # the file we read is the one stamped even if a writer replaced the path.
        try:
            st = os.fstat(fd)
            if UTIME_BY_FD:
                os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
            elif fingerprint(os.stat(path)) == fingerprint(st):
                os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
            else:
                return None  # replaced under us: nothing stamped, nothing to remember
            return st
        except PermissionError:
            # Not the file's owner (group-shared cache): only "now" is allowed, which
            # moves mtime too, so the memo would never match: remember nothing.
            with contextlib.suppress(OSError):
                os.utime(fd if UTIME_BY_FD else path)
        except OSError:
            pass
        return None


class LookingMemo(HitMemo):
    """A read-only handle's memo: the same repeat hits, no access-time stamp (looking
    at a cache -- ``cuforge cache explain``, a ``?ro`` level -- writes nothing to it;
    the entry is still reverified once per interval)."""

    def bump_atime(self, fd: int, path: str) -> os.stat_result | None:
        now = time.monotonic_ns()
        last = self._bumped.get(path)
        if last is not None and now - last < self.interval_ns:
            return None
        if len(self._bumped) >= self.MAX_ENTRIES:
            self._bumped.clear()
        self._bumped[path] = now
        try:
            return os.fstat(fd)
        except OSError:
            return None
