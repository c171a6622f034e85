"""``cuforge cache verify|prune|clear``: keep a cache healthy and small.

- ``verify [--fix]``: check every entry (payload and metadata against their digest;
  header manifests must also parse). Lists the bad ones; ``--fix`` removes them.
  Exit 1 when any bad entry was found (also with ``--fix``, like fsck: the next
  ``verify`` answers 0), 0 on a healthy cache. Without the secret a signed entry's
  signature cannot be checked: the summary says how many went unchecked (never "all
  verify" for them; ``--json``: ``signatures_unchecked``), and that alone is exit 0
  (their integrity is fine; whether they are genuine is for a run with the secret).
- ``prune [--older-than D] [--unused-for D] [--compiler BUILD] [--max-size SIZE]
  [--dry-run] [--json]``: remove entries stored more than D ago, not read for D, or
  made by a compiler that matches BUILD, words of the description ``cache ls`` shows
  (``nvrtc 13.5 feebac3b``): each word a compiler name, a version as a dotted prefix
  (``13`` is 13.x, never 3.x or 12.x) or a build id's first 6+ hex digits
  (``_entries.compiler_matcher``; any other word, or none, is a usage error); then,
  with ``--max-size``, least recently used entries until the rest fits. D and SIZE
  need their unit (``30d``, ``2G``; a plain number is a usage error). Header
  manifests age like entries, and a manifest whose entries are all gone goes with
  them. Exit 1 when an entry could not be removed (a read-only cache): the summary
  counts only what went.
- ``clear [--yes] [--json]``: remove every entry; asks on a terminal, refuses without
  ``--yes`` when there is none to ask (exit 2); says how many entries (and bytes)
  went; exit 1 when entries remain, with a line saying how many stayed and why (a
  read-only file system: the error the removal met, not a traceback or a path inside
  the cache).

On a tier each level is pruned, cleared or fixed as a cache of its own, the writable
ones only: a ``?ro`` level's entries are reported as kept, per level, never as removed
nor as failures (``_maintlevels``); a tier with no writable level is a usage error.

None of these creates a cache: a path that does not exist is a usage error (exit 2),
and so is a directory that is not a cuforge cache (``verify`` without ``--fix`` opens
read-only; the others delete only the cache's own files, see ``storage.ownership``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

from cuforge.cli import _entries, _maintlevels, _select, _term
from cuforge.cli._args import UsageError, duration_arg, size_arg
from cuforge.cli.cache import opened

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge.cli._args import Subparsers
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["register"]


def register(actions: Subparsers) -> None:
    """Add ``verify``, ``prune`` and ``clear`` to the ``cache`` group."""
    p = actions.add_parser("verify", help="check every entry; --fix removes bad ones")
    p.add_argument("--fix", action="store_true", help="remove the bad entries")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_verify)
    _select.add_cache_option(p, can_disable=False)

    p = actions.add_parser("prune", help="remove old, unused or foreign-compiler entries")
    p.add_argument("--older-than", type=duration_arg, metavar="DURATION", help="stored before")
    p.add_argument("--unused-for", type=duration_arg, metavar="DURATION", help="not read for")
    p.add_argument(
        "--compiler", metavar="BUILD", help="made by this compiler: 13.5, nvrtc 13.5, a build id"
    )
    p.add_argument("--max-size", type=size_arg, metavar="SIZE", help="then evict LRU to SIZE")
    p.add_argument("--dry-run", action="store_true", help="only say what would go")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_prune)
    _select.add_cache_option(p, can_disable=False)

    p = actions.add_parser("clear", help="remove every entry")
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_clear)
    _select.add_cache_option(p, can_disable=False)


def _label(row: _entries.Row) -> str:
    name = row.record.get("name") or "-"
    return f"{row.id[: _entries.SHORT]}  {row.kind:<8} {name}"


def _verify(args: argparse.Namespace) -> int:
    bad: list[tuple[_maintlevels.Part, _entries.Row, str, bool]] = []  # ..., removed
    removed = checked = unsigned_check = 0
    foreign: list[tuple[_maintlevels.Part, str, str]] = []
    chosen = opened(args, read_only=not args.fix)
    with chosen as cache:
        # Each level on its own: a bad copy is removed from its level only (on the tier
        # as one cache, a bad copy in a ?ro level had the good copy behind it removed).
        levels = _maintlevels.parts(cache, chosen.choice, "fix", args.fix)
        for part in levels:
            fixes = args.fix and not part.read_only
            for row in _entries.rows(part.cache):
                try:
                    problem = part.cache.check_entry(row.id)
                except KeyError:
                    continue  # removed by someone else meanwhile
                checked += 1
                if row.kind == _entries.SIGNED:  # listed without the secret: integrity only
                    unsigned_check += 1
                if problem is None and row.kind == "manifest":
                    entry = part.cache.read_entry(row.id)
                    if entry is not None and _entries.manifest_entry_ids(entry.data) is None:
                        problem = "header manifest does not parse"
                if problem is not None:
                    went = fixes and part.cache.remove_entry(row.id)
                    removed += went
                    bad.append((part, row, problem, went))
            # Objects that are no entry at all (a FIFO, a directory, a file for a shard)
            # never list as entries; a directory cache names them itself.
            find = getattr(part.cache, "foreign_objects", None)
            found: list[tuple[str, str]] = find() if find is not None else []
            foreign.extend((part, path, what) for path, what in found)
            if fixes and found:
                remove = part.cache.remove_foreign_object  # type: ignore[attr-defined]
                removed += sum(bool(remove(path)) for path, _ in found)
    tier = levels[0].index is not None
    kept = [p for p, _, _, went in bad if args.fix and p.read_only and not went]
    if args.json:
        report = {
            "checked": checked,
            "bad": [
                {"id": r.id, "kind": r.kind, "problem": why,
                 **({"level": p.index, "removed": went} if tier else {})}
                for p, r, why, went in bad
            ],
            "foreign": [
                {"path": f"entries/{path}", "what": what, **({"level": p.index} if tier else {})}
                for p, path, what in foreign
            ],
            "removed": removed,
            "signatures_unchecked": unsigned_check,
        }  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        for part, row, problem, _ in bad:
            note = " (read-only level: kept)" if args.fix and part.read_only else ""
            print(f"{part.prefix()}{_label(row)}: {_term.paint(problem, 'red')}{note}")
        for part, path, what in foreign:
            place = "an entry file" if "/" in path else "a shard directory"
            note = f"{what} where {place} belongs"
            print(f"{part.prefix()}entries/{path}: {_term.paint(note, 'red')}")
        summary = f"checked {_count(checked, 'entry')}: {len(bad)} bad"
        if foreign:
            summary += f", {_count(len(foreign), 'foreign object')}"
        if args.fix:
            summary += f", {removed} removed"
            if kept:
                ro = list({p.index: p for p in kept}.values())
                summary += f", {len(kept)} kept in {_maintlevels.read_only_note(ro)}"
        if not (bad or foreign):
            # "all verify" only when every check was made; else what was: integrity
            summary = f"checked {_count(checked, 'entry')}: all " + (
                "intact" if unsigned_check else "verify"
            )
        if tier:
            summary += f" (over {_count(len(levels), 'level')}: each level's copy counted)"
        if unsigned_check:
            summary += f"; {_unchecked(unsigned_check)}"
        print(summary)
    return 1 if bad or foreign else 0


def _unchecked(n: int) -> str:
    """The words for ``n`` signed entries whose signature this run could not check."""
    whose = "entry's signature was" if n == 1 else "entries' signatures were"
    return f"{n} signed {whose} not checked (no secret set: CUFORGE_CACHE_SECRET or secret_file)"


@dataclass
class _Pruned:
    """What prune did in one level: its entries as listed before (None: a read-only
    level that cannot list), what went (id -> why), what would not go, bytes freed."""

    part: _maintlevels.Part
    listed: list[_entries.Row] | None
    gone: dict[str, str] = field(default_factory=dict)
    stuck: list[_entries.Row] = field(default_factory=list)
    doomed: int = 0
    freed: int = 0

    @property
    def left(self) -> int:
        return len(self.listed or ()) - len(self.gone)

    @property
    def rest(self) -> int:
        return sum(r.info.size for r in self.listed or () if r.id not in self.gone)


def _prune(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size

    # What ls and show print is what --compiler matches (a substring of the raw string
    # matched every entry: "12" is in most build ids, "build-id" in all).
    args.compiler_matches = None
    if args.compiler is not None:
        args.compiler_matches = _entries.compiler_matcher(args.compiler)
    if not any((args.older_than, args.unused_for, args.compiler, args.max_size)):
        raise UsageError("give at least one of --older-than, --unused-for, --compiler, --max-size")
    now = time.time_ns()
    chosen = opened(args)
    with chosen as cache:
        levels = _maintlevels.parts(cache, chosen.choice, "prune")
        done = [_prune_level(part, args, now) for part in levels]
    freed = sum(d.freed for d in done)
    gone = sum(len(d.gone) for d in done)
    stuck = sum(len(d.stuck) for d in done)
    left, rest = sum(d.left for d in done), sum(d.rest for d in done)
    tier = levels[0].index is not None
    if args.json:
        removed = [
            {"id": r.id, "kind": r.kind, "name": r.record.get("name"), "size": r.info.size,
             "reason": d.gone[r.id], **({"level": d.part.index} if tier else {})}
            for d in done for r in d.listed or () if r.id in d.gone
        ]  # fmt: skip
        report: dict[str, object] = {
            "dry_run": bool(args.dry_run), "removed": removed, "removed_bytes": freed,
            "remaining": left, "remaining_bytes": rest, "not_removed": stuck,
        }  # fmt: skip
        if tier:  # what went from each level and what stays there
            report["levels"] = [
                {"cache": d.part.name, "read_only": d.part.read_only, "removed": len(d.gone),
                 "removed_bytes": d.freed,
                 "remaining": None if d.listed is None else d.left,
                 "remaining_bytes": None if d.listed is None else d.rest,
                 "not_removed": len(d.stuck)}
                for d in done
            ]  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        ro = [d for d in done if d.part.read_only]
        for d in done if tier else ():
            remain = "its entries" if d.listed is None else _count(d.left, "entry")
            sized = " (it cannot list them)" if d.listed is None else f" ({format_size(d.rest)})"
            what = f"{verb} {_count(len(d.gone), 'entry')} ({format_size(d.freed)}); "
            if d.part.read_only:
                what = "read-only (?ro), not pruned: "
            print(f"{d.part.label()}: {what}{remain}{sized} remain")
        kept = ""
        if ro:
            held = sum(d.left for d in ro)
            kept = f", {held} of them ({format_size(sum(d.rest for d in ro))}) in "
            kept += _maintlevels.read_only_note([d.part for d in ro])
        print(
            f"{verb} {_count(gone, 'entry')} ({format_size(freed)}); "
            f"{_count(left, 'entry')} ({format_size(rest)}) remain{kept}"
        )
    if stuck:
        where = ", ".join(d.part.name for d in done if d.stuck)
        doomed = sum(d.doomed for d in done)
        print(
            f"cuforge cache prune: could not remove {stuck} of {_count(doomed, 'entry')} "
            f"(is {where} read-only or another user's?)",
            file=sys.stderr,
        )
        return 1
    return 0


def _prune_level(part: _maintlevels.Part, args: argparse.Namespace, now: int) -> _Pruned:
    """Prune one level as a cache of its own (a read-only level: only listed, to say
    what stays there); each entry that went is printed as it goes (not on a terminal)."""
    cache = part.cache
    if part.read_only:
        try:
            return _Pruned(part, _entries.rows(cache))
        except UsageError:  # cannot list: what it keeps is not known, only that it keeps it
            return _Pruned(part, None)
    listed = _entries.rows(cache)
    doomed: dict[str, tuple[_entries.Row, str]] = {}
    for row in listed:
        reason = _rule(row, args, now)
        if reason:
            doomed[row.id] = (row, reason)
    if args.max_size is not None:
        kept = sorted((r for r in listed if r.id not in doomed), key=lambda r: r.info.used_ns)
        total = sum(r.info.size for r in kept)
        for row in kept:
            if total <= args.max_size:
                break
            doomed[row.id] = (row, "least recently used beyond --max-size")
            total -= row.info.size
    # A manifest whose entries are all gone only costs a lookup: it goes too.
    present = {r.id for r in listed if r.id not in doomed and r.kind != "manifest"}
    for row in listed:
        if row.kind != "manifest" or row.id in doomed:
            continue
        entry = cache.read_entry(row.id)
        ids = None if entry is None else _entries.manifest_entry_ids(entry.data)
        if ids is not None and not any(i in present for i in ids):
            doomed[row.id] = (row, "header manifest of removed entries only")
    out = _Pruned(part, listed, doomed=len(doomed))
    for row, reason in doomed.values():
        if args.dry_run or cache.remove_entry(row.id):
            out.freed += row.info.size
            out.gone[row.id] = reason
            if not args.json and (args.dry_run or not _term.is_tty(sys.stdout)):
                print(f"{part.prefix()}{_label(row)}: {reason}")
        elif _still_there(cache, row.id):
            out.stuck.append(row)  # not removed: a read-only cache, no permission
    return out


def _count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 foreign objects``."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def _still_there(cache: ProgramCacheResource, entry_id: str) -> bool:
    """Whether entry ``entry_id`` still exists (a removal that said no may have lost a
    race with another remover: then it is gone all the same)."""
    try:
        cache.check_entry(entry_id)
    except KeyError:
        return False
    except NotImplementedError:
        return True
    return True


def _rule(row: _entries.Row, args: argparse.Namespace, now: int) -> str:
    if args.older_than is not None and row.info.stored_ns < now - args.older_than * 1e9:
        return "stored before --older-than"
    if args.unused_for is not None and row.info.used_ns < now - args.unused_for * 1e9:
        return "not read within --unused-for"
    matches = args.compiler_matches
    if matches is not None and row.kind == "program" and matches(row.compiler):
        return f"made by compiler {_entries.short_compiler(row.compiler)}"
    return ""


@dataclass
class _Cleared:
    """What clear did in one level: its entries before (None: it cannot list), those
    still there after (a writable level's: not removed; a read-only level's: kept)."""

    part: _maintlevels.Part
    before: list[_entries.Row] | None
    stayed: list[_entries.Row] = field(default_factory=list)
    failure: OSError | None = None

    @property
    def went(self) -> list[_entries.Row]:
        kept = {r.id for r in self.stayed}
        return [r for r in self.before or () if r.id not in kept]


def _clear(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size

    chosen = opened(args)
    with chosen as cache:
        where = chosen.choice.shown()
        levels = _maintlevels.parts(cache, chosen.choice, "clear")
        ro = [p for p in levels if p.read_only]
        if not args.yes:
            if not (_term.is_tty(sys.stdin) and _term.is_tty(sys.stderr)):
                raise UsageError(f"refusing to clear {where} without --yes (no terminal to ask)")
            try:
                listed = [r for p in levels if not p.read_only for r in _entries.rows(p.cache)]
                size = format_size(sum(r.info.size for r in listed))
                what = f"all {_count(len(listed), 'entry')} ({size})"
            except UsageError:
                what = "every entry"
            asked = where
            if ro:  # what it will not touch, said before it is asked
                asked += f" (the {_maintlevels.read_only_note(ro)} keep theirs)"
            sys.stderr.write(f"Remove {what} from {asked}? [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print("not cleared", file=sys.stderr)
                if args.json:
                    print(json.dumps({"cache": where, "cleared": False}, indent=2))
                return 1
        done = [_clear_level(part) for part in levels]
    written = [d for d in done if not d.part.read_only]
    stuck = sum(len(d.stayed) for d in written)
    counted = all(d.before is not None for d in written)
    went = [r for d in written for r in d.went]
    freed = sum(r.info.size for r in went)
    kept = [d for d in done if d.part.read_only]
    tier = levels[0].index is not None
    if args.json:
        report: dict[str, object] = {
            "cache": where, "cleared": not stuck,
            "removed": len(went) if counted else None,
            "removed_bytes": freed if counted else None,
            "not_removed": stuck,
        }  # fmt: skip
        if tier:  # what went from each level and what stays there
            report["levels"] = [
                {"cache": d.part.name, "read_only": d.part.read_only,
                 "removed": None if d.before is None else len(d.went),
                 "removed_bytes": None if d.before is None else sum(r.info.size for r in d.went),
                 "remaining": None if d.before is None else len(d.stayed),
                 "not_removed": 0 if d.part.read_only else len(d.stayed)}
                for d in done
            ]  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        for d in done if tier else ():
            print(f"{d.part.label()}: {_level_words(d, format_size)}")
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
    if stuck:
        failure = next((d.failure for d in written if d.failure is not None), None)
        why = "read-only, or another user's?"
        if failure is not None:  # what the removal met, without a path inside the cache
            why = failure.strerror or type(failure).__name__
        where = ", ".join(d.part.name for d in written if d.stayed)
        of = sum(len(d.before or ()) for d in written)
        print(
            f"cuforge cache clear: could not remove {stuck} of {_count(of, 'entry')} of "
            f"{where} ({why})",
            file=sys.stderr,
        )
        return 1
    return 0


def _size(rows: list[_entries.Row]) -> int:
    return sum(r.info.size for r in rows)


def _level_words(d: _Cleared, format_size: Callable[[int], str]) -> str:
    """What clear did in one of a tier's levels, in words."""
    if d.before is None:
        if d.part.read_only:
            return "read-only (?ro), not cleared: it keeps its entries (it cannot list them)"
        return "cleared (it cannot list its entries, so none were counted)"
    if d.part.read_only:
        return (
            f"read-only (?ro), not cleared: {_count(len(d.stayed), 'entry')} "
            f"({format_size(_size(d.stayed))}) kept"
        )
    words = f"removed {_count(len(d.went), 'entry')} ({format_size(_size(d.went))})"
    if d.stayed:
        words += f"; could not remove {_count(len(d.stayed), 'entry')}"
    return words


def _clear_level(part: _maintlevels.Part) -> _Cleared:
    """Clear one level (a read-only one: only listed, to say what it keeps)."""
    try:
        before: list[_entries.Row] | None = _entries.rows(part.cache)
    except UsageError:  # a backend that cannot list: its clear() is taken at its word
        before = None
    if part.read_only:
        return _Cleared(part, before, list(before or ()))
    out = _Cleared(part, before)
    try:
        part.cache.clear()
    except OSError as exc:  # a read-only mount, another user's files: counted below
        if before is None:
            raise
        out.failure = exc
    out.stayed = [r for r in before or () if _still_there(part.cache, r.id)]
    return out
