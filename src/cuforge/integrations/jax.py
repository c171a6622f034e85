"""JAX's persistent compilation cache on a cuforge cache.

``install()`` puts a cuforge backend behind JAX's persistent compilation cache: every
executable JAX would write to its cache directory goes to a cuforge cache instead
(kind ``jax``, JAX's own cache key in the record), and every lookup JAX makes is
answered from it -- with integrity on every read, signing (with
``$CUFORGE_CACHE_SECRET`` an unsigned, tampered or foreign-signed executable is a
miss and JAX compiles), any backend (a shared directory, SQLite, Redis, S3, tiers),
a size cap, and a cache fault that is a miss or a dropped store, never a failed
compile.

**How the hook is found.** JAX keeps its cache in ``jax._src.compilation_cache``:
the module global ``_cache`` (a ``CacheInterface``: ``get(key) -> bytes | None``,
``put(key, bytes)``), created from ``jax_compilation_cache_dir`` the first time a
compile asks for it (``_initialize_cache``, guarded by ``_cache_initialized``).
``install()`` sets both, so JAX never builds its own, and JAX's flow (``get`` on
every compile whose key it computes, ``put`` after a compile that passed JAX's
thresholds) reaches cuforge. Those names are JAX's private API: ``install()`` checks
for them and refuses a JAX without them in one line. Tested with jax 0.10.0.

**Keys that mean the same on every host.** When ``jax_compilation_cache_dir`` is
set, JAX also turns on XLA's own caches under that directory (the per-fusion
autotune directory, by default) and their paths go into the compile options it
hashes into every key: two hosts whose cache directories differ never share an
entry. Through cuforge no directory is needed (the cache is not a directory), so
leave ``jax_compilation_cache_dir`` unset: keys are then the same wherever the
job runs. ``install()`` warns when it is set.

**Single-flight.** JAX's miss and its store are one call (``compiler.
_compile_and_write_cache``: compile, then write when the compile took at least
``jax_persistent_cache_min_compile_time_secs``). Where that function has the
signature read from jax 0.10, ``install()`` wraps it: the miss takes the cache's
per-key lock, looks again (a peer may have stored it meanwhile) and compiles only
on a second miss; the lock is released when the call returns or raises, so a
compile JAX does not store (below its thresholds) or that fails never holds it.
Elsewhere JAX still hits and stores through cuforge, without single-flight.

JAX's thresholds stay JAX's: ``jax_persistent_cache_min_compile_time_secs``
(default 1 s) and ``jax_persistent_cache_min_entry_size_bytes`` decide what is
written (0 writes everything). Importing this module imports nothing; ``install()``
imports jax.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from typing import TYPE_CHECKING, Any

from cuforge import _warm
from cuforge._stack import outside_level
from cuforge.storage.base import CacheWriteWarning

from ._cache import ForeignEntries, select_cache

if TYPE_CHECKING:
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["ENV_CACHE", "counters", "install", "installed", "uninstall"]

#: A cache URL for JAX only (else what ``cache=True`` uses: docs/cache.md); ``off``.
ENV_CACHE = "CUFORGE_JAX_CACHE"
_KIND = "jax"
_TESTED = "tested with jax 0.10.0"
#: The parameters of ``compiler._compile_and_write_cache`` the single-flight wrapper
#: relies on (read from jax 0.10.0).
_WRITE_PARAMS = (
    "backend",
    "computation",
    "executable_devices",
    "compile_options",
    "host_callbacks",
    "module_name",
    "cache_key",
)

#: This process's lookups through cuforge: ``hits``, ``misses``, ``stored``,
#: ``waited`` (misses answered by a peer's compile after waiting on its lock).
counters: dict[str, int] = {"hits": 0, "misses": 0, "stored": 0, "waited": 0}

_state: dict[str, Any] = {"cache": None, "original": None}  # values: Any, never narrowed
_mutex = threading.Lock()


def _jax_modules() -> tuple[Any, Any, Any]:
    """(jax, jax._src.compilation_cache, jax._src.compiler), checked to have the
    hook; RuntimeError (one line) otherwise."""
    try:
        import jax
        from jax._src import compilation_cache, compiler
    except ImportError as exc:
        raise RuntimeError(f"cuforge.integrations.jax needs jax ({exc})") from None
    missing = [
        name
        for name in ("_cache", "_cache_initialized", "_cache_initialized_mutex", "reset_cache")
        if not hasattr(compilation_cache, name)
    ]
    try:
        from jax._src.compilation_cache_interface import CacheInterface
    except ImportError:
        missing.append("compilation_cache_interface.CacheInterface")
    else:
        if not {"get", "put"} <= set(getattr(CacheInterface, "__abstractmethods__", ())):
            missing.append("CacheInterface.get/put")
    if missing:
        raise RuntimeError(
            f"cuforge.integrations.jax: jax {jax.__version__} lacks "
            f"jax._src.compilation_cache.{', '.join(missing)} ({_TESTED}); "
            "this jax cannot use a cuforge cache"
        )
    return jax, compilation_cache, compiler


@functools.cache
def _cache_class() -> type:
    """A ``CacheInterface`` whose get/put are cuforge entries of kind ``jax``."""
    import pathlib

    from jax._src.compilation_cache_interface import CacheInterface

    class CuforgeJaxCache(CacheInterface):  # type: ignore[misc]
        """JAX's persistent cache on a cuforge cache (see the module docstring)."""

        def __init__(self, cache: ProgramCacheResource) -> None:
            self.cache = cache
            self._entries = ForeignEntries(cache, _KIND)
            # JAX logs ``_cache._path`` when it resets its cache; no directory here.
            self._path = pathlib.Path(f"cuforge:{type(cache).__name__}")

        def get(self, key: str) -> bytes | None:
            data = self._entries.load(key)
            counters["hits" if data is not None else "misses"] += 1
            return data

        def put(self, key: str, value: bytes) -> None:
            if _state["original"] is None:  # no single-flight wrapper saw the compile
                _warm.note_compile("jax", key.split("-", 1)[0], self.cache)
            if self._entries.store(key, bytes(value), {"cache": "executable"}):
                counters["stored"] += 1

    return CuforgeJaxCache


def _single_flight(original: Any, compilation_cache: Any) -> Any:
    """``original`` (``_compile_and_write_cache``) under the cache key's lock: a miss
    waits for a peer compiling the same module, looks again, and compiles only when
    the entry is still missing. The lock is released when the call returns or raises
    (closes the race of N processes missing one module at once: each compiled it)."""

    @functools.wraps(original)
    def compile_and_write(
        backend: Any,
        computation: Any,
        executable_devices: Any,
        compile_options: Any,
        host_callbacks: Any,
        module_name: str,
        cache_key: str,
    ) -> Any:
        ours: Any = _state["cache"]
        current = getattr(compilation_cache, "_cache", None)
        if ours is None or id(current) != id(ours):  # another cache in use: JAX's own flow
            return original(
                backend, computation, executable_devices, compile_options,
                host_callbacks, module_name, cache_key,
            )  # fmt: skip
        lock_key = ours._entries.key(cache_key)
        try:
            locking = ours.cache.lock(lock_key)
            locking.__enter__()
        except Exception as exc:  # a lock fault costs a duplicate compile, no more
            warnings.warn(
                f"cuforge jax cache: lock failed ({type(exc).__name__}: {exc}); compiling "
                "without single-flight",
                CacheWriteWarning,
                stacklevel=outside_level(),
            )
            locking = None
        try:
            # Look again whether or not the lock is held: a lock yields False at once
            # when the holder has just stored the entry (the protocol's step 3).
            if ours._entries.load(cache_key) is not None:  # a peer stored it
                found, _ = compilation_cache.get_executable_and_time(
                    cache_key, compile_options, backend, executable_devices
                )
                if found is not None:
                    counters["waited"] += 1
                    return found
            _warm.note_compile("jax", module_name, ours.cache)
            return original(
                backend, computation, executable_devices, compile_options,
                host_callbacks, module_name, cache_key,
            )  # fmt: skip
        finally:
            if locking is not None:
                locking.__exit__(None, None, None)

    compile_and_write.__cuforge_original__ = original  # type: ignore[attr-defined]
    return compile_and_write


def install(cache: ProgramCacheResource | str | None = None) -> ProgramCacheResource | None:
    """Serve JAX's persistent compilation cache from ``cache``; returns the cache in use.

    ``cache`` is a cache, a cache URL, or None for ``$CUFORGE_JAX_CACHE``, else the
    cache ``cache=True`` uses (docs/cache.md, "Which cache"). Returns None (and
    installs nothing) when that is ``off`` or cannot be opened (one warning naming
    where it came from and why; a value from the environment never raises). Installing again
    replaces the previous cache. Raises RuntimeError (one line) when jax lacks the
    hook, ValueError for a ``cache`` URL the parser or its backend refuses.
    """
    jax, compilation_cache, compiler = _jax_modules()
    chosen = select_cache(cache, ENV_CACHE)
    if chosen is None:
        return None
    if jax.config.jax_compilation_cache_dir:
        warnings.warn(
            "cuforge jax cache: jax_compilation_cache_dir is set "
            f"({jax.config.jax_compilation_cache_dir!r}); JAX folds paths under it into "
            "every cache key, so hosts whose directories differ share nothing. Leave it "
            "unset under cuforge",
            CacheWriteWarning,
            stacklevel=outside_level(),
        )
    ours = _cache_class()(chosen)
    with _mutex, compilation_cache._cache_initialized_mutex:
        compilation_cache._cache = ours
        compilation_cache._cache_initialized = True
        _state["cache"] = ours
        current = getattr(compiler, "_compile_and_write_cache", None)
        if current is not None and not hasattr(current, "__cuforge_original__"):
            try:
                params = tuple(inspect.signature(current).parameters)
            except (TypeError, ValueError):
                params = ()
            if params == _WRITE_PARAMS and hasattr(compilation_cache, "get_executable_and_time"):
                _state["original"] = current
                compiler._compile_and_write_cache = _single_flight(current, compilation_cache)
    return chosen


def installed() -> ProgramCacheResource | None:
    """The cache JAX's persistent cache uses through cuforge now, or None."""
    ours: Any = _state["cache"]
    if ours is None:
        return None
    import sys

    compilation_cache = sys.modules.get("jax._src.compilation_cache")
    if compilation_cache is None or id(getattr(compilation_cache, "_cache", None)) != id(ours):
        return None
    chosen: ProgramCacheResource = ours.cache
    return chosen


def uninstall() -> None:
    """Give JAX its own cache back (built again from ``jax_compilation_cache_dir`` at the
    next compile, as JAX does after ``reset_cache``)."""
    _, compilation_cache, compiler = _jax_modules()
    with _mutex:
        ours, _state["cache"] = _state["cache"], None
        original, _state["original"] = _state["original"], None
        if original is not None:
            compiler._compile_and_write_cache = original
        with compilation_cache._cache_initialized_mutex:
            if ours is not None and compilation_cache._cache is ours:
                compilation_cache._cache = None
                compilation_cache._cache_initialized = False
