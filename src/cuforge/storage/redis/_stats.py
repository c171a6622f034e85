"""Fleet statistics in Redis: every handle adds its counters to one hash.

The hash ``<prefix>stats`` has one integer field per CacheStats counter. A handle
sends what it counted since its last flush -- the difference between its counters
now and at that flush, negative where the compile layer took a count back -- as
pipelined HINCRBYs every ``every`` operations, every ``interval`` seconds, at
close, and at interpreter exit for handles still open. A flush that fails is
retried with the next one, so counts are late but not lost while the handle
lives; a handle killed, or dropped without ``close()``, between flushes loses at
most ``every`` operations' worth.
"""

from __future__ import annotations

import time
from typing import Any

from .._livehandles import LiveHandles
from ..stats import CacheStats
from ._resp import RespClient

__all__ = ["FleetCounters", "read_fleet", "track", "untrack"]

_FIELDS = tuple(CacheStats().as_dict())


class FleetCounters:
    """When and what a handle flushes to the fleet hash ``name``."""

    def __init__(self, name: bytes, every: int, interval: float) -> None:
        self.name = name
        self.every = max(1, int(every))
        self.interval = interval
        self.reset()

    def reset(self) -> None:
        """Forget what was flushed (a forked child starts from zero)."""
        self.flushed = CacheStats()
        self.ops = 0
        self.last = time.monotonic()

    def due(self) -> bool:
        """Count one operation; whether a flush is due now."""
        self.ops += 1
        return self.ops >= self.every or time.monotonic() - self.last >= self.interval

    def flush(self, client: Any, stats: CacheStats) -> None:
        """Send ``stats - flushed``; Redis errors propagate (nothing is marked sent)."""
        self.ops = 0
        self.last = time.monotonic()
        current = stats.copy()
        delta = {n: v for n, v in (current - self.flushed).as_dict().items() if v}
        if delta and isinstance(client, RespClient):  # the hit path's small client
            client.pipeline([(b"HINCRBY", self.name, f, v) for f, v in delta.items()])
        elif delta:
            pipe = client.pipeline(transaction=False)
            for field, value in delta.items():
                pipe.hincrby(self.name, field, value)
            pipe.execute()
        self.flushed = current


def read_fleet(client: Any, name: bytes) -> CacheStats:
    """The fleet hash as CacheStats (unknown fields, from newer versions, ignored)."""
    raw = client.hgetall(name)
    fields = {k.decode(): int(v) for k, v in raw.items() if k.decode() in _FIELDS}
    return CacheStats(**fields)


# Open handles: flushed at interpreter exit; reset in a forked child, which must not
# report its parent's counts as its own.
_LIVE = LiveHandles()


def track(cache: Any) -> None:
    """Call ``cache._flush_at_exit()`` at exit and ``cache._after_fork_in_child()`` in a
    forked child, while the handle lives."""
    _LIVE.add(cache)


def untrack(cache: Any) -> None:
    _LIVE.discard(cache)
