"""The bytes-in/bytes-out cache interface every storage backend implements."""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager

from cuforge import _warm
from cuforge._hashing import blake2b

from ._values import coerce_key
from .entry import CacheEntry, EntryInfo
from .stats import CacheStats

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from .outcome import StoreOutcome

__all__ = [
    "CacheKey",
    "CacheValue",
    "CacheWriteWarning",
    "KeyLocks",
    "ProgramCacheResource",
    "meta_key",
]

CacheKey = bytes | str
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    from cuforge._typing import ObjectCodeLike, Self

    #: bytes, bytearray, memoryview, or an ObjectCode-like object (``.code`` + ``.code_type``).
    CacheValue: TypeAlias = bytes | bytearray | memoryview | ObjectCodeLike
else:
    CacheValue = object

DEFAULT_LOCK_TIMEOUT = 120.0


class KeyLocks:
    """A table of per-key locks, each dropped when its last user leaves.

    ``hold(key, timeout)`` yields True when this thread holds the key's lock and
    False when ``timeout`` (seconds; None waits forever) expired first -- the
    caller then proceeds unlocked (fall-through), it is never blocked for good.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[bytes, list[Any]] = {}  # key -> [lock, users]

    @contextmanager
    def hold(self, key: bytes, timeout: float | None) -> Iterator[bool]:
        with self._guard:
            slot = self._locks.get(key)
            if slot is None:
                slot = self._locks[key] = [threading.Lock(), 0]
            slot[1] += 1
        lock: threading.Lock = slot[0]
        acquired = lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
            with self._guard:
                slot[1] -= 1
                if slot[1] == 0:
                    del self._locks[key]


_LAZY_STATE = {"_stats": CacheStats, "_key_locks": KeyLocks}
_LAZY_LOCK = threading.Lock()


class CacheWriteWarning(RuntimeWarning):
    """A cache could not store an entry; the program still compiled and works.
    ``once``: what a handle warns about once (its cache's name, the kind of failure),
    so that a program with several handles on one cache can say it once too."""

    once: tuple[str, str] | None = None


class CacheReadWarning(RuntimeWarning):
    """A cache could not be read (a server down, a level that raised); the lookup was
    a miss, so the program was compiled and works. ``once``: as for
    :class:`CacheWriteWarning`."""

    once: tuple[str, str] | None = None


def meta_key(key: bytes) -> bytes:
    """Where a backend without native metadata keeps ``key``'s metadata: a derived key."""
    return blake2b(key, digest_size=32, person=b"cuforge-meta").digest()


class ProgramCacheResource(abc.ABC):
    """Abstract mapping from cache keys to compiled program bytes.

    Keys are ``bytes`` or ``str`` (UTF-8 encoded); any other key type raises
    ``TypeError``. Values may be ``bytes``, ``bytearray``, ``memoryview`` or an
    ObjectCode (a path-backed one is read when stored); reads always return
    ``bytes`` equal to what was stored. A missing, corrupt or unreadable entry is a
    miss: ``KeyError`` from ``cache[key]``, ``default`` from ``get``.

    There is deliberately no ``__contains__``: with other processes writing and
    evicting, ``if key in cache: cache[key]`` can fail between the two calls. Use
    ``cache.get(key)`` and test for ``None``.

    Single-flight protocol (what ``Program.compile(cache=)`` does, and what any
    caller that fills the cache should do)::

        data = cache.get(key)                 # 1. look up
        if data is None:
            with cache.lock(key) as held:     # 2. on a miss, take the key's lock
                data = cache.get(key)         # 3. look again: a peer may have filled it
                if data is None:
                    data = compile()          # 4. compile
                    cache[key] = data         # 5. store; the lock is released on exit

    ``held`` is False when the lock could not be taken within the timeout (a hung
    holder, or a backend that cannot lock): the caller then compiles anyway, so a
    lock problem costs a duplicate compile, never a stuck process.

    Every entry may carry a small metadata byte string (``set_entry``/``get_entry``)
    stored and verified together with the payload; the built-in backends keep it
    natively. A subclass that implements only the mapping methods inherits a
    fallback that keeps metadata under a derived key (:func:`meta_key`): correct,
    but two entries, so payload and metadata can be replaced separately by racing
    writers -- a reader that then finds mismatched metadata treats the entry as a
    miss (``Program.compile`` checks that the record names the key it asked for).

    Listing and per-entry maintenance (``iter_entries``, ``check_entry``,
    ``read_entry``, ``remove_entry``) serve the command line (``cuforge cache ls``,
    ``verify``, ``prune``, ``show``); a backend that cannot enumerate its entries
    raises NotImplementedError there and works for everything else.

    Backends are context managers; ``close()`` releases what they hold. A subclass
    need not call ``super().__init__()``: its counters and per-key locks are then made
    on first use.
    """

    def __init__(self) -> None:
        self._stats = CacheStats()
        self._key_locks = KeyLocks()

    if not TYPE_CHECKING:  # hidden from mypy: it would make every attribute legal

        def __getattr__(self, name: str) -> Any:
            """The base state of a subclass that skipped ``super().__init__()``, made on
            first use (once, under a lock: two threads must share one ``KeyLocks``).
            Only reached when normal lookup failed, so it costs initialised handles
            nothing."""
            make = _LAZY_STATE.get(name)
            if make is None:
                raise AttributeError(
                    f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self
                )
            with _LAZY_LOCK:
                value = self.__dict__.get(name)
                if value is None:
                    value = self.__dict__[name] = make()
            return value

    # -- mapping protocol --------------------------------------------------------
    @abc.abstractmethod
    def __getitem__(self, key: CacheKey) -> bytes:
        """The stored bytes for ``key``; ``KeyError`` on a miss."""

    @abc.abstractmethod
    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        """Store ``value`` under ``key``, replacing any previous entry."""

    @abc.abstractmethod
    def __delitem__(self, key: CacheKey) -> None:
        """Remove ``key``; ``KeyError`` if it is absent."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of entries (a snapshot; other processes may change it at once)."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    def __contains__(self, key: object) -> bool:
        raise TypeError(
            "program caches do not support 'in': the answer can be stale before the "
            "next call when other processes share the cache; use cache.get(key)"
        )

    __iter__ = None  # not iterable; keeps Python from iterating via __getitem__(0)

    def get(self, key: CacheKey, default: bytes | None = None) -> bytes | None:
        """The stored bytes for ``key``, or ``default`` on any miss."""
        try:
            return self[key]
        except KeyError:
            return default

    def update(
        self,
        items: Mapping[CacheKey, CacheValue] | Iterable[tuple[CacheKey, CacheValue]],
        /,
    ) -> None:
        """Store many entries, from a mapping or from ``(key, value)`` pairs.

        Each goes through ``__setitem__``; not transactional: an exception part-way
        leaves the earlier entries stored.
        """
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            self[key] = value

    # -- entries with metadata --------------------------------------------------
    def get_entry(self, key: CacheKey) -> CacheEntry | None:
        """The verified ``(data, meta)`` stored under ``key``, or None on any miss.

        cuforge's own caches (:class:`EntryCache`) also take ``count=False``: a lookup
        that is part of a request already counted (``storage.failopen.lookup`` passes
        it only to them)."""
        data = self.get(key)
        if data is None:
            return None
        return CacheEntry(data, self.get(meta_key(coerce_key(key))) or b"")

    def get_entries(self, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
        """``get_entry`` of each key, in order (None for each miss), with the same
        verification and counters; a caller that needs several entries at once (a
        Triton kernel's files) asks once. Backends that can answer together do:
        Redis in one round trip, SQLite in one query, a tier level by level (each
        level asked only for what the faster ones missed). This default asks one key
        at a time. Raises TypeError for a key of another type, before any lookup.
        """
        ks = [coerce_key(key) for key in keys]
        return [self.get_entry(k) for k in ks]

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> StoreOutcome | None:
        """Store ``value`` with ``meta`` under ``key`` (same failure rules as ``cache[key] =``).

        cuforge's caches answer what happened (:class:`~cuforge.storage.outcome.StoreOutcome`:
        stored, or not stored and why); this mapping fallback answers None (it cannot
        tell). Raises TypeError when ``meta`` is not bytes.
        """
        check_meta(meta)
        mkey = meta_key(coerce_key(key))
        if meta:
            self[mkey] = meta  # metadata first: a reader that finds the payload finds it
        else:
            with contextlib.suppress(KeyError):
                del self[mkey]
        self[key] = value
        return None

    def set_entries(
        self, items: Iterable[tuple[CacheKey, CacheValue, bytes]]
    ) -> Sequence[StoreOutcome | None]:
        """``set_entry`` of each ``(key, value, meta)``, in order; each one's outcome.
        Backends that can write together do (``DriverCache``: the driver's batch
        write); this default stores one at a time."""
        return [self.set_entry(key, value, meta) for key, value, meta in items]

    # -- listing and maintenance (the command line's view) ----------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry, unverified, in no particular order (a snapshot as it goes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its entries")

    def check_entry(self, entry_id: str) -> str | None:
        """None when the entry verifies, else what is wrong with it (one line).

        Raises KeyError when no entry has this id.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot check entries by id")

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        """The verified entry with this id, or None when it is absent or damaged."""
        raise NotImplementedError(f"{type(self).__name__} cannot read entries by id")

    def remove_entry(self, entry_id: str) -> bool:
        """Remove the entry with this id; whether something was removed."""
        raise NotImplementedError(f"{type(self).__name__} cannot remove entries by id")

    # -- single-flight -----------------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """Per-key lock for single-flight fills; yields whether it is held.

        This default serialises threads of this process only. Backends shared
        between processes override it. After ``timeout`` seconds (None: no limit)
        it yields False and the caller proceeds unlocked.
        """
        return self._key_locks.hold(coerce_key(key), timeout)

    # -- statistics and lifetime -------------------------------------------------
    def stats(self) -> CacheStats:
        """A copy of this handle's counters."""
        return self._stats.copy()

    def _tally(self, entry: CacheEntry | None, count: bool = True, rejected: bool = False) -> None:
        """Count one lookup's answer, made without counting (``get_entry(count=False)``)
        by a wrapper or a request that now knows its result: a hit of ``entry``, or a
        miss -- ``rejected``: because the entry failed its signature (also a
        ``signature_failure``). Nothing when ``count`` is False: a request counts its
        answer once, rejection included."""
        if not count:
            return
        stats = self._stats
        if entry is None:
            stats.misses += 1
            if rejected:
                stats.signature_failures += 1
        else:
            stats.hits += 1
            stats.bytes_read += len(entry.data)

    def _begin_request(self) -> None:  # noqa: B027 - a hook: nothing to do but in a tier
        """A request that will count its answer itself (``_tally_answer``) begins: a
        tier notes from here what its lookups count at each level (a wrapper passes
        it on). Nothing elsewhere."""

    def _tally_answer(self, key: bytes, entry: CacheEntry | None) -> None:
        """Count a request's answer -- ``entry`` found under ``key`` by lookups made
        with ``count=False``, or a miss -- as ``_tally`` does; a tier also counts it at
        the level that answered and the levels asked in front of it (a wrapper passes
        it to the cache it wraps)."""
        self._tally(entry)

    def _tally_store(self, nbytes: int) -> None:
        """Count a store of ``nbytes`` of payload (a composite whose levels stored it)."""
        stats = self._stats
        stats.stores += 1
        stats.bytes_written += nbytes

    def _tally_failure(self, counter: str) -> None:
        """Count one event the caller met (``write_failures``, ``read_failures``,
        ``warm_compiles``)."""
        setattr(self._stats, counter, getattr(self._stats, counter) + 1)

    def zero_stats(self) -> None:
        """Start the counters this cache reports for all its users over from zero
        (``cuforge cache zero-stats``): afterwards ``total_stats()`` -- or ``stats()``
        where a backend keeps no shared counters -- counts only what happens next.

        Raises NotImplementedError where the backend cannot reset them.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot reset its statistics")

    def close(self) -> None:  # noqa: B027 - optional hook, default is a no-op
        """Release backend resources (files, connections). Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EntryCache(ProgramCacheResource):
    """A backend whose native read is ``get_entry``: ``cache[key]`` and ``get`` are
    that one lookup (same verification, same counters), answering its payload.
    Its ``get_entry`` takes ``count=False`` (a lookup that counts neither a hit nor a
    miss) and its ``set_entry`` answers a ``StoreOutcome``."""

    @abc.abstractmethod
    def get_entry(
        self, key: CacheKey, *, count: bool = True, count_miss: bool | None = None
    ) -> CacheEntry | None:
        """The verified ``(data, meta)`` stored under ``key``, or None on any miss.

        Counted as a hit when ``count``, as a miss when ``count_miss`` (None: as
        ``count``): ``count=False`` counts nothing (a lookup inside a request that
        counts its answer itself); ``count_miss=False`` a hit only (a request's first
        lookup: on a miss the caller looks again, and that lookup counts);
        ``count=False, count_miss=True`` a miss only (a look-again whose hit the
        caller counts itself). A rejected entry counts as its miss does."""

    @abc.abstractmethod
    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> StoreOutcome:
        """Store ``value`` with ``meta`` under ``key``; what happened."""

    def set_entries(
        self, items: Iterable[tuple[CacheKey, CacheValue, bytes]]
    ) -> Sequence[StoreOutcome]:
        """``set_entry`` of each ``(key, value, meta)``, in order; each one's outcome."""
        return [self.set_entry(key, value, meta) for key, value, meta in items]

    def __getitem__(self, key: CacheKey) -> bytes:
        entry = self.get_entry(key)
        if entry is None:
            raise KeyError(key)
        return entry.data

    def get(self, key: CacheKey, default: bytes | None = None) -> bytes | None:
        entry = self.get_entry(key)
        return default if entry is None else entry.data


def count_warm_compile(cache: ProgramCacheResource) -> str:
    """Add one ``warm_compiles`` to the counters ``cache`` reports for all its users (a
    compile after the process declared itself warm, ``cuforge._warm``): a wrapper's
    inner cache, a tier's widest writable level (what ``total_stats`` reads), else
    the handle itself. Answers where the count lives (``_warm.COUNTED``): ``shared``;
    ``read-only`` (that handle's own counters only: a read-only handle persists
    none), ``memory`` (an in-memory cache's: gone with the process)."""
    for _ in range(8):  # wrappers nest a few deep at most
        inner = getattr(cache, "inner", None)
        if isinstance(inner, ProgramCacheResource):
            cache = inner
            continue
        levels = getattr(cache, "levels", None)
        if isinstance(levels, tuple) and levels:
            ro = set(getattr(cache, "read_only", ()) or ())
            writable = [lv for i, lv in enumerate(levels) if i not in ro]
            cache = (writable or list(levels))[-1]
            continue
        break
    cache._tally_failure("warm_compiles")
    if getattr(cache, "read_only", False) is True:
        return "read-only"
    return "memory" if getattr(cache, "in_memory", False) is True else "shared"


_warm.counter = count_warm_compile  # cuforge._warm counts through storage


def lookup_of(
    cache: ProgramCacheResource, key: CacheKey, count: bool = True, count_miss: bool | None = None
) -> CacheEntry | None:
    """``cache.get_entry(key)`` counted as ``count``/``count_miss`` say where ``cache``
    can be asked so (an :class:`EntryCache`); a cache from elsewhere counts as it does."""
    if (count and count_miss is None) or not isinstance(cache, EntryCache):
        return cache.get_entry(key)
    return cache.get_entry(key, count=count, count_miss=count_miss)


def check_meta(meta: Any) -> bytes:
    """``meta`` if it is bytes; TypeError naming ``meta`` otherwise."""
    if type(meta) is not bytes:
        raise TypeError(f"meta must be bytes, got {type(meta).__name__}")
    return meta
