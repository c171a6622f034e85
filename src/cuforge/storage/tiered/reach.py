"""Whether a cache's stores wait on a server.

:func:`reaches_server` answers from what the cache is, never by opening or asking
anything: a Redis or S3 cache does; a tier does when one of its levels does (a lazy
level from its URL's scheme, before it is opened); a signing wrapper as what it wraps.
Every other cache (a directory, SQLite, memory, a user's mapping) does not. The
integrations write stores behind for a cache that does (``integrations._behind``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["reaches_server"]


def reaches_server(cache: Any) -> bool:
    """True when a store to ``cache`` reaches a server (see the module docstring)."""
    from ..remote import RemoteCache
    from ..signing import SignedProgramCache
    from . import TieredProgramCache
    from ._lazylevel import LazyLevel

    if isinstance(cache, SignedProgramCache):
        return reaches_server(cache.inner)
    if isinstance(cache, LazyLevel):
        level = cache.opened
        return cache.remote if level is None else reaches_server(level)
    if isinstance(cache, TieredProgramCache):
        return any(reaches_server(level) for level in cache._levels)
    return isinstance(cache, RemoteCache)
