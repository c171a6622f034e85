"""In-process per-key locks (the thread half of single-flight)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

__all__ = ["KeyLocks"]


class KeyLocks:
    """A table of per-key locks, each dropped when its last user leaves.

    ``hold(key, timeout)`` yields True when this thread holds the key's lock and
    False when ``timeout`` (seconds; None waits forever) expired first -- the
    caller then proceeds unlocked (fall-through), it is never blocked for good.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[bytes, list[Any]] = {}  # key -> [lock, users]

    @contextmanager
    def hold(self, key: bytes, timeout: float | None) -> Iterator[bool]:
        with self._guard:
            slot = self._locks.get(key)
            if slot is None:
                slot = self._locks[key] = [threading.Lock(), 0]
            slot[1] += 1
        lock: threading.Lock = slot[0]
        acquired = lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
            with self._guard:
                slot[1] -= 1
                if slot[1] == 0:
                    del self._locks[key]
