"""``Program``: one source (CUDA C++, PTX or NVVM IR) and the options to compile it.

Guarantees:
- Construction validates code, code_type and options -- including that every set
  option is one the chosen backend honours -- and touches no compiler: an NVRTC
  program is created only inside ``compile``.
- ``compile`` either returns an ObjectCode of exactly ``target_type`` or raises:
  TypeError/ValueError for caller mistakes (before any backend runs), CompileError
  for backend failures (with the full log and flags). Warnings text from a
  successful compile goes to ``logs.write`` when ``logs`` is given.
- A fresh PTX result warns (RuntimeWarning) when the local driver is older than
  the compiler that wrote it.
- C++ compiles see the CUDA runtime headers and CCCL after the program's own
  ``include_path`` (``_toolkit`` decides which; the cache key pins them).
"""

from __future__ import annotations

import time

from cuforge.compile import _inputs
from cuforge.compile.options import ProgramOptions
from cuforge.compile.targets import (
    SUPPORTED_TARGETS,
    compile_target,
    normalize_code_type,
    normalize_target,
)

# Importing Program loads what constructing and validating one needs, nothing more:
# the cache pipeline (keys, header tracking, the watcher, the toolkit's headers, the
# compiler identity, storage) loads with the first compile(cache=), the compilers with
# the first compile, so a script that only compiles pays for neither at import.
TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from cuforge._typing import SupportsWrite
    from cuforge.compile.object_code import ObjectCode
    from cuforge.storage.base import ProgramCacheResource

_BACKENDS = {"c++": "NVRTC", "nvvm": "NVVM"}


class ProgramSource:
    """What a :class:`Program` is, as the compile cache reads it (the seam between the
    two, ``Program.source``): ``code_type`` (canonical), ``code`` (bytes), ``options``
    and ``closed``. Plain attributes, so the cache's hit path reads them at no cost;
    only the Program changes them (``closed``, at ``close()``)."""

    __slots__ = ("closed", "code", "code_type", "options")

    def __init__(self, code_type: str, code: bytes, options: ProgramOptions) -> None:
        self.code_type = code_type
        self.code = code
        self.options = options
        self.closed = False


class Program:
    """A compilable program; names and behaviour follow cuda.core's ``Program``.

    Args:
        code: str source for "c++" and "ptx"; str (text IR) or bytes (bitcode) for
            "nvvm".
        code_type: "c++", "ptx" or "nvvm" (case-insensitive).
        options: a ProgramOptions; None means ``ProgramOptions()`` (arch from the
            current device).

    Raises:
        TypeError: wrong type for code, code_type or options.
        ValueError: unknown code_type, empty code, or an option the backend for
            this code_type cannot honour (or ``arch`` missing without a device).
    """

    def __init__(
        self, code: str | bytes | bytearray, code_type: str, options: ProgramOptions | None = None
    ) -> None:
        # Canonical spellings skip normalisation: this is on the cache-hit path.
        code_type = code_type if code_type in SUPPORTED_TARGETS else normalize_code_type(code_type)
        code_bytes = _inputs.code_bytes(code, code_type)
        if options is None:
            options = ProgramOptions()
        elif not isinstance(options, ProgramOptions):
            raise TypeError(f"options must be a ProgramOptions, got {type(options).__name__}")
        #: What the compile cache reads of this program (the seam: ``ProgramSource``).
        self.source = ProgramSource(code_type, code_bytes, options)
        # Validate now (pure Python): unsupported options fail at construction.
        self._base_flags()

    @property
    def code_type(self) -> str:
        return self.source.code_type

    @property
    def options(self) -> ProgramOptions:
        return self.source.options

    @property
    def backend(self) -> str:
        """ "NVRTC", "NVVM", "nvJitLink" or "driver" (PTX without nvJitLink)."""
        if self.source.code_type == "ptx":
            from cuforge.compile.linker import linker_backend

            return "nvJitLink" if linker_backend() == "nvjitlink" else "driver"
        return _BACKENDS[self.source.code_type]

    def _base_flags(self, closed: bool = False) -> list[bytes]:
        code_type, options = self.source.code_type, self.source.options
        if code_type == "c++":
            if closed:
                from cuforge.compile.cache._key import closed_flags

                return closed_flags(options)
            return options.as_nvrtc_options()
        if code_type == "nvvm":
            return options.as_nvvm_options()
        if self.backend == "nvJitLink":
            return options.as_nvjitlink_options()
        return options.as_driver_linker_options()

    def _flags(self, target: str, closed: bool = False) -> list[bytes]:
        """The base flags plus the one a target implies (LTO output)."""
        flags = self._base_flags(closed)
        code_type, options = self.source.code_type, self.source.options
        # The whole rule, pair included: this is the one step every compile (cached or
        # not) reaches before a backend runs, so none can label one kind of output as
        # another (NVVM IR's PTX as a cubin), and no cache can be handed it to store.
        compile_target(code_type, options, target)
        if target == "ltoir" and not options.link_time_optimization:
            flags.append(b"--dlink-time-opt" if code_type == "c++" else b"-gen-lto")
        return flags

    def compile(
        self,
        target_type: str,
        name_expressions: Iterable[str | bytes] = (),
        logs: SupportsWrite | None = None,
        cache: ProgramCacheResource | bool | None = None,
    ) -> ObjectCode:
        """Compile to ``target_type`` ("ptx", "cubin" or "ltoir"; case-insensitive;
        valid targets depend on code_type).

        ``name_expressions`` (c++ only): expressions such as ``"k<float>"`` whose
        mangled names end up in ``ObjectCode.symbol_mapping``, keyed by the object
        given. ``logs``: anything with ``write(str)``; receives warnings on success.

        Raises:
            TypeError: bad name expression, or ``logs`` without ``write``.
            ValueError: unsupported target for this code_type, name expressions for
                a non-C++ program, or a target that contradicts the options.
            RuntimeError: the Program is closed.
            CompileError: the backend failed.

        ``cache``: a ``cuforge.utils.ProgramCacheResource``; ``True`` for the
        default cache (``cuforge.storage.config.default_cache``: the cache the
        command line would use -- ``$CUFORGE_CACHE``, a settings file... as
        docs/cache.md "Which cache" says; none when ``off``); None or False for
        none. A hit returns without compiling; concurrent misses compile once; a
        failing cache never fails the compile (see ``cuforge.compile.cache``).
        Headers the source includes are tracked; inputs no scan can be sure of
        (precompiled headers, NVVM ``use_libdevice``, ``#include_next``, ...) raise
        a ValueError that says what to do instead (docs/headers.md lists them).
        """
        src = self.source
        target = (
            target_type
            if target_type in SUPPORTED_TARGETS[src.code_type]
            else normalize_target(src.code_type, target_type)
        )
        names = _inputs.name_tuple(src.code_type, name_expressions)
        _inputs.check_target(src.options, target)  # before a cache hit could hide it
        if logs is not None and not callable(getattr(logs, "write", None)):
            raise TypeError(f"logs must have a write(str) method, got {type(logs).__name__}")
        if cache is True:  # the default cache, opened once per state of its variables
            from cuforge.storage.config import default_cache

            cache = default_cache()
        if cache is not None and cache is not False:
            return _run_pipeline(self, target, names, logs, cache)
        return self.compile_uncached(target, names, logs)

    def compile_uncached(
        self,
        target: str,
        name_expressions: tuple[str | bytes, ...],
        logs: Any,
        *,
        headers: dict[str, bytes] | None = None,
        captured: list[str] | None = None,
    ) -> ObjectCode:
        """Run the backend for ``target`` (already canonical) and wrap the result: the
        compile step of the cache pipeline (a seam: ``compile.cache`` calls it on a miss).

        ``headers`` (C++ only) makes a closed-world compile: NVRTC gets those files
        in memory and neither the user's include directories nor the source
        directory (see ``cache_key.closed_flags``). ``captured`` receives a
        non-empty compile log (the cache stores it with the entry, to replay on hits).
        """
        from cuforge import _warm
        from cuforge.compile import _compilelog
        from cuforge.compile.object_code import ObjectCode

        src = self.source
        if src.closed:
            raise RuntimeError("Program is closed")
        flags = self._flags(target, closed=headers is not None)
        code_type, options, code = src.code_type, src.options, src.code
        name = options.name or ""
        if _warm._state["warm"]:  # a compile in a process that declared itself warm
            _warm.note_compile("cuforge", name or code_type, _warm.compiling_through())
        mapping: dict[str | bytes, str] = {}
        debug = _compilelog.debug_enabled()
        started = time.perf_counter() if debug else 0.0
        if code_type == "c++":
            from cuforge.compile import _nvrtc
            from cuforge.compile.cache import _toolkit

            # The one place the toolkit's headers join: last, because NVRTC searches
            # include directories in order and a program's own include_path must win.
            flags += _toolkit.toolkit_include_flags()
            code, log, mapping = _nvrtc.compile_cpp(
                code, name, flags, target, name_expressions, headers
            )
        elif code_type == "nvvm":
            from cuforge.compile import _nvvm

            modules = [(code, name)]
            modules += [(extra, mod) for mod, extra in options.extra_sources or ()]
            code, log = _nvvm.compile_nvvm(modules, flags, bool(options.use_libdevice), name)
        elif self.backend == "nvJitLink":
            from cuforge.compile import _nvjitlink

            code, log = _nvjitlink.link([(code, "ptx", name)], flags, target, name)
        else:
            from cuforge.compile import _driver_linker

            code, log = _driver_linker.link_ptx(code, flags, name)
        if debug:
            _compilelog.compiled(self.backend, name, target, started, len(code), flags)
        if log.strip():
            if logs is not None:
                logs.write(log)
            if captured is not None:
                captured.append(log)
        obj = ObjectCode(code, target, name=name, symbol_mapping=mapping)
        if target == "ptx":
            from cuforge.compile import _versions
            from cuforge.compile._callers import outside_level

            _versions.warn_if_ptx_unloadable(code, stacklevel=outside_level())
        return obj

    def close(self) -> None:
        """Mark the Program closed; ``compile`` then raises RuntimeError. Idempotent.
        (No compiler handle outlives a ``compile`` call, so nothing else is freed.)"""
        self.source.closed = True

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        src = self.source
        return f"<Program {src.code_type} {src.options.name!r} arch={src.options.arch}>"


def _pipeline_first(program: Program, target: str, names: Any, logs: Any, cache: Any) -> ObjectCode:
    """The first compile with a cache: loads the pipeline (and ``_warm``), which
    installs the pipeline this process runs from then on, and runs that."""
    _load_pipeline()
    return _run_pipeline(program, target, names, logs, cache)


def _pipeline_warm(program: Program, target: str, names: Any, logs: Any, cache: Any) -> ObjectCode:
    """The pipeline of a warm process: a miss's compile is counted in ``cache``'s
    ``warm_compiles`` (``_warm.through`` tells ``compile_uncached`` the cache)."""
    run = _pipeline
    return _through(cache, lambda: run(program, target, names, logs, cache))


#: ``_pipeline_first`` until a compile with a cache has loaded the pipeline; then
#: ``compile.cache.pipeline``, or ``_pipeline_warm`` while the process is warm --
#: switched by ``mark_warm`` (``_warm.watch``), so the hit path of a process that is
#: not warm is what it was: one global lookup, one call, no check.
_run_pipeline: Callable[..., ObjectCode] = _pipeline_first
#: ``compile.cache.pipeline`` and ``_warm.through``: set by ``_load_pipeline``, before
#: anything reads them.
_pipeline: Callable[..., ObjectCode]
_through: Callable[[Any, Callable[[], ObjectCode]], ObjectCode]


def _load_pipeline() -> None:
    """Import the pipeline and ``_warm`` (not at import: a script that only compiles
    pays for neither, nor for the threading module ``_warm`` needs) and join
    ``_warm``'s watchers, which sets ``_run_pipeline`` for the state the process is
    in now. Threads that race here import the same modules and join once."""
    global _pipeline, _through
    from cuforge import _warm
    from cuforge.compile.cache import pipeline

    _pipeline, _through = pipeline, _warm.through
    _warm.watch(_switch_pipeline)


def _switch_pipeline(warm: bool) -> None:
    global _run_pipeline
    _run_pipeline = _pipeline_warm if warm else _pipeline


__all__ = ["Program"]  # ProgramSource: the seam of compile.cache, not public
