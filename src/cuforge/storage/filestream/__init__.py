"""A program cache in a directory, safe to share between processes (and users).

On-disk layout under the cache root::

    entries/<2 hex>/<62 hex>          the raw compiled binary (cuobjdump reads it)
    entries/<2 hex>/<62 hex>.cfsum    its digest sidecar with the entry's metadata (see _integrity)
    tmp/                              staging for atomic writes (see _atomicwrite)
    size.ledger                       shared running byte total (see _sizeindex)
    size.ledger.users                 one shared lock per open handle (crash recovery)
    evict.lock                        serialises eviction scans across processes (see _evict)
    locks/<64 hex>.lock               single-flight locks, one per key being filled
    stats/                            persisted counters (see _statsfile)
    CACHEDIR.TAG                      marks the directory as a cuforge cache (see _owned)

The handle is the storage core (``storage.handle``) over the FileStream driver
(``_driver``), which says where an entry's files lie and how they are read and
written. Who may write these directories, and links below the root: ``_safedir``;
which directories are the cache's and which of their files it may delete:
``_owned``; reading and verifying a pair: ``_pairread`` (repeat hits: ``_hitmemo``);
listing and removing entries by id: ``_entries``.

The 64 hex digits are blake2b-256 of the key (the entry's public id, see
``entry.entry_id``), so any key length maps to a short fixed name.
"""

from __future__ import annotations

import os

from ..handle import SharedCache
from ._driver import FileStreamDriver
from ._owned import DEFAULT_NAME, not_a_cache

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from ..stats import CacheStats

__all__ = ["FileStreamProgramCache", "default_cache_dir", "not_a_cache"]


def default_cache_dir() -> str:
    """``<user cache dir>/cuforge/program-cache`` as platformdirs defines it."""
    from platformdirs import user_cache_path

    return str(user_cache_path("cuforge", appauthor=False) / DEFAULT_NAME)


class FileStreamProgramCache(SharedCache):
    """Program cache in a directory shared by any number of processes.

    Guarantees:

    - **Never a corrupt hit.** Every read checks the payload against its sidecar
      (length, CRC-32 and key binding); a truncated, empty, bit-flipped or
      misplaced entry is a miss, is removed (only if nobody replaced it meanwhile)
      and counts in ``stats().integrity_failures``. Payload files stay the raw
      binary. A repeat hit in one process may serve the bytes it verified
      earlier for that key, after one ``stat`` shows the same file (inode, size,
      mtime) still stands at the entry's path; the full check reruns at least
      once a second per entry, and a replaced, deleted or cleared entry is never
      served from memory.
    - **Atomic entries.** Writes stage in ``tmp/`` (fsync with ``durable=True``) and publish
      with ``os.replace`` (sidecar first, then payload), so readers see an old
      pair, a new pair, or a mismatch -- which is a miss, never wrong bytes.
    - **Never breaks the caller.** ``cache[key] = value`` does not raise
      ``OSError``: a store that fails (disk full, file too large, permission,
      read-only directory) is dropped, warned about once per handle
      (:class:`CacheWriteWarning`) and counted in ``write_failures``. A read that
      fails is a miss. ``clear()`` and eviction tolerate concurrent writers.
      Bad arguments (key or value types, a missing path-backed ObjectCode file)
      still raise.
    - **Size cap across processes.** ``max_size_bytes`` (> 0 or None) bounds the
      sum of entry file sizes (payloads, sidecars, in-flight temp files). It is
      recorded in the cache (``<root>/cap``, see ``_cap``): a later opener that
      passes None uses it; one that passes a cap replaces it. A shared ledger makes
      a write O(1); when the total passes the cap, one process scans and evicts
      least-recently-read entries down to 90% of the cap. The cap is soft: it can
      be passed briefly by writes that land during a scan. A value whose pair is
      larger than the cap is refused (``write_failures``, nothing evicted for it).
    - **LRU by reads.** A hit bumps the entry's access time explicitly
      (independent of mount options) at most once a second per entry and process
      (whatever the time on the file), so recency is exact to about a second. An
      access time in the future (a clock that was ahead, a copied cache) counts as
      now; a store is never evicted by the eviction it starts.
    - **Private by default.** Without ``mode=`` directories are created ``0o700`` and
      files ``0o600``. Opening refuses (:class:`~cuforge.storage.UnsafeCacheError`)
      a root or any directory below it that users other than its owner (and the
      group, with a group ``mode=``) can write, or that another user owns -- they
      could plant programs this process runs -- unless ``trust_shared=True`` (or
      entries are signed; see ``_safedir``). ``entries/``, ``tmp/``, ``stats/`` or
      ``locks/`` that is a symbolic link is refused too; a link where a shard
      belongs is a foreign object (:meth:`foreign_objects`). Writes, scans and
      deletions never follow one; the root itself may be a link (resolved once, at
      open).
    - **Group sharing.** ``mode=0o2770`` (for example) creates directories with
      that mode and setgid and files group read/write (``0o660``), whatever the
      umask, so all members of the directory's group can use the cache.
    - **Only its own directory.** The root carries cuforge's ``CACHEDIR.TAG``: a
      missing or empty directory is tagged at open, and so is an older cuforge's
      cache; any other directory is refused (``CachePathError``), whatever
      ``trust_shared`` says. Every deletion goes through ``ownership.delete_owned``
      and takes only names of the layout: a user's ``entries/notes.txt`` stays.
    - **Read-only handles** (``read_only=True``, ``?ro``) create, write and delete
      nothing (no directories, tag, sweep, ledger, counters or atime stamps); a
      missing directory is an empty cache; stores are dropped (``write_failures``);
      ``clear``/``del``/``remove_entry``/``zero_stats`` raise ``PermissionError``.
    - **Path errors** (a path that is a file, cannot be created, is refused) raise
      :class:`~cuforge.storage.CachePathError` (an ``OSError``): one line naming
      the path, the problem and the fix.

    Not crash-durable: a host crash can lose recent entries (directories are not
    fsynced) but can never make a damaged entry a hit. ``len()`` and ``clear()``
    scan the directory. Call ``close()`` (or use ``with``) to persist statistics.
    """

    _driver: FileStreamDriver

    #: Temp files older than this (seconds) are a crashed writer's: swept.
    STALE_TEMP_AGE_S = 3600.0
    #: A hit stamps its entry's access time at most this often (ns, per entry and process).
    ATIME_BUMP_INTERVAL_NS = 1_000_000_000
    #: An eviction frees the cache down to this fraction of the cap.
    EVICT_LOW_WATER = 0.9

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_size_bytes: int | None = None,
        mode: int | None = None,
        *,
        durable: bool = False,
        trust_shared: bool = False,
        read_only: bool = False,
    ) -> None:
        given = os.path.abspath(default_cache_dir() if path is None else os.fspath(path))
        knobs = (self.STALE_TEMP_AGE_S, self.ATIME_BUMP_INTERVAL_NS, self.EVICT_LOW_WATER)
        driver = FileStreamDriver(
            given, max_size_bytes, mode, durable, trust_shared, read_only, knobs
        )
        super().__init__(driver)

    @property
    def path(self) -> str:
        """The cache root directory."""
        return self._driver.root

    def total_stats(self) -> CacheStats:
        """Counters summed over every process and handle that used this directory.

        Other live handles contribute what they last flushed (every few hundred
        operations and at close); a read-only handle's own counts are not included.
        """
        return super().total_stats()

    def zero_stats(self) -> None:
        """Make ``total_stats()`` count from zero for every process using this directory.

        Live handles keep their own counters: the totals they have persisted so far
        are recorded as a baseline that later totals subtract (see ``_statsfile``), so
        what any process counts after this call is counted once. Raises OSError when
        the baseline cannot be written (a read-only cache; PermissionError for a
        read-only handle).
        """
        super().zero_stats()

    def foreign_objects(self) -> list[tuple[str, str]]:
        """``(path, what)`` of every object under ``entries/`` that is not the cache's: a
        FIFO, socket, device, link or directory where an entry file belongs, anything
        but a directory where a shard belongs (``cuforge cache verify`` lists them).
        Paths are relative to ``entries/``; nothing is opened."""
        self._check_open()
        return self._driver.foreign_objects()

    def remove_foreign_object(self, path: str) -> bool:
        """Remove one object :meth:`foreign_objects` named (a directory with what it
        holds; links are removed, never followed). Whether it went; a regular entry
        file is never removed here, nor anything at a name that is not the layout's
        (a shard's, an entry file's) or in a root not proven the cache's."""
        self._check_writable()
        return self._driver.remove_foreign_object(path)

    def __repr__(self) -> str:
        ro = ", read_only=True" if self.read_only else ""
        return f"FileStreamProgramCache({self.path!r}, max_size_bytes={self.max_size_bytes}{ro})"
