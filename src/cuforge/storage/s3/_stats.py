"""Fleet statistics on an object store: each handle writes what it counted as a
small object of its own, and the fleet's total is their sum.

Object stores have no atomic increment, and a shared counter object rewritten by
every process would lose counts to racing writers. So a handle writes its counts
since its last flush (a :class:`CacheStats` record) to a new object
``<prefix>stats/<time_ns>-<random>`` -- never rewriting anyone's -- at close, at
interpreter exit, and every ``every`` operations or ``interval`` seconds while it
lives. ``total_stats()`` lists ``stats/`` and sums; a reader with the lease on the
stats folds many objects into one (written first, then the folded ones deleted:
a crash in between can count a fold twice, never lose one). A short-lived process
costs one small PUT at exit; a failed flush is retried with the next one.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ..stats import CacheStats

__all__ = ["FleetCounters", "read_all", "write"]


class FleetCounters:
    """When and what a handle flushes under ``folder`` (``<prefix>stats/``)."""

    def __init__(self, folder: str, every: int, interval: float) -> None:
        self.folder = folder
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

    def flush(self, obs: Any, store: Any, stats: CacheStats) -> None:
        """Write ``stats - flushed`` as a new object (nothing when it is all zero).
        Errors propagate and nothing is marked sent."""
        self.ops = 0
        self.last = time.monotonic()
        current = stats.copy()
        delta = current - self.flushed
        # A count taken back (negative) waits until later counts cover it: records
        # hold no negatives.
        sent = CacheStats(**{n: max(0, v) for n, v in delta.as_dict().items()})
        if any(sent.as_dict().values()):
            write(obs, store, self.folder, sent)
        self.flushed = self.flushed + sent


def write(obs: Any, store: Any, folder: str, counts: CacheStats) -> str:
    """Write ``counts`` as a new object under ``folder``; its path."""
    name = f"{folder}{time.time_ns():020d}-{secrets.token_hex(6)}"
    obs.put(store, name, counts.to_record(), mode="create")
    return name


def read_all(obs: Any, store: Any, folder: str) -> tuple[CacheStats, list[str]]:
    """The sum of every counter object under ``folder`` and their paths (objects
    that vanished meanwhile or do not parse are skipped)."""
    total = CacheStats()
    paths: list[str] = []
    for page in obs.list(store, prefix=folder):
        for meta in page:
            try:
                record = CacheStats.from_record(bytes(obs.get(store, meta["path"]).bytes()))
            except FileNotFoundError:
                continue
            if record is not None:
                total = total + record
                paths.append(meta["path"])
    return total, paths
