"""The cache-facing steps of the compile pipeline: an entry as an ObjectCode, a
compile as a stored entry.

Guarantees (the cache never breaks a compile; both go through ``storage.failopen``):
- ``lookup`` turns a backend that raises into a miss (one ``CacheReadWarning`` per
  cache handle, a fail-open event), and an entry whose record lacks the requested
  name mapping into a miss. ``count``/``count_miss`` say how the cache counts it.
- ``store`` never raises for the backend: a failing write is a warning once per
  handle plus a ``write_failures`` count. It returns what happened as a
  :class:`StoreOutcome` (stored, or not stored and why: the cache's own answer), so a
  caller can report the truth instead of assuming the entry is there. A compiler
  that changed while this process ran is refused its store (``compiler changed``).
"""

from __future__ import annotations

from cuforge._log import debug_enabled, get_logger
from cuforge.compile import _versions
from cuforge.compile._callers import outside_level
from cuforge.compile.cache import _identity_store
from cuforge.compile.cache._records import stored_log, stored_mapping
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

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from cuforge.storage.base import ProgramCacheResource

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
    "peek_entry",
    "store",
]

LOGGER = "cuforge.cache"  # logging is imported only once someone listens (see cuforge._log)
OVER_CAP = TOO_LARGE  # its name before the backends refused such values


def lookup_entry(
    cache: ProgramCacheResource, key: bytes, count: bool = True, count_miss: bool | None = None
) -> CacheEntry | None:
    """The entry under ``key`` (counted as ``count``/``count_miss`` say), or None --
    also when the backend raised (``storage.failopen``)."""
    return failopen.lookup(cache, key, count, count_miss)


def peek_entry(cache: ProgramCacheResource, key: bytes) -> CacheEntry | None:
    """The verified entry under ``key`` read as maintenance, not as a use: by its id
    (``read_entry``: no access time or recency moved, nothing counted), so a question
    such as ``explain`` never keeps an entry alive against ``prune --unused-for`` or
    eviction. A cache that cannot read by id (one from elsewhere) is asked
    ``get_entry`` uncounted; a cache that raises is a miss (warned once, as
    :func:`lookup_entry`)."""
    try:
        return cache.read_entry(entry_id(key))
    except NotImplementedError:
        return failopen.lookup(cache, key, count=False)
    except Exception as exc:
        failopen.warn_once(cache, f"cache lookup failed ({type(exc).__name__}: {exc})", True)
        return None


def lookup(
    cache: ProgramCacheResource,
    key: bytes,
    target: str,
    name: str,
    names: tuple[str | bytes, ...],
    logs: Any = None,
    count: bool = True,
    count_miss: bool | None = None,
) -> ObjectCode | None:
    """The lookup step: a fresh ObjectCode for the entry under ``key``, or None.

    A hit with name expressions needs the record's mapping to cover exactly
    ``names``; a PTX hit warns as a fresh PTX compile does when the driver is older
    than the compiler that wrote it. With ``logs``, a hit writes the compile log the
    entry kept (the miss's warnings), as the compile did.

    The DEBUG log has one line per answer: a miss is logged by the look that counts it,
    never by a request's first look (``count_miss=False``), whose look-again under the
    single-flight lock follows and logs the miss (or the hit another process stored).
    """
    entry = failopen.lookup(cache, key, count, count_miss)
    if entry is None:
        if count_miss is not False and debug_enabled(LOGGER):
            get_logger(LOGGER).debug("miss %s %s: no entry for this key", entry_id(key)[:12], name)
        return None
    mapping: dict[str | bytes, str] = {}
    if names:
        found = stored_mapping(entry.meta, names)
        if found is None:
            if count_miss is not False and debug_enabled(LOGGER):
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


def store(cache: ProgramCacheResource, key: bytes, value: bytes, meta: bytes) -> StoreOutcome:
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
