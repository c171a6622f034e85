"""A program cache on Redis (or any Redis-protocol server), shared by a fleet of hosts.

``pip install 'cuforge[redis]'`` (redis-py). The handle (``_cache``) is the storage
core over the shared remote driver (``storage.remote``); this package is only the
Redis connection (``_store``: keys, scripts, leases, counters), the hit path's small
client (``_resp``), listings that do not touch entries (``_quiet``) and the URL
opener (``_url``). The cache never breaks a compile: see :class:`RedisProgramCache`.

This module imports nothing: :class:`RedisProgramCache` loads on first use, so that
checking a ``redis://`` URL (``_url``, at every open of a tier that names one)
costs only that module, not the handle, the driver and the client.
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._cache import RedisProgramCache as RedisProgramCache

__all__ = ["RedisProgramCache"]

__getattr__, __dir__ = _lazy.exports(
    __name__, {"RedisProgramCache": "cuforge.storage.redis._cache"}
)
