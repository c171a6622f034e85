"""``cuforge.utils`` mirrors ``cuda.core.utils``: program caches and cache keys.

Change ``from cuda.core.utils import ...`` to ``from cuforge.utils import ...``.
``toolkit_headers()`` (cuforge's own) reports the CUDA headers C++ programs get.

Names resolve on first use: ``import cuforge.utils`` costs almost nothing, and
using a cache class loads only the storage code (the compile layer loads with the
first name that needs it).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any

# public name -> module that defines it
_EXPORTS = {
    "KEY_SCHEMA_VERSION": "cuforge.compile.cache_key",
    "CachePathError": "cuforge.storage._safedir",
    "CacheRecoveryWarning": "cuforge.storage.sqlite",
    "CacheStats": "cuforge.storage.stats",
    "CacheWriteWarning": "cuforge.storage.base",
    "Explanation": "cuforge.compile.explain",
    "FileStreamProgramCache": "cuforge.storage.filestream",
    "InMemoryProgramCache": "cuforge.storage.memory",
    "ProgramCacheResource": "cuforge.storage.base",
    "RedisProgramCache": "cuforge.storage.redis",  # needs redis-py: cuforge[redis]
    "SQLiteProgramCache": "cuforge.storage.sqlite",
    "SignedProgramCache": "cuforge.storage.signing",
    "TieredProgramCache": "cuforge.storage.tiered",
    "UnsafeCacheError": "cuforge.storage._safedir",
    "default_cache": "cuforge.storage.config",
    "default_cache_dir": "cuforge.storage.filestream",
    "default_db_path": "cuforge.storage.sqlite",
    "explain": "cuforge.compile.explain",
    "fingerprint_headers": "cuforge.compile.cache_key",
    "make_program_cache_key": "cuforge.compile.cache_key",
    "open_cache": "cuforge.storage.urls",
    "toolkit_headers": "cuforge.compile._toolkit",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
