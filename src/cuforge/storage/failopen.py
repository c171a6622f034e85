"""The one fail-open wrapper for callers above storage: a cache fault is never theirs.

The compile pipeline (and any layer that fills a cache for its own work) goes
through these instead of calling a cache directly:

- :func:`lookup` -- the entry under a key, or None; a cache that raises is a miss,
  one :class:`CacheReadWarning` per handle at the caller's line and a fail-open
  event (``events.UNAVAILABLE``). ``count``/``count_miss`` say what it counts
  (``base.EntryCache.get_entry``): a request counts one hit or miss whatever
  lookups it makes (cuforge's caches take both; a cache from elsewhere counts as it
  does).
- :func:`store` -- write an entry, never raising for the cache: what happened, as a
  :class:`~cuforge.storage.outcome.StoreOutcome` (the cache's own answer; a cache from
  elsewhere that answers nothing is taken at its word). One that raises is a
  ``write_failures`` count, one :class:`CacheWriteWarning` per handle and an event.
- :func:`refuse` -- a store the caller decides not to make (its inputs may lie),
  counted and warned as a failed one.
- :func:`begin`, :func:`tally` -- a request whose lookups are made with
  ``count=False`` begins, and is counted once its answer is known.
- :func:`lock` -- the key's single-flight lock; a cache that cannot lock yields False.

Counters are the cache's: only storage writes them (these functions do, for the
caller).
"""

from __future__ import annotations

import contextlib
import warnings

from cuforge._stack import outside_level

from . import events
from .base import (
    CacheKey,
    CacheReadWarning,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    ProgramCacheResource,
)
from .outcome import FAILED, STORED, TOO_LARGE, StoreOutcome

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any

    from .entry import CacheEntry

__all__ = [
    "CACHE_TYPES",
    "MappingCache",
    "as_cache",
    "begin",
    "lock",
    "lookup",
    "refuse",
    "store",
    "tally",
    "warn_once",
]

_WARNED_ATTR = "_cuforge_write_warned"


class MappingCache(ProgramCacheResource):
    """A duck-typed mapping (``get`` and ``__setitem__``, as another library's cache
    has) seen as a cache: every call goes to ``mapping``; metadata lives under a
    derived key (``ProgramCacheResource``'s fallbacks); its counters are this view's."""

    def __init__(self, mapping: Any) -> None:
        super().__init__()
        self.mapping = mapping

    def __getitem__(self, key: CacheKey) -> bytes:
        return self.mapping[key]  # type: ignore[no-any-return]

    def get(self, key: CacheKey, default: bytes | None = None) -> bytes | None:
        return self.mapping.get(key, default)  # type: ignore[no-any-return]

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.mapping[key] = value

    def __delitem__(self, key: CacheKey) -> None:
        del self.mapping[key]

    def __len__(self) -> int:
        return len(self.mapping)

    def clear(self) -> None:
        self.mapping.clear()


#: The types already found to be caches (a caller's hit path probes this set before it
#: calls :func:`as_cache`), and those that take the counting arguments
#: (``EntryCache``): a set probe per call instead of an ABC check (~0.1 us each).
CACHE_TYPES: set[type] = set()
_COUNTING: set[type] = set()


def _known(kind: type, cache: Any) -> bool:
    """Whether ``cache`` (of ``kind``) is a cache, remembering its type when it is."""
    if not isinstance(cache, ProgramCacheResource):
        return False
    CACHE_TYPES.add(kind)
    if isinstance(cache, EntryCache):
        _COUNTING.add(kind)
    return True


def as_cache(cache: Any) -> ProgramCacheResource:
    """``cache`` as a :class:`ProgramCacheResource`: itself, or a duck-typed mapping in
    a :class:`MappingCache`. TypeError naming the type for anything else."""
    kind = type(cache)
    if kind in CACHE_TYPES or _known(kind, cache):
        return cache  # type: ignore[no-any-return]
    if callable(getattr(cache, "get", None)) and hasattr(cache, "__setitem__"):
        return MappingCache(cache)
    raise TypeError(
        "cache must be a cuforge.utils.ProgramCacheResource (get/__setitem__), got "
        f"{type(cache).__name__}"
    )


def warn_once(cache: ProgramCacheResource, message: str, read: bool = False) -> None:
    """A ``CacheWriteWarning`` (``read``: a ``CacheReadWarning``) at the caller's line,
    once per cache handle and kind."""
    attr = _WARNED_ATTR + ("_read" if read else "")
    holder = cache.mapping if isinstance(cache, MappingCache) else cache
    try:
        if getattr(holder, attr, False):
            return
        setattr(holder, attr, True)
    except AttributeError:
        pass
    category = CacheReadWarning if read else CacheWriteWarning
    warnings.warn(message, category, stacklevel=outside_level())


def lookup(
    cache: ProgramCacheResource, key: bytes, count: bool = True, count_miss: bool | None = None
) -> CacheEntry | None:
    """The entry under ``key`` (counted by the cache as ``count`` and ``count_miss``
    say), or None -- also when the cache raised (a broken cache is a miss, never a
    failed caller)."""
    try:
        if count and count_miss is None:
            return cache.get_entry(key)
        kind = type(cache)
        if kind in _COUNTING or (_known(kind, cache) and kind in _COUNTING):
            return cache.get_entry(key, count=count, count_miss=count_miss)  # type: ignore[call-arg]
        return cache.get_entry(key)  # a cache from elsewhere counts as it does
    except Exception as exc:
        warn_once(cache, f"cache lookup failed ({type(exc).__name__}: {exc}); compiling", True)
        events.fail_open(
            cache, events.UNAVAILABLE, "cache lookup failed (%s: %s); compiling",
            type(exc).__name__, exc,
        )  # fmt: skip
        return None


def begin(cache: ProgramCacheResource) -> None:
    """A request whose lookups are made with ``count=False`` begins (its answer is
    counted by :func:`tally`): a tier counts it at its levels then."""
    cache._begin_request()


def tally(cache: ProgramCacheResource, key: bytes, entry: CacheEntry | None) -> None:
    """Count one request's answer -- a hit of ``entry`` found under ``key``, or a miss --
    whose lookups were made with ``count=False`` (a tier: at the levels too)."""
    cache._tally_answer(key, entry)


def store(cache: ProgramCacheResource, key: bytes, value: bytes, meta: bytes) -> StoreOutcome:
    """Write ``value`` + ``meta`` under ``key``; what happened (see the module)."""
    try:
        outcome = cache.set_entry(key, value, meta)
    except Exception as exc:
        return refuse(
            cache, StoreOutcome(FAILED, f"{type(exc).__name__}: {exc}"),
            f"cache write failed ({type(exc).__name__}: {exc}); the program compiled and is "
            "returned, but was not cached",
        )  # fmt: skip
    if outcome is not None:
        return outcome
    # A cache from elsewhere answers nothing: stored, unless it keeps a cap it is over.
    cap = getattr(cache, "max_size_bytes", None)
    size = len(value) + len(meta)
    if isinstance(cap, int) and not isinstance(cap, bool) and size > cap:
        return StoreOutcome(TOO_LARGE, f"{size} bytes, cap {cap}")
    return StoreOutcome(STORED)


def refuse(cache: ProgramCacheResource, outcome: StoreOutcome, message: str) -> StoreOutcome:
    """A store that did not happen for the caller's reason (``message``, warned once
    per handle; also a fail-open event): counted in the cache's ``write_failures``."""
    cache._tally_failure("write_failures")
    warn_once(cache, message)
    events.fail_open(cache, events.WRITE, "%s", message)
    return outcome


def lock(cache: ProgramCacheResource, key: bytes) -> AbstractContextManager[bool]:
    """``cache.lock(key)``; a cache that cannot lock yields False (the caller fills
    unlocked: a duplicate fill, never a failed or stuck one)."""
    try:
        return cache.lock(key)
    except Exception:
        return contextlib.nullcontext(False)
