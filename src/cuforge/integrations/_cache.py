"""Cache selection and foreign-payload entries, shared by every integration.

A foreign payload (an Inductor JSON-wrapped pickle, a CuPy cubin) is opaque bytes
to cuforge: it is stored with a metadata record (``kind`` = the system, the
system's own key, which of its caches) so ``cuforge cache ls/stats/verify/prune``
list and manage it, and it is never unpickled, loaded or run by cuforge. Integrity
and signing are the cache's: with a secret set, an unsigned, tampered or
foreign-signed entry is a miss. A cache fault never fails the host system's
compile: a read that raises is a miss and a :class:`CacheReadWarning`, a store that
raises is dropped with a :class:`CacheWriteWarning`.

Choosing the cache never fails it either. A cache the environment names
(``$CUFORGE_<SYSTEM>_CACHE``, ``$CUFORGE_CACHE``, ``$CUFORGE_CACHE_SECRET``) that
cannot be opened -- a bad URL, a directory that cannot be created or that every
user can write, a database path that is a directory, a secret too short -- is one
:class:`CacheWriteWarning` per process (naming the variable, its value and why) and
no cache: the system compiles as without one. A ``cache=`` argument is the caller's
code: a URL the parser or the backend refuses raises ValueError there (TypeError
for another type), and one that cannot be opened for the environment's reasons (an
``OSError``: a path that cannot be created or is unsafe) warns the same way.
"""

from __future__ import annotations

import os
import threading
import warnings

from cuforge._stack import outside_level
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource
from cuforge.storage.record import decode_record, encode_record

__all__ = ["ForeignEntries", "caching_off", "select_cache"]

_OFF = "off"
#: The source named when the ``cache=`` argument cannot be opened.
_ARGUMENT = "cache"

_mutex = threading.Lock()
#: Handles opened from URLs, by (URL, secret variable's value): one per process.
_opened: dict[tuple[str, str | None], ProgramCacheResource] = {}
#: Why a URL could not be opened, by the same identity: it is not tried again.
_failed: dict[tuple[str, str | None], Exception] = {}
#: (source, value, secret) already warned about: one warning each per process.
_warned: set[tuple[str, str, str | None]] = set()


class _SecretFault(Exception):
    """``$CUFORGE_CACHE_SECRET`` is unusable: the environment's fault, whatever
    named the URL, so never raised at a ``cache=`` argument."""


def _open(url: str) -> ProgramCacheResource:
    from cuforge.storage.config import secret_from_env
    from cuforge.storage.urls import open_cache

    try:
        secret = secret_from_env()
    except ValueError as exc:
        raise _SecretFault(str(exc)) from None
    return open_cache(url, secret=secret)


def _open_url(url: str, source: str) -> ProgramCacheResource | None:
    """The process's handle on ``url`` (opened at first use with ``$CUFORGE_CACHE_SECRET``),
    so an adapter's calls share one handle and its statistics; None (warned once per
    source) when it cannot be opened. ``source`` is what named ``url``: the argument
    (a refused URL raises ValueError) or a variable (nothing raises)."""
    from cuforge.storage.config import ENV_SECRET

    secret = os.environ.get(ENV_SECRET)
    ident = (url, secret)
    with _mutex:
        cache = _opened.get(ident)
        if cache is not None:
            return cache
        failure = _failed.get(ident)
        if failure is None:
            try:
                cache = _opened[ident] = _open(url)
                return cache
            except Exception as exc:  # judged below, by who named the URL
                failure = _failed[ident] = exc
    if source == _ARGUMENT and isinstance(failure, (ValueError, TypeError)):
        raise ValueError(f"cache: {failure}") from None
    _unavailable(source, url, secret, failure)
    return None


def _unavailable(source: str, value: str, secret: str | None, exc: Exception) -> None:
    """Warn, once per process for ``source`` holding ``value``, that its cache cannot
    be opened and the compile goes on without one (a URL's password is not shown)."""
    with _mutex:
        if (source, value, secret) in _warned:
            return
        _warned.add((source, value, secret))
    import re

    shown = "cache=" if source == _ARGUMENT else f"{source}="
    reason = str(exc).removeprefix(f"{source}: ") or type(exc).__name__
    message = (
        f"cuforge: {shown}{value!r}: the cache cannot be opened ({reason}); "
        "compiling without a cache"
    )
    message = re.sub(r"(://[^/@?,\s:]*):[^@/?,\s]*@", r"\1:***@", message)
    warnings.warn(message, CacheWriteWarning, stacklevel=outside_level())


def select_cache(
    cache: ProgramCacheResource | str | None, env_var: str
) -> ProgramCacheResource | None:
    """The cache an integration uses: ``cache`` itself (a cache, or a URL to open),
    else ``$env_var`` (a cache URL, or ``off``), else cuforge's default cache
    (``$CUFORGE_CACHE``). None means no cache: turned off, or it cannot be opened.

    URLs open with ``$CUFORGE_CACHE_SECRET`` when it is set (every shared level then
    signs and verifies), once per process and secret. A value from the environment
    never raises: one it cannot open is a :class:`CacheWriteWarning` naming the
    variable, once per process, and None. A ``cache`` URL the parser or its backend
    refuses raises ValueError (``cache: ...``), a ``cache`` of another type
    TypeError; one that cannot be opened (an ``OSError``) warns and gives None.
    """
    if isinstance(cache, ProgramCacheResource):
        return cache
    if isinstance(cache, str):
        return _open_url(cache, _ARGUMENT)
    if cache is not None:
        raise TypeError(
            "cache: expected a ProgramCacheResource, a cache URL or None, "
            f"got {type(cache).__name__}"
        )
    url = (os.environ.get(env_var) or "").strip()
    if url.lower() == _OFF:
        return None
    if url:
        return _open_url(url, f"${env_var}")
    from cuforge.storage.config import default_cache

    try:
        return default_cache()  # warns itself, once, when the directory cannot be opened
    except Exception as exc:  # a bad $CUFORGE_CACHE or secret: the environment's, no raise
        from cuforge.storage.config import ENV_CACHE, ENV_SECRET

        value = os.environ.get(ENV_CACHE) or ""
        _unavailable(f"${ENV_CACHE}", value, os.environ.get(ENV_SECRET), exc)
        return None


def caching_off(env_var: str) -> bool:
    """Whether the environment turns this integration's cache off: ``off`` in
    ``$env_var``, or in ``$CUFORGE_CACHE`` when ``$env_var`` is unset (tells a None
    from :func:`select_cache` that means off from one that means unavailable)."""
    own = (os.environ.get(env_var) or "").strip()
    if own:
        return own.lower() == _OFF
    from cuforge.storage.config import ENV_CACHE

    return (os.environ.get(ENV_CACHE) or "").strip().lower() == _OFF


class ForeignEntries:
    """One foreign system's payloads in a cuforge cache, under its own names.

    ``kind`` is the metadata record's kind (``"inductor"``, ``"cupy"``); the entry
    key is derived from ``kind`` and the system's name, so systems never collide
    with each other or with cuforge's programs. :meth:`load` returns a payload only
    when the entry verifies (integrity, and the signature when the cache signs) and
    its record says it is this kind's entry for this name.
    """

    __slots__ = ("cache", "kind")

    def __init__(self, cache: ProgramCacheResource, kind: str) -> None:
        self.cache = cache
        self.kind = kind

    def key(self, name: str) -> bytes:
        """The cache key of the system's ``name``."""
        return b"cuforge-foreign\0" + self.kind.encode() + b"\0" + name.encode("utf-8")

    def load(self, name: str) -> bytes | None:
        """The payload stored for ``name``, or None (a miss, also when reading failed)."""
        try:
            entry = self.cache.get_entry(self.key(name))
        except Exception as exc:  # a cache fault is a miss, never the host's failure
            warnings.warn(
                f"cuforge {self.kind} cache: lookup failed ({type(exc).__name__}: {exc}); "
                "treated as a miss",
                CacheReadWarning,
                stacklevel=outside_level(),
            )
            return None
        if entry is None:
            return None
        record = decode_record(entry.meta, self.kind)
        if record is None or record.get("key") != name:
            return None
        return bytes(entry.data)

    def store(self, name: str, data: bytes, fields: dict[str, str | int | None]) -> bool:
        """Store ``data`` for ``name`` with a record of ``fields``; False when dropped."""
        meta = encode_record(self.kind, {"key": name, "name": _short(name), **fields})
        try:
            self.cache.set_entry(self.key(name), bytes(data), meta)
        except Exception as exc:  # a cache fault never fails the host's compile
            warnings.warn(
                f"cuforge {self.kind} cache: store failed ({type(exc).__name__}: {exc}); "
                "the result is used but not cached",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )
            return False
        return True


def _short(name: str, limit: int = 80) -> str:
    """``name`` as ``cuforge cache ls`` shows it: at most ``limit`` characters."""
    return name if len(name) <= limit else name[: limit - 3] + "..."
