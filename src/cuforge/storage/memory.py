"""In-process LRU program cache bounded by bytes: the storage core over a dict.

The driver keeps entries in insertion-ordered dict under one lock; every operation
is O(1). What a cache handle does besides (keys, counters, refusals, per-key locks)
is the core's (``storage.handle``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator

from .driver import Driver
from .entry import CacheEntry, EntryInfo
from .handle import DriverCache
from .outcome import STORED_OUTCOME, TOO_LARGE, StoreOutcome
from .stats import CacheStats
from .units import check_max_size

__all__ = ["InMemoryProgramCache"]


class _Slot:
    __slots__ = ("entry", "size", "stored_ns", "used_ns")

    def __init__(self, entry: CacheEntry) -> None:
        self.entry = entry
        self.size = len(entry.data) + len(entry.meta)
        self.stored_ns = self.used_ns = time.time_ns()


class MemoryDriver(Driver):
    """Entries by key digest, least recently used first, at most ``cap`` bytes."""

    label = "cuforge in-memory program cache"
    in_memory = True

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self._slots: OrderedDict[bytes, _Slot] = OrderedDict()
        self.total = 0
        self._mutex = threading.RLock()

    def read(self, kd: bytes) -> CacheEntry | None:
        with self._mutex:
            slot = self._slots.get(kd)
            if slot is None:
                return None
            self._slots.move_to_end(kd)
            slot.used_ns = time.time_ns()
            return slot.entry

    def peek(self, kd: bytes) -> CacheEntry | None:
        with self._mutex:
            slot = self._slots.get(kd)
            return None if slot is None else slot.entry

    def write(self, kd: bytes, data: bytes, meta: bytes) -> StoreOutcome:
        slot = _Slot(CacheEntry(data, meta))
        if self.cap is not None and slot.size > self.cap:
            return StoreOutcome(TOO_LARGE, f"{slot.size} bytes, cap {self.cap}")
        evicted = 0
        with self._mutex:
            old = self._slots.pop(kd, None)
            if old is not None:
                self.total -= old.size
            self._slots[kd] = slot
            self.total += slot.size
            while self.cap is not None and self.total > self.cap and self._slots:
                _, gone = self._slots.popitem(last=False)
                self.total -= gone.size
                evicted += 1
        if evicted:
            self.reports.evicted(evicted)
        return STORED_OUTCOME

    def remove(self, kd: bytes) -> bool:
        with self._mutex:
            old = self._slots.pop(kd, None)
            if old is None:
                return False
            self.total -= old.size
            return True

    def scan(self) -> Iterator[EntryInfo]:
        with self._mutex:
            items = list(self._slots.items())
        for kd, s in items:
            yield EntryInfo(kd.hex(), s.size, s.stored_ns, s.used_ns, s.entry.meta)

    def count(self) -> int:
        with self._mutex:
            return len(self._slots)

    def size(self) -> int:
        return self.total

    def clear(self) -> None:
        with self._mutex:
            self._slots.clear()
            self.total = 0


class InMemoryProgramCache(DriverCache):
    """Thread-safe, single-process LRU cache; every operation is O(1).

    ``max_size_bytes`` (> 0, or None for unbounded) caps the sum of stored
    payload and metadata sizes; storing past it evicts least-recently-used
    entries (a read or a write makes an entry most recent). A value larger than
    the cap is refused: nothing is evicted for it, an entry already under its key
    stays, and it counts in ``write_failures`` (``events.TOO_LARGE``). Entries are
    immutable ``bytes`` objects, so they cannot be corrupted in place (``check_entry``
    finds nothing wrong); nothing is persisted; ``lock()`` serialises the threads of
    this process; ``close()`` releases nothing, and the cache stays usable.
    """

    _driver: MemoryDriver

    def __init__(self, max_size_bytes: int | None = None) -> None:
        super().__init__(MemoryDriver(check_max_size(max_size_bytes)))

    def zero_stats(self) -> None:
        """Reset this cache's counters (they live in this process only)."""
        self._stats = CacheStats()

    def close(self) -> None:
        """Nothing to release: the entries stay, and so does the cache."""

    def __repr__(self) -> str:
        return (
            f"InMemoryProgramCache(max_size_bytes={self.max_size_bytes}, "
            f"entries={self._driver.count()}, size_bytes={self.size_bytes})"
        )
