"""The size cap a file cache keeps for every opener: ``<root>/cap``.

A cap is a property of the cache, not of one handle: a process that opens the
directory with ``max_size_bytes=N`` records N there, and a later opener that passes
no cap (``cuforge cache stats``, a script, a build) reads and enforces it. A cap
passed explicitly always wins for that handle and replaces the recorded one.

The file holds the decimal number of bytes and a newline; it is written to a temp
file beside it and renamed in (a reader sees the old cap or the new one, never a
torn one), and read without following a link. A missing, unreadable, foreign
(not a positive number) or unwritable file never fails an open: it reads as "no
cap recorded", and a read-only cache keeps whatever it has.
"""

from __future__ import annotations

import contextlib
import os

from .._fsutil import O_NOFOLLOW, PRIVATE_FILE

__all__ = ["CAP_FILE", "keep_cap", "recorded_cap"]

CAP_FILE = "cap"
_MAX_LEN = 32


def recorded_cap(root: str) -> int | None:
    """The cap recorded in ``root``, or None (none, or not one this module wrote)."""
    try:
        fd = os.open(os.path.join(root, CAP_FILE), os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.read(fd, _MAX_LEN + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > _MAX_LEN or not text.isdigit() or int(text) <= 0:
        return None
    return int(text)


def keep_cap(root: str, cap: int, file_mode: int | None) -> None:
    """Record ``cap`` for later openers (atomic replace); a failure leaves the old one.
    The temp file lies in the root, not ``tmp/``, whose sweep removes temps it does not
    know the writer of."""
    if recorded_cap(root) == cap:
        return
    tmp = os.path.join(root, f".{CAP_FILE}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW
        fd = os.open(tmp, flags, PRIVATE_FILE if file_mode is None else file_mode)
        try:
            os.write(fd, f"{cap}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(root, CAP_FILE))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
