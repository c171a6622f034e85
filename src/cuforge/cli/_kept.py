"""Whether what a command reported stored is still in the cache when it ends.

A store can be undone before the command that made it ends: the size cap of a
directory or SQLite level evicts least-recently-used entries, and a later store of
the same command (another output, another worker process) or the close of its
handle may evict an entry this command stored a moment before. "Stored in LEVEL"
would then be false, and the next run a miss. So at the end of the command,
:func:`recheck` looks each such entry up again through a read-only handle (which
writes nothing: no use, no counter) and reports one that is gone as not stored in
that level, why ``evicted`` (``storage.events.EVICTED``).

It looks only where an eviction may have happened -- a level this process's handle
counted evictions in, or, when worker processes compiled (their counts stay
theirs), every directory and SQLite level (a cache of one level only when it has a
cap) -- so a command whose handle evicted nothing pays nothing. ``compile`` looks
once its handle is closed; ``warm`` with its handle still open, which evicts nothing
more at close (a SQLite handle evicts at close only past the database's share,
where its own stores never leave it; a directory never at close). Redis and S3
levels are never looked at: cuforge evicts nothing there (the server's
``maxmemory``, the bucket's lifecycle rules do). A lookup that fails (a read error,
a damaged entry) changes nothing in the report.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._select import Choice

__all__ = ["recheck"]

_LOCAL = ("file", "sqlite")  # the schemes whose handles evict for a cap
_DETAIL = "stored, then evicted before the command ended (the level's size cap)"


def recheck(
    stored: list[tuple[dict[str, Any], list[str]]], choice: Choice, cache: Any, workers: bool
) -> None:
    """Mark, in each report of ``stored`` (``_report.store_fields`` dicts, each with
    the keys, hex, it was stored under), each level that no longer holds what it
    reported stored -- ``cache`` is this process's (closed) handle, ``workers``
    whether worker processes compiled. See the module docstring."""
    from cuforge.storage.urls import parse_cache_url

    from . import _select
    from ._args import UsageError

    schemes = [spec.scheme for spec in parse_cache_url(choice.url or "")]
    counted = _evictions(cache, len(schemes))
    # Worker processes' handles counted their own evictions: look wherever one may
    # have evicted (a level of one's own kind and, for a cache of one level, a cap).
    capped = len(schemes) > 1 or getattr(cache, "max_size_bytes", None) is not None
    suspect = {
        i
        for i, scheme in enumerate(schemes)
        if scheme in _LOCAL and ((workers and capped) or counted[i])
    }
    todo = [
        (r, keys, i)
        for r, keys in stored
        if keys
        for i, lv in enumerate(r.get("levels") or ())
        if i in suspect and lv["stored"]
    ]
    if not todo:
        return
    try:
        looking = _select.open_choice(choice, read_only=True)
    except (UsageError, OSError, ValueError):
        return  # it opened a moment ago: leave the report as the stores said it
    with looking:
        levels = list(getattr(looking, "levels", ())) if len(schemes) > 1 else [looking]
        for r, keys, i in todo:
            level = levels[i]
            before = _faults(level)
            gone = any(level.get_entry(bytes.fromhex(k)) is None for k in keys)
            if gone and _faults(level) == before:
                _mark_evicted(r, i)


def _evictions(cache: Any, n: int) -> list[int]:
    """Evictions this process's handle counted, per level (a tier's own per level)."""
    per_level = getattr(cache, "level_stats", None)
    if per_level is not None:
        return [s.evictions for s in per_level()]
    return [cache.stats().evictions] * n


def _faults(level: Any) -> tuple[int, int]:
    stats = level.stats()
    return stats.read_failures, stats.integrity_failures


def _mark_evicted(r: dict[str, Any], i: int) -> None:
    """Level ``i`` of result ``r`` no longer holds it: the report's store fields again."""
    from cuforge.storage.events import EVICTED

    levels = r["levels"]
    levels[i].update(stored=False, reason=EVICTED, detail=_DETAIL)
    r["stored_in"] = [lv["level"] for lv in levels if lv["stored"]]
    r["outlives_process"] = any(lv["stored"] and lv["outlives_process"] for lv in levels)
    if not r["stored_in"]:
        r["stored"] = False
        r["not_stored"] = EVICTED
