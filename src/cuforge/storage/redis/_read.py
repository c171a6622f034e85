"""The Redis cache's batched read: many entries in one round trip."""

from __future__ import annotations

from typing import Any

from ._resp import ReplyError

__all__ = ["fetch_many"]


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
