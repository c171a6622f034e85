"""The figures ``cuforge cache stats`` shows beyond the counters: each level of a
tier (its entries, bytes and cap, its own hit rate, and whose counters are shown), a SQLite cache's
bytes on disk, and the words for a cache used without a cap -- what bounds it where
the backend takes none. Reads only; a level that cannot list reads ``-``.
"""

from __future__ import annotations

from cuforge.cli import _select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.storage.base import ProgramCacheResource

__all__ = ["counters_from", "disk_bytes", "level_line", "no_cap", "tier_levels"]


def tier_levels(
    cache: ProgramCacheResource, choice: _select.Choice
) -> tuple[list[dict[str, Any]], int | None] | None:
    """For a tier (signed or not): each level's own figures -- ``cache`` (its URL as
    reports name it), ``backend``, ``read_only``, ``entries`` and ``size_bytes`` (None
    where it cannot list), ``max_size_bytes``; ``read_only`` as the URL says (``?ro``:
    this command opens every level read-only) -- and the index of the level whose
    counters ``stats`` shows (``total_stats``: the widest that keeps shared totals;
    None: this command's own). ``hits`` and ``lookups`` are the level's shared
    counters; ``recorded`` False for a level the URL opens ``?ro``: a read-only handle
    counts nothing, so those counters hold none of the lookups through this tier (only
    what writable handles of that cache counted). None for a cache of one level."""
    from cuforge.storage.signing import SignedProgramCache
    from cuforge.storage.tiered import TieredProgramCache, opened

    inner = cache.inner if isinstance(cache, SignedProgramCache) else cache
    if not isinstance(inner, TieredProgramCache):
        return None
    from cuforge.storage.urls import parse_cache_url

    names = [name for name, _ in _select.level_names(choice)]
    # ?ro as the URL says it: this command opens every level read-only to look
    given_ro = [spec.read_only for spec in parse_cache_url(choice.url or "")]
    levels = []
    for i, level in enumerate(inner.levels):
        try:
            infos = list(level.iter_entries())
        except NotImplementedError:
            infos = None
        shown = opened(level) or level
        lookups = _shared_lookups(level)
        ro = given_ro[i] if i < len(given_ro) else i in inner.read_only
        levels.append({
            "cache": names[i] if i < len(names) else repr(shown),
            "backend": type(shown).__name__,
            "read_only": ro,
            "entries": None if infos is None else len(infos),
            "size_bytes": None if infos is None else sum(info.size for info in infos),
            "max_size_bytes": getattr(shown, "max_size_bytes", None),
            "hits": None if lookups is None else lookups[0],
            "lookups": None if lookups is None else lookups[1],
            "recorded": not ro,
        })  # fmt: skip
    return levels, inner.totals_level()


def _shared_lookups(level: Any) -> tuple[int, int] | None:
    """``(hits, lookups)`` a level's shared counters hold (summed over every process
    that used it), or None for a level that keeps none (``memory://``) or cannot be
    read. A tier asks a level only when the levels in front of it missed, so each
    level's figures count the lookups that reached it."""
    totals = getattr(level, "total_stats", None)
    if totals is None:
        return None
    try:
        stats = totals()
    except Exception:  # a level that cannot be read: its line says so by omission
        return None
    return stats.hits, stats.hits + stats.misses


def counters_from(levels: list[dict[str, Any]], i: int | None) -> str:
    """Whose counters a tier's ``stats`` shows, in words."""
    if i is None:
        return "this command's own (no level keeps shared totals)"
    if not levels[i].get("recorded", True):  # ?ro: the lookups through it count nowhere
        return (
            f"level {i}'s ({levels[i]['cache']}, read-only), summed over every process "
            "that used it writable: opened read-only, lookups through it are not counted"
        )
    ro = ", read-only" if levels[i]["read_only"] else ""
    return (
        f"level {i}'s ({levels[i]['cache']}{ro}), summed over every process that used it: "
        "the lookups that reached it (the levels in front answer the others: each level's "
        "hit rate is on its line below)"
    )


def no_cap(scheme: str) -> str:
    """The size line's end for a cache used without a cap: what bounds it where the
    backend takes none (a Redis server's ``maxmemory``; an S3 bucket's lifecycle rule
    or ``cache prune``: docs/cache.md), else that none is set."""
    if scheme.startswith("redis"):
        return " (no cap: only the server's maxmemory, if it sets one, bounds it)"
    if scheme == "s3":
        return " (no cap: only a lifecycle rule or cuforge cache prune bounds it)"
    return " (no cap set)"


def level_line(level: dict[str, Any], scheme: str) -> str:
    """``file:///c (FileStreamProgramCache): 1 entry, 4.1 KiB of 10.0 MiB cap``."""
    from cuforge.storage.units import format_size

    ro = ", read-only" if level["read_only"] else ""
    n, size, cap = level["entries"], level["size_bytes"], level["max_size_bytes"]
    held = "entries -" if n is None else f"{n} entry" if n == 1 else f"{n} entries"
    held += "" if size is None else f", {format_size(size)}"
    held += f" of {format_size(cap)} cap" if cap else no_cap(scheme)
    hits, lookups = level.get("hits"), level.get("lookups")
    if hits is not None and lookups is not None:
        counted = (f"{hits} hit{'' if hits == 1 else 's'} / {lookups} "
                   f"lookup{'' if lookups == 1 else 's'}")  # fmt: skip
        if level.get("recorded", True):
            rate = f"{100 * hits / lookups:.1f} %" if lookups else "-"
            held += f"; hit rate {rate} ({counted} that reached it)"
        else:  # a read-only handle counts nothing: what it served is in no counter
            held += (
                "; hit rate not recorded: opened read-only, lookups through it are not "
                f"counted (its stored counters, from writable use: {counted})"
            )
    return f"{level['cache']} ({level['backend']}{ro}): {held}"


def disk_bytes(cache: ProgramCacheResource) -> int | None:
    """Bytes on disk where the cap bounds them rather than the entries' bytes: a SQLite
    cache's database, WAL and WAL index (``SQLiteProgramCache.size_bytes``, the files'
    sizes; signed or not), which the entries' sum leaves out (pages, indexes, free
    space). None elsewhere. Read once ``cache`` is closed, so a WAL index that only
    this look opened is not counted."""
    from cuforge.storage.signing import SignedProgramCache

    inner = cache.inner if isinstance(cache, SignedProgramCache) else cache
    if type(inner).__name__ != "SQLiteProgramCache":
        return None
    size: int = inner.size_bytes  # type: ignore[attr-defined]
    return size
