"""The ``cuforge`` command line (also ``python -m cuforge``).

Commands, one module each: ``compile`` (``compile.py``), ``cache`` with ``stats``,
``zero-stats``, ``ls``, ``show``, ``dir`` (``cache.py``), ``verify``, ``prune``,
``clear`` (``cache_maint.py``) and ``explain`` (``explain.py``), ``warm``
(``warm.py``), ``run`` (``run.py``) and ``doctor`` (``doctor.py``). Each module's
``register`` adds its parsers and sets ``handler`` (``args -> exit status``).

A repeated ``cuforge compile`` is first offered to ``_direct``, which answers a
hit it can prove without importing argparse or the compile layer; everything
else goes through argparse (stdlib, fast to import; a third-party parser would
buy nothing here and cost start-up time).

Exit status: 0 ok; 1 the command ran and found a failure (a compile error, bad
entries, a miss for ``explain`` or ``warm --fail-on-miss``, a cache server that
cannot be reached), or standard output's reader went away (nothing on stderr) or it
could not take the report (one line: ``cannot write standard output: ...``); 2
usage errors, one line on stderr, never a traceback -- also a compiler library that
is not installed (``ToolkitNotFoundError``: the line names the extra to install,
``pip install 'cuforge[cu13]'``); 130 interrupted.
"""

from __future__ import annotations

import io  # loaded with the interpreter: costs nothing
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

    from cuforge.cli._args import Parser

__all__ = ["build_parser", "job_environment", "main", "say_warning"]


def build_parser() -> Parser:
    """The full argument parser, with every command registered."""
    import cuforge
    from cuforge.cli import cache, cache_maint, compile, doctor, explain, run, warm
    from cuforge.cli._args import Parser

    parser = Parser(
        prog="cuforge",
        description="JIT-compile CUDA through a cache that is never wrong.",
    )
    parser.add_argument("--version", action="version", version=f"cuforge {cuforge.__version__}")
    # Read by _verbosity.split before parsing (so they also work after the command);
    # declared here for --help.
    parser.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="also print cuforge's debug log: hits, misses and why, compiles",
    )  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    # prog given: argparse would otherwise build a help formatter (and import shutil) now
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=Parser, prog="cuforge"
    )
    compile.register(commands)
    actions = cache.register(commands)
    cache_maint.register(actions)
    explain.register(actions)
    warm.register(commands)
    run.register(commands)
    doctor.register(commands)
    return parser


_quiet = False
#: The variables the running command set for its own process, the user having set
#: none of them (``_run``): never handed on to a job (:func:`job_environment`).
_set_here: list[str] = []


def job_environment() -> dict[str, str]:
    """This process's environment as the user gave it, for a program the command
    starts (``cuforge run``'s job): the variables the command line set for itself
    (``CUFORGE_WATCH=0``, where the user set none) are left out; one the user set is
    kept as they set it. So is a ``LC_CTYPE`` Python's start-up added (PEP 538 locale
    coercion, on a host without the user's locale): on Linux, one that is in
    ``os.environ`` but not in ``/proc/self/environ`` (the environment the process was
    started with, which ``setenv`` does not change) is left out; where that file
    cannot be read, the environment is handed on as it is."""
    import os

    env = dict(os.environ)
    for name in _set_here:
        env.pop(name, None)
    if "LC_CTYPE" in env and sys.platform.startswith("linux"):
        try:
            with open("/proc/self/environ", "rb") as f:
                started = f.read().split(b"\0")
        except OSError:
            return env
        if not any(item.startswith(b"LC_CTYPE=") for item in started):
            del env["LC_CTYPE"]  # added by the interpreter, not given by the user
    return env


#: What the running command has warned about: a cache handle's ``once`` (its cache,
#: the kind of failure), else the line itself (:func:`say_warning`).
_said: set[object] = set()


def _warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    say_warning(str(message), getattr(message, "once", None))


def say_warning(text: str, once: object = None) -> None:
    """One ``cuforge: warning:`` line, said once per command: a warning a cache handle
    gives once (``once``: its cache and the kind of failure) is said once for all the
    handles on that cache -- this process's and its worker processes' (``_pool``
    hands theirs here) -- and any other line once as it is."""
    said = (text,) if once is None else once
    if said in _said:
        return
    _said.add(said)
    if not _quiet:
        print(f"cuforge: warning: {_one_line(in_cli_words(text))}", file=sys.stderr)


def _one_line(message: str) -> str:
    """An error or warning line with each control character escaped -- a file name's
    newline as ``\\n`` (``_names.printed``) -- so it stays the one line it is."""
    from cuforge._names import printed

    return printed(message)


def in_cli_words(message: str) -> str:
    """A library message as the command line says it, after its own ``cuforge:``:
    the message's own name for cuforge goes (``cuforge: X`` -> ``X``, ``cuforge Redis
    cache H: ...`` -> ``Redis cache H: ...``: a line says ``cuforge:`` once); the
    counters it names are ``cuforge cache stats``' lines (``stats().write_failures`` ->
    ``cuforge cache stats (write failures)``, ``counted in warm_compiles`` ->
    ``counted in cuforge cache stats (warm compiles)``, and a warm compile that is not
    counted there says why: ``_WARM_COUNTED``; nor is anything of a command whose cache
    could not write its counters: ``_COUNTS_LOST``), and its ways out are a cache
    URL's (``?trust=shared``, not ``trust_shared=True``;
    ``CachePathError.in_url_words``). The Python warnings keep their text."""
    import re  # only when something is said

    from cuforge.storage import CachePathError
    from cuforge.storage.stats import CacheStats

    def counters(found: re.Match[str]) -> str:
        names = found.group(1) or found.group(2)
        return (
            f"cuforge cache stats ({names.replace('_', ' ')})" if names else "cuforge cache stats"
        )

    if "marked warm (" in message:  # a warm compile's: where it was counted, per cause
        from cuforge._warm import COUNTED

        for cause, said in COUNTED.items():
            message = message.replace(said, _WARM_COUNTED[cause])
    if "SQLiteProgramCache " in message:  # a lazy sqlite:// level's refusal, in a warning
        message = _sqlite_level_words(message)
    if "(total_stats())" in message:  # a remote handle's warning: loaded by then
        from cuforge.storage.remote import LATER_FAILURES

        for answered, said in LATER_FAILURES.items():
            message = message.replace(said, _LATER_FAILURES[answered])
    if "could not be written either" in message:  # a cache whose counters cannot be
        from cuforge.storage.events import COUNTS_LOST  # written: loaded by then

        message = message.replace(COUNTS_LOST, _COUNTS_LOST)
    # A tier's own counts live in its handle only: a command keeps none of them.
    message = message.replace(
        "counted in this handle's stats() without a warning", "not warned about"
    )
    # "cuforge: ...", and "cuforge " before a cache's or a mirror's name (not "cuforge
    # compiles ...", where cuforge is the subject)
    message = re.sub(r"^cuforge(?:: | (?=[\w+-]+ cache\b|cache level\b|mirror\b))", "", message)
    # "stats().write_failures", "stats() (read_failures, write_failures)", "stats()"
    pattern = r"(?<![\w.])stats\(\)(?:\.(\w+)| \(([a-z_]+(?:, [a-z_]+)*)\))?"
    message = re.sub(pattern, counters, message)
    fields = "|".join(CacheStats().as_dict())
    message = re.sub(
        rf"\bcounted in ({fields})\b",
        lambda m: f"counted in cuforge cache stats ({m.group(1).replace('_', ' ')})",
        message,
    )
    return CachePathError.in_url_words(message)


def _sqlite_level_words(message: str) -> str:
    """An ``sqlite://`` level's refusal (a directory, another program's database) quoted
    in a warning -- a tier's level opened at first use -- with its way out in the
    command line's words: the level in the cache URL, not ``SQLiteProgramCache``. An
    error a command exits with names the flag, variable or file (``_select.explain``)."""
    import re

    from cuforge.storage.sqlite import FOREIGN_WAY_OUT

    message = message.replace(
        FOREIGN_WAY_OUT, "give that sqlite:// level of the cache URL a path of its own, or "
        "move that file away",
    )  # fmt: skip
    return re.sub(
        r"SQLiteProgramCache path (.+?) is a directory; give the path of a database file "
        r"\(e\.g\. \.\.\./program-cache\.db\)",
        lambda m: (
            f"sqlite:// path {m.group(1)} is a directory, not a database file; give "
            f"that level of the cache URL the path of a database file (such as "
            f"sqlite://{m.group(1).rstrip('/')}/program-cache.db)"
        ),
        message,
    )


#: ``_warm.COUNTED`` in the command line's words, per cause: a command's own counts
#: (``compiles_after_warm()``, a handle's ``stats()``) end with it, so only a cache
#: that keeps shared counters and is written to counts it in ``cuforge cache stats``.
_NOT_COUNTED = "(not counted in cuforge cache stats: "
_WARM_COUNTED = {
    "shared": "(counted in cuforge cache stats (warm compiles))",
    "no-cache": _NOT_COUNTED + "no cache is in use)",
    "read-only": _NOT_COUNTED + "the cache is read-only, and a read-only cache records "
    "no counters)",
    "memory": _NOT_COUNTED + "a memory:// cache's counters are gone when this command exits)",
    "none": _NOT_COUNTED + "the cache keeps no counters)",
}

#: ``storage.events.COUNTS_LOST`` in the command line's words: the cache's counters
#: could not be written (a full disk, a ``tmp/`` and ``stats/`` that cannot be), so
#: ``cuforge cache stats`` counts nothing of this command.
_COUNTS_LOST = (
    "Later write failures are not warned about, and not counted in cuforge cache stats; "
    "neither is any other count of this command (misses included): the cache's counters "
    "could not be written either"
)

#: ``storage.remote.LATER_FAILURES`` in the command line's words, per cause: a
#: command's counts reach the server's counters only through a flush the server
#: accepts, and none is sent while backing off, so when the command ends first --
#: the server down, refusing it (a password or rights it does not grant), or not sent
#: to at all -- they are not kept.
_LATER = "Later failures are counted in cuforge cache stats (read failures, write failures) "
_LATER_FAILURES: dict[bool | None, str] = {
    False: _LATER + "without a warning only if the server answers again before this command "
    "ends: while it is down, the command's counts (misses included) are not kept.",
    True: _LATER + "without a warning only if the server accepts this command's counts before "
    "it ends: while it refuses them (as a server refusing the password or the rights does), "
    "the command's counts (misses included) are not kept.",
    None: _LATER + "without a warning only if this command can send them to the server before "
    "it ends: while it cannot (the cause above), the command's counts (misses included) are "
    "not kept.",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit status."""
    from cuforge.cli import _verbosity

    args = list(sys.argv[1:] if argv is None else argv)
    undo = _escape_names()
    # Warnings are said as the command line's lines from here on, on the fast hit path
    # too (a cache server failing under it warns before any parsing), once per command.
    global _quiet
    _quiet = _verbosity.split(args)[1] < 0
    import warnings  # loaded on every path by then (the fast path's failopen, _run)

    shown = warnings.showwarning
    warnings.showwarning = _warning  # one line, not a file:line dump, for people
    try:
        digest = None
        if args[:1] == ["compile"] and not _verbosity.verbose(args):
            from cuforge.cli import _direct

            try:
                digest = _direct.request_digest(args[1:])
            except OSError:  # the working directory or cuforge's files vanished
                digest = None
            served = None if digest is None else _direct.serve(args[1:], digest)
            if served is not None:
                return served
        guarded = _guard_stdout()  # the full path only: the fast path's one line is said
        try:  # in _direct, at no cost to a hit
            return _flushed(_run(args, digest))
        finally:
            if guarded is not None:
                _unguard_stdout(guarded)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (``| head``): as the full path does
        return _reader_gone()
    except StandardOutputError as exc:  # the fast path's report could not be written
        return _stdout_failed(args, exc)
    finally:
        warnings.showwarning = shown
        _quiet = False
        _said.clear()
        if undo:
            import contextlib  # loaded by then on every path

            for stream, errors in undo:
                with contextlib.suppress(AttributeError, ValueError, OSError):
                    stream.reconfigure(errors=errors)  # type: ignore[attr-defined]


#: The error handlers of a standard stream :func:`_escape_names` replaces: those that
#: raise, print a byte that is not UTF-8 raw or as ``\udcfc``.
_REPLACED = ("strict", "backslashreplace", "surrogateescape")


def _escape_names() -> list[tuple[object, str]]:
    """Make standard output and error print what their encoding cannot show escaped
    -- a file name's byte that is not UTF-8 as ``\\xfc`` (``cuforge._names``), any
    other character as ``backslashreplace`` does -- rather than fail (strict), print
    it as ``\\udcfc`` (backslashreplace) or raw (surrogateescape); docs/cli.md says
    so. Returns each stream changed with its handler before, to put back."""
    from cuforge import _names

    undo: list[tuple[object, str]] = []
    for stream in (sys.stdout, sys.stderr):
        errors = getattr(stream, "errors", None)
        if errors not in _REPLACED:
            continue
        try:
            stream.reconfigure(errors=_names.register())  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            continue
        undo.append((stream, str(errors)))
    return undo


class StandardOutputError(OSError):
    """Standard output could not take what a command printed (``> /dev/full``, a full
    disk): said as that, not as a bare ``[Errno 28]`` that names no file."""


def _guard_stdout() -> TextIO | None:
    """Point ``sys.stdout`` at a stream like it whose failed writes raise
    :class:`StandardOutputError` (a closed pipe stays ``BrokenPipeError``); the stream
    it replaced, to put back, or None where stdout is no real descriptor (``main()``
    called under a capture). A write costs nothing more until it fails."""
    out = sys.stdout
    if out is not sys.__stdout__ or not isinstance(out, io.TextIOWrapper):
        return None
    try:
        fd = out.fileno()
        out.flush()
        raw = _StdoutFile(fd, "w", closefd=False)
        buffered = isinstance(out.buffer, io.BufferedWriter)  # not with PYTHONUNBUFFERED
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(raw) if buffered else raw, encoding=out.encoding, errors=out.errors,
            line_buffering=out.line_buffering, write_through=out.write_through,
        )  # fmt: skip
    except (OSError, ValueError, AttributeError):
        return None
    return out


def _flushed(status: int) -> int:
    """``status``, once what the command printed has reached standard output (a
    failure to write it is then said, not lost at exit) -- but after a usage error,
    which may be that very write (``-o: cannot write -``), the line said is the one."""
    try:
        sys.stdout.flush()
    except StandardOutputError:
        if status != 2:
            raise
        _reader_gone()
    return status


def _unguard_stdout(out: TextIO) -> None:
    import contextlib

    guard, sys.stdout = sys.stdout, out
    with contextlib.suppress(OSError, ValueError):  # said already, when it failed
        guard.flush()
    if isinstance(guard, io.TextIOWrapper):
        with contextlib.suppress(OSError, ValueError):
            guard.detach()  # leaves the descriptor open: it is the interpreter's stdout


def _stdout_error(exc: OSError) -> OSError:
    return exc if isinstance(exc, BrokenPipeError) else StandardOutputError(exc.errno, exc.strerror)


class _StdoutFile(io.FileIO):
    """Standard output's descriptor, whose failed write says it was standard output's."""

    def write(self, data: Any, /) -> int:
        try:
            return super().write(data)
        except OSError as exc:
            raise _stdout_error(exc) from None


def _stdout_failed(argv: list[str], exc: OSError) -> int:
    """Exit 1 with one line naming standard output, as a command that ran and failed;
    stdout is pointed at /dev/null so the exit's flush says nothing more."""
    print(f"{_prog(argv)}: error: cannot write standard output: {exc.strerror}", file=sys.stderr)
    _reader_gone()
    return 1


def _run(argv: list[str], digest: str | None = None) -> int:
    import os

    from cuforge.cli import _verbosity

    argv, level = _verbosity.split(argv)
    undo_log = _verbosity.configure(level)

    # A command-line process compiles each source once: the header watcher (inotify)
    # would cost more to start than the stat checks it saves. CUFORGE_WATCH=1 keeps it.
    # Set for this command and its worker processes, and put back after (main() may be
    # called as a function); never handed on to a job `cuforge run` starts.
    watch = os.environ.get("CUFORGE_WATCH")
    if watch is None:
        os.environ["CUFORGE_WATCH"] = "0"
        _set_here.append("CUFORGE_WATCH")
    try:
        return _dispatch(argv, digest)
    finally:
        undo_log()
        if watch is None:
            os.environ.pop("CUFORGE_WATCH", None)
            _set_here.remove("CUFORGE_WATCH")


def _dispatch(argv: list[str], digest: str | None) -> int:
    from cuforge.cli._args import UsageError

    parser = build_parser()
    try:
        try:
            args, extra = parser.parse_known_args(argv)
        except UsageError:
            # "argument COMMAND: invalid choice: '/tmp/x'" for `cuforge --cache /tmp/x
            # cache stats`: say where the option goes instead
            hint = _misplaced(parser, argv)
            if hint is None:
                import re

                raised = sys.exc_info()[1]
                found = re.search(r"invalid choice: '([^']*)'", str(raised))
                what = "action" if "argument ACTION" in str(raised) else "command"
                hint = (
                    None if found is None else _unknown_before(parser, argv, found.group(1), what)
                )
                if hint is None:
                    raise
                hint = f"{hint}: {raised}"
            raise UsageError(hint) from None
        if extra:  # named against the command they were given to, not the top level
            raise UsageError(
                _misplaced(parser, argv)
                or f"unrecognized arguments: {' '.join(extra)} (see {_prog(argv)} --help)"
            )
        handler = getattr(args, "handler", None)
        if handler is None:  # bare `cuforge`: one line, as a bare `cuforge cache` says
            raise UsageError(
                f"a command is required: {', '.join(_commands(parser))} (see cuforge --help)"
            )
        if args.command == "compile":
            args.request_digest = digest  # what _direct names its hit record by
        return int(handler(args))
    except UsageError as exc:
        prog = exc.prog or _prog(argv)
        print(f"{prog}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_gone()
    except StandardOutputError as exc:
        return _stdout_failed(argv, exc)
    except OSError as exc:  # a cache that cannot be reached or written while in use
        print(f"{_prog(argv)}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    except Exception as exc:
        from cuforge._cuda import ToolkitNotFoundError  # imports nothing CUDA

        if not isinstance(exc, ToolkitNotFoundError):
            raise
        # No compiler library (a plain `pip install cuforge`): the set-up, not the
        # sources, is what to fix -- one line naming the extra to install.
        message = " ".join(str(exc).split())
        print(f"{_prog(argv)}: error: {message}", file=sys.stderr)
        return 2


_TOP_LEVEL = ("-h", "--help", "--version")


def _misplaced(parser: Parser, argv: list[str]) -> str | None:
    """When ``argv`` starts with options of the command named after them (``--cache
    /tmp/x cache stats``, ``--json cache ls``): the line saying they go after the
    command, with the command as it should read. None when that is not the mistake
    (an option no command has, no command named, nothing before it)."""
    import argparse
    import shlex

    commands: dict[str, Parser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = dict(action.choices)
    at = next((i for i, word in enumerate(argv) if word in commands), None)
    if not at or not argv[0].startswith("-") or argv[0] in _TOP_LEVEL:
        return None
    lead, rest = argv[:at], argv[at:]
    known = set(commands[rest[0]]._option_string_actions)
    for action in commands[rest[0]]._actions:  # cache ACTION: the action's options too
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(rest[1]) if len(rest) > 1 else None
            for sub in [chosen] if chosen is not None else action.choices.values():
                known.update(sub._option_string_actions)
    name = lead[0].split("=", 1)[0]
    if name not in known:
        return None
    return (
        f"{name} is an option of the command, so it goes after it: "
        f"cuforge {shlex.join(rest + lead)}"
    )


def _unknown_before(parser: Parser, argv: list[str], choice: str, what: str) -> str | None:
    """When the word before the invalid ``what`` (command or action) ``choice`` is an
    option no parser knows (``cuforge --cach /tmp/x cache stats``: ``/tmp/x`` read as
    the command): the words saying so; None otherwise (a mistyped command itself)."""
    import argparse

    known: set[str] = set()
    todo = [parser]
    while todo:
        each = todo.pop()
        known.update(each._option_string_actions)
        for action in each._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    at = argv.index(choice) if choice in argv else 0
    word = argv[at - 1] if at > 0 else ""
    if not word.startswith("-") or word.split("=", 1)[0] in known:
        return None
    return f"unknown option {word} (so {choice!r} after it was read as the {what})"


def _commands(parser: Parser) -> list[str]:
    """The command names ``parser`` knows, in the order its help lists them."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _reader_gone() -> int:
    """Exit status 1 with nothing on stderr when standard output's reader went away
    (``| head -c0``): not a usage error, and no "Exception ignored" when the
    interpreter flushes what is still buffered at exit (stdout is pointed at
    /dev/null for that)."""
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no real descriptor (main() as a call)
        pass
    return 1


def _prog(argv: list[str]) -> str:
    words = ["cuforge"]
    if argv and not argv[0].startswith("-"):
        words.append(argv[0])
        if argv[0] == "cache" and len(argv) > 1 and not argv[1].startswith("-"):
            words.append(argv[1])
    return " ".join(words)
