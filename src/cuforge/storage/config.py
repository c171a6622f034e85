"""The default program cache, configured by the environment.

- ``CUFORGE_CACHE``: a cache URL (see ``storage.urls``: ``file:///...``,
  ``redis://host/0``, ``memory://,redis://host?ro``, a plain directory...) used by
  ``Program.compile(cache=True)`` and the ``cuforge`` command line. Unset or empty:
  a FileStream cache in the user cache directory (``default_cache_dir()``).
  ``off``: no caching.
- ``CUFORGE_CACHE_SECRET``: when set (16 bytes or more), every shared level of the
  default cache and of ``open_cache`` signs its entries and rejects entries without
  a valid signature (see ``storage.signing``).

:func:`default_cache` opens the cache once per process and returns the same
handle while the two variables keep their values, so ``cache=True`` costs two
environment reads on the hit path. A bad value raises ValueError naming the
variable; a cache that cannot be opened for environmental reasons (a directory that
cannot be created) warns once and compiles uncached.
"""

from __future__ import annotations

import os
import threading
import warnings

from cuforge._stack import outside_level

from ._env import ENV_CACHE, ENV_SECRET, secret_from_env
from .base import CacheWriteWarning, ProgramCacheResource

__all__ = ["ENV_CACHE", "ENV_SECRET", "default_cache", "open_default_cache", "secret_from_env"]

_OFF = "off"

_mutex = threading.Lock()
_current: tuple[tuple[str | None, str | None], ProgramCacheResource | None] | None = None


def open_default_cache() -> ProgramCacheResource | None:
    """A new handle on the cache the environment selects (None for ``off``).

    Raises ValueError naming ``$CUFORGE_CACHE`` or ``$CUFORGE_CACHE_SECRET`` for a
    bad value; errors opening the backend propagate.
    """
    value = (os.environ.get(ENV_CACHE) or "").strip()
    if value.lower() == _OFF:
        return None
    secret = secret_from_env()
    if not value:
        from .filestream import FileStreamProgramCache
        from .signing import SignedProgramCache

        # Signed entries cannot be planted: a shared directory is then acceptable.
        cache: ProgramCacheResource = FileStreamProgramCache(trust_shared=secret is not None)
        return cache if secret is None else SignedProgramCache(cache, secret)
    from .urls import open_cache

    try:
        return open_cache(value, secret=secret)
    except ValueError as exc:
        raise ValueError(f"${ENV_CACHE}: {exc}") from None


def default_cache() -> ProgramCacheResource | None:
    """The process-wide default cache (None when ``CUFORGE_CACHE=off``).

    Opened at the first call and kept; reopened only when ``CUFORGE_CACHE`` or
    ``CUFORGE_CACHE_SECRET`` changed since (the old handle is left to its users).
    """
    global _current
    env = (os.environ.get(ENV_CACHE), os.environ.get(ENV_SECRET))
    current = _current
    if current is not None and current[0] == env:
        return current[1]
    with _mutex:
        if _current is not None and _current[0] == env:
            return _current[1]
        try:
            cache = open_default_cache()
        except OSError as exc:
            warnings.warn(
                f"cuforge: the default program cache cannot be opened ({exc}); compiling "
                f"without a cache (set ${ENV_CACHE} to choose another, or {_OFF!r})",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )
            cache = None
        _current = (env, cache)
        return cache
