"""What a SQLite cache takes on disk before it holds any entry, and so the smallest
cap it can keep: the floor under ``max_size``.

A cap is shared out (``_space``): the WAL gets an allowance (16 KiB at the least),
the WAL index at least one 32 KiB block, and the database file the rest. The
database file itself is never smaller than an empty cache database
(:data:`EMPTY_PAGES` pages: the schema page, the pointer map of incremental vacuum,
the roots of the entries table, its index and the state table). A cap below
:data:`SMALLEST_CAP` leaves no page for an entry: every store would be evicted, or
refused, so such a cap is refused where it is given (:func:`cap_problem`: the
``sqlite://`` URL's ``max_size``, ``--max-size``, a settings file, the constructor).

Imports nothing: checking a ``sqlite://`` URL (``_url``) costs this module only.
"""

from __future__ import annotations

__all__ = [
    "EMPTY_BYTES",
    "EMPTY_PAGES",
    "INDEX_BLOCK",
    "PAGE",
    "SMALLEST_CAP",
    "WAL_MIN",
    "cap_problem",
    "row_bytes",
]

PAGE = 4096  # the page size every cache database is created with (_schema)
WAL_MIN = 16384  # the WAL's smallest allowance
INDEX_BLOCK = 32768  # the WAL index grows by 32 KiB blocks
#: Pages of an empty cache database (``tests/test_storage_sqlite.py`` measures it).
EMPTY_PAGES = 5
EMPTY_BYTES = EMPTY_PAGES * PAGE
_ROW_HEADER = 96  # a row's columns besides meta and data, and its record header, at most
#: The smallest cap: the WAL's allowance, its index, an empty database and one page
#: for entries (72 KiB). Below it no entry of any size fits.
SMALLEST_CAP = WAL_MIN + INDEX_BLOCK + EMPTY_BYTES + PAGE


def row_bytes(size: int) -> int:
    """Bytes of pages one row of ``size`` stored bytes (payload + metadata) may add to a
    database, at most: its record over pages of 4092 usable bytes (the overflow chain;
    a lone row's leaf is the table's root), and a pointer-map page per 512 of them.
    Measured on cache databases: a row of 130,000 bytes adds 31 pages, this says 32."""
    pages = -(-(size + _ROW_HEADER) // (PAGE - 4))
    return (pages + pages // 512) * PAGE


def cap_problem(cap: int) -> str | None:
    """Why ``cap`` (bytes) cannot be a SQLite cache's cap, or None when it can: what
    follows the name of the setting in a one-line error."""
    if cap >= SMALLEST_CAP:
        return None
    return (
        f"{_kib(cap)} is below the smallest cap of a SQLite cache, {_kib(SMALLEST_CAP)}: "
        f"an empty database, the WAL's allowance and its index take "
        f"{_kib(SMALLEST_CAP - PAGE)} before any entry"
    )


def _kib(n: int) -> str:
    return f"{n} bytes" if n % 1024 else f"{n // 1024} KiB"
