"""A job with every JIT cuforge knows wired to one cache: ``cuforge run``'s work, in
this process (for code that cannot be wrapped in a command).

::

    import cuforge.integrations

    with cuforge.integrations.session(cache="file:///local,redis://cache-host/0",
                                      warm_set="train-llama"):
        train()

On entry: the cache is opened (``cache=``, else ``$CUFORGE_CACHE``, else cuforge's
default); the warm set, if named, is prefetched into the cache's local level
(:mod:`~cuforge.integrations.warmsets`); the directory caches of JITs that only
have a directory (the mirror profiles ``cuforge.integrations.mirror`` finds active,
of ``configured_profiles()``: the built-ins and the settings files'
``[mirror.<name>]`` tables, as ``cuforge run`` reads them) are hydrated from the
cache; and JAX, Inductor, CuPy and Triton are wired to the cache
(:mod:`~cuforge.integrations._wiring`: now for systems already imported, at their
import for the others), and so is cuforge's own ``Program.compile(cache=True)``
(``storage.config.use_default``: process-wide, as the wiring, for every thread;
the default cache before is put back at exit). While it runs, what the job added is published every
``publish_every`` seconds (mirrors and the warm set), so a killed job loses little.
On exit: published once more -- the warm set made exactly what this job read or
stored when the block ended without an exception, added to otherwise; a job that
read or stored nothing through the cache records nothing, and one warning says so,
as ``cuforge run`` does -- the integrations unwired, and a cache the session opened
(from a URL or ``$CUFORGE_CACHE``) closed: its server connections too. A cache
object passed in, and cuforge's default cache, are left open: others use them.

Nothing here fails the job: a cache that cannot be opened is one warning and the
systems run as without cuforge; a prefetch, hydration or publish that fails is a
warning, and so is a bad ``[mirror.<name>]`` table (then no directory is mirrored).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from cuforge._stack import outside_level
from cuforge.storage import config
from cuforge.storage.base import CacheWriteWarning, ProgramCacheResource

from . import _behind, warmsets
from ._cache import selected
from ._wiring import Wiring

__all__ = ["Session", "each_mirror", "is_local", "open_mirrors", "prefetch_set", "session"]

#: The variable ``cuforge run`` gives its child: the directory of the run's journals.
ENV_JOURNAL = "CUFORGE_RUN_JOURNAL"
ENV_CACHE = "CUFORGE_CACHE"


def _warn(what: str) -> None:
    warnings.warn(f"cuforge: {what}", CacheWriteWarning, stacklevel=outside_level())


def open_mirrors(
    cache: ProgramCacheResource,
    env: dict[str, str] | None = None,
    path: list[str] | None = None,
    profiles: dict[str, Any] | None = None,
    imported: dict[str, str | None] | None = None,
) -> list[Any]:
    """A ``Mirror`` on ``cache`` for each mirror profile active in ``env`` (default:
    this environment) that is on; [] when the mirror module is not there or finds
    none. ``path``: the ``sys.path`` of the job's Python when ``cuforge run`` asked it
    (``cli._jobpython``): which JITs are installed, and their versions (what the
    entries' keys name), are read there -- never this Python's, whose JIT versions
    may differ; ``imported``: the ``version_from`` values read in that Python.
    ``profiles``: the profile set (default ``mirror.configured_profiles()``, the
    built-ins and the settings files'; a bad settings file is then a warning and no
    mirror). An active profile that is off (no version, no directory, ...) is one
    warning naming it and why when it comes from a settings file (an info line under
    ``-v`` for a built-in); one profile's fault is one warning, and the others go on.
    """
    try:
        from cuforge.integrations import mirror
    except ImportError:
        return []
    try:
        environ = dict(os.environ if env is None else env)
        table = mirror.configured_profiles() if profiles is None else profiles
        active = mirror.active_profiles(environ, table, path=path)
    except Exception as exc:  # a mirror never fails the job
        _warn(f"directory mirrors are not used ({type(exc).__name__}: {exc})")
        return []
    out = []
    for profile in active:
        try:
            version = profile.version(path, imported)
            if path is not None and not version:
                reason = f"{profile.name} is not installed (no version)"
            else:
                m = mirror.Mirror(profile, cache, version=version, env=env)
                reason = m.reason
                if not reason:
                    out.append(m)
                    continue
        except Exception as exc:  # this profile's fault is this profile's
            _warn(f"mirror {profile.name} is not used ({type(exc).__name__}: {exc})")
            continue
        if mirror.PROFILES.get(profile.name) != profile:  # a settings file's: said
            _warn(f"mirror {profile.name} is off: {reason}")
        else:
            from cuforge._log import get_logger

            get_logger("cuforge.mirror").info("mirror %s is off: %s", profile.name, reason)
    return out


def each_mirror(mirrors: list[Any], action: str) -> None:
    """Run ``action`` (``"hydrate"``, ``"publish"``) on each mirror; a mirror that
    fails is one warning, and the others go on."""
    for m in mirrors:
        try:
            getattr(m, action)()
        except Exception as exc:  # one mirror's fault is that mirror's
            _warn(f"mirror {action} failed ({type(exc).__name__}: {exc})")


class Session:
    """See the module docstring; :func:`session` is the context-manager form."""

    def __init__(
        self,
        cache: ProgramCacheResource | str | None = None,
        *,
        warm_set: str | None = None,
        publish_every: float = 60.0,
        systems: tuple[str, ...] | None = None,
        mirrors: bool = True,
    ) -> None:
        if warm_set is not None:
            warmsets.set_key(warm_set)  # ValueError for a bad name, before anything opens
        if publish_every <= 0:
            raise ValueError(f"publish_every: expected seconds > 0, got {publish_every!r}")
        self.cache, self._owned = selected(cache, ENV_CACHE, shared=False)
        self.warm_set = warm_set
        self.publish_every = publish_every
        self.recorder: warmsets.Recorder | None = None
        self.prefetched: warmsets.Prefetched | None = None
        self.wiring: Wiring | None = None
        self.mirrors: list[Any] = []
        self._systems = systems
        self._use_mirrors = mirrors
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publish_lock = threading.Lock()
        self._restore_default: Callable[[], None] | None = None

    def start(self) -> Session:
        """Prefetch, hydrate, wire, and start publishing periodically."""
        base = cache = self.cache
        if base is None or cache is None:
            return self  # off, or warned: every system runs as without cuforge
        if self.warm_set is not None:
            self.prefetched = prefetch_set(cache, self.warm_set)
            self.recorder = warmsets.Recorder(cache)
            cache = self.recorder
        if self._use_mirrors:  # through the recorder: mirrored entries join the warm set
            self.mirrors = open_mirrors(cache)
            each_mirror(self.mirrors, "hydrate")
        self.wiring = Wiring(cache, self._systems).start()
        self._restore_default = config.use_default(cache)  # compile(cache=True) too
        self._thread = threading.Thread(target=self._periodic, name="cuforge-publish", daemon=True)
        self._thread.start()
        return self

    def _periodic(self) -> None:
        while not self._stop.wait(self.publish_every):
            self.publish(final=False, ok=False)

    def publish(self, *, final: bool = False, ok: bool = True) -> None:
        """Publish the mirrors and the warm set now (``final`` and ``ok``: the set
        becomes exactly what was recorded; otherwise it is added to)."""
        if self.cache is None:
            return
        with self._publish_lock:
            each_mirror(self.mirrors, "publish")
            if self.recorder is not None and self.warm_set is not None:
                keys = self.recorder.keys()
                if keys:  # a job that recorded nothing leaves the set as it was
                    warmsets.publish(self.cache, self.warm_set, keys, replace=final and ok)
                elif final:  # `cuforge run`'s words: `warm --set NAME` finding none is no surprise
                    _warn(
                        f"warm set {self.warm_set!r}: the job read or stored nothing through "
                        "the cache, so nothing was recorded (a set stored before is left as "
                        "it was)"
                    )

    def close(self, ok: bool = True) -> None:
        """Let the stores written behind land, publish a last time, unwire, put the
        default cache back and close the cache the session opened; idempotent."""
        _behind.flush()  # the warm set and the mirrors then include every store
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.wiring is not None:
            self.wiring.stop()
            self.wiring = None
            self.publish(final=True, ok=ok)
        if self._restore_default is not None:
            self._restore_default()
            self._restore_default = None
        if self.recorder is not None:
            self.recorder.close()
        if self._owned and self.cache is not None:
            self._owned = False
            try:
                self.cache.close()
            except Exception as exc:  # closing never fails the job
                _warn(f"closing the cache failed ({type(exc).__name__}: {exc})")


def prefetch_set(cache: ProgramCacheResource, name: str) -> warmsets.Prefetched | None:
    """Prefetch the warm set ``name`` into ``cache``'s local level; None when there is
    no such set yet, or no local level to fetch into (warned)."""
    found = warmsets.load_set(cache, name)
    if found is None or not found.keys:
        return None
    tier = warmsets.local_tier(cache)
    if tier is None:
        if is_local(cache):  # a local cache has nothing to fetch from: nothing to say
            return None
        _warn(
            f"warm set {name!r}: the cache has no local level to prefetch into (use a tier "
            "such as file:///local/dir,redis://host/0); nothing prefetched"
        )
        return None
    return warmsets.prefetch(tier, found.keys, name=name, pack=found.pack)


def is_local(cache: ProgramCacheResource) -> bool:
    """Whether ``cache`` is one local level (a directory or a database file)."""
    from cuforge.storage.filestream import FileStreamProgramCache
    from cuforge.storage.sqlite import SQLiteProgramCache

    for _ in range(4):
        inner = getattr(cache, "inner", None)
        if not isinstance(inner, ProgramCacheResource):
            break
        cache = inner
    return isinstance(cache, (FileStreamProgramCache, SQLiteProgramCache))


@contextlib.contextmanager
def session(
    cache: ProgramCacheResource | str | None = None,
    *,
    warm_set: str | None = None,
    publish_every: float = 60.0,
    systems: tuple[str, ...] | None = None,
    mirrors: bool = True,
) -> Iterator[Session]:
    """Run the block with every JIT wired to one cache (see the module docstring).

    ``cache``: a cache, a cache URL, or None for ``$CUFORGE_CACHE`` (else cuforge's
    default). ``warm_set``: the name to prefetch and record. ``systems``: which of
    ``"jax"``, ``"inductor"``, ``"cupy"`` to wire (default: all; Triton always).
    ValueError for a bad ``warm_set`` name or ``cache`` URL.
    """
    s = Session(
        cache, warm_set=warm_set, publish_every=publish_every, systems=systems, mirrors=mirrors
    ).start()
    ok = False
    try:
        yield s
        ok = True
    finally:
        s.close(ok=ok)
