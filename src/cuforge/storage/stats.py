"""Cache statistics: a small value type every backend returns from ``stats()``.

Counters are plain integers. In-memory caches update them under their lock, so
they are exact; the file-stream hit path updates them without a lock, so under
heavy multi-threading an increment can rarely be lost (never invented).
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, fields

__all__ = ["CacheStats"]


@dataclass(slots=True)
class CacheStats:
    """Counters of one cache handle (or, summed, of every handle that shared a cache).

    ``integrity_failures`` counts entries found corrupt (truncated, empty, bit-flipped,
    or bound to another key) and removed; each is also a miss. ``write_failures``
    counts stores dropped because the backend could not write (full disk, read-only
    directory, ...); such a store is never counted in ``stores``.
    """

    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0
    integrity_failures: int = 0
    write_failures: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain ``{name: value}`` dict (stable key order)."""
        return asdict(self)

    def copy(self) -> CacheStats:
        return CacheStats(*self._values())

    def __add__(self, other: CacheStats) -> CacheStats:
        if not isinstance(other, CacheStats):
            return NotImplemented
        return CacheStats(*(a + b for a, b in zip(self._values(), other._values(), strict=False)))

    def _values(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    # Fixed-size record used by the file-stream backend to persist counters.
    def to_record(self) -> bytes:
        return _RECORD.pack(*(max(0, v) for v in self._values()))

    @classmethod
    def from_record(cls, data: bytes) -> CacheStats | None:
        """Parse a record written by :meth:`to_record`; ``None`` if it is not one."""
        if len(data) != _RECORD.size:
            return None
        return cls(*_RECORD.unpack(data))


_RECORD = struct.Struct("<" + "Q" * len(fields(CacheStats)))
RECORD_SIZE = _RECORD.size
