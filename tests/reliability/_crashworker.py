"""Processes for the crash-consistency test: a zygote that forks writers, and readers.

    python _crashworker.py zygote <spec-json>     # stdin: "fork <slot> <seed>" -> pid
    python _crashworker.py reader <spec-json> <seed> <result.json>

A writer stores self-describing values (see ``_selfdesc``) under a small cap, so its
operations are writes, ledger updates, evictions, deletes and ``clear()``; it runs until
the test kills it with SIGKILL. Before each step it names the step in its byte of a
shared phase file, so the test knows what every kill interrupted (the real code runs;
the wrappers only write one byte before and after). A reader looks up random keys until
SIGTERM and checks every value it is given; it writes its counts as JSON.

Writers are forked from a zygote that has imported cuforge already, so a kill cycle
costs a fork, not an interpreter start.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _selfdesc

PHASES = [
    "idle", "open", "write", "ledger", "evict", "clear", "delete", "read", "stats", "txn",
    "checkpoint",
]  # fmt: skip
_CODE = {name: i for i, name in enumerate(PHASES)}


def open_cache(spec: dict[str, Any]) -> Any:
    if spec["backend"] == "filestream":
        from cuforge.storage import FileStreamProgramCache

        return FileStreamProgramCache(spec["path"], max_size_bytes=spec["cap"])
    if spec["backend"] == "sqlite":
        from cuforge.storage.sqlite import SQLiteProgramCache

        return SQLiteProgramCache(spec["path"], max_size_bytes=spec["cap"])
    raise ValueError(spec["backend"])


class Phases:
    """This process's two bytes in the shared phase file -- the operation it is in
    (innermost: an eviction inside a write says "evict") and the low-level step inside
    it (a transaction, a ledger update, a checkpoint) -- and wrappers that set them."""

    def __init__(self, path: str, slot: int) -> None:
        fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(fd, 0)
        os.close(fd)
        self._op = 2 * slot
        self.set("open")

    def set(self, phase: str, step: bool = False) -> int:
        where = self._op + step
        old = self._map[where]
        self._map[where] = _CODE[phase]
        return old

    def wrap(self, owner: Any, name: str, phase: str, step: bool = False) -> None:
        real = getattr(owner, name)
        phases = self
        where = self._op + step

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            old = phases.set(phase, step)
            try:
                return real(*args, **kwargs)
            finally:
                phases._map[where] = old

        setattr(owner, name, wrapped)


def phase_at(mapped: Any, slot: int) -> str:
    """``op`` or ``op/step`` as the shared file says for ``slot``."""
    op, step = PHASES[mapped[2 * slot]], mapped[2 * slot + 1]
    return f"{op}/{PHASES[step]}" if step else op


def instrument(spec: dict[str, Any], phases: Phases) -> None:
    if spec["backend"] == "filestream":
        from cuforge.storage import handle
        from cuforge.storage.filestream import _atomicwrite, _driver, _sizeindex, _statsfile

        fs = handle.DriverCache  # the handle's request lifecycle is the core's
        phases.wrap(fs, "set_entry", "write")
        phases.wrap(_atomicwrite.PairWriter, "write_pair", "write")
        phases.wrap(_sizeindex.SizeLedger, "_update", "ledger", step=True)
        phases.wrap(_driver.FileStreamDriver, "_evict", "evict")
        phases.wrap(fs, "clear", "clear")
        phases.wrap(fs, "__delitem__", "delete")
        phases.wrap(fs, "get_entry", "read")
        phases.wrap(_statsfile.StatsStore, "flush", "stats")
    elif spec["backend"] == "sqlite":
        from cuforge.storage import handle
        from cuforge.storage.sqlite import _driver as sqlite
        from cuforge.storage.sqlite import _space as _sqlite_space
        from cuforge.storage.sqlite import _writes

        db = handle.DriverCache  # the handle's request lifecycle is the core's
        phases.wrap(db, "set_entry", "write")
        # every writing transaction: single statements, and stores, evictions, clears
        phases.wrap(sqlite, "immediate", "txn", step=True)
        phases.wrap(_sqlite_space.Space, "begin", "txn", step=True)
        phases.wrap(_writes.Writes, "make_room", "evict")
        phases.wrap(sqlite, "checkpoint", "checkpoint", step=True)
        phases.wrap(_sqlite_space, "checkpoint", "checkpoint", step=True)
        phases.wrap(db, "clear", "clear")
        phases.wrap(db, "__delitem__", "delete")
        phases.wrap(_writes.Writes, "housekeep", "stats")  # uses and counters written back
        phases.wrap(db, "get_entry", "read")


def keys(spec: dict[str, Any]) -> list[bytes]:
    return [f"key-{i}".encode() for i in range(spec["keys"])]


def writer(spec: dict[str, Any], slot: int, seed: int) -> None:
    phases = Phases(spec["phases"], slot)
    instrument(spec, phases)
    rng = random.Random(seed)
    pool = keys(spec)
    cache = open_cache(spec)
    phases.set("idle")
    while True:
        key = rng.choice(pool)
        roll = rng.random()
        if roll < 0.65:
            version = rng.randrange(1 << 30)
            value = _selfdesc.make(key, version, rng.randrange(64, spec["max_value"]))
            cache.set_entry(key, value, _selfdesc.make_meta(key, version))
        elif roll < 0.93:
            entry = cache.get_entry(key)
            if entry is not None:
                problem = _selfdesc.problem(key, entry.data)
                problem = problem or _selfdesc.meta_problem(key, entry.meta)
                if problem:
                    raise AssertionError(f"writer read a wrong value for {key!r}: {problem}")
        elif roll < 0.99:
            with contextlib.suppress(KeyError):
                del cache[key]
        else:
            cache.clear()


def zygote(spec: dict[str, Any]) -> None:
    # Imported once, before the forks (cuforge.storage loads its modules lazily).
    import cuforge.storage.filestream
    import cuforge.storage.filestream._atomicwrite
    import cuforge.storage.filestream._sizeindex
    import cuforge.storage.filestream._statsfile

    if spec["backend"] == "sqlite":
        import cuforge.storage.sqlite
        import cuforge.storage.sqlite._conn

        cuforge.storage.sqlite._conn.load_sqlite3()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped for us
    for line in sys.stdin:
        cmd, slot, seed = line.split()
        assert cmd == "fork"
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                writer(spec, int(slot), int(seed))
            except BaseException as exc:  # anything but SIGKILL ending a writer is a failure
                import traceback

                with open(os.path.join(spec["errors"], f"writer-{os.getpid()}.err"), "w") as f:
                    f.write(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            finally:
                os._exit(4)
        print(pid, flush=True)


def reader(spec: dict[str, Any], seed: int, result: str) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    rng = random.Random(seed)
    pool = keys(spec)
    counts = {"hits": 0, "misses": 0, "bad": 0, "bad_examples": []}
    cache = open_cache(spec)
    with open(result + ".ready", "w"):
        pass
    while not stop:
        key = rng.choice(pool)
        try:
            entry = cache.get_entry(key)
        except Exception as exc:  # a reader must never see an exception either
            counts["bad"] += 1
            counts["bad_examples"].append(f"{type(exc).__name__}: {exc}")
            continue
        if entry is None:
            counts["misses"] += 1
            continue
        problem = _selfdesc.problem(key, entry.data) or _selfdesc.meta_problem(key, entry.meta)
        if problem:
            counts["bad"] += 1
            counts["bad_examples"].append(problem)
        else:
            counts["hits"] += 1
    cache.close()
    counts["bad_examples"] = counts["bad_examples"][:5]
    with open(result, "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    command, spec_text = sys.argv[1], sys.argv[2]
    spec = json.loads(spec_text)
    if command == "zygote":
        zygote(spec)
    elif command == "reader":
        reader(spec, int(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(f"unknown command {command!r}")
    time.sleep(0)
