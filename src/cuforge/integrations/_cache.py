"""Cache selection and foreign-payload entries, shared by every integration.

A foreign payload (an Inductor JSON-wrapped pickle, a CuPy cubin) is opaque bytes
to cuforge: it is stored with a metadata record (``kind`` = the system, the
system's own key, which of its caches) so ``cuforge cache ls/stats/verify/prune``
list and manage it, and it is never unpickled, loaded or run by cuforge. Integrity
and signing are the cache's: with a secret set, an unsigned, tampered or
foreign-signed entry is a miss. A cache fault never fails the host system's
compile: a read that raises is a miss and a :class:`CacheReadWarning`, a store that
raises is dropped with a :class:`CacheWriteWarning`.
"""

from __future__ import annotations

import os
import threading
import warnings

from cuforge._stack import outside_level
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource
from cuforge.storage.record import decode_record, encode_record

__all__ = ["ForeignEntries", "select_cache"]

_OFF = "off"

_mutex = threading.Lock()
#: Handles opened from URLs, by (URL, secret variable's value): one per process.
_opened: dict[tuple[str, str | None], ProgramCacheResource] = {}


def _open_url(url: str) -> ProgramCacheResource:
    """The process's handle on ``url`` (opened at first use with ``$CUFORGE_CACHE_SECRET``),
    so an adapter's calls share one handle and its statistics."""
    from cuforge.storage.config import ENV_SECRET
    from cuforge.storage.urls import open_cache

    ident = (url, os.environ.get(ENV_SECRET))
    with _mutex:
        cache = _opened.get(ident)
        if cache is None:
            cache = _opened[ident] = open_cache(url)
        return cache


def select_cache(
    cache: ProgramCacheResource | str | None, env_var: str
) -> ProgramCacheResource | None:
    """The cache an integration uses: ``cache`` itself (a cache, or a URL to open),
    else ``$env_var`` (a cache URL, or ``off``), else cuforge's default cache
    (``$CUFORGE_CACHE``). None means caching is off.

    URLs open with ``$CUFORGE_CACHE_SECRET`` when it is set (every shared level then
    signs and verifies), once per process and secret. Raises ValueError naming the
    argument or variable for a bad URL, TypeError for a ``cache`` of another type.
    """
    if isinstance(cache, ProgramCacheResource):
        return cache
    if isinstance(cache, str):
        try:
            return _open_url(cache)
        except ValueError as exc:
            raise ValueError(f"cache: {exc}") from None
    if cache is not None:
        raise TypeError(
            "cache: expected a ProgramCacheResource, a cache URL or None, "
            f"got {type(cache).__name__}"
        )
    url = (os.environ.get(env_var) or "").strip()
    if url.lower() == _OFF:
        return None
    if url:
        try:
            return _open_url(url)
        except ValueError as exc:
            raise ValueError(f"${env_var}: {exc}") from None
    from cuforge.storage.config import default_cache

    return default_cache()


class ForeignEntries:
    """One foreign system's payloads in a cuforge cache, under its own names.

    ``kind`` is the metadata record's kind (``"inductor"``, ``"cupy"``); the entry
    key is derived from ``kind`` and the system's name, so systems never collide
    with each other or with cuforge's programs. :meth:`load` returns a payload only
    when the entry verifies (integrity, and the signature when the cache signs) and
    its record says it is this kind's entry for this name.
    """

    __slots__ = ("cache", "kind")

    def __init__(self, cache: ProgramCacheResource, kind: str) -> None:
        self.cache = cache
        self.kind = kind

    def key(self, name: str) -> bytes:
        """The cache key of the system's ``name``."""
        return b"cuforge-foreign\0" + self.kind.encode() + b"\0" + name.encode("utf-8")

    def load(self, name: str) -> bytes | None:
        """The payload stored for ``name``, or None (a miss, also when reading failed)."""
        try:
            entry = self.cache.get_entry(self.key(name))
        except Exception as exc:  # a cache fault is a miss, never the host's failure
            warnings.warn(
                f"cuforge {self.kind} cache: lookup failed ({type(exc).__name__}: {exc}); "
                "treated as a miss",
                CacheReadWarning,
                stacklevel=outside_level(),
            )
            return None
        if entry is None:
            return None
        record = decode_record(entry.meta, self.kind)
        if record is None or record.get("key") != name:
            return None
        return bytes(entry.data)

    def store(self, name: str, data: bytes, fields: dict[str, str | int | None]) -> bool:
        """Store ``data`` for ``name`` with a record of ``fields``; False when dropped."""
        meta = encode_record(self.kind, {"key": name, "name": _short(name), **fields})
        try:
            self.cache.set_entry(self.key(name), bytes(data), meta)
        except Exception as exc:  # a cache fault never fails the host's compile
            warnings.warn(
                f"cuforge {self.kind} cache: store failed ({type(exc).__name__}: {exc}); "
                "the result is used but not cached",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )
            return False
        return True


def _short(name: str, limit: int = 80) -> str:
    """``name`` as ``cuforge cache ls`` shows it: at most ``limit`` characters."""
    return name if len(name) <= limit else name[: limit - 3] + "..."
