"""Fleet counters on an object store: each flush is a small object of its own, and the
fleet's total is their sum.

Object stores have no atomic increment, and a shared counter object rewritten by
every process would lose counts to racing writers. So a handle writes what it
counted since its last flush (a :class:`CacheStats` record) to a new object
``<prefix>stats/<time_ns>-<random>`` -- never rewriting anyone's -- on the core's
schedule, at close and at exit. ``total_stats()`` lists ``stats/`` and sums: a read,
which creates nothing. Writers fold: a handle that has just written its counters at
close or exit lists them, one time in :data:`FOLD_ONE_IN`, and when there are more
than :data:`FOLD_OVER` it takes the stats lease, reads them again under it, writes
their sum as one object and deletes the ones it summed (written first, then deleted:
a crash in between can count a fold twice, never lose one; read under the lease, so
two folders never both fold the same objects).

Only counter objects are ever read or deleted here: names ``<20 digits>-<12 hex>``
under ``<prefix>stats/`` (:func:`owns`); anything else in that folder is someone
else's.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..stats import CacheStats

__all__ = ["FOLD_ONE_IN", "FOLD_OVER", "is_counter_name", "read_all", "write"]

#: A handle folds after one in this many of its close/exit flushes (at random).
FOLD_ONE_IN = 16
#: ... when more counter objects than this lie in the folder.
FOLD_OVER = 64


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


def owns(folder: str, path: str) -> bool:
    """Whether ``path`` is a counter object under ``folder`` (the ownership proof)."""
    return path.startswith(folder) and is_counter_name(path[len(folder) :])


def fold_due() -> bool:
    """Whether a close or exit flush that wrote should fold (one time in FOLD_ONE_IN)."""
    import secrets  # here: a process that never flushes never imports it (~1-4 ms)

    return secrets.randbelow(FOLD_ONE_IN) == 0


def write(obs: Any, store: Any, folder: str, counts: CacheStats) -> bool:
    """Write ``counts`` (negatives as zero) as a new object under ``folder``; whether
    there was anything to write."""
    sent = CacheStats(**{n: max(0, v) for n, v in counts.as_dict().items()})
    if not any(sent.as_dict().values()):
        return False
    name = f"{folder}{time.time_ns():020d}-{os.urandom(6).hex()}"  # secrets.token_hex(6)
    obs.put(store, name, sent.to_record(), mode="create")
    return True


def read_all(obs: Any, store: Any, folder: str) -> tuple[CacheStats, list[str]]:
    """The sum of every counter object under ``folder`` and their paths (objects that
    vanished meanwhile or do not parse are skipped; others are not read)."""
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
