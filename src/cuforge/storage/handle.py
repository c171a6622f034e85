"""The storage core: one request lifecycle for every backend, over its driver.

A :class:`DriverCache` is a cache handle; its :class:`~cuforge.storage.driver.Driver`
moves the bytes. Everything else happens here, once:

- **Keys.** ``bytes`` or ``str`` (UTF-8), digested once per key and handle: the
  driver's locator is remembered per key (bounded), so a repeat lookup costs one
  dict probe before the driver's read.
- **Lookups** count one hit or miss, or as the caller says
  (``base.EntryCache.get_entry``: ``count``, ``count_miss``). A damaged entry is a
  miss, counted in ``integrity_failures``, logged, and dropped by the driver unless
  it was replaced since it was read.
- **Stores** return a :class:`~cuforge.storage.outcome.StoreOutcome`. A store the
  handle refuses by design (read-only) or the driver could not make (too large,
  unreachable, failed, locked) is counted in ``write_failures`` (a store kept back
  to be written later, in ``lock_timeouts``), noted for the pipeline
  (``events.note_dropped``), logged once per cause, and -- for a failure -- warned
  once per handle (:class:`CacheWriteWarning`); nothing raises for the medium.
- **Counters** (``stats()``) are written here only; the driver persists them on a
  schedule (every ``flush_every`` operations or ``flush_interval_s`` seconds, at
  close and at exit) and tells the core what it meets on its own (``Reports``).
- **Locks.** ``lock(key)`` queues this process's threads on a per-key lock, then
  takes the driver's cross-process lease (if it has one) with what is left of the
  timeout; a lock that cannot be had yields False, never blocks for good.
  ``claim(key)`` is the same lock, also handing over the entry when the wait ended
  because a peer stored it and the driver read it (counted as a hit).
- **Lifetime.** A closed handle raises ValueError; fork and exit are told to every
  open handle (counters of a parent are never reported by its child).

Counters are plain integers updated without a lock: under heavy threading an
increment can rarely be lost, never invented.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from time import monotonic, monotonic_ns

from cuforge._stack import outside_level

from . import events
from ._livehandles import LiveHandles
from ._values import coerce_key, coerce_value
from .base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheReadWarning,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    KeyLocks,
    check_meta,
)
from .entry import CacheEntry, EntryInfo, entry_id, key_digest
from .outcome import PRESENT, READ_ONLY, STORED, TOO_LARGE, Damaged, StoreOutcome
from .stats import CacheStats

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from .driver import Driver, Found

__all__ = ["LIVE", "DriverCache", "SharedCache"]

_KEYS_MAX = 4096  # keys whose locator a handle remembers

#: Open handles, told about fork() and interpreter exit.
LIVE = LiveHandles()


class DriverCache(EntryCache):
    """A cache handle: the core's request lifecycle over ``driver`` (module docstring)."""

    def __init__(self, driver: Driver) -> None:
        super().__init__()
        self._driver = driver
        self._reader = driver.reader()  # asked once: a hit is one call into the driver
        self._locs: dict[Any, Any] = {}
        self._closed = False
        self._ops = 0
        self._every = driver.flush_every
        self._interval = int(driver.flush_interval_s * 1e9)
        # Operations before the schedule is looked at: every one when a flush can be
        # due by time, else only when it is due by count (one compare per hit).
        self._check = 1 if self._interval else self._every
        self._last = monotonic_ns()
        self._warned: set[str] = set()
        driver.bind(_Reporter(self))
        LIVE.add(self)

    @property
    def read_only(self) -> bool:
        """Whether this handle only looks: stores are dropped, nothing is deleted."""
        return self._driver.read_only

    @property
    def in_memory(self) -> bool:
        """Whether the entries live in this process only (nothing is persisted)."""
        return self._driver.in_memory

    @property
    def host_lock(self) -> bool:
        """Whether :meth:`lock` holds every process of this host, and talks to no
        server (a writable cache on local files): a tier's host level."""
        driver = self._driver
        return driver.lease is not None and not driver.remote and not driver.read_only

    @property
    def hands_over(self) -> bool:
        """Whether :meth:`claim` asks the medium for the entry before it takes the
        lock: then it hands the entry over when it is there, and holds the lock only
        when it is not (a remote driver's claim)."""
        driver = self._driver
        return driver.claim is not None and driver.claim_reads_first and not driver.read_only

    @property
    def max_size_bytes(self) -> int | None:
        """The size cap in bytes this handle keeps (None: none)."""
        return self._driver.cap

    @property
    def size_bytes(self) -> int:
        """The bytes the cache's entries occupy, as the backend measures them: a shared
        running total (FileStream), the database's files (SQLite), a listing (a server)."""
        return self._driver.size()

    # -- keys ---------------------------------------------------------------------------
    def _loc(self, key: CacheKey) -> Any:
        """The driver's locator of ``key`` (remembered per key); TypeError/ValueError
        for a key that is not bytes or str."""
        try:
            loc = self._locs.get(key)
        except TypeError:  # unhashable: let coerce_key name the problem
            loc = None
        if loc is None:
            loc = self._driver.locate(key_digest(coerce_key(key)))
            if len(self._locs) >= _KEYS_MAX:
                self._locs.clear()
            self._locs[key] = loc
        return loc

    # -- lookups ------------------------------------------------------------------------
    def get_entry(
        self, key: CacheKey, *, count: bool = True, count_miss: bool | None = None
    ) -> CacheEntry | None:
        """The verified ``(data, meta)`` under ``key``, or None on any miss; counted as
        a hit or a miss (see the module docstring for ``count`` and ``count_miss``)."""
        loc = self._locs.get(key) if type(key) is bytes else None
        if loc is None:
            loc = self._loc(key)
        if self._closed:
            raise ValueError(f"operation on a closed {type(self).__name__}")
        found = self._reader.read(loc)
        if found:  # a verified entry: None and Damaged are false
            if count:
                stats = self._stats
                stats.hits += 1
                stats.bytes_read += len(found.data)  # type: ignore[union-attr]
            self._ops += 1
            if self._ops >= self._check:
                self._due()
            return found  # type: ignore[return-value]
        return self._missed(key, loc, found, count if count_miss is None else count_miss)

    def _missed(self, key: CacheKey, loc: Any, found: Found, count: bool) -> CacheEntry | None:
        """A lookup that did not hit (None); a damaged entry is counted, logged and
        dropped."""
        if isinstance(found, Damaged):
            driver = self._driver
            self._stats.integrity_failures += 1
            driver.drop(loc, found)
            events.fail_open(
                self,
                events.INTEGRITY,
                "%s: entry %s failed its integrity check (%s); %s, counted in "
                "stats().integrity_failures, and compiled again",
                driver.label,
                entry_id(coerce_key(key))[:12],
                found.problem,
                "left in place (a read-only handle)" if driver.read_only else "removed",
            )
        if count:
            self._stats.misses += 1
        self._tick()
        return None

    def get_entries(
        self, keys: Iterable[CacheKey], *, count: bool = True
    ) -> list[CacheEntry | None]:
        """``get_entry`` of each key, in order, with the same checks and counters; the
        driver's batch read answers them together where the medium can."""
        ks = list(keys)
        locs = [self._loc(key) for key in ks]  # a bad key raises before any lookup
        self._check_open()
        many = self._driver.read_many
        if many is None or len(ks) < 2:
            return [self.get_entry(key, count=count) for key in ks]
        out: list[CacheEntry | None] = []
        for key, loc, found in zip(ks, locs, many(locs), strict=True):
            if type(found) is CacheEntry:
                self._tally(found, count)
                self._tick()
                out.append(found)
            else:
                out.append(self._missed(key, loc, found, count))
        return out

    # -- stores -------------------------------------------------------------------------
    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> StoreOutcome:
        """Store ``value`` with ``meta`` under ``key``; what happened. Nothing raises for
        the medium; bad arguments (key, value or ``meta`` types, a missing path-backed
        ObjectCode file) and a closed handle do."""
        loc = self._locs.get(key) if type(key) is bytes else None
        if loc is None:
            loc = self._loc(key)
        data = coerce_value(value, f"{type(self).__name__}.__setitem__")
        check_meta(meta)
        self._check_open()
        driver = self._driver
        if driver.read_only:
            outcome = StoreOutcome(READ_ONLY, f"{driver.label} was opened read-only")
        else:
            outcome = driver.write(loc, data, meta)
        self._account(outcome, 1, len(data))
        return outcome

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        """Store ``value`` (see :meth:`set_entry`)."""
        self.set_entry(key, value)

    def set_entries(
        self, items: Iterable[tuple[CacheKey, CacheValue, bytes]]
    ) -> list[StoreOutcome]:
        """``set_entry`` of each ``(key, value, meta)``, in order, with the same checks,
        counters and outcomes; the driver's batch write stores them together where
        the medium can. Bad arguments raise before anything is stored."""
        batch: list[tuple[Any, bytes, bytes]] = []
        for key, value, meta in items:
            loc = self._loc(key)
            data = coerce_value(value, f"{type(self).__name__}.set_entries")
            batch.append((loc, data, check_meta(meta)))
        self._check_open()
        driver = self._driver
        if driver.read_only:
            refused = StoreOutcome(READ_ONLY, f"{driver.label} was opened read-only")
            outcomes = [refused] * len(batch)
        elif driver.write_many is None or len(batch) < 2:
            outcomes = [driver.write(loc, data, meta) for loc, data, meta in batch]
        else:
            outcomes = driver.write_many(batch)
        for (_, data, _), outcome in zip(batch, outcomes, strict=True):
            self._account(outcome, 1, len(data))
        return outcomes

    def update(
        self,
        items: Mapping[CacheKey, CacheValue] | Iterable[tuple[CacheKey, CacheValue]],
        /,
    ) -> None:
        """Store many entries (without metadata); the driver's batch write sends them
        together where the medium can. Not transactional: a bad key or value raises
        after the entries before it are stored."""
        many = self._driver.write_many
        if many is None:
            super().update(items)
            return
        self._check_open()
        pairs = items.items() if isinstance(items, Mapping) else items
        batch: list[tuple[Any, bytes, bytes]] = []
        try:
            for key, value in pairs:
                data = coerce_value(value, f"{type(self).__name__}.update")
                batch.append((self._loc(key), data, b""))
        finally:
            if batch:
                if self._driver.read_only:
                    refused = StoreOutcome(READ_ONLY, f"{self._driver.label} was opened read-only")
                    outcomes = [refused] * len(batch)
                else:
                    outcomes = many(batch)
                for (_, data, _), outcome in zip(batch, outcomes, strict=True):
                    self._account(outcome, 1, len(data))

    def _account(self, outcome: StoreOutcome, n: int, nbytes: int) -> None:
        """Count ``n`` stores (``nbytes`` of payload) that ended as ``outcome``."""
        if outcome.reason == STORED:
            if outcome is not PRESENT:  # an equal entry already there: nothing written
                stats = self._stats
                stats.stores += n
                stats.bytes_written += nbytes
        else:
            for _ in range(n):
                self._dropped(outcome)
        self._tick()

    def _dropped(self, outcome: StoreOutcome) -> None:
        """A store that did not land: counted, noted, logged, warned (module docstring)."""
        stats = self._stats
        driver = self._driver
        events.note_dropped(outcome.reason, outcome.detail)
        if outcome.kept:
            stats.lock_timeouts += 1
            events.fail_open(
                self, events.LOCKED, "%s: %s; counted in stats().lock_timeouts",
                driver.label, outcome.detail,
            )  # fmt: skip
            return
        stats.write_failures += 1
        if outcome.reason == TOO_LARGE:
            events.fail_open(
                self, events.TOO_LARGE,
                "%s: an entry larger than the cache's size cap (%s) is not stored, and "
                "nothing is evicted for it; counted in stats().write_failures",
                driver.label, outcome.detail,
            )  # fmt: skip
            return
        if outcome.reason == READ_ONLY and driver.read_only:
            return  # by design: nothing to report
        if outcome.reason == READ_ONLY:  # a writable handle on a read-only file system
            events.fail_open(
                self, events.WRITE, "%s: could not store an entry (%s); counted in "
                "stats().write_failures", driver.label, outcome.detail,
            )  # fmt: skip
            # Not "counted in stats()": the cache's shared counters live on the same
            # read-only file system, so `cuforge cache stats` never sees these.
            self._warn_once(
                "write",
                CacheWriteWarning,
                f"{driver.label}: could not store an entry ({outcome.detail}); the result "
                "is still returned, only not cached. The cache still serves hits; later "
                "stores of this handle are dropped without a warning, and nothing is "
                "recorded on a read-only file system, counters included.",
            )
            return
        events.fail_open(
            self, events.WRITE,
            "%s: could not store an entry (%s); the result is still returned, only not "
            "cached; counted in stats().write_failures", driver.label, outcome.detail,
        )  # fmt: skip
        if not driver.remote and "write" not in self._warned:  # a remote driver warned
            # Whether the shared counters get this handle's counts is found by
            # persisting them now (once: what the warning promises must hold).
            lost = driver.counts_lost(self._stats)
            later = (
                "Later write failures of this cache handle are counted in "
                "stats().write_failures without a warning."
                if lost is None
                else f"{events.COUNTS_LOST} ({lost})."
            )
            self._warn_once(
                "write",
                CacheWriteWarning,
                f"{driver.label}: could not store an entry ({outcome.detail}); the result "
                f"is still returned, only not cached. {later}",
            )

    # -- removal ------------------------------------------------------------------------
    def __delitem__(self, key: CacheKey) -> None:
        """Delete ``key``'s entry; KeyError when there is none."""
        loc = self._loc(key)
        self._check_writable()
        if not self._driver.remove(loc):
            raise KeyError(key)

    def clear(self) -> None:
        """Remove every entry of this cache (and only its own)."""
        self._check_writable()
        self._driver.clear()

    def __len__(self) -> int:
        """Entries now (a snapshot; other processes may change it at once)."""
        self._check_open()
        return self._driver.count()

    # -- listing and maintenance ----------------------------------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry, unverified, in no particular order."""
        self._check_open()
        yield from self._driver.scan()

    def check_entry(self, entry_id: str) -> str | None:
        """None when the entry verifies, else what is wrong with it; KeyError when no
        entry has this id. Not a use of the entry."""
        self._check_open()
        loc = self._driver.locate_id(entry_id)
        found = None if loc is None else self._driver.peek(loc)
        if found is None:
            raise KeyError(entry_id)
        return found.problem if isinstance(found, Damaged) else None

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        """The verified entry with this id, or None (absent or damaged); not a use."""
        self._check_open()
        loc = self._driver.locate_id(entry_id)
        found = None if loc is None else self._driver.peek(loc)
        return found if isinstance(found, CacheEntry) else None

    def remove_entry(self, entry_id: str) -> bool:
        """Remove the entry with this id; whether one went."""
        self._check_writable()
        loc = self._driver.locate_id(entry_id)
        return loc is not None and bool(self._driver.remove(loc))

    # -- single-flight ------------------------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """Per-key lock across this process's threads, then the driver's cross-process
        lease (none on a read-only handle); yields whether it is held. After
        ``timeout`` seconds (None: no limit) it yields False and the caller goes on."""
        loc = self._loc(key)
        self._check_open()
        return self._hold(key_digest(coerce_key(key)), loc, timeout)

    def claim(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT, *, count: bool = True
    ) -> AbstractContextManager[tuple[bool, CacheEntry | None]]:
        """:meth:`lock`, yielding ``(held, entry)``: ``entry`` is the verified entry
        (counted as a hit, ``held`` False) when the wait ended because a peer stored
        it and the driver's answer carried it -- nothing to fill, nothing to look up
        again -- else None (look again as after ``lock``). A driver that cannot hand
        entries over (no ``claim``) yields ``(held, None)``. ``count=False``: the entry
        is not counted (a wrapper that checks it more counts it, ``_tally``)."""
        loc = self._loc(key)
        self._check_open()
        return self._claim(key_digest(coerce_key(key)), loc, timeout, count)

    @contextmanager
    def _claim(
        self, kd: bytes, loc: Any, timeout: float | None, count: bool = True
    ) -> Iterator[tuple[bool, CacheEntry | None]]:
        driver = self._driver
        claim = driver.claim
        if claim is None or driver.read_only:
            with self._hold(kd, loc, timeout) as held:
                yield held, None
            return
        start = monotonic()
        with self._key_locks.hold(kd, timeout) as local:
            if not local:
                yield False, None
                return
            left = None if timeout is None else max(0.0, timeout - (monotonic() - start))
            with claim(loc, left) as (held, found):
                if not found:  # None, or a damaged entry: the look-again drops it
                    yield held, None
                    return
                if count:
                    self._tally(found, True)  # type: ignore[arg-type]
                self._tick()
                yield held, found  # type: ignore[misc]

    @contextmanager
    def _hold(self, kd: bytes, loc: Any, timeout: float | None) -> Iterator[bool]:
        start = monotonic()
        with self._key_locks.hold(kd, timeout) as local:
            lease = self._driver.lease
            if not local or lease is None or self._driver.read_only:
                yield local
                return
            left = None if timeout is None else max(0.0, timeout - (monotonic() - start))
            with lease(loc, left) as held:
                yield held

    # -- counters -----------------------------------------------------------------------
    def _tick(self) -> None:
        """One operation done: flush the counters when they are due."""
        self._ops += 1
        if self._ops >= self._check:
            self._due()

    def _due(self) -> None:
        """Flush when ``flush_every`` operations or ``flush_interval_s`` passed."""
        if self._ops >= self._every or (
            self._interval and monotonic_ns() - self._last >= self._interval
        ):
            self._flush(False)

    def _flush(self, final: bool) -> None:
        """Let the driver persist the counters; a failure waits for the next flush."""
        self._ops = 0
        self._last = monotonic_ns()
        with contextlib.suppress(Exception):  # counted in memory; persisted later
            self._driver.flush(self._stats, final)

    def zero_stats(self) -> None:
        """Restart the counters this cache reports for all its users from zero (see the
        backend's ``zero_stats``). PermissionError on a read-only handle."""
        self._check_writable()
        self._driver.zero(self._stats)

    def _warn_once(self, key: str, category: type[Warning], text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            message = category(text)
            if isinstance(message, (CacheReadWarning, CacheWriteWarning)):
                message.once = (self._driver.label, key)
            warnings.warn(message, stacklevel=outside_level())

    # -- lifetime -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"operation on a closed {type(self).__name__}")

    def _check_writable(self) -> None:
        self._check_open()
        if self._driver.read_only:
            raise PermissionError(f"{self._driver.label} was opened read-only")

    def close(self) -> None:
        """Persist the counters and release what the driver holds. Idempotent; the
        handle is then unusable."""
        if self._closed:
            return
        self._closed = True
        LIVE.discard(self)
        self._flush(True)
        self._driver.close()

    def _flush_at_exit(self) -> None:
        if not self._closed:
            self._flush(True)
            self._driver.at_exit()

    def _after_fork_in_child(self) -> None:
        # The parent's counts are the parent's to report; so are the per-key locks its
        # threads hold (a child that kept them would wait out the timeout for a key the
        # parent has long let go, and must take the driver's lease like any process).
        self._stats = CacheStats()
        self._key_locks = KeyLocks()
        self._ops = 0
        self._driver.after_fork()


class SharedCache(DriverCache):
    """A handle on a cache other handles share (a directory, a database, a server):
    it has totals over all of them."""

    def total_stats(self) -> CacheStats:
        """Counters summed over every process and handle that used this cache (live
        handles contribute what they last flushed)."""
        self._check_open()
        return self._driver.totals(self._stats)


class _Reporter:
    """A driver's ``reports`` (``storage.protocol.Reports``): counted and logged on its
    handle, held weakly (the handle owns the driver)."""

    __slots__ = ("_handle",)

    def __init__(self, handle: DriverCache) -> None:
        self._handle = weakref.ref(handle)

    def _live(self) -> DriverCache:
        handle = self._handle()
        if handle is None:  # pragma: no cover - a driver outliving its handle
            raise ReferenceError("the cache handle is gone")
        return handle

    def counts(self) -> CacheStats:
        return self._live()._stats

    def unreadable(self, exc: BaseException) -> None:
        h = self._live()
        events.fail_open(
            h, events.READ, "%s: could not read an entry (%s); treated as a miss",
            h._driver.label, exc,
        )  # fmt: skip

    def unreachable(self, n: int = 1) -> None:
        self._live()._stats.read_failures += n

    def evicted(self, n: int) -> None:
        self._live()._stats.evictions += n

    def stored(self, n: int, nbytes: int) -> None:
        stats = self._live()._stats
        stats.stores += n
        stats.bytes_written += nbytes

    def dropped(self, outcome: StoreOutcome) -> None:
        self._live()._dropped(outcome)

    def lock_busy(self, message: str, warning: str | None = None) -> None:
        h = self._live()
        h._stats.lock_timeouts += 1
        events.fail_open(h, events.LOCKED, "%s: %s", h._driver.label, message)
        if warning is not None:
            h._warn_once("lock", CacheWriteWarning, warning)

    def warn_once(self, key: str, category: type[Warning], text: str) -> None:
        self._live()._warn_once(key, category, text)
