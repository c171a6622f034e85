"""The ``cuforge`` command line (also ``python -m cuforge``).

Each subcommand lives in its own module exposing ``register(subparsers, parsers)``:
it adds its parser(s) and sets ``handler`` (a function ``args -> int``) as a default.
``parsers`` maps command names to their parsers, so a later module can extend an
earlier command (e.g. add ``--cache DIR`` to ``compile``). Adding a command is one
line in ``_COMMANDS``. Stdlib only; CUDA libraries load only when a command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import cuforge

#: Modules registered in this order; later ones may extend earlier parsers.
_COMMANDS = ("cuforge.cli.compile_cmd", "cuforge.cli.cache_cmd")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every command module registered."""
    parser = argparse.ArgumentParser(
        prog="cuforge", description="JIT-compile CUDA through a cache that is never wrong."
    )
    parser.add_argument("--version", action="version", version=f"cuforge {cuforge.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for module in _COMMANDS:
        importlib.import_module(module).register(subparsers, parsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit status (0 ok, 1 failed, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130


__all__ = ["build_parser", "main"]
