"""``sqlite:///path/to/cache.db?max_size=..&durable&timeout=..&trust=shared``: the URL
scheme of :class:`cuforge.storage.sqlite.SQLiteProgramCache`.

Named in ``storage.urls``' scheme table and imported only when such a URL is opened.
"""

from __future__ import annotations

from ..spec import CacheSpec
from ._floor import cap_problem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._cache import SQLiteProgramCache

__all__ = ["check_sqlite", "open_sqlite"]


def check_sqlite(spec: CacheSpec) -> None:
    """What :func:`open_sqlite` refuses in the URL itself, checked without opening
    (``storage.urls.check_level``): ValueError naming the bad part -- a cap below
    the smallest a SQLite cache can keep (``_floor``) among them."""
    if not spec.location:
        raise spec.error("sqlite:// needs a database file (sqlite:///path/to/cache.db)")
    # each raises for a value that does not parse
    cap = spec.size("max_size")
    small = None if cap is None else cap_problem(cap)
    if small is not None:
        raise spec.error(f"max_size={spec.params['max_size']}: {small}")
    spec.flag("durable")
    spec.duration("timeout")
    spec.trust_shared()


def open_sqlite(spec: CacheSpec) -> SQLiteProgramCache:
    """The SQLiteProgramCache ``spec`` names; ValueError naming the bad part."""
    from ._cache import SQLiteProgramCache

    check_sqlite(spec)
    timeout = spec.duration("timeout")
    return SQLiteProgramCache(
        spec.location,
        max_size_bytes=spec.size("max_size"),
        durable=spec.flag("durable"),
        timeout=5.0 if timeout is None else timeout,
        trust_shared=spec.trust_shared(),
        read_only=spec.read_only,
    )
