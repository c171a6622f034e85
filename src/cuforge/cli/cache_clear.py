"""``cuforge cache clear``: remove every entry of a cache, level by level on a tier.

Asks on a terminal, refuses without ``--yes`` when there is none to ask (exit 2);
says how many entries (and bytes) went; exit 1 when entries remain, with a line saying
how many stayed and why (a read-only file system: the error the removal met, not a
traceback or a path inside the cache). On a tier each writable level is cleared as a
cache of its own and a ``?ro`` level's entries are reported as kept
(``_maintlevels``). Every level is listed before any is cleared: a writable level
that cannot be listed (a server that cannot be reached) is reported on its own line
and nothing is removed from any level (exit 1); a level that fails while cleared is
reported on its line, the others' work as usual (exit 1). Removes only through the
backends' own ``clear()``, which deletes only the cache's own files
(``storage.ownership``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import partial

from cuforge.cli import _entries, _maintlevels, _term
from cuforge.cli._args import UsageError
from cuforge.cli.cache import opened

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

_count = _maintlevels.count  # "1 entry", "2 entries"

__all__ = ["clear"]


@dataclass
class _Cleared:
    """What clear did in one level: its entries before (None: it cannot list), those
    still there after (a writable level's: not removed; a read-only level's: kept).
    ``error``: the level failed (its words; ``before`` None: it could not be listed, so
    nothing was removed there; else what went is not known); ``held``: not cleared
    because another level could not be listed."""

    part: _maintlevels.Part
    before: list[_entries.Row] | None
    stayed: list[_entries.Row] = field(default_factory=list)
    failure: OSError | None = None
    error: str | None = None
    held: bool = False

    @property
    def went(self) -> list[_entries.Row]:
        kept = {r.id for r in self.stayed}
        return [r for r in self.before or () if r.id not in kept]

    @property
    def known(self) -> bool:
        """Whether what went from this level is known (listed, and no failure after)."""
        return self.before is not None and self.error is None


def clear(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size

    chosen = opened(args)
    with chosen as cache:
        where = chosen.choice.shown()
        levels = _maintlevels.parts(cache, chosen.choice, "clear")
        ro = [p for p in levels if p.read_only]
        # Every level is listed before any is cleared (a tier's level that fails is
        # that level's failure; a writable one that cannot be listed stops every removal).
        lists = [_maintlevels.attempt(p, partial(_listing, p)) for p in levels]
        stop = _maintlevels.stopper(levels, [e for _, e in lists])
        if not args.yes:
            if not (_term.is_tty(sys.stdin) and _term.is_tty(sys.stderr)):
                raise UsageError(f"refusing to clear {where} without --yes (no terminal to ask)")
            listed = [
                r
                for p, (rows, _) in zip(levels, lists, strict=True)
                if not p.read_only
                for r in rows or ()
            ]
            what = f"all {_count(len(listed), 'entry')} ({format_size(_size(listed))})"
            if any(
                rows is None for p, (rows, _) in zip(levels, lists, strict=True) if not p.read_only
            ):
                what = "every entry"
            asked = where
            if ro:  # what it will not touch, said before it is asked
                asked += f" (the {_maintlevels.read_only_note(ro)} keep theirs)"
            if stop is None:
                sys.stderr.write(f"Remove {what} from {asked}? [y/N] ")
                sys.stderr.flush()
                if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                    print("not cleared", file=sys.stderr)
                    if args.json:
                        print(json.dumps({"cache": where, "cleared": False}, indent=2))
                    return 1
        done = [
            _clear_level(part, rows, exc, held=stop is not None)
            for part, (rows, exc) in zip(levels, lists, strict=True)
        ]
    written = [d for d in done if not d.part.read_only]
    stuck = sum(len(d.stayed) for d in written if d.error is None and not d.held)
    counted = all(d.before is not None for d in written if d.error is None)
    went = [r for d in written if d.known for r in d.went]
    freed = sum(r.info.size for r in went)
    kept = [d for d in done if d.part.read_only]
    failed = [d for d in done if d.error is not None]
    tier = levels[0].index is not None
    if args.json:
        report: dict[str, object] = {
            "cache": where, "cleared": not (stuck or failed or stop),
            "removed": len(went) if counted else None,
            "removed_bytes": freed if counted else None,
            "not_removed": stuck,
        }  # fmt: skip
        if tier:  # what went from each level and what stays there
            report["levels"] = [_level_json(d) for d in done]
            report["stopped_by"] = None if stop is None else stop.index
        print(json.dumps(report, indent=2))
    else:
        for d in done if tier else ():
            print(f"{d.part.label()}: {_level_words(d, format_size, stop)}")
        if not counted and not tier:
            print(f"cleared {where} (it cannot list its entries, so none were counted)")
        else:
            line = f"removed {_count(len(went), 'entry')} ({format_size(freed)}) from {where}"
            if not counted:
                line += " (and what the levels that cannot list held)"
            if kept:
                held = [r for d in kept for r in d.before or ()]
                line += f"; {_count(len(held), 'entry')} ({format_size(_size(held))}) kept"
                line += f" in {_maintlevels.read_only_note([d.part for d in kept])}"
            print(line)
    code = _maintlevels.level_failures(
        "clear", stop, [d.part for d in failed], " (the entries it serves would have stayed)"
    )
    if stuck:
        failure = next((d.failure for d in written if d.failure is not None), None)
        why = "read-only, or another user's?"
        if failure is not None:  # what the removal met, without a path inside the cache
            # a server's answer is in the message (a refused command is no ConnectionError)
            why = _maintlevels.why_words(failure)
        where = ", ".join(d.part.name for d in written if d.stayed and d.error is None)
        of = sum(len(d.before or ()) for d in written if d.error is None)
        print(
            f"cuforge cache clear: could not remove {stuck} of {_count(of, 'entry')} of "
            f"{where} ({why})",
            file=sys.stderr,
        )
        code = 1
    return code


def _listing(part: _maintlevels.Part) -> list[_entries.Row] | None:
    """``part``'s entries; None for a backend that cannot list (its clear() is taken at
    its word). A failure to reach it raises (``_maintlevels.attempt``)."""
    try:
        return _entries.rows(part.cache)
    except UsageError:
        return None


def _size(rows: list[_entries.Row]) -> int:
    return sum(r.info.size for r in rows)


def _level_json(d: _Cleared) -> dict[str, object]:
    """One level of ``clear --json``'s ``levels``: counts where known, else null."""
    known = d.known
    out: dict[str, object] = {
        "cache": d.part.name, "read_only": d.part.read_only,
        "removed": len(d.went) if known else None,
        "removed_bytes": _size(d.went) if known else None,
        "remaining": len(d.stayed) if known else None,
        "not_removed": 0 if d.part.read_only or d.held or not known else len(d.stayed),
    }  # fmt: skip
    if d.error is not None:
        out["error"] = d.error
    return out


def _level_words(
    d: _Cleared, format_size: Callable[[int], str], stop: _maintlevels.Part | None
) -> str:
    """What clear did in one of a tier's levels, in words."""
    if d.error is not None:
        if d.before is None:
            there = "read-only (?ro), not cleared" if d.part.read_only else "nothing removed there"
            return f"{d.error}: {there}"
        return f"{d.error}: what went of its {_count(len(d.before), 'entry')} is not known"
    if d.before is None:
        if d.part.read_only:
            return "read-only (?ro), not cleared: it keeps its entries (it cannot list them)"
        if d.held and stop is not None:
            return f"not cleared, as level {stop.index} could not be listed: it keeps its entries"
        return "cleared (it cannot list its entries, so none were counted)"
    kept = f"{_count(len(d.stayed), 'entry')} ({format_size(_size(d.stayed))}) kept"
    if d.part.read_only:
        return f"read-only (?ro), not cleared: {kept}"
    if d.held and stop is not None:
        return f"not cleared, as level {stop.index} could not be listed: {kept}"
    words = f"removed {_count(len(d.went), 'entry')} ({format_size(_size(d.went))})"
    if d.stayed:
        words += f"; could not remove {_count(len(d.stayed), 'entry')}"
    return words


def _clear_level(
    part: _maintlevels.Part,
    before: list[_entries.Row] | None,
    failed: OSError | None,
    held: bool,
) -> _Cleared:
    """Clear one level listed as ``before`` (a read-only one, or every one while
    ``held``: only reported, with what it keeps). ``failed``: its listing's error (it is
    not cleared). A tier's level that fails while cleared is reported, not raised."""
    if failed is not None:
        return _Cleared(part, None, error=_maintlevels.failure_words(failed, "list entries"))
    if part.read_only or held:
        return _Cleared(part, before, list(before or ()), held=held and not part.read_only)
    out = _Cleared(part, before)
    try:
        part.cache.clear()
    except OSError as exc:  # a read-only mount, another user's files: counted below
        if before is None:
            if part.index is None:
                raise
            out.error = _maintlevels.failure_words(exc, "clear")
            return out
        out.failure = exc
    stayed, lost = _maintlevels.attempt(
        part, lambda: [r for r in before or () if _maintlevels.still_there(part.cache, r.id)]
    )
    if lost is not None:  # the server went away meanwhile: what stays is not known
        out.error = _maintlevels.failure_words(lost, "clear")
    out.stayed = stayed or []
    return out
