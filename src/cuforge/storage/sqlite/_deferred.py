"""Stores kept in memory while another process holds the database's write lock.

A store waits for SQLite's write lock at most ``wait_ms`` (0.25 s by default). When
another process holds it longer -- a long eviction under a cap, or a process that
holds ``BEGIN EXCLUSIVE`` for good (stopped, in a debugger) -- the row is kept here
instead of being dropped, and written with the next store that gets the lock, or at
``close()``. For ``backoff_s`` after a wait timed out, stores wait at most 10 ms,
so a holder that never lets go costs a compile one bound, not one per miss.

Bounded: at most ``max_bytes`` of payload and metadata are kept; a row past that is
dropped (the caller counts a write failure). The handle serves its own deferred rows
as hits; other processes see them once written. Forgotten in a forked child (the
parent's to write) and by ``clear``/deletion of their key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["DeferredStores", "Row", "batches"]

#: A row as ``SQL.put`` takes it: (rid, digest, crc, size, stored_ns, used_ns, meta, data).
Row = tuple[Any, ...]


class DeferredStores:
    """Rows not yet written, newest per row id, and the store wait's back-off."""

    __slots__ = ("_backoff_s", "_quiet_until", "bytes", "max_bytes", "rows", "wait_ms")

    def __init__(self, wait_ms: int, backoff_s: float, max_bytes: int) -> None:
        self.wait_ms = wait_ms
        self._backoff_s = backoff_s
        self.max_bytes = max_bytes
        self._quiet_until = 0.0
        self.rows: dict[int, Row] = {}
        self.bytes = 0

    def wait_now_ms(self) -> int:
        """How long this store may wait for the write lock: 10 ms while backing off."""
        if self._quiet_until and time.monotonic() < self._quiet_until:
            return min(10, self.wait_ms)
        return self.wait_ms

    def timed_out(self) -> None:
        self._quiet_until = time.monotonic() + self._backoff_s

    def keep(self, row: Row) -> bool:
        """Keep ``row`` for later; False when that would pass ``max_bytes``."""
        old = self.rows.pop(row[0], None)
        if old is not None:
            self.bytes -= old[3]
        if self.bytes + row[3] > self.max_bytes:
            return False
        self.rows[row[0]] = row
        self.bytes += row[3]
        return True

    def with_new(self, row: Row) -> list[Row]:
        """``row``, then every deferred row (but an older one of ``row``'s id): the
        store at hand is written first."""
        return [row] + [r for rid, r in self.rows.items() if rid != row[0]]

    def resume(self) -> None:
        """A store got through: end the back-off (rows still kept stay)."""
        self._quiet_until = 0.0

    def written(self) -> None:
        """They were written: forget them, end the back-off."""
        self.rows.clear()
        self.bytes = 0
        self._quiet_until = 0.0

    def lookup(self, rid: int, digest: bytes) -> Row | None:
        row = self.rows.get(rid)
        return row if row is not None and row[1] == digest else None

    def forget(self, rid: int) -> None:
        row = self.rows.pop(rid, None)
        if row is not None:
            self.bytes -= row[3]

    def clear(self) -> None:
        self.rows.clear()
        self.bytes = 0


def batches(rows: list[Row], room: int, cost: Callable[[int, int], int]) -> Iterator[list[Row]]:
    """``rows`` in runs whose WAL cost -- ``cost(rows, payload bytes)`` -- stays within
    ``room`` bytes (one row at least): one transaction each, so catching up on deferred
    rows never writes more to the WAL at once than the WAL's allowance has room for."""
    batch: list[Row] = []
    size = 0
    for row in rows:
        if batch and cost(len(batch) + 1, size + row[3]) > room:
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += row[3]
    if batch:
        yield batch
