"""Everything a SQLite cache writes: stores (kept back while the write lock is held
elsewhere), the write-back of recorded uses and counters, and eviction's callbacks.

- **A store** waits for SQLite's write lock at most its bound (``_deferred``: 0.25 s,
  10 ms while backing off), then is kept in memory (``locked``, kept: a lock timeout,
  not a write failure) and written with the next store that gets the lock, at the
  write-back of close or at exit (at most ``_CATCH_UP`` transactions of them per
  store, so that no store holds the write lock for long). Each transaction adds at
  most half the WAL's allowance (``_deferred.batches``, ``_space.tx_bytes``):
  deferred rows written in one go would grow the WAL past the cap. A store that
  would take the WAL past its allowance while a reader keeps the WAL from being
  folded in is kept the same way (``_space.WalFull``). Rows that cannot be written
  for another reason are dropped, each a write failure told to the core.
- **Write-back** (``housekeep``): the first use of each row since the last write-back
  and the counters' difference since then, in one short transaction: on the core's
  schedule (``wait=False``: a brief busy wait, what is not written waits for the
  next), and at close, exit or for totals (``wait=True``). It never folds the WAL:
  when its pages would not fit beside the WAL, it waits for the next write-back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..outcome import FAILED, LOCKED, READ_ONLY, STORED_OUTCOME, StoreOutcome
from ..stats import CacheStats
from ._conn import Connections, committed
from ._deferred import DeferredStores, Row, batches
from ._floor import row_bytes
from ._schema import SQL, STAT_COLUMNS, Counters, is_busy, is_corruption
from ._space import Space, WalFull, touch_bytes, tx_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..protocol import Reports

__all__ = ["Writes"]

_PENDING_MAX = 4096
_CATCH_UP = 4  # transactions of kept rows a store writes after its own


class Writes:
    """The write side of one handle (see the module docstring). ``damaged(exc)`` is
    told of SQLite reporting damage; ``reports`` is the core's."""

    def __init__(
        self,
        conns: Connections,
        space: Space,
        deferred: DeferredStores,
        path: str,
        error: type[BaseException],
        housekeeping_ms: int,
    ) -> None:
        self.conns, self.space, self.deferred = conns, space, deferred
        self.path, self.error, self.housekeeping_ms = path, error, housekeeping_ms
        self.mutex = threading.Lock()  # one write-back at a time per handle
        self.pending: dict[int, int] = {}  # rid -> wall ns of a use, not yet written
        self.flushed = CacheStats()  # the counters the database has of this handle
        self.read_only = False  # the file system or file: stores are refused
        self.full: str | None = None  # read-only because the disk is full: stores fail
        self.broken: str | None = None  # why the handle serves misses only
        # The counter columns the file has (``_schema.Counters``): set once it is open.
        self.counters = Counters(len(STAT_COLUMNS))
        self.reports: Reports
        self.damaged: Callable[[BaseException], None]

    # -- stores ---------------------------------------------------------------------
    def store(self, row: Row) -> StoreOutcome:
        """Write ``row`` (and the deferred rows after it); what became of ``row``."""
        self.pending.pop(row[0], None)
        return self.rows(self.deferred.with_new(row), self.deferred.wait_now_ms(), (row,))[0]

    def store_many(self, new: list[Row]) -> list[StoreOutcome]:
        """Write ``new`` (and the deferred rows after them) in as few transactions as
        the WAL's allowance lets (one for a prefetch batch); what became of each, as
        :meth:`store` of one after another would answer (a later row of the same id
        wins). One wait for the write lock for them all."""
        for row in new:
            self.pending.pop(row[0], None)
        ids = {row[0] for row in new}
        rows = new + [r for rid, r in self.deferred.rows.items() if rid not in ids]
        return self.rows(rows, self.deferred.wait_now_ms(), tuple(new))

    def rows(self, rows: list[Row], wait_ms: int, new: tuple[Row, ...]) -> list[StoreOutcome]:
        """Write ``rows`` (``new`` first), waiting at most ``wait_ms`` for the write lock;
        the outcome of each of ``new``. The other rows written are told to the core as
        stores; those that fail, as dropped stores."""
        conn = self.conns.get()
        self.conns.set_busy(conn, wait_ms)  # maintenance waits longer (full_wait)
        left = list(rows)
        mine = {id(r) for r in new}
        room = self.space.budget.wal - self.space.budget.fold_at
        caught_up = 0
        for batch in batches(rows, room, tx_bytes):
            if new and not any(id(r) in mine for r in left) and caught_up >= _CATCH_UP:
                # The new rows are written: the rest of the kept ones wait for the next
                # store, so one store never holds the write lock for a long run of
                # transactions (peers' stores would time out meanwhile).
                self.deferred.resume()
                return [STORED_OUTCOME] * len(new)
            caught_up += not any(id(r) in mine for r in batch)
            adds = tx_bytes(len(batch), sum(r[3] for r in batch))
            grows = sum(row_bytes(r[3]) for r in batch)
            try:
                # Sizes checked under the lock; a fold waits for readers at most as
                # long as the store may wait for the lock.
                self.space.begin(conn, wait_ms, self.make_room, adds, grows=grows)
                with committed(conn):
                    conn.executemany(SQL.put, batch)
            except (self.error, WalFull) as exc:
                return self._stopped(exc, left, new)
            del left[: len(batch)]
            others = [r for r in batch if id(r) not in mine]
            for row in batch:  # written: an older deferred row of its id goes too
                self.deferred.forget(row[0])
            if others:
                self.reports.stored(len(others), sum(len(r[7]) for r in others))
        self.deferred.written()
        return [STORED_OUTCOME] * len(new)

    def _stopped(
        self, exc: BaseException, left: list[Row], new: tuple[Row, ...]
    ) -> list[StoreOutcome]:
        """A write of ``left`` (those of ``new`` among them not written) failed with
        ``exc``. A store that waited its bound keeps what is left for later; anything
        else drops it."""
        unwritten = {id(r) for r in left}
        pending_new = [r for r in new if id(r) in unwritten]
        wal = isinstance(exc, WalFull)
        if new and (wal or is_busy(exc)) and all(self.deferred.keep(r) for r in pending_new):
            self.deferred.timed_out()
            detail = (
                f"{exc}; kept in memory until it is"
                if wal
                else f"another process holds the write lock for more than "
                f"{self.deferred.wait_ms} ms; kept in memory until the write lock is free"
            )
            if not pending_new:
                self.reports.lock_busy(detail)
            kept = StoreOutcome(LOCKED, detail, kept=True)
            return [kept if id(r) in unwritten else STORED_OUTCOME for r in new]
        self.deferred.clear()
        outcome = self.failed(exc)
        mine = {id(r) for r in new}
        for row in left:
            if id(row) not in mine:
                self.reports.dropped(outcome)
        return [outcome if id(r) in unwritten else STORED_OUTCOME for r in new]

    def failed(self, why: BaseException | str) -> StoreOutcome:
        """The outcome of a store that ``why`` stopped (told of damage)."""
        if isinstance(why, BaseException) and is_corruption(why):
            self.damaged(why)
        if isinstance(why, WalFull) or (isinstance(why, BaseException) and is_busy(why)):
            return StoreOutcome(LOCKED, str(why))
        return StoreOutcome(READ_ONLY if self.read_only and not self.full else FAILED, str(why))

    def write_deferred(self, wait_ms: int) -> None:
        if self.deferred.rows and not self.broken:
            self.rows(list(self.deferred.rows.values()), wait_ms, ())

    # -- eviction ---------------------------------------------------------------------
    def make_room(self, db: int, wal: int, grows: int = 0, *, wait_ms: int = 0) -> None:
        """Evict and fold so the files fit the cap, with room for rows that may add
        ``grows`` bytes of pages (``Space.make_room``)."""
        self.space.make_room(db, wal, wait_ms, self._uses_first, self._evicted, grows)

    def _uses_first(self) -> None:
        """Before the first row is evicted: the recorded uses, so LRU order is true."""
        self.housekeep(False, fold=True)

    def _evicted(self, rids: list[int]) -> None:
        for rid in rids:
            self.pending.pop(rid, None)
        if rids:
            self.reports.evicted(len(rids))

    # -- write-back of uses and counters ----------------------------------------------
    def housekeep(self, wait: bool, fold: bool = False) -> bool:
        """Write pending uses and counter deltas in one transaction; whether all is
        written (``wait=False``: a brief busy wait; what is not written is kept). Only
        with ``wait`` or ``fold`` (before an eviction) is the WAL folded in to make
        room for them (``Space.begin``); the write-back a read may run never folds."""
        if self.read_only:
            return True  # nothing can be written: uses and counters stay per handle
        if not self.mutex.acquire(blocking=wait):
            return False
        pending: dict[int, int] = {}
        try:
            snap = self.reports.counts().copy()
            deltas = [a - b for a, b in zip(snap._values(), self.flushed._values(), strict=True)]
            del deltas[self.counters.n :]  # counters the table has columns for
            pending, self.pending = self.pending, {}
            batch = self.space.budget.touches  # each use rewrites pages: bound the WAL
            if len(pending) > batch:
                items = list(pending.items())
                pending, self.pending = dict(items[:batch]), dict(items[batch:])
            if self.broken or (not pending and not any(deltas)):
                return True
            conns = self.conns
            conn = conns.get()
            brief = self.housekeeping_ms
            adds = touch_bytes(len(pending))
            with conns.full_wait(conn) if wait else conns.busy_timeout(conn, brief):
                if wait or fold:
                    self.space.begin(conn, 0 if wait else brief, adds=adds)
                else:
                    conn.execute("BEGIN IMMEDIATE")
                    if not self.space.fits_now(adds):  # the next store folds
                        conn.execute("ROLLBACK")
                        raise WalFull("no room in the WAL for a write-back")
                with committed(conn):
                    if pending:
                        now = time.time_ns()
                        conn.executemany(SQL.touch, [(ns, r, ns, now) for r, ns in pending.items()])
                    if any(deltas):
                        conn.execute(self.counters.add, deltas)
            self.flushed = snap
            return True
        except (self.error, WalFull):
            if len(self.pending) < _PENDING_MAX:
                for rid, ns in pending.items():
                    self.pending.setdefault(rid, ns)
            return False
        finally:
            self.mutex.release()

    def after_fork(self) -> None:
        self.mutex = threading.Lock()
        self.flushed = CacheStats()  # the parent's counts are the parent's to write
        self.pending = {}
        self.deferred.clear()  # the parent's to write

    def touch(self, rid: int) -> None:
        """Record a use of ``rid`` (the first per write-back)."""
        pending = self.pending
        if rid not in pending:
            pending[rid] = time.time_ns()

    def unflushed(self, stats: CacheStats) -> list[Any]:
        return [a - b for a, b in zip(stats._values(), self.flushed._values(), strict=True)]
