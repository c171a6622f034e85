"""What one request's lookups counted at each level of a tier, for a request that counts
its answer itself.

A header-tracked program is found in several lookups made without counting
(``get_entry(count=False)``: its manifest, then a variant's entry) and counted once its
answer is known (``tally_answer``). Each level of a tier counts every request that
reached it once -- a hit where the answer was found, a miss at each level asked in
front of it, a miss at every level reached when there is no answer -- as a tier
counts an untracked lookup. Some of a request's lookups count at a level by
themselves (a manifest's miss, an entry a claim handed over, the miss of a level
the claim found empty): those levels are not counted again -- though a level that
then served the answer's entry counts its bytes read.

The ledger is per thread and per tier: a request that counts its answer itself opens
it first (``failopen.begin``: the tracked compile steps, the command line's direct
path), which forgets whatever came before -- a request that raised before its answer
was counted leaves nothing a later one reads. Only an open ledger records lookups;
``tally_answer`` closes it, keeping where the other keys of an uncounted batch were
found (the direct path looks up every output, then counts each).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..base import ProgramCacheResource
from ..entry import CacheEntry
from ._claims import handle_of
from ._lazylevel import opened


class Ledger(threading.local):
    """One thread's record of the request in progress at one tier."""

    def __init__(self) -> None:
        self.counted: dict[int, bool] = {}  # level -> counted a hit (True) or a miss
        self.served: dict[bytes, int] = {}  # key -> level an uncounted lookup found it at
        self.reached = 0  # how many levels (front first) the uncounted lookups asked
        self.open = False  # a request that counts its answer itself is in progress

    def start(self) -> None:
        """A request that counts its answer itself begins: forget the one before."""
        self.counted.clear()
        self.served.clear()
        self.reached = 0
        self.open = True

    def asked(self, i: int, key: bytes, found: bool, hit_counted: bool, miss_counted: bool) -> None:
        """Level ``i`` was asked for ``key``: what it found and what it counted."""
        self.reached = max(self.reached, i + 1)
        if found:
            if hit_counted:
                self.counted[i] = True
            else:
                self.served[key] = i
        elif miss_counted:
            self.counted.setdefault(i, False)


def count_at(level: ProgramCacheResource, entry: CacheEntry | None, hit: bool = True) -> None:
    """One hit of ``entry`` (None: one miss) in ``level``'s own counters (a signed
    level's: the handle it signs); ``hit=False``: only the entry's bytes read."""
    handle = handle_of(opened(level))
    if handle is None:
        return
    if hit or entry is None:
        handle._tally(entry)
    else:
        handle._stats.bytes_read += len(entry.data)


def tally_answer(
    ledger: Ledger, levels: Sequence[ProgramCacheResource], key: bytes, entry: CacheEntry | None
) -> None:
    """Count the request's answer -- ``entry`` found under ``key``, or none -- at each
    level it reached and that has not counted it yet (module docstring)."""
    counted = ledger.counted
    if entry is not None:
        at = ledger.served.get(key)
        if at is not None and True in counted.values():
            # The hit is counted (a claim handed the manifest over): the answer's bytes
            # are still read from the level that had them.
            count_at(levels[at], entry, hit=False)
        elif at is not None:
            for j in range(at):
                if j not in counted:
                    count_at(levels[j], None)
            count_at(levels[at], entry)
    else:
        for j in range(min(ledger.reached, len(levels))):
            if j not in counted:
                count_at(levels[j], None)
    # Closed; the other keys an uncounted batch found stay for their own answers.
    ledger.served.pop(key, None)
    counted.clear()
    ledger.reached = 0
    ledger.open = bool(ledger.served)
