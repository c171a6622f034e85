"""Which process obstore's I/O runtime runs in, so that no S3 request waits for good.

obstore keeps one runtime per process (Tokio worker threads), started by the first
request of any of its clients -- making a client starts nothing -- and a forked
child has none of those threads: any request from it, on an inherited client or a
new one, waits for good. There is no restarting it in that child.

- :func:`mark` runs before a client's first request in a process (``S3Store`` makes
  its clients on first use, and calls it then): this process's runtime is started.
- Before a fork, a runtime started outside cuforge (obstore used directly here) is
  marked too, seen by its threads (``tokio-*``, from ``/proc/self/task``; where that
  cannot be read, an imported obstore counts as started). Another library's Tokio
  threads count as well: S3 is then off in the children, never hung.
- :func:`elsewhere`: this process is a child forked after its parent's runtime
  started: its stores are broken (``FORKED``: misses and dropped stores).
- :func:`forks_lose_s3`: a child forked from this process now would be such a one;
  start children with ``forkserver`` or ``spawn`` to give them S3.
"""

from __future__ import annotations

import os
import sys

__all__ = ["FORKED", "elsewhere", "forks_lose_s3", "mark"]

FORKED = (
    "the S3 client does not work in a process forked after it was used (start it with "
    "the 'spawn' or 'forkserver' method to use the cache)"
)
# The process that started obstore's I/O runtime (empty: none has).
_RUNTIME_PID: list[int] = []


def mark() -> None:
    """Record this process's runtime as started (before a client's first request)."""
    if not _RUNTIME_PID:
        _RUNTIME_PID.append(os.getpid())


def elsewhere() -> bool:
    """Whether the runtime was started by a process this one was forked from."""
    return bool(_RUNTIME_PID) and _RUNTIME_PID[0] != os.getpid()


def forks_lose_s3() -> bool:
    """Whether a child forked from this process now could not use S3 (a request was
    sent here, or in a process this one was forked from)."""
    if not _RUNTIME_PID:
        _before_fork()
    return bool(_RUNTIME_PID)


def _tokio_threads() -> bool:
    """Whether a Tokio runtime's threads run in this process (True where the thread
    names cannot be read: assume so)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", "rb") as f:
                if f.read().startswith(b"tokio-"):
                    return True
        except OSError:
            continue  # the thread ended meanwhile
    return False


def _before_fork() -> None:
    """A runtime obstore started outside cuforge is marked before the fork (the
    child then knows it cannot use it). Costs nothing once marked or while obstore
    is not imported."""
    if not _RUNTIME_PID and "obstore" in sys.modules and _tokio_threads():
        _RUNTIME_PID.append(os.getpid())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
