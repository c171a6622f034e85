"""Fleet statistics on an object store: each handle writes what it counted as a
small object of its own, and the fleet's total is their sum.

Object stores have no atomic increment, and a shared counter object rewritten by
every process would lose counts to racing writers. So a handle writes its counts
since its last flush (a :class:`CacheStats` record) to a new object
``<prefix>stats/<time_ns>-<random>`` -- never rewriting anyone's -- at close, at
interpreter exit, and every ``every`` operations or ``interval`` seconds while it
lives. ``total_stats()`` lists ``stats/`` and sums: a read, which creates nothing
(``cuforge cache stats`` leaves the bucket as it was). Writers fold: a handle that
has just written its counters at close or exit lists them, one time in
:data:`FOLD_ONE_IN`, and when there are more than :data:`FOLD_OVER` it takes the
stats lease, reads them again under it, writes their sum as one object and deletes
the ones it summed (written first, then deleted: a crash in between can count a
fold twice, never lose one; read under the lease, so two folders never both fold
the same objects). A short-lived process costs one small PUT at exit; a failed
flush is retried with the next one.

Only counter objects are ever read or deleted here: names ``<20 digits>-<12 hex>``
under ``<prefix>stats/`` (:meth:`FleetCounters.owns`); anything else in that folder
is someone else's.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ..stats import CacheStats

__all__ = ["FOLD_ONE_IN", "FOLD_OVER", "FleetCounters", "read_all", "write"]

#: A handle folds after one in this many of its close/exit flushes (at random).
FOLD_ONE_IN = 16
#: ... when more counter objects than this lie in the folder.
FOLD_OVER = 64


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

    def owns(self, path: str) -> bool:
        """Whether ``path`` is a counter object's (the ownership proof of one)."""
        return path.startswith(self.folder) and is_counter_name(path[len(self.folder) :])

    def fold_due(self) -> bool:
        """Whether the flush just made should fold the folder (one time in FOLD_ONE_IN)."""
        return secrets.randbelow(FOLD_ONE_IN) == 0

    def flush(self, obs: Any, store: Any, stats: CacheStats) -> bool:
        """Write ``stats - flushed`` as a new object (nothing when it is all zero);
        whether one was written. Errors propagate and nothing is marked sent."""
        self.ops = 0
        self.last = time.monotonic()
        current = stats.copy()
        delta = current - self.flushed
        # A count taken back (negative) waits until later counts cover it: records
        # hold no negatives.
        sent = CacheStats(**{n: max(0, v) for n, v in delta.as_dict().items()})
        wrote = any(sent.as_dict().values())
        if wrote:
            write(obs, store, self.folder, sent)
        self.flushed = self.flushed + sent
        return wrote


def is_counter_name(name: str) -> bool:
    """``<20 digits>-<12 lowercase hex digits>``, as :func:`write` names them."""
    stamp, dash, rand = name.partition("-")
    return (
        bool(dash)
        and len(stamp) == 20
        and stamp.isdigit()
        and len(rand) == 12
        and all(c in "0123456789abcdef" for c in rand)
    )


def write(obs: Any, store: Any, folder: str, counts: CacheStats) -> str:
    """Write ``counts`` as a new object under ``folder``; its path."""
    name = f"{folder}{time.time_ns():020d}-{secrets.token_hex(6)}"
    obs.put(store, name, counts.to_record(), mode="create")
    return name


def read_all(obs: Any, store: Any, folder: str) -> tuple[CacheStats, list[str]]:
    """The sum of every counter object under ``folder`` and their paths (objects
    that vanished meanwhile or do not parse are skipped, and objects not named as
    counters are not read)."""
    total = CacheStats()
    paths: list[str] = []
    for page in obs.list(store, prefix=folder):
        for meta in page:
            if not is_counter_name(meta["path"][len(folder) :]):
                continue
            try:
                record = CacheStats.from_record(bytes(obs.get(store, meta["path"]).bytes()))
            except FileNotFoundError:
                continue
            if record is not None:
                total = total + record
                paths.append(meta["path"])
    return total, paths
