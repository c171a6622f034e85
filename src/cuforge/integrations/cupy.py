"""CuPy's kernel cache on a cuforge cache.

``install()`` gives CuPy a ``cupy.cuda._compiler_cache.KernelCacheBackend`` whose
``load``/``save`` go to a cuforge cache (kind ``cupy``, CuPy's cache name in the
record), set with ``cupy.cuda.compiler._set_kernel_cache_backend()``. Both are
CuPy's experimental API: tested with cupy 14.2; a CuPy without them is refused
with one line. CuPy's name already covers the source, options, architecture and
compiler; cuforge adds integrity on every read, signing (with
``$CUFORGE_CACHE_SECRET`` an unsigned or foreign-signed cubin is a miss, never
loaded), shared backends (SQLite, Redis, tiers) and a size cap across processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuforge import _warm

from ._cache import ForeignEntries, select_cache

if TYPE_CHECKING:
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["ENV_CACHE", "install"]

#: A cache URL for CuPy only (else ``$CUFORGE_CACHE``, else cuforge's default); ``off``.
ENV_CACHE = "CUFORGE_CUPY_CACHE"
_KIND = "cupy"


def _cupy_api() -> tuple[type, Any]:
    """(KernelCacheBackend, _set_kernel_cache_backend); RuntimeError when absent."""
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(f"cuforge.integrations.cupy needs cupy ({exc})") from None
    try:
        from cupy.cuda._compiler_cache import KernelCacheBackend
        from cupy.cuda.compiler import _set_kernel_cache_backend
    except ImportError:
        raise RuntimeError(
            f"cuforge.integrations.cupy: cupy {cupy.__version__} lacks "
            "cupy.cuda._compiler_cache.KernelCacheBackend or "
            "cupy.cuda.compiler._set_kernel_cache_backend (tested with cupy 14.2)"
        ) from None
    return KernelCacheBackend, _set_kernel_cache_backend


def install(cache: ProgramCacheResource | str | None = None) -> ProgramCacheResource | None:
    """Make CuPy load and save compiled kernels through ``cache``; returns the cache.

    ``cache`` is a cache, a cache URL, or None for ``$CUFORGE_CUPY_CACHE``, else
    ``$CUFORGE_CACHE``, else cuforge's default; None (nothing installed) when that
    is ``off`` or cannot be opened (one warning naming the variable or argument and
    why; a value from the environment never raises). Raises RuntimeError (one line)
    when CuPy lacks the hook, ValueError for a ``cache`` URL the parser or its backend
    refuses. A cache fault is a miss or a dropped store, never a failed compile.
    """
    base, set_backend = _cupy_api()
    chosen = select_cache(cache, ENV_CACHE)
    if chosen is None:
        return None
    entries = ForeignEntries(chosen, _KIND)

    class CuforgeKernelCacheBackend(base):  # type: ignore[misc, valid-type]
        """CuPy kernel cache entries as cuforge entries (kind ``cupy``)."""

        def load(self, name: str) -> bytes | None:
            return entries.load(name)

        def save(self, name: str, cubin: bytes, source: str) -> None:
            if _warm._state["warm"]:  # CuPy saves what it has just compiled
                _warm.note_compile("cupy", name, entries.cache)
            entries.store(name, cubin, {"source_chars": len(source)})

    set_backend(CuforgeKernelCacheBackend())
    return chosen
