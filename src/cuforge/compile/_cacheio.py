"""The cache-facing steps of the compile pipeline: lookup, store, single-flight.

Guarantees (the cache never breaks a compile):
- ``lookup`` turns a backend that raises into a miss (one ``CacheReadWarning`` per
  cache handle, a fail-open event), and an entry whose record lacks the requested
  name mapping into a miss.
- ``store`` never raises for the backend: a failing write is a warning once per
  handle plus a ``write_failures`` count. It returns what happened as a
  :class:`StoreOutcome` (stored, or not stored and why), so a caller can report
  the truth instead of assuming the entry is there.
- ``single_flight``: concurrent misses of one key fill once; a lock that cannot be
  had costs a duplicate fill, never a hang or a failed compile.

Statistics count each request once: a look-again inside a request is taken back
with ``uncount``; a miss found without a counted lookup is added by ``count_miss``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cuforge._log import debug_enabled, get_logger
from cuforge.compile import _identity_store, _versions
from cuforge.compile._callers import outside_level
from cuforge.compile._records import stored_log, stored_mapping
from cuforge.compile.object_code import ObjectCode
from cuforge.storage import events
from cuforge.storage.base import ProgramCacheResource
from cuforge.storage.entry import CacheEntry, entry_id

if TYPE_CHECKING:
    from typing import TypeVar

    _Found = TypeVar("_Found")
    _Filled = TypeVar("_Filled")

__all__ = [
    "COMPILER_CHANGED",
    "FAILED",
    "LOCKED",
    "LOGGER",
    "OVER_CAP",
    "READ_ONLY",
    "STORED",
    "TOO_LARGE",
    "UNREACHABLE",
    "StoreOutcome",
    "count_miss",
    "lookup",
    "lookup_entry",
    "single_flight",
    "store",
    "uncount",
    "warn_once",
]

LOGGER = "cuforge.cache"  # logging is imported only once someone listens (see cuforge._log)
_WARNED_ATTR = "_cuforge_write_warned"

#: The entry was written (the backend counted a store).
STORED = "stored"
#: The cache (or every level of it) is read-only: nothing is written by design.
READ_ONLY = events.READ_ONLY
#: The backend's server could not be reached (or is being backed off from).
UNREACHABLE = events.UNREACHABLE
#: The entry is larger than the cache's size cap: refused (the built-in backends), or
#: stored and evicted at once (a backend that keeps no such rule). Reads "larger than
#: the cache's size cap" (``events.dropped_words``).
TOO_LARGE = events.TOO_LARGE
OVER_CAP = TOO_LARGE  # its name before the backends refused such values
#: Another process held the backend's write lock past its timeout.
LOCKED = events.LOCKED
#: The backend failed to write (full disk, permissions, an error it raised).
FAILED = events.FAILED
#: The compiler or its headers changed while this process ran: the key may lie.
COMPILER_CHANGED = "compiler changed"


class StoreOutcome:
    """What the store step did: ``stored`` (bool), ``reason`` (one of the constants
    above; ``STORED`` when stored) and ``detail`` (the backend's words, or "")."""

    __slots__ = ("detail", "reason")

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail

    @property
    def stored(self) -> bool:
        return self.reason == STORED

    def __repr__(self) -> str:
        return f"StoreOutcome({self.reason!r}{', ' + repr(self.detail) if self.detail else ''})"


def warn_once(cache: Any, message: str, read: bool = False) -> None:
    """A ``CacheWriteWarning`` (``read``: a ``CacheReadWarning``) at the caller's line,
    once per cache handle and kind."""
    from cuforge.storage.base import CacheReadWarning, CacheWriteWarning

    attr = _WARNED_ATTR + ("_read" if read else "")
    try:
        if getattr(cache, attr, False):
            return
        setattr(cache, attr, True)
    except AttributeError:
        pass
    category = CacheReadWarning if read else CacheWriteWarning
    warnings.warn(message, category, stacklevel=outside_level())


def lookup_entry(cache: Any, key: bytes) -> CacheEntry | None:
    """The entry under ``key`` (counted by the backend), or None -- also when the
    backend raised (a broken backend is a miss, never a failed compile)."""
    try:
        getter = getattr(cache, "get_entry", None)
        if getter is None:  # a duck-typed mapping: metadata under a derived key
            return ProgramCacheResource.get_entry(cache, key)
        entry: CacheEntry | None = getter(key)
        return entry
    except Exception as exc:
        warn_once(cache, f"cache lookup failed ({type(exc).__name__}: {exc}); compiling", True)
        events.fail_open(
            cache, events.UNAVAILABLE, "cache lookup failed (%s: %s); compiling",
            type(exc).__name__, exc,
        )  # fmt: skip
        return None


def lookup(
    cache: Any,
    key: bytes,
    target: str,
    name: str,
    names: tuple[str | bytes, ...],
    logs: Any = None,
) -> ObjectCode | None:
    """The lookup step: a fresh ObjectCode for the entry under ``key``, or None.

    A hit with name expressions needs the record's mapping to cover exactly
    ``names``; a PTX hit warns as a fresh PTX compile does when the driver is older
    than the compiler that wrote it. With ``logs``, a hit writes the compile log the
    entry kept (the miss's warnings), as the compile did.
    """
    entry = lookup_entry(cache, key)
    if entry is None:
        if debug_enabled(LOGGER):
            get_logger(LOGGER).debug("miss %s %s: no entry for this key", entry_id(key)[:12], name)
        return None
    mapping: dict[str | bytes, str] = {}
    if names:
        found = stored_mapping(entry.meta, names)
        if found is None:
            if debug_enabled(LOGGER):
                get_logger(LOGGER).debug(
                    "miss %s %s: entry lacks the name mapping", entry_id(key)[:12], name
                )
            return None
        mapping = found
    if debug_enabled(LOGGER):
        get_logger(LOGGER).debug("hit %s %s", entry_id(key)[:12], name)
    data = entry.data
    obj = ObjectCode._trusted(data, target, name, mapping)
    if target == "ptx":
        _versions.warn_if_ptx_unloadable(data, stacklevel=outside_level())
    if logs is not None:
        log = stored_log(entry.meta)
        if log:
            logs.write(log)
    return obj


def _counters(cache: Any) -> tuple[int, int] | None:
    stats = getattr(cache, "_stats", None)
    if stats is None:
        return None
    return getattr(stats, "stores", 0), getattr(stats, "write_failures", 0)


def _count_write_failure(cache: Any) -> None:
    stats = getattr(cache, "_stats", None)
    if stats is not None and hasattr(stats, "write_failures"):
        stats.write_failures += 1


def _read_only(cache: Any) -> bool:
    """Whether nothing can be written: a read-only handle, or a tiered cache whose
    levels are all read-only."""
    flag = getattr(cache, "read_only", False)
    if isinstance(flag, tuple):
        return len(flag) == len(getattr(cache, "levels", ()))
    return flag is True


def store(cache: Any, key: bytes, value: bytes, meta: bytes) -> StoreOutcome:
    """The store step: write ``value`` + ``meta`` under ``key``; what happened."""
    if not _identity_store.confirm():
        # The key named a compiler identity kept on disk that a fresh probe now
        # contradicts (a library or header set changed during this process).
        _count_write_failure(cache)
        warn_once(
            cache,
            "the compiler or its CUDA headers changed while this process ran; the "
            "program is returned but not cached",
        )
        return StoreOutcome(COMPILER_CHANGED)
    before = _counters(cache)
    events.take_dropped()  # a drop noted earlier on this thread is not this store's
    try:
        setter = getattr(cache, "set_entry", None)
        if setter is None:
            ProgramCacheResource.set_entry(cache, key, value, meta)
        else:
            setter(key, value, meta)
    except Exception as exc:
        _count_write_failure(cache)
        warn_once(
            cache,
            f"cache write failed ({type(exc).__name__}: {exc}); the program compiled and is "
            "returned, but was not cached",
        )
        events.fail_open(
            cache, events.WRITE,
            "cache write failed (%s: %s); the program compiled and is returned, but was not "
            "cached", type(exc).__name__, exc,
        )  # fmt: skip
        return StoreOutcome(FAILED, f"{type(exc).__name__}: {exc}")
    outcome = _judge(cache, before, len(value) + len(meta))
    if debug_enabled(LOGGER):
        get_logger(LOGGER).debug(
            "store %s (%d bytes): %s", entry_id(key)[:12], len(value), outcome.reason
        )
    return outcome


def _judge(cache: Any, before: tuple[int, int] | None, size: int) -> StoreOutcome:
    """What a ``set_entry`` that returned did: the backend's counters say whether it
    stored; the drop it noted (``storage.events.note_dropped``) says why not. A
    backend that counts nothing is taken at its word."""
    dropped = events.take_dropped()
    after = _counters(cache)
    if before is not None and after is not None and after[0] == before[0]:
        if dropped is not None:
            return StoreOutcome(*dropped)
        return StoreOutcome(READ_ONLY if _read_only(cache) else FAILED)
    cap = getattr(cache, "max_size_bytes", None)
    if isinstance(cap, int) and not isinstance(cap, bool) and size > cap:
        return StoreOutcome(TOO_LARGE, f"{size} bytes, cap {cap}")
    # Stored; a level of a tiered cache may still have dropped it (the detail says).
    return StoreOutcome(STORED, "" if dropped is None else f"{dropped[0]}: {dropped[1]}")


def single_flight(
    cache: Any,
    lock_key: bytes,
    lookup: Callable[[], _Found | None],
    fill: Callable[[], _Filled],
) -> _Found | _Filled:
    """Look up; on a miss take ``lock_key``'s lock, look again, and fill.

    ``lookup`` counts one hit or miss in the cache's statistics; the look-again
    under the lock is the same request, so its miss is not counted twice. A lock
    that cannot be had (or a backend that cannot lock) costs a duplicate fill,
    never a failed compile.
    """
    found = lookup()
    if found is not None:
        return found
    try:
        guard = cache.lock(lock_key)
    except Exception:
        guard = None
    if guard is None:
        return fill()
    with guard:
        uncount(cache, None)
        found = lookup()
        if found is not None:
            return found
        return fill()


def uncount(cache: Any, entry: CacheEntry | None) -> None:
    """Take back the hit or miss a lookup of ``entry`` counted (a lookup that is
    part of a request already counted)."""
    stats = getattr(cache, "_stats", None)
    if stats is None:
        return
    if entry is None:
        if getattr(stats, "misses", 0) > 0:
            stats.misses -= 1
    elif getattr(stats, "hits", 0) > 0:
        stats.hits -= 1
        stats.bytes_read = max(0, stats.bytes_read - len(entry.data))


def count_miss(cache: Any) -> None:
    """Count a miss found without a counted lookup (no manifest variant held)."""
    stats = getattr(cache, "_stats", None)
    if stats is not None and hasattr(stats, "misses"):
        stats.misses += 1
