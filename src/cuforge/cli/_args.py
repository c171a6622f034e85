"""Argument parsing shared by every command: one-line usage errors and value types.

Every usage error -- argparse's own, a size or duration that does not parse, a cache
URL or path that cannot be used -- becomes :class:`UsageError`, which ``main`` prints
as ``cuforge <command>: error: <message>`` on one line and exits 2. Sizes and
durations go through ``cuforge.storage.units`` (the one parser), which requires a
unit on the command line (``30d``, ``2G``, ``512B``): a plain number is refused.
"""

from __future__ import annotations

import argparse
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, TypeAlias

    # What build_parser's add_subparsers returns: commands (and cache actions) register on it.
    Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"

__all__ = ["Parser", "UsageError", "arch_arg", "duration_arg", "size_arg"]


class UsageError(Exception):
    """A mistake in how the command was called (exit status 2)."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog  # None: the command that was running


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise :class:`UsageError` instead of printing
    usage and exiting; option names are never abbreviated (``--no`` is not ``--no-cache``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    _argv: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(args) if args is not None else []
        return super().parse_known_args(args, namespace)

    def _print_message(self, message: str, file: Any = None) -> None:
        """Print ``--help`` or ``--version`` (argparse's one way out) -- unlike
        argparse, letting a closed standard output raise: ``BrokenPipeError`` reaches
        ``main``, which exits 1 with nothing on stderr, as every command does
        (argparse swallowed it and exited 0). Flushed here, so the reader being gone
        is found now, not at the interpreter's exit."""
        if not message:
            return
        stream = file if file is not None else sys.stderr
        if stream is None:  # no standard stream at all (pythonw): as argparse, nothing
            return
        stream.write(message)
        stream.flush()

    def error(self, message: str) -> NoReturn:
        negative = _negative(self._argv, message, self._option_string_actions)
        if negative is not None:
            raise UsageError(f"{negative} (see {self.prog} --help)", self.prog)
        said = _swallowed(self._argv, message) or _dash_value(
            self._argv, message, self._option_string_actions
        )
        raise UsageError(f"{message}{said} (see {self.prog} --help)", self.prog)


def _negative(argv: list[str], message: str, actions: dict[str, argparse.Action]) -> str | None:
    """The line for ``--older-than -5d``: argparse takes ``-5d`` for an option and says
    "expected one argument"; a negative duration or size is what was given, and is
    never one (None when that is not the mistake). ``actions``: the parser's options,
    whose ``type`` says whether the flag takes a size or a duration."""
    found = re.fullmatch(r"argument (--[\w-]+): expected one argument", message)
    if found is None:
        return None
    from cuforge.storage.units import NEGATIVE  # the one wording (settings files, URLs)

    flag = found.group(1)
    action = actions.get(flag)
    taken = getattr(action, "type", None)
    if taken is size_arg:
        kind = "size"
    elif taken is duration_arg:
        kind = "duration"
    else:
        return None
    for i, word in enumerate(argv[:-1]):
        value = argv[i + 1]
        if word == flag and re.fullmatch(r"-[0-9.]\S*", value):
            return f"argument {flag}: {NEGATIVE.format(value=value, kind=kind, bare=value[1:])}"
    return None


def _swallowed(argv: list[str], message: str) -> str:
    """Why a positional is missing when ``--cache`` (whose value is optional) took it."""
    if "arguments are required" not in message:
        return ""
    for i, word in enumerate(argv[:-1]):
        if word == "--cache" and not argv[i + 1].startswith("-"):
            return (
                f": {argv[i + 1]!r} was taken as the value of --cache; write "
                "--cache=URL, or put the file before --cache"
            )
    return ""


def _dash_value(argv: list[str], message: str, actions: dict[str, argparse.Action]) -> str:
    """How to give a value that starts with ``-`` (``--name '-x*'``: argparse reads
    ``-x*`` as an option and says only "expected one argument"): ``--name=-x*``. Not
    said when the word after the flag is one of the command's options (``--name
    --json``: the value was left out)."""
    found = re.fullmatch(r"argument (\S+): expected one argument", message)
    if found is None:
        return ""
    flags = found.group(1).split("/")
    for i, word in enumerate(argv[:-1]):
        value = argv[i + 1]
        known = value.partition("=")[0] in actions or value == "--"
        if word in flags and value.startswith("-") and not known:
            joined = f"{word}={value}" if word.startswith("--") else f"{word}{value}"
            return (
                f" ({value!r} is read as an option: give a value that starts with '-' "
                f"joined to its flag, {joined})"
            )
    return ""


def size_arg(text: str) -> int:
    """``500M``/``2GiB`` -> bytes, for ``type=``."""
    from cuforge.storage.units import parse_size

    try:
        return parse_size(text)  # --max-size=-1G: "-1G is negative", as -1G alone says
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_arg(text: str) -> float:
    """``90s``/``12h``/``7d`` -> seconds, for ``type=``."""
    from cuforge.storage.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def arch_arg(text: str) -> str:
    """An architecture as ``ProgramOptions`` takes it (``sm_90``, ``compute_100f``), for
    ``type=`` of a filter, where a typo (``sm90``) would match nothing and say nothing."""
    from cuforge.compile.options import ProgramOptions

    try:
        ProgramOptions(arch=text)  # its own rule; with an arch given, no device is asked
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an architecture (expected e.g. sm_90, sm_90a or compute_90)"
        ) from None
    return text
