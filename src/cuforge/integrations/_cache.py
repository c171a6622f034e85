"""Cache selection and foreign-payload entries, shared by every integration.

A foreign payload (an Inductor JSON-wrapped pickle, a CuPy cubin) is opaque bytes
to cuforge: it is stored with a metadata record (``kind`` = the system, the
system's own key, which of its caches) so ``cuforge cache ls/stats/verify/prune``
list and manage it, and it is never unpickled, loaded or run by cuforge. Integrity
and signing are the cache's: with a secret set, an unsigned, tampered or
foreign-signed entry is a miss. A cache fault never fails the host system's
compile: a read that raises is a miss and a :class:`CacheReadWarning`, a store that
raises is dropped with a :class:`CacheWriteWarning`.

Choosing the cache never fails it either. The choice is ``storage.config``'s, the
one ``Program.compile(cache=True)`` and the command line make (docs/cache.md, "Which
cache"), with the adapter's own variable (``$CUFORGE_<SYSTEM>_CACHE``) ranked just
below the ``cache=`` argument. A cache the environment or a settings file names
(the adapter's variable, ``$CUFORGE_CACHE``, ``$CUFORGE_CACHE_DIR``, ``cache`` in
``cuforge.toml``, a ``$CUFORGE_CACHE_SECRET`` or ``secret_file``) that cannot be
opened -- a bad URL, a directory that cannot be created or that every user can
write, a database path that is a directory, a secret too short -- is one
:class:`CacheWriteWarning` per process (naming where it came from, its value and
why) and no cache: the system compiles as without one. A ``cache=`` argument is the
caller's code: a URL the parser or the backend refuses raises ValueError there
(TypeError for another type), and one that cannot be opened for the environment's
reasons (an ``OSError``: a path that cannot be created or is unsafe; a bad secret)
warns the same way.
"""

from __future__ import annotations

import os
import threading
import warnings

from cuforge._stack import outside_level
from cuforge.storage import config
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource
from cuforge.storage.entry import CacheEntry
from cuforge.storage.record import decode_record, encode_record

from . import _behind

__all__ = ["ForeignEntries", "caching_off", "select_cache", "selected"]

_mutex = threading.Lock()
#: Handles opened, by (URL, secret): one per process.
_opened: dict[tuple[str, bytes | None], ProgramCacheResource] = {}
#: Why a URL could not be opened, by the same identity: it is not tried again.
_failed: dict[tuple[str, bytes | None], Exception] = {}
#: Warnings already given (the text): one each per process.
_warned: set[str] = set()


def _open(chosen: config.Selection, shared: bool = True) -> ProgramCacheResource | None:
    """The process's handle on ``chosen`` (opened at first use), so an adapter's calls
    share one handle and its statistics; None (warned once) when it cannot be opened.
    ``shared=False``: a new handle, the caller's own to close. A URL the ``cache=``
    argument gave that the backend refuses raises ValueError."""
    assert chosen.url is not None
    ident = (chosen.target(), chosen.secret)
    with _mutex:
        cache = _opened.get(ident) if shared else None
        if cache is not None:
            return cache
        failure = _failed.get(ident)
        if failure is None:
            try:
                cache = chosen.open()
                if shared:
                    _opened[ident] = cache
                return cache
            except Exception as exc:  # judged below, by who named the URL
                failure = _failed[ident] = exc
    if chosen.origin == config.ARGUMENT and isinstance(failure, (ValueError, TypeError)):
        raise ValueError(chosen.explain(failure)) from None
    _unavailable(chosen.named(), chosen.reason(failure))  # the environment's: never raises
    return None


def _unavailable(named: str, reason: str) -> None:
    """Warn, once per process for each text, that the cache ``named`` cannot be
    opened and the compile goes on without one (a URL's password is not shown)."""
    import re

    message = f"cuforge: {named}: the cache cannot be opened ({reason}); compiling without a cache"
    message = re.sub(r"(://[^/@?,\s:]*):[^@/?,\s]*@", r"\1:***@", message)
    with _mutex:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(message, CacheWriteWarning, stacklevel=outside_level())


def _refused(exc: config.SelectionError) -> None:
    """A value that cannot choose a cache: the argument's own raises (ValueError),
    anything the environment or a settings file gave warns once."""
    if exc.of_argument:
        raise ValueError(str(exc)) from None
    if exc.chosen:
        _unavailable(exc.chosen, exc.detail())
    else:  # no cache chosen yet: a settings file that cannot be read
        _unavailable("the cache", str(exc))


def select_cache(
    cache: ProgramCacheResource | str | None, env_var: str
) -> ProgramCacheResource | None:
    """:func:`selected`'s cache: one handle per URL for the whole process."""
    return selected(cache, env_var)[0]


def selected(
    cache: ProgramCacheResource | str | None, env_var: str, *, shared: bool = True
) -> tuple[ProgramCacheResource | None, bool]:
    """The cache an integration uses: ``cache`` itself (a cache, or a URL to open),
    else what ``storage.config.select`` chooses with ``$env_var`` (a cache URL, or
    ``off``) ranked first -- with the variable unset, cuforge's default cache (the
    handle ``cache=True`` compiles use). None means no cache: turned off, or it
    cannot be opened.

    URLs open with the chosen secret (``$CUFORGE_CACHE_SECRET``, else a settings
    file's ``secret_file``): every shared level then signs and verifies; once per
    process and secret. A value from the environment or a settings file never
    raises: one that cannot be used is a :class:`CacheWriteWarning` naming where it
    came from, once per process, and None. A ``cache`` URL the parser or its backend
    refuses raises ValueError (``cache: ...``), a ``cache`` of another type
    TypeError; one that cannot be opened (an ``OSError``) warns and gives None.

    With it, whether the handle is the caller's own to close: ``shared=False`` opens a
    URL's anew (a ``session()`` closes it at its end) -- never ``cache`` itself nor
    the default cache, which others use.
    """
    if isinstance(cache, ProgramCacheResource):
        return cache, False
    if cache is not None and not isinstance(cache, str):
        raise TypeError(
            "cache: expected a ProgramCacheResource, a cache URL or None, "
            f"got {type(cache).__name__}"
        )
    if cache is None and not (os.environ.get(env_var) or "").strip():
        try:
            return config.default_cache(), False  # warns itself, once, when unopenable
        except config.SelectionError as exc:  # a bad value, from the environment or a file
            _refused(exc)
            return None, False
    try:
        chosen = config.selection(cache, env_var=env_var)
    except config.SelectionError as exc:
        _refused(exc)
        return None, False
    if chosen.url is None:
        return None, False
    opened = _open(chosen, shared)
    return opened, opened is not None and not shared


def caching_off(env_var: str) -> str:
    """What turns caching off for this integration (``$env_var`` first; see
    :func:`select_cache`) -- ``$CUFORGE_TRITON_CACHE=off``, ``cache = 'off' in project
    config PATH``... -- or "" when it is on: tells a None from :func:`select_cache`
    that means off from one that means unavailable."""
    try:
        chosen = config.selection(env_var=env_var)
    except config.SelectionError:
        return ""
    return chosen.said() if chosen.url is None else ""


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
        """The payload stored for ``name``, or None (a miss, also when reading failed);
        a deferred store of this process not landed yet is read back (read your writes)."""
        key = self.key(name)
        queued = _behind.pending(self.cache, key) if _behind.queued else None
        entry: CacheEntry | None
        if queued is not None:
            entry = CacheEntry(*queued)
        else:
            try:
                entry = self.cache.get_entry(key)
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

    def store(
        self, name: str, data: bytes, fields: dict[str, str | int | None], *, defer: bool = False
    ) -> bool:
        """Store ``data`` for ``name`` with a record of ``fields``; False when dropped.
        ``defer``: hand the store to the write-behind queue (``_behind``) and return True
        at once; it lands in the background (flushed at exit), and a failure is the
        same warning, then."""
        meta = encode_record(self.kind, {"key": name, "name": _short(name), **fields})
        if defer:
            _behind.submit(self.cache, self.key(name), bytes(data), meta, self._store_failed)
            return True
        try:
            self.cache.set_entry(self.key(name), bytes(data), meta)
        except Exception as exc:  # a cache fault never fails the host's compile
            self._store_failed(exc)
            return False
        return True

    def _store_failed(self, exc: Exception) -> None:
        warnings.warn(
            f"cuforge {self.kind} cache: store failed ({type(exc).__name__}: {exc}); "
            "the result is used but not cached",
            CacheWriteWarning,
            stacklevel=outside_level(),
        )


def _short(name: str, limit: int = 80) -> str:
    """``name`` as ``cuforge cache ls`` shows it: at most ``limit`` characters."""
    return name if len(name) <= limit else name[: limit - 3] + "..."
