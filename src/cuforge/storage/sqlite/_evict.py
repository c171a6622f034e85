"""Eviction for the SQLite cache: least-recently-used rows out, pages back to the disk.

Deciding needs no scan: the pages in use come from two pragmas and the stored bytes
from the running total the triggers keep. Choosing walks the ``used_ns`` index from
the oldest row and stops as soon as enough is chosen. Deleted rows free pages inside
the file; ``incremental_vacuum`` hands them back (truncating the database as the WAL
is folded in) in steps, each on a WAL just folded in.

A last use later than the clock's now (written by a host whose clock was ahead, or
a cache copied from one) is not believed: such rows go first, ahead of every row
with a believable time -- otherwise they would outrank every new store for as long
as the skew lasts, and each new entry would be the one evicted. A hit re-stamps such
a row with its real time (``SQL.touch``).

Eviction never takes more than the cap asks: it stops at the low-water mark, and the
most recently used row goes only when it alone no longer fits the database's share
(:func:`evict_down`) -- so the row a store has just written, which fits alone
(``_space.Budget.fits_alone``), is never evicted by its own handle.

Row deletes go through ``ownership.delete_owned`` like every destructive operation;
their proof is :func:`row_of_our_database`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import ownership
from ._conn import committed
from ._floor import EMPTY_BYTES

__all__ = [
    "checkpoint",
    "delete_all",
    "evict_down",
    "evict_rows",
    "pages_in_use",
    "row_of_our_database",
    "shrink_to",
    "vacuum",
]


def pages_in_use(conn: Any) -> int:
    """Database pages holding data (all pages less the free list)."""
    pages: int = conn.execute("PRAGMA page_count").fetchall()[0][0]
    free: int = conn.execute("PRAGMA freelist_count").fetchall()[0][0]
    return pages - free


def row_of_our_database(_rid: object) -> bool:
    """The ownership proof of a row: every row of ``cuforge_entries`` is the cache's own
    by construction -- a handle works on a database only after proving it ours (its
    application id, or cuforge's tables in a legacy cache; ``_open``), and only cuforge
    writes that table. The file-level operations (moving a damaged file aside) are the
    ones that need a proof read from the file."""
    return True


_DELETE = "DELETE FROM cuforge_entries WHERE rid = ?"


def _delete_rows(conn: Any, where: str, rids: list[int]) -> None:
    """Delete the rows ``rids`` through the ownership gate (in the caller's transaction)."""

    def remove(own: list[int]) -> int:
        conn.executemany(_DELETE, [(rid,) for rid in own])
        return len(own)

    ownership.delete_owned(rids, row_of_our_database, remove, where=where)


#: Believed last uses are at or before now; later ones are evicted first (see module).
_OLDEST_FIRST = (
    "SELECT rid, size FROM cuforge_entries WHERE used_ns > ? ORDER BY used_ns",
    "SELECT rid, size FROM cuforge_entries WHERE used_ns <= ? ORDER BY used_ns",
)


def _choose(conn: Any, need: float, limit: int) -> list[int]:
    """Row ids to evict, least recently used first (a last use in the future first of
    all), until their stored bytes reach ``need`` or there are ``limit`` of them."""
    now = time.time_ns()  # under the write lock: every believable stamp is older
    victims: list[int] = []
    freed = 0
    for sql in _OLDEST_FIRST:
        cur = conn.execute(sql, (now,))
        try:
            while freed < need and len(victims) < limit:
                batch = cur.fetchmany(256)
                if not batch:
                    break
                for rid, size in batch:
                    victims.append(rid)
                    freed += size
                    if freed >= need or len(victims) >= limit:
                        break
        finally:
            cur.close()
        if freed >= need or len(victims) >= limit:
            break
    return victims


#: Starts a write transaction on a connection (``SQLiteProgramCache._begin``: BEGIN
#: IMMEDIATE, folding the WAL in first when it is past its fold point).
Begin = Callable[[Any], object]


def evict_rows(
    conn: Any, room: float, page: int, limit: int, begin: Begin, keep: int = 0
) -> list[int]:
    """Delete the least recently used rows until the pages in use would fit ``room``
    bytes, at most ``limit`` of them, and never the ``keep`` most recently used; the
    row ids deleted. One write transaction.

    The pages the rows take are the pages in use less the empty database's
    (``_floor``); a stored byte costs that over the stored bytes, so the rows chosen
    are those whose stored bytes free the excess at that rate. Row ids are key
    digests, so old rows sit on unrelated pages and each one deleted writes about a
    page to the WAL: ``limit`` keeps that within the WAL budget."""
    begin(conn)
    with committed(conn):
        used = pages_in_use(conn) * page
        state = conn.execute("SELECT entries, total_bytes FROM cuforge_state").fetchall()
        entries, total = state[0]
        victims: list[int] = []
        limit = min(limit, entries - keep)
        if used > room and total > 0 and limit > 0:
            rows = max(used - EMPTY_BYTES, 1)
            victims = _choose(conn, total * min(1.0, (used - room) / rows), limit)
            _delete_rows(conn, "eviction", victims)
    return victims


def vacuum(conn: Any, pages: int, step: int, timeout: float) -> None:
    """Hand up to ``pages`` free pages back to the file system, ``step`` at a time,
    each step on a WAL just folded in (a checkpoint first): moving pages writes them
    (and their parents) to the WAL, so one big step would swell the WAL by as much
    as it frees, and steps piled on a WAL a reader keeps from being folded would
    take it past its allowance. Stops early when a checkpoint cannot complete (the
    free pages are then reused by later writes)."""
    free = conn.execute("PRAGMA freelist_count").fetchall()[0][0]
    while pages > 0 and free > 0:
        n = min(max(step, 1), pages)  # incremental_vacuum(0) would free every page at once
        if not checkpoint(conn, timeout):
            return
        # executescript steps the pragma to completion; execute() would free one page.
        conn.executescript(f"PRAGMA incremental_vacuum({n})")
        left = conn.execute("PRAGMA freelist_count").fetchall()[0][0]
        if left >= free:
            return
        pages -= free - left
        free = left


def checkpoint(conn: Any, timeout: float) -> bool:
    """Fold the WAL into the database and empty its file (TRUNCATE), so that the
    file's size is never more than what the WAL holds (``_space`` decides by it);
    whether that completed within ``timeout`` seconds.

    Each try waits for nobody (busy timeout 0, restored after): TRUNCATE takes the
    write lock before it waits for readers, so letting SQLite's busy handler wait
    for them would keep every writer out for as long. Tries are repeated here, a few
    milliseconds apart, until ``timeout``: between them the write lock is free.
    """
    deadline = time.monotonic() + timeout
    before = conn.execute("PRAGMA busy_timeout").fetchall()[0][0]
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        while True:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0]
            if busy == 0:
                return True
            if time.monotonic() >= deadline:
                return False  # readers outlasted the timeout, or no turn came
            time.sleep(0.002)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(before)}")


def evict_down(
    conn: Any,
    room: Callable[[], float],
    must: Callable[[], float],
    page: int,
    step: int,
    begin: Begin,
    first: Callable[[], object],
    gone: list[int],
) -> None:
    """Evict in transactions of at most ``step`` rows (each begun by ``begin``) until
    the pages in use fit ``room()`` (the low-water mark); call ``first()`` before the
    first one. The most recently used row is never evicted to reach ``room()``: only
    when every other row is gone and the pages in use still exceed ``must()`` (the
    share the cap leaves the database) does it go too -- so the entry just stored,
    which fits alone (``Budget.fits_alone``), stays.
    The row ids deleted are added to ``gone`` as each transaction commits (so a later
    one that raises does not hide them)."""
    for _ in range(64):
        fits = room()
        used = pages_in_use(conn) * page
        if used <= fits:
            break
        if not gone:
            first()
        batch = evict_rows(conn, fits, page, step, begin, keep=1)
        if not batch and used > must():  # the newest row alone does not fit the share
            batch = evict_rows(conn, must(), page, step, begin)
        gone += batch
        if not batch:
            break


_FROM = "SELECT rid FROM cuforge_entries WHERE rid >= ? ORDER BY rid LIMIT ?"
_AFTER = "SELECT rid FROM cuforge_entries WHERE rid > ? ORDER BY rid LIMIT ?"


def delete_all(conn: Any, step: int, begin: Begin) -> None:
    """Delete every row in one walk up the row ids, ``step`` rows per transaction
    (each begun by ``begin``). One statement deleting them all would write nearly the
    whole database to the WAL (every row sits on its own page). A row stored behind
    the walk meanwhile stays, as it would had it been stored just after."""
    query, bound = _FROM, -(1 << 63)
    while True:
        begin(conn)
        with committed(conn):
            rids = [rid for (rid,) in conn.execute(query, (bound, step)).fetchall()]
            _delete_rows(conn, "clear", rids)
        if len(rids) < step:
            return
        query, bound = _AFTER, rids[-1]


def shrink_to(conn: Any, share: float, page: int, step: int, timeout: float) -> None:
    """Give back the free pages of a file larger than ``share`` bytes (pages free
    inside a file within its share are reused by later writes)."""
    pages = conn.execute("PRAGMA page_count").fetchall()[0][0]
    vacuum(conn, pages - int(share // page), step, timeout)
