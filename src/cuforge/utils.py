"""``cuforge.utils`` mirrors ``cuda.core.utils``: program caches and cache keys.

Change ``from cuda.core.utils import ...`` to ``from cuforge.utils import ...``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuforge.compile.cache_key import KEY_SCHEMA_VERSION, make_program_cache_key
from cuforge.storage import (
    CacheStats,
    CacheWriteWarning,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    SignedProgramCache,
    TieredProgramCache,
    default_cache,
    default_cache_dir,
    open_cache,
)

if TYPE_CHECKING:
    from cuforge.storage.redis import RedisProgramCache

__all__ = [
    "KEY_SCHEMA_VERSION",
    "CacheStats",
    "CacheWriteWarning",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "RedisProgramCache",
    "SignedProgramCache",
    "TieredProgramCache",
    "default_cache",
    "default_cache_dir",
    "make_program_cache_key",
    "open_cache",
]


def __getattr__(name: str) -> Any:
    # RedisProgramCache needs redis-py (pip install 'cuforge[redis]'): imported on use.
    if name == "RedisProgramCache":
        from cuforge.storage.redis import RedisProgramCache

        return RedisProgramCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
