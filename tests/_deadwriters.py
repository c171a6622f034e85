"""Writers that die mid-write: real processes SIGKILLed with a temp file half written.

Each child opens the cache and stores one value, but its payload write stops half
way (the rest of the process is real) and waits to be killed, as a writer killed by
the OOM killer or a crashed job leaves its staging file behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_DIES_MID_WRITE = """
import os, sys, time
from cuforge.storage import FileStreamProgramCache
from cuforge.storage.filestream import _atomicwrite

def stuck(self, fd, data, durable, stamp):  # half the payload on disk, then killed here
    os.write(fd, data[: len(data) // 2])
    print("mid", flush=True)
    time.sleep(600)

_atomicwrite.PairWriter._fill = stuck
c = FileStreamProgramCache(sys.argv[1], max_size_bytes=int(sys.argv[2]))
c[sys.argv[3]] = b"w" * int(sys.argv[4])
"""


def kill_writers_mid_write(root: Path, cap: int, n: int, size: int) -> None:
    """``n`` real writer processes, each SIGKILLed with half a ``size`` temp file written."""
    for i in range(n):
        child = subprocess.Popen(
            [sys.executable, "-c", _DIES_MID_WRITE, str(root), str(cap), f"dead{i}", str(size)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "mid"
        finally:
            child.kill()
            child.wait(30)
