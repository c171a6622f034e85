"""The SQLite cache's rows by entry id: listing, checking, reading and removing them
(``cuforge cache ls / verify / show / prune``).

A row is found by its id's first 8 bytes (the row id) and must hold that id as its
key digest; its check is the key-seeded CRC-32 of ``_sqlite_schema.row_check``.
Listing reads pages of 256 rows, each in its own statement, so no read transaction
stays open between pages (a listing never holds the WAL back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._integrity import key_seed
from ._sqlite_schema import SQL, rid_of, row_check
from .entry import CacheEntry, EntryInfo

__all__ = ["check_row", "digest_of_id", "find_row", "list_rows", "read_row", "remove_row"]

_MIN_RID = -(1 << 63)
_PAGE = 256
Row = tuple[Any, ...]  # (digest, crc, meta, data), as SQL.get reads it


def list_rows(conn: Callable[[], Any]) -> Iterator[EntryInfo]:
    """Every row in row id order, read ``_PAGE`` at a time on ``conn()``."""
    query, bound = SQL.list_first, _MIN_RID
    while True:
        rows = conn().execute(query, (bound,)).fetchall()
        for _, digest, size, stored_ns, used_ns, meta in rows:
            yield EntryInfo(bytes(digest).hex(), size, stored_ns, used_ns, meta)
        if len(rows) < _PAGE:
            return
        query, bound = SQL.list_next, rows[-1][0]


def digest_of_id(entry_id: str) -> bytes | None:
    """The key digest an entry id names; None for anything but 64 lower-case hex digits."""
    if not (isinstance(entry_id, str) and len(entry_id) == 64):
        return None
    try:
        kd = bytes.fromhex(entry_id)
    except ValueError:
        return None
    return kd if entry_id == kd.hex() else None  # upper case is not an id


def find_row(conn: Any, kd: bytes) -> Row | None:
    """The row holding key digest ``kd``, or None."""
    rows = conn.execute(SQL.get, (rid_of(kd),)).fetchall()
    return tuple(rows[0]) if rows and rows[0][0] == kd else None


def check_row(kd: bytes, row: Row) -> str | None:
    """What is wrong with ``row`` of key digest ``kd``; None when it verifies."""
    _, crc, meta, data = row
    if row_check(key_seed(kd), data, meta) != crc:
        return "checksum mismatch (payload or metadata damaged)"
    return None


def read_row(kd: bytes, row: Row) -> CacheEntry | None:
    """``row`` as an entry when it verifies, else None."""
    return None if check_row(kd, row) else CacheEntry(row[3], row[2])


def remove_row(conn: Any, kd: bytes, immediate: Callable[..., Any]) -> bool:
    """Delete the row of ``kd`` (in ``immediate``'s write transaction); whether it was there."""
    cur = immediate(conn, SQL.delete_key, (rid_of(kd), kd))
    removed: int = cur.rowcount
    return removed > 0
