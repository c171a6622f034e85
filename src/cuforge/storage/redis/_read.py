"""The Redis cache's batched read: many entries in one round trip."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._values import coerce_key
from ..base import CacheKey
from ..entry import CacheEntry, key_digest
from . import _frame as frame
from ._resp import ReplyError

__all__ = ["fetch_many", "get_entries", "settle"]


def settle(cache: Any, kd: bytes, name: bytes, value: Any) -> CacheEntry | None:
    """The verified entry in the stored ``value`` of ``name`` (a hit counted), or None:
    absent, or damaged (counted, and dropped unless replaced meanwhile)."""
    stats = cache._stats
    result = None if value is None else frame.unpack(kd, value)
    if type(result) is CacheEntry:
        stats.hits += 1
        stats.bytes_read += len(result.data)
    else:
        stats.misses += 1
        if result is not None:
            stats.integrity_failures += 1
            cache._drop(name, value)
        result = None
    cache._tick()
    return result


def get_entries(cache: Any, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
    """``RedisProgramCache.get_entries``: every key in one round trip (``fetch_many``),
    each value checked as ``get_entry`` checks it; a server fault makes every key a
    counted miss (one warning per handle), never an error. A cluster asks key by key:
    the keys lie in different hash slots."""
    ks = [coerce_key(key) for key in keys]
    cache._check_open()
    if cache._cluster or len(ks) < 2:
        return [cache.get_entry(k) for k in ks]
    stats = cache._stats
    kds = [key_digest(k) for k in ks]
    names = [cache._entry_name(kd) for kd in kds]
    values: list[Any] | None = None
    if cache._breaker.allow():
        try:
            values = fetch_many(cache, names)
        except Exception as exc:  # every server problem is a miss
            cache._failed(exc, "lookup")
        else:
            cache._breaker.success()
    if values is None:
        stats.misses += len(ks)
        stats.read_failures += len(ks)
        return [None] * len(ks)
    return [settle(cache, kd, n, v) for kd, n, v in zip(kds, names, values, strict=True)]


def fetch_many(cache: Any, names: list[bytes]) -> list[Any]:
    """The stored values of ``names`` (None where absent), in one round trip: one
    MGET, or -- when reads renew the TTL -- one pipeline of GETEX. A read-only
    replica refuses GETEX: the handle then stops renewing and the read is an MGET.
    Not for a cluster (the names lie in different hash slots). Raises what the
    client raises when the server cannot be read.
    """
    refresh = cache._refresh_ms
    fast = cache._fast
    if fast is not None:
        if refresh is not None:
            try:
                return list(fast.pipeline([(b"GETEX", n, b"PX", refresh) for n in names]))
            except ReplyError as exc:
                if not str(exc).startswith("READONLY"):
                    raise
                cache._refresh_ms = None
        return list(fast.call(b"MGET", *names))
    client = cache._conn()
    if refresh is not None:
        pipe = client.pipeline(transaction=False)
        for n in names:
            pipe.getex(n, px=refresh)
        replies = pipe.execute(raise_on_error=False)
        if not any(isinstance(r, Exception) for r in replies):
            return list(replies)
        if not any("READONLY" in str(r) or "read only" in str(r) for r in replies):
            raise next(r for r in replies if isinstance(r, Exception))
        cache._refresh_ms = None
    return list(client.mget(names))
