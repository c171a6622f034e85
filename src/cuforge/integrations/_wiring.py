"""Wiring every JIT cuforge knows to one cache, in this process.

:class:`Wiring` installs each integration on one cache object -- now for the
systems already imported, and for the others the moment they are imported (an
import hook that runs after the module's own code, so ``import jax`` in user code
is all it takes): JAX (``jax``), PyTorch Inductor (``torch._inductor.remote_cache``)
and CuPy (``cupy``) through their ``install(cache)``; Triton through
:func:`triton_override`, which ``cuforge.integrations.triton.triton_cache`` asks
first (Triton finds cuforge's manager by ``$TRITON_CACHE_MANAGER``, which the
wiring sets when it is unset).

Installing never breaks the user's import or compile: an integration that refuses
(a system without the hook) or fails is one :class:`CacheWriteWarning` and that
system runs as without cuforge.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from cuforge._stack import outside_level
from cuforge.storage.base import CacheWriteWarning, ProgramCacheResource

__all__ = ["SYSTEMS", "TRITON_MANAGER", "Wiring", "triton_override"]

TRITON_MANAGER = "cuforge.integrations.triton:CuforgeCacheManager"

_mutex = threading.Lock()
#: The cache Triton's manager uses in this process while a wiring is active.
_triton: list[ProgramCacheResource] = []


def triton_override() -> ProgramCacheResource | None:
    """The cache an active :class:`Wiring` gives Triton, or None (Triton's manager
    then selects its cache from the environment)."""
    return _triton[-1] if _triton else None


def _install_triton(cache: ProgramCacheResource) -> Callable[[], None]:
    with _mutex:
        _triton.append(cache)

    def undo() -> None:
        with _mutex:
            for i in range(len(_triton) - 1, -1, -1):
                if _triton[i] is cache:
                    del _triton[i]
                    break

    return undo


def _install_jax(cache: ProgramCacheResource) -> Callable[[], None]:
    from cuforge.integrations import jax as adapter

    adapter.install(cache)
    return adapter.uninstall


def _install_inductor(cache: ProgramCacheResource) -> Callable[[], None]:
    from cuforge.integrations import inductor as adapter

    adapter.install(cache)
    return adapter.uninstall


def _install_cupy(cache: ProgramCacheResource) -> Callable[[], None]:
    from cuforge.integrations import cupy as adapter

    adapter.install(cache)
    return lambda: None  # CuPy has no way back to its own backend but a new one


#: The module whose import triggers each integration, and its installer.
_SYSTEMS: dict[str, tuple[str, Callable[[ProgramCacheResource], Callable[[], None]]]] = {
    "triton": ("triton", _install_triton),
    "jax": ("jax", _install_jax),
    "inductor": ("torch._inductor.remote_cache", _install_inductor),
    "cupy": ("cupy", _install_cupy),
}
#: Every system :class:`Wiring` knows.
SYSTEMS = tuple(_SYSTEMS)


class _ImportHook:
    """A ``sys.meta_path`` finder that lets the normal finders find a watched module
    and runs a callback right after the module's own code has run."""

    def __init__(self, watched: dict[str, Callable[[], None]]) -> None:
        self.watched = watched
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        callback = self.watched.get(name)
        if callback is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        finally:
            self._busy.discard(name)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if spec is None or run is None:
            return None

        def exec_module(module: Any) -> None:
            run(module)
            self.watched.pop(name, None)
            callback()

        with contextlib.suppress(AttributeError, TypeError):  # a loader that takes none
            loader.exec_module = exec_module  # type: ignore[union-attr]
        return spec

    def invalidate_caches(self) -> None:
        return None


class Wiring:
    """The integrations of ``systems`` (default: all of :data:`SYSTEMS`) installed on
    one cache: ``cache`` itself, or what ``cache()`` returns, called once when the
    first system is installed (so a process that imports no JIT opens nothing);
    None from it wires nothing."""

    def __init__(
        self,
        cache: ProgramCacheResource | Callable[[], ProgramCacheResource | None],
        systems: tuple[str, ...] | None = None,
    ) -> None:
        self._source = cache
        self._cache: ProgramCacheResource | None = None
        self._resolved = False
        self.systems = SYSTEMS if systems is None else tuple(systems)
        unknown = [s for s in self.systems if s not in _SYSTEMS]
        if unknown:
            raise ValueError(
                f"systems: unknown {', '.join(map(repr, unknown))} (known: {', '.join(SYSTEMS)})"
            )
        self.installed: list[str] = []
        self._undo: list[Callable[[], None]] = []
        self._hook: _ImportHook | None = None
        self._set_manager = False
        self._active = False
        self._lock = threading.RLock()

    @property
    def cache(self) -> ProgramCacheResource | None:
        """The cache the systems are wired to (opened at the first install)."""
        with self._lock:
            if not self._resolved:
                self._resolved = True
                source = self._source
                self._cache = source if isinstance(source, ProgramCacheResource) else source()
            return self._cache

    def start(self) -> Wiring:
        """Install now what is imported, the rest when it is imported."""
        self._active = True
        if "triton" in self.systems and not os.environ.get("TRITON_CACHE_MANAGER"):
            os.environ["TRITON_CACHE_MANAGER"] = TRITON_MANAGER
            self._set_manager = True
        watched: dict[str, Callable[[], None]] = {}
        for system in self.systems:
            module, _ = _SYSTEMS[system]
            if module in sys.modules:
                self._install(system)
            else:
                watched[module] = lambda s=system: self._install(s)  # type: ignore[misc]
        if watched:
            self._hook = _ImportHook(watched)
            sys.meta_path.insert(0, self._hook)
        return self

    def _install(self, system: str) -> None:
        with self._lock:
            if not self._active or system in self.installed:
                return
            try:
                cache = self.cache
                if cache is None:
                    return
                undo = _SYSTEMS[system][1](cache)
            except Exception as exc:  # never the user's import's failure
                warnings.warn(
                    f"cuforge: {system} is not wired to the cache ({exc}); it runs as "
                    "without cuforge",
                    CacheWriteWarning,
                    stacklevel=outside_level(),
                )
                return
            self.installed.append(system)
            self._undo.append(undo)

    def stop(self) -> None:
        """Uninstall what was installed; idempotent."""
        with self._lock:
            self._active = False
            if self._hook is not None:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self._hook)
                self._hook = None
            for undo in reversed(self._undo):
                with contextlib.suppress(Exception):
                    undo()
            self._undo.clear()
            self.installed.clear()
            if self._set_manager and os.environ.get("TRITON_CACHE_MANAGER") == TRITON_MANAGER:
                del os.environ["TRITON_CACHE_MANAGER"]
            self._set_manager = False
