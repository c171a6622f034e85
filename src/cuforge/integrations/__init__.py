"""The cuforge cache behind the JIT systems people already run.

Each submodule adapts one system and imports it only when used, so neither
``import cuforge`` nor ``import cuforge.integrations`` imports torch, triton or cupy:

- :mod:`cuforge.integrations.triton` -- Triton's cache manager and remote cache
  backend (``TRITON_CACHE_MANAGER`` / ``TRITON_REMOTE_CACHE_BACKEND``).
"""

from __future__ import annotations

__all__: list[str] = []
