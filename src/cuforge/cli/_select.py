"""Which cache a command uses, and opening it with errors a person can act on.

The choice is ``cuforge.storage.config.select`` -- the one the Python API and every
integration make -- given ``--cache`` (``--no-cache`` is ``--cache off``) and
``--max-size``; docs/cache.md ("Which cache") has the rules: ``--cache``, then
``$CUFORGE_CACHE``, ``$CUFORGE_CACHE_DIR``, the project's and the user's settings
file, the user cache directory; ``off`` anywhere is no cache. ``--cache`` alone means
"as if not given"; ``--cache ''`` is a usage error (as ``-o ''`` is), while an empty
variable is unset (docs/cache.md).

Every failure is a :class:`UsageError` (exit 2) starting with where the value came
from: a URL that does not parse, a bad settings file, size or secret, a path that is
a regular file, a directory that cannot be created (``/proc/nope``), one that is not
a cuforge cache (nor empty), a backend that is not installed. Commands that only look
open read-only (``open_choice(..., read_only=True)``): they create, sweep and delete
nothing. ``cuforge doctor`` runs these same functions and reports what they say.
"""

from __future__ import annotations

import argparse

from cuforge.cli._args import UsageError
from cuforge.storage.config import ENV_CACHE, ENV_CACHE_DIR, Selection, select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuforge.storage.absent import Absent
    from cuforge.storage.base import ProgramCacheResource

__all__ = [
    "ENV_CACHE",
    "ENV_CACHE_DIR",
    "Choice",
    "add_cache_option",
    "choose",
    "explain",
    "level_names",
    "level_refusal",
    "missing",
    "open_choice",
    "require_existing",
    "unreachable_level",
]

#: A chosen cache (``storage.config.Selection``): ``url`` (None: off), ``origin``...
Choice = Selection

_DEFAULT_HELP = (
    f"${ENV_CACHE}, else ${ENV_CACHE_DIR}, else the project's or user's settings file, "
    "else the user cache directory; 'off' for none"
)


#: ``--cache`` given no value (as if not given); a NUL can never be a typed argument.
_BARE = "\0"


def add_cache_option(parser: argparse.ArgumentParser, can_disable: bool) -> None:
    """``--cache [URL|DIR|off]`` (and ``--no-cache`` where running uncached makes sense)."""
    parser.add_argument(
        "--cache",
        nargs="?",
        const=_BARE,
        default=None,
        metavar="URL|DIR",
        help=f"cache URL or directory (default: {_DEFAULT_HELP})",
    )
    if can_disable:
        parser.add_argument("--no-cache", action="store_true", help="compile without a cache")


def choose(args: argparse.Namespace, max_size: int | None = None) -> Choice:
    """The cache ``args`` (``--cache``, ``--no-cache``), the environment and the
    settings files choose, with its secret and cap (``max_size``: compile's
    ``--max-size``). UsageError naming where a bad value came from."""
    given = getattr(args, "cache", None)
    if given == _BARE:  # bare --cache: as if not given
        given = None
    elif given is not None and not given.strip():  # --cache '': not the default, unsaid
        raise UsageError(
            "--cache needs a cache URL or directory (it was given an empty one); leave "
            "--cache out for the default cache"
        )
    origin = "--cache"
    if getattr(args, "no_cache", False):
        if given is not None:
            raise UsageError("--cache and --no-cache contradict each other")
        given, origin = "off", "--no-cache"
    try:
        return select(
            given,
            origin=origin,
            max_size=max_size,
            max_size_origin="--max-size",
        )
    except ValueError as exc:
        refused = UsageError(str(exc))
        # which rule was choosing when the value failed ("cache in project config
        # PATH", "$CUFORGE_CACHE"; empty: none yet), for doctor's cache line
        refused.chosen_where = getattr(exc, "chosen_where", "")  # type: ignore[attr-defined]
        raise refused from None


def missing(choice: Choice) -> Absent | None:
    """The first level of ``choice`` whose directory or database file does not exist
    (None when every one does): a cache that is not there yet."""
    return choice.missing()


def require_existing(choice: Choice) -> None:
    """Inspection and maintenance never create a cache: UsageError naming the first
    directory or database file of ``choice`` that does not exist (a mistyped path
    created the whole tree before, and ``clear`` "cleared" it) -- but a tier's ``?ro``
    level that is not there yet, which ``compile`` reads as an empty cache and never
    creates, is read so here too."""
    absent = choice.missing(tier_ro_too=False)
    if absent is not None:
        raise UsageError(
            f"{choice.where}: there is no cache at {absent.location} (nothing was created)"
        )


def open_choice(
    choice: Choice, *, read_only: bool = False, as_compile: bool = False, levels: bool = True
) -> ProgramCacheResource:
    """Open ``choice`` (which must not be off) with its secret and cap; ``read_only``
    opens it to look (``open_cache(read_only=True)``). ``as_compile`` (doctor, which
    opens read-only to report what ``compile`` would do): a refusal whose words
    depend on writing -- a directory that is not a cuforge cache -- is said as the
    writable open ``compile`` makes says it, for a level not ``?ro``.

    Raises UsageError naming the origin and what is wrong, the ways out in the
    command line's words (``?trust=shared``, ``secret_file``; not ``trust_shared=True``).
    A tier's existing directory and database levels are opened here too (a lazy one
    would open at its first use, ~1 ms later): one that is refused -- unsafe, not a
    cuforge cache, another program's database -- is the same UsageError, naming the
    level (:func:`level_refusal`), not a warning or an exit status 1 mid-command
    (``levels=False``: left lazy; doctor opens and reports each level itself).
    """
    try:
        cache = choice.open(read_only=read_only)
    except (ValueError, TypeError, ImportError, OSError) as exc:
        at = _refusing_level(choice, exc)
        if at is not None:  # a tier's level the open reached (one behind memory://)
            raise UsageError(level_refusal(choice, at, exc, as_compile=as_compile)) from None
        raise UsageError(explain(choice, _as_writer(choice, exc) if as_compile else exc)) from None
    try:
        if levels:
            _open_local_levels(choice, cache, as_compile)
    except BaseException:
        cache.close()
        raise
    return cache


def _refusing_level(choice: Choice, exc: BaseException) -> int | None:
    """The level of a tier whose directory or database ``exc`` is about (its path in
    the message); None for a cache of one level, or when no level is named."""
    from cuforge.storage.urls import parse_cache_url

    try:
        specs = parse_cache_url(choice.url or "")
    except ValueError:
        return None
    if len(specs) < 2:
        return None
    said = str(exc)
    named = [
        (len(spec.location), -i)
        for i, spec in enumerate(specs)
        if spec.scheme in ("file", "sqlite") and spec.location and spec.location in said
    ]
    return -max(named)[1] if named else None  # the longest path named: /a/b, not /a


def _open_local_levels(choice: Choice, cache: ProgramCacheResource, as_compile: bool) -> None:
    """Open each ``file://`` and ``sqlite://`` level of the tier ``cache`` whose
    directory or database exists (one that does not stays lazy: opening it would
    create it); UsageError (:func:`level_refusal`) for the first one refused. Redis
    and S3 levels stay lazy: reaching a server is no check of the command line."""
    import os

    from cuforge.storage.signing import SignedProgramCache
    from cuforge.storage.tiered import TieredProgramCache
    from cuforge.storage.urls import parse_cache_url

    inner = cache.inner if isinstance(cache, SignedProgramCache) else cache
    if not isinstance(inner, TieredProgramCache):
        return
    for i, spec in enumerate(parse_cache_url(choice.url or "")):
        if spec.scheme not in ("file", "sqlite") or not os.path.lexists(spec.location):
            continue
        try:
            inner.level(i)
        except (ValueError, TypeError, ImportError, OSError) as exc:
            raise UsageError(level_refusal(choice, i, exc, as_compile=as_compile)) from None


def level_refusal(choice: Choice, i: int, exc: BaseException, *, as_compile: bool = False) -> str:
    """The line for level ``i`` of the tier ``choice`` refusing to open with ``exc``:
    a single-level cache's line (:func:`explain`: where the choice came from, the
    command line's ways out, ``as_compile`` as :func:`open_choice` says it) with the
    level named by its URL after the origin -- ``--cache: level 1 (file:///d): ...``."""
    line = explain(choice, _as_writer(choice, exc) if as_compile else exc)
    head = f"{choice.where}: "
    names = level_names(choice)
    if i < len(names) and line.startswith(head):
        line = f"{head}level {i} ({names[i][0]}): {line[len(head) :]}"
    return line


def _as_writer(choice: Choice, exc: BaseException) -> BaseException:
    """``exc`` as a writable open of ``choice`` raises it: the refusal of a directory
    that is not a cuforge cache (``filestream._owned.not_a_cache``) has the writer's
    words when that directory is a level not opened ``?ro``; anything else as is."""
    import errno

    from cuforge.storage import CachePathError

    if not isinstance(exc, CachePathError) or exc.errno != errno.ENOTEMPTY:
        return exc
    import os

    from cuforge.storage.filestream import not_a_cache
    from cuforge.storage.urls import parse_cache_url

    for spec in parse_cache_url(choice.url or ""):
        if spec.scheme == "file" and os.path.realpath(spec.location) == exc.path:
            return exc if spec.read_only else not_a_cache(exc.path, read_only=False)
    return exc


def unreachable_level(choice: Choice) -> tuple[str, str] | None:
    """The first Redis or S3 level of ``choice`` that cannot be reached or refuses
    reads -- ``(its name as reports give it, the line cuforge cache stats would fail
    with)`` -- asked as ``doctor`` asks it (``RemoteCache.check_server``, within the
    level's own timeouts, changing nothing there); None when every one answers."""
    from cuforge.storage.urls import LOCAL_SCHEMES, open_level, parse_cache_url

    names = level_names(choice)
    for spec, (name, _) in zip(parse_cache_url(choice.url or ""), names, strict=True):
        if spec.scheme in LOCAL_SCHEMES:
            continue
        try:
            handle = open_level(spec.as_read_only())
        except (ValueError, TypeError, ImportError, OSError):
            continue  # opening the cache says it
        with handle:
            check = getattr(handle, "check_server", None)
            if check is None:
                continue
            try:
                check(writes=False)
            except ConnectionError as exc:
                return name, str(exc)
    return None


def level_names(choice: Choice) -> list[tuple[str, bool]]:
    """Each level of ``choice`` (none when off) as a report names it -- its URL or path
    without the query, a password shown as ``***`` -- and whether it lives in this
    process only (``memory://``: gone when the command exits)."""
    if choice.url is None:
        return []
    from cuforge.storage.urls import parse_cache_url

    out = []
    for spec in parse_cache_url(choice.url):
        text = spec.text.split("?", 1)[0]
        scheme, sep, rest = text.rpartition("://")
        user, _, host = rest.rpartition("@")
        name, _, password = user.partition(":")
        if password:  # a user name without a password is shown as it is: no ***
            text = f"{scheme}{sep}{name}:***@{host}"
        out.append((text, spec.scheme == "memory"))
    return out


def explain(choice: Choice, exc: BaseException) -> str:
    """``choice.explain(exc)`` -- the line for a cache that cannot be opened -- in the
    command line's words (``CachePathError.in_url_words``; an ``sqlite://`` path that
    is no database file of cuforge's: :func:`_sqlite_words`)."""
    from cuforge.storage import CachePathError

    return CachePathError.in_url_words(_sqlite_words(choice, exc) or choice.explain(exc))


def _sqlite_words(choice: Choice, exc: BaseException) -> str | None:
    """The refusal of an ``sqlite://`` path -- a directory, or a file that is not a
    cuforge SQLite cache (another program's database) -- with the way out naming what
    to change, as the command line spells it (``give --cache ...``, ``set
    $CUFORGE_CACHE to ...``, ``set cache in project config PATH to ...``), not the
    Python API's ``SQLiteProgramCache``; None for any other failure."""
    if not type(exc).__module__.startswith("cuforge.storage.sqlite"):
        return None  # loads nothing for the others
    from cuforge.storage import sqlite

    flag = choice.origin.startswith("-")
    change = f"give {choice.origin}" if flag else f"set {choice.where} to"
    if isinstance(exc, sqlite.DatabaseIsDirectoryError):
        return (
            f"{choice.where}: sqlite:// path {exc.path} is a directory, not a database file; "
            f"{change} the path of a database file (such as "
            f"sqlite://{exc.path.rstrip('/')}/program-cache.db)"
        )
    if isinstance(exc, sqlite.ForeignDatabaseError):
        from cuforge.storage.sqlite import FOREIGN_WAY_OUT

        way = f"{change} an sqlite:// path of its own, or move that file away"
        return choice.explain(exc).replace(FOREIGN_WAY_OUT, way)
    return None
