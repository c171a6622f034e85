"""``cuforge cache ...``: look at a program cache.

- ``stats [--json | --format text|json|openmetrics]``: where and what the cache is,
  entries and bytes, the cap, the counters summed over every process that used it
  (hits, misses, stores, evictions, integrity and write failures, hit rate), the oldest
  and newest entry; ``openmetrics`` is the Prometheus text format (``_openmetrics``).
  Where the cap bounds disk use rather than entry bytes (SQLite: database + WAL + WAL
  index), the size shown against the cap is the disk use (``disk_bytes``).
- ``zero-stats [--json]``: restart those counters from zero (for every process; on
  Redis, for the whole fleet using the prefix).
- ``ls [--sort size|age|last-used|name] [--limit N] [--reverse] [--name GLOB]
  [--arch ARCH] [--kind KIND] [--json]``: one
  line per entry (those every filter given matches): short id, kind, target, arch,
  size, age, last use, source name (an integration's entries: the system's key),
  compiler. ``KIND``: one of ``storage.record.KINDS`` (program, manifest, triton,
  inductor, cupy, jax, warm-set, warm-pack, mirror, mirror-index), raw (no record) or
  signed (stored signed, listed without the secret: its record is not read).
- ``show ID-PREFIX [--extract OUT [--force]] [--json]``: everything recorded about one
  entry and whether it verifies (a signed entry without the secret: its integrity only,
  said so; ``--json``: ``signature_checked`` false), its size as stored and the
  artifact's (what compile and ``--extract`` count); ``--extract`` writes its raw
  payload (a cubin for cuobjdump) (``-``: to stdout); the details then go to stderr, so
  stdout holds the payload only. ``OUT`` is checked before anything is printed (an empty
  name, a missing folder, a directory: usage errors), and an existing file is never
  written over without ``--force`` (it may be a source, or another entry's extract).
- ``dir [--default] [--json]``: the cache in use (a directory's path, else its URL
  without a password, else ``caching is off (...)``: exit 0, ``--json`` ``null``);
  ``--default``: the default directory, whatever is chosen.

Maintenance (``verify``, ``prune``, ``clear``) lives in ``cache_maint``, ``explain``
in ``explain``. Every action takes ``--cache URL|DIR`` (see ``_select``).

Exit status: 0 ok; 1 ``show`` could not extract a damaged entry; 2 usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from cuforge._names import printed
from cuforge.cli import _entries, _maintlevels, _select, _statslevels, _term
from cuforge.cli._args import UsageError, arch_arg
from cuforge.storage.config import DEFAULT_ORIGIN
from cuforge.storage.record import KINDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import Subparsers
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["opened", "register"]

_SORTS = {
    "last-used": (lambda r: r.info.used_ns, True),
    "age": (lambda r: r.info.stored_ns, True),
    "size": (lambda r: r.info.size, True),
    "name": (lambda r: (str(r.record.get("name") or ""), r.id), False),
}


def register(subparsers: Subparsers) -> Subparsers:
    """Add the ``cache`` group; returns its action subparsers' parent for the other
    cache modules to extend."""
    group = subparsers.add_parser("cache", help="inspect, verify, prune or clear a cache")
    actions = group.add_subparsers(dest="action", metavar="ACTION", prog="cuforge cache")
    group.set_defaults(handler=lambda args: _missing_action(group))

    p = actions.add_parser("stats", help="size, entries and counters over all processes")
    p.add_argument("--json", action="store_true", help="print JSON (--format json)")
    p.add_argument(
        "--format",
        choices=("text", "json", "openmetrics"),
        default=None,
        help="text (default), json, or openmetrics (the Prometheus text format)",
    )
    p.set_defaults(handler=_stats)
    _select.add_cache_option(p, can_disable=False)

    p = actions.add_parser("zero-stats", help="restart the counters from zero")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_zero_stats)
    _select.add_cache_option(p, can_disable=False)

    p = actions.add_parser("ls", help="one line per entry")
    p.add_argument("--sort", choices=sorted(_SORTS), default="last-used", help="order")
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--limit", type=_positive, metavar="N", help="show the first N")
    p.add_argument("--name", metavar="GLOB", help="only sources named so (saxpy.cu, 'sax*')")
    p.add_argument("--arch", type=arch_arg, metavar="ARCH", help="only entries for ARCH (sm_90)")
    p.add_argument(
        "--kind",
        choices=(*KINDS, "raw", _entries.SIGNED),
        help="only entries of this kind (raw: stored without a record; signed: stored "
        "signed, listed without the secret)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_ls)
    _select.add_cache_option(p, can_disable=False)

    p = actions.add_parser("show", help="one entry's metadata; --extract its payload")
    p.add_argument("prefix", metavar="ID-PREFIX", help="the entry id or its first digits")
    p.add_argument("--extract", metavar="OUT", help="write the raw payload to OUT (-: stdout)")
    p.add_argument("--force", action="store_true", help="let --extract write over a file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_show)
    _select.add_cache_option(p, can_disable=False)

    p = actions.add_parser("dir", help="print the cache in use (--default: the default)")
    p.add_argument(
        "--default", action="store_true", help="print the default directory, whatever is chosen"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_dir)
    _select.add_cache_option(p, can_disable=False)
    return actions


def _missing_action(group: argparse.ArgumentParser) -> int:
    raise UsageError("an action is required (see cuforge cache --help)", group.prog)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


class opened:  # lower case: used like open()
    """``with opened(args) as cache``: the chosen cache, closed after (UsageError when
    caching is off, the cache does not exist -- nothing is created -- or it cannot be
    opened). ``read_only``: the command only looks, and the cache is opened so that
    it creates, sweeps and deletes nothing (a directory that is not a cuforge cache
    is a UsageError); the default directory before the first compile made it then
    reads as an empty cache (``not_yet``), not as a mistake."""

    def __init__(self, args: argparse.Namespace, read_only: bool = False) -> None:
        self.choice = _select.choose(args)
        if self.choice.url is None:
            raise UsageError(f"caching is off ({self.choice.said()}): there is no cache to use")
        self.read_only = read_only
        self.not_yet = False
        self.cache: ProgramCacheResource | None = None

    def __enter__(self) -> ProgramCacheResource:
        fresh = self.read_only and self.choice.origin == DEFAULT_ORIGIN
        self.not_yet = fresh and _select.missing(self.choice) is not None
        if not self.not_yet:
            _select.require_existing(self.choice)  # these commands never create a cache
        self.cache = _select.open_choice(self.choice, read_only=self.read_only)
        return self.cache

    def __exit__(self, *exc: object) -> None:
        if self.cache is not None:
            self.cache.close()


def _count(n: int, noun: str) -> str:
    """``1 hit``, ``2 hits``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _when(ns: int) -> str:
    import datetime

    if not ns:
        return "-"
    stamp = datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} ({_term.ago(ns)})"


_NOT_YET = ": not created yet (the first compile creates it)"


def _stats(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size
    from cuforge.storage.urls import parse_cache_url

    chosen = opened(args, read_only=True)
    with chosen as cache:
        counters = (getattr(cache, "total_stats", None) or cache.stats)().as_dict()
        try:
            listed = _entries.rows(cache)
        except UsageError:
            listed = None
        cap = getattr(cache, "max_size_bytes", None)
        tier = _statslevels.tier_levels(cache, chosen.choice)
    disk = _statslevels.disk_bytes(cache)  # closed: without the WAL index this look opened
    choice = chosen.choice
    kinds: dict[str, int] = {}
    for row in listed or ():
        kinds[row.kind] = kinds.get(row.kind, 0) + 1
    lookups = counters["hits"] + counters["misses"]
    report: dict[str, Any] = {
        "cache": choice.shown(),  # as zero-stats, clear and dir --json name it
        "path": choice.shown(),  # deprecated: the same, under its first name
        "backend": type(cache).__name__,
        "entries": None if listed is None else len(listed),
        "kinds": kinds,
        "size_bytes": None if listed is None else sum(r.info.size for r in listed),
        "disk_bytes": disk,
        "max_size_bytes": cap,
        **counters,
        "hit_rate": round(counters["hits"] / lookups, 4) if lookups else None,
        "oldest_ns": min((r.info.stored_ns for r in listed or ()), default=None),
        "newest_ns": max((r.info.stored_ns for r in listed or ()), default=None),
    }
    if tier is not None:  # whose figures are whose: each level's own, and the counters'
        report["levels"], report["counters_level"] = tier
    specs = parse_cache_url(choice.url or "")
    # a ?ro cache of one level counts nothing: its counters are from writable use
    recorded = tier is not None or not (len(specs) == 1 and specs[0].read_only)
    if not recorded:
        report["recorded"] = False
    shape = args.format or ("json" if args.json else "text")
    if args.json and shape != "json":
        raise UsageError(f"--json and --format {shape} disagree: give one of them")
    if shape == "json":
        print(json.dumps(report, indent=2))
        return 0
    if shape == "openmetrics":
        from cuforge.cli._openmetrics import render as openmetrics

        sys.stdout.write(openmetrics(report))
        return 0
    entries = "-" if listed is None else str(len(listed))
    if kinds:
        entries += " (" + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ")"
    size = "-" if report["size_bytes"] is None else format_size(report["size_bytes"])
    if disk is not None:  # what the cap bounds: the files' size, not the entries'
        size = f"{format_size(disk)} on disk (entries {size})"
    rate = "-" if report["hit_rate"] is None else f"{report['hit_rate'] * 100:.1f} %"
    every = ", all levels" if tier is not None else ""  # a tier: the union of its levels
    if tier is not None:
        size += " in all levels (each level's cap below)"
    else:
        last = parse_cache_url(choice.url or "")[-1].scheme
        size += f" of {format_size(cap)} cap" if cap else _statslevels.no_cap(last)
        held = disk if disk is not None else report["size_bytes"]
        if cap and held is not None and held > cap * 1.1:  # a lowered cap, not yet applied
            size += " (over it: lowered since; a store that fits under it evicts down to it)"
    lines = [
        ("cache", f"{report['cache']} ({report['backend']}){_NOT_YET if chosen.not_yet else ''}"),
        ("entries", entries + every),
        ("size", size),
    ]
    if tier is not None:
        lines.append(("counters", _statslevels.counters_from(*tier)))
    counted = f"{_count(counters['hits'], 'hit')} / {_count(lookups, 'lookup')}"
    if recorded:
        lines.append(("hit rate", f"{rate} ({counted})"))
    else:
        lines.append(("hit rate", f"not recorded: opened read-only, lookups through it are not "
                      f"counted (its stored counters, from writable use: {counted})"))  # fmt: skip
    for name, value in counters.items():
        if name in ("hits",):
            continue
        shown = format_size(value) if name.startswith("bytes") else str(value)
        lines.append((name.replace("_", " "), shown))
    lines.append(("oldest entry", _when(report["oldest_ns"] or 0) + every))
    lines.append(("newest entry", _when(report["newest_ns"] or 0) + every))
    schemes = [spec.scheme for spec in parse_cache_url(choice.url or "")]
    for i, level in enumerate(tier[0] if tier is not None else ()):
        lines.append(
            (f"level {i}", _statslevels.level_line(level, schemes[i] if i < len(schemes) else ""))
        )
    for label, value in lines:
        bad = label in ("integrity failures", "write failures") and value != "0"
        print(f"{label:<20}{_term.paint(value, 'red') if bad else value}")
    return 0


def _zero_stats(args: argparse.Namespace) -> int:
    chosen = opened(args)
    with chosen as cache:
        try:
            cache.zero_stats()
        except NotImplementedError as exc:
            raise UsageError(str(exc)) from None
        except ConnectionError:
            raise  # a server that cannot be reached: exit 1, as for every command
        except OSError as exc:
            level = getattr(exc, "level", None)
            names = _select.level_names(chosen.choice)
            if isinstance(exc, PermissionError) and level is not None and level < len(names):
                raise UsageError(  # a ?ro level holds the counters stats reports
                    f"cannot reset the statistics: {names[level][0]} is opened read-only "
                    "(?ro), so its shared counters (what cuforge cache stats shows) stay as "
                    "they are; leave ?ro out to reset them"
                ) from None
            why = f"cannot reset the statistics: {exc.strerror or exc}"
            if isinstance(exc, PermissionError) and getattr(cache, "read_only", False) is True:
                raise UsageError(why) from None  # the URL says ?ro: the command asked wrong
            # The command ran and the cache failed it (a locked database, a directory it
            # may not write): exit 1, as clear and prune that could not remove entries.
            print(f"cuforge cache zero-stats: error: {printed(why)}", file=sys.stderr)
            return 1
        # Which levels restarted: a ?ro level is never written, so its counters stay.
        levels = _maintlevels.parts(cache, chosen.choice, "zero", writes=False)
    ro = [p for p in levels if p.read_only]
    if args.json:
        report: dict[str, object] = {"cache": chosen.choice.shown(), "zeroed": True}
        if levels[0].index is not None:
            report["levels"] = [
                {"cache": p.name, "read_only": p.read_only, "zeroed": not p.read_only}
                for p in levels
            ]
        print(json.dumps(report, indent=2))
    elif ro:
        zeroed = ", ".join(p.label() for p in levels if not p.read_only)
        left = ", ".join(p.label() for p in ro)
        print(
            f"statistics of {zeroed} restart from zero; {left} "
            f"{'is' if len(ro) == 1 else 'are'} read-only (?ro): counters left as they are"
        )
    elif levels[0].index is not None:  # a tier: say which levels restarted
        zeroed = ", ".join(p.label() for p in levels)
        print(f"statistics of {zeroed} restart from zero")
    else:
        print(f"statistics of {chosen.choice.shown()} restart from zero")
    return 0


def _selected(row: _entries.Row, args: argparse.Namespace) -> bool:
    """Whether ``row`` passes ``ls``'s filters: every one given must match."""
    from fnmatch import fnmatchcase

    if args.kind and row.kind != args.kind:
        return False
    if args.arch and str(row.record.get("arch") or "") != args.arch:
        return False
    name = str(row.record.get("name") or "")
    base = name.rsplit("/", 1)[-1]
    return not args.name or fnmatchcase(name, args.name) or fnmatchcase(base, args.name)


def _ls(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size

    if args.name is not None and not args.name.strip():  # '' matched every entry
        given = "a blank" if args.name else "an empty"
        raise UsageError(
            f"--name needs a source name or glob such as saxpy.cu or 'sax*' (it was given "
            f"{given} one); leave --name out to list every entry"
        )
    with opened(args, read_only=True) as cache:
        listed = [r for r in _entries.rows(cache) if _selected(r, args)]
    key, descending = _SORTS[args.sort]
    listed.sort(key=key, reverse=descending != args.reverse)
    if args.limit:
        listed = listed[: args.limit]
    if args.json:
        print(json.dumps([r.as_dict() for r in listed], indent=2))
        return 0
    now = time.time_ns()
    body = []
    for r in listed:
        rec = r.record
        body.append(
            [
                r.id[: _entries.SHORT],
                r.kind,
                str(rec.get("target") or "-"),
                str(rec.get("arch") or "-"),
                format_size(r.info.size),
                _term.ago(r.info.stored_ns, now),
                _term.ago(r.info.used_ns, now),
                printed(str(rec.get("name") or "-")),  # one line, one column: escaped
                _entries.short_compiler(r.compiler) if r.kind == "program" else "-",
            ]
        )
    header = ["ID", "KIND", "TARGET", "ARCH", "SIZE", "AGE", "USED", "NAME", "COMPILER"]
    if body:
        print(_term.table(header, body, sys.stdout, right="....r"))
    elif _term.is_tty(sys.stdout):
        print("(no entries)")
    return 0


def _check_extract(out: str | None, force: bool) -> bool:
    """UsageError, before the cache is opened or anything printed, when ``--extract
    OUT`` cannot or must not be written: an empty name, a folder that is missing, a
    directory, an existing file without ``force``. Whether OUT is to be replaced
    (an existing object: a file with ``force``, a device, a FIFO)."""
    if force and out is None:
        raise UsageError("--force goes with --extract OUT (it lets it write over a file)")
    if out is None or out == "-":
        return False
    if out == "":
        raise UsageError(
            "--extract needs a file name (it was given an empty one); - is standard output"
        )
    folder = os.path.dirname(out) or "."
    if not os.path.isdir(folder):
        raise UsageError(f"--extract {out}: the directory {folder} does not exist")
    if os.path.isdir(out):
        raise UsageError(f"--extract {out}: is a directory; name a file")
    if not os.path.lexists(out):
        return False
    if os.path.isfile(out) and not force:
        raise UsageError(_exists(out))
    return True


def _exists(out: str) -> str:
    return f"--extract {out}: the file exists; give --force to write over it"


def _write_extract(out: str, data: bytes, replace: bool) -> None:
    """Write ``data`` to ``out``; a new file is created exclusively, so a file that
    appeared after :func:`_check_extract` looked is not written over either."""
    try:
        with open(out, "wb" if replace else "xb") as f:
            f.write(data)
    except FileExistsError:
        raise UsageError(_exists(out)) from None


def _show(args: argparse.Namespace) -> int:
    replace = _check_extract(args.extract, args.force)
    with opened(args, read_only=True) as cache:
        row = _entries.find(cache, args.prefix)
        try:
            problem = cache.check_entry(row.id)
        except KeyError:
            raise UsageError(f"entry {row.id[: _entries.SHORT]} was removed meanwhile") from None
        except NotImplementedError:
            problem = None
        entry = cache.read_entry(row.id)  # a maintenance read: not a use
    details: dict[str, Any] = {
        "id": row.id,
        "kind": row.kind,
        "size": row.info.size,  # stored: the artifact with its record and checks
        "artifact_bytes": None if entry is None else len(entry.data),
        "stored": _when(row.info.stored_ns),
        "last_used": _when(row.info.used_ns),
        "verifies": problem is None,
    }
    if problem is not None:
        details["problem"] = problem
    if row.kind == _entries.SIGNED:
        # listed without the secret: "verifies" is its integrity alone
        details["signature_checked"] = False
        details["record"] = _entries.SIGNED_NOTE
    details.update({k: v for k, v in row.record.items() if k not in ("v", "kind")})
    if row.kind == "manifest" and entry is not None:
        details["variants"] = _variants(entry.data)
    # With --extract, stdout is the payload's alone (``--extract -``): details to stderr.
    shown_to = sys.stderr if args.extract else sys.stdout
    if args.json:
        print(json.dumps(details, indent=2), file=shown_to)
    else:
        if details.pop("signature_checked", True) is False and details["verifies"]:
            details["verifies"] = "intact; the signature not checked (no secret set)"
        if isinstance(details.get("created"), int):  # seconds since the epoch
            details["created"] = _when(details["created"] * 1_000_000_000)
        if isinstance(details.get("variants"), list):
            details["variants"] = [_variant_line(v) for v in details["variants"]]
        # compile and --extract count the artifact's bytes; the listing, what is stored
        stored = f"{details['size']} B stored"
        artifact = details.pop("artifact_bytes")
        details["size"] = stored if artifact is None else f"{stored} (artifact: {artifact} B)"
        if details.get("compiler"):  # as ls prints it (what prune --compiler matches)
            raw = details["compiler"]
            details["compiler"] = f"{_entries.short_compiler(raw)} ({raw})"
        _print_details(details, shown_to)
    if args.extract:
        if entry is None:
            print(
                f"cuforge cache show: entry {row.id[: _entries.SHORT]} is damaged or gone",
                file=sys.stderr,
            )
            return 1
        try:
            if args.extract == "-":
                sys.stdout.buffer.write(entry.data)
                sys.stdout.buffer.flush()
            else:
                _write_extract(args.extract, entry.data, replace)
        except BrokenPipeError:  # --extract - read by a reader that went away: exit 1
            raise
        except OSError as exc:
            raise UsageError(f"cannot write {args.extract}: {exc.strerror or exc}") from None
        print(f"wrote {len(entry.data)} bytes to {args.extract}", file=sys.stderr)
    return 0


def _variants(data: bytes) -> list[dict[str, Any]]:
    from cuforge.storage.record import decode_record

    record = decode_record(data, "manifest") or {}
    ids = _entries.manifest_entry_ids(data) or []
    out = []
    for variant, eid in zip(record.get("variants") or [], ids, strict=False):
        files = variant.get("files") or []
        out.append(
            {
                "entry": eid,
                "headers": [f[1] for f in files if isinstance(f, list) and len(f) > 1],
                "absent_candidates": len(variant.get("absent") or []),
            }
        )
    return out


def _variant_line(variant: dict[str, Any]) -> str:
    """``entry 650fc447da9c: headers scale.h, cfg.h; 2 paths that must stay absent``:
    a header manifest's variant for people (``--json`` keeps the fields)."""
    headers = ", ".join(variant["headers"]) or "none"
    absent = variant["absent_candidates"]
    where = (
        f"; {absent} {'path' if absent == 1 else 'paths'} that must stay absent" if absent else ""
    )
    return f"entry {variant['entry'][: _entries.SHORT]}: headers {headers}{where}"


def _print_details(details: dict[str, Any], to: Any) -> None:
    """``label  value`` lines; a control character in a value (a name's newline) is
    escaped (``_names.printed``), so each value stays on its line."""
    for key, value in details.items():
        label = key.replace("_", " ")
        if isinstance(value, list):
            print(f"{label}:" if value else f"{label:<16}-", file=to)
            for item in value:
                if isinstance(item, dict):
                    item = ", ".join(f"{k}={v}" for k, v in item.items())
                elif isinstance(item, list):
                    item = " ".join(str(x) for x in item)
                print(f"  {printed(str(item))}", file=to)
        else:
            shown = printed(str(value))
            if key == "verifies" and isinstance(value, bool):
                ok = _term.paint("yes", "green", to) if value else _term.paint("NO", "red", to)
                shown = ok
            print(f"{label:<16}{shown}", file=to)


def _dir(args: argparse.Namespace) -> int:
    """The cache the other commands would use: a directory as an absolute path, any
    other cache as its URL (without a password); ``--default``: the default directory.
    A cache of one directory -- a plain path or a ``file://`` URL -- is printed as the
    path it opens: without ``file://``, without its query (``?max_size=``, which
    ``cuforge run`` adds to ``$CUFORGE_CACHE`` for a settings file's cap) and with
    the URL's percent-encoding decoded (``%2C``: a comma): a path ``du`` can take.
    Caching off is an answer too (exit 0): ``caching is off (WHAT SAID SO)``, in
    ``--json`` ``"cache": null``."""
    if args.default:
        from cuforge.storage.filestream import default_cache_dir

        where, origin = default_cache_dir(), DEFAULT_ORIGIN
    else:
        choice = _select.choose(args)
        if choice.url is None:  # the answer, not a mistake: no cache is in use
            if args.json:
                print(json.dumps({"cache": None, "origin": choice.origin}, indent=2))
            else:
                print(f"caching is off ({choice.said()})")
            return 0
        where, origin = choice.shown(), choice.origin
        from cuforge.storage.urls import parse_cache_url

        specs = parse_cache_url(choice.url)
        for spec in specs:
            # a path no cache can open as its scheme (a regular file as a directory, a
            # directory as a database): the commands' usage error, as they give it
            wrong = spec.scheme == "file" and not os.path.isdir(spec.location)
            wrong |= spec.scheme == "sqlite" and os.path.isdir(spec.location)
            if wrong and os.path.lexists(spec.location):
                _select.open_choice(choice, read_only=True).close()
        if len(specs) == 1 and specs[0].scheme == "file":
            # the directory the cache opens, as the file system names it: not its URL
            # (file:///d), its options (?max_size=) or its encoding (%2C for a comma)
            where = os.path.abspath(specs[0].location)
    # one line: a control character in the path escaped (--json: the exact path)
    print(json.dumps({"cache": where, "origin": origin}, indent=2) if args.json else printed(where))
    return 0
