"""``cuforge compile FILE... [--arch A ...]``: compile sources through the cache.

Every FILE is compiled for every ``--arch`` (in parallel threads: NVRTC releases the
GIL). Outputs: ``-o OUT`` for a single output; ``--outdir DIR`` for any number
(``DIR/<stem>.<target>``, or ``DIR/<stem>.<arch>.<target>`` with several archs);
otherwise beside each source, named the same way. One line per output says where
it went, its size, the time and whether the cache served it (``--json``: one JSON
array). Caching is on by default (see ``_select`` for which cache); ``--no-cache``
compiles without one.

Exit status: 0 all compiled; 1 a compiler rejected a source (its log goes to stderr,
other outputs are still written); 2 usage errors (bad option values, unreadable
input, an output that cannot be written, a cache that cannot be opened).

A repeated command is normally answered by ``_direct`` before this module is even
imported; this is the full path, which also leaves the record ``_direct`` uses.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time

from cuforge.cli import _direct, _programs, _select
from cuforge.cli._args import UsageError, size_arg
from cuforge.cli._report import render

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add ``compile``."""
    p = subparsers.add_parser(
        "compile",
        help="compile .cu/.ptx/.ll files to cubin, PTX or LTO-IR through the cache",
        description="Compile each FILE (CUDA C++, or PTX/NVVM IR by suffix) for each --arch.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="source files (.cu, .ptx, .ll, .bc)")
    _programs.add_compile_options(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("-o", dest="output", metavar="OUT", help="output path (one output only)")
    out.add_argument("--outdir", metavar="DIR", help="directory for the outputs (created)")
    _select.add_cache_option(p, can_disable=True)
    p.add_argument("--max-size", type=size_arg, metavar="SIZE", help="cap a directory cache (2G)")
    p.add_argument("--json", action="store_true", help="print one JSON array of results")
    p.set_defaults(handler=run)


class Job:
    """One source compiled for one arch into one output file."""

    __slots__ = ("arch", "compiled", "error", "ms", "obj", "output", "program", "source")

    def __init__(self, source: _programs.SourceFile, arch: str | None, output: str) -> None:
        self.source, self.arch, self.output = source, arch, output
        self.program: Any = None
        self.obj: Any = None
        self.compiled = False
        self.error: str | None = None
        self.ms = 0.0


def _output_for(args: argparse.Namespace, path: str, arch: str | None, several_archs: bool) -> str:
    if args.output:
        return args.output
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"{stem}.{arch}.{args.target}" if several_archs and arch else f"{stem}.{args.target}"
    folder = args.outdir if args.outdir else os.path.dirname(path)
    return os.path.join(folder, name)


def plan(args: argparse.Namespace) -> list[Job]:
    """Read every source, build every Program (validating all options before any
    compile starts) and name every output. Raises UsageError."""
    archs: list[str | None] = list(dict.fromkeys(args.arch)) if args.arch else [None]
    if args.output and len(args.files) * len(archs) > 1:
        raise UsageError("-o names one output; use --outdir DIR for several files or archs")
    if args.outdir:
        try:
            os.makedirs(args.outdir, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--outdir {args.outdir}: {exc.strerror or exc}") from None
    jobs, seen = [], {}
    for path in args.files:
        source = _programs.read_source(path)
        for arch in archs:
            fields = _programs.option_fields(
                source, arch, args.defines, args.includes, args.std, args.pre_include
            )
            job = Job(source, arch, _output_for(args, path, arch, len(archs) > 1))
            job.program = _programs.make_program(source, fields)
            job.arch = job.program.options.arch
            other = seen.setdefault(os.path.abspath(job.output), path)
            if other is not path:
                raise UsageError(f"{other} and {path} would both be written to {job.output}")
            jobs.append(job)
    return jobs


def _compile(job: Job, target: str, cache: Any) -> None:
    from cuforge.compile.errors import CompileError

    logs = io.StringIO()
    start = time.perf_counter()
    try:
        job.obj, job.compiled = _programs.compile_through(job.program, target, logs, cache)
    except CompileError as exc:
        job.error = str(exc)
    except (TypeError, ValueError) as exc:  # e.g. an include no scan can track
        job.error = f"{type(exc).__name__}: {exc}"
    job.ms = (time.perf_counter() - start) * 1000
    if logs.getvalue().strip():
        sys.stderr.write(f"{job.source.path} ({job.arch}): {logs.getvalue().rstrip()}\n")


def run(args: argparse.Namespace) -> int:
    """Compile every job; see the module docstring for exit statuses."""
    choice = _select.choose(args)
    if choice.url is None and args.max_size is not None:
        raise UsageError("--max-size applies to a cache; it was given with no cache")
    jobs = plan(args)
    cache = _select.open_choice(choice, args.max_size) if choice.url is not None else None
    with cache if cache is not None else contextlib.nullcontext():
        if len(jobs) == 1:
            _compile(jobs[0], args.target, cache)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
                list(pool.map(lambda j: _compile(j, args.target, cache), jobs))
        results = []
        for job in jobs:
            if job.error is not None:
                sys.stderr.write(f"{job.source.path} ({job.arch}): {job.error}\n")
                results.append(
                    {"source": job.source.path, "arch": job.arch, "target": args.target,
                     "error": job.error}
                )  # fmt: skip
                continue
            try:
                with open(job.output, "wb") as f:
                    f.write(job.obj.code)
            except OSError as exc:
                raise UsageError(f"cannot write {job.output}: {exc.strerror or exc}") from None
            status = "off" if cache is None else ("miss" if job.compiled else "hit")
            results.append(
                {"source": job.source.path, "arch": job.arch, "target": args.target,
                 "output": job.output, "bytes": len(job.obj.code), "ms": round(job.ms, 3),
                 "cache": status}
            )  # fmt: skip
        failed = any(job.error is not None for job in jobs)
        if not failed and cache is not None and getattr(args, "argv", None) is not None:
            done = [(j.source, j.program, args.target, j.output, j.obj) for j in jobs]
            _direct.remember(args.argv, cache, "json" if args.json else "text", done)
    print(render(results, args.json))
    return 1 if failed else 0
