"""The ``cuforge.compile`` logger: one DEBUG record per compile or link.

Each record names the backend, the program, the target, the time the backend took
and the exact flags it received. Callers check :func:`debug_enabled` before timing,
so with DEBUG off a compile pays one check -- and imports no ``logging`` until the
application does (``cuforge._log``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from cuforge import _log

LOGGER = "cuforge.compile"


def debug_enabled() -> bool:
    """Whether ``cuforge.compile`` would emit a DEBUG record now."""
    return _log.debug_enabled(LOGGER)


def compiled(
    backend: str, name: str, target: str, started: float, size: int, flags: Sequence[str | bytes]
) -> None:
    """Log a finished compile that began at ``time.perf_counter()`` == ``started``."""
    ms = (time.perf_counter() - started) * 1e3
    shown = " ".join(f.decode("utf-8", "replace") if isinstance(f, bytes) else f for f in flags)
    _log.get_logger(LOGGER).debug(
        "%s compiled %s to %s in %.1f ms (%d bytes): %s",
        backend, name or "<source>", target, ms, size, shown,
    )  # fmt: skip


__all__ = ["LOGGER", "compiled", "debug_enabled"]
