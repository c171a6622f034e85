"""Bytes-in/bytes-out program caches. Imports nothing from CUDA or other cuforge layers.

Public names mirror ``cuda.core.utils``; ``cuforge.utils`` re-exports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._safedir import CachePathError, UnsafeCacheError
from ._winretry import _is_windows_sharing_violation
from .base import CacheWriteWarning, ProgramCacheResource
from .config import default_cache
from .entry import CacheEntry, EntryInfo, entry_id
from .filestream import FileStreamProgramCache, default_cache_dir
from .memory import InMemoryProgramCache
from .sqlite import CacheRecoveryWarning, SQLiteProgramCache, default_db_path
from .stats import CacheStats

if TYPE_CHECKING:
    from .redis import RedisProgramCache
    from .signing import SignedProgramCache
    from .tiered import TieredProgramCache
    from .urls import open_cache

__all__ = [
    "CacheEntry",
    "CachePathError",
    "CacheRecoveryWarning",
    "CacheStats",
    "CacheWriteWarning",
    "EntryInfo",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "RedisProgramCache",
    "SQLiteProgramCache",
    "SignedProgramCache",
    "TieredProgramCache",
    "UnsafeCacheError",
    "_is_windows_sharing_violation",
    "default_cache",
    "default_cache_dir",
    "default_db_path",
    "entry_id",
    "open_cache",
]


# Loaded on first use: the Redis backend imports redis-py, and the others are not on
# the hit path of a plain FileStream cache (the CLI imports this package).
_LAZY = {
    "RedisProgramCache": ".redis",
    "SignedProgramCache": ".signing",
    "TieredProgramCache": ".tiered",
    "open_cache": ".urls",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
