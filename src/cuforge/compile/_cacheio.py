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

Statistics count each request once: its first lookup counts a hit only
(``count_miss=False``), the look-again under the lock counts the answer; a request
whose lookups are all uncounted (``count=False``) counts its answer with
``storage.failopen.tally``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cuforge._log import debug_enabled, get_logger
from cuforge.compile import _identity_store, _versions
from cuforge.compile._callers import outside_level
from cuforge.compile._records import stored_log, stored_mapping
from cuforge.compile.object_code import ObjectCode
from cuforge.storage import failopen
from cuforge.storage.entry import CacheEntry, entry_id
from cuforge.storage.outcome import (
    COMPILER_CHANGED,
    FAILED,
    LOCKED,
    READ_ONLY,
    STORED,
    TOO_LARGE,
    UNREACHABLE,
    StoreOutcome,
)

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
    "lookup",
    "lookup_entry",
    "single_flight",
    "store",
]

LOGGER = "cuforge.cache"  # logging is imported only once someone listens (see cuforge._log)
OVER_CAP = TOO_LARGE  # its name before the backends refused such values


def lookup_entry(cache: Any, key: bytes, count: bool = True) -> CacheEntry | None:
    """The entry under ``key`` (counted unless ``count`` is False), or None -- also when
    the backend raised (``storage.failopen``)."""
    return failopen.lookup(cache, key, count)


def lookup(
    cache: Any,
    key: bytes,
    target: str,
    name: str,
    names: tuple[str | bytes, ...],
    logs: Any = None,
    count: bool = True,
    count_miss: bool = True,
) -> ObjectCode | None:
    """The lookup step: a fresh ObjectCode for the entry under ``key``, or None.

    A hit with name expressions needs the record's mapping to cover exactly
    ``names``; a PTX hit warns as a fresh PTX compile does when the driver is older
    than the compiler that wrote it. With ``logs``, a hit writes the compile log the
    entry kept (the miss's warnings), as the compile did.
    """
    entry = failopen.lookup(cache, key, count, count_miss)
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


def store(cache: Any, key: bytes, value: bytes, meta: bytes) -> StoreOutcome:
    """The store step: write ``value`` + ``meta`` under ``key``; what happened."""
    if not _identity_store.confirm():
        # The key named a compiler identity kept on disk that a fresh probe now
        # contradicts (a library or header set changed during this process).
        return failopen.refuse(
            cache,
            StoreOutcome(COMPILER_CHANGED),
            "the compiler or its CUDA headers changed while this process ran; the "
            "program is returned but not cached",
        )
    outcome = failopen.store(cache, key, value, meta)
    if debug_enabled(LOGGER):
        get_logger(LOGGER).debug(
            "store %s (%d bytes): %s", entry_id(key)[:12], len(value), outcome.reason
        )
    return outcome


def single_flight(
    cache: Any,
    lock_key: bytes,
    lookup: Callable[[bool], _Found | None],
    fill: Callable[[], _Filled],
) -> _Found | _Filled:
    """Look up; on a miss take ``lock_key``'s lock, look again, and fill.

    One request counts one hit or miss: ``lookup(False)`` (the first) counts a hit
    only; on a miss the look-again under the lock, ``lookup(True)``, counts the
    request's answer. A lock that cannot be had (or a backend that cannot lock)
    costs a duplicate fill, never a failed compile.
    """
    found = lookup(False)
    if found is not None:
        return found
    with failopen.lock(cache, lock_key):
        found = lookup(True)
        if found is not None:
            return found
        return fill()
