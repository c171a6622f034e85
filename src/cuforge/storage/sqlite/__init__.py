"""A program cache in one SQLite database file, shared by threads and processes.

Files: ``<path>`` (the database), ``<path>-wal`` and ``<path>-shm`` (SQLite's WAL
and its index, present while the database is open), ``<path>.lock`` (record locks,
see ``_lock``) and, only after SQLite reported damage, ``<path>.damaged``.
The schema is described in ``_schema``. Python's ``sqlite3`` is imported when
a cache is opened, so ``import cuforge`` works on interpreters built without it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
import weakref
from contextlib import AbstractContextManager
from time import monotonic_ns
from typing import Any
from zlib import crc32

from cuforge._stack import outside_level

from .. import events
from .._integrity import key_seed
from .._livehandles import LiveHandles
from .._safedir import prepare_db_file
from .._values import coerce_key, coerce_value
from ..base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    check_meta,
)
from ..entry import CacheEntry, key_digest
from ..memory import check_max_size
from ..stats import CacheStats
from ._batch import BatchRead
from ._conn import Connections, check_timeout, immediate, load_sqlite3, pragmas
from ._deferred import DeferredStores, Row, batches
from ._entries import EntriesById
from ._evict import checkpoint, delete_all, vacuum
from ._lock import LockFile, reset_after_fork
from ._open import default_db_path, mark_damaged, open_database, refuse_unless_ours
from ._schema import (
    SQL,
    STAT_COLUMNS,
    ForeignDatabaseError,
    is_busy,
    is_corruption,
    rid_of,
    row_check,
)
from ._space import Budget, Space

__all__ = ["CacheRecoveryWarning", "SQLiteProgramCache", "default_db_path"]

_IDS_MAX = 4096
_FLUSH_EVERY = 256  # operations between write-backs of uses and counters
_SECOND = 1_000_000_000  # ... or nanoseconds
_U32 = 0xFFFFFFFF
_GET = SQL.get  # the hit path avoids an attribute lookup
_PENDING_MAX = 4096


class CacheRecoveryWarning(RuntimeWarning):
    """A cache found its storage damaged: it moved it aside and started empty, or,
    when it could not, serves misses (compiles still work)."""


class SQLiteProgramCache(BatchRead, EntriesById, EntryCache):
    """Program cache in one SQLite file, safe across threads and processes.

    Guarantees (docs/cache.md has the full account):

    - **Never a corrupt hit**: every read checks the row's key digest and a key-seeded
      CRC-32 over payload, payload length and metadata; a row that fails is a miss,
      is removed (unless a writer replaced it) and counts in ``integrity_failures``.
    - **Never breaks the caller**: a lock held past ``timeout`` seconds, a full disk or
      a read-only file make a read a miss and a write a dropped store (one
      :class:`CacheWriteWarning` per handle, ``write_failures``); none deletes the file.
      A store waits for the write lock at most ``STORE_LOCK_WAIT_S`` (0.25 s, or
      ``timeout`` if shorter), then is kept in memory and written later (``_deferred``;
      ``lock_timeouts``): a process that holds the database locked for good costs a
      compile one bound, not one timeout per miss.
    - **Read-only**: a current cache file on a read-only file system (or a read-only
      file) opens for reading (``mode=ro``, else ``immutable=1``): hits are served,
      stores dropped with one warning.
    - **Only its own file**: a file that is not provably a cuforge database (a user's,
      someone else's database) raises ``ForeignDatabaseError`` (a ``CachePathError``)
      before anything is created beside it. A damaged cuforge database (its header's
      application id proves it) is moved to ``<path>.corrupt-<timestamp>`` (only while
      no other process uses it) and the cache starts empty (:class:`CacheRecoveryWarning`).
    - **Cap on real disk use**: ``max_size_bytes`` bounds database + WAL + index; LRU
      eviction walks an index on last use, vacuums and checkpoints (no table scans); a
      value that cannot fit is refused (``events.TOO_LARGE``), nothing evicted for it.
    - **Threads and processes**: a connection per thread, WAL (reads never wait for
      writers), ``lock(key)`` by record locks in ``<path>.lock``, counters in the
      database (``total_stats()``). ``durable=True``: ``synchronous=FULL``.
    """

    EVICT_LOW_WATER = 0.9
    STORE_LOCK_WAIT_S = 0.25
    STORE_LOCK_BACKOFF_S = 2.0
    DEFERRED_MAX_BYTES = 16 << 20
    HOUSEKEEPING_TIMEOUT_MS = 50
    CHECKPOINT_TIMEOUT_MS = 200

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_size_bytes: int | None = None,
        *,
        durable: bool = False,
        timeout: float = 5.0,
        trust_shared: bool = False,
    ) -> None:
        super().__init__()
        sqlite3 = load_sqlite3()
        self._sqlite = sqlite3
        self._error = sqlite3.Error
        self._max = check_max_size(max_size_bytes)
        self._timeout = check_timeout(timeout)
        # A store waits for the write lock at most STORE_LOCK_WAIT_S (or ``timeout``
        # if shorter), then is deferred (see _deferred).
        self._deferred = DeferredStores(
            int(min(self._timeout, self.STORE_LOCK_WAIT_S) * 1000),
            self.STORE_LOCK_BACKOFF_S,
            self.DEFERRED_MAX_BYTES,
        )
        self._durable = bool(durable)
        raw = default_db_path() if path is None else os.fspath(path)
        self._path = os.path.abspath(raw)
        if os.path.isdir(self._path):
            raise ValueError(
                f"SQLiteProgramCache path {self._path} is a directory; give the path of "
                "a database file (e.g. .../program-cache.db)"
            )
        refuse_unless_ours(sqlite3, self._path, self._timeout)  # before creating anything
        prepare_db_file(self._path, trust_shared)  # private, like FileStream (_safedir)
        budget = Budget(self._max)
        self._conns = Connections(
            sqlite3, self._path, self._timeout, pragmas(self._durable, budget.wal)
        )
        self._space = Space(
            budget,
            self._conns,
            self._path,
            self.EVICT_LOW_WATER,
            self.CHECKPOINT_TIMEOUT_MS,
            sqlite3.Error,
        )
        self._closed = False
        self._warned = False
        self._recovery_warned = False
        self._broken: str | None = None  # why this handle serves misses only
        self._read_only = False
        self._flush_mutex = threading.Lock()
        self._ids: dict[Any, tuple[bytes, int, int]] = {}
        self._pending: dict[int, int] = {}  # rid -> wall ns, not yet written
        self._flushed = CacheStats()
        self._ops = 0
        self._last_flush = time.monotonic_ns()
        self._lockfile = LockFile(self._path)
        try:
            opened = open_database(sqlite3, self._conns, self._lockfile, self._path, self._timeout)
        except BaseException as exc:
            self._conns.close_all()
            self._lockfile.release(remove_if_created=isinstance(exc, ForeignDatabaseError))
            raise
        self._broken = opened.broken
        self._read_only = opened.read_only  # hits only: stores are dropped (one warning)
        if opened.notice is not None:
            tail = "; this handle serves misses (compiles still work)" if opened.broken else ""
            self._warn_recovery(f"cuforge program cache {self._path}: {opened.notice}{tail}")
        # A handle dropped without close() still lets go of its connections and locks.
        self._finalizer = weakref.finalize(self, _release, self._conns, self._lockfile)
        self._finalizer.atexit = False  # the exit flush needs them; the OS frees them after
        _LIVE.add(self)

    def _warn_recovery(self, message: str) -> None:
        if not self._recovery_warned:
            self._recovery_warned = True
            warnings.warn(message, CacheRecoveryWarning, stacklevel=outside_level())

    def _damaged(self, exc: BaseException) -> None:
        mark_damaged(self._path)
        self._warn_recovery(
            f"cuforge program cache {self._path}: SQLite reports damage ({exc}); reads "
            "are misses, and the file is checked (and moved aside if damaged) when it is "
            "next opened while no other process uses it",
        )

    def _conn(self) -> Any:
        return self._conns.get()

    # -- properties ------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    @property
    def size_bytes(self) -> int:
        """Bytes on disk of the database, its WAL and its WAL index."""
        return sum(self._sizes(3))

    def _sizes(self, n: int = 2) -> list[int]:
        return self._space.sizes(n)

    # -- reads -------------------------------------------------------------------------
    def _ident(self, key: CacheKey) -> tuple[bytes, int, int]:
        """``(key digest, row id, check seed)`` of ``key`` (remembered per handle)."""
        try:
            got = self._ids.get(key)
        except TypeError:  # unhashable: let coerce_key name the problem
            got = None
        if got is None:
            kd = key_digest(coerce_key(key))
            got = (kd, rid_of(kd), key_seed(kd))
            if len(self._ids) >= _IDS_MAX:
                self._ids.clear()
            self._ids[key] = got
        return got

    def get_entry(self, key: CacheKey) -> CacheEntry | None:
        ident = self._ids.get(key) if type(key) is bytes else None
        if ident is None:
            ident = self._ident(key)
        if self._closed:
            raise ValueError("operation on a closed SQLiteProgramCache")
        kd, rid, seed = ident
        rows = None
        if self._broken is None:
            try:
                rows = self._conns.get().execute(_GET, (rid,)).fetchall()
            except self._error as exc:
                if is_corruption(exc):
                    self._damaged(exc)
        self._ops += 1
        if rows:
            digest, crc, meta, data = rows[0]
            if (  # a damaged record header can turn a column into text, a number or NULL
                type(data) is bytes
                and type(meta) is bytes
                and digest == kd
                and crc32(meta, crc32(data, (seed ^ len(data)) & _U32)) == crc
            ):
                stats = self._stats
                stats.hits += 1
                stats.bytes_read += len(data)
                pending = self._pending
                if rid not in pending:  # the first use per write-back is recorded
                    pending[rid] = time.time_ns()
                if self._ops >= _FLUSH_EVERY or monotonic_ns() - self._last_flush >= _SECOND:
                    self._housekeep(wait=False)
                return CacheEntry(data, meta)
            self._drop_damaged(rid, crc)
        if self._deferred.rows:  # stored by this handle, not written yet (lock held)
            kept = self._deferred.lookup(rid, kd)
            if kept is not None:
                self._stats.hits += 1
                self._stats.bytes_read += len(kept[7])
                return CacheEntry(kept[7], kept[6])
        self._stats.misses += 1
        if self._ops >= _FLUSH_EVERY:
            self._housekeep(wait=False)
        return None

    def _drop_damaged(self, rid: int, crc: int) -> None:
        """Count a row that does not verify and remove it -- unless a writer has
        replaced it since it was read (its check would differ)."""
        self._stats.integrity_failures += 1
        self._pending.pop(rid, None)
        with contextlib.suppress(self._error):
            immediate(self._conns.get(), SQL.drop_if_same, (rid, crc))

    # -- writes ------------------------------------------------------------------------
    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        """Store ``value``; failures become a warning + ``write_failures`` (see class)."""
        self.set_entry(key, value)

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> None:
        """Store ``value`` with ``meta``; failures become a warning + ``write_failures``."""
        kd, rid, seed = self._ident(key)
        data = coerce_value(value, "SQLiteProgramCache.__setitem__")
        check_meta(meta)
        self._check_open()
        if self._broken or self._read_only:
            self._write_failed(self._broken or "the file system or file is read-only")
            return
        size = len(data) + len(meta)
        if size > self._space.budget.share:  # could never fit: refused, nothing evicted
            self._stats.write_failures += 1
            self._space.refuse_too_large(self, size)
            return
        now = time.time_ns()
        row = (rid, kd, row_check(seed, data, meta), size, now, now, meta, data)
        self._pending.pop(rid, None)
        self._write_rows(self._deferred.with_new(row), self._deferred.wait_now_ms(), row)
        self._ops += 1
        if self._ops >= _FLUSH_EVERY:
            self._housekeep(wait=False)

    def _write_rows(self, rows: list[Row], wait_ms: int, new: Row | None) -> None:
        """Write ``rows`` (``new`` first, then the deferred ones), waiting at most
        ``wait_ms`` for the write lock; busy past it defers ``new`` (see _deferred).

        Each transaction holds at most a quarter of the WAL's allowance (``_deferred.batches``):
        deferred rows written in one go would grow the WAL past the cap (4 writers under
        a 2 MB cap, each catching up on ~50 deferred 4 KiB rows, left a 457 KB WAL).
        A busy lock between batches keeps the rows not yet written deferred."""
        conn = self._conn()
        self._conns.set_busy(conn, wait_ms)  # maintenance waits longer (full_wait)
        left = list(rows)
        budget = self._space.budget
        for batch in batches(rows, budget.rows, budget.wal // 4):
            try:
                self._space.begin(conn, evict=self._make_room)  # sizes checked under the lock
                try:
                    conn.executemany(SQL.put, batch)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except self._error as exc:
                self._write_stopped(exc, left, new)
                return
            del left[: len(batch)]
            for row in batch:  # written: an older deferred row of its id goes too
                self._deferred.forget(row[0])
            self._stats.stores += len(batch)
            self._stats.bytes_written += sum(len(r[7]) for r in batch)
        self._deferred.written()

    def _write_stopped(self, exc: BaseException, left: list[Row], new: Row | None) -> None:
        """A write of ``left`` (``new`` among them unless written) failed with ``exc``."""
        # A store that waited its bound (``new``; not a flush at exit or close) keeps
        # what is left for later; anything else drops it, counted.
        if new is not None and is_busy(exc):
            pending_new = any(r is new for r in left)
            if not pending_new or self._deferred.keep(new):
                self._deferred.timed_out()
                self._stats.lock_timeouts += 1
                events.note_dropped(
                    events.LOCKED, f"{self._path}: kept in memory until the write lock is free"
                )
                events.fail_open(
                    self,
                    events.LOCKED,
                    "cuforge program cache %s: another process holds the write lock for "
                    "more than %d ms; stores are kept in memory and written when it lets "
                    "go; counted in stats().lock_timeouts",
                    self._path,
                    self._deferred.wait_ms,
                )
                return
        self._deferred.clear()
        for _ in left:
            self._write_failed(exc)

    def _write_deferred(self, wait_ms: int) -> None:
        if self._deferred.rows and not self._broken:
            self._write_rows(list(self._deferred.rows.values()), wait_ms, None)

    def _write_failed(self, why: BaseException | str) -> None:
        self._stats.write_failures += 1
        busy = isinstance(why, BaseException) and is_busy(why)
        reason = events.READ_ONLY if self._read_only else events.FAILED
        events.note_dropped(events.LOCKED if busy else reason, f"{self._path}: {why}")
        if isinstance(why, BaseException) and is_corruption(why):
            self._damaged(why)
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"cuforge program cache {self._path}: could not store an entry ({why}); "
                "the result is still returned, only not cached. Later write failures of "
                "this cache handle are counted in stats().write_failures without a warning.",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )

    def __delitem__(self, key: CacheKey) -> None:
        kd, rid, _ = self._ident(key)
        self._check_open()
        if self._broken:
            raise KeyError(key)
        kept = self._deferred.lookup(rid, kd) is not None
        self._deferred.forget(rid)
        try:
            conn = self._conn()
            with self._conns.full_wait(conn):
                cur = immediate(conn, SQL.delete_key, (rid, kd))
        except self._error as exc:
            self._write_failed(exc)
            return
        if cur.rowcount == 0 and not kept:
            raise KeyError(key)

    def clear(self) -> None:
        """Remove every entry and give the space back to the file system."""
        self._check_open()
        if self._broken:
            return
        self._pending.clear()
        self._deferred.clear()
        try:
            conn = self._conn()
            with self._conns.full_wait(conn):
                delete_all(conn, self._space.budget.rows, self._space.begin)
        except self._error as exc:
            self._write_failed(exc)
            return
        # Giving the pages back is housekeeping: busy here fails nothing (the pages
        # are reused by later writes, or given back by a later eviction).
        wait = self.CHECKPOINT_TIMEOUT_MS
        with contextlib.suppress(self._error), self._conns.busy_timeout(conn, wait):
            vacuum(conn, 1 << 62, self._space.budget.rows, wait / 1000)
            checkpoint(conn, wait / 1000, truncate=True)

    def __len__(self) -> int:
        """Number of entries (kept by triggers: no scan)."""
        self._check_open()
        if self._broken:
            return 0
        return int(self._conn().execute("SELECT entries FROM cuforge_state").fetchall()[0][0])

    # -- eviction ----------------------------------------------------------------------
    def _make_room(self, db: int, wal: int, wait_ms: int = 0) -> None:
        """Evict and fold so the files fit the cap (``Space.make_room``); waits
        ``wait_ms`` (default CHECKPOINT_TIMEOUT_MS) for readers at each checkpoint."""
        self._space.make_room(db, wal, wait_ms, lambda: self._housekeep(False), self._evicted)

    def _evicted(self, rids: list[int]) -> None:
        for rid in rids:
            self._pending.pop(rid, None)
        self._stats.evictions += len(rids)

    # -- housekeeping: recorded uses and counters ----------------------------------------
    def _housekeep(self, wait: bool) -> bool:
        """Write pending uses and counter deltas in one transaction; whether all is written.

        ``wait=False`` (the hit path) gives up after a short busy wait; what was not
        written is kept for the next attempt.
        """
        if self._read_only:
            return True  # nothing can be written: uses and counters stay per handle
        if not self._flush_mutex.acquire(blocking=wait):
            return False
        pending: dict[int, int] = {}
        try:
            self._ops = 0
            self._last_flush = time.monotonic_ns()
            snap = self._stats.copy()
            deltas = [a - b for a, b in zip(snap._values(), self._flushed._values(), strict=True)]
            del deltas[len(STAT_COLUMNS) :]  # counters the table has columns for
            pending, self._pending = self._pending, {}
            batch = self._space.budget.rows  # each use rewrites a page: bound the WAL
            if len(pending) > batch:
                items = list(pending.items())
                pending, self._pending = dict(items[:batch]), dict(items[batch:])
            if self._broken or (not pending and not any(deltas)):
                return True
            conn = self._conns.get()
            brief = self.HOUSEKEEPING_TIMEOUT_MS
            with self._conns.busy_timeout(conn, brief) if not wait else self._conns.full_wait(conn):
                conn.execute("BEGIN IMMEDIATE")  # a few pages: the next writer folds
                try:
                    if pending:
                        now = time.time_ns()
                        uses = [(ns, r, ns, now) for r, ns in pending.items()]
                        conn.executemany(SQL.touch, uses)
                    if any(deltas):
                        conn.execute(SQL.add_stats, deltas)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            self._flushed = snap
            return True
        except self._error:
            if len(self._pending) < _PENDING_MAX:
                for rid, ns in pending.items():
                    self._pending.setdefault(rid, ns)
            return False
        finally:
            self._flush_mutex.release()

    def total_stats(self) -> CacheStats:
        """Counters summed over every process and handle that used this database.

        Other live handles contribute what they last wrote (every 256 operations or
        second, and at close).
        """
        self._check_open()
        self._housekeep(wait=True)
        now, then = self._stats._values(), self._flushed._values()
        unflushed = [a - b for a, b in zip(now, then, strict=True)]
        try:
            stored = list(self._conn().execute(SQL.read_stats).fetchall()[0])
        except (self._error, IndexError):
            stored = [0] * len(STAT_COLUMNS)
        stored += [0] * (len(now) - len(stored))  # counters kept per handle only
        return CacheStats(*(max(0, a + b) for a, b in zip(stored, unflushed, strict=True)))

    def zero_stats(self) -> None:
        """Make ``total_stats()`` count from zero for every process using this database.

        The stored counters are set to zero in one write transaction, and what this
        handle has counted so far is dropped from what it writes back. Other live
        handles keep counting and write back only what they counted since their last
        write-back (every 256 operations or second), so nothing is counted twice; what
        they had not yet written may still appear. ``stats()`` of a handle is its own
        and stays. Raises OSError when the database cannot be written (locked past
        ``timeout``, read-only, damaged).
        """
        self._check_open()
        if self._broken:
            raise OSError(f"{self._path}: {self._broken}")
        with self._flush_mutex:
            done = self._stats.copy()
            try:
                conn = self._conn()
                with self._conns.full_wait(conn):
                    immediate(conn, SQL.zero_stats)
            except self._error as exc:
                if is_corruption(exc):
                    self._damaged(exc)
                raise OSError(f"{self._path}: {exc}") from exc
            self._flushed = done

    # -- single-flight and lifetime ------------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """Cross-process per-key lock (a record lock in ``<path>.lock``); yields held.

        A holder that dies frees it at once; a live holder that outlasts ``timeout``
        makes waiters give up (False) and compile themselves.
        """
        kd = self._ident(key)[0]
        self._check_open()
        return self._lockfile.hold(kd, timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("operation on a closed SQLiteProgramCache")

    def _flush_at_exit(self) -> None:
        """Write kept stores and counters as close() does, waiting ``timeout`` (with the
        store's 0.25 s and 50 ms, a peer holding the write lock a little longer lost them)."""
        with self._conns.full_wait(self._conn()):
            self._write_deferred(int(self._timeout * 1000))
            self._housekeep(wait=True)

    def _after_fork_in_child(self) -> None:
        self._conns.forget_after_fork()
        self._flush_mutex = threading.Lock()
        self._space.after_fork()
        self._stats = CacheStats()  # the parent's counts are the parent's to write
        self._flushed = CacheStats()
        self._pending = {}
        self._deferred.clear()  # the parent's to write
        self._lockfile.use(0)

    def close(self) -> None:
        """Write counters and recorded uses, close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        with contextlib.suppress(Exception), self._conns.full_wait(self._conn()):
            self._flush_at_exit()  # kept stores and counters, waiting as long as a write may
            db, wal = self._sizes()
            if not self._broken and self._space.budget.needs_work(db, wal):
                # Leave the cache within its cap, waiting as long as a write would.
                self._space.retry_at = 0
                self._make_room(db, wal, int(self._timeout * 1000))
        self._finalizer()

    def __repr__(self) -> str:
        return f"SQLiteProgramCache({self._path!r}, max_size_bytes={self._max})"


def _release(conns: Connections, lockfile: LockFile) -> None:
    conns.close_all()
    lockfile.release()


_LIVE = LiveHandles(child_first=reset_after_fork)
