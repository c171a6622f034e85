"""Bytes-in/bytes-out program caches. Imports nothing from CUDA or other cuforge layers.

Public names mirror ``cuda.core.utils``; ``cuforge.utils`` re-exports them. Names
resolve on first use, so ``import cuforge.storage.filestream`` (a cache hit from a
fresh process) loads only the modules that backend needs.
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    # What __getattr__ resolves, spelled out for type checkers (tests/test_typing.py
    # checks that this block and _EXPORTS agree).
    from cuforge.storage._safedir import CachePathError as CachePathError
    from cuforge.storage._safedir import UnsafeCacheError as UnsafeCacheError
    from cuforge.storage._winretry import (
        _is_windows_sharing_violation as _is_windows_sharing_violation,
    )
    from cuforge.storage.base import CacheReadWarning as CacheReadWarning
    from cuforge.storage.base import CacheWriteWarning as CacheWriteWarning
    from cuforge.storage.base import ProgramCacheResource as ProgramCacheResource
    from cuforge.storage.config import default_cache as default_cache
    from cuforge.storage.entry import CacheEntry as CacheEntry
    from cuforge.storage.entry import EntryInfo as EntryInfo
    from cuforge.storage.entry import entry_id as entry_id
    from cuforge.storage.filestream import FileStreamProgramCache as FileStreamProgramCache
    from cuforge.storage.filestream import default_cache_dir as default_cache_dir
    from cuforge.storage.memory import InMemoryProgramCache as InMemoryProgramCache
    from cuforge.storage.redis import RedisProgramCache as RedisProgramCache
    from cuforge.storage.signing import SignedProgramCache as SignedProgramCache
    from cuforge.storage.sqlite import CacheRecoveryWarning as CacheRecoveryWarning
    from cuforge.storage.sqlite import SQLiteProgramCache as SQLiteProgramCache
    from cuforge.storage.sqlite import default_db_path as default_db_path
    from cuforge.storage.stats import CacheStats as CacheStats
    from cuforge.storage.tiered import TieredProgramCache as TieredProgramCache
    from cuforge.storage.urls import open_cache as open_cache

# public name -> module that defines it
_EXPORTS = {
    "CacheEntry": "cuforge.storage.entry",
    "CachePathError": "cuforge.storage._safedir",
    "CacheRecoveryWarning": "cuforge.storage.sqlite",
    "CacheStats": "cuforge.storage.stats",
    "CacheReadWarning": "cuforge.storage.base",
    "CacheWriteWarning": "cuforge.storage.base",
    "EntryInfo": "cuforge.storage.entry",
    "FileStreamProgramCache": "cuforge.storage.filestream",
    "InMemoryProgramCache": "cuforge.storage.memory",
    "ProgramCacheResource": "cuforge.storage.base",
    "RedisProgramCache": "cuforge.storage.redis",  # imports redis-py: pip install 'cuforge[redis]'
    "SQLiteProgramCache": "cuforge.storage.sqlite",
    "SignedProgramCache": "cuforge.storage.signing",
    "TieredProgramCache": "cuforge.storage.tiered",
    "UnsafeCacheError": "cuforge.storage._safedir",
    "_is_windows_sharing_violation": "cuforge.storage._winretry",
    "default_cache": "cuforge.storage.config",
    "default_cache_dir": "cuforge.storage.filestream",
    "default_db_path": "cuforge.storage.sqlite",
    "entry_id": "cuforge.storage.entry",
    "open_cache": "cuforge.storage.urls",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
