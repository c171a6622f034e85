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

None of these creates a cache: a path that does not exist is a usage error (exit 2),
and so is a directory that is not a cuforge cache (``verify`` without ``--fix`` opens
read-only; the others delete only the cache's own files, see ``storage.ownership``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cuforge.cli import _entries, _select, _term
from cuforge.cli._args import UsageError, duration_arg, size_arg
from cuforge.cli.cache import opened

TYPE_CHECKING = False
if TYPE_CHECKING:
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
    bad: list[tuple[_entries.Row, str]] = []
    removed = checked = unsigned_check = 0
    with opened(args, read_only=not args.fix) as cache:
        for row in _entries.rows(cache):
            try:
                problem = cache.check_entry(row.id)
            except KeyError:
                continue  # removed by someone else meanwhile
            checked += 1
            if row.kind == _entries.SIGNED:  # listed without the secret: integrity only
                unsigned_check += 1
            if problem is None and row.kind == "manifest":
                entry = cache.read_entry(row.id)
                if entry is not None and _entries.manifest_entry_ids(entry.data) is None:
                    problem = "header manifest does not parse"
            if problem is not None:
                bad.append((row, problem))
                if args.fix and cache.remove_entry(row.id):
                    removed += 1
        # Objects that are no entry at all (a FIFO, a directory, a file for a shard)
        # never list as entries; a directory cache names them itself.
        find = getattr(cache, "foreign_objects", None)
        foreign: list[tuple[str, str]] = find() if find is not None else []
        if args.fix and foreign:
            remove = cache.remove_foreign_object  # type: ignore[attr-defined]
            removed += sum(bool(remove(path)) for path, _ in foreign)
    if args.json:
        report = {
            "checked": checked,
            "bad": [{"id": r.id, "kind": r.kind, "problem": p} for r, p in bad],
            "foreign": [{"path": f"entries/{p}", "what": w} for p, w in foreign],
            "removed": removed,
            "signatures_unchecked": unsigned_check,
        }
        print(json.dumps(report, indent=2))
    else:
        for row, problem in bad:
            print(f"{_label(row)}: {_term.paint(problem, 'red')}")
        for path, what in foreign:
            place = "an entry file" if "/" in path else "a shard directory"
            note = f"{what} where {place} belongs"
            print(f"entries/{path}: {_term.paint(note, 'red')}")
        summary = f"checked {_count(checked, 'entry')}: {len(bad)} bad"
        if foreign:
            summary += f", {_count(len(foreign), 'foreign object')}"
        if args.fix:
            summary += f", {removed} removed"
        if not (bad or foreign):
            # "all verify" only when every check was made; else what was: integrity
            summary = f"checked {_count(checked, 'entry')}: all " + (
                "intact" if unsigned_check else "verify"
            )
        if unsigned_check:
            summary += f"; {_unchecked(unsigned_check)}"
        print(summary)
    return 1 if bad or foreign else 0


def _unchecked(n: int) -> str:
    """The words for ``n`` signed entries whose signature this run could not check."""
    whose = "entry's signature was" if n == 1 else "entries' signatures were"
    return f"{n} signed {whose} not checked (no secret set: CUFORGE_CACHE_SECRET or secret_file)"


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
    with opened(args) as cache:
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
        freed = 0
        gone: dict[str, str] = {}  # id -> why
        stuck: list[_entries.Row] = []
        for row, reason in doomed.values():
            if args.dry_run or cache.remove_entry(row.id):
                freed += row.info.size
                gone[row.id] = reason
                if not args.json and (args.dry_run or not _term.is_tty(sys.stdout)):
                    print(f"{_label(row)}: {reason}")
            elif _still_there(cache, row.id):
                stuck.append(row)  # not removed: a read-only cache, no permission
    left = len(listed) - len(gone)
    rest = sum(r.info.size for r in listed if r.id not in gone)
    if args.json:
        removed = [
            {"id": r.id, "kind": r.kind, "name": r.record.get("name"), "size": r.info.size,
             "reason": gone[r.id]}
            for r in listed if r.id in gone
        ]  # fmt: skip
        report = {
            "dry_run": bool(args.dry_run), "removed": removed, "removed_bytes": freed,
            "remaining": left, "remaining_bytes": rest, "not_removed": len(stuck),
        }  # fmt: skip
        print(json.dumps(report, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        print(
            f"{verb} {_count(len(gone), 'entry')} ({format_size(freed)}); "
            f"{_count(left, 'entry')} ({format_size(rest)}) remain"
        )
    if stuck:
        print(
            f"cuforge cache prune: could not remove {len(stuck)} of "
            f"{_count(len(doomed), 'entry')} (is {chosen_shown(args)} read-only or another "
            "user's?)",
            file=sys.stderr,
        )
        return 1
    return 0


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


def chosen_shown(args: argparse.Namespace) -> str:
    return _select.choose(args).shown()


def _rule(row: _entries.Row, args: argparse.Namespace, now: int) -> str:
    if args.older_than is not None and row.info.stored_ns < now - args.older_than * 1e9:
        return "stored before --older-than"
    if args.unused_for is not None and row.info.used_ns < now - args.unused_for * 1e9:
        return "not read within --unused-for"
    matches = args.compiler_matches
    if matches is not None and row.kind == "program" and matches(row.compiler):
        return f"made by compiler {_entries.short_compiler(row.compiler)}"
    return ""


def _clear(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size

    chosen = opened(args)
    with chosen as cache:
        where = chosen.choice.shown()
        if not args.yes:
            if not (_term.is_tty(sys.stdin) and _term.is_tty(sys.stderr)):
                raise UsageError(f"refusing to clear {where} without --yes (no terminal to ask)")
            try:
                listed = _entries.rows(cache)
                size = format_size(sum(r.info.size for r in listed))
                what = f"all {_count(len(listed), 'entry')} ({size})"
            except UsageError:
                what = "every entry"
            sys.stderr.write(f"Remove {what} from {where}? [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print("not cleared", file=sys.stderr)
                if args.json:
                    print(json.dumps({"cache": where, "cleared": False}, indent=2))
                return 1
        before: list[_entries.Row] | None
        try:
            before = _entries.rows(cache)
        except UsageError:  # a backend that cannot list: its clear() is taken at its word
            before = None
        failure: OSError | None = None
        try:
            cache.clear()
        except OSError as exc:  # a read-only mount, another user's files: counted below
            if before is None:
                raise
            failure = exc
        stuck = [r for r in before or () if _still_there(cache, r.id)]
    kept = {r.id for r in stuck}
    went = [r for r in before or () if r.id not in kept]
    freed = sum(r.info.size for r in went)
    if args.json:
        report = {
            "cache": where, "cleared": not stuck,
            "removed": None if before is None else len(went),
            "removed_bytes": None if before is None else freed,
            "not_removed": len(stuck),
        }  # fmt: skip
        print(json.dumps(report, indent=2))
    elif before is None:
        print(f"cleared {where} (it cannot list its entries, so none were counted)")
    else:
        print(f"removed {_count(len(went), 'entry')} ({format_size(freed)}) from {where}")
    if stuck:
        why = "read-only, or another user's?"
        if failure is not None:  # what the removal met, without a path inside the cache
            why = failure.strerror or type(failure).__name__
        print(
            f"cuforge cache clear: could not remove {len(stuck)} of "
            f"{_count(len(before or ()), 'entry')} of {where} ({why})",
            file=sys.stderr,
        )
        return 1
    return 0
