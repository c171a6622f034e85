"""``cuforge.utils`` mirrors ``cuda.core.utils``: program caches and cache keys.

Change ``from cuda.core.utils import ...`` to ``from cuforge.utils import ...``.
"""

from __future__ import annotations

from cuforge.compile.cache_key import KEY_SCHEMA_VERSION, make_program_cache_key
from cuforge.storage import (
    CacheRecoveryWarning,
    CacheStats,
    CacheWriteWarning,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    SQLiteProgramCache,
    default_cache_dir,
    default_db_path,
)

__all__ = [
    "KEY_SCHEMA_VERSION",
    "CacheRecoveryWarning",
    "CacheStats",
    "CacheWriteWarning",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "SQLiteProgramCache",
    "default_cache_dir",
    "default_db_path",
    "make_program_cache_key",
]
