"""The FileStream driver: a cache directory's entries as the storage core asks for them.

What this module decides (the rest is the core's, ``storage.handle``): where an
entry's two files lie (``locate``), the verified read (``_hitmemo`` first, then
``_pairread``; a pair that does not verify is read once more, since a writer
replacing it mismatches for a moment), the atomic write and its size accounting
(``_atomicwrite``, ``_sizeindex``; eviction past the cap in ``_evict``), removals
through the ownership gate (``_entries``, ``_owned``), the per-key lock files
(``_locking``), the counter records (``_statsfile``) and the recorded cap (``_cap``).

Failure modes: every OS error of a store is its outcome (``failed``), never raised;
a pair larger than the cap is refused before anything is evicted (``too-large``);
another process holding the ledger's or ``evict.lock``'s lock past the bound defers
accounting or eviction (told to the core: ``lock_timeouts``, one warning); a
read-only driver creates, writes and deletes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from .._fsutil import check_mode
from .._integrity import SIDECAR_SIZE, SIDECAR_SUFFIX, key_seed, sidecar_for
from .._safedir import WORLD_MODE_HINT, DirRules
from ..driver import Driver
from ..outcome import FAILED, READ_ONLY, STORED_OUTCOME, TOO_LARGE, Damaged, StoreOutcome
from ..units import check_max_size
from ._anchor import EntriesAnchor
from ._atomicwrite import PairWriter, sweep_temps
from ._cap import keep_cap, recorded_cap
from ._hitmemo import HitMemo, LookingMemo
from ._locking import LOCK_WAIT_S, BoundedWait, FileKeyLock
from ._owned import open_owned_root
from ._pairread import Mismatch, PairNames, read_pair
from ._sizeindex import SizeLedger
from ._statsfile import FLUSH_EVERY, StatsStore, read_totals, zero_totals

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from ..driver import Found
    from ..entry import EntryInfo
    from ..protocol import Reports
    from ..stats import CacheStats
    from ._scan import Scanned

__all__ = ["FileStreamDriver"]

_BUSY = (
    "another process holds a lock of the cache (size.ledger or evict.lock) for more than "
    "{:.2f} s; size accounting and eviction are deferred until it lets go"
)


class FileStreamDriver(Driver):
    """The entries of the cache directory ``given`` (see the handle for the options);
    ``knobs``: ``(stale temp age s, access-time bump interval ns, eviction low water)``."""

    flush_every = FLUSH_EVERY

    def __init__(
        self,
        given: str,
        max_size_bytes: int | None,
        mode: int | None,
        durable: bool,
        trust_shared: bool,
        read_only: bool,
        knobs: tuple[float, int, float],
    ) -> None:
        self._durable = bool(durable)
        self.read_only = ro = bool(read_only)
        self.cap = check_max_size(max_size_bytes)
        self._dir_mode, self._file_mode = check_mode(mode)
        if mode is not None and mode & 0o002 and not trust_shared:
            raise ValueError(
                f"mode={oct(mode)} lets every user write the cache (and plant programs "
                f"this process runs); {WORLD_MODE_HINT}"
            )
        rules = DirRules.for_process(mode is not None and bool(mode & 0o070), trust_shared)
        # The root's proof is kept for every deletion (see _owned); a root that is a
        # symbolic link is resolved once: it cannot be re-pointed under us.
        root, owned = open_owned_root(given, self._dir_mode, self._file_mode, rules, ro)
        self.root, self._owned = root, owned
        self.label = f"cuforge program cache {root}"
        self._entries = os.path.join(root, "entries")
        self._tmp = os.path.join(root, "tmp")
        self._stats_dir = os.path.join(root, "stats")
        self._stale_ns, bump_ns, self._low_water = int(knobs[0] * 1e9), knobs[1], knobs[2]
        self._memo = (LookingMemo if ro else HitMemo)(bump_ns, self._read_pair)
        self._evict_mutex = threading.Lock()
        self._evict_wait = BoundedWait()
        self._busy_early = 0  # busy locks met before the core was bound
        modes = (self._dir_mode, self._file_mode)
        self._writer = PairWriter(self._tmp, self._entries, *modes, owned=owned)
        self._anchor = EntriesAnchor(self._entries)
        self._ledger: SizeLedger | None = None
        if not ro:
            sweep_temps(self._tmp, time.time_ns(), self._stale_ns, owned=owned)
            with contextlib.suppress(OSError):  # cannot write here; writes will fail and warn
                self._ledger = SizeLedger(
                    os.path.join(root, "size.ledger"), self._file_mode, self._scan_total,
                    self._lock_busy, owned=owned,
                )  # fmt: skip
            self.lease = self._hold
            self.claim = self._claim
        self._stats_store = StatsStore(self._stats_dir, self._tmp, *modes, owned=owned,
                                       read_only=ro)  # fmt: skip
        if self.cap is None:  # the cap is the cache's: kept for openers that pass none
            self.cap = recorded_cap(root)
        elif not ro:
            keep_cap(root, self.cap, self._file_mode)
        self._file_locks = FileKeyLock(os.path.join(root, "locks"), *modes, owned=owned)
        self.write_many = self._write_many

    def bind(self, reports: Reports) -> None:
        super().bind(reports)
        for _ in range(self._busy_early):
            self._lock_busy()

    # -- names and reads ------------------------------------------------------------
    def reader(self) -> HitMemo:
        """The memo, which falls back to the pair: a repeat hit is one call."""
        return self._memo

    def read(self, names: PairNames) -> Found:
        return self._memo.read(names)

    def locate(self, kd: bytes) -> PairNames:
        h = kd.hex()
        payload = os.path.join(self._entries, h[:2], h[2:])
        return PairNames(payload, payload + SIDECAR_SUFFIX, h[:2], kd, key_seed(kd), h[2:])

    def _read_pair(self, names: PairNames) -> Found:
        """The verified read; a mismatch is looked at twice (a writer replacing the
        pair under us mismatches too)."""
        result = read_pair(names, self._memo, self.reports.unreadable, self._anchor)
        if isinstance(result, Mismatch):
            result = read_pair(names, self._memo, self.reports.unreadable, self._anchor)
            if isinstance(result, Mismatch):
                return Damaged(result.problem, result)
        return result

    def peek(self, names: PairNames) -> Found:
        result = read_pair(names, None, self.reports.unreadable, self._anchor)
        return Damaged(result.problem, result) if isinstance(result, Mismatch) else result

    def drop(self, names: PairNames, damaged: Damaged) -> None:
        """Forget the pair; remove its files if they are still the ones read."""
        self._memo.forget(names.payload)
        if self.read_only:
            return
        from ._entries import unlink_pair

        bad: Mismatch = damaged.token
        freed = unlink_pair(self._anchor, names, bad.payload_fp, bad.sidecar_fp, self._owned)
        if freed:
            with contextlib.suppress(OSError):
                self._ledger_add(-freed)

    # -- writes ---------------------------------------------------------------------
    def write(self, names: PairNames, data: bytes, meta: bytes) -> StoreOutcome:
        size = len(data) + SIDECAR_SIZE + len(meta)  # the pair's bytes on disk
        if self.cap is not None and size > self.cap:
            return StoreOutcome(TOO_LARGE, f"{size} bytes, cap {self.cap}")
        self._memo.forget(names.payload)
        side = sidecar_for(names.key_digest, names.seed, data, meta)
        name = names.name
        try:
            old = self._writer.write_pair(
                names.shard, name, name + SIDECAR_SUFFIX, data, side, self._durable
            )
        except OSError as exc:
            return _not_written(exc)
        try:
            total = self._ledger_add(len(data) + len(side) - old)
            if self.cap is not None and total > self.cap:
                self._evict(names.payload)
        except OSError as exc:  # stored, but its size could not be accounted for
            self.reports.dropped(StoreOutcome(FAILED, _why(exc)))
        return STORED_OUTCOME

    def _write_many(self, batch: Sequence[tuple[PairNames, bytes, bytes]]) -> list[StoreOutcome]:
        """:meth:`write` of each, in order, with the directories opened once
        (``PairWriter.write_pairs``: each pair staged and published as one write does
        it, so a crash leaves each entry whole or absent) and the size ledger updated
        once for the batch (one lock instead of one per entry); eviction, when the
        batch passes the cap, never takes the last entry written. A ledger that cannot
        be updated counts each stored entry's accounting as dropped, as :meth:`write`
        does."""
        out: list[StoreOutcome] = []
        todo: list[tuple[str, str, str, bytes, bytes]] = []
        at: list[int] = []
        for names, data, meta in batch:
            size = len(data) + SIDECAR_SIZE + len(meta)
            if self.cap is not None and size > self.cap:
                out.append(StoreOutcome(TOO_LARGE, f"{size} bytes, cap {self.cap}"))
                continue
            self._memo.forget(names.payload)
            side = sidecar_for(names.key_digest, names.seed, data, meta)
            at.append(len(out))
            out.append(STORED_OUTCOME)
            todo.append((names.shard, names.name, names.name + SIDECAR_SUFFIX, data, side))
        delta, stored, last = 0, 0, ""
        for n, item, answer in zip(at, todo, self._writer.write_pairs(todo, self._durable),
                                   strict=True):  # fmt: skip
            if isinstance(answer, OSError):
                out[n] = _not_written(answer)
                continue
            delta += len(item[3]) + len(item[4]) - answer
            stored += 1
            last = batch[n][0].payload
        if stored:
            try:
                total = self._ledger_add(delta)
                if self.cap is not None and total > self.cap:
                    self._evict(last)
            except OSError as exc:  # stored, but their sizes could not be accounted for
                for _ in range(stored):
                    self.reports.dropped(StoreOutcome(FAILED, str(exc)))
        return out

    def remove(self, names: PairNames) -> bool:
        from ._entries import remove_names

        self._memo.forget(names.payload)
        freed, removed = remove_names(self._anchor, names, self._owned)
        if freed:
            with contextlib.suppress(OSError):
                self._ledger_add(-freed)
        return removed

    # -- size accounting, eviction, listing -------------------------------------------
    def _ledger_add(self, delta: int) -> int:
        return 0 if self._ledger is None else self._ledger.add(delta)

    def _scan(self, now_ns: int) -> tuple[list[Scanned], int]:
        from ._evict import scan_all

        owned = None if self.read_only else self._owned  # read-only: look, sweep nothing
        return scan_all(self._entries, self._tmp, now_ns, self._stale_ns, owned)

    def _scan_total(self) -> int:
        return self._scan(time.time_ns())[1]

    def _exclusive_scan(self) -> AbstractContextManager[bool]:
        """Serialise scans that delete: threads by a mutex, processes by evict.lock."""
        from ._evict import exclusive_scan

        lock_path = os.path.join(self.root, "evict.lock")
        return exclusive_scan(
            self._evict_mutex, lock_path, self._file_mode, self._evict_wait, self._lock_busy
        )

    def _lock_busy(self) -> None:
        """Another process held the ledger's or ``evict.lock``'s lock past the bound:
        the operation went on without it (accounting or eviction deferred)."""
        reports = getattr(self, "reports", None)
        if reports is None:  # met while opening: told once the core is bound
            self._busy_early += 1
            return
        text = _BUSY.format(LOCK_WAIT_S)
        reports.lock_busy(
            text + "; counted in stats().lock_timeouts",
            f"{self.label}: {text}. Entries are still stored and served. Counted in "
            "stats().lock_timeouts without another warning.",
        )

    def _evict(self, keep: str) -> None:
        """Evict down to the low-water mark; never ``keep``, the entry just written."""
        assert self.cap is not None and self._ledger is not None
        from ._evict import evict_lru

        evicted = evict_lru(
            self._ledger, self.cap, self._low_water, self._exclusive_scan(), self._scan, keep,
            owned=self._owned,
        )  # fmt: skip
        if evicted:
            self.reports.evicted(evicted)

    def clear(self) -> None:
        """Remove every entry (only names of the layout: a user's file stays)."""
        from ._evict import clear_all

        self._memo.clear()
        clear_all(self._ledger, self._exclusive_scan(), self._scan, self._owned)

    def count(self) -> int:
        """Entries with both files present (a directory scan; not verified)."""
        found, _ = self._scan(time.time_ns())
        return sum(1 for e in found if e.payload is not None and e.sidecar is not None)

    def size(self) -> int:
        """The shared ledger's running total (an estimate); read-only: a scan."""
        if self.read_only:
            return self._scan_total()
        return 0 if self._ledger is None else self._ledger.total()

    def scan(self) -> Iterator[EntryInfo]:
        from ._entries import list_entries

        yield from list_entries(self._entries)

    def foreign_objects(self) -> list[tuple[str, str]]:
        from ._scan import find_foreign

        return find_foreign(self._entries)

    def remove_foreign_object(self, path: str) -> bool:
        from ._entries import remove_foreign_object

        return remove_foreign_object(self._anchor, self._entries, self._owned, path)

    # -- locks, counters, lifetime ----------------------------------------------------
    def _hold(self, names: PairNames, timeout: float | None) -> AbstractContextManager[bool]:
        return self._file_locks.hold(names.key_digest.hex(), timeout)

    def _claim(
        self, names: PairNames, timeout: float | None
    ) -> AbstractContextManager[tuple[bool, Found]]:
        """The key's lock; when it was waited for and its holder finished, the entry
        that holder stored (the verified read) instead, held by nobody
        (``FileKeyLock.claim``). The entry is not read before the lock is taken."""
        return self._file_locks.claim(
            names.key_digest.hex(), timeout, lambda: self._memo.read(names)
        )

    def flush(self, stats: CacheStats, final: bool) -> None:
        self._stats_store.flush(stats)

    def counts_lost(self, stats: CacheStats) -> str | None:
        self._stats_store.flush(stats)
        return self._stats_store.lost

    def totals(self, stats: CacheStats) -> CacheStats:
        if not self.read_only:
            self._stats_store.flush(stats)
        return read_totals(self._stats_dir)

    def zero(self, stats: CacheStats) -> None:
        self._stats_store.flush(stats)
        zero_totals(self._stats_dir, self._tmp, self._file_mode)

    def at_exit(self) -> None:
        if self._ledger is not None:  # off the ledger's count: a clean exit
            self._ledger.close()
            self._ledger = None

    def after_fork(self) -> None:
        # The child shares the parent's descriptors and so its file locks.
        self._evict_mutex = threading.Lock()
        self._evict_wait = BoundedWait()
        self._writer.renew()
        self._stats_store.forget_after_fork()
        if self._ledger is not None:
            try:
                self._ledger.reopen()
            except OSError:
                self._ledger = None

    def close(self) -> None:
        self._stats_store.close()
        if self._ledger is not None:
            self._ledger.close()
        self._anchor.close()
        self._writer.close()


def _why(exc: OSError) -> str:
    """What stopped a store, for a message that already names the cache (its label):
    the error (``Read-only file system``), not the internal file it met (a writer's
    ``tmp/<pid>-<tag>.alive.new``, a shard), which says nothing to a user."""
    return exc.strerror or type(exc).__name__


def _not_written(exc: OSError) -> StoreOutcome:
    """A store the file system refused: ``READ_ONLY`` when it is mounted read-only
    (EROFS: nothing can be written there, by whoever mounted it so -- "not stored:
    read-only", as a handle opened read-only says), else ``FAILED``; the detail is
    :func:`_why`'s."""
    return StoreOutcome(READ_ONLY if exc.errno == errno.EROFS else FAILED, _why(exc))
