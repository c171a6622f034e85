"""Which cache, and is it off: one answer for ``Program.compile(cache=True)``,
:func:`default_cache`, the ``cuforge`` command line and every integration.

:func:`select` decides (docs/cache.md, "Which cache", says it for users). First
match wins; ``off`` (any case), wherever it comes from, means no cache:

1. the argument: ``--cache URL|DIR`` (``--no-cache`` is ``off``), an integration's
   ``cache=``;
2. an integration's own variable (``$CUFORGE_TRITON_CACHE``, ...);
3. ``$CUFORGE_CACHE``;
4. ``$CUFORGE_CACHE_DIR`` (the older spelling);
5. ``cache`` in the project's settings file, then in the user's (``storage.settings``);
6. the user cache directory (``default_cache_dir()``).

A value is a cache URL or a directory (``storage.urls``). Plain directories are made
absolute when chosen (``~`` expanded; a settings file's relative to that file), so a
directory named ``off`` is written ``./off``. The signing secret is
``$CUFORGE_CACHE_SECRET``, else the file ``$CUFORGE_CACHE_SECRET_FILE`` names, else
the settings files' ``secret_file`` (both files read by ``_env.secret_from_file``);
it reaches ``open_cache`` as an argument, never through ``os.environ``. The size cap is the
caller's (``--max-size``: refused where the last level takes none or its URL names
one), else the URL's own ``max_size``, else the settings files' ``max_size`` where
the last level takes a cap.

Errors: a bad value (a URL that does not parse, a bad settings file, size or secret,
a ``secret_file`` that cannot be read) is a :class:`SelectionError`, a ValueError
whose message starts with where the value came from. :meth:`Selection.open` opens;
:meth:`Selection.explain` words any failure of it the same way. What a failure means
is the caller's: the command line exits 2; :func:`default_cache` raises a bad value
and warns (compiling uncached) for a cache that cannot be opened; an integration
warns for anything the environment or a settings file named.

:func:`default_cache` runs on every ``cache=True`` compile: it compares
``$CUFORGE_CACHE``, ``$CUFORGE_CACHE_DIR`` and ``$CUFORGE_CACHE_SECRET`` with the
values it opened under and returns the same handle while they hold. The Python API
reads the settings files once per process and state of those variables
(:func:`selection`): a process keeps the cache it chose when a settings file is
edited or its working directory changes. The command line chooses afresh at every
command.
"""

from __future__ import annotations

import os
import threading
import warnings

from cuforge._stack import outside_level

from . import _capwords
from ._env import (
    ENV_CACHE,
    ENV_CACHE_DIR,
    ENV_SECRET,
    ENV_SECRET_FILE,
    secret_file_from_env,
    secret_from_env,
    secret_from_file,
)
from .base import CacheWriteWarning, ProgramCacheResource

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .absent import Absent
    from .settings import Setting
    from .urls import CacheSpec

__all__ = [
    "DEFAULT_ORIGIN",
    "ENV_CACHE",
    "ENV_CACHE_DIR",
    "ENV_SECRET",
    "ENV_SECRET_FILE",
    "Selection",
    "SelectionError",
    "default_cache",
    "open_default_cache",
    "secret_file_from_env",
    "secret_from_env",
    "secret_from_file",
    "select",
    "selection",
    "use_default",
    "wrap_default",
]

_OFF = "off"
#: The origin of the last rule: no argument, variable or settings file named a cache.
DEFAULT_ORIGIN = "the default cache directory"
#: The origin of the Python API's ``cache=`` argument.
ARGUMENT = "cache"
_CAPPED = ("file", "sqlite", "memory")  # schemes whose caches take max_size


class SelectionError(ValueError):
    """A value that cannot choose a cache; ``str()`` is ``WHERE: REASON``. ``where``
    names the flag, variable, argument or settings file (empty where ``reason`` names
    it); ``of_argument`` says whether the caller's argument itself is at fault (not
    the environment or a file). ``chosen`` is the cache that was being chosen when
    the error came (:meth:`Selection.named`; empty if none was yet), ``chosen_where``
    its :attr:`Selection.where`."""

    def __init__(self, where: str, reason: str, of_argument: bool = False) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.where, self.reason, self.of_argument = where, reason, of_argument
        self.chosen = self.chosen_where = ""

    def about(self, chosen: Selection) -> SelectionError:
        """This error, saying it came while choosing ``chosen``."""
        self.chosen, self.chosen_where = chosen.named(), chosen.where
        return self

    def copy(self) -> SelectionError:
        """A new exception saying the same (one raised again keeps no old traceback)."""
        twin = SelectionError(self.where, self.reason, self.of_argument)
        twin.chosen, twin.chosen_where = self.chosen, self.chosen_where
        return twin

    def detail(self) -> str:
        """What is wrong, for a message that already names :attr:`chosen`."""
        return self.reason if self.where in ("", self.chosen_where) else str(self)


class Selection:
    """A chosen cache: ``url`` to open (None: caching is off), ``origin`` (the flag,
    variable, argument, ``project config PATH``/``user config PATH``, or
    :data:`DEFAULT_ORIGIN`), ``value`` as it was written there, ``secret`` (bytes or
    None), where it came from and ``secret_file`` (the absolute path of the file it
    was read from; "" when it came from ``$CUFORGE_CACHE_SECRET`` or there is none),
    and ``cap`` (bytes, or None) to open it with."""

    __slots__ = ("cap", "origin", "secret", "secret_file", "secret_origin", "url", "value")

    def __init__(
        self,
        url: str | None,
        origin: str,
        value: str | None = None,
        secret: bytes | None = None,
        secret_origin: str = "",
        cap: int | None = None,
        secret_file: str = "",
    ) -> None:
        self.url, self.origin = url, origin
        self.value = (url or _OFF) if value is None else value
        self.secret, self.secret_origin, self.cap = secret, secret_origin, cap
        self.secret_file = secret_file

    @property
    def off(self) -> bool:
        return self.url is None

    @property
    def where(self) -> str:
        """The origin as messages start: ``$CUFORGE_CACHE``, ``--cache``, ``cache in
        project config PATH``..."""
        return _where(self.origin)

    def named(self) -> str:
        """Where and what, for a warning: ``$CUFORGE_CACHE='redis://...'``."""
        if self.origin.startswith("$") or self.origin == ARGUMENT:
            return f"{self.origin}={self.value!r}"
        if self.origin.startswith(_FILE_ORIGINS):
            return f"cache={self.value!r} in {self.origin}"
        return f"{self.origin} {self.value!r}"

    def said(self) -> str:
        """What turned caching off, or chose this cache: ``--no-cache``,
        ``--cache off``, ``$CUFORGE_CACHE=off``, ``cache = "off" in user config PATH``."""
        if self.origin == "--no-cache":
            return self.origin
        if self.origin.startswith("-"):
            return f"{self.origin} {self.value}"
        if self.origin.startswith(_FILE_ORIGINS):
            return f"cache = {self.value!r} in {self.origin}"
        if self.origin.startswith("$"):
            return f"{self.origin}={self.value}"
        return self.named()

    def target(self) -> str:
        """The URL to open (not off): ``url`` with the cap as ``max_size``."""
        assert self.url is not None, "caching is off"
        if self.cap is None:
            return self.url
        last = self.url.rsplit(",", 1)[-1]
        return f"{self.url}{'&' if '?' in last else '?'}max_size={self.cap}"

    def shown(self) -> str:
        """``url`` for people: a password shown as ``***``."""
        if self.url is None:
            return "(no cache)"
        import re

        return re.sub(r"(://[^/@,]*?:)[^/@,]*@", r"\1***@", self.url)

    def open(self, *, read_only: bool = False) -> ProgramCacheResource:
        """A new handle on the cache (not off), signed with ``secret``; ``read_only``
        opens to look (``open_cache(read_only=True)``). What the backend raises
        propagates: :meth:`explain` words it."""
        from .urls import open_cache

        return open_cache(self.target(), secret=self.secret, read_only=read_only)

    def explain(self, exc: BaseException) -> str:
        """One line for ``exc`` (choosing or opening failed): where the choice came
        from, then what is wrong."""
        if isinstance(exc, SelectionError):
            return str(exc)
        return f"{self.where}: {self.reason(exc)}"

    def refusal(self, exc: BaseException) -> SelectionError:
        """``exc`` (opening refused a value) as a SelectionError naming this choice."""
        refused = SelectionError(self.where, self.reason(exc), self.origin == ARGUMENT)
        return refused.about(self)

    def reason(self, exc: BaseException) -> str:
        """What is wrong, without where the choice came from."""
        if isinstance(exc, SelectionError):
            return exc.reason
        if isinstance(exc, ImportError):
            return f"the backend is not installed ({exc})"
        from ._safedir import CachePathError

        if isinstance(exc, (CachePathError, ValueError, TypeError)):
            return str(exc)
        location = self._location()
        if isinstance(exc, FileExistsError):
            return f"{location} exists and is not a directory"
        if isinstance(exc, NotADirectoryError):
            return f"a parent of {location} is not a directory"
        if isinstance(exc, OSError):
            return f"cannot use {exc.filename or location}: {exc.strerror or exc}"
        return f"{type(exc).__name__}: {exc}"

    def missing(self, tier_ro_too: bool = True) -> Absent | None:
        """The first level (not off) whose directory or database file does not exist:
        the cache is not there yet. None when every such level exists.
        ``tier_ro_too=False`` passes over a tier's ``?ro`` level, which a compile reads
        as an empty cache and never creates (a lone ``?ro`` cache still counts)."""
        from .urls import parse_cache_url

        specs = parse_cache_url(self.url or "")
        for spec in specs:
            if spec.scheme not in ("file", "sqlite") or os.path.lexists(spec.location):
                continue
            if not tier_ro_too and spec.read_only and len(specs) > 1:
                continue
            from .absent import Absent  # a command about to create a cache asks

            return Absent(spec.scheme, spec.location)
        return None

    def _location(self) -> str:
        from .urls import parse_cache_url

        try:
            return parse_cache_url(self.url or "")[-1].location
        except ValueError:
            return self.value

    def __repr__(self) -> str:
        return f"Selection({self.shown()!r}, {self.origin!r})"


#: How ``storage.settings`` names the files a setting came from.
_FILE_ORIGINS = ("project config ", "user config ")


# -- choosing ------------------------------------------------------------------------------
def select(
    cache: str | None = None,
    *,
    origin: str = ARGUMENT,
    env_var: str | None = None,
    max_size: int | None = None,
    max_size_origin: str = "max_size",
) -> Selection:
    """The cache the argument ``cache`` (named ``origin`` in messages), the variable
    ``env_var`` (an integration's own), the environment and the settings files choose
    -- see the module docstring. ``max_size``: the caller's cap (``--max-size``).

    Raises SelectionError naming where the bad value came from. Reads the settings
    files each call: the Python API goes through :func:`selection`.
    """
    value, where = _first(cache, origin, env_var)
    if value.lower() == _OFF:
        if max_size is not None:
            raise SelectionError(
                max_size_origin, f"applies to a cache, and caching is off ({where})", True
            )
        return Selection(None, where, value)
    from .urls import absolute_paths, check_levels, parse_cache_url

    chosen = Selection(None, where, value)
    try:
        try:
            specs = parse_cache_url(value)  # what was written: errors show it
            for spec in specs:
                spec.size("max_size")  # the cap is weighed below: its value first
            check_levels(specs)  # what opening would refuse in any level's URL itself
        except ValueError as exc:
            raise SelectionError(_where(where), str(exc), where == origin) from None
        cap = _cap(specs, where, max_size, max_size_origin)
        secret, secret_origin, secret_file = _secret()
    except SelectionError as exc:
        raise exc.about(chosen) from None
    return Selection(absolute_paths(value), where, value, secret, secret_origin, cap, secret_file)


def _first(cache: str | None, origin: str, env_var: str | None) -> tuple[str, str]:
    """(value, origin) of the first rule that names a cache."""
    if cache is not None:
        if not cache.strip():
            raise SelectionError(origin, "cache URL is empty", True)
        return cache.strip(), origin
    for name in (env_var, ENV_CACHE, ENV_CACHE_DIR):
        value = (os.environ.get(name) or "").strip() if name else ""
        if value:
            return value, f"${name}"
    found = _setting("cache")
    if found is not None:
        return found.value, found.origin
    from .filestream import default_cache_dir

    return default_cache_dir(), DEFAULT_ORIGIN


def _where(origin: str) -> str:
    """``origin`` as a message starts: a settings file's value is ``cache in FILE``."""
    return f"cache in {origin}" if origin.startswith(_FILE_ORIGINS) else origin


def _setting(name: str) -> Setting | None:
    from . import settings

    try:
        return settings.setting(name)
    except ValueError as exc:  # names the file (and the key) itself
        refused = SelectionError("", str(exc))
        if isinstance(exc, settings.SettingsFileError):  # its rule was choosing (cache =)
            refused.chosen_where = _where(exc.origin)
        raise refused from None


def _cap(specs: list[CacheSpec], where: str, given: int | None, given_origin: str) -> int | None:
    """The cap to open with: ``given`` (the caller's: the last level must take one and
    name none), else None where the URL names one, else the settings files'."""
    last = specs[-1]
    takes = last.scheme in _CAPPED
    if given is not None:
        if not takes:
            raise SelectionError(
                given_origin, _capwords.uncapped(specs, _where(where), given, _CAPPED), True
            )
        if "max_size" in last.params:
            raise SelectionError(
                given_origin,
                f"{_where(where)} sets max_size={last.params['max_size']} already: give one",
                True,
            )
        small = _capwords.too_small(last.scheme, given)
        if small is not None:
            raise SelectionError(given_origin, small, True)
        return given
    found = _setting("max_size")
    if found is None:
        return None
    from .units import parse_size

    try:
        cap = parse_size(found.value)
    except ValueError as exc:
        raise SelectionError(f"max_size in {found.origin}", str(exc)) from None
    if not takes or "max_size" in last.params:
        return None
    small = _capwords.too_small(last.scheme, cap)
    if small is not None:
        raise SelectionError(f"max_size in {found.origin}", small)
    return cap


def _secret() -> tuple[bytes | None, str, str]:
    """(the secret, where it came from, the file it was read from or ""):
    ``$CUFORGE_CACHE_SECRET``, else the file ``$CUFORGE_CACHE_SECRET_FILE`` names, else
    ``secret_file``."""
    path = secret_file_from_env()
    if os.environ.get(ENV_SECRET) or path is not None:
        try:
            secret = secret_from_env()
        except ValueError as exc:  # names the variable (and the file)
            raise SelectionError("", str(exc)) from None
        if path is None:
            return secret, f"${ENV_SECRET}", ""
        return secret, f"${ENV_SECRET_FILE}", path
    found = _setting("secret_file")
    if found is None:
        return None, "", ""
    source = f"secret_file {found.value} ({found.origin})"
    try:
        return secret_from_file(found.value, source), found.origin, found.value
    except ValueError as exc:
        raise SelectionError("", str(exc)) from None


# -- the Python API ------------------------------------------------------------------------
def _environment_reader() -> Callable[[], tuple[object, ...]]:
    """A function returning the three variables :func:`default_cache` watches, as
    ``os.environ`` stores them (None where unset): only ever compared with an earlier
    result of the same function.

    ``os.environ.get`` costs ~250 ns a variable and ~550 ns an unset one (a KeyError
    inside); CPython's ``os.environ`` keeps its values in a dict, which every write
    through ``os.environ`` updates, so one lookup each there gives the same answer in
    ~25 ns. Anywhere that layout is missing, or after ``os.environ`` was replaced,
    ``get`` answers.
    """
    environ = os.environ
    data = getattr(environ, "_data", None)
    encode = getattr(environ, "encodekey", None)
    names = (ENV_CACHE, ENV_CACHE_DIR, ENV_SECRET)

    def slow() -> tuple[object, ...]:
        return tuple(map(os.environ.get, names))

    if type(data) is not dict or not callable(encode):
        return slow
    get = data.get
    a, b, c = (encode(name) for name in names)

    def fast() -> tuple[object, ...]:
        if os.environ is environ:
            return (get(a), get(b), get(c))
        return slow()

    return fast


_environment = _environment_reader()
_mutex = threading.Lock()
#: (the environment it was opened under, the handle) of :func:`default_cache`.
_current: tuple[tuple[object, ...], ProgramCacheResource | None] | None = None
#: What :func:`default_cache` hands out in place of each handle it opens (see
#: :func:`wrap_default`); None: the handle itself.
_wrap: Callable[[ProgramCacheResource], ProgramCacheResource] | None = None
#: :func:`selection`'s answers, by argument, variable and the environment's values.
_selections: dict[tuple[object, ...], Selection | SelectionError] = {}


def selection(cache: str | None = None, *, env_var: str | None = None) -> Selection:
    """:func:`select` for the Python API (the argument is named ``cache``), remembered
    per argument and value of ``env_var`` and the three variables: the settings files
    are read once per process and state of the environment. Raises SelectionError."""
    own = os.environ.get(env_var) if env_var else None
    key = (cache, env_var, own, *_environment())
    found = _selections.get(key)
    if found is None:
        try:
            found = select(cache, env_var=env_var)
        except SelectionError as exc:
            found = exc
        with _mutex:
            if len(_selections) > 64:  # a process cycling through many values
                _selections.clear()
            _selections[key] = found
    if isinstance(found, SelectionError):
        raise found.copy()
    return found


def open_default_cache() -> ProgramCacheResource | None:
    """A new handle on the cache the environment and the settings files choose (None
    when off). Raises ValueError naming where a bad value came from; errors opening
    the backend (OSError: a directory that cannot be created or is unsafe) propagate.
    """
    chosen = select()
    if chosen.url is None:
        return None
    try:
        return chosen.open()
    except ValueError as exc:
        raise chosen.refusal(exc) from None


def default_cache() -> ProgramCacheResource | None:
    """The process-wide default cache: what ``cache=True`` compiles through (None when
    off, or when it cannot be opened: one CacheWriteWarning naming where it came from
    and why).

    Opened at the first call and kept; chosen and opened again only when
    ``CUFORGE_CACHE``, ``CUFORGE_CACHE_DIR`` or ``CUFORGE_CACHE_SECRET`` changed (the
    old handle is left to its users). Raises ValueError naming where a bad value came
    from (a variable, a settings file).
    """
    global _current
    env = _environment()
    current = _current
    if current is not None and current[0] == env:
        return current[1]
    with _mutex:
        if _current is not None and _current[0] == env:
            return _current[1]
        chosen = select()
        cache = None
        if chosen.url is not None:
            try:
                cache = chosen.open()
            except ValueError as exc:
                raise chosen.refusal(exc) from None
            except OSError as exc:
                warnings.warn(
                    f"cuforge: {chosen.explain(exc)}; compiling without a cache "
                    "(docs/cache.md, 'Which cache', says how to choose another)",
                    CacheWriteWarning,
                    stacklevel=outside_level(),
                )
        if cache is not None and _wrap is not None:
            cache = _wrap(cache)
        _current = (env, cache)
        return cache


def wrap_default(wrap: Callable[[ProgramCacheResource], ProgramCacheResource]) -> None:
    """Have :func:`default_cache` hand out ``wrap(handle)`` for every handle it opens
    from now on -- ``cuforge run --warm-set``'s recorder, so the job's own
    ``compile(cache=True)`` reads and stores join the warm set. A handle opened
    before is dropped (the next call opens and wraps one). Costs nothing on the hit
    path: the wrapped handle is the one remembered."""
    global _current, _wrap
    with _mutex:
        _wrap = wrap
        _current = None


def use_default(cache: ProgramCacheResource | None) -> Callable[[], None]:
    """Have :func:`default_cache` hand out ``cache`` (process-wide, every thread: what
    ``cache=True`` compiles through) -- ``session()``'s cache, as ``cuforge run``'s
    ``$CUFORGE_CACHE`` gives its job's -- and return the function that puts back the
    handle it replaced. Costs nothing on the hit path: ``cache`` becomes the handle
    remembered for the environment as it is now. Should ``CUFORGE_CACHE``,
    ``CUFORGE_CACHE_DIR`` or ``CUFORGE_CACHE_SECRET`` change meanwhile, the cache
    they name is opened as before (the environment's word is the later one), and the
    restore then leaves that one in place. Restores nest: undo in reverse order.
    Under :func:`wrap_default` (``cuforge run --warm-set``), ``wrap(cache)`` is handed
    out: the run's warm set records these compiles too."""
    global _current
    with _mutex:
        if cache is not None and _wrap is not None:
            cache = _wrap(cache)
        before = _current
        mine = _current = (_environment(), cache)

    def restore() -> None:
        global _current
        with _mutex:
            if _current is mine:  # not replaced since (a changed environment's own)
                _current = before

    return restore
