"""How a tier's batched read copies entries between signed levels under one secret.

With ``$CUFORGE_CACHE_SECRET`` every persistent level of a tier is a
``SignedProgramCache``. An entry a level behind found is verified there (its
HMAC-SHA256); back-filling it into a faster level through that level's
``set_entries`` would compute the same HMAC again to store the same bytes -- the
signature covers the key, the metadata and the payload, nothing else. So when the
level that found the entries and a level that missed them are signed under the
same secret (``SignedProgramCache.same_secret``), the entries are read with their
stored metadata (``get_entries_sealed``: verified and counted as ``get_entries``
does) and stored with it (``set_entries_sealed``): one HMAC per entry instead of
two, and byte for byte what signing again would store. Levels under another
secret, or unsigned, are read and written as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..base import CacheKey, CacheValue, ProgramCacheResource
from ..entry import CacheEntry
from ..outcome import StoreOutcome
from ..signing import SignedProgramCache
from ._lazylevel import LazyLevel, opened

__all__ = ["read_level", "signer_of", "write_level"]


def signer_of(level: ProgramCacheResource) -> SignedProgramCache | None:
    """The signed handle ``level`` is (an open lazy level: the one it opened), else
    None."""
    inner = opened(level) if isinstance(level, LazyLevel) else level
    return inner if isinstance(inner, SignedProgramCache) else None


def read_level(
    level: ProgramCacheResource, keys: list[bytes], missed: Sequence[ProgramCacheResource]
) -> tuple[list[CacheEntry | None], list[bytes] | None, list[bool]]:
    """``level.get_entries(keys)``; and, for each of the levels that ``missed`` these
    keys, whether it takes the entries sealed. When one does, the second item holds
    each found entry's stored metadata (in the order of the found ones), else None.
    Opens a lazy ``level`` as its ``get_entries`` would."""
    reader = signer_of(level.open() if isinstance(level, LazyLevel) else level)
    sealed = [reader is not None and reader.same_secret(signer_of(lv)) for lv in missed]
    if reader is None or not any(sealed):
        return level.get_entries(keys), None, sealed
    got = reader.get_entries_sealed(keys)
    stored = [g[1] for g in got if g is not None]
    return [None if g is None else g[0] for g in got], stored, sealed


def write_level(
    level: ProgramCacheResource,
    items: Sequence[tuple[CacheKey, CacheValue, bytes]],
    sealed: bool,
) -> Sequence[StoreOutcome | None]:
    """``level.set_entries(items)``; ``sealed`` (``read_level`` said so for this level):
    the items' metadata is as stored, signature first -- its ``set_entries_sealed``."""
    signer = signer_of(level) if sealed else None
    return level.set_entries(items) if signer is None else signer.set_entries_sealed(items)
