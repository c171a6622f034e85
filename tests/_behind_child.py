"""Processes whose stores are written behind (``cuforge.integrations._behind``).

``python _behind_child.py exit URL N GO`` looks an entry up and stores one (its
client connected, as a JIT's is once it has compiled), prints ``connected``, waits
until the file GO exists, then queues N stores (``ForeignEntries.store(...,
defer=True)``, the way Inductor's values go), prints ``queued`` and returns from
``main``: the stores must land before the interpreter is gone.

``python _behind_child.py churn DIR SECRET`` stores entries behind into the
directory cache DIR without end, printing each index once it is queued (entry 0 once
it has landed), until it is killed; every payload is :func:`payload` of its index,
so a reader knows what each entry must hold.

:func:`pool_worker` is a ``multiprocessing`` target: it queues one store and then
waits like an idle pool worker, until it is sent SIGTERM.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time


def payload(i: int) -> bytes:
    """The bytes entry ``i`` holds: 1 to ~200 KB, derived from ``i`` alone."""
    seed = hashlib.sha256(str(i).encode()).digest()
    return seed * (1 + (i * 7919) % 6000)


def name(i: int) -> str:
    return f"entry-{i}"


def _entries(url: str, secret: str | None = None):  # type: ignore[no-untyped-def]
    from cuforge.integrations._cache import ForeignEntries
    from cuforge.storage.urls import open_cache

    return ForeignEntries(open_cache(url, secret=secret), "inductor")


def pool_worker(url: str, ready: str) -> None:
    """Queue one store, say so (``ready`` is created), then idle until ended."""
    entries = _entries(url)
    entries.store(name(0), payload(0), {"cache": "fx_graph"}, defer=True)
    open(ready, "w").close()
    time.sleep(600)


def main() -> None:
    mode = sys.argv[1]
    if mode == "exit":
        entries = _entries(sys.argv[2])
        assert entries.load("warm-up") is None
        assert entries.store("warm-up", b"x", {})
        print("connected", flush=True)
        while not os.path.exists(sys.argv[4]):
            time.sleep(0.01)
        for i in range(int(sys.argv[3])):
            entries.store(name(i), payload(i), {"cache": "fx_graph"}, defer=True)
        print("queued", flush=True)
    elif mode == "churn":
        from cuforge.integrations import flush

        entries = _entries(f"file://{sys.argv[2]}", secret=sys.argv[3])
        # Entry 0 lands before anything is printed, so every kill comes after at least one
        # store landed (the reader's check then always has an entry to look at); the
        # rest are queued and killed at whatever point the writer has reached.
        entries.store(name(0), payload(0), {"cache": "fx_graph"}, defer=True)
        assert flush(60)
        os.write(1, b"0\n")
        i = 1
        while True:
            entries.store(name(i), payload(i), {"cache": "fx_graph"}, defer=True)
            os.write(1, f"{i}\n".encode())
            i += 1


if __name__ == "__main__":
    main()
