"""In-process LRU program cache bounded by bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ._values import coerce_key, coerce_value
from .base import CacheKey, CacheValue, ProgramCacheResource
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


class InMemoryProgramCache(ProgramCacheResource):
    """Thread-safe, single-process LRU cache; every operation is O(1).

    ``max_size_bytes`` (> 0, or None for unbounded) caps the sum of stored value
    sizes; storing past it evicts least-recently-used entries (a read or a write
    makes an entry most recent). A value larger than the cap is not kept (counted
    as a store and an eviction). Entries are immutable ``bytes`` objects, so they
    cannot be corrupted in place; nothing is persisted and ``lock()`` serialises
    the threads of this process.
    """

    def __init__(self, max_size_bytes: int | None = None) -> None:
        super().__init__()
        self._max = check_max_size(max_size_bytes)
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._total = 0
        self._mutex = threading.RLock()

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    @property
    def size_bytes(self) -> int:
        """Sum of the stored value sizes."""
        return self._total

    def __getitem__(self, key: CacheKey) -> bytes:
        k = coerce_key(key)
        with self._mutex:
            value = self._entries.get(k)
            if value is None:
                self._stats.misses += 1
                raise KeyError(key)
            self._entries.move_to_end(k)
            self._stats.hits += 1
            self._stats.bytes_read += len(value)
            return value

    def get(self, key: CacheKey, default: bytes | None = None) -> bytes | None:
        k = coerce_key(key)
        with self._mutex:
            value = self._entries.get(k)
            if value is None:
                self._stats.misses += 1
                return default
            self._entries.move_to_end(k)
            self._stats.hits += 1
            self._stats.bytes_read += len(value)
            return value

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        k = coerce_key(key)
        data = coerce_value(value, "InMemoryProgramCache.__setitem__")
        with self._mutex:
            old = self._entries.pop(k, None)
            if old is not None:
                self._total -= len(old)
            self._entries[k] = data
            self._total += len(data)
            self._stats.stores += 1
            self._stats.bytes_written += len(data)
            if self._max is not None:
                while self._total > self._max and self._entries:
                    _, evicted = self._entries.popitem(last=False)
                    self._total -= len(evicted)
                    self._stats.evictions += 1

    def __delitem__(self, key: CacheKey) -> None:
        k = coerce_key(key)
        with self._mutex:
            old = self._entries.pop(k, None)
            if old is None:
                raise KeyError(key)
            self._total -= len(old)

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
