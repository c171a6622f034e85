"""A tier level that is opened -- imported, connected -- the first time a call reaches it.

``open_cache("file:///…,redis://…")`` puts every level behind the first persistent one
in a :class:`LazyLevel`: a fresh process whose lookups the front levels answer never
imports the Redis client or connects to the server.

Guarantees:

- **Opened once, on first need.** A lookup, lock, listing or maintenance call opens the
  level (under a lock: racing threads open it once). Statistics of a level never opened
  are zeros; they never open it.
- **Stores do not open it; none is lost.** A store to a level not yet opened is kept
  here (the last one per key; its outcome says so: ``outcome.DEFERRED``) and written
  when the level opens: at the first lookup or lock that reaches it, when more than
  ``max_pending_bytes`` are waiting, at ``close()``, and at a normal interpreter exit
  (when the main thread ends, before other threads are joined: a client library can
  still be imported then). A lookup
  through this level flushes first, so it never misses what was stored through it. A
  process killed (SIGKILL) before any of these loses the deferred copies in this level
  only: the front levels already hold them.
- **An opening that fails** (a bad location, a missing client library) raises the same
  error from every call that needs the level, without retrying the open; the tier
  counts and warns it as that level's failure. Deferred stores it cannot write are
  counted as ``write_failures``.
- **fork()**: a child drops the parent's deferred stores (the parent writes them).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from cuforge._stack import outside_level

from .._livehandles import LiveHandles
from .._values import coerce_key, coerce_value
from ..base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    ProgramCacheResource,
    check_meta,
    lookup_of,
)
from ..entry import CacheEntry, EntryInfo
from ..outcome import DEFERRED, STORED_OUTCOME, StoreOutcome
from ..stats import CacheStats

__all__ = ["LazyLevel", "opened"]

#: Deferred bytes a level may hold before a store opens it and writes them.
DEFAULT_MAX_PENDING = 64 << 20

_LIVE = LiveHandles()


def _flush_all() -> None:
    """Write every live level's deferred stores; runs when the main thread ends, before
    other threads are joined (after that, a client library that imports
    ``concurrent.futures`` -- redis-py does -- cannot be imported any more)."""
    for handle in _LIVE.handles():
        with contextlib.suppress(Exception):
            handle._flush_at_exit()


_register = getattr(threading, "_register_atexit", None)  # CPython 3.9+: before joins
if _register is not None:
    _register(_flush_all)


def _ready_for_exit() -> None:
    """Load the standard thread pool now, with the first deferred store: once shutdown
    has begun ``concurrent.futures.thread`` refuses to load, and a client library that
    imports it (redis-py does) could not open its level at exit. ~20 ms, on a store
    path only (which follows a compile)."""
    import concurrent.futures.thread  # noqa: F401


class LazyLevel(EntryCache):
    """The level ``opener()`` returns, opened on first need; ``name`` names it in
    messages (a URL without its password); ``remote``: it lives on a server."""

    def __init__(
        self,
        opener: Callable[[], ProgramCacheResource],
        name: str,
        *,
        max_pending_bytes: int = DEFAULT_MAX_PENDING,
        remote: bool = False,
    ) -> None:
        super().__init__()
        self._opener = opener
        self._name = name
        self.remote = remote
        self._max_pending = max_pending_bytes
        self._level: ProgramCacheResource | None = None
        self._error: BaseException | None = None
        self._pending: dict[bytes, tuple[bytes, bytes]] = {}
        self._pending_bytes = 0
        self._mutex = threading.RLock()
        self._closed = False
        _LIVE.add(self)

    # -- opening ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The level as messages name it: its URL without the password."""
        return self._name

    @property
    def opened(self) -> ProgramCacheResource | None:
        """The level if it has been opened, else None (never opens it)."""
        return self._level

    @property
    def pending(self) -> int:
        """Deferred stores not written yet."""
        return len(self._pending)

    def open(self) -> ProgramCacheResource:
        """The level, opened now if it was not; deferred stores are written first."""
        level = self._level
        if level is not None and not self._pending:
            return level
        with self._mutex:
            if self._closed:
                raise ValueError(f"operation on a closed cache level ({self._name})")
            if self._level is None:
                if self._error is not None:
                    raise self._error
                try:
                    self._level = self._opener()
                except Exception as exc:  # kept: every later call fails the same way
                    self._error = exc
                    raise
            self._write_pending(self._level)
            return self._level

    def _write_pending(self, level: ProgramCacheResource) -> None:
        """Write the deferred stores (caller holds the mutex); a failing one is counted.

        They stay listed until all are written: a racing store or lookup sees them
        and waits for the mutex, so an older deferred value never lands after a
        newer store of the same key.
        """
        for key, (data, meta) in list(self._pending.items()):
            try:
                level.set_entry(key, data, meta)
            except Exception as exc:  # one failed write never stops the rest
                self._tally_failure("write_failures")
                self._warn(f"store a deferred entry ({type(exc).__name__}: {exc})")
        self._pending, self._pending_bytes = {}, 0

    def _warn(self, what: str) -> None:
        warnings.warn(
            f"cuforge cache level {self._name}: could not {what}; the other levels keep "
            "the entry. Counted in stats().write_failures.",
            CacheWriteWarning,
            stacklevel=outside_level(),
        )

    # -- reads ----------------------------------------------------------------------------
    def get_entry(
        self, key: CacheKey, *, count: bool = True, count_miss: bool | None = None
    ) -> CacheEntry | None:
        level = self._level
        if level is None or self._pending:
            level = self.open()
        return lookup_of(level, key, count, count_miss)

    def get_entries(self, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
        level = self._level
        if level is None or self._pending:
            level = self.open()
        return level.get_entries(keys)

    # -- writes ---------------------------------------------------------------------------
    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> StoreOutcome:
        """Store through the open level, or keep the store until the level opens:
        ``DEFERRED`` (written at the latest at close or exit)."""
        level = self._level
        if level is not None and not self._pending:
            return level.set_entry(key, value, meta) or STORED_OUTCOME
        k = coerce_key(key)
        data = coerce_value(value, "LazyLevel.set_entry")
        check_meta(meta)
        with self._mutex:
            # Once the threads' shutdown has begun, the exit's write of deferred stores
            # (_flush_all) has run or is running: a store now (one written behind and
            # flushed at exit) is made at once, or it would be kept and lost.
            late = getattr(threading, "_SHUTTING_DOWN", False)
            if self._level is None and self._error is None and not self._closed and not late:
                if not self._pending:
                    _ready_for_exit()
                old = self._pending.pop(k, None)
                if old is not None:
                    self._pending_bytes -= len(old[0]) + len(old[1])
                self._pending[k] = (data, meta)
                self._pending_bytes += len(data) + len(meta)
                if self._pending_bytes <= self._max_pending:
                    return DEFERRED
        return self.open().set_entry(k, data, meta) or STORED_OUTCOME

    def set_entries(
        self, items: Iterable[tuple[CacheKey, CacheValue, bytes]]
    ) -> Sequence[StoreOutcome]:
        """The open level's batch write; until it opens, each is kept as ``set_entry``
        keeps it."""
        level = self._level
        if level is not None and not self._pending:
            return [o or STORED_OUTCOME for o in level.set_entries(items)]
        return [self.set_entry(key, value, meta) for key, value, meta in items]

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.set_entry(key, value)

    def __delitem__(self, key: CacheKey) -> None:
        del self.open()[key]

    def __len__(self) -> int:
        return len(self.open())

    def clear(self) -> None:
        self.open().clear()

    # -- listing, maintenance, locks: these open the level --------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        return self.open().iter_entries()

    def check_entry(self, entry_id: str) -> str | None:
        return self.open().check_entry(entry_id)

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        return self.open().read_entry(entry_id)

    def remove_entry(self, entry_id: str) -> bool:
        return self.open().remove_entry(entry_id)

    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        return self.open().lock(key, timeout)

    def __getattr__(self, name: str) -> Any:
        """A backend's own public calls (``total_stats``, ``prefix``) open the level."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.open(), name)

    # -- statistics and lifetime --------------------------------------------------------------
    def stats(self) -> CacheStats:
        """The level's counters (zeros while it is not open) plus failed deferred stores."""
        level = self._level
        if level is None:
            return self._stats.copy()
        out = level.stats()
        out.write_failures += self._stats.write_failures
        return out

    def zero_stats(self) -> None:
        self.open().zero_stats()
        self._stats = CacheStats()

    def close(self) -> None:
        """Write what is deferred (opening the level if needed), then close it. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            if self._pending:
                try:
                    self.open()
                except Exception as exc:  # a level that cannot open cannot take them
                    for _ in self._pending:
                        self._tally_failure("write_failures")
                    self._pending, self._pending_bytes = {}, 0
                    self._warn(f"open to store deferred entries ({type(exc).__name__}: {exc})")
            self._closed = True
            _LIVE.discard(self)
            if self._level is not None:
                self._level.close()

    def _flush_at_exit(self) -> None:
        """At interpreter exit: write the deferred stores and let the level flush too."""
        if not self._closed and self._pending:
            self.open()

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.RLock()
        self._pending, self._pending_bytes = {}, 0
        self._stats = CacheStats()

    def __repr__(self) -> str:
        level = self._level
        return repr(level) if level is not None else f"LazyLevel({self._name!r}, not opened)"


def opened(level: ProgramCacheResource) -> ProgramCacheResource | None:
    """``level`` itself, or for a :class:`LazyLevel` the level it opened (None if not yet)."""
    return level.opened if isinstance(level, LazyLevel) else level
