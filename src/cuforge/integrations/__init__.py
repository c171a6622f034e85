"""The cuforge cache behind the JIT systems people already run.

Each submodule adapts one system and imports it only when used, so neither
``import cuforge`` nor ``import cuforge.integrations`` imports torch, triton or cupy:

- :mod:`cuforge.integrations.triton` -- Triton's cache manager and remote cache
  backend (``TRITON_CACHE_MANAGER`` / ``TRITON_REMOTE_CACHE_BACKEND``).
- :mod:`cuforge.integrations.inductor` -- PyTorch Inductor's remote FX-graph,
  AOT-autograd and autotune caches, and its cache-artifact bundles.
- :mod:`cuforge.integrations.cupy` -- CuPy's kernel cache.
- :mod:`cuforge.integrations.jax` -- JAX's persistent compilation cache.
- :mod:`cuforge.integrations.warmsets` -- warm sets: what a job read or stored,
  recorded under a name and prefetched in bulk.
- :func:`session` -- all of them wired to one cache for a block of code (what
  ``cuforge run`` does for a command).

What they share (choosing the cache, entries with a metadata record for payloads
cuforge treats as opaque bytes) is in ``_cache``. Triton's files and Inductor's
values are written behind (``_behind``): the compile goes on while a writer thread
stores them; :func:`flush` waits until they have landed (done for you at exit).
"""

from __future__ import annotations

from cuforge import _lazy

__all__ = ["Session", "flush", "session"]

__getattr__, __dir__ = _lazy.exports(
    __name__,
    {
        "session": "cuforge.integrations.sessions",
        "Session": "cuforge.integrations.sessions",
        "flush": "cuforge.integrations._behind",
    },
)
