"""Argument parsing shared by every command: one-line usage errors and value types.

Every usage error -- argparse's own, a size or duration that does not parse, a cache
URL or path that cannot be used -- becomes :class:`UsageError`, which ``main`` prints
as ``cuforge <command>: error: <message>`` on one line and exits 2. Sizes and
durations go through ``cuforge.storage.units`` (the one parser).
"""

from __future__ import annotations

import argparse

__all__ = ["Parser", "UsageError", "duration_arg", "size_arg"]


class UsageError(Exception):
    """A mistake in how the command was called (exit status 2)."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog  # None: the command that was running


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise :class:`UsageError` instead of printing
    usage and exiting; option names are never abbreviated (``--no`` is not ``--no-cache``)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)", self.prog)


def size_arg(text: str) -> int:
    """``500M``/``2GiB`` -> bytes, for ``type=``."""
    from cuforge.storage.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_arg(text: str) -> float:
    """``90s``/``12h``/``7d`` -> seconds, for ``type=``."""
    from cuforge.storage.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
