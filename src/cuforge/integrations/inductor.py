"""PyTorch Inductor's remote caches and cache artifacts on a cuforge cache.

``install()`` puts a cuforge backend behind Inductor's remote FX-graph,
AOT-autograd, autotune and bundled-autotune caches; users still turn each on with
Inductor's own switch (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1``,
``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1``, ``TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1``,
``TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE=1``). The hook is
``torch._inductor.remote_cache.RemoteCache.backend_override_cls``, which is not a
stable torch API: tested with torch 2.13 (CPU) and 2.11 (CUDA); a torch without it
is refused with one line, never half-installed.

Inductor's values are JSON around pickles, and Inductor unpickles what a remote
cache returns. cuforge stores them as opaque bytes (kind ``inductor``) and never
unpickles them; with ``$CUFORGE_CACHE_SECRET`` set, an unsigned, tampered or
foreign-signed value is a miss, so a value planted in a shared cache never
reaches Inductor. Without a secret, anyone who can write the cache can run code
in every process that reads it: set one for any cache others can write.

``save_artifacts(tag)`` / ``load_artifacts(tag)`` store and hot-load the bundle of
``torch.compiler.save_cache_artifacts()`` under ``tag`` and the torch, Triton and
CUDA versions and GPU name, so a bundle is only offered to a matching install.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from cuforge import _warm

from ._cache import ForeignEntries, select_cache

if TYPE_CHECKING:
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["ENV_CACHE", "REMOTE_CACHES", "install", "load_artifacts", "save_artifacts", "uninstall"]

#: A cache URL for Inductor only (else ``$CUFORGE_CACHE``, else cuforge's default); ``off``.
ENV_CACHE = "CUFORGE_INDUCTOR_CACHE"

#: Which Inductor cache (the metadata record's ``cache``) -> its class in torch.
REMOTE_CACHES = {
    "fx_graph": "RemoteFxGraphCache",
    "aot_autograd": "RemoteAOTAutogradCache",
    "autotune": "RemoteAutotuneCache",
    "bundled_autotune": "RemoteBundledAutotuneCache",
}
_KIND = "inductor"
_TESTED = "tested with torch 2.11 and 2.13"


def _remote_cache_module() -> Any:
    """torch's remote-cache module, checked to have the hook; RuntimeError otherwise."""
    try:
        import torch
        from torch._inductor import remote_cache
    except ImportError as exc:
        raise RuntimeError(
            f"cuforge.integrations.inductor needs torch with Inductor ({exc})"
        ) from None
    missing = [
        name
        for name in ("RemoteCache", "RemoteCacheBackend", *REMOTE_CACHES.values())
        if not hasattr(remote_cache, name)
    ]
    if missing or not hasattr(remote_cache.RemoteCache, "backend_override_cls"):
        lacks = ", ".join(missing) or "RemoteCache.backend_override_cls"
        raise RuntimeError(
            f"cuforge.integrations.inductor: torch {torch.__version__} lacks "
            f"torch._inductor.remote_cache.{lacks} ({_TESTED}); "
            "this torch cannot use a cuforge backend"
        )
    return remote_cache


@functools.cache
def _backend_class() -> type:
    """A ``RemoteCacheBackend[bytes]`` storing Inductor's values as cuforge entries.

    Subclassing torch's base keeps torch's own counters (``cache_stats``) true.
    """
    base = _remote_cache_module().RemoteCacheBackend

    class CuforgeInductorBackend(base):  # type: ignore[misc, valid-type]
        def __init__(self, entries: ForeignEntries, which: str) -> None:
            super().__init__()
            self._entries = entries
            self._which = which

        def _get(self, key: str) -> bytes | None:
            return self._entries.load(key)

        def _put(self, key: str, data: bytes) -> None:
            if not isinstance(data, (bytes, bytearray)):
                raise TypeError(f"Inductor value for {key!r}: expected bytes, got {type(data)}")
            if _warm._state["warm"] and self._which == "fx_graph":  # stored after a compile
                _warm.note_compile("inductor", key, self._entries.cache)
            # Written behind (``_behind``): the compile does not wait for the store.
            self._entries.store(key, bytes(data), {"cache": self._which}, defer=True)

    return CuforgeInductorBackend


def install(cache: ProgramCacheResource | str | None = None) -> ProgramCacheResource | None:
    """Serve Inductor's remote caches from ``cache``; returns the cache in use.

    ``cache`` is a cache, a cache URL, or None for ``$CUFORGE_INDUCTOR_CACHE``, else
    ``$CUFORGE_CACHE``, else cuforge's default. Returns None (and installs nothing)
    when that is ``off`` or cannot be opened (one warning naming the variable or
    argument and why; a value from the environment never raises). Installing again
    replaces the previous backend. Raises RuntimeError (one line) when torch lacks the
    hook, ValueError for a ``cache`` URL the parser or its backend refuses.
    """
    remote_cache = _remote_cache_module()
    chosen = select_cache(cache, ENV_CACHE)
    if chosen is None:
        return None
    entries = ForeignEntries(chosen, _KIND)
    backend = _backend_class()
    for which, cls_name in REMOTE_CACHES.items():
        factory = functools.partial(backend, entries, which)
        getattr(remote_cache, cls_name).backend_override_cls = factory
    return chosen


def uninstall() -> None:
    """Give Inductor's remote caches back their own (Redis) backends."""
    remote_cache = _remote_cache_module()
    for cls_name in REMOTE_CACHES.values():
        getattr(remote_cache, cls_name).backend_override_cls = None


# -- cache artifacts (torch.compiler.save_cache_artifacts) -----------------------------


def _environment() -> dict[str, str]:
    """What a bundle of artifacts is only valid for: torch, Triton, CUDA, the GPU."""
    import torch

    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    gpu = "none"
    if torch.cuda.is_available():
        gpu = str(torch.cuda.get_device_name(torch.cuda.current_device()))
    return {
        "torch": str(torch.__version__),
        "triton": triton_version,
        "cuda": str(torch.version.cuda or "none"),
        "gpu": gpu,
    }


def _artifact_name(tag: str, env: dict[str, str]) -> str:
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"tag: expected a non-empty str, got {tag!r}")
    parts = "\0".join(f"{k}={env[k]}" for k in sorted(env))
    return f"artifacts\0{tag}\0{parts}"


def save_artifacts(tag: str, cache: ProgramCacheResource | str | None = None) -> bool:
    """Store this process's compile artifacts (``torch.compiler.save_cache_artifacts()``)
    under ``tag`` and the torch / Triton / CUDA versions and GPU name.

    Returns False when torch had nothing to save, caching is off or the cache cannot
    be opened, or the store was dropped (a :class:`CacheWriteWarning` says why).
    ValueError for an empty tag.
    """
    import torch

    env = _environment()
    name = _artifact_name(tag, env)
    chosen = select_cache(cache, ENV_CACHE)
    saved = torch.compiler.save_cache_artifacts()
    if chosen is None or saved is None:
        return False
    data = saved[0]
    fields: dict[str, str | int | None] = {"cache": "artifacts", "tag": tag, **env}
    return ForeignEntries(chosen, _KIND).store(name, data, fields)


def load_artifacts(tag: str, cache: ProgramCacheResource | str | None = None) -> bool:
    """Hot-load the artifacts saved under ``tag`` for this torch / Triton / CUDA / GPU
    into torch's caches (``torch.compiler.load_cache_artifacts``); False on a miss.

    The bundle reaches torch only when the entry verifies, and with a secret set only
    when it carries a valid signature (torch unpickles it).
    """
    import torch

    name = _artifact_name(tag, _environment())
    chosen = select_cache(cache, ENV_CACHE)
    if chosen is None:
        return False
    data = ForeignEntries(chosen, _KIND).load(name)
    if data is None:
        return False
    return torch.compiler.load_cache_artifacts(data) is not None
