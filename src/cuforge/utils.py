"""``cuforge.utils`` mirrors ``cuda.core.utils``: program caches and cache keys.

Change ``from cuda.core.utils import ...`` to ``from cuforge.utils import ...``.
``toolkit_headers()`` (cuforge's own) reports the CUDA headers C++ programs get.

Names resolve on first use: ``import cuforge.utils`` costs almost nothing, and
using a cache class loads only the storage code (the compile layer loads with the
first name that needs it).
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    # What __getattr__ resolves, spelled out for type checkers (tests/test_typing.py
    # checks that this block and _EXPORTS agree).
    from cuforge.compile.cache_key import KEY_SCHEMA_VERSION as KEY_SCHEMA_VERSION
    from cuforge.compile.cache_key import fingerprint_headers as fingerprint_headers
    from cuforge.compile.cache_key import make_program_cache_key as make_program_cache_key
    from cuforge.compile.explain import Explanation as Explanation
    from cuforge.compile.explain import explain as explain
    from cuforge.compile.toolchain import toolkit_headers as toolkit_headers
    from cuforge.storage import CachePathError as CachePathError
    from cuforge.storage import UnsafeCacheError as UnsafeCacheError
    from cuforge.storage.base import CacheReadWarning as CacheReadWarning
    from cuforge.storage.base import CacheWriteWarning as CacheWriteWarning
    from cuforge.storage.base import ProgramCacheResource as ProgramCacheResource
    from cuforge.storage.config import default_cache as default_cache
    from cuforge.storage.filestream import FileStreamProgramCache as FileStreamProgramCache
    from cuforge.storage.filestream import default_cache_dir as default_cache_dir
    from cuforge.storage.memory import InMemoryProgramCache as InMemoryProgramCache
    from cuforge.storage.redis import RedisProgramCache as RedisProgramCache
    from cuforge.storage.s3 import S3ProgramCache as S3ProgramCache
    from cuforge.storage.signing import SignedProgramCache as SignedProgramCache
    from cuforge.storage.sqlite import CacheRecoveryWarning as CacheRecoveryWarning
    from cuforge.storage.sqlite import SQLiteProgramCache as SQLiteProgramCache
    from cuforge.storage.sqlite import default_db_path as default_db_path
    from cuforge.storage.stats import CacheStats as CacheStats
    from cuforge.storage.tiered import TieredProgramCache as TieredProgramCache
    from cuforge.storage.urls import open_cache as open_cache

# public name -> module that defines it
_EXPORTS = {
    "KEY_SCHEMA_VERSION": "cuforge.compile.cache_key",
    "CachePathError": "cuforge.storage",
    "CacheRecoveryWarning": "cuforge.storage.sqlite",
    "CacheStats": "cuforge.storage.stats",
    "CacheReadWarning": "cuforge.storage.base",
    "CacheWriteWarning": "cuforge.storage.base",
    "Explanation": "cuforge.compile.explain",
    "FileStreamProgramCache": "cuforge.storage.filestream",
    "InMemoryProgramCache": "cuforge.storage.memory",
    "ProgramCacheResource": "cuforge.storage.base",
    "RedisProgramCache": "cuforge.storage.redis",  # needs redis-py: cuforge[redis]
    "S3ProgramCache": "cuforge.storage.s3",  # needs obstore: cuforge[s3]
    "SQLiteProgramCache": "cuforge.storage.sqlite",
    "SignedProgramCache": "cuforge.storage.signing",
    "TieredProgramCache": "cuforge.storage.tiered",
    "UnsafeCacheError": "cuforge.storage",
    "default_cache": "cuforge.storage.config",
    "default_cache_dir": "cuforge.storage.filestream",
    "default_db_path": "cuforge.storage.sqlite",
    "explain": "cuforge.compile.explain",
    "fingerprint_headers": "cuforge.compile.cache_key",
    "make_program_cache_key": "cuforge.compile.cache_key",
    "open_cache": "cuforge.storage.urls",
    "toolkit_headers": "cuforge.compile.toolchain",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
