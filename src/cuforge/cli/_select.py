"""Which cache a command uses, and opening it with errors a person can act on.

The choice, first match wins:

1. ``--no-cache`` (compile, explain, warm): none.
2. ``--cache URL`` or ``--cache DIR``: that cache (a plain directory is a file
   cache; any URL ``cuforge.storage.urls`` accepts). ``--cache`` alone: the default.
3. ``$CUFORGE_CACHE_DIR``: a directory (the older spelling, kept working).
4. ``$CUFORGE_CACHE``: a cache URL or directory; ``off`` means none.
5. ``cache`` in the project's settings file, then the user's (``_config``).
6. The user cache directory (``cuforge.storage.default_cache_dir()``).

Opening failures are :class:`UsageError` naming where the choice came from: a URL
that does not parse, a path that is a regular file, a directory that cannot be
created (``/proc/nope``), a directory that is not a cuforge cache (nor empty), a
backend that is not installed. Commands that only look open read-only
(``open_choice(..., read_only=True)``): they create, sweep and delete nothing.
"""

from __future__ import annotations

import argparse
import os
import re

from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuforge.storage.base import ProgramCacheResource

__all__ = [
    "ENV_CACHE",
    "ENV_DIR",
    "Choice",
    "add_cache_option",
    "choose",
    "configured_cap",
    "open_choice",
    "require_existing",
    "url_of",
]

ENV_DIR = "CUFORGE_CACHE_DIR"
ENV_CACHE = "CUFORGE_CACHE"
_OFF = "off"
_DEFAULT_HELP = (
    f"${ENV_DIR}, else ${ENV_CACHE}, else the project's or user's settings file, else the "
    "user cache directory"
)


class Choice:
    """A chosen cache: its URL (None: caching off) and where the choice came from."""

    __slots__ = ("origin", "url")

    def __init__(self, url: str | None, origin: str) -> None:
        self.url = url
        self.origin = origin

    def shown(self) -> str:
        """The URL for people, without a password."""
        if self.url is None:
            return "(no cache)"
        return re.sub(r"(://[^/@,]*?:)[^/@,]*@", r"\1***@", self.url)


def add_cache_option(parser: argparse.ArgumentParser, can_disable: bool) -> None:
    """``--cache [URL|DIR]`` (and ``--no-cache`` where running uncached makes sense)."""
    parser.add_argument(
        "--cache",
        nargs="?",
        const="",
        default=None,
        metavar="URL|DIR",
        help=f"cache URL or directory (default: {_DEFAULT_HELP})",
    )
    if can_disable:
        parser.add_argument("--no-cache", action="store_true", help="compile without a cache")


def choose(args: argparse.Namespace) -> Choice:
    """The cache ``args`` and the environment select (see the module docstring)."""
    if getattr(args, "no_cache", False):
        if getattr(args, "cache", None):
            raise UsageError("--cache and --no-cache contradict each other")
        return Choice(None, "--no-cache")
    given = getattr(args, "cache", None)
    if given:
        return Choice(given, "--cache")
    if os.environ.get(ENV_DIR, "").strip():
        return Choice(os.environ[ENV_DIR].strip(), f"${ENV_DIR}")
    value = os.environ.get(ENV_CACHE, "").strip()
    if value:
        return Choice(None if value.lower() == _OFF else value, f"${ENV_CACHE}")
    from cuforge.cli import _config

    configured = _config.setting("cache")
    if configured is not None:
        off = configured.value.lower() == _OFF
        return Choice(None if off else configured.value, configured.origin)
    from cuforge.storage.filestream import default_cache_dir

    return Choice(default_cache_dir(), "the default cache directory")


def url_of(choice: Choice, max_size: int | None = None) -> str:
    """The URL to open for ``choice`` (not off): a plain directory made absolute (so
    it means the same after a chdir or in a worker process), ``max_size`` added."""
    assert choice.url is not None
    url = choice.url
    if "://" not in url and "," not in url and "?" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    if max_size is not None:
        last = url.rsplit(",", 1)[-1]
        url += ("&" if "?" in last else "?") + f"max_size={max_size}"
    return url


def configured_cap(choice: Choice) -> int | None:
    """A settings file's ``max_size`` for ``choice``, when its last level takes a cap
    (file, sqlite, memory) and its URL names none; else None (Redis has no cap)."""
    if choice.url is None:
        return None
    from cuforge.cli import _config
    from cuforge.storage.urls import parse_cache_url

    cap = _config.default_max_size()
    if cap is None:
        return None
    try:
        last = parse_cache_url(url_of(choice))[-1]
    except ValueError:
        return None  # open_choice names what is wrong with the URL
    if last.scheme in ("file", "sqlite", "memory") and "max_size" not in last.params:
        return cap
    return None


def require_existing(choice: Choice) -> None:
    """Inspection and maintenance never create a cache: UsageError naming the first
    directory or database file of ``choice`` that does not exist (a mistyped path
    created the whole tree before, and ``clear`` "cleared" it)."""
    from cuforge.storage.urls import parse_cache_url

    try:
        specs = parse_cache_url(url_of(choice))
    except ValueError:
        return  # open_choice names what is wrong with it
    for spec in specs:
        try:
            spec.size("max_size")  # a bad value is named first, as opening would
        except ValueError:
            return
        if spec.scheme in ("file", "sqlite") and not os.path.lexists(spec.location):
            where = _where(choice)
            raise UsageError(f"{where}: there is no cache at {spec.location} (nothing was created)")


def _where(choice: Choice) -> str:
    return f"{choice.origin} {choice.shown()!r}" if choice.origin != "--cache" else "--cache"


def open_choice(
    choice: Choice, max_size: int | None = None, *, read_only: bool = False
) -> ProgramCacheResource:
    """Open ``choice`` (which must not be off). ``max_size`` caps a file cache;
    ``read_only`` opens it to look (``open_cache(read_only=True)``).

    Raises UsageError naming the origin and what is wrong.
    """
    from cuforge.storage import CachePathError
    from cuforge.storage.urls import open_cache

    url = url_of(choice, max_size)
    where = _where(choice)
    try:
        return open_cache(url, read_only=read_only)
    except CachePathError as exc:  # one line naming the path, the problem and the fix
        raise UsageError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    except ImportError as exc:
        raise UsageError(f"{where}: the backend is not installed ({exc})") from None
    except FileExistsError:
        raise UsageError(f"{where}: {_location(url)} exists and is not a directory") from None
    except NotADirectoryError:
        raise UsageError(f"{where}: a parent of {_location(url)} is not a directory") from None
    except OSError as exc:
        target = exc.filename or _location(url)
        raise UsageError(f"{where}: cannot use {target}: {exc.strerror or exc}") from None


def _location(url: str) -> str:
    from cuforge.storage.urls import parse_cache_url

    try:
        return parse_cache_url(url)[-1].location
    except ValueError:
        return url
