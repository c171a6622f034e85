"""Cache statistics: a small value type every backend returns from ``stats()``.

Counters are plain integers. In-memory caches update them under their lock, so
they are exact; the file-stream hit path updates them without a lock, so under
heavy multi-threading an increment can rarely be lost (never invented).
"""

from __future__ import annotations

import struct

__all__ = ["CacheStats"]

_FIELDS = (
    "hits",
    "misses",
    "stores",
    "evictions",
    "integrity_failures",
    "write_failures",
    "bytes_read",
    "bytes_written",
)


class CacheStats:
    """Counters of one cache handle (or, summed, of every handle that shared a cache).

    ``integrity_failures`` counts entries found corrupt (truncated, empty, bit-flipped,
    or bound to another key) and removed; each is also a miss. ``write_failures``
    counts stores dropped because the backend could not write (full disk, read-only
    directory, ...); such a store is never counted in ``stores``.

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
        """Parse a record written by :meth:`to_record`; ``None`` if it is not one."""
        if len(data) != _RECORD.size:
            return None
        return cls(*_RECORD.unpack(data))


_RECORD = struct.Struct("<" + "Q" * len(_FIELDS))
RECORD_SIZE = _RECORD.size
