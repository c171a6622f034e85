"""How a tier asks its widest level for a key's lock: as a claim, which may hand the
entry over (``TieredProgramCache``'s single flight, one waiter per host).

- :func:`handle_of`: the storage core handle a level is, or signs (a
  ``SignedProgramCache`` counts as the handle it wraps), else None.
- :func:`claim_of`: the level's lock as ``(held, entry handed over)`` -- a core
  handle's ``claim``, a signed one's (the entry only once its signature verifies),
  any other cache's ``lock`` (never hands an entry over).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from ..base import ProgramCacheResource
from ..entry import CacheEntry
from ..handle import DriverCache
from ..signing import SignedProgramCache
from ._lazylevel import LazyLevel

__all__ = ["claim_of", "handle_of"]


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
