"""Bounded retries for Windows sharing violations.

On Windows, replacing, opening or deleting a file another process holds open
fails with ``PermissionError`` (winerror 5 ERROR_ACCESS_DENIED, 32
ERROR_SHARING_VIOLATION, 33 ERROR_LOCK_VIOLATION) until that process lets go.
These helpers retry such errors for about 185 ms and then re-raise; every other
error propagates at once, and off Windows a real ``PermissionError`` (which has no
``winerror``) is never retried.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import TypeVar

    _T = TypeVar("_T")

__all__ = [
    "RETRY_DELAYS",
    "SHARING_WINERRORS",
    "_is_windows_sharing_violation",
    "open_retry",
    "replace_retry",
    "unlink_retry",
]

IS_WINDOWS = sys.platform == "win32"
SHARING_WINERRORS = frozenset({5, 32, 33})
RETRY_DELAYS = (0.005, 0.010, 0.020, 0.050, 0.100)  # 185 ms in all


def _is_windows_sharing_violation(exc: BaseException) -> bool:
    """True when ``exc`` is a transient Windows sharing/lock violation.

    A ``winerror`` decides when present (only 5/32/33 are transient). Without one,
    a bare EACCES counts only on Windows, where some APIs report a sharing
    violation that way; a non-sharing winerror that maps to EACCES is a real
    permission problem and must propagate.
    """
    if not isinstance(exc, PermissionError):
        return False
    winerror = getattr(exc, "winerror", None)
    if winerror is not None:
        return winerror in SHARING_WINERRORS
    return IS_WINDOWS and exc.errno == errno.EACCES


def with_sharing_retry(op: Callable[..., _T], *args: object) -> _T:
    """Call ``op(*args)``, retrying sharing violations within the delay budget."""
    for delay in RETRY_DELAYS:
        try:
            return op(*args)
        except PermissionError as exc:
            if not _is_windows_sharing_violation(exc):
                raise
        time.sleep(delay)
    return op(*args)


# os.* is looked up at call time so tests can substitute failing versions.
def replace_retry(src: str, dst: str) -> None:
    with_sharing_retry(lambda a, b: os.replace(a, b), src, dst)


def unlink_retry(path: str) -> None:
    with_sharing_retry(lambda p: os.unlink(p), path)


def open_retry(path: str, flags: int, mode: int = 0o666) -> int:
    return with_sharing_retry(lambda p, f, m: os.open(p, f, m), path, flags, mode)
