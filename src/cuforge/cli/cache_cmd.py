"""``cuforge cache ...`` and ``cuforge compile --cache``: see and use the program cache.

- ``cuforge compile FILE --cache [DIR]`` compiles through a FileStreamProgramCache
  (DIR, else ``$CUFORGE_CACHE_DIR``, else the user cache directory); ``--max-size``
  caps it. A value with ``://`` is a cache URL (``sqlite:///path.db``, see
  ``cuforge.storage.urls``).
- ``cuforge cache stats [--cache DIR] [--json]`` prints the counters summed over
  every process that used the cache, with its size and entry count.
- ``cuforge cache clear [--cache DIR]`` removes every entry (safe while others use it).
- ``cuforge cache dir`` prints the default cache directory.

Exit status: 0 ok, 2 usage error (e.g. a size that does not parse).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

ENV_DIR = "CUFORGE_CACHE_DIR"


def parse_size(text: str) -> int:
    """``"500M"`` -> bytes for argparse (see ``cuforge.storage.units.parse_size``)."""
    from cuforge.storage.units import parse_size as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cache_dir(args: argparse.Namespace) -> str:
    """The directory a command works on: --cache DIR, $CUFORGE_CACHE_DIR, or the default."""
    chosen = getattr(args, "cache", None)
    if isinstance(chosen, str) and chosen:
        return chosen
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    from cuforge.storage import default_cache_dir

    return default_cache_dir()


@contextlib.contextmanager
def _open_for_compile(args: argparse.Namespace) -> Iterator[Any]:
    if args.cache is None:
        yield None
        return
    if "://" in args.cache:  # a cache URL (sqlite:///path.db, ...)
        from cuforge.storage.urls import open_cache

        url = args.cache
        if args.max_size is not None and "max_size=" not in url:
            url += ("&" if "?" in url else "?") + f"max_size={args.max_size}"
        try:
            opened = open_cache(url)
        except OSError as exc:
            raise ValueError(f"cannot open the cache {args.cache}: {exc}") from None
        with opened as cache:
            yield cache
        return
    from cuforge.storage import FileStreamProgramCache

    with FileStreamProgramCache(cache_dir(args), max_size_bytes=args.max_size) as cache:
        yield cache


def register(subparsers: Any, parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Add ``--cache``/``--max-size`` to ``compile`` and the ``cache`` command group."""
    compile_parser = parsers["compile"]
    compile_parser.add_argument(
        "--cache",
        nargs="?",
        const="",
        default=None,
        metavar="DIR|URL",
        help=f"compile through a file cache (DIR, else ${ENV_DIR}, else the user cache dir) "
        "or a cache URL such as sqlite:///path/cache.db",
    )
    compile_parser.add_argument(
        "--max-size", type=parse_size, default=None, metavar="SIZE", help="cap the cache (e.g. 2G)"
    )
    compile_parser.set_defaults(cache_factory=_open_for_compile)

    cache = subparsers.add_parser("cache", help="inspect or clear the program cache")
    actions = cache.add_subparsers(dest="action", metavar="ACTION")
    for name, handler, help_text in (
        ("stats", _stats, "counters over all processes, size and entry count"),
        ("clear", _clear, "remove every entry"),
        ("dir", _dir, "print the default cache directory"),
    ):
        p = actions.add_parser(name, help=help_text)
        if name != "dir":
            p.add_argument("--cache", metavar="DIR", help="cache directory")
        if name == "stats":
            p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(handler=handler)
    cache.set_defaults(handler=lambda args: (cache.print_help(sys.stderr), 2)[1])
    parsers["cache"] = cache


def _stats(args: argparse.Namespace) -> int:
    from cuforge.storage import FileStreamProgramCache
    from cuforge.storage.units import format_size

    path = cache_dir(args)
    with FileStreamProgramCache(path) as cache:
        totals = cache.total_stats().as_dict()
        entries = len(cache)
        size = cache.size_bytes
    lookups = totals["hits"] + totals["misses"]
    report = {"path": path, "entries": entries, "size_bytes": size, **totals}
    report["hit_rate"] = round(totals["hits"] / lookups, 4) if lookups else None
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"cache directory     {path}")
    print(f"entries             {entries}")
    print(f"size                {format_size(size)}")
    rate = "-" if report["hit_rate"] is None else f"{report['hit_rate'] * 100:.1f} %"
    print(f"hit rate            {rate}")
    for name, value in totals.items():
        shown = format_size(value) if name.startswith("bytes") else str(value)
        print(f"{name.replace('_', ' '):<20}{shown}")
    return 0


def _clear(args: argparse.Namespace) -> int:
    from cuforge.storage import FileStreamProgramCache

    path = cache_dir(args)
    with FileStreamProgramCache(path) as cache:
        cache.clear()
    print(f"cleared {path}")
    return 0


def _dir(args: argparse.Namespace) -> int:
    print(cache_dir(args))
    return 0


__all__ = ["ENV_DIR", "cache_dir", "parse_size", "register"]
