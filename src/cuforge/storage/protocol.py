"""The typed seams of storage: what callers above it take, what drivers tell the core.

Annotation-only (it imports ``typing``): runtime modules import it under
``if TYPE_CHECKING:``, so a cache hit never loads it.

- :class:`ProgramCache` -- what the compile pipeline and the integrations need of a
  cache: entries in and out, a lookup that may say it must not count, the per-key
  lock. Every ``ProgramCacheResource`` is one (``count`` is taken by cuforge's own
  caches; ``storage.failopen`` asks a cache from elsewhere without it).
- :class:`Reports` -- what a driver tells the core about events it meets on its
  own; the core counts, logs and warns (drivers never touch ``CacheStats``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from .entry import CacheEntry, EntryInfo
from .outcome import StoreOutcome
from .stats import CacheStats

__all__ = ["ProgramCache", "Reports"]


class ProgramCache(Protocol):
    """A cache as the layers above storage use it."""

    def get_entry(self, key: bytes | str) -> CacheEntry | None: ...

    def set_entry(
        self, key: bytes | str, value: bytes, meta: bytes = b""
    ) -> StoreOutcome | None: ...

    def lock(
        self, key: bytes | str, timeout: float | None = ...
    ) -> AbstractContextManager[bool]: ...

    def iter_entries(self) -> Iterator[EntryInfo]: ...

    def stats(self) -> CacheStats: ...


class Reports(Protocol):
    """The core's side of a driver: events a driver meets outside a lookup's or a
    store's answer. Each is counted in ``stats()`` and logged on ``cuforge.cache``
    (WARNING once per cause and handle, then DEBUG)."""

    def counts(self) -> CacheStats:
        """The handle's counters now (for a driver that persists them; read only)."""
        ...

    def unreadable(self, exc: BaseException) -> None:
        """An entry exists but could not be read: the lookup is a miss."""

    def unreachable(self, n: int = 1) -> None:
        """``n`` lookups could not consult the medium at all (``read_failures``)."""

    def evicted(self, n: int) -> None:
        """``n`` entries were evicted to keep the size cap."""

    def stored(self, n: int, nbytes: int) -> None:
        """``n`` earlier stores, kept back, were written now (``nbytes`` of payload)."""

    def dropped(self, outcome: StoreOutcome) -> None:
        """A store kept back earlier was lost after all (``write_failures``)."""

    def lock_busy(self, message: str, warning: str | None = None) -> None:
        """Another process held a lock past its bound (``lock_timeouts``): ``message``
        is logged; ``warning``, when given, is a ``CacheWriteWarning`` once per handle."""

    def warn_once(self, key: str, category: type[Warning], text: str) -> None:
        """Warn ``text`` at the caller's line, once per handle and ``key``."""
