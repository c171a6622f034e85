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

Who may write these directories, and links below the root: see ``_safedir``; which
directories are the cache's and which of their files it may delete: ``_owned``.
Reading and verifying a pair: ``_pairread``; listing and removing entries by id:
``_entries``.

The 64 hex digits are blake2b-256 of the key (the entry's public id, see
``entry.entry_id``), so any key length maps to a short fixed name.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from contextlib import AbstractContextManager

from cuforge._stack import outside_level

from .. import events
from .._fsutil import check_mode
from .._integrity import SIDECAR_SIZE, SIDECAR_SUFFIX, key_seed, sidecar_for
from .._livehandles import LiveHandles
from .._safedir import DirRules
from .._values import coerce_key, coerce_value
from ..base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    check_meta,
)
from ..entry import CacheEntry, is_entry_id, key_digest
from ..memory import check_max_size
from ..stats import CacheStats
from ._anchor import EntriesAnchor
from ._atomicwrite import PairWriter, sweep_temps
from ._byid import EntriesById
from ._cap import keep_cap, recorded_cap
from ._hitmemo import HitMemo, LookingMemo
from ._locking import LOCK_WAIT_S, BoundedWait, FileKeyLock
from ._owned import open_owned_root
from ._pairread import Mismatch, PairNames, read_pair
from ._sizeindex import SizeLedger
from ._statsfile import FLUSH_EVERY, StatsStore, read_totals, zero_totals

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from ._scan import Scanned

__all__ = ["FileStreamProgramCache", "default_cache_dir"]

_NAME_CACHE_MAX = 4096


def default_cache_dir() -> str:
    """``<user cache dir>/cuforge/program-cache`` as platformdirs defines it."""
    from platformdirs import user_cache_path

    return str(user_cache_path("cuforge", appauthor=False) / "program-cache")


class FileStreamProgramCache(EntriesById, EntryCache):
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
      entries are signed; see ``_safedir``). A directory below the root that is a
      symbolic link is refused too, and writes, scans and deletions never follow
      one; the root itself may be a link (resolved once, at open).
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

    STALE_TEMP_AGE_S = 3600.0
    ATIME_BUMP_INTERVAL_NS = 1_000_000_000
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
        super().__init__()
        self._durable = bool(durable)
        self._read_only = ro = bool(read_only)
        self._max = check_max_size(max_size_bytes)
        self._dir_mode, self._file_mode = check_mode(mode)
        if mode is not None and mode & 0o002 and not trust_shared:
            raise ValueError(
                f"mode={oct(mode)} lets every user write the cache (and plant programs "
                "this process runs); use a group mode such as 0o2770, or pass "
                "trust_shared=True"
            )
        given = os.path.abspath(default_cache_dir() if path is None else os.fspath(path))
        rules = DirRules.for_process(mode is not None and bool(mode & 0o070), trust_shared)
        # The root's proof is kept for every deletion (see _owned); a root that is a
        # symbolic link is resolved once: it cannot be re-pointed under us.
        root, owned = open_owned_root(given, self._dir_mode, self._file_mode, rules, ro)
        self._root, self._owned = root, owned
        self._entries = os.path.join(root, "entries")
        self._tmp = os.path.join(root, "tmp")
        self._stats_dir = os.path.join(root, "stats")
        self._locks_dir = os.path.join(root, "locks")
        self._closed = False
        self._warned = False
        self._names: dict[Any, PairNames] = {}
        self._memo = (LookingMemo if ro else HitMemo)(self.ATIME_BUMP_INTERVAL_NS)
        self._evict_mutex = threading.Lock()
        self._evict_wait = BoundedWait()
        self._lock_warned = False
        self._writer = PairWriter(
            self._tmp, self._entries, self._dir_mode, self._file_mode, owned=owned
        )
        self._anchor = EntriesAnchor(self._entries)
        self._ledger: SizeLedger | None = None
        if not ro:
            self._sweep_temps(time.time_ns())
            with contextlib.suppress(OSError):  # cannot write here; writes will fail and warn
                self._ledger = SizeLedger(
                    os.path.join(root, "size.ledger"), self._file_mode, self._scan_total,
                    self._lock_busy, owned=owned,
                )  # fmt: skip
        modes = (self._dir_mode, self._file_mode)
        self._stats_store = StatsStore(
            self._stats_dir, self._tmp, *modes, owned=owned, read_only=ro
        )
        if self._max is None:  # the cap is the cache's: kept for openers that pass none
            self._max = recorded_cap(root)
        elif not ro:
            keep_cap(root, self._max, self._file_mode)
        self._ops = 0
        self._file_locks = FileKeyLock(self._locks_dir, *modes, owned=owned)
        _LIVE.add(self)

    # -- properties ----------------------------------------------------------------
    @property
    def path(self) -> str:
        """The cache root directory."""
        return self._root

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    @property
    def read_only(self) -> bool:
        """Whether this handle only looks (``read_only=True``; see the class)."""
        return self._read_only

    @property
    def size_bytes(self) -> int:
        """The shared ledger's running total of cache bytes (an estimate); a read-only
        handle, which keeps no ledger, scans."""
        if self._read_only:
            return self._scan_total()
        return 0 if self._ledger is None else self._ledger.total()

    # -- names ---------------------------------------------------------------------
    def _names_for(self, key: CacheKey) -> PairNames:
        try:
            names = self._names.get(key)
        except TypeError:  # unhashable: let coerce_key name the problem
            names = None
        if names is None:
            names = self._names_of(key_digest(coerce_key(key)))
            if len(self._names) >= _NAME_CACHE_MAX:
                self._names.clear()
            self._names[key] = names
        return names

    def _names_of(self, kd: bytes) -> PairNames:
        h = kd.hex()
        shard = os.path.join(self._entries, h[:2])
        payload = os.path.join(shard, h[2:])
        return PairNames(payload, payload + SIDECAR_SUFFIX, h[:2], kd, key_seed(kd), h[2:])

    def _names_of_id(self, entry_id: str) -> PairNames:
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            raise KeyError(entry_id)
        return self._names_of(bytes.fromhex(entry_id))

    # -- reads ---------------------------------------------------------------------
    def get_entry(self, key: CacheKey) -> CacheEntry | None:
        if self._closed:
            raise ValueError("operation on a closed FileStreamProgramCache")
        names = self._names.get(key) if type(key) is bytes else None
        if names is None:
            names = self._names_for(key)
        memo = self._memo
        if memo._entries:
            entry = memo.recall(names.payload)
            if entry is not None:
                stats = self._stats
                stats.hits += 1
                stats.bytes_read += len(entry.data)
                self._ops += 1
                if self._ops >= FLUSH_EVERY:
                    self._flush_stats()
                return entry
        result = read_pair(names, memo, self._read_failed, self._anchor)
        if isinstance(result, Mismatch):
            # A writer replacing the pair under us also mismatches: look once more.
            result = read_pair(names, memo, self._read_failed, self._anchor)
            if isinstance(result, Mismatch):
                self._drop_corrupt(names, result)
                result = None
        if result is None:
            self._stats.misses += 1
        else:
            self._stats.hits += 1
            self._stats.bytes_read += len(result.data)
        self._ops += 1
        if self._ops >= FLUSH_EVERY:
            self._flush_stats()
        return result

    def _drop_corrupt(self, names: PairNames, bad: Mismatch) -> None:
        self._memo.forget(names.payload)
        ro = self._read_only
        if ro:
            freed = 0
        else:
            from ._entries import unlink_pair

            freed = unlink_pair(self._anchor, names, bad.payload_fp, bad.sidecar_fp, self._owned)
        self._stats.integrity_failures += 1
        if freed:
            self._ledger_add(-freed)
        events.fail_open(
            self,
            events.INTEGRITY,
            "cuforge program cache %s: entry %s failed its integrity check (%s); %s, "
            "counted in stats().integrity_failures, and compiled again",
            self._root,
            names.key_digest.hex()[:12],
            bad.problem,
            "left in place (a read-only handle)" if ro else "removed",
        )

    def _read_failed(self, exc: OSError) -> None:
        events.fail_open(
            self,
            events.READ,
            "cuforge program cache %s: could not read an entry (%s); treated as a miss",
            self._root,
            exc,
        )

    # -- writes --------------------------------------------------------------------
    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        """Store ``value``; OS errors become a warning + ``write_failures`` (see class)."""
        self.set_entry(key, value)

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> None:
        """Store ``value`` with ``meta``; OS errors become a warning + ``write_failures``."""
        self._check_open()
        names = self._names_for(key)
        data = coerce_value(value, "FileStreamProgramCache.__setitem__")
        check_meta(meta)
        if self._read_only:
            self._stats.write_failures += 1
            events.note_dropped(events.READ_ONLY, f"{self._root} was opened read-only")
            return
        size = len(data) + SIDECAR_SIZE + len(meta)  # the pair's bytes on disk
        if self._max is not None and size > self._max:
            self._too_large(size, self._max)
            return
        self._memo.forget(names.payload)
        try:
            delta = self._write_pair(names, data, meta)
        except OSError as exc:
            self._write_failed(exc)
            return
        self._stats.stores += 1
        self._stats.bytes_written += len(data)
        self._ops += 1
        if self._ops >= FLUSH_EVERY:
            self._flush_stats()
        try:
            total = self._ledger_add(delta)
            if self._max is not None and total > self._max:
                self._evict(names.payload)
        except OSError as exc:
            self._write_failed(exc)

    def _write_pair(self, names: PairNames, data: bytes, meta: bytes) -> int:
        """Publish payload + sidecar; return the change in bytes on disk."""
        side = sidecar_for(names.key_digest, names.seed, data, meta)
        name = os.path.basename(names.payload)
        old = self._writer.write_pair(
            names.shard, name, name + SIDECAR_SUFFIX, data, side, self._durable
        )
        return len(data) + len(side) - old

    def _write_failed(self, exc: OSError) -> None:
        self._stats.write_failures += 1
        events.note_dropped(events.FAILED, f"{self._root}: {exc}")
        events.fail_open(
            self,
            events.WRITE,
            "cuforge program cache %s: could not store an entry (%s); the result is still "
            "returned, only not cached; counted in stats().write_failures",
            self._root,
            exc,
        )
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"cuforge program cache {self._root!s}: could not store an entry "
                f"({exc}); the result is still returned, only not cached. Later write "
                "failures of this cache handle are counted in stats().write_failures "
                "without a warning.",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )

    def _too_large(self, size: int, cap: int) -> None:
        """Refuse a pair larger than the cap (storing it would evict every other entry
        and then itself): dropped, counted in ``write_failures``, nothing evicted."""
        self._stats.write_failures += 1
        events.note_dropped(events.TOO_LARGE, f"{size} bytes, cap {cap}")
        events.fail_open(
            self,
            events.TOO_LARGE,
            "cuforge program cache %s: an entry of %d bytes is larger than the cache's "
            "size cap (%d bytes); not stored, nothing evicted for it; counted in "
            "stats().write_failures",
            self._root,
            size,
            cap,
        )

    def __delitem__(self, key: CacheKey) -> None:
        self._check_writable()
        names = self._names_for(key)
        self._memo.forget(names.payload)
        freed, removed = self._remove_by_names(names)
        if not removed:
            raise KeyError(key)
        with contextlib.suppress(OSError):
            self._ledger_add(-freed)

    def _remove_by_names(self, names: PairNames) -> tuple[int, bool]:
        from ._entries import remove_names

        return remove_names(self._anchor, names, self._owned)

    # -- size accounting and eviction ----------------------------------------------
    def _ledger_add(self, delta: int) -> int:
        return 0 if self._ledger is None else self._ledger.add(delta)

    def _scan(self, now_ns: int) -> tuple[list[Scanned], int]:
        from ._evict import scan_all

        owned = None if self._read_only else self._owned  # read-only: look, sweep nothing
        return scan_all(self._entries, self._tmp, now_ns, int(self.STALE_TEMP_AGE_S * 1e9), owned)

    def _scan_total(self) -> int:
        return self._scan(time.time_ns())[1]

    def _sweep_temps(self, now_ns: int) -> int:
        return sweep_temps(self._tmp, now_ns, int(self.STALE_TEMP_AGE_S * 1e9), owned=self._owned)

    def _exclusive_scan(self) -> AbstractContextManager[bool]:
        """Serialise scans that delete: threads by a mutex, processes by evict.lock."""
        from ._evict import exclusive_scan

        lock_path = os.path.join(self._root, "evict.lock")
        return exclusive_scan(
            self._evict_mutex, lock_path, self._file_mode, self._evict_wait, self._lock_busy
        )

    def _lock_busy(self) -> None:
        """Another process held the size ledger's or ``evict.lock``'s lock past the
        bound: the operation went on without it (accounting or eviction deferred)."""
        self._stats.lock_timeouts += 1
        events.fail_open(
            self,
            events.LOCKED,
            "cuforge program cache %s: another process holds a lock of the cache "
            "(size.ledger or evict.lock) for more than %.2f s; size accounting and "
            "eviction are deferred until it lets go; counted in stats().lock_timeouts",
            self._root,
            LOCK_WAIT_S,
        )
        if not self._lock_warned:
            self._lock_warned = True
            warnings.warn(
                f"cuforge program cache {self._root!s}: another process holds a lock of "
                f"the cache (size.ledger or evict.lock) for more than {LOCK_WAIT_S} s; "
                "entries are still stored and served, size accounting and eviction are "
                "deferred until it lets go. Counted in stats().lock_timeouts without "
                "another warning.",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )

    def _evict(self, keep: str) -> None:
        """Evict down to the low-water mark; never ``keep``, the entry just written."""
        assert self._max is not None and self._ledger is not None
        from ._evict import evict_lru

        self._stats.evictions += evict_lru(
            self._ledger, self._max, self.EVICT_LOW_WATER, self._exclusive_scan(), self._scan,
            keep,
            owned=self._owned,
        )  # fmt: skip

    def clear(self) -> None:
        """Remove every entry; concurrent writers' new entries may survive. Never raises
        for files that vanish or change meanwhile; a user's file among them stays (only
        names of the layout go). PermissionError on a read-only handle."""
        self._check_writable()
        self._memo.clear()
        from ._evict import clear_all

        clear_all(self._ledger, self._exclusive_scan(), self._scan, self._owned)

    def __len__(self) -> int:
        """Entries with both files present (a directory scan; does not verify them)."""
        self._check_open()
        found, _ = self._scan(time.time_ns())
        return sum(1 for e in found if e.payload is not None and e.sidecar is not None)

    # -- single-flight, statistics, lifetime ------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """Cross-process per-key lock (a lock file under ``locks/``); yields held.

        The OS releases the lock when its holder dies, so a crashed or killed
        compile frees waiters at once; a live holder that outlasts ``timeout``
        makes waiters give up (False) and compile themselves. If the lock file
        cannot be created (read-only cache), yields False at once. A read-only handle
        holds an in-process lock only (it creates no lock file).
        """
        self._check_open()
        if self._read_only:
            return super().lock(key, timeout)
        return self._file_locks.hold(self._names_for(key).key_digest.hex(), timeout)

    def total_stats(self) -> CacheStats:
        """Counters summed over every process and handle that used this directory.

        Other live handles contribute what they last flushed (every few hundred
        operations and at close); a read-only handle's own counts are not included.
        """
        if not self._read_only:
            self._flush_stats()
        return read_totals(self._stats_dir)

    def zero_stats(self) -> None:
        """Make ``total_stats()`` count from zero for every process using this directory.

        Live handles keep their own counters: the totals they have persisted so far
        are recorded as a baseline that later totals subtract (see ``_statsfile``), so
        what any process counts after this call is counted once. Raises OSError when
        the baseline cannot be written (a read-only cache; PermissionError for a
        read-only handle).
        """
        self._check_writable()
        self._flush_stats()
        zero_totals(self._stats_dir, self._tmp, self._file_mode)

    def _flush_stats(self) -> None:
        self._ops = 0
        self._stats_store.flush(self._stats)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("operation on a closed FileStreamProgramCache")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise PermissionError(f"cuforge program cache {self._root} was opened read-only")

    def _after_fork_in_child(self) -> None:
        # The child shares the parent's descriptors and so its file locks; it
        # must not flush the parent's counts as its own.
        self._evict_mutex = threading.Lock()
        self._evict_wait = BoundedWait()
        self._writer.renew()
        self._stats = CacheStats()
        self._ops = 0
        self._stats_store.forget_after_fork()
        if self._ledger is not None:
            try:
                self._ledger.reopen()
            except OSError:
                self._ledger = None

    def _flush_at_exit(self) -> None:
        self._flush_stats()
        if self._ledger is not None:  # off the ledger's count: a clean exit
            self._ledger.close()
            self._ledger = None

    def close(self) -> None:
        """Persist statistics and release files. Idempotent; the handle is then unusable."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        self._stats_store.close(self._stats)
        if self._ledger is not None:
            self._ledger.close()
        self._anchor.close()
        self._writer.close()

    def __repr__(self) -> str:
        ro = ", read_only=True" if self._read_only else ""
        return f"FileStreamProgramCache({self._root!r}, max_size_bytes={self._max}{ro})"


_LIVE = LiveHandles()
