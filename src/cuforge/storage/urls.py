"""Cache URLs: one parser for every place a cache is named (``open_cache``, the CLI,
``CUFORGE_CACHE``).

Grammar::

    URL      := LEVEL ("," LEVEL)*           several levels make a tiered cache
    LEVEL    := SCHEME "://" LOCATION ["?" QUERY] | PATH
    QUERY    := NAME["=" VALUE] ("&" NAME["=" VALUE])*

A plain path (no ``://``) is a FileStream directory. Each scheme declares the query
parameters it accepts; ``ro`` (read-only level) is accepted by every scheme.
Location and values are percent-decoded, so a path containing ``,`` or ``?`` is
written ``%2C`` / ``%3F``. Every error is a ValueError that names the bad part of
the URL and what was expected.

Schemes and backends never import each other at load time. A backend's opener is
named in :data:`SCHEMES` as a ``"module:function"`` string with the query parameters
it accepts; parsing a URL reads only that table, and the first open of a scheme
imports the opener's module (``redis`` loads only when a redis URL is opened). The
opener takes a :class:`CacheSpec` and returns the open cache; it lives in the
backend's package (``storage/<backend>/_url.py``), which imports this module for
``CacheSpec`` -- never the other way round.

**A new backend** (``storage/s3/`` say) adds one line to :data:`SCHEMES`::

    "s3": ("cuforge.storage.s3._url:open_s3", frozenset({"region", "prefix", ...})),

Code outside cuforge calls :func:`register_scheme` with the opener itself.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from functools import partial

from ._env import secret_from_env
from .base import ProgramCacheResource
from .spec import CacheSpec, unquote

TYPE_CHECKING = False  # typing and dataclasses cost a cold process ~10 ms: not here
if TYPE_CHECKING:
    from typing import Any

    from .tiered import TieredProgramCache


__all__ = [
    "FROM_ENV",
    "SCHEMES",
    "CacheSpec",
    "absolute_paths",
    "check_level",
    "check_levels",
    "open_cache",
    "open_level",
    "open_tiered",
    "parse_cache_url",
    "register_scheme",
]


class _Scheme:
    __slots__ = ("opener", "params")

    def __init__(
        self, opener: Callable[[CacheSpec], ProgramCacheResource], params: frozenset[str]
    ) -> None:
        self.opener = opener
        self.params = params


_REDIS_PARAMS = frozenset(
    {"prefix", "cluster", "ttl", "timeout", "connect_timeout", "lock_lease", "retry_after"}
    | {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"}
)

#: The backends' schemes: scheme -> (opener as ``"module:function"``, accepted query
#: parameters besides ``ro``). The module is imported on the scheme's first open.
SCHEMES: dict[str, tuple[str, frozenset[str]]] = {
    "file": (
        "cuforge.storage.filestream._url:open_file",
        frozenset({"max_size", "mode", "durable", "trust"}),
    ),
    "sqlite": (
        "cuforge.storage.sqlite._url:open_sqlite",
        frozenset({"max_size", "durable", "timeout", "trust"}),
    ),
    "redis": ("cuforge.storage.redis._url:open_redis", _REDIS_PARAMS),
    "rediss": ("cuforge.storage.redis._url:open_redis", _REDIS_PARAMS),
    "redis+cluster": ("cuforge.storage.redis._url:open_redis", _REDIS_PARAMS),
    "rediss+cluster": ("cuforge.storage.redis._url:open_redis", _REDIS_PARAMS),
    "s3": (
        "cuforge.storage.s3._url:open_s3",
        frozenset({"endpoint", "region", "path_style", "timeout", "connect_timeout"})
        | frozenset({"lock_lease", "retry_after"}),
    ),
}

#: The schemes whose entries live on this host (the others', on a server).
LOCAL_SCHEMES = frozenset({"memory", "file", "sqlite"})

#: What each scheme's opener refuses in the URL itself, checked without opening or
#: connecting (:func:`check_level`): ``"module:function"``, imported when used.
CHECKS: dict[str, str] = {
    "file": "cuforge.storage.filestream._url:check_file",
    "sqlite": "cuforge.storage.sqlite._url:check_sqlite",
    **dict.fromkeys(
        ("redis", "rediss", "redis+cluster", "rediss+cluster"),
        "cuforge.storage.redis._url:check_redis",
    ),
    "s3": "cuforge.storage.s3._url:check_s3",
}

# Openers resolved or registered: scheme -> _Scheme.
_SCHEMES: dict[str, _Scheme] = {}


def register_scheme(
    scheme: str, opener: Callable[[CacheSpec], ProgramCacheResource], params: set[str]
) -> None:
    """Make ``scheme://`` URLs open through ``opener``; ``params`` are the query
    names it accepts (besides ``ro``)."""
    _SCHEMES[scheme] = _Scheme(opener, frozenset(params) | {"ro"})


def _accepted(name: str, spec_text: str) -> frozenset[str]:
    """The query parameters scheme ``name`` accepts; imports no backend."""
    found = _SCHEMES.get(name)
    if found is not None:
        return found.params
    if name in SCHEMES:
        return SCHEMES[name][1] | {"ro"}
    known = ", ".join(sorted({*_SCHEMES, *SCHEMES}))
    raise ValueError(f"cache URL {spec_text!r}: unknown scheme {name!r} (expected {known})")


def _opener(name: str, spec_text: str) -> Callable[[CacheSpec], ProgramCacheResource]:
    """Scheme ``name``'s opener, importing its module on first use."""
    found = _SCHEMES.get(name)
    if found is None:
        params = _accepted(name, spec_text)
        module, _, function = SCHEMES[name][0].partition(":")
        opener = getattr(importlib.import_module(module), function)
        found = _SCHEMES[name] = _Scheme(opener, params)
    return found.opener


#: Schemes whose location is a local path: ``scheme:///absolute/path``.
_PATH_SCHEMES = ("file", "sqlite")


def _without_host(scheme: str, location: str, text: str) -> str:
    """The path of ``scheme://HOST/path``: only ``localhost`` (RFC 8089) is a host a
    local path may name; any other (``sqlite://cache/k.db``, two slashes) is refused,
    naming the URL that was probably meant, instead of opening a path relative to the
    working directory: that path under the working directory (``./cache/k.db``), or
    -- when only its folder exists -- the absolute path one left-out slash gives
    (``sqlite://tmp/k.db``: ``/tmp/k.db``)."""
    host, slash, path = location.partition("/")
    if host.lower() == "localhost":
        return slash + path
    if location.startswith("~"):
        meant = os.path.abspath(os.path.expanduser(location))
    else:
        absolute, relative = os.path.normpath("/" + location), os.path.abspath(location)
        slash_left_out = os.path.isdir(os.path.dirname(absolute)) and not os.path.isdir(
            os.path.dirname(relative)
        )
        meant = absolute if slash_left_out else relative
    raise ValueError(
        f"cache URL {text!r}: {scheme}:// URLs name no host ({host!r}); "
        f"an absolute path takes three slashes: {scheme + '://' + meant!r}"
    )


def _parse_level(text: str) -> CacheSpec:
    if not text.strip():
        raise ValueError("cache URL: empty level (two commas, or a trailing comma?)")
    if "://" not in text:
        path, _, query = text.partition("?")
        scheme, location = "file", path
    else:
        scheme, _, rest = text.partition("://")
        scheme = scheme.lower()
        location, _, query = rest.partition("?")
        if scheme in _PATH_SCHEMES and location and not location.startswith("/"):
            location = _without_host(scheme, location, text)
    accepted = _accepted(scheme, text)
    params: dict[str, str] = {}
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        name = unquote(name)
        if name not in accepted:
            allowed = ", ".join(sorted(accepted))
            raise ValueError(
                f"cache URL {text!r}: unknown parameter {name!r} for {scheme}:// "
                f"(accepted: {allowed})"
            )
        if name in params:
            raise ValueError(f"cache URL {text!r}: parameter {name!r} given twice")
        params[name] = unquote(value)
    spec = CacheSpec(scheme, unquote(location), params, False, text)
    return CacheSpec(scheme, spec.location, params, spec.flag("ro"), text)


def check_level(spec: CacheSpec) -> None:
    """Raise the ValueError opening ``spec`` would raise for the URL itself -- a
    missing directory, database, host or bucket, a port or database that is no
    number, a bad parameter value -- without opening, connecting or creating
    anything: what ``config.select`` and :func:`open_tiered` run on every level
    (:func:`check_levels`), so a value that cannot open is refused the same way by
    every command (``cuforge cache dir`` too), whatever the level's position. What
    only a connection finds (a server down, a bucket missing) is not checked. A
    scheme registered from outside (:func:`register_scheme`) is checked by its
    opener only. Imports the scheme's ``_url`` module, never its handle or client
    (the redis and s3 packages load those on first use)."""
    if spec.scheme == "memory":
        _check_memory(spec)
        return
    target = CHECKS.get(spec.scheme)
    if target is None:
        return
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)(spec)


def check_levels(specs: Sequence[CacheSpec]) -> None:
    """:func:`check_level` of every level, fastest first: a typo in a level's URL is
    refused at open even where the level itself opens only when first reached
    (:func:`open_tiered`). Checking imports a backend's ``_url`` module only, so a
    hit from the front level still loads no handle or client of a level behind it."""
    for spec in specs:
        check_level(spec)


def parse_cache_url(url: str) -> list[CacheSpec]:
    """The levels of ``url``, fastest first. Raises ValueError naming the bad part."""
    if not isinstance(url, str):
        raise TypeError(f"cache URL must be a str, got {type(url).__name__}")
    if not url.strip():
        raise ValueError("cache URL is empty")
    return [_parse_level(part.strip()) for part in url.split(",")]


def _quoted(path: str) -> str:
    """``path`` for a URL: the characters the grammar gives a meaning (``%``, ``,``,
    ``?``) percent-encoded, so a directory named ``a,b`` stays one level."""
    return path.replace("%", "%25").replace(",", "%2C").replace("?", "%3F")


def absolute_paths(url: str, base: str | None = None) -> str:
    """``url`` with every plain-path level (one without ``scheme://``) made absolute:
    ``~`` expanded, a relative path joined to ``base`` (default: the working
    directory), normalised; so the URL means the same after a ``chdir`` and in
    another process. What the base and home contribute is percent-encoded where the
    grammar would read it (a working directory named ``a,b``). Other levels, and a
    level's query, are left as they are."""
    levels = []
    for level in url.split(","):
        path, sep, query = level.strip().partition("?")
        if "://" in level or not path:
            levels.append(level)
            continue
        if path.startswith("~"):
            user, slash, rest = path.partition("/")
            home = os.path.expanduser(user)
            if home != user:
                path = _quoted(home) + slash + rest
        if not os.path.isabs(path):
            path = os.path.join(_quoted(os.getcwd() if base is None else base), path)
        levels.append(os.path.normpath(path) + sep + query)
    return ",".join(levels)


class _FromEnv:
    def __repr__(self) -> str:
        return "FROM_ENV"


#: ``open_cache``'s default ``secret``: ``$CUFORGE_CACHE_SECRET`` when set, else the file
#: ``$CUFORGE_CACHE_SECRET_FILE`` names, else none.
FROM_ENV: Any = _FromEnv()


def open_level(spec: CacheSpec, secret: bytes | str | None = None) -> ProgramCacheResource:
    """Open one parsed level; with ``secret``, wrap it in a SignedProgramCache --
    except ``memory://``, which only this process can write."""
    signed = secret is not None and spec.scheme != "memory"
    cache = _opener(spec.scheme, spec.text)(spec.as_signed() if signed else spec)
    if signed and secret is not None:
        from .signing import SignedProgramCache

        try:
            cache = SignedProgramCache(cache, secret)
        except BaseException:
            cache.close()
            raise
    return cache


def open_cache(
    url: str, *, secret: bytes | str | None = FROM_ENV, read_only: bool = False
) -> ProgramCacheResource:
    """Open the cache ``url`` names: one backend, or a tiered cache for several levels.

    ``url`` is one level or several joined by ``,`` (fastest first); each level is
    ``SCHEME://LOCATION[?NAME[=VALUE]&...]`` or a plain directory path:

    - ``memory://`` -- InMemoryProgramCache; ``max_size``.
    - ``file:///abs/dir`` or a path -- FileStreamProgramCache; ``max_size``, ``mode``
      (octal, e.g. 2770), ``durable``, ``trust=shared``.
    - ``sqlite:///abs/path.db`` -- SQLiteProgramCache; ``max_size``, ``durable``,
      ``timeout``, ``trust=shared``. (``file``/``sqlite`` take no host but localhost.)
    - ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS),
      ``redis+cluster://``, ``rediss+cluster://`` -- RedisProgramCache; ``prefix``,
      ``ttl``, ``timeout``, ``connect_timeout``, ``lock_lease``, ``retry_after``,
      ``cluster``; over TLS also ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
      ``ssl_cert_reqs``.

    Every level takes ``ro`` (read-only). Sizes read ``64M``/``2G``, durations
    ``500ms``/``90s``/``7d``; values are percent-decoded. Example:
    ``open_cache("memory://?max_size=256M,file:///var/cache/cuforge?max_size=20G")``.

    ``secret`` signs and verifies every entry of every shared level (see
    ``storage.signing``); by default it is ``$CUFORGE_CACHE_SECRET`` when that is
    set, else the secret in the file ``$CUFORGE_CACHE_SECRET_FILE`` names (what
    ``cuforge run`` gives its job); ``secret=None`` opens unsigned whatever the
    environment says.

    ``read_only=True`` opens to look: every level as if it carried ``ro`` (a file
    level then creates, sweeps and deletes nothing), and one level is returned as
    its backend's own handle (the ``cuforge cache`` commands that only inspect).

    Raises ValueError for a bad URL (naming the bad part), a too-short secret or a
    secret file that cannot be read;
    errors opening a level (a path that is a file, a database that is not ours)
    propagate from the backend.
    """
    specs = parse_cache_url(url)
    if secret is FROM_ENV:
        secret = secret_from_env()
    if read_only:
        specs = [spec.as_read_only() for spec in specs]
        if len(specs) == 1:
            return open_level(specs[0], secret)
    if len(specs) > 1 or specs[0].read_only:
        return open_tiered(specs, secret=secret)
    return open_level(specs[0], secret)


def _check_memory(spec: CacheSpec) -> None:
    if spec.location:
        raise spec.error("memory:// takes no location (use memory://?max_size=64M)")
    spec.size("max_size")


def _open_memory(spec: CacheSpec) -> ProgramCacheResource:
    from .memory import InMemoryProgramCache

    _check_memory(spec)
    return InMemoryProgramCache(max_size_bytes=spec.size("max_size"))


def open_tiered(
    specs: Sequence[CacheSpec], *, secret: bytes | str | None = None
) -> TieredProgramCache:
    """The levels of a parsed cache URL; ``?ro`` levels are read-only.

    Every level's URL is checked first (:func:`check_levels`): a bad port, database
    or parameter value in any level is a ValueError here, before anything opens.
    Levels up to the first persistent one (not ``memory://``) open now: a fresh
    process's lookups reach that far anyway, and a bad location there is an error
    here. Levels behind it are ``LazyLevel`` s (``storage.tiered``), opened when
    first reached: an error opening one (a server down, a bucket missing) is then
    that level's counted failure, and ``levels`` raises it.
    """
    from .tiered import LazyLevel, TieredProgramCache

    check_levels(specs)
    levels: list[ProgramCacheResource] = []
    eager = True
    try:
        for spec in specs:
            if eager:
                levels.append(open_level(spec, secret))
                eager = spec.scheme == "memory"
            else:
                opener = partial(open_level, spec, secret)
                remote = spec.scheme not in LOCAL_SCHEMES
                levels.append(LazyLevel(opener, _shown(spec.text), remote=remote))
    except BaseException:
        for level in levels:
            level.close()
        raise
    return TieredProgramCache(*levels, read_only=[i for i, s in enumerate(specs) if s.read_only])


def _shown(text: str) -> str:
    """A level's URL for messages: without its query, a password shown as ``***``
    (a user name without one is shown as it is: no ``***`` for a password not given)."""
    scheme, sep, rest = text.split("?", 1)[0].rpartition("://")
    user, at, host = rest.rpartition("@")
    name, _, password = user.partition(":")
    return f"{scheme}{sep}{f'{name}:***@' if password else user + at}{host}"


register_scheme("memory", _open_memory, {"max_size"})
