"""``sqlite:///path/to/cache.db?max_size=..&durable&timeout=..&trust=shared``: the URL
scheme of :class:`cuforge.storage.sqlite.SQLiteProgramCache`.

Named in ``storage.urls``' scheme table and imported only when such a URL is opened.
"""

from __future__ import annotations

from ..spec import CacheSpec
from . import SQLiteProgramCache

__all__ = ["open_sqlite"]


def open_sqlite(spec: CacheSpec) -> SQLiteProgramCache:
    """The SQLiteProgramCache ``spec`` names; ValueError naming the bad part."""
    if not spec.location:
        raise spec.error("sqlite:// needs a database file (sqlite:///path/to/cache.db)")
    timeout = spec.duration("timeout")
    return SQLiteProgramCache(
        spec.location,
        max_size_bytes=spec.size("max_size"),
        durable=spec.flag("durable"),
        timeout=5.0 if timeout is None else timeout,
        trust_shared=spec.trust_shared(),
    )
