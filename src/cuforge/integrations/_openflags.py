"""The open() flags the integrations read and write JIT files with, defined once.

``READ``: a file opened to compare or publish -- never through a symbolic link
(``O_NOFOLLOW``: a planted link is an error, not followed), never waiting on a FIFO
or a device (``O_NONBLOCK``), not inherited. ``CREATE``: a temp file made to be
renamed into place -- new (``O_EXCL``: never another's file), never through a link,
not inherited, binary. Flags a platform lacks are 0.
"""

from __future__ import annotations

import os

__all__ = ["CREATE", "READ"]

READ = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
CREATE = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
