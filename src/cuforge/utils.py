"""``cuforge.utils`` mirrors ``cuda.core.utils``: program caches and cache keys.

Change ``from cuda.core.utils import ...`` to ``from cuforge.utils import ...``.
``toolkit_headers()`` (cuforge's own) reports the CUDA headers C++ programs get.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuforge.compile._toolkit import toolkit_headers
from cuforge.compile.cache_key import (
    KEY_SCHEMA_VERSION,
    fingerprint_headers,
    make_program_cache_key,
)
from cuforge.compile.explain import Explanation, explain
from cuforge.storage import (
    CachePathError,
    CacheRecoveryWarning,
    CacheStats,
    CacheWriteWarning,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    SQLiteProgramCache,
    UnsafeCacheError,
    default_cache,
    default_cache_dir,
    default_db_path,
)

if TYPE_CHECKING:
    from cuforge.storage import (
        RedisProgramCache,
        SignedProgramCache,
        TieredProgramCache,
        open_cache,
    )

__all__ = [
    "KEY_SCHEMA_VERSION",
    "CachePathError",
    "CacheRecoveryWarning",
    "CacheStats",
    "CacheWriteWarning",
    "Explanation",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "RedisProgramCache",
    "SQLiteProgramCache",
    "SignedProgramCache",
    "TieredProgramCache",
    "UnsafeCacheError",
    "default_cache",
    "default_cache_dir",
    "default_db_path",
    "explain",
    "fingerprint_headers",
    "make_program_cache_key",
    "open_cache",
    "toolkit_headers",
]


def __getattr__(name: str) -> Any:
    # Loaded on use (RedisProgramCache needs redis-py: pip install 'cuforge[redis]').
    if name in ("RedisProgramCache", "SignedProgramCache", "TieredProgramCache", "open_cache"):
        import cuforge.storage

        return getattr(cuforge.storage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
