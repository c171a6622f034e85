"""``cuforge warm MANIFEST [--jobs N] [--fail-on-miss]``: fill a cache ahead of use.

Compiles every kernel x arch x option set a TOML manifest lists (``_warmfile``)
into the chosen cache, ``--jobs`` at a time in worker processes (``_pool`` says
why not threads; ``--threads`` runs them on threads of this process, for
comparison). Each compile goes through ``Program.compile(cache=)``, so what is
already cached is only looked up, and concurrent misses of one key (from other
hosts or processes) compile once.

Shows a progress bar on a terminal and one line per compile otherwise, then a
summary table: compiled, already cached, failed -- with the first lines of each
failure's log. ``--fail-on-miss`` makes anything that had to be compiled a failure:
CI can prove a cache is warm.

Exit status: 0 all compiled or cached; 1 a compile failed, or (``--fail-on-miss``)
something was not cached yet; 2 usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from cuforge.cli import _pool, _select, _term, _warmfile
from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import Subparsers

__all__ = ["register"]

_LOG_LINES = 4


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "warm",
        help="compile the kernels a TOML manifest lists into the cache",
        description="Compile every kernel x arch x option set of MANIFEST into the cache.",
    )
    p.add_argument("manifest", metavar="MANIFEST", help="TOML file (see docs/cli.md)")
    p.add_argument("--jobs", "-j", type=_jobs, default=os.cpu_count() or 1, metavar="N",
                   help="compile N at a time (default: the number of CPUs)")  # fmt: skip
    p.add_argument("--threads", action="store_true", help="threads of one process, not processes")
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 if anything had to compile")
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
    folder, specs = _warmfile.load(args.manifest)
    chosen = _select.choose(args)
    if chosen.url is None:
        raise UsageError(f"caching is off ({chosen.said()}): warm has nothing to fill")
    cache = _select.open_choice(chosen)  # opened here too: bad URLs fail before any work
    url = chosen.target()  # what worker processes open (absolute before the chdir)
    os.chdir(folder)  # compile as `cuforge compile` run from the manifest's directory would
    progress = _term.Progress(len(specs), "warming", sys.stderr if args.json else None)
    results: list[dict[str, Any]] = []
    start = time.perf_counter()

    def finished(spec: _warmfile.Spec, result: dict[str, Any]) -> None:
        result.update(source=spec.source, arch=spec.arch, variant=spec.label or "")
        results.append(result)
        what = f"{result['source']} {result['arch']} {result['variant']}".rstrip()
        progress.item(f"{result['status']:<9}{what} ({result['seconds']:.2f} s)")

    jobs = min(args.jobs, len(specs))
    with cache:
        if args.threads and jobs > 1:
            from concurrent.futures import ThreadPoolExecutor, as_completed

            with ThreadPoolExecutor(jobs) as pool:
                futures = {pool.submit(_pool.compile_spec, s, cache): s for s in specs}
                for future in as_completed(futures):
                    finished(futures[future], future.result())
        else:
            opener = (url, chosen.secret)
            _pool.run_specs(specs, jobs, cache, opener, lambda i, r: finished(specs[i], r))
    progress.close()
    wall = time.perf_counter() - start
    return _summary(results, wall, jobs, args)


def _summary(
    results: list[dict[str, Any]], wall: float, jobs: int, args: argparse.Namespace
) -> int:
    counts = {s: sum(r["status"] == s for r in results) for s in ("compiled", "cached", "failed")}
    order = {"failed": 0, "compiled": 1, "cached": 2}
    results.sort(key=lambda r: (order[r["status"]], r["source"], r["arch"], r["variant"]))
    if args.json:
        import json

        print(json.dumps({"wall_seconds": round(wall, 3), "jobs": jobs, **counts,
                          "results": results}, indent=2))  # fmt: skip
    else:
        if _term.is_tty(sys.stdout):
            rows = [
                [_term.paint(r["status"], _colour(r["status"])), r["source"], r["arch"],
                 r["variant"] or "-", f"{r['seconds']:.2f}"]
                for r in results
            ]  # fmt: skip
            print(
                _term.table(["RESULT", "SOURCE", "ARCH", "VARIANT", "SECONDS"], rows, right="....r")
            )
        for r in results:
            if r["status"] == "failed":
                lines = [ln for ln in r["log"].splitlines() if ln.strip()][:_LOG_LINES]
                print(f"\nfailed: {r['source']} {r['arch']} {r['variant']}".rstrip())
                for ln in lines:
                    print(f"  {ln}")
        plural = "" if jobs == 1 else "s"
        print(
            f"{len(results)} compiles: {counts['compiled']} compiled, {counts['cached']} "
            f"already cached, {counts['failed']} failed in {wall:.2f} s ({jobs} job{plural})"
        )
        from cuforge.storage.events import dropped_words

        why = sorted({dropped_words(r["not_stored"]) for r in results if r.get("not_stored")})
        if why:  # a warm that warmed nothing must not read as if it had
            unstored = sum(bool(r.get("not_stored")) for r in results)
            print(f"{unstored} compiled but not stored: {', '.join(why)}")
    if counts["failed"]:
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
