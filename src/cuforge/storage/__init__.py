"""Bytes-in/bytes-out program caches. Imports nothing from CUDA or other cuforge layers.

Public names mirror ``cuda.core.utils``; ``cuforge.utils`` re-exports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._winretry import _is_windows_sharing_violation
from .base import CacheWriteWarning, ProgramCacheResource
from .config import default_cache
from .entry import CacheEntry, EntryInfo, entry_id
from .filestream import FileStreamProgramCache, default_cache_dir
from .memory import InMemoryProgramCache
from .signing import SignedProgramCache
from .stats import CacheStats
from .tiered import TieredProgramCache
from .urls import open_cache

if TYPE_CHECKING:
    from .redis import RedisProgramCache

__all__ = [
    "CacheEntry",
    "CacheStats",
    "CacheWriteWarning",
    "EntryInfo",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "RedisProgramCache",
    "SignedProgramCache",
    "TieredProgramCache",
    "_is_windows_sharing_violation",
    "default_cache",
    "default_cache_dir",
    "entry_id",
    "open_cache",
]


def __getattr__(name: str) -> Any:
    # The Redis backend imports redis-py: load it only when asked for.
    if name == "RedisProgramCache":
        from .redis import RedisProgramCache

        return RedisProgramCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
