"""Cache statistics: a small value type every backend returns from ``stats()``.

Counters are plain integers, written by the storage core (``storage.handle``) and
by the composites that own theirs (tiers, lazy levels), without a lock: under heavy
multi-threading an increment can rarely be lost (never invented).
"""

from __future__ import annotations

import struct

__all__ = ["CacheStats"]

# Only ever appended: persisted records of an older layout read with the new fields
# at zero (see CacheStats.from_record).
_FIELDS = (
    "hits",
    "misses",
    "stores",
    "evictions",
    "integrity_failures",
    "write_failures",
    "bytes_read",
    "bytes_written",
    "signature_failures",
    "read_failures",
    "lock_timeouts",
    "warm_compiles",
)


class CacheStats:
    """Counters of one cache handle (or, summed, of every handle that shared a cache).

    ``integrity_failures`` counts entries found corrupt (truncated, empty, bit-flipped,
    or bound to another key) and removed; each is also a miss. ``write_failures``
    counts stores dropped because the backend could not write (full disk, read-only
    directory, an unreachable server, ...) or would not (a value larger than the
    cache's size cap, refused before anything is evicted for it); such a store is
    never counted in ``stores``. ``signature_failures`` counts entries rejected by a signed cache
    (unsigned, forged, or signed with another secret); each is also a miss.
    ``read_failures`` counts lookups that could not consult the backend (a server
    that is down, slow, or being backed off from); each is also a miss.
    ``lock_timeouts`` counts cache operations that gave up waiting for a lock another
    process held past the cache's bound (a fraction of a second): the store was
    skipped, or its size accounting or an eviction deferred.
    ``warm_compiles`` counts compiles made through the cache by a process that had
    declared itself warm (``cuforge.mark_warm()``; see ``cuforge._warm``).

    Fields are only ever appended: persisted records of an older layout read with
    the new fields at zero (see :meth:`from_record`).

    A plain slotted class rather than a dataclass: ``dataclasses`` imports
    ``inspect``, several milliseconds of a cold process that only wants a hit.
    """

    __slots__ = _FIELDS
    hits: int
    misses: int
    stores: int
    evictions: int
    integrity_failures: int
    write_failures: int
    bytes_read: int
    bytes_written: int
    signature_failures: int
    read_failures: int
    lock_timeouts: int
    warm_compiles: int

    def __init__(self, *values: int, **named: int) -> None:
        if len(values) > len(_FIELDS):
            raise TypeError(f"CacheStats takes at most {len(_FIELDS)} counters")
        given = dict(zip(_FIELDS, values, strict=False))
        for name, value in named.items():
            if name not in _FIELDS or name in given:
                raise TypeError(f"CacheStats: unexpected or repeated counter {name!r}")
            given[name] = value
        for name in _FIELDS:
            setattr(self, name, given.get(name, 0))

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain ``{name: value}`` dict (stable key order)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def copy(self) -> CacheStats:
        return CacheStats(*self._values())

    def __sub__(self, other: CacheStats) -> CacheStats:
        if not isinstance(other, CacheStats):
            return NotImplemented
        return CacheStats(*(a - b for a, b in zip(self._values(), other._values(), strict=True)))

    def __add__(self, other: CacheStats) -> CacheStats:
        if not isinstance(other, CacheStats):
            return NotImplemented
        return CacheStats(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheStats):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it was

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)}" for name in _FIELDS)
        return f"CacheStats({inner})"

    def _values(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    # Fixed-size record used by the file-stream backend to persist counters.
    def to_record(self) -> bytes:
        return _RECORD.pack(*(max(0, v) for v in self._values()))

    @classmethod
    def from_record(cls, data: bytes) -> CacheStats | None:
        """Parse a record written by :meth:`to_record` of this or another version.

        A record is a run of u64 counters in field order. An older, shorter record
        (at least the original eight counters) leaves the newer fields at zero; a
        newer, longer one has its extra counters ignored. ``None`` if it is not a
        record at all.
        """
        size = len(data)
        if size % 8 or not _MIN_RECORD_SIZE <= size <= MAX_RECORD_SIZE:
            return None
        values = struct.unpack(f"<{size // 8}Q", data)
        return cls(*values[: len(_FIELDS)])


_RECORD = struct.Struct("<" + "Q" * len(_FIELDS))
RECORD_SIZE = _RECORD.size
_MIN_RECORD_SIZE = 8 * 8  # the first layout: hits .. bytes_written
#: Read this many bytes to get any record, of this or a later layout.
MAX_RECORD_SIZE = 64 * 8
