"""Keeping a SQLite cache's database + WAL + WAL index within its size cap.

The WAL gets an allowance of a 16th of the cap (16 KiB to 64 MiB; 64 MiB without a
cap), the WAL index what SQLite needs to index that many frames, and the database
file the rest (its *share*), of which an empty database takes its fixed pages
(``_floor``, which also refuses a cap too small for them and one page). A store
whose rows may not fit the share -- the pages in use, those in the WAL included,
plus theirs -- first evicts (``Space.make_room``): the pages in use then fit ~90 %
of what the share leaves for entries, less the new rows. A value whose row alone
cannot fit beside the empty database is refused (``Budget.fits_alone``).

The WAL stays in its allowance because no write transaction starts unless what it
may add (:func:`tx_bytes`: pages per row measured on cache databases, with margin)
fits beside the WAL file as it is. Every transaction that can add more than a
page or two starts with :meth:`Space.begin`, which looks at the WAL file *under the
write lock*: past its fold point (half the allowance) the WAL is folded into the
database and its file emptied (a TRUNCATE checkpoint, so the file's size is always
an upper bound on what the WAL holds), and a transaction that would not fit is
folded for first. A fold cannot complete while a reader still uses an older
snapshot (a process descheduled in the middle of a read, on a loaded machine);
the transaction then does not start (:class:`WalFull`: a store is kept in memory
as under a held write lock, ``_deferred``; housekeeping waits), instead of growing
the WAL past the cap until the reader finishes. Transactions are sized (``rows``,
``touches``, :func:`batches <cuforge.storage.sqlite._deferred.batches>`) to fit the
half of the allowance above the fold point, so a failed fold at that point costs
nothing yet.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ._conn import Connections
from ._evict import checkpoint, evict_down, pages_in_use, shrink_to
from ._floor import EMPTY_BYTES, INDEX_BLOCK, PAGE, WAL_MIN, row_bytes

__all__ = ["FRAME", "PAGE", "WAL_MAX", "Budget", "Space", "WalFull", "touch_bytes", "tx_bytes"]

WAL_MAX = 64 << 20
FRAME = PAGE + 24  # a page in the WAL, with its frame header
_INDEX_FRAMES = 4096  # the WAL index grows by a block (_floor) per 4096 WAL frames
_FOLDS = 4  # folds a transaction waiting for room tries while others refill the WAL


def tx_bytes(rows: int, payload: int = 0) -> int:
    """WAL bytes a transaction storing or deleting ``rows`` rows (with ``payload``
    bytes of stored values) may add: each row's overflow pages, and for each row its
    leaf, its index entry, b-tree rebalancing, pointer-map and free-list pages; then
    the header and state pages once. Measured on cache databases of 2 MiB to 90 MiB
    (worst of hundreds: 1 row 17 + its payload pages, 8 rows 61 +), with margin."""
    return FRAME * (8 + 7 * rows + -(-payload // PAGE))


def touch_bytes(rows: int) -> int:
    """WAL bytes a write-back of ``rows`` uses and the counters may add (a use
    rewrites a row's leaf and moves its index entry; measured 8 uses: 22 pages)."""
    return FRAME * (8 + 2 * rows)


class WalFull(Exception):
    """A write transaction did not start: it would take the WAL file past its
    allowance, and the WAL could not be folded in (a reader still uses an older
    snapshot)."""


class Budget:
    """The shares of one cap (``None``: no cap, only the WAL's allowance applies)."""

    __slots__ = ("cap", "fold_at", "rows", "share", "touches", "wal")

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        #: Bytes the WAL file may take.
        self.wal = WAL_MAX if cap is None else min(WAL_MAX, max(WAL_MIN, cap // 16))
        #: The WAL file size past which the cache folds it in.
        self.fold_at = self.wal // 2
        #: Rows one write transaction of eviction or clear may delete (row ids are key
        #: digests, so each row sits on a page of its own): as many as fit the half
        #: of the allowance above the fold point (``tx_bytes``); at least one.
        self.rows = max(1, ((self.wal - self.fold_at) // FRAME - 8) // 7)
        #: Uses one write-back may record, by the same rule (``touch_bytes``).
        self.touches = max(1, ((self.wal - self.fold_at) // FRAME - 8) // 2)
        index = INDEX_BLOCK * (1 + self.wal // PAGE // _INDEX_FRAMES)
        #: Bytes the database file may take (``inf`` without a cap).
        self.share = float("inf") if cap is None else float(cap - self.wal - index)

    def fits_alone(self, size: int) -> bool:
        """Whether a row of ``size`` stored bytes fits the database's share beside the
        empty database's own pages (``_floor``) -- so that, once stored, the cap never
        makes its own handle evict it while it is the newest entry."""
        return EMPTY_BYTES + row_bytes(size) <= self.share

    def entry_share(self) -> int:
        """Bytes of the share left for entries (the empty database's pages taken)."""
        return max(int(self.share) - EMPTY_BYTES, 0)

    def file_share(self, index_bytes: int) -> float:
        """The database file's share, given the WAL index's size on disk now."""
        if self.cap is None:
            return float("inf")
        return float(self.cap - self.wal - max(index_bytes, INDEX_BLOCK))

    def room(self, index_bytes: int, low_water: float) -> float:
        """Bytes of pages in use that eviction leaves: the empty database's pages and
        ``low_water`` of what the file's share leaves for entries beside them (a share
        of the entries' room, not of the cap: under a small cap the fixed pages would
        otherwise eat the margin, and eviction would take most entries each time)."""
        assert self.cap is not None
        share = self.file_share(index_bytes)
        return EMPTY_BYTES + max(share - EMPTY_BYTES, 0) * low_water

    def needs_work(self, db: int, wal: int) -> bool:
        """Whether files of these sizes call for eviction or a checkpoint (``wal``
        bounds what the WAL may add to the database once folded in: pages a store
        wrote are in the WAL, not yet in the database file)."""
        return wal > self.fold_at or db + wal > self.share

    def fits(self, wal: int, adds: int) -> bool:
        """Whether a transaction adding ``adds`` bytes may start beside a WAL file of
        ``wal`` bytes: within the allowance, or the WAL empty (a single row larger
        than the allowance cannot be split; it goes into an empty WAL)."""
        return wal == 0 or wal + adds <= self.wal


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

    def fold(self, conn: Any, db: int, wal: int, wait_ms: int = 0) -> bool:
        """Fold the WAL into the database and empty its file, waiting ``wait_ms`` for
        readers; whether that completed. Readers outlasting that: the fold point
        is tried again after another allowance's worth of writes, not on every write
        (a transaction that would not fit tries again at once: :meth:`begin`). Never
        raises."""
        wait_ms = wait_ms or self._wait_ms
        done = False
        with contextlib.suppress(self._error), self._conns.busy_timeout(conn, wait_ms):
            done = checkpoint(conn, wait_ms / 1000)
        self.retry_at = 0 if done else db + wal + self.budget.wal
        return done

    def begin(
        self,
        conn: Any,
        wait_ms: int = 0,
        evict: Callable[[int, int, int], object] | None = None,
        adds: int = 0,
        patience_ms: int = 0,
        grows: int = 0,
    ) -> None:
        """BEGIN IMMEDIATE for a transaction adding at most ``adds`` bytes to the WAL.
        The WAL file is looked at under the write lock: past its fold point it is
        folded in first; and if ``adds`` would take it past its allowance and the
        fold (waiting ``wait_ms`` for readers) could not make room, raises
        :class:`WalFull`, with no transaction open. This closes the race of writers
        in several processes each adding to a WAL that a reader keeps from being
        folded: whoever holds the write lock sees the WAL as it is. With ``evict``
        (a store of rows that may add ``grows`` bytes of pages), a database that may
        not hold them within its share -- its file, the WAL not yet folded into it
        and ``grows`` -- calls ``evict(db, wal, grows)`` first (which measures the
        pages in use, evicts to make room for the rows, and folds). ``patience_ms``:
        how long to keep trying folds that readers make fail (each waits ``wait_ms``:
        the write lock is held while it waits) before giving up -- a deletion waits
        its ``timeout``, a store does not."""
        budget = self.budget
        conn.execute("BEGIN IMMEDIATE")
        db, wal = self.sizes()
        # The files first (two stats); near the share, the pages in use: the file
        # keeps the pages eviction freed, and the WAL holds pages not yet in it.
        over = (
            evict is not None
            and db + wal + grows > budget.share
            and pages_in_use(conn) * PAGE + grows > budget.share
        )
        if not over and budget.fits(wal, adds) and not self.fold_due(db, wal):
            return
        conn.execute("ROLLBACK")
        if evict is not None and over:
            evict(db, wal, grows)
            db, wal = self.sizes()
        if not over and self.fold_due(db, wal):
            self.fold(conn, db, wal, wait_ms)
        # The fold runs without the write lock (SQLite checkpoints outside a
        # transaction): other writers may fill the WAL again before it is taken back.
        deadline = time.monotonic() + patience_ms / 1000
        tries = 0
        while True:
            conn.execute("BEGIN IMMEDIATE")
            db, wal = self.sizes()
            if budget.fits(wal, adds):
                return
            conn.execute("ROLLBACK")
            tries += 1
            folded = self.fold(conn, db, wal, wait_ms)
            if time.monotonic() >= deadline and (not folded or tries >= _FOLDS):
                break
        raise WalFull(
            f"the WAL ({wal} bytes) has no room for {adds} more within its allowance "
            f"({budget.wal} bytes), and a reader keeps it from being folded in"
        )

    def fits_now(self, adds: int) -> bool:
        """Whether ``adds`` bytes fit beside the WAL file now (under the write lock:
        for a transaction that does not fold, e.g. a write-back)."""
        return self.budget.fits(self.sizes()[1], adds)

    def make_room(
        self,
        db: int,
        wal: int,
        wait_ms: int,
        first: Callable[[], object],
        evicted: Callable[[list[int]], object],
        grows: int = 0,
    ) -> None:
        """Keep the database within its share, with room for rows about to be stored
        that may add ``grows`` bytes of pages. The pages in use (measured: the WAL's
        included) past that: delete least-recently-used rows until they would fit
        ``low_water`` of the entries' room less ``grows`` (``Budget.room``), but never
        more than the share requires of the newest row (``evict_down``); then give the
        file's pages beyond the share back (``first()`` before the first row goes;
        ``evicted(row ids)`` after). The WAL past its fold point: fold it in. Busy or
        full is never an error."""
        if not self._mutex.acquire(blocking=False):
            return  # another thread of this handle is at it
        try:
            conn = self._conns.get()
            budget = self.budget
            wait_ms = wait_ms or self._wait_ms
            index = self.sizes(3)[2]
            share = budget.file_share(index)
            over = pages_in_use(conn) * PAGE + grows > share
            gone: list[int] = []
            if over:
                adds = tx_bytes(budget.rows)
                try:
                    evict_down(
                        conn,
                        lambda: budget.room(self.sizes(3)[2], self._low_water) - grows,
                        lambda: budget.file_share(self.sizes(3)[2]) - grows,
                        PAGE,
                        budget.rows,
                        lambda c: self.begin(c, wait_ms, adds=adds),
                        first,
                        gone,
                    )
                finally:
                    evicted(gone)
            pages = conn.execute("PRAGMA page_count").fetchall()[0][0]
            if gone or pages * PAGE > share:
                with self._conns.busy_timeout(conn, wait_ms):
                    shrink_to(conn, share, PAGE, max(1, budget.rows // 2), wait_ms / 1000)
                db, wal = self.sizes()
                over = True
            if over or self.fold_due(db, wal):
                self.fold(conn, db, wal, wait_ms)
        except (self._error, WalFull):
            pass  # busy, full, or the WAL kept by a reader: the next write tries again
        finally:
            self._mutex.release()
