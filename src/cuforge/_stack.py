"""Warnings that point at the user's line, however deep inside cuforge they start.

Used by every layer (storage included), so it lives at the package's root and
imports nothing.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["outside_level"]


def outside_level() -> int:
    """The ``warnings.warn`` stacklevel, for a warning issued in the calling function,
    that names the first frame outside the ``cuforge`` package (the caller's line, as
    the warnings module intends: its filters and ``-W error`` then act on user code)."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("cuforge."):
        frame = frame.f_back
        level += 1
    return level
