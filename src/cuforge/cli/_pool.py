"""Running many compiles: in this process, or in worker processes.

Compiles run in worker processes when there are several and more than one CPU:
measured (``benchmarks/bench_cli.py``, 8 CUB kernels), threads never ran NVRTC
compiles in parallel in one interpreter (0.9-1.0x with 2 or 8 threads on a quiet
host) while processes scaled: 1.7x with 2 on two quiet cores, 6.1x with 8. Each worker opens
the cache once, from its URL and secret (passed to it, never through the environment),
compiles what it is sent, and closes the cache when it exits (its statistics are
persisted like any process's). A worker's warnings go back with its results and
the command says each once (``cli.say_warning``: one line per cache for all the
workers' handles); what a worker warns at its exit it shows itself. Workers are forked on
Linux (no driver is loaded in the parent before they start; ``warm``'s parent has
asked NVRTC for its supported archs, a library that starts no thread and holds no
device state), spawned elsewhere -- and started by a fork server (a fresh process)
where this process has sent an S3 request already: obstore's I/O runtime does not
survive a fork, so a forked worker's S3 level would be off (``storage.s3``); one
that only opened the cache forks workers that make clients of their own.

A compile is described by a :class:`Spec` (plain data) and answered by a result
dict: ``status`` (``compiled``, ``cached``, ``failed``), ``seconds``, ``log`` (the
compiler log of a failure, or why it was refused), ``refused`` (True: an include the
cache cannot track refused it, nothing was compiled), ``code`` (the binary, when
asked for), ``bytes``, and
for a compile through a cache ``stored`` (bool) with ``not_stored`` (why not:
``read-only``, ``unreachable``, ``too-large``, ``locked``, ``failed``,
``compiler changed``), ``store_levels``: (reason, detail) per level of the cache
(``_report.store_fields`` names them) and ``keys`` (hex: the keys it was stored
under, for ``_kept`` to look up once the command's handles are closed).

In a process of a ``cuforge run --warm-set`` job, each compile goes through the cache
in a recorder (:func:`recording`), in this process and in each worker: what the
command reads or stores joins the run's warm set, as a Python job's
``compile(cache=True)`` does.
"""

from __future__ import annotations

import io
import os
import sys
import time

from cuforge.cli import _programs
from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

__all__ = ["Spec", "recording", "run_specs"]


class Spec:
    """One compile: a source file (relative to the working directory) for one arch.
    ``label``: a warm manifest's variant ("" when its kernel has one); None for a
    ``cuforge compile`` spec."""

    __slots__ = ("arch", "defines", "includes", "label", "pre_include", "source", "std", "target")
    arch: str | None
    defines: list[str] | None
    includes: list[str] | None
    label: str | None
    pre_include: list[str] | None
    source: str
    std: str | None
    target: str

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            setattr(self, name, fields.get(name))

    def key(self) -> tuple[object, ...]:
        return tuple(
            tuple(v) if isinstance(v, list) else v
            for v in (getattr(self, n) for n in self.__slots__ if n != "label")
        )

    def __getstate__(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


def compile_spec(spec: Spec, cache: Any, want_code: bool = False) -> dict[str, Any]:
    """Compile ``spec`` through ``cache`` (None: uncached); never raises for the
    compile itself -- a failure is a result with its log."""
    from cuforge.compile.errors import CompileError

    start = time.perf_counter()
    result: dict[str, Any] = {}
    logs = io.StringIO()
    try:
        source = _programs.read_source(spec.source)
        fields = _programs.option_fields(
            source, spec.arch, spec.defines or [], spec.includes or [], spec.std,
            spec.pre_include or [],
        )  # fmt: skip
        program = _programs.make_program(source, fields, None)  # checked before any compile
        result["arch"] = program.options.arch
        obj, compiled, outcome, keys = _programs.compile_through(program, spec.target, logs, cache)
        result.update(status="compiled" if compiled else "cached", bytes=len(obj.code))
        if outcome is not None:
            result["stored"] = outcome.stored
            result["keys"] = [key.hex() for key in keys]
            if not outcome.stored:
                result["not_stored"] = outcome.reason
            # What each level did (a cache of one level: the outcome is its own).
            done = outcome.levels or (outcome,)
            result["store_levels"] = [(level.reason, level.detail) for level in done]
        if want_code:
            result["code"] = obj.code
    except CompileError as exc:
        result.update(status="failed", log=str(exc))
    except (UsageError, TypeError, ValueError) as exc:
        # A refused include's ways out, in the words of the command that ran: a warm
        # manifest's spec has a label ("" for a kernel's one variant), compile's none.
        log = _programs.refusal_in_words(exc, manifest=spec.label is not None)
        result.update(status="failed", log=log)
        if getattr(exc, "way", ""):  # refused before any compiler ran: not a compile error
            result["refused"] = True
    result["warnings"] = logs.getvalue().strip()
    result["seconds"] = time.perf_counter() - start
    return result


def recording(cache: Any) -> Any:
    """``cache`` as this command compiles through it: in a process of a ``cuforge run
    --warm-set`` job, in a recorder journaling every key read or stored into the run's
    warm set (``integrations.warmsets.recording``); ``cache`` itself otherwise (and
    for no cache), at the cost of one variable lookup. Close what it returns with
    :func:`done_recording`."""
    if cache is None or not os.environ.get("CUFORGE_RUN_JOURNAL"):
        return cache
    from cuforge.integrations.warmsets import recording as in_recorder

    return in_recorder(cache, "cli")


def done_recording(through: Any, cache: Any) -> None:
    """Close the journal of ``through`` when :func:`recording` wrapped ``cache`` in it
    (``cache`` itself stays open: it is the caller's)."""
    if through is not cache:
        through.close()


# -- worker processes ----------------------------------------------------------------------
_worker_cache: Any = None
#: The warnings a worker gave since its last result, ``(text, once)``, handed to the
#: parent with the result (``said``); None once the worker is exiting.
_worker_said: list[tuple[str, Any]] | None = None


def _keep_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A worker's warning: kept for the parent, which says each once per command
    (``cli.say_warning``: several workers each warn once for the same cache); at
    the worker's exit, shown as the process shows warnings."""
    if _worker_said is None:
        _shown(message, category, filename, lineno, file, line)
    else:
        _worker_said.append((str(message), getattr(message, "once", None)))


def _exiting() -> None:
    global _worker_said
    _worker_said = None


_shown: Any = None


def _worker_init(opener: tuple[str | None, bytes | None]) -> None:
    global _worker_cache, _worker_said, _shown
    import warnings
    from multiprocessing import util

    os.environ["CUFORGE_WATCH"] = os.environ.get("CUFORGE_WATCH", "0")
    _worker_said, _shown = [], warnings.showwarning
    warnings.showwarning = _keep_warning
    # Before the cache closes (exitpriority 10): what its close warns is shown here.
    util.Finalize(None, _exiting, exitpriority=20)
    url, secret = opener
    if url is None:
        return
    from cuforge.storage.urls import open_cache

    cache = open_cache(url, secret=secret)
    # Forked workers leave through os._exit (no atexit): close the cache, which
    # persists this worker's statistics, as multiprocessing shuts the worker down.
    util.Finalize(cache, cache.close, exitpriority=10)
    _worker_cache = recording(cache)  # this worker's own journal, in a cuforge run job
    if _worker_cache is not cache:
        util.Finalize(_worker_cache, _worker_cache.close, exitpriority=11)


def _worker_run(spec: Spec, want_code: bool) -> dict[str, Any]:
    result = compile_spec(spec, _worker_cache, want_code)
    if _worker_said:
        result["said"] = _worker_said[:]
        _worker_said.clear()
    return result


def _say(result: dict[str, Any]) -> dict[str, Any]:
    """A worker's result, its warnings said here (once per command)."""
    said = result.pop("said", None)
    if said:
        from cuforge.cli import say_warning

        for text, once in said:
            say_warning(text, once)
    return result


def _start_method() -> str | None:
    """How workers start (module docstring): ``fork`` on Linux unless a forked child
    could not use S3 (this process has used it), then ``forkserver``; the platform's
    default elsewhere. Never imports the S3 package: a process that has not has not
    used S3."""
    if not sys.platform.startswith("linux"):
        return None
    s3 = sys.modules.get("cuforge.storage.s3")
    return "forkserver" if s3 is not None and s3.forks_lose_s3() else "fork"


def run_specs(
    specs: Sequence[Spec],
    jobs: int,
    cache: Any,
    opener: tuple[str | None, bytes | None],
    done: Callable[[int, dict[str, Any]], None],
    want_code: bool = False,
) -> bool:
    """Compile every spec, calling ``done(index, result)`` as each finishes; whether
    worker processes compiled (their cache handles are closed when this returns).

    ``jobs`` > 1 (and more than one spec) runs ``min(jobs, len(specs))`` worker
    processes that open ``opener``, (the cache's URL, its secret) -- the secret
    passed to them, never through the environment; otherwise this process compiles
    through ``cache``. Either way through :func:`recording`.
    """
    jobs = min(jobs, len(specs))
    if jobs <= 1:
        through = recording(cache)
        try:
            for i, spec in enumerate(specs):
                done(i, compile_spec(spec, through, want_code))
        finally:
            done_recording(through, cache)
        return False
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context(_start_method())
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init,
                             initargs=(opener,)) as pool:  # fmt: skip
        futures = {pool.submit(_worker_run, spec, want_code): i for i, spec in enumerate(specs)}
        for future in as_completed(futures):
            done(futures[future], _say(future.result()))
    return True
