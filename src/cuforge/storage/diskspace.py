"""Whether a file-backed cache's file system has room: the one test the SQLite
backend's open and the command line's writability probe (``doctor``) both make."""

from __future__ import annotations

import os

__all__ = ["no_space"]


def no_space(folder: str) -> str | None:
    """Why a file in ``folder`` cannot grow: its file system has no free block for
    this user (root's reserved blocks count for root) -- else None, also when the
    file system cannot be asked (then the write itself says)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    free = st.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else st.f_bavail
    return None if free else "no space left on its file system"
