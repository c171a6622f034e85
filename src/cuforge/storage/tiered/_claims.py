"""A tier's single flight: how ``TieredProgramCache.lock`` takes a key's locks -- the
host level's, then the widest level's, each as a claim that may hand the entry over
(one waiter per host; the tier's module docstring says what each case promises).

- :func:`hold`: the tier's lock for a key (what ``TieredProgramCache.lock`` returns).
- :func:`handle_of`: the storage core handle a level is, or signs (a
  ``SignedProgramCache`` counts as the handle it wraps), else None.
- :func:`claim_of`: the level's lock as ``(held, entry handed over)`` -- a core
  handle's ``claim``, a signed one's (the entry only once its signature verifies),
  any other cache's ``lock`` (never hands an entry over).

A level whose lock raises is counted and warned about once through the tier
(``_level_failed``) and the caller compiles unlocked: a cache fault never stalls a
compile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from threading import get_ident
from time import monotonic

from ..base import ProgramCacheResource, lookup_of
from ..entry import CacheEntry
from ..handle import DriverCache
from ..signing import SignedProgramCache
from ._lazylevel import LazyLevel, opened

TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import TieredProgramCache

__all__ = ["claim_of", "handle_of", "hold"]


@contextmanager
def _as_claim(guard: AbstractContextManager[bool]) -> Iterator[tuple[bool, CacheEntry | None]]:
    with guard as held:
        yield held, None


def handle_of(level: ProgramCacheResource | None) -> DriverCache | None:
    """The storage core handle ``level`` is, or signs (``SignedProgramCache``), else
    None (a lazy level not open, any other cache)."""
    inner = level.inner if isinstance(level, SignedProgramCache) else level
    return inner if isinstance(inner, DriverCache) else None


def claim_of(
    level: ProgramCacheResource, key: bytes, timeout: float | None
) -> AbstractContextManager[tuple[bool, CacheEntry | None]]:
    """``level``'s lock as ``(held, entry handed over)``: a storage core handle's
    ``claim`` (a signed one's: the entry verified), any other cache's ``lock`` (never
    hands over). Opens a lazy level."""
    inner = level.open() if isinstance(level, LazyLevel) else level
    if isinstance(inner, (DriverCache, SignedProgramCache)):
        return inner.claim(key, timeout)
    return _as_claim(inner.lock(key, timeout))


@contextmanager
def hold(tier: TieredProgramCache, key: bytes, timeout: float | None) -> Iterator[bool]:
    """``tier``'s lock for ``key``: the widest writable level's (threads of this process
    when none is writable), behind the host level's when there is one; one ``timeout``
    bounds both waits. Yields whether this caller holds it (False: another process
    filled it, a claim handed the entry over, or a lock could not be had: compile
    unlocked). While a claim this thread made is held, ``tier._claimed`` marks the key
    for the look-again (``TieredProgramCache._after_claim``)."""
    widest = tier._locker_index
    if widest is None:
        with tier._key_locks.hold(key, timeout) as held:
            yield held
        return
    host = tier._host
    if host is None or host == widest:
        with _lock_level(tier, widest, key, timeout) as held:
            yield held
        return
    start = monotonic()
    with _host_claim(tier, host, key, timeout) as (local, entry):
        if entry is not None:  # this host's holder stored it while this rank waited
            tier._claimed[key] = (get_ident(), host)  # counted where it was found
            try:
                yield False
            finally:
                tier._claimed.pop(key, None)
            return
        if not local:  # not had within the timeout (or failed): compile unlocked
            yield False
            return
        if _filled_here(tier, host, key):  # a process of this host filled it meanwhile
            yield True
            return
        left = None if timeout is None else max(0.0, timeout - (monotonic() - start))
        try:
            guard = claim_of(tier._levels[widest], key, left)
        except Exception as exc:  # no fleet lock: the host's holds for this host
            tier._level_failed(widest, exc, "lock", "read_failures")
            yield False
            return
        with guard as (held, entry):
            handle = handle_of(opened(tier._levels[widest]))
            if entry is not None:  # handed over: the look-again hits in front
                for j in range(widest):
                    if tier._writable[j]:
                        tier._put(j, key, entry.data, entry.meta, "store a backfill")
            elif not held or handle is None or not handle.hands_over:
                yield held
                return
            # A core handle's claim takes the lease only where the entry is not:
            # the look-again under this lock need not ask that level again.
            tier._claimed[key] = (get_ident(), -1 if entry is None else widest)
            try:
                yield held
            finally:
                tier._claimed.pop(key, None)


def _filled_here(tier: TieredProgramCache, host: int, key: bytes) -> bool:
    """Whether the host level has the entry now (an uncounted lookup: the caller's
    look-again counts), so the levels behind need not be asked."""
    try:
        return lookup_of(tier._levels[host], key, False) is not None
    except Exception:  # the look-again meets it and counts it
        return False


@contextmanager
def _host_claim(
    tier: TieredProgramCache, i: int, key: bytes, timeout: float | None
) -> Iterator[tuple[bool, CacheEntry | None]]:
    """The host level's lock as ``(held, entry)`` (its ``claim``): the entry, held by
    nobody and counted as a hit there, when this rank waited for another of its host
    and that one stored it; ``(False, None)`` (counted, warned once) when taking the
    lock raises."""
    try:
        guard = claim_of(tier._levels[i], key, timeout)
    except Exception as exc:  # no lock: the caller compiles unlocked
        tier._level_failed(i, exc, "lock", "read_failures")
        yield False, None
        return
    with guard as got:
        yield got


@contextmanager
def _lock_level(
    tier: TieredProgramCache, i: int, key: bytes, timeout: float | None
) -> Iterator[bool]:
    """Level ``i``'s lock; False (counted, warned once) when taking it raises."""
    try:
        guard = tier._levels[i].lock(key, timeout)
    except Exception as exc:  # no lock: the caller compiles unlocked
        tier._level_failed(i, exc, "lock", "read_failures")
        yield False
        return
    with guard as held:
        yield held
