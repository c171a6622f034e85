"""Keeping a SQLite cache's database + WAL + WAL index within its size cap.

The WAL gets an allowance of a 16th of the cap (16 KiB to 64 MiB; 64 MiB without a
cap), the WAL index what SQLite needs to index that many frames, and the database
file the rest (its *share*); eviction leaves the pages in use at ~90 % of the share.
The WAL stays in its allowance because every write transaction is kept to about a
quarter of it (rows per eviction, clear or use write-back batch) and the cache folds
the WAL into the database (a checkpoint) once its file passes half the allowance.
A checkpoint cannot restart the WAL while a reader still uses an older snapshot; the
WAL then grows until the reader finishes, and a checkpoint that cannot finish is
never an error (the next write tries again).

Every write transaction that can add more than a page or two starts with
:meth:`Space.begin`, which looks at the WAL *under the write lock*: past its fold
point, the WAL is folded in before anything is added, so concurrent writers cannot
pile onto it while a fold waits for its turn.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

from .. import events
from ._conn import Connections
from ._evict import checkpoint, evict_down, shrink_to

__all__ = ["PAGE", "WAL_MAX", "Budget", "Space"]

WAL_MAX = 64 << 20
PAGE = 4096  # the page size every cache database is created with (_schema)
_INDEX_BLOCK = 32768  # the WAL index grows by 32 KiB per 4096 WAL frames
_INDEX_FRAMES = 4096


class Budget:
    """The shares of one cap (``None``: no cap, only the WAL's allowance applies)."""

    __slots__ = ("cap", "fold_at", "rows", "share", "wal")

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        #: Bytes the WAL file may take.
        self.wal = WAL_MAX if cap is None else min(WAL_MAX, max(16384, cap // 16))
        #: The WAL file size past which the cache folds it in.
        self.fold_at = self.wal // 2
        #: Rows one write transaction of eviction, clear or use write-back may touch:
        #: row ids are key digests, so each row sits on a page of its own, and a row
        #: deleted writes it, its index entry, free-list and pointer-map pages (up to
        #: ~6 pages for a row with overflow pages): an eighth of the allowance in pages.
        self.rows = max(2, self.wal // PAGE // 8)
        index = _INDEX_BLOCK * (1 + self.wal // PAGE // _INDEX_FRAMES)
        #: Bytes the database file may take (``inf`` without a cap).
        self.share = float("inf") if cap is None else float(cap - self.wal - index)

    def file_share(self, index_bytes: int) -> float:
        """The database file's share, given the WAL index's size on disk now."""
        if self.cap is None:
            return float("inf")
        return float(self.cap - self.wal - max(index_bytes, _INDEX_BLOCK))

    def room(self, index_bytes: int, low_water: float) -> float:
        """Bytes of pages in use that eviction leaves: ``low_water`` of the cap, less
        what the WAL and its index are allowed."""
        assert self.cap is not None
        return self.file_share(index_bytes) - self.cap * (1 - low_water)

    def needs_work(self, db: int, wal: int) -> bool:
        """Whether files of these sizes call for eviction or a checkpoint."""
        return wal > self.fold_at or db > self.share


class Space:
    """One handle's keeper of its cap: sizes, folds, and eviction (see the module).

    ``wait_ms`` is how long a blocking checkpoint waits for readers by default;
    ``error`` is sqlite3.Error (busy or full is never raised from here).
    """

    def __init__(
        self,
        budget: Budget,
        conns: Connections,
        path: str,
        low_water: float,
        wait_ms: int,
        error: type[BaseException],
    ) -> None:
        self.budget = budget
        self._conns = conns
        self._files = (path, path + "-wal", path + "-shm")
        self._low_water = low_water
        self._wait_ms = wait_ms
        self._error = error
        self._mutex = threading.Lock()  # one eviction at a time per handle
        self.retry_at = 0  # db + WAL bytes before a failed fold is tried again

    def refuse_too_large(self, handle: object, size: int) -> None:
        """Report a store of ``size`` bytes refused for being larger than the database's
        share of the cap (the caller counts it in ``write_failures``): storing it would
        evict every other entry and still leave the files over the cap. Noted as
        ``events.TOO_LARGE`` for the compile pipeline; logged once per handle."""
        cap, share = self.budget.cap, max(int(self.budget.share), 0)
        events.note_dropped(
            events.TOO_LARGE,
            f"{self._files[0]}: {size} bytes, larger than the cache's size cap "
            f"({cap} bytes, {share} of them for entries)",
        )
        events.fail_open(
            handle,
            events.TOO_LARGE,
            "cuforge program cache %s: an entry of %d bytes is larger than the cache's size "
            "cap (%d bytes, %d of them for entries); not stored, nothing evicted for it; "
            "counted in stats().write_failures",
            self._files[0],
            size,
            cap,
            share,
        )

    def after_fork(self) -> None:
        self._mutex = threading.Lock()

    def sizes(self, n: int = 2) -> list[int]:
        """Sizes of the database and WAL (and WAL index with ``n=3``); 0 if absent."""
        out = []
        for path in self._files[:n]:
            try:
                out.append(os.stat(path).st_size)
            except OSError:
                out.append(0)
        return out

    def fold_due(self, db: int, wal: int) -> bool:
        """Whether the WAL is past its fold point (and no fold failed since the last
        allowance's worth of writes)."""
        return wal > self.budget.fold_at and db + wal >= self.retry_at

    def fold(self, conn: Any, db: int, wal: int, wait_ms: int = 0, truncate: bool = False) -> None:
        """Fold the WAL into the database so the next writer restarts it (and cuts its
        file back to the fold point; emptied now with ``truncate``), waiting ``wait_ms``
        for readers. Readers outlasting that: try again after another allowance's worth
        of writes, not on every write. Never raises."""
        wait_ms = wait_ms or self._wait_ms
        done = False
        with contextlib.suppress(self._error), self._conns.busy_timeout(conn, wait_ms):
            done = checkpoint(conn, wait_ms / 1000, truncate)
        self.retry_at = 0 if done else db + wal + self.budget.wal

    def begin(
        self, conn: Any, wait_ms: int = 0, evict: Callable[[int, int], object] | None = None
    ) -> None:
        """BEGIN IMMEDIATE; a WAL found past its fold point under the write lock is
        folded in first, so no process adds to it there while a fold can complete.
        With ``evict`` (a store), a database past its share calls ``evict(db, wal)``
        first instead (which evicts and folds)."""
        conn.execute("BEGIN IMMEDIATE")
        db, wal = self.sizes()
        over = evict is not None and db > self.budget.share
        if over or self.fold_due(db, wal):
            conn.execute("ROLLBACK")
            if evict is not None:
                evict(db, wal)
            else:
                self.fold(conn, db, wal, wait_ms)
            conn.execute("BEGIN IMMEDIATE")

    def make_room(
        self,
        db: int,
        wal: int,
        wait_ms: int,
        first: Callable[[], object],
        evicted: Callable[[list[int]], object],
    ) -> None:
        """The database past its share: delete least-recently-used rows until its pages
        in use would fit ``low_water`` of it, and give the pages beyond it back
        (``first()`` before the first row goes; ``evicted(row ids)`` after). The WAL
        past its fold point: fold it in. Busy or full is never an error."""
        if not self._mutex.acquire(blocking=False):
            return  # another thread of this handle is at it
        try:
            conn = self._conns.get()
            budget = self.budget
            wait_ms = wait_ms or self._wait_ms
            index = self.sizes(3)[2]
            over = db > budget.file_share(index)
            if over:
                gone = evict_down(
                    conn,
                    lambda: budget.room(self.sizes(3)[2], self._low_water),
                    PAGE,
                    budget.rows,
                    lambda c: self.begin(c, wait_ms),
                    first,
                )
                evicted(gone)
                if gone:
                    share = budget.file_share(index)
                    with self._conns.busy_timeout(conn, wait_ms):
                        shrink_to(conn, share, PAGE, budget.rows // 2, wait_ms / 1000)
                db, wal = self.sizes()
            if over or self.fold_due(db, wal):
                self.fold(conn, db, wal, wait_ms, truncate=over)
        except self._error:
            pass  # busy or full: the next write tries again
        finally:
            self._mutex.release()
