"""The SQLite cache's rows by entry id: listing, checking, reading and removing them
(``cuforge cache ls / verify / show / prune``).

A row is found by its row id, the first 8 bytes of its key digest. A listing names
each row by its row id's 8 bytes followed by the rest of the stored digest, so every
listed id finds its row again -- also when the stored digest is damaged (then the
listed id is the key's own id whenever the damage lies in the first 8 bytes, and
otherwise the damaged digest, which does not verify). The row found for an id
answers for it when it holds that id, or when it does not verify as the row of the
digest it holds (damage: it cannot be shown to belong to another key); it is then
reported damaged and can be removed, and is never read. A row that verifies under
another digest is another key's, and the id has no entry. Listing reads pages of 256
rows, each in its own statement, so no read transaction outlives a page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .._integrity import key_seed
from ..entry import CacheEntry, EntryInfo
from ._conn import immediate
from ._schema import SQL, rid_of, row_check

__all__ = ["digest_of_id", "find_row", "list_rows", "read_row", "remove_row"]

_MIN_RID = -(1 << 63)
_PAGE = 256
Row = tuple[Any, ...]  # (digest, crc, meta, data), as SQL.get reads it
#: A row found by ``find_row``: the row and what is wrong with it (None: it verifies).
Found = tuple[Row, str | None]


def listed_id(rid: int, digest: Any) -> str:
    """The id a listing gives the row ``rid`` holding ``digest`` (see the module)."""
    tail = digest[8:32] if isinstance(digest, bytes) else b""
    return (rid.to_bytes(8, "little", signed=True) + tail.ljust(24, b"\0")).hex()


def list_rows(conn: Callable[[], Any]) -> Iterator[EntryInfo]:
    """Every row in row id order, read ``_PAGE`` at a time on ``conn()``."""
    query, bound = SQL.list_first, _MIN_RID
    while True:
        rows = conn().execute(query, (bound,)).fetchall()
        for rid, digest, size, stored_ns, used_ns, meta in rows:
            yield EntryInfo(listed_id(rid, digest), size, stored_ns, used_ns, meta)
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


def _verifies(kd: Any, row: Row) -> bool:
    """Whether ``row`` passes its check as the row of key digest ``kd``."""
    _, crc, meta, data = row
    if not (type(kd) is bytes and type(meta) is bytes and type(data) is bytes):
        return False  # a column of another type is damage too
    return bool(row_check(key_seed(kd), data, meta) == crc)


def find_row(conn: Any, kd: bytes) -> Found | None:
    """The row that answers for key digest ``kd`` and its problem; None: no entry."""
    rid = rid_of(kd)
    rows = conn.execute(SQL.get, (rid,)).fetchall()
    if not rows:
        return None
    row = tuple(rows[0])
    held = row[0]
    if held == kd:
        ok = _verifies(kd, row)
        return (
            row,
            None if ok else "checksum mismatch (payload, metadata or stored key digest damaged)",
        )
    if type(held) is bytes and len(held) == 32 and rid_of(held) == rid and _verifies(held, row):
        return None  # another key's intact row (its digest shares our first 8 bytes)
    return row, "stored key digest damaged (the row does not verify under the id it holds)"


def read_row(found: Found) -> CacheEntry | None:
    """The entry of a row found by ``find_row`` when it verifies, else None."""
    row, problem = found
    return None if problem else CacheEntry(row[3], row[2])


def remove_row(conn: Any, kd: bytes, found: Found) -> bool:
    """Delete the row ``find_row`` found for ``kd``; whether a row went. A damaged
    row goes only if no writer has replaced it since it was read."""
    row = found[0]
    if row[0] == kd:
        cur = immediate(conn, SQL.delete_key, (rid_of(kd), kd))
    else:
        cur = immediate(conn, SQL.drop_exact, (rid_of(kd), row[0], row[1]))
    removed: int = cur.rowcount
    return removed > 0
