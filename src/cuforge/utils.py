"""``cuforge.utils`` mirrors ``cuda.core.utils``: program caches and cache keys.

Change ``from cuda.core.utils import ...`` to ``from cuforge.utils import ...``.
``toolkit_headers()`` (cuforge's own) reports the CUDA headers C++ programs get.
"""

from __future__ import annotations

from cuforge.compile._toolkit import toolkit_headers
from cuforge.compile.cache_key import (
    KEY_SCHEMA_VERSION,
    fingerprint_headers,
    make_program_cache_key,
)
from cuforge.compile.explain import Explanation, explain
from cuforge.storage import (
    CacheStats,
    CacheWriteWarning,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    default_cache_dir,
)

__all__ = [
    "KEY_SCHEMA_VERSION",
    "CacheStats",
    "CacheWriteWarning",
    "Explanation",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "default_cache_dir",
    "explain",
    "fingerprint_headers",
    "make_program_cache_key",
    "toolkit_headers",
]
