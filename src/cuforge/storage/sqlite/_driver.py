"""The SQLite driver: a database file's rows as the storage core asks for them.

What this module decides (the rest is the core's, ``storage.handle``): opening the
file only when it is provably cuforge's (``_open``), the verified read of a row
(its key digest and a key-seeded CRC-32 over payload, payload length and metadata;
``_schema.row_check``), one query for many keys, a row that fails dropped only if
no writer replaced it, rows by id for the command line (``_entries``), record locks
for single flight (``_lock``), and what is written (``_writes``: stores, their
deferral, the write-back of uses and counters; ``_space``: the cap).

Failure modes: SQLite reporting damage marks the file for recovery at its next
open and warns (:class:`~cuforge.storage.sqlite.CacheRecoveryWarning`); a handle
that could not open the file usably (``broken``) serves misses and drops stores; a
database locked past ``timeout`` is a miss; nothing raises for the medium on the
lookup or store path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from zlib import crc32

from cuforge._stack import outside_level

from .._integrity import key_seed
from .._safedir import prepare_db_file
from ..driver import Driver
from ..entry import CacheEntry, EntryInfo
from ..outcome import STORED_OUTCOME, TOO_LARGE, Damaged, StoreOutcome
from ..stats import CacheStats
from ..units import check_max_size
from ._conn import Connections, check_timeout, committed, immediate, load_sqlite3, pragmas
from ._deferred import DeferredStores
from ._entries import find_row, list_rows, remove_row
from ._evict import checkpoint, delete_all, vacuum
from ._floor import cap_problem
from ._lock import LockFile
from ._open import mark_damaged, open_database, refuse_unless_ours
from ._schema import (
    SQL,
    Counters,
    DatabaseIsDirectoryError,
    ForeignDatabaseError,
    NewerSchemaError,
    counter_columns,
    is_busy,
    is_corruption,
    rid_of,
    row_check,
)
from ._space import Budget, Space, WalFull, tx_bytes
from ._writes import Writes

if TYPE_CHECKING:
    from ..protocol import Reports

__all__ = ["SQLiteDriver"]

_U32 = 0xFFFFFFFF
_GET = SQL.get  # the hit path avoids an attribute lookup
_CHUNK = 500  # bound parameters per query (SQLite's limit is 999 on old builds)
Loc = tuple[bytes, int, int]  # (key digest, row id, check seed)


class SQLiteDriver(Driver):
    """The rows of the database at ``path``; ``knobs`` are the handle's class settings
    (``EVICT_LOW_WATER``, ``STORE_LOCK_WAIT_S``, ``STORE_LOCK_BACKOFF_S``,
    ``DEFERRED_MAX_BYTES``, ``HOUSEKEEPING_TIMEOUT_MS``, ``CHECKPOINT_TIMEOUT_MS``)."""

    flush_every = 256
    flush_interval_s = 1.0

    def __init__(
        self,
        path: str,
        max_size_bytes: int | None,
        durable: bool,
        timeout: float,
        trust_shared: bool,
        knobs: tuple[float, float, float, int, int, int],
        recovery: type[Warning],
        read_only: bool = False,
    ) -> None:
        low_water, store_wait, backoff, deferred_max, housekeeping_ms, self._checkpoint_ms = knobs
        sqlite3 = load_sqlite3()
        self._error = sqlite3.Error
        self.cap = check_max_size(max_size_bytes)
        small = None if self.cap is None else cap_problem(self.cap)
        if small is not None:  # before anything is created: no entry could ever stay
            raise ValueError(f"max_size_bytes: {small}")
        self._timeout = check_timeout(timeout)
        self._durable = bool(durable)
        self.path = path
        self.label = f"cuforge program cache {path}"
        self._recovery = recovery
        self._recovery_warned = False
        if os.path.isdir(path):
            raise DatabaseIsDirectoryError(path)
        refuse_unless_ours(sqlite3, path, self._timeout)  # before creating anything
        prepare_db_file(path, trust_shared)  # private, like FileStream (_safedir)
        budget = Budget(self.cap)
        self._conns = Connections(sqlite3, path, self._timeout, pragmas(self._durable, budget.wal))
        space = Space(budget, self._conns, path, low_water, self._checkpoint_ms, sqlite3.Error)
        deferred = DeferredStores(
            int(min(self._timeout, store_wait) * 1000), backoff, int(deferred_max)
        )
        self._w = Writes(self._conns, space, deferred, path, sqlite3.Error, int(housekeeping_ms))
        self._w.damaged = self._damaged
        self._lockfile = LockFile(path)
        try:
            opened = open_database(sqlite3, self._conns, self._lockfile, path, self._timeout)
        except BaseException as exc:
            self._conns.close_all()
            refused = isinstance(exc, (ForeignDatabaseError, NewerSchemaError))
            self._lockfile.release(remove_if_created=refused)
            raise
        self._w.broken = opened.broken
        # ``read_only`` (``?ro``, the commands that only look): stores refused by design,
        # no use, counter or eviction written -- not even the cap's at close. A file
        # that cannot be written: hits only, stores dropped (one warning).
        self.read_only = bool(read_only)
        self._w.read_only = opened.read_only or self.read_only
        self._w.full = None if self.read_only else opened.full
        if opened.broken is None:
            with contextlib.suppress(self._error):  # unreadable: the next write-back meets it
                self._w.counters = Counters(counter_columns(self._conns.get()))
        if opened.notice is not None:
            tail = "; this handle serves misses (compiles still work)" if opened.broken else ""
            self._warn_recovery(f"{self.label}: {opened.notice}{tail}")
        # A driver dropped without close() still lets go of its connections and locks.
        self._finalizer = weakref.finalize(self, _release, self._conns, self._lockfile)
        self._finalizer.atexit = False  # the exit flush needs them; the OS frees them after
        self.read_many = self._read_many
        self.write_many = self._write_many
        self.lease = self._hold

    def bind(self, reports: Reports) -> None:
        super().bind(reports)
        self._w.reports = reports

    def _warn_recovery(self, message: str) -> None:
        if not self._recovery_warned:
            self._recovery_warned = True
            warnings.warn(message, self._recovery, stacklevel=outside_level())

    def _damaged(self, exc: BaseException) -> None:
        mark_damaged(self.path)
        self._warn_recovery(
            f"{self.label}: SQLite reports damage ({exc}); reads are misses, and the file "
            "is checked (and moved aside if damaged) when it is next opened while no "
            "other process uses it",
        )

    # -- reads ----------------------------------------------------------------------
    def locate(self, kd: bytes) -> Loc:
        return kd, rid_of(kd), key_seed(kd)

    def read(self, loc: Loc) -> CacheEntry | Damaged | None:
        kd, rid, seed = loc
        w = self._w
        if w.broken is None:
            try:
                rows = self._conns.get().execute(_GET, (rid,)).fetchall()
            except self._error as exc:
                if is_corruption(exc):
                    self._damaged(exc)
                rows = None
            if rows:
                digest, crc, meta, data = rows[0]
                if (  # a damaged record header can turn a column into text, a number or NULL
                    type(data) is bytes
                    and type(meta) is bytes
                    and digest == kd
                    and crc32(meta, crc32(data, (seed ^ len(data)) & _U32)) == crc
                ):
                    w.touch(rid)
                    return CacheEntry(data, meta)
                return Damaged("checksum mismatch", (rid, crc))
        if w.deferred.rows:  # stored by this handle, not written yet (lock held)
            kept = w.deferred.lookup(rid, kd)
            if kept is not None:
                return CacheEntry(kept[7], kept[6])
        return None

    def _read_many(self, locs: Sequence[Loc]) -> list[CacheEntry | Damaged | None]:
        """The rows of ``locs`` by one SELECT per 500 keys (one snapshot); a key whose
        row is not a verified one goes through :meth:`read` (deferred stores, damage)."""
        rows: dict[int, tuple[Any, ...]] = {}
        if self._w.broken is None:
            rids = [rid for _kd, rid, _seed in locs]
            try:
                conn = self._conns.get()
                for at in range(0, len(rids), _CHUNK):
                    part = rids[at : at + _CHUNK]
                    sql = (
                        "SELECT rid, digest, crc, meta, data FROM cuforge_entries WHERE rid IN ("
                        + ",".join("?" * len(part))
                        + ")"
                    )
                    for row in conn.execute(sql, part).fetchall():
                        rows[row[0]] = row[1:]
            except self._error:
                rows = {}  # read() below meets the fault itself and handles it
        out: list[CacheEntry | Damaged | None] = []
        for loc in locs:
            row = rows.get(loc[1])
            if row is not None and _verifies(loc, row):
                self._w.touch(loc[1])
                out.append(CacheEntry(row[3], row[2]))
            else:
                out.append(self.read(loc))
        return out

    def drop(self, loc: Loc, damaged: Damaged) -> None:
        """Remove a row that does not verify -- unless a writer has replaced it since it
        was read (its check would differ)."""
        rid, crc = damaged.token
        self._w.pending.pop(rid, None)
        with contextlib.suppress(self._error):
            immediate(self._conns.get(), SQL.drop_if_same, (rid, crc))

    # -- stores and removals ----------------------------------------------------------
    def write(self, loc: Loc, data: bytes, meta: bytes) -> StoreOutcome:
        kd, rid, seed = loc
        w = self._w
        if w.broken or w.read_only:
            return w.failed(w.broken or w.full or "the file system or file is read-only")
        size = len(data) + len(meta)
        budget = w.space.budget
        if not budget.fits_alone(size):  # could never fit: refused, nothing evicted
            return self._too_large(size)
        now = time.time_ns()
        return self._w.store((rid, kd, row_check(seed, data, meta), size, now, now, meta, data))

    def _write_many(self, batch: Sequence[tuple[Loc, bytes, bytes]]) -> list[StoreOutcome]:
        """:meth:`write` of each, in order, the rows that fit written in one
        transaction (as many as the WAL's allowance lets) after one wait for the write
        lock, instead of one transaction -- one commit, one WAL sync with
        ``durable`` -- each. A transaction commits whole or not at all, so after a
        crash each row is there and verifying, or absent."""
        w = self._w
        if w.broken or w.read_only:
            failed = w.failed(w.broken or w.full or "the file system or file is read-only")
            return [failed] * len(batch)
        out: list[StoreOutcome] = []
        rows: list[tuple[Any, ...]] = []
        at: list[int] = []
        budget = w.space.budget
        now = time.time_ns()
        for (kd, rid, seed), data, meta in batch:
            size = len(data) + len(meta)
            if not budget.fits_alone(size):  # could never fit: refused, nothing evicted
                out.append(self._too_large(size))
                continue
            at.append(len(out))
            out.append(STORED_OUTCOME)
            rows.append((rid, kd, row_check(seed, data, meta), size, now, now, meta, data))
        if rows:
            for n, outcome in zip(at, w.store_many(rows), strict=True):
                out[n] = outcome
        return out

    def _too_large(self, size: int) -> StoreOutcome:
        budget = self._w.space.budget
        share = budget.entry_share()
        return StoreOutcome(
            TOO_LARGE,
            f"{self.path}: {size} bytes, larger than the cache's size cap "
            f"({budget.cap} bytes, {share} of them for entries)",
        )

    def remove(self, loc: Any) -> bool:
        """``loc`` of a key: its row and any store of it kept back; of an id
        (``locate_id``): the row that answers for that id (``_entries``)."""
        w = self._w
        if w.broken:
            return False
        if loc[0] == "id":
            kd = loc[1]
            for rid, row in list(w.deferred.rows.items()):
                if row[1] == kd:
                    w.deferred.forget(rid)
            found = find_row(self._conns.get(), kd)
            if found is None:
                return False
            try:
                conn = self._conns.get()
                with self._conns.full_wait(conn):
                    return remove_row(conn, kd, found)
            except self._error as exc:
                raise self._refused(exc) from exc
        kd, rid, _ = loc
        patience = int(self._timeout * 1000)  # a deletion waits for room as for the lock
        kept = w.deferred.lookup(rid, kd) is not None
        w.deferred.forget(rid)
        try:
            conn = self._conns.get()
            with self._conns.full_wait(conn):
                w.space.begin(conn, adds=tx_bytes(1), patience_ms=patience)
                with committed(conn):
                    cur = conn.execute(SQL.delete_key, (rid, kd))
        except (self._error, WalFull) as exc:
            self.reports.dropped(w.failed(exc))
            return True  # not known absent: no KeyError
        return cur.rowcount > 0 or kept

    def clear(self) -> None:
        """Remove every row and give the space back to the file system."""
        w = self._w
        if w.broken:
            return
        w.pending.clear()
        w.deferred.clear()
        space = w.space
        adds = tx_bytes(space.budget.rows)
        patience = int(self._timeout * 1000)  # waits for room as for the lock

        def begin(c: Any) -> None:
            space.begin(c, adds=adds, patience_ms=patience)

        try:
            conn = self._conns.get()
            with self._conns.full_wait(conn):
                delete_all(conn, space.budget.rows, begin)
        except (self._error, WalFull) as exc:
            raise self._refused(exc) from exc
        # Giving the pages back is housekeeping: busy here fails nothing.
        wait = self._checkpoint_ms
        with contextlib.suppress(self._error), self._conns.busy_timeout(conn, wait):
            vacuum(conn, 1 << 62, space.budget.rows, wait / 1000)
            checkpoint(conn, wait / 1000)

    def _refused(self, exc: BaseException) -> OSError:
        """What a maintenance removal (``clear``, an entry by id) raises when the
        database refuses it -- never a store's warning: a lock held elsewhere past the
        timeout says so (``EBUSY``), damage is told to the handle, anything else is
        SQLite's own words (``EIO``)."""
        self._w.failed(exc)  # tells the handle of damage; the outcome is no store's
        if isinstance(exc, WalFull):  # a reader keeps the write-ahead log from folding
            return OSError(errno.EBUSY, str(exc))
        if is_busy(exc):
            held = f"another connection held it for over {self._timeout:g} s"
            return OSError(errno.EBUSY, f"the database is locked: {held}")
        return OSError(errno.EIO, str(exc))

    # -- by id, listing -----------------------------------------------------------------
    def locate_id(self, entry_id: str) -> Any:
        from ._entries import digest_of_id

        kd = digest_of_id(entry_id)
        return None if kd is None else ("id", kd)

    def peek(self, loc: Any) -> CacheEntry | Damaged | None:
        if self._w.broken:
            return None
        found = find_row(self._conns.get(), loc[1])
        if found is None:
            return None
        row, problem = found
        return Damaged(problem, None) if problem else CacheEntry(row[3], row[2])

    def scan(self) -> Iterator[EntryInfo]:
        """Every row, in pages of 256 (no read transaction stays open between pages)."""
        if not self._w.broken:
            yield from list_rows(self._conns.get)

    def count(self) -> int:
        """Number of entries (kept by triggers: no scan)."""
        if self._w.broken:
            return 0
        return int(self._conns.get().execute("SELECT entries FROM cuforge_state").fetchall()[0][0])

    def size(self) -> int:
        """Bytes on disk of the database, its WAL and its WAL index."""
        return sum(self._w.space.sizes(3))

    # -- locks, counters, lifetime ------------------------------------------------------
    def _hold(self, loc: Loc, timeout: float | None) -> AbstractContextManager[bool]:
        return self._lockfile.hold(loc[0], timeout)

    def flush(self, stats: CacheStats, final: bool) -> None:
        if not final:
            self._w.housekeep(False)
            return
        # Kept stores and counters, waiting as long as a write may (a peer holding the
        # write lock a little longer than a store's 0.25 s would lose them otherwise).
        with self._conns.full_wait(self._conns.get()):
            self._w.write_deferred(int(self._timeout * 1000))
            self._w.housekeep(True)

    def counts_lost(self, stats: CacheStats) -> str | None:
        # A file served for reading because its disk is full takes no counters either.
        return self._w.full

    def totals(self, stats: CacheStats) -> CacheStats:
        """Counters summed over every handle (others: what they last wrote back)."""
        self._w.housekeep(True)
        unflushed = self._w.unflushed(stats)
        try:
            stored = list(self._conns.get().execute(self._w.counters.read).fetchall()[0])
        except (self._error, IndexError):
            stored = []
        stored += [0] * (len(unflushed) - len(stored))  # counters kept per handle only
        return CacheStats(*(max(0, a + b) for a, b in zip(stored, unflushed, strict=True)))

    def zero(self, stats: CacheStats) -> None:
        """Set the stored counters to zero and drop what this handle counted so far
        from what it writes back (OSError when the database cannot be written)."""
        w = self._w
        if w.broken:
            raise OSError(f"{self.path}: {w.broken}")
        with w.mutex:
            done = stats.copy()
            try:
                conn = self._conns.get()
                with self._conns.full_wait(conn):
                    immediate(conn, self._w.counters.zero)
            except self._error as exc:
                if is_corruption(exc):
                    self._damaged(exc)
                raise OSError(f"{self.path}: {exc}") from exc
            w.flushed = done

    def after_fork(self) -> None:
        self._conns.forget_after_fork()
        self._w.space.after_fork()
        self._w.after_fork()
        self._lockfile.use(0)

    def close(self) -> None:
        """Leave the cache within its cap (waiting as long as a write would; a
        read-only handle evicts nothing), then let go of the connections and the lock
        file."""
        w = self._w
        with contextlib.suppress(Exception), self._conns.full_wait(self._conns.get()):
            db, wal = w.space.sizes()
            if not w.broken and not w.read_only and w.space.budget.needs_work(db, wal):
                w.space.retry_at = 0
                before = self.reports.counts().evictions
                w.make_room(db, wal, wait_ms=int(self._timeout * 1000))
                if self.reports.counts().evictions != before:
                    # The core wrote its counters back before this: these evictions
                    # would stay in this handle's stats, never in total_stats().
                    w.housekeep(True)
        self._finalizer()


def _verifies(loc: Loc, row: tuple[Any, ...]) -> bool:
    kd, _, seed = loc
    digest, crc, meta, data = row
    return (
        type(data) is bytes
        and type(meta) is bytes
        and digest == kd
        and crc32(meta, crc32(data, (seed ^ len(data)) & _U32)) == crc
    )


def _release(conns: Connections, lockfile: LockFile) -> None:
    conns.close_all()
    lockfile.release()
