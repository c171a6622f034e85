"""In-process LRU program cache bounded by bytes."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator

from . import events
from ._values import coerce_key, coerce_value
from .base import CacheKey, CacheValue, ProgramCacheResource, check_meta
from .entry import CacheEntry, EntryInfo, entry_id
from .stats import CacheStats

__all__ = ["InMemoryProgramCache"]


def check_max_size(max_size_bytes: int | None) -> int | None:
    """Validate a ``max_size_bytes`` argument: a positive int or None."""
    if max_size_bytes is None:
        return None
    if isinstance(max_size_bytes, bool) or not isinstance(max_size_bytes, int):
        raise TypeError(
            f"max_size_bytes must be a positive int or None, got {type(max_size_bytes).__name__}"
        )
    if max_size_bytes <= 0:
        raise ValueError(f"max_size_bytes must be > 0 or None, got {max_size_bytes}")
    return max_size_bytes


class _Slot:
    __slots__ = ("data", "meta", "size", "stored_ns", "used_ns")

    def __init__(self, data: bytes, meta: bytes) -> None:
        self.data = data
        self.meta = meta
        self.size = len(data) + len(meta)
        self.stored_ns = self.used_ns = time.time_ns()


class InMemoryProgramCache(ProgramCacheResource):
    """Thread-safe, single-process LRU cache; every operation is O(1).

    ``max_size_bytes`` (> 0, or None for unbounded) caps the sum of stored
    payload and metadata sizes; storing past it evicts least-recently-used
    entries (a read or a write makes an entry most recent). A value larger than
    the cap is refused: nothing is evicted for it, an entry already under its key
    stays, and it counts in ``write_failures`` (``events.TOO_LARGE``). Entries are
    immutable ``bytes`` objects, so they cannot be corrupted in place; nothing is
    persisted and ``lock()`` serialises the threads of this process.
    """

    def __init__(self, max_size_bytes: int | None = None) -> None:
        super().__init__()
        self._max = check_max_size(max_size_bytes)
        self._entries: OrderedDict[bytes, _Slot] = OrderedDict()
        self._total = 0
        self._mutex = threading.RLock()

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    def __repr__(self) -> str:
        return (
            f"InMemoryProgramCache(max_size_bytes={self._max}, entries={len(self._entries)}, "
            f"size_bytes={self._total})"
        )

    @property
    def size_bytes(self) -> int:
        """Sum of the stored payload and metadata sizes."""
        return self._total

    def _find(self, key: CacheKey) -> _Slot | None:
        k = coerce_key(key)
        with self._mutex:
            slot = self._entries.get(k)
            if slot is None:
                self._stats.misses += 1
                return None
            self._entries.move_to_end(k)
            slot.used_ns = time.time_ns()
            self._stats.hits += 1
            self._stats.bytes_read += len(slot.data)
            return slot

    def __getitem__(self, key: CacheKey) -> bytes:
        slot = self._find(key)
        if slot is None:
            raise KeyError(key)
        return slot.data

    def get(self, key: CacheKey, default: bytes | None = None) -> bytes | None:
        slot = self._find(key)
        return default if slot is None else slot.data

    def get_entry(self, key: CacheKey) -> CacheEntry | None:
        slot = self._find(key)
        return None if slot is None else CacheEntry(slot.data, slot.meta)

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.set_entry(key, value)

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> None:
        k = coerce_key(key)
        data = coerce_value(value, "InMemoryProgramCache.__setitem__")
        slot = _Slot(data, check_meta(meta))
        if self._max is not None and slot.size > self._max:
            self._refuse(slot.size)
            return
        with self._mutex:
            old = self._entries.pop(k, None)
            if old is not None:
                self._total -= old.size
            self._entries[k] = slot
            self._total += slot.size
            self._stats.stores += 1
            self._stats.bytes_written += len(data)
            if self._max is not None:
                while self._total > self._max and self._entries:
                    _, evicted = self._entries.popitem(last=False)
                    self._total -= evicted.size
                    self._stats.evictions += 1

    def _refuse(self, size: int) -> None:
        """A value larger than the cap: dropped before anything is evicted for it."""
        with self._mutex:
            self._stats.write_failures += 1
        events.note_dropped(events.TOO_LARGE, f"{size} bytes, cap {self._max}")
        events.fail_open(
            self,
            events.TOO_LARGE,
            "cuforge in-memory program cache: a value of %d bytes is larger than the "
            "cache's size cap (%d bytes); not stored, nothing evicted for it; counted in "
            "stats().write_failures",
            size,
            self._max,
        )

    def __delitem__(self, key: CacheKey) -> None:
        k = coerce_key(key)
        with self._mutex:
            old = self._entries.pop(k, None)
            if old is None:
                raise KeyError(key)
            self._total -= old.size

    def __len__(self) -> int:
        with self._mutex:
            return len(self._entries)

    def clear(self) -> None:
        with self._mutex:
            self._entries.clear()
            self._total = 0

    def stats(self) -> CacheStats:
        with self._mutex:
            return self._stats.copy()

    def zero_stats(self) -> None:
        """Reset this cache's counters (they live in this process only)."""
        with self._mutex:
            self._stats = CacheStats()

    # -- listing and maintenance ---------------------------------------------------
    def _key_of(self, eid: str) -> bytes | None:
        with self._mutex:
            return next((k for k in self._entries if entry_id(k) == eid), None)

    def iter_entries(self) -> Iterator[EntryInfo]:
        with self._mutex:
            items = list(self._entries.items())
        for k, s in items:
            yield EntryInfo(entry_id(k), s.size, s.stored_ns, s.used_ns, s.meta)

    def check_entry(self, entry_id: str) -> str | None:
        if self._key_of(entry_id) is None:
            raise KeyError(entry_id)
        return None  # immutable bytes in this process: nothing can damage them

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        k = self._key_of(entry_id)
        with self._mutex:
            slot = None if k is None else self._entries.get(k)
            return None if slot is None else CacheEntry(slot.data, slot.meta)

    def remove_entry(self, entry_id: str) -> bool:
        k = self._key_of(entry_id)
        with self._mutex:
            old = None if k is None else self._entries.pop(k, None)
            if old is None:
                return False
            self._total -= old.size
            return True
