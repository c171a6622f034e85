"""Fail-open events of a program cache, logged the library way.

A cache that cannot be written, holds a damaged entry, cannot be read or whose
backend is unreachable never fails a compile: the event becomes a miss or a
dropped store, is counted in ``stats()``, and is logged on ``cuforge.cache`` --
WARNING the first time a cause is seen on a cache handle, DEBUG every time after
(so a full disk says so once, not per compile). The library adds no handler and
sets no level: the application decides what is shown. ``logging`` itself is
imported only when an event happens or the application uses it (``cuforge._log``):
a cache hit from a fresh process does not pay for it.

Backends call ``fail_open(self, CAUSE, message, *args)``; ``message`` is a
%-format string, as for ``logging``.
"""

from __future__ import annotations

import threading
import weakref

from cuforge._log import debug_enabled, get_logger

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

LOGGER = "cuforge.cache"

#: The cache could not store an entry (full disk, read-only or missing directory).
WRITE = "write"
#: An entry failed its integrity check; it was removed and the program compiled again.
INTEGRITY = "integrity"
#: An entry exists but could not be read (permissions, I/O error): a miss.
READ = "read"
#: The backend itself failed or is unreachable (a lookup raised; a server is down).
UNAVAILABLE = "unavailable"

#: Why a store was dropped (``note_dropped``): the handle cannot write by design,
#: its server is unreachable, another process held the write lock too long, or the
#: write failed.
READ_ONLY = "read-only"
UNREACHABLE = "unreachable"
LOCKED = "locked"
FAILED = "failed"
#: The value is larger than the cache's size cap: refused, and nothing evicted for it.
TOO_LARGE = "too-large"
#: Stored, then evicted (the level's size cap) before the command that stored it
#: ended: what the command line reports once it has looked again (``cli._kept``).
EVICTED = "evicted"

#: A failed store's warning when the cache's shared counters cannot be written either
#: (``Driver.counts_lost``; followed by why): the command line says it in its words.
COUNTS_LOST = (
    "Later write failures of this cache handle are counted in stats().write_failures "
    "without a warning, but not in the cache's shared counters, and neither is any other "
    "count of this handle (misses included): they could not be written either"
)

# How a reason reads for a person ("not stored: ..."), where it is not its own words.
_WORDS = {
    TOO_LARGE: "larger than the cache's size cap",
    EVICTED: "evicted again before the command ended, to keep the cache within its size cap",
}

_ATTR = "_cuforge_fail_open_seen"
_lock = threading.Lock()
_by_ref: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _first_time(handle: Any, cause: str) -> bool:
    """Whether ``cause`` is new for ``handle`` (recording it). Handles that take
    neither an attribute nor a weak reference report every event as new."""
    with _lock:
        seen = getattr(handle, _ATTR, None)
        if seen is None:
            seen = set()
            try:
                setattr(handle, _ATTR, seen)
            except (AttributeError, TypeError):
                try:
                    seen = _by_ref.setdefault(handle, seen)
                except TypeError:
                    return True
        if cause in seen:
            return False
        seen.add(cause)
        return True


def fail_open(handle: Any, cause: str, message: str, *args: Any) -> None:
    """Log a fail-open event of ``handle``: WARNING once per ``cause``, then DEBUG."""
    if _first_time(handle, cause):
        get_logger(LOGGER).warning(message, *args, extra={"cuforge_cause": cause})
    elif debug_enabled(LOGGER):
        get_logger(LOGGER).debug(message, *args, extra={"cuforge_cause": cause})


# The last store this thread dropped: (reason, detail).
_dropped = threading.local()


def note_dropped(reason: str, detail: str = "") -> None:
    """Record, for this thread, that the store being made was dropped and why
    (``READ_ONLY``, ``UNREACHABLE``, ``LOCKED``, ``FAILED`` or ``TOO_LARGE``).
    Backends call it where they count a write failure; the compile pipeline reads it
    with ``take_dropped`` to report the store's outcome. Per thread, so concurrent
    stores never mix."""
    _dropped.last = (reason, detail)


def dropped_words(reason: str) -> str:
    """``reason`` (a ``note_dropped`` reason or a pipeline outcome) as a person reads it
    after "not stored: " -- ``TOO_LARGE`` reads "larger than the cache's size cap";
    the other reasons are their own words."""
    return _WORDS.get(reason, reason)


def take_dropped() -> tuple[str, str] | None:
    """The drop ``note_dropped`` recorded on this thread since the last call, or None."""
    last: tuple[str, str] | None = getattr(_dropped, "last", None)
    if last is not None:
        _dropped.last = None
    return last


__all__ = [
    "EVICTED",
    "FAILED",
    "INTEGRITY",
    "LOCKED",
    "LOGGER",
    "READ",
    "READ_ONLY",
    "TOO_LARGE",
    "UNAVAILABLE",
    "UNREACHABLE",
    "WRITE",
    "dropped_words",
    "fail_open",
    "note_dropped",
    "take_dropped",
]
