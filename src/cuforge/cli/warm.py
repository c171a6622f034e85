"""``cuforge warm [MANIFEST] [--set NAME] [--jobs N] [--fail-on-miss]``: fill a cache
ahead of use.

``MANIFEST``: compiles every kernel x arch x option set a TOML manifest lists
(``_warmfile``) into the chosen cache, ``--jobs`` at a time in worker processes
(``_pool`` says why not threads; ``--threads`` runs them on threads of this process,
for comparison). Each compile goes through ``Program.compile(cache=)``, so what is
already cached is only looked up, and concurrent misses of one key (from other
hosts or processes) compile once. Shows a progress bar on a terminal and one line
per compile otherwise, then a summary table: compiled, already cached, failed --
with the first lines of each failure's log -- and what was not stored where it would
last: not stored at all, stored in ``memory://`` only (gone when the command exits),
or not stored in a level that dropped it (``N not stored in redis://h:6379/0:
unreachable``).

``--set NAME`` (the command-line side of ``cuforge run --warm-set``): fetches every
entry the warm set ``NAME`` lists (``integrations.warmsets``) into the local level of
the chosen tier -- its first persistent level, ``file:///local`` of
``file:///local,redis://shared`` -- in batches, before the manifest (if any) is
compiled. A cache that is one local level (a directory, a SQLite file) has nothing
to fetch from: the set is checked against it (how many of its entries are there,
verified). A cache with no local level (a bare ``redis://``, ``s3://``, a tier whose
first persistent level is read-only) has nowhere to fetch into: a usage error.

In a ``cuforge run --warm-set`` job, what the manifest's compiles read or store is
recorded into the run's warm set (``_pool.recording``), in this process, its threads
and its worker processes; the entries ``--set`` fetches are not (as the run's own
prefetch is not): they are the set's, not the job's use of them.

``--fail-on-miss`` makes anything that had to be compiled, or a set entry that is in
no level, a failure: CI can prove a cache is warm.

Exit status: 0 all compiled, cached or fetched; 1 a compile failed, no warm set
``NAME`` is stored, or (``--fail-on-miss``) something was not cached yet; 2 usage
errors (no manifest and no ``--set``, a bad set name, a cache with no local level).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from cuforge._names import printed
from cuforge.cli import _kept, _pool, _programs, _select, _term, _warmfile
from cuforge.cli._args import UsageError
from cuforge.cli._report import MEMORY_ONLY, store_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import Subparsers
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["register"]

_LOG_LINES = 4


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "warm",
        help="compile a manifest's kernels into the cache; fetch a warm set",
        description="Compile every kernel x arch x option set of MANIFEST into the cache; "
        "with --set NAME, first fetch the warm set NAME into the cache's local level.",
    )
    p.add_argument("manifest", metavar="MANIFEST", nargs="?", help="TOML file (see docs/cli.md)")
    p.add_argument(
        "--set", metavar="NAME", dest="warm_set",
        help="fetch the warm set NAME into the cache's local level",
    )  # fmt: skip
    p.add_argument("--jobs", "-j", type=_jobs, default=os.cpu_count() or 1, metavar="N",
                   help="compile N at a time (default: the number of CPUs)")  # fmt: skip
    p.add_argument("--threads", action="store_true", help="threads of one process, not processes")
    p.add_argument(
        "--fail-on-miss", action="store_true",
        help="exit 1 if anything had to compile, or a set entry is in no level",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(handler=_warm)
    _select.add_cache_option(p, can_disable=False)


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of jobs, got {text!r}")
    return value


# -- the command -------------------------------------------------------------------------
def _warm(args: argparse.Namespace) -> int:
    if args.manifest is None and args.warm_set is None:
        raise UsageError("a manifest or --set NAME is required (see cuforge warm --help)")
    _programs.check_warm_setting()
    if args.warm_set is not None:
        from cuforge.integrations.warmsets import set_key

        try:
            set_key(args.warm_set)
        except ValueError as exc:
            raise UsageError(f"--set: {exc}") from None
    folder, specs = _warmfile.load(args.manifest) if args.manifest is not None else ("", [])
    chosen = _select.choose(args)
    if chosen.url is None:
        raise UsageError(f"caching is off ({chosen.said()}): warm has nothing to fill")
    absent = _select.missing(chosen)
    if args.warm_set is not None and absent is not None and not _set_stored(chosen, args):
        return _no_set(args, chosen, absent.location)
    cache = _select.open_choice(chosen)  # opened here too: bad URLs fail before any work
    with cache:
        fetched: dict[str, Any] | None = None
        if args.warm_set is not None:
            fetched = _fetch_set(cache, args.warm_set, chosen)
            if fetched is None:
                return _no_set(args, chosen)
            if not specs:
                return _set_summary(fetched, args)
        return _compile_all(cache, chosen, folder, specs, args, fetched)


def _compile_all(
    cache: ProgramCacheResource,
    chosen: _select.Choice,
    folder: str,
    specs: list[_warmfile.Spec],
    args: argparse.Namespace,
    fetched: dict[str, Any] | None,
) -> int:
    """Compile every spec of the manifest through ``cache`` (open), then summarise."""
    url = chosen.target()  # what worker processes open (absolute before the chdir)
    os.chdir(folder)  # compile as `cuforge compile` run from the manifest's directory would
    progress = _term.Progress(len(specs), "warming", sys.stderr if args.json else None)
    results: list[dict[str, Any]] = []
    start = time.perf_counter()

    shown = _select.level_names(chosen)  # how the summary names where a compile went
    stored: list[tuple[dict[str, Any], list[str]]] = []  # lasting stores, their keys

    def finished(spec: _warmfile.Spec, result: dict[str, Any]) -> None:
        result.update(source=spec.source, arch=spec.arch, variant=spec.label or "")
        keys = result.pop("keys", None) or []
        if "stored" in result:  # compiled: where it was stored, per level
            result.update(store_fields(result, shown))
            if result.get("outlives_process"):
                stored.append((result, keys))
        result.pop("store_levels", None)
        results.append(result)
        what = f"{result['source']} {result['arch']} {result['variant']}".rstrip()
        progress.item(f"{result['status']:<9}{what} ({result['seconds']:.2f} s)")

    jobs = min(args.jobs, len(specs))
    workers = False
    if args.threads and jobs > 1:
        from concurrent.futures import ThreadPoolExecutor, as_completed

        through = _pool.recording(cache)  # a cuforge run job's warm set: recorded
        try:
            with ThreadPoolExecutor(jobs) as pool:
                futures = {pool.submit(_pool.compile_spec, s, through): s for s in specs}
                for future in as_completed(futures):
                    finished(futures[future], future.result())
        finally:
            _pool.done_recording(through, cache)
    else:
        opener = (url, chosen.secret)
        workers = _pool.run_specs(specs, jobs, cache, opener, lambda i, r: finished(specs[i], r))
    progress.close()
    if stored:  # workers' handles are closed; this one evicts nothing more at close
        _kept.recheck(stored, chosen, cache, workers)
    wall = time.perf_counter() - start
    return _summary(results, wall, jobs, args, fetched)


# -- warm sets ---------------------------------------------------------------------------
def _set_stored(chosen: _select.Choice, args: argparse.Namespace) -> bool:
    """Whether the warm set ``args.warm_set`` is stored in ``chosen``, looked up through
    a read-only handle: a cache (or level) that does not exist yet is not created --
    a mistyped ``--cache`` path made a whole new cache before saying no set was there.
    """
    from cuforge.integrations import warmsets

    with _select.open_choice(chosen, read_only=True) as looking:
        return warmsets.load(looking, args.warm_set) is not None


def _no_set(args: argparse.Namespace, chosen: _select.Choice, absent: str = "") -> int:
    """Say that no warm set of that name is stored (``absent``: the cache, or level,
    that does not exist and was not created); exit 1. When a server level cannot be
    reached (``_select.unreachable_level``), whether the set exists is unknown: the
    line says the set could not be read, and why."""
    import shlex  # the command to run, as a shell reads it: 'bad name/../'

    down = _select.unreachable_level(chosen)
    if down is not None:
        print(
            f"cuforge warm: warm set {args.warm_set!r} could not be read: {down[0]} is "
            f"unreachable ({down[1]})",
            file=sys.stderr,
        )
        return 1

    where, why = f"in {chosen.shown()}", " ("
    searched = _searched(chosen)
    if absent and searched:  # the other levels were searched: the set is in none of them
        where = f"in any level of {chosen.shown()}"
        why = f" (searched: {', '.join(searched)}; {absent} does not exist and was not created; "
    elif absent:
        why = f": there is no cache at {absent} (nothing was created; "
    record = f"cuforge run --warm-set {shlex.quote(args.warm_set)}"
    print(
        f"cuforge warm: no warm set {args.warm_set!r} is stored {where}{why}"
        f"{record} records one from a job that reads or stores entries through this cache)",
        file=sys.stderr,
    )
    return 1


def _searched(chosen: _select.Choice) -> list[str]:
    """The names of ``chosen``'s levels a warm set was looked up in: every one whose
    directory or database file exists (a server level always)."""
    import os

    from cuforge.storage.urls import parse_cache_url

    specs = parse_cache_url(chosen.url or "")
    return [
        name
        for spec, (name, _) in zip(specs, _select.level_names(chosen), strict=True)
        if spec.scheme not in ("file", "sqlite") or os.path.lexists(spec.location)
    ]


def _fetch_set(
    cache: ProgramCacheResource, name: str, chosen: _select.Choice
) -> dict[str, Any] | None:
    """Fetch the warm set ``name`` into ``cache``'s local level (or check it against a
    cache that is one local level); what was done, or None when no such set is stored.
    UsageError when ``cache`` has no local level to fetch into."""
    from cuforge.integrations import warmsets
    from cuforge.integrations.sessions import is_local

    local = is_local(cache)
    tier = None if local else warmsets.local_tier(cache)
    if tier is None and not local:
        kept = _read_only_local(chosen)
        if kept is not None:
            raise UsageError(
                f"--set: the local level {kept} of {chosen.where} {chosen.shown()} is "
                "read-only (?ro): there is nothing to fetch the warm set into; drop its ?ro"
            )
        raise UsageError(
            f"--set: {chosen.where} {chosen.shown()} has no local level to fetch the warm set "
            "into; give a tier such as file:///local/dir,redis://host/0"
        )
    found = warmsets.load_set(cache, name)
    if found is None:
        return None
    if tier is None:  # a local cache: checked against the set, nothing to fetch from
        done = warmsets.prefetch(cache, found.keys)
    else:
        done = warmsets.prefetch(tier, found.keys, name=name, pack=found.pack)
    return {
        "name": name,
        "listed": done.listed,
        "present": done.fetched,
        "missing": done.missing,
        "seconds": round(done.seconds, 3),
        "into": _local_level(chosen) if tier is not None else None,
    }


def _read_only_local(chosen: _select.Choice) -> str | None:
    """The name of ``chosen``'s first directory or database level when it is ``?ro``
    (the local level a warm set would be fetched into, opened read-only), else None."""
    from cuforge.storage.urls import parse_cache_url

    specs = parse_cache_url(chosen.url or "")
    for spec, (name, _) in zip(specs, _select.level_names(chosen), strict=True):
        if spec.scheme in ("file", "sqlite"):
            return name if spec.read_only else None
    return None


def _local_level(chosen: _select.Choice) -> str:
    """The URL of the chosen tier's first persistent level, for people."""
    for part in chosen.shown().split(","):
        if not part.startswith("memory:"):
            return part
    return chosen.shown()


def _set_line(done: dict[str, Any]) -> str:
    where = (
        f"now in the local level {done['into']}"
        if done["into"] is not None
        else "in the cache (one local level: nothing to fetch from)"
    )
    return (
        f"warm set {done['name']}: {done['listed']} {'entry' if done['listed'] == 1 else 'entries'}"
        f" listed, {done['present']} {where}, "
        f"{done['missing']} missing ({done['seconds']:.2f} s)"
    )


def _set_summary(done: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        import json

        print(json.dumps({"warm_set": done}, indent=2))
    else:
        print(_set_line(done))
    return _set_failed(done, args)


def _set_failed(done: dict[str, Any] | None, args: argparse.Namespace) -> int:
    if done is not None and args.fail_on_miss and done["missing"]:
        print(
            f"cuforge warm: {done['missing']} entries of warm set {done['name']!r} are in "
            "no level (--fail-on-miss)",
            file=sys.stderr,
        )
        return 1
    return 0


# -- the summary -------------------------------------------------------------------------
def _summary(
    results: list[dict[str, Any]],
    wall: float,
    jobs: int,
    args: argparse.Namespace,
    fetched: dict[str, Any] | None = None,
) -> int:
    counts = {s: sum(r["status"] == s for r in results) for s in ("compiled", "cached", "failed")}
    order = {"failed": 0, "compiled": 1, "cached": 2}
    results.sort(key=lambda r: (order[r["status"]], r["source"], r["arch"], r["variant"]))
    if args.json:
        import json

        extra = {} if fetched is None else {"warm_set": fetched}
        print(json.dumps({"wall_seconds": round(wall, 3), "jobs": jobs, **counts,
                          "results": results, **extra}, indent=2))  # fmt: skip
    else:
        if fetched is not None:
            print(_set_line(fetched))
        if _term.is_tty(sys.stdout):
            rows = [
                [_term.paint(r["status"], _colour(r["status"])), printed(r["source"]), r["arch"],
                 r["variant"] or "-", f"{r['seconds']:.2f}"]
                for r in results
            ]  # fmt: skip
            print(
                _term.table(["RESULT", "SOURCE", "ARCH", "VARIANT", "SECONDS"], rows, right="....r")
            )
        for r in results:
            if r["status"] == "failed":
                lines = [ln for ln in r["log"].splitlines() if ln.strip()][:_LOG_LINES]
                print(f"\nfailed: {printed(r['source'])} {r['arch']} {r['variant']}".rstrip())
                for ln in lines:
                    print(f"  {ln}")
        plural = "" if jobs == 1 else "s"
        print(
            f"{len(results)} compile{'' if len(results) == 1 else 's'}: "
            f"{counts['compiled']} compiled, {counts['cached']} "
            f"already cached, {counts['failed']} failed in {wall:.2f} s ({jobs} job{plural})"
        )
        from cuforge.storage.events import dropped_words

        whys: dict[str, int] = {}
        for r in results:
            if r.get("not_stored"):
                said = dropped_words(r["not_stored"])
                whys[said] = whys.get(said, 0) + 1
        if whys:  # a warm that warmed nothing must not read as if it had
            unstored = sum(whys.values())
            each = (
                next(iter(whys))
                if len(whys) == 1
                else "; ".join(f"{n} {said}" for said, n in sorted(whys.items()))
            )  # several causes: how many each
            print(f"{unstored} compiled but not stored: {each}")
        fleeting = sum(r.get("stored") is True and r.get("outlives_process") is False
                       for r in results)  # fmt: skip
        if fleeting:  # nor one that only this process's memory holds
            print(f"{fleeting} compiled and {MEMORY_ONLY}")
        missed: dict[tuple[str, str], int] = {}  # a level that dropped stores the others took
        for r in results:
            for lv in r.get("levels", ()) if r.get("stored") else ():
                if not lv["stored"] and lv["reason"] != "read-only":
                    place = (lv["level"], dropped_words(lv["reason"]))
                    missed[place] = missed.get(place, 0) + 1
        for (level, words), n in sorted(missed.items()):
            print(f"{n} not stored in {level}: {words}")
    if counts["failed"] or _set_failed(fetched, args):
        return 1
    if args.fail_on_miss and counts["compiled"]:
        print(
            f"cuforge warm: {counts['compiled']} compiles were not cached (--fail-on-miss)",
            file=sys.stderr,
        )
        return 1
    return 0


def _colour(status: str) -> str:
    return {"compiled": "yellow", "cached": "green", "failed": "red"}[status]
