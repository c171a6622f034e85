"""A real second process that holds a lock of a cache until the test lets go.

``holding_flock(path)`` runs a child that takes ``flock(LOCK_EX)`` on ``path`` (as a
stopped process, a debugger or a stuck NFS client would) and keeps it until the
block ends, when the child is killed and the OS releases the lock.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


@contextlib.contextmanager
def holding_flock(path: Path | str, most: float = 20.0) -> Iterator[subprocess.Popen[str]]:
    """Another process holds an exclusive flock on ``path`` inside the block (for at
    most ``most`` seconds: a cache that waited it out is slow, not hung)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _FLOCK, str(path), str(most)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        yield child
    finally:
        child.kill()
        child.wait(timeout=30)
