"""Warnings that point at the user's line, however deep inside cuforge they start."""

from __future__ import annotations

import sys

__all__ = ["outside_level"]


def outside_level() -> int:
    """The ``warnings.warn`` stacklevel, for a warning issued in the calling
    function, that names the first frame outside the ``cuforge`` package."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("cuforge."):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
