"""The SQLite cache's handle, :class:`SQLiteProgramCache`: the storage core over the
SQLite driver (``_driver``). Imported when the class is first used
(``cuforge.storage.sqlite`` re-exports it lazily), so that checking a ``sqlite://``
URL (``_url``) loads none of it."""

from __future__ import annotations

import os

from ..handle import SharedCache
from . import CacheRecoveryWarning
from ._driver import SQLiteDriver
from ._open import default_db_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..stats import CacheStats

__all__ = ["SQLiteProgramCache"]


class SQLiteProgramCache(SharedCache):
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
      A cuforge database of a newer layout than this cuforge reads raises
      ``NewerSchemaError`` and is never written; one of an older revision is brought
      up to date in place (``_schema``: no entry or counter lost).
    - **Cap on real disk use**: ``max_size_bytes`` bounds database + WAL + index, and
      is at least 72 KiB (``_floor``: what an empty database, the WAL's allowance and
      its index take, and a page; a smaller one raises ValueError before anything is
      created). A store evicts before it writes, least recently used first (an index
      on last use, no table scans), down to ~90 % of the entries' room, never the
      newest entry that fits alone; evictions reach ``total_stats()``, those at close
      too. A value that cannot fit beside the empty database is refused
      (``events.TOO_LARGE``), nothing evicted for it.
    - **Read-only handles** (``read_only=True``, ``?ro``, the commands that only look)
      write nothing: stores are refused, uses and counters stay in the handle, and
      closing it evicts nothing, whatever its cap.
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

    _driver: SQLiteDriver

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_size_bytes: int | None = None,
        *,
        durable: bool = False,
        timeout: float = 5.0,
        trust_shared: bool = False,
        read_only: bool = False,
    ) -> None:
        raw = default_db_path() if path is None else os.fspath(path)
        knobs = (self.EVICT_LOW_WATER, self.STORE_LOCK_WAIT_S, self.STORE_LOCK_BACKOFF_S,
                 self.DEFERRED_MAX_BYTES, self.HOUSEKEEPING_TIMEOUT_MS,
                 self.CHECKPOINT_TIMEOUT_MS)  # fmt: skip
        driver = SQLiteDriver(
            os.path.abspath(raw), max_size_bytes, durable, timeout, trust_shared, knobs,
            CacheRecoveryWarning, read_only,
        )  # fmt: skip
        super().__init__(driver)

    @property
    def path(self) -> str:
        """The database file."""
        return self._driver.path

    def total_stats(self) -> CacheStats:
        """Counters summed over every process and handle that used this database.

        Other live handles contribute what they last wrote (every 256 operations or
        second, and at close).
        """
        return super().total_stats()

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
        super().zero_stats()

    def __repr__(self) -> str:
        return f"SQLiteProgramCache({self.path!r}, max_size_bytes={self.max_size_bytes})"
