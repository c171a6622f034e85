"""A program cache on Redis (or any Redis-protocol server), shared by a fleet of hosts.

``pip install 'cuforge[redis]'`` (redis-py). Keys in the server, for an entry whose
id (see ``entry.entry_id``) is ``<id>``::

    <prefix>{<id>}          the entry: one string value (layout in _frame)
    <prefix>{<id>}:lock     single-flight lock while someone compiles it
    <prefix>stats           fleet counters: a hash, one field per CacheStats counter

The ``{<id>}`` hash tag puts an entry and its lock in one Redis Cluster slot, so
every operation stays on one shard. The cache never breaks a compile: see
:class:`RedisProgramCache` for what happens when the server is down or slow.

The prefix may be shared with other programs' keys: whatever the cache deletes goes
through :func:`~cuforge.storage.ownership.delete_owned` with a proof that it is one
of the names above (``_listing`` for entries; the counters and a lock only by their
exact names).
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cuforge._stack import outside_level

from .. import events
from .._breaker import CircuitBreaker
from .._values import coerce_key, coerce_value
from ..base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheReadWarning,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    check_meta,
)
from ..entry import CacheEntry, key_digest
from ..ownership import delete_owned
from ..stats import CacheStats
from . import _frame as frame
from ._listing import EntryListing
from ._lock import RELEASE, RENEW, LockLease, poll_lock
from ._quiet import QuietReads
from ._read import get_entries as batch_get_entries
from ._read import settle
from ._resp import ReplyError, RespClient, client_for_url
from ._stats import FleetCounters, read_fleet, track, untrack

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

_redis: Any = None  # redis-py, imported on first need (see _resp for why)

__all__ = ["RedisProgramCache"]

_URL_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _need_redis() -> None:
    """ImportError unless redis-py is installed (found, not imported: that costs ~100 ms)."""
    if _redis is None and importlib.util.find_spec("redis") is None:
        raise ImportError(
            "Redis caches need the redis package: pip install 'cuforge[redis]' (or redis>=5)"
        )


def _redis_py() -> Any:
    """The redis module, imported now if it was not."""
    global _redis
    if _redis is None:
        import redis
        import redis.cluster
        import redis.exceptions

        _redis = redis
    return _redis


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


class RedisProgramCache(EntryListing, EntryCache):
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
      ``update()`` pipelines; counters travel every ``stats_every`` operations.
    - **Size** is bounded by the server (``maxmemory`` with ``allkeys-lru``);
      ``ttl`` (seconds) expires entries not read for that long: a hit renews it.
    - **Fails open and fast.** Commands time out after ``timeout`` s (connect:
      ``connect_timeout``). A lookup that fails is a miss (``read_failures``), a
      store that fails is dropped (``write_failures``); the first failure warns once
      (a lookup: :class:`CacheReadWarning`, a store: :class:`CacheWriteWarning`). After a
      connection failure or timeout the server is skipped for ``retry_after`` s (doubling
      to ``max_retry_after``) instead of paying the timeout per compile. Maintenance
      calls (``len``, ``clear``, listing, ``total_stats``) raise ``ConnectionError``.
    - **Single-flight across hosts**: ``lock(key)`` is an expiring lock key (see
      ``_lock``) with a ``lock_lease`` renewed while held; a dead holder frees
      it within one lease.
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
        super().__init__()
        _need_redis()
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
        ttl = None if ttl is None else _positive("ttl", ttl)
        self._timeout = _positive("timeout", timeout)
        self._connect_timeout = _positive("connect_timeout", connect_timeout)
        self._lease_ms = max(1, int(_positive("lock_lease", lock_lease) * 1000))
        self._ttl_ms = None if ttl is None else max(1, int(ttl * 1000))
        self._read_only = bool(read_only)
        # A read-only handle never writes, not even a TTL renewal.
        self._refresh_ms = None if self._read_only else self._ttl_ms
        self._prefix = prefix
        self._pre = prefix.encode()
        self._breaker = CircuitBreaker(
            _positive("retry_after", retry_after), _positive("max_retry_after", max_retry_after)
        )
        self._fleet = FleetCounters(
            self._pre + b"stats", stats_every, _positive("stats_interval", stats_interval)
        )
        self._quiet = QuietReads()  # maintenance reads never count as a use
        self._warned = False
        self._closed = False
        self._mutex = threading.Lock()
        self._client: Any = None
        self._fast: RespClient | None
        self._scripts: tuple[Any, Any] | None = None
        if isinstance(url_or_client, str):
            scheme = url_or_client.partition("://")[0].lower()
            if scheme not in _URL_SCHEMES:
                raise ValueError(
                    f"url_or_client: {url_or_client.split('@')[-1]!r} is not a Redis URL "
                    f"(expected {', '.join(s + '://' for s in _URL_SCHEMES)})"
                )
            self._url: str | None = url_or_client
            parts = urlsplit(url_or_client)
            self._cluster = bool(cluster) or parts.scheme.endswith("+cluster")
            self._where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path}"
            self._options = dict(client_options or {})
            self._fast = (
                None
                if self._cluster
                else client_for_url(
                    url_or_client, self._options, self._timeout, self._connect_timeout
                )
            )
        elif callable(getattr(url_or_client, "pipeline", None)):
            self._url = None
            self._client = url_or_client
            self._cluster = isinstance(url_or_client, _redis_py().cluster.RedisCluster)
            kw = getattr(getattr(url_or_client, "connection_pool", None), "connection_kwargs", {})
            self._where = f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
            self._options = {}
            self._fast = None
        else:
            raise TypeError(
                "url_or_client must be a Redis URL or a redis-py client, got "
                f"{type(url_or_client).__name__}"
            )
        track(self)

    # -- connection and failure handling -------------------------------------------
    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def ttl(self) -> float | None:
        return None if self._ttl_ms is None else self._ttl_ms / 1000

    @property
    def cluster(self) -> bool:
        return self._cluster

    @property
    def read_only(self) -> bool:
        return self._read_only

    def _conn(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._mutex:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        assert self._url is not None
        _redis = _redis_py()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options: dict[str, Any] = {
            "socket_timeout": self._timeout,
            "socket_connect_timeout": self._connect_timeout,
            "retry": Retry(NoBackoff(), 0),  # fail fast: the breaker decides when to retry
            **self._options,
        }
        scheme, sep, rest = self._url.partition("://")
        url = scheme.replace("+cluster", "") + sep + rest
        if self._cluster:
            # Discovers the slot map now: raises if no node answers (caught by callers).
            return _redis.cluster.RedisCluster.from_url(url, **options)
        return _redis.Redis.from_url(url, **options)

    def _script(self, which: int) -> Any:
        if self._scripts is None:
            client = self._conn()
            self._scripts = (client.register_script(RELEASE), client.register_script(RENEW))
        return self._scripts[which]

    def _failed(self, exc: BaseException, what: str) -> None:
        """Record a failed command: back off when the server is unreachable; warn once."""
        # An error answer (read-only replica, OOM) is no outage; a down cluster is.
        refused = isinstance(exc, ReplyError) or (
            _redis is not None
            and isinstance(exc, _redis.ResponseError)
            and not isinstance(exc, _redis.exceptions.ClusterError)
        )
        retry = None if refused else self._breaker.failure()
        if self._warned:
            return
        self._warned = True
        after = (
            f"the server answered with an error, so {what}s fail"
            if refused
            else f"lookups are misses and stores are skipped, retrying in {retry:g} s"
        )
        warnings.warn(
            f"cuforge Redis cache {self._where}: {what} failed ({type(exc).__name__}: {exc}); "
            f"{after}. Compiles are not affected. Later failures of this handle are counted "
            "in stats() (read_failures, write_failures) without a warning.",
            CacheReadWarning if what == "lookup" else CacheWriteWarning,
            stacklevel=outside_level(),
        )

    @contextlib.contextmanager
    def _maintenance(self, what: str) -> Iterator[None]:
        """Turns Redis errors of a maintenance call into one ConnectionError."""
        try:
            yield
        except (OSError, ReplyError) as exc:  # from the small client
            raise ConnectionError(
                f"Redis cache {self._where}: could not {what} ({type(exc).__name__}: {exc})"
            ) from exc
        except (_redis_py().RedisError, _redis.exceptions.RedisClusterException) as exc:
            raise ConnectionError(
                f"Redis cache {self._where}: could not {what} ({type(exc).__name__}: {exc})"
            ) from exc

    # -- names ------------------------------------------------------------------------
    def _entry_name(self, kd: bytes) -> bytes:
        return b"%s{%s}" % (self._pre, kd.hex().encode())

    # -- reads ------------------------------------------------------------------------
    def get_entry(self, key: CacheKey) -> CacheEntry | None:
        self._check_open()
        kd = key_digest(coerce_key(key))
        stats = self._stats
        if not self._breaker.allow():
            stats.misses += 1
            stats.read_failures += 1
            return None
        name = self._entry_name(kd)
        try:
            value = self._lookup(name)
        except Exception as exc:  # every server problem is a miss
            stats.misses += 1
            stats.read_failures += 1
            self._failed(exc, "lookup")
            return None
        self._breaker.success()
        return settle(self, kd, name, value)

    get_entries = batch_get_entries  # every key in one round trip (see _read)

    def _lookup(self, name: bytes) -> Any:
        """One GET (GETEX renewing the TTL): the small client when it serves this URL."""
        refresh = self._refresh_ms
        fast = self._fast
        if fast is not None:
            if refresh is None:
                return fast.call(b"GET", name)
            try:
                return fast.call(b"GETEX", name, b"PX", refresh)
            except ReplyError as exc:
                if not str(exc).startswith("READONLY"):
                    raise
                self._refresh_ms = None  # a replica: read without renewing TTLs
                return fast.call(b"GET", name)
        client = self._conn()
        if refresh is None:
            return client.get(name)
        try:
            return client.getex(name, px=refresh)
        except _redis.exceptions.ReadOnlyError:
            self._refresh_ms = None
            return client.get(name)

    def _drop(self, name: bytes, value: bytes) -> None:
        """Delete a damaged value unless someone replaced it meanwhile. ``name`` is the
        entry name of the key just looked up (its store would replace the value
        anyway), so the name is the proof; the compare-and-delete runs on the server."""
        if self._read_only:
            return

        def remove(names: list[bytes]) -> int:
            return int(
                self._conn().eval(
                    "if redis.call('getrange', KEYS[1], 0, ARGV[2]) == ARGV[1] then "
                    "return redis.call('del', KEYS[1]) end return 0",
                    1,
                    names[0],
                    value[: frame.PREFIX_SIZE],
                    frame.PREFIX_SIZE - 1,
                )
            )

        with contextlib.suppress(Exception):
            delete_owned([name], lambda n: self._id_of(n) is not None, remove, self._where)

    # -- writes -----------------------------------------------------------------------
    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.set_entry(key, value)

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> None:
        """Store ``value`` with ``meta``; a server problem is a counted, warned write failure."""
        self._check_open()
        kd = key_digest(coerce_key(key))
        data = coerce_value(value, "RedisProgramCache.__setitem__")
        check_meta(meta)
        self._write([(self._entry_name(kd), frame.pack(kd, data, meta, time.time_ns()), len(data))])

    def update(
        self,
        items: Mapping[CacheKey, CacheValue] | Iterable[tuple[CacheKey, CacheValue]],
        /,
    ) -> None:
        """Store many entries in one pipelined round trip (entries without metadata).

        Not transactional: a bad key or value raises after the entries before it
        are stored.
        """
        self._check_open()
        pairs = items.items() if isinstance(items, Mapping) else items
        batch: list[tuple[bytes, bytes, int]] = []
        now = time.time_ns()
        try:
            for key, value in pairs:
                kd = key_digest(coerce_key(key))
                data = coerce_value(value, "RedisProgramCache.update")
                batch.append((self._entry_name(kd), frame.pack(kd, data, b"", now), len(data)))
        finally:
            if batch:
                self._write(batch)

    def _write(self, batch: list[tuple[bytes, bytes, int]]) -> None:
        stats = self._stats
        if self._read_only or not self._breaker.allow():
            stats.write_failures += len(batch)
            if self._read_only:
                events.note_dropped(events.READ_ONLY, f"Redis cache {self._where} is read-only")
            else:
                events.note_dropped(events.UNREACHABLE, f"Redis {self._where}: backing off")
            return
        try:
            client = self._conn()
            if len(batch) == 1:
                client.set(batch[0][0], batch[0][1], px=self._ttl_ms)
            else:
                pipe = client.pipeline(transaction=False)
                for name, value, _ in batch:
                    pipe.set(name, value, px=self._ttl_ms)
                pipe.execute()
        except Exception as exc:  # a store never breaks the caller
            stats.write_failures += len(batch)
            refused = isinstance(exc, ReplyError) or (
                _redis is not None and isinstance(exc, _redis.ResponseError)
            )
            events.note_dropped(
                events.FAILED if refused else events.UNREACHABLE,
                f"Redis {self._where}: {type(exc).__name__}: {exc}",
            )
            self._failed(exc, "store")
            return
        self._breaker.success()
        stats.stores += len(batch)
        stats.bytes_written += sum(n for _, _, n in batch)
        self._tick()

    def __delitem__(self, key: CacheKey) -> None:
        """Delete ``key``'s entry (as ``remove_entry``); KeyError if there is none."""
        self._check_writable()
        name = self._entry_name(key_digest(coerce_key(key)))
        with self._maintenance("delete"):
            removed = self._remove_owned([name])
        if not removed:
            raise KeyError(key)

    # -- single-flight ------------------------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """Cross-host per-key lock; yields whether it is held.

        Threads of this process queue locally first, then one polls the server.
        Yields False at once when the server cannot be reached, as soon as the entry
        has been stored by the holder (look again: it is a hit), or after
        ``timeout`` seconds (None: no limit).
        """
        self._check_open()
        return self._hold(key_digest(coerce_key(key)), timeout)

    @contextlib.contextmanager
    def _hold(self, kd: bytes, timeout: float | None) -> Iterator[bool]:
        deadline = float("inf") if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._key_locks.hold(kd, timeout) as local:
            if not local or self._read_only:  # read-only: this process's threads only
                yield local
                return
            lock_name = self._entry_name(kd) + b":lock"
            token = None
            if self._breaker.allow():
                try:
                    token, _ = poll_lock(
                        self._conn(), lock_name, self._entry_name(kd), self._lease_ms, deadline
                    )
                    self._breaker.success()
                except Exception as exc:  # no lock: compile unlocked
                    self._failed(exc, "lock")
            if token is None:
                yield False
                return
            lease = LockLease(self._script(1), lock_name, token, self._lease_ms)
            try:
                yield True
            finally:
                lease.stop()
                with contextlib.suppress(Exception):  # else it expires after one lease
                    # Only this lock's own name, and (on the server) only with our token.
                    delete_owned(
                        [lock_name],
                        lambda n: n == self._entry_name(kd) + b":lock",
                        lambda ns: int(self._script(0)(keys=ns, args=[token])),
                        self._where,
                    )

    # -- statistics and lifetime ----------------------------------------------------------
    def _tick(self) -> None:
        if self._fleet.due():
            self._flush_stats()

    def _flush_stats(self, raise_errors: bool = False) -> None:
        """Add what this handle counted since the last flush to the fleet's hash."""
        if self._read_only:
            return  # counters stay in this handle
        try:
            self._fleet.flush(self._fast or self._conn(), self._stats)
        except Exception:
            if raise_errors:
                raise

    def total_stats(self) -> CacheStats:
        """Counters summed over every host and process that used this prefix.

        Live handles contribute what they flushed (every ``stats_every``
        operations, every ``stats_interval`` seconds, and at close).
        """
        self._check_open()
        with self._maintenance("read statistics"):
            self._flush_stats(raise_errors=True)
            return read_fleet(self._conn(), self._fleet.name)

    def zero_stats(self) -> None:
        """Restart the fleet's counters (``total_stats()``) from zero for every host and
        process using this prefix, on the server: one shared hash, so this resets them
        for the whole fleet, not for this host.

        This handle first flushes what it counted, then the hash is deleted; live
        handles elsewhere keep their own counters and go on sending only what they
        count from their last flush, so nothing after the reset is counted twice.
        What a live handle counted before the reset but had not flushed yet (at most
        ``stats_every`` operations or ``stats_interval`` seconds' worth) still arrives
        afterwards. ``stats()`` (this handle's own counters) is unchanged. Raises
        PermissionError on a read-only handle and ConnectionError when the server
        cannot be reached.
        """
        self._check_writable()
        with self._maintenance("reset statistics"):
            self._flush_stats(raise_errors=True)
            delete_owned(  # the fleet hash, by its exact name only
                [self._fleet.name],
                lambda n: n == self._pre + b"stats",
                lambda ns: int(self._conn().delete(*ns)),
                self._where,
            )

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("operation on a closed RedisProgramCache")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise PermissionError(f"Redis cache {self._where} was opened read-only")

    def _flush_at_exit(self) -> None:
        if not self._closed and self._breaker.allow():
            self._flush_stats()

    def _after_fork_in_child(self) -> None:
        # The child must not report the parent's counts as its own; redis-py's
        # pools open fresh connections in a child by themselves.
        self._stats = CacheStats()
        self._fleet.reset()
        self._mutex = threading.Lock()
        if self._fast is not None:
            self._fast.forget()

    def close(self) -> None:
        """Flush the counters and drop the connections. Idempotent."""
        if self._closed:
            return
        if self._breaker.allow():
            self._flush_stats()
        self._closed = True
        untrack(self)
        if self._fast is not None:
            self._fast.close()
        if self._url is not None and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()

    def __repr__(self) -> str:
        return f"RedisProgramCache({self._where!r}, prefix={self._prefix!r})"
