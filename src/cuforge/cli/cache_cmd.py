"""``cuforge cache ...`` and ``cuforge compile --cache``: see and use the program cache.

- ``cuforge compile FILE --cache [DIR|URL]`` compiles through a program cache;
  ``--max-size`` caps a directory cache.
- ``cuforge cache stats [--cache DIR|URL] [--json]`` prints the counters summed over
  every process (every host, for Redis) that used the cache, with its size and
  entry count.
- ``cuforge cache clear [--cache DIR|URL]`` removes every entry (safe while others use it).
- ``cuforge cache dir`` prints the default cache directory.

Which cache: ``--cache`` (a cache URL when it contains ``://``, else a directory),
else ``$CUFORGE_CACHE_DIR``, else ``$CUFORGE_CACHE`` (a cache URL or ``off``), else
the user cache directory. With ``$CUFORGE_CACHE_SECRET`` set, entries are signed
and verified (see ``cuforge.storage.signing``).

Exit status: 0 ok, 1 the cache could not be reached, 2 usage error (a size or URL
that does not parse).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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
    """The directory a command works on: --cache DIR, $CUFORGE_CACHE_DIR, a plain
    directory in $CUFORGE_CACHE, or the default."""
    chosen = getattr(args, "cache", None)
    if isinstance(chosen, str) and chosen:
        return chosen
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    from cuforge.storage.config import ENV_CACHE

    plain = (os.environ.get(ENV_CACHE) or "").strip()
    if plain and cache_url(args) is None:  # $CUFORGE_CACHE names a plain directory
        return plain
    from cuforge.storage import default_cache_dir

    return default_cache_dir()


def cache_url(args: argparse.Namespace) -> str | None:
    """The cache URL a command works on, or None when it is a directory (``cache_dir``).

    ``--cache`` with ``://`` is a URL; ``$CUFORGE_CACHE`` is one when no directory
    was chosen by ``--cache`` or ``$CUFORGE_CACHE_DIR``.
    """
    from cuforge.storage.config import ENV_CACHE

    chosen = getattr(args, "cache", None)
    if isinstance(chosen, str) and chosen:
        return chosen if "://" in chosen else None
    if os.environ.get(ENV_DIR):
        return None
    value = (os.environ.get(ENV_CACHE) or "").strip()
    return value if "://" in value or "," in value or value.lower() == "off" else None


@contextlib.contextmanager
def open_chosen(args: argparse.Namespace, max_size: int | None = None) -> Iterator[Any]:
    """The cache the command works on (None for ``CUFORGE_CACHE=off``), closed after.

    Raises ValueError for a bad URL or secret, naming it.
    """
    from cuforge.storage.config import ENV_CACHE, secret_from_env

    url = cache_url(args)
    if url is not None and url.lower() == "off":
        if getattr(args, "cache", None):
            raise ValueError(f"--cache {url!r}: 'off' means no cache")
        yield None
        return
    if url is not None:
        from cuforge.storage.urls import open_cache

        if max_size is not None:
            raise ValueError("--max-size applies to a directory cache; put ?max_size= in the URL")
        try:
            cache = open_cache(url)
        except ValueError as exc:
            where = "--cache" if getattr(args, "cache", None) else f"${ENV_CACHE}"
            raise ValueError(f"{where}: {exc}") from None
    else:
        from cuforge.storage import FileStreamProgramCache, SignedProgramCache

        secret = secret_from_env()
        cache = FileStreamProgramCache(cache_dir(args), max_size_bytes=max_size)
        if secret is not None:
            cache = SignedProgramCache(cache, secret)
    with cache:
        yield cache


def where(args: argparse.Namespace) -> str:
    """The chosen cache for people: its directory, or its URL without a password."""
    url = cache_url(args)
    if url is None:
        return cache_dir(args)
    return re.sub(r"(://[^/@,]*?:)[^/@,]*@", r"\1***@", url)


@contextlib.contextmanager
def _open_for_compile(args: argparse.Namespace) -> Iterator[Any]:
    if args.cache is None:
        yield None
        return
    with open_chosen(args, args.max_size) as cache:
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
        help=f"compile through a cache (DIR or URL, else ${ENV_DIR}, else $CUFORGE_CACHE, "
        "else the user cache dir)",
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
            p.add_argument("--cache", metavar="DIR|URL", help="cache directory or URL")
        if name == "stats":
            p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(handler=handler)
    cache.set_defaults(handler=lambda args: (cache.print_help(sys.stderr), 2)[1])
    parsers["cache"] = cache


def _fail(args: argparse.Namespace, exc: Exception) -> int:
    code = 2 if isinstance(exc, ValueError) else 1
    print(f"cuforge cache {args.action}: error: {exc}", file=sys.stderr)
    return code


def _stats(args: argparse.Namespace) -> int:
    from cuforge.storage.units import format_size

    try:
        with open_chosen(args) as cache:
            if cache is None:
                raise ValueError("caching is off (CUFORGE_CACHE=off): there is nothing to show")
            total = getattr(cache, "total_stats", cache.stats)
            totals = total().as_dict()
            entries = len(cache)
            size = getattr(cache, "size_bytes", None)
    except (ValueError, ImportError, OSError) as exc:
        return _fail(args, exc)
    lookups = totals["hits"] + totals["misses"]
    report = {"path": where(args), "entries": entries, "size_bytes": size, **totals}
    report["hit_rate"] = round(totals["hits"] / lookups, 4) if lookups else None
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    label = "cache directory" if cache_url(args) is None else "cache"
    print(f"{label:<20}{report['path']}")
    print(f"entries             {entries}")
    print(f"size                {'-' if size is None else format_size(size)}")
    rate = "-" if report["hit_rate"] is None else f"{report['hit_rate'] * 100:.1f} %"
    print(f"hit rate            {rate}")
    for name, value in totals.items():
        shown = format_size(value) if name.startswith("bytes") else str(value)
        print(f"{name.replace('_', ' '):<20}{shown}")
    return 0


def _clear(args: argparse.Namespace) -> int:
    try:
        with open_chosen(args) as cache:
            if cache is None:
                raise ValueError("caching is off (CUFORGE_CACHE=off): there is nothing to clear")
            cache.clear()
    except (ValueError, ImportError, OSError) as exc:
        return _fail(args, exc)
    print(f"cleared {where(args)}")
    return 0


def _dir(args: argparse.Namespace) -> int:
    print(cache_dir(args))
    return 0


__all__ = ["ENV_DIR", "cache_dir", "cache_url", "open_chosen", "parse_size", "register", "where"]
