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
- ``clear [--yes] [--json]``: remove every entry (``cache_clear``).

On a tier each level is pruned, cleared or fixed as a cache of its own, the writable
ones only: a ``?ro`` level's entries are reported as kept, per level, never as removed
nor as failures (``_maintlevels``); a tier with no writable level is a usage error.
Every level is listed before anything is removed: a level that fails is reported on
its own line (``--json``: its ``error``), the summary still printed, exit 1; while a
writable level cannot be listed nothing is removed from any level.

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
from functools import partial

from cuforge.cli import _entries, _maintlevels, _select, _term
from cuforge.cli._args import UsageError, duration_arg, size_arg
from cuforge.cli.cache import opened
from cuforge.cli.cache_clear import clear

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuforge.cli._args import Subparsers

_count = _maintlevels.count  # "1 entry", "2 entries"

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
    p.set_defaults(handler=clear)
    _select.add_cache_option(p, can_disable=False)


def _label(row: _entries.Row) -> str:
    name = row.record.get("name") or "-"
    return f"{row.id[: _entries.SHORT]}  {row.kind:<8} {name}"


def _verify(args: argparse.Namespace) -> int:
    bad: list[tuple[_maintlevels.Part, _entries.Row, str, bool]] = []  # ..., removed
    removed = checked = unsigned_check = 0
    refused: list[str] = []  # why a cache of one level refused a removal, as it said
    foreign: list[tuple[_maintlevels.Part, str, str]] = []
    chosen = opened(args, read_only=not args.fix)
    errors: dict[int, str] = {}  # a tier's level that failed: its words
    counts: dict[int, int] = {}  # entries checked per level
    stop: _maintlevels.Part | None = None
    with chosen as cache:
        # Each level on its own: a bad copy is removed from its level only (on the tier
        # as one cache, a bad copy in a ?ro level had the good copy behind it removed).
        # Every level is listed first: with --fix, a writable one that cannot be listed
        # stops every removal, and a level that fails is reported as that level's.
        levels = _maintlevels.parts(cache, chosen.choice, "fix", args.fix)
        lists = [_maintlevels.attempt(p, partial(_entries.rows, p.cache)) for p in levels]
        if args.fix:
            stop = _maintlevels.stopper(levels, [e for _, e in lists])
        for n, (part, (listed, failed)) in enumerate(zip(levels, lists, strict=True)):
            if failed is not None:
                errors[n] = _maintlevels.failure_words(failed, "list entries")
                continue
            fixes = args.fix and not part.read_only and stop is None
            before = checked

            def check(
                part: _maintlevels.Part = part,
                listed: list[_entries.Row] = listed or [],
                fixes: bool = fixes,
            ) -> None:
                nonlocal checked, unsigned_check, removed
                for row in listed:
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
                        try:
                            went = fixes and part.cache.remove_entry(row.id)
                        except OSError as exc:  # a tier's level: its failure (attempt)
                            if part.index is not None:
                                raise
                            went = False  # one cache: the summary says why, as prune's
                            refused.append(_maintlevels.why_words(exc))
                        removed += went
                        bad.append((part, row, problem, went))
                # Objects that are no entry at all (a FIFO, a directory, a file for a
                # shard) never list as entries; a directory cache names them itself.
                find = getattr(part.cache, "foreign_objects", None)
                found: list[tuple[str, str]] = find() if find is not None else []
                foreign.extend((part, path, what) for path, what in found)
                if fixes and found:
                    remove = part.cache.remove_foreign_object  # type: ignore[attr-defined]
                    removed += sum(bool(remove(path)) for path, _ in found)

            _, lost = _maintlevels.attempt(part, check)
            if lost is not None:
                errors[n] = _maintlevels.failure_words(lost, "check entries")
            counts[n] = checked - before
    tier = levels[0].index is not None
    kept = [p for p, _, _, went in bad if args.fix and p.read_only and not went]
    if args.json:
        report: dict[str, object] = {
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
        if tier:  # what each level checked, and a level that failed with its error
            report["levels"] = [
                {"cache": p.name, "read_only": p.read_only, "checked": counts.get(n),
                 **({"error": errors[n]} if n in errors else {})}
                for n, p in enumerate(levels)
            ]  # fmt: skip
            report["stopped_by"] = None if stop is None else stop.index
        print(json.dumps(report, indent=2))
    else:
        for n, part in enumerate(levels):
            if n in errors:
                there = "nothing removed there" if args.fix else "not checked"
                if n in counts:  # failed part way: what it checked is listed below
                    there = f"{_count(counts[n], 'entry')} checked before that"
                print(f"{part.label()}: {errors[n]}: {there}")
        for part, row, problem, _ in bad:
            note = " (read-only level: kept)" if args.fix and part.read_only else ""
            if args.fix and stop is not None and not part.read_only:
                note = f" (not removed: level {stop.index} could not be listed)"
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
        if errors:
            ids = ", ".join(str(n) for n in errors)
            summary += f"; level{'s' if len(errors) > 1 else ''} {ids} failed (see above)"
        print(summary)
    if stop is not None:
        print(
            f"cuforge cache verify: {stop.label()} could not be listed, so nothing was "
            "removed from any level",
            file=sys.stderr,
        )
    elif errors:
        names = ", ".join(levels[n].label() for n in errors)
        print(f"cuforge cache verify: {names} failed (see its line)", file=sys.stderr)
    stayed = [(p, row) for p, row, _, went in bad if args.fix and not p.read_only and not went]
    if stayed and stop is None:  # asked to fix, and a writable level kept them
        where = ", ".join(dict.fromkeys(p.name for p, _ in stayed))
        why = f"({refused[0]})" if refused else _MAYBE
        print(
            f"cuforge cache verify: could not remove {len(stayed)} of the "
            f"{_count(len(bad), 'bad entry')} of {where} {why}",
            file=sys.stderr,
        )
    return 1 if bad or foreign or errors else 0


#: Why a removal a cache refused may have failed, where the cache does not say.
_MAYBE = "(a read-only file system, an immutable directory, or another user's files?)"


def _unchecked(n: int) -> str:
    """The words for ``n`` signed entries whose signature this run could not check."""
    whose = "entry's signature was" if n == 1 else "entries' signatures were"
    return f"{n} signed {whose} not checked (no secret set: CUFORGE_CACHE_SECRET or secret_file)"


@dataclass
class _Pruned:
    """What prune did in one level: its entries as listed before (None: a read-only
    level that cannot list, or one that failed), what went (id -> why), what would not
    go, bytes freed. ``error``: the level failed (its words); ``held``: not pruned
    because another level could not be listed."""

    part: _maintlevels.Part
    listed: list[_entries.Row] | None
    gone: dict[str, str] = field(default_factory=dict)
    stuck: list[_entries.Row] = field(default_factory=list)
    doomed: int = 0
    freed: int = 0
    error: str | None = None
    held: bool = False
    refused: str | None = None  # why a cache of one level refused its removals

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
        # Every level is listed before any is pruned; a writable one that cannot be
        # listed stops every removal (a dry run removes nothing anyway).
        lists = [_maintlevels.attempt(p, partial(_prune_listing, p)) for p in levels]
        stop = _maintlevels.stopper(levels, [e for _, e in lists])
        held = stop is not None and not args.dry_run
        done = [
            _prune_level(part, rows, exc, args, now, held)
            for part, (rows, exc) in zip(levels, lists, strict=True)
        ]
    freed = sum(d.freed for d in done)
    gone = sum(len(d.gone) for d in done)
    stuck = sum(len(d.stuck) for d in done)
    left, rest = sum(d.left for d in done), sum(d.rest for d in done)
    failed = [d for d in done if d.error is not None]
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
                 "not_removed": len(d.stuck),
                 **({"error": d.error} if d.error is not None else {})}
                for d in done
            ]  # fmt: skip
            report["stopped_by"] = stop.index if held and stop is not None else None
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
            elif d.held and stop is not None:
                what = f"not pruned, as level {stop.index} could not be listed: "
            if d.error is not None and d.listed is None:
                there = (
                    "read-only (?ro), not pruned" if d.part.read_only else "nothing removed there"
                )
                print(f"{d.part.label()}: {d.error}: {there}")
                continue
            if d.error is not None:  # failed part way: what went is counted, the rest stays
                what = f"{what[:-2]}, then {d.error}; "
            agree = "remain" if d.listed is None or d.left != 1 else "remains"
            print(f"{d.part.label()}: {what}{remain}{sized} {agree}")
        kept = ""
        if ro:
            held_ro = sum(d.left for d in ro)
            kept = f", {held_ro} of them ({format_size(sum(d.rest for d in ro))}) in "
            kept += _maintlevels.read_only_note([d.part for d in ro])
        print(
            f"{verb} {_count(gone, 'entry')} ({format_size(freed)}); "
            f"{_count(left, 'entry')} ({format_size(rest)}) {'remains' if left == 1 else 'remain'}"
            f"{kept}{_unknown(failed)}"
        )
    code = _maintlevels.level_failures("prune", stop if held else None, [d.part for d in failed])
    if stuck:
        where = ", ".join(d.part.name for d in done if d.stuck)
        doomed = sum(d.doomed for d in done)
        refused = next((d.refused for d in done if d.refused), None)
        why = f"of {where} ({refused})" if refused else f"of {where} {_MAYBE}"
        print(
            f"cuforge cache prune: could not remove {stuck} of {_count(doomed, 'entry')} {why}",
            file=sys.stderr,
        )
        code = 1
    return code


def _unknown(failed: list[_Pruned]) -> str:
    """``; not counted: what level 1 holds (it could not be listed)``, else ""."""
    unlisted = [d.part for d in failed if d.listed is None]
    if not unlisted:
        return ""
    ids = ", ".join(str(p.index) for p in unlisted)
    which = f"levels {ids} hold" if len(unlisted) > 1 else f"level {ids} holds"
    return f"; not counted: what {which} (it could not be listed)"


def _prune_listing(part: _maintlevels.Part) -> list[_entries.Row] | None:
    """``part``'s entries; None for a read-only level that cannot list (what it keeps
    is not known, only that it keeps it). A writable one that cannot list is a
    UsageError; one that cannot be reached raises (``_maintlevels.attempt``)."""
    try:
        return _entries.rows(part.cache)
    except UsageError:
        if part.read_only:
            return None
        raise


def _prune_level(
    part: _maintlevels.Part,
    listed: list[_entries.Row] | None,
    failed: OSError | None,
    args: argparse.Namespace,
    now: int,
    held: bool,
) -> _Pruned:
    """Prune one level as a cache of its own, listed as ``listed`` (a read-only level,
    or every level while ``held``: only reported, with what stays there; ``failed``: its
    listing's error). Each entry that went is printed as it goes (not on a terminal); a
    tier's level that fails part way stops there and is reported, not raised."""
    if failed is not None:
        return _Pruned(part, None, error=_maintlevels.failure_words(failed, "list entries"))
    if part.read_only or held or listed is None:
        return _Pruned(part, listed, held=held and not part.read_only)
    out = _Pruned(part, listed)
    _, lost = _maintlevels.attempt(part, partial(_prune_entries, out, listed, args, now))
    if lost is not None:
        out.error = _maintlevels.failure_words(lost, "remove entries")
    return out


def _prune_entries(
    out: _Pruned, listed: list[_entries.Row], args: argparse.Namespace, now: int
) -> None:
    """Choose what goes from ``out.part`` by the rules and remove it, counting into ``out``."""
    part = out.part
    cache = part.cache
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
    out.doomed = len(doomed)
    for row, reason in doomed.values():
        if out.refused is not None:
            out.stuck.append(row)  # the server refused the first: not asked again
            continue
        try:
            went = args.dry_run or cache.remove_entry(row.id)
        except OSError as exc:  # a tier's level: reported as its failure (attempt)
            if part.index is not None:
                raise
            # one cache (a server whose user may not delete): the summary, then why
            out.refused = _maintlevels.why_words(exc)
            out.stuck.append(row)
            continue
        if went:
            out.freed += row.info.size
            out.gone[row.id] = reason
            if not args.json and (args.dry_run or not _term.is_tty(sys.stdout)):
                print(f"{part.prefix()}{_label(row)}: {reason}")
        elif _maintlevels.still_there(cache, row.id):
            out.stuck.append(row)  # not removed: a read-only cache, no permission


def _rule(row: _entries.Row, args: argparse.Namespace, now: int) -> str:
    if args.older_than is not None and row.info.stored_ns < now - args.older_than * 1e9:
        return "stored before --older-than"
    if args.unused_for is not None and row.info.used_ns < now - args.unused_for * 1e9:
        return "not read within --unused-for"
    matches = args.compiler_matches
    if matches is not None and row.kind == "program" and matches(row.compiler):
        return f"made by compiler {_entries.short_compiler(row.compiler)}"
    return ""
