"""Bytes-in/bytes-out program caches. Imports nothing from CUDA or other cuforge layers.

Public names mirror ``cuda.core.utils``; ``cuforge.utils`` re-exports them.
"""

from __future__ import annotations

from ._winretry import _is_windows_sharing_violation
from .base import CacheWriteWarning, ProgramCacheResource
from .entry import CacheEntry, EntryInfo, entry_id
from .filestream import FileStreamProgramCache, default_cache_dir
from .memory import InMemoryProgramCache
from .sqlite import CacheRecoveryWarning, SQLiteProgramCache, default_db_path
from .stats import CacheStats

__all__ = [
    "CacheEntry",
    "CacheRecoveryWarning",
    "CacheStats",
    "CacheWriteWarning",
    "EntryInfo",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "SQLiteProgramCache",
    "_is_windows_sharing_violation",
    "default_cache_dir",
    "default_db_path",
    "entry_id",
]
