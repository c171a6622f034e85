"""The bytes-in/bytes-out cache interface every storage backend implements."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ._keylock import KeyLocks
from ._values import coerce_key
from .stats import CacheStats

__all__ = ["CacheKey", "CacheValue", "CacheWriteWarning", "ProgramCacheResource"]

CacheKey = bytes | str
#: bytes, bytearray, memoryview, or an ObjectCode-like object (``.code`` + ``.code_type``).
CacheValue = Any

DEFAULT_LOCK_TIMEOUT = 120.0


class CacheWriteWarning(RuntimeWarning):
    """A cache could not store an entry; the program still compiled and works."""


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

    Backends are context managers; ``close()`` releases what they hold.
    """

    def __init__(self) -> None:
        self._stats = CacheStats()
        self._key_locks = KeyLocks()

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

    def close(self) -> None:  # noqa: B027 - optional hook, default is a no-op
        """Release backend resources (files, connections). Idempotent."""

    def __enter__(self) -> ProgramCacheResource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
