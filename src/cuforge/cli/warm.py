"""``cuforge warm MANIFEST [--jobs N] [--fail-on-miss]``: fill a cache ahead of use.

Compiles every kernel x arch x option set a TOML manifest lists (``_warmfile``)
into the chosen cache, ``--jobs`` at a time: threads by default, since NVRTC
releases the GIL while it compiles (``--processes`` uses worker processes instead;
``benchmarks/bench_cli.py`` measures both). Each compile goes through
``Program.compile(cache=)``, so what is already cached is only looked up, and
concurrent misses of one key (from other hosts or processes) compile once.

Shows a progress bar on a terminal and one line per compile otherwise, then a
summary table: compiled, already cached, failed -- with the first lines of each
failure's log. ``--fail-on-miss`` makes anything that had to be compiled a failure:
CI can prove a cache is warm.

Exit status: 0 all compiled or cached; 1 a compile failed, or (``--fail-on-miss``)
something was not cached yet; 2 usage errors.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time

from cuforge.cli import _programs, _select, _term, _warmfile
from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["register"]

_LOG_LINES = 4


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "warm",
        help="compile the kernels a TOML manifest lists into the cache",
        description="Compile every kernel x arch x option set of MANIFEST into the cache.",
    )
    p.add_argument("manifest", metavar="MANIFEST", help="TOML file (see docs/cli.md)")
    p.add_argument("--jobs", "-j", type=_jobs, default=os.cpu_count() or 1, metavar="N",
                   help="compile N at a time (default: the number of CPUs)")  # fmt: skip
    p.add_argument("--processes", action="store_true", help="use worker processes, not threads")
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


# -- one compile (runs in a thread or a worker process) --------------------------------
_worker_cache: Any = None


def _run_spec(spec: _warmfile.Spec, cache: Any) -> dict[str, Any]:
    from cuforge.compile.errors import CompileError

    start = time.perf_counter()
    result: dict[str, Any] = {"source": spec.source, "arch": spec.arch, "variant": spec.label}
    try:
        source = _programs.read_source(spec.source)
        fields = _programs.option_fields(
            source, spec.arch, spec.defines, spec.includes, spec.std, spec.pre_include
        )
        program = _programs.make_program(source, fields)
        obj, compiled = _programs.compile_through(program, spec.target, io.StringIO(), cache)
        result.update(status="compiled" if compiled else "cached", bytes=len(obj.code))
    except CompileError as exc:
        result.update(status="failed", log=str(exc))
    except (UsageError, TypeError, ValueError) as exc:
        result.update(status="failed", log=str(exc))
    result["seconds"] = round(time.perf_counter() - start, 4)
    return result


def _worker_init(url: str) -> None:
    global _worker_cache
    from cuforge.storage.urls import open_cache

    _worker_cache = open_cache(url)


def _worker_run(spec: _warmfile.Spec) -> dict[str, Any]:
    return _run_spec(spec, _worker_cache)


# -- the command -------------------------------------------------------------------------
def _warm(args: argparse.Namespace) -> int:
    folder, specs = _warmfile.load(args.manifest)
    chosen = _select.choose(args)
    if chosen.url is None:
        raise UsageError(f"caching is off ({chosen.origin}): warm has nothing to fill")
    cache = _select.open_choice(chosen)  # opened here too: bad URLs fail before any work
    # Worker processes open the cache by URL: a relative directory must not move with
    # the chdir below.
    url = chosen.url if "://" in chosen.url or "," in chosen.url else os.path.abspath(chosen.url)
    os.chdir(folder)  # compile as `cuforge compile` run from the manifest's directory would
    progress = _term.Progress(len(specs), "warming", sys.stderr if args.json else None)
    results: list[dict[str, Any]] = []
    start = time.perf_counter()

    def finished(result: dict[str, Any]) -> None:
        results.append(result)
        what = f"{result['source']} {result['arch']} {result['variant']}".rstrip()
        progress.item(f"{result['status']:<9}{what} ({result['seconds']:.2f} s)")

    jobs = min(args.jobs, len(specs))
    with cache:
        if args.processes and jobs > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(jobs, initializer=_worker_init, initargs=(url,)) as pool:
                for result in pool.map(_worker_run, specs):
                    finished(result)
        elif jobs > 1:
            from concurrent.futures import ThreadPoolExecutor, as_completed

            with ThreadPoolExecutor(jobs) as pool:
                for future in as_completed([pool.submit(_run_spec, s, cache) for s in specs]):
                    finished(future.result())
        else:
            for spec in specs:
                finished(_run_spec(spec, cache))
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
        print(
            f"{len(results)} compiles: {counts['compiled']} compiled, {counts['cached']} "
            f"already cached, {counts['failed']} failed in {wall:.2f} s ({jobs} jobs)"
        )
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
