"""The Redis cache's handle, :class:`RedisProgramCache`: the storage core over the
shared remote driver (``storage.remote``) and this package's connection (``_store``).
Imported when the class is first used (``cuforge.storage.redis`` re-exports it
lazily), so that checking a ``redis://`` URL (``_url``) loads none of it."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..remote import RemoteCache
from ..units import positive_seconds
from ._resp import client_for_url
from ._store import RedisStore, redis_py

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from ._cluster import ClusterClient
    from ._resp import RespClient

__all__ = ["RedisProgramCache"]

_URL_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _need_redis() -> None:
    """ImportError unless redis-py is installed (found, not imported: that costs ~100 ms)."""
    if importlib.util.find_spec("redis") is None:
        raise ImportError(
            "Redis caches need the redis package: pip install 'cuforge[redis]' (or redis>=5)"
        )


class RedisProgramCache(RemoteCache):
    """Program cache in Redis, safe to share between any number of hosts.

    ``url_or_client``: a ``redis://[[user]:password@]host:port/db`` or ``rediss://``
    (TLS) URL as redis-py's ``from_url`` reads it, or a ready ``redis.Redis`` /
    ``redis.cluster.RedisCluster`` client (then its own timeouts apply).
    ``cluster=True`` (or a ``redis+cluster://`` URL) talks to a Redis Cluster.
    Cache URLs with cuforge's parameters go through ``open_cache``.

    Guarantees:

    - **Never a corrupt hit.** An entry is one value: header, blake2b digest over
      key + metadata + payload, metadata, payload. A value that does not verify is
      a miss, counted in ``integrity_failures``, and deleted if still unchanged.
    - **One round trip per lookup** (``GET``, or ``GETEX`` refreshing the TTL);
      ``update()`` and ``get_entries()`` pipeline; counters travel every
      ``stats_every`` operations or ``stats_interval`` seconds.
    - **Size** is bounded by the server (``maxmemory`` with ``allkeys-lru``);
      ``ttl`` (seconds) expires entries not read for that long: a hit renews it.
    - **Fails open and fast.** Commands time out after ``timeout`` s (connect:
      ``connect_timeout``). A lookup that fails is a miss (``read_failures``), a
      store that fails is dropped (``write_failures``); the first failure warns once
      (a lookup: :class:`CacheReadWarning`, a store: :class:`CacheWriteWarning`). After a
      connection failure or timeout the server is skipped for ``retry_after`` s (doubling
      to ``max_retry_after``) instead of paying the timeout per compile. Maintenance
      calls (``len``, ``clear``, listing, ``total_stats``) raise ``ConnectionError``.
    - **Single-flight across hosts**: ``lock(key)`` is an expiring lock key with a
      ``lock_lease`` renewed while held; a dead holder frees it within one lease.
    - **Only its own keys**: the prefix may hold other programs' keys; ``clear`` and
      the removals take only entry names of this prefix holding a string.
    - ``read_only=True`` (a ``?ro`` level) never writes to the server: no stores,
      TTL renewals, removals of damaged values, locks or fleet counters (a
      ``PermissionError`` from ``clear``/``del``/``remove_entry``). On a replica,
      hits stop renewing TTLs by themselves.
    """

    def __init__(
        self,
        url_or_client: str | Redis | RedisCluster,
        *,
        prefix: str = "cuforge:",
        ttl: float | None = None,
        timeout: float = 0.5,
        connect_timeout: float = 0.1,
        cluster: bool | None = None,
        lock_lease: float = 30.0,
        retry_after: float = 1.0,
        max_retry_after: float = 30.0,
        stats_every: int = 64,
        stats_interval: float = 10.0,
        read_only: bool = False,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        _need_redis()
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
        ttl = None if ttl is None else positive_seconds("ttl", ttl)
        timeouts = (positive_seconds("timeout", timeout),
                    positive_seconds("connect_timeout", connect_timeout))  # fmt: skip
        self._timeout, self._connect_timeout = timeouts
        ttl_ms = None if ttl is None else max(1, int(ttl * 1000))
        if isinstance(url_or_client, str):
            scheme = url_or_client.partition("://")[0].lower()
            if scheme not in _URL_SCHEMES:
                raise ValueError(
                    f"url_or_client: {url_or_client.split('@')[-1]!r} is not a Redis URL "
                    f"(expected {', '.join(s + '://' for s in _URL_SCHEMES)})"
                )
            self._url: str | None = url_or_client
            parts = urlsplit(url_or_client)
            is_cluster = bool(cluster) or parts.scheme.endswith("+cluster")
            where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path}"
            options = dict(client_options or {})
            fast: RespClient | ClusterClient | None
            if is_cluster:  # the small client routes by slot (``_cluster``)
                from ._cluster import cluster_client_for_url

                fast = cluster_client_for_url(url_or_client, options, *timeouts)
            else:
                fast = client_for_url(url_or_client, options, *timeouts)
            client = None
        elif callable(getattr(url_or_client, "pipeline", None)):
            self._url = None
            client = url_or_client
            is_cluster = isinstance(client, redis_py().cluster.RedisCluster)
            kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
            where = f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
            options, fast = {}, None
        else:
            raise TypeError(
                "url_or_client must be a Redis URL or a redis-py client, got "
                f"{type(url_or_client).__name__}"
            )
        store = RedisStore(
            where, prefix, url=self._url, client=client, cluster=is_cluster, fast=fast,
            options=options, timeouts=timeouts, ttl_ms=ttl_ms, read_only=bool(read_only),
        )  # fmt: skip
        self._redis = store
        super().__init__(store, read_only, lock_lease, (retry_after, max_retry_after),
                         (stats_every, stats_interval))  # fmt: skip

    @property
    def ttl(self) -> float | None:
        ttl_ms = self._redis.ttl_ms
        return None if ttl_ms is None else ttl_ms / 1000

    @property
    def cluster(self) -> bool:
        return self._redis.cluster

    def __repr__(self) -> str:
        return f"RedisProgramCache({self._store.where!r}, prefix={self.prefix!r})"
