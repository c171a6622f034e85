"""Crash consistency: writers killed with SIGKILL at random points while readers read.

Writers (forked from a zygote, see ``_crashworker``) store self-describing values under
a small cap -- writes, ledger updates, evictions, deletes and ``clear()`` -- and are
killed one after another at random moments; each kill is attributed to the step the
writer was in. Two reader processes check every value they are given the whole time.
Then, with every process gone, the next open must find: no temp file older than the
sweep age, a size tracker equal to what the disk holds, and only intact entries served.
"""

from __future__ import annotations

import collections
import contextlib
import json
import mmap
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _crashworker import phase_at
from _figures import SCALES, pick, record
from _selfdesc import make, make_meta, meta_problem, problem

WORKER = str(Path(__file__).with_name("_crashworker.py"))
WRITERS = 3
READERS = 2


def disk_bytes(root: Path, subdirs: tuple[str, ...] = ("entries", "tmp")) -> int:
    total = 0
    for sub in subdirs:
        for dirpath, _dirs, files in os.walk(root / sub):
            for name in files:
                p = os.path.join(dirpath, name)
                if os.path.isfile(p) and not os.path.islink(p):
                    total += os.lstat(p).st_size
    return total


class Harness:
    """The zygote, the writers it forks, the readers, and the phase file."""

    def __init__(self, spec: dict[str, Any], tmp: Path, seed: int) -> None:
        self.spec = spec
        self.tmp = tmp
        self.rng = random.Random(seed)
        phase_file = tmp / "phases"
        phase_file.write_bytes(b"\0" * 4096)
        spec["phases"] = str(phase_file)
        spec["errors"] = str(tmp)
        fd = os.open(phase_file, os.O_RDWR)
        self.phases = mmap.mmap(fd, 0)
        os.close(fd)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.zygote = subprocess.Popen(
            [sys.executable, WORKER, "zygote", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.readers = [
            subprocess.Popen(
                [sys.executable, WORKER, "reader", json.dumps(spec), str(i), str(tmp / f"r{i}")],
                env=env,
            )
            for i in range(READERS)
        ]
        deadline = time.monotonic() + 60
        while not all((tmp / f"r{i}.ready").exists() for i in range(READERS)):
            assert time.monotonic() < deadline, "readers did not start"
            time.sleep(0.01)
        self.next_slot = 0
        self.kills: collections.Counter[str] = collections.Counter()
        self.live: set[int] = set()  # writers forked and not yet killed

    def fork(self) -> tuple[int, int]:
        slot = self.next_slot % 2048
        self.next_slot += 1
        assert self.zygote.stdin is not None and self.zygote.stdout is not None
        self.zygote.stdin.write(f"fork {slot} {self.rng.randrange(1 << 30)}\n")
        self.zygote.stdin.flush()
        pid = int(self.zygote.stdout.readline())
        self.live.add(pid)
        return pid, slot

    def kill(self, pid: int, slot: int) -> None:
        os.kill(pid, signal.SIGKILL)  # ProcessLookupError: the writer ended on its own
        self.live.discard(pid)
        self.kills[phase_at(self.phases, slot)] += 1

    def abandon(self) -> None:
        """Kill every process of the harness (a run that failed or timed out must not
        leave writers and readers running after the test)."""
        for pid in self.live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.live.clear()
        for proc in (self.zygote, *self.readers):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def run(self, kills: int, min_delay: float, max_delay: float, long_lived: float) -> None:
        writers = [self.fork() for _ in range(WRITERS)]
        for _ in range(kills):
            # Mostly young writers (their first writes, evictions, clears); at full scale
            # one in six lives long enough for the periodic steps (stats and use
            # write-backs, checkpoints) to come round.
            lives_long = self.rng.random() < long_lived
            time.sleep(self.rng.uniform(0.3, 1.2) if lives_long else
                       self.rng.uniform(min_delay, max_delay))  # fmt: skip
            victim = writers.pop(self.rng.randrange(len(writers)))
            self.kill(*victim)
            writers.append(self.fork())
        for victim in writers:
            self.kill(*victim)

    def stop(self) -> list[dict[str, Any]]:
        try:
            return self._stop()
        finally:
            self.abandon()  # whatever is left: nothing, after a clean stop

    def _stop(self) -> list[dict[str, Any]]:
        for pid in list(self.live):  # run() was interrupted (a failure or a timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.live.discard(pid)
        assert self.zygote.stdin is not None
        self.zygote.stdin.close()
        self.zygote.wait(timeout=30)
        results = []
        for i, r in enumerate(self.readers):
            r.send_signal(signal.SIGTERM)
            assert r.wait(timeout=60) == 0
            results.append(json.loads((self.tmp / f"r{i}").read_text()))
        errors = [p.read_text() for p in self.tmp.glob("writer-*.err")]
        assert errors == [], errors[:2]
        return results


def check_after_crashes(cache: Any, spec: dict[str, Any]) -> tuple[int, int]:
    """Every lookup of every key: intact or a miss. Returns (intact, missing)."""
    intact = missing = 0
    for i in range(spec["keys"]):
        key = f"key-{i}".encode()
        entry = cache.get_entry(key)
        if entry is None:
            missing += 1
            continue
        assert problem(key, entry.data) is None and meta_problem(key, entry.meta) is None
        intact += 1
    return intact, missing


def run_filestream(tmp_path: Path, scale: str) -> None:
    from cuforge.storage import FileStreamProgramCache

    root = tmp_path / "cache"
    cap = 96 * 1024
    spec = {"backend": "filestream", "path": str(root), "cap": cap, "keys": 64,
            "max_value": 8000}  # fmt: skip
    FileStreamProgramCache(root, max_size_bytes=cap).close()
    harness, _, served = crash_run(spec, tmp_path, pick(scale, 60, 400), scale)

    # The next open: stale temp files go, the size tracker agrees with the disk.
    tmp_dir = root / "tmp"
    leftovers = [p for p in tmp_dir.iterdir() if p.is_file()]
    old = time.time() - FileStreamProgramCache.STALE_TEMP_AGE_S - 60
    for p in leftovers:
        os.utime(p, (old, old))  # as if the sweep age had passed since the crashes
    with FileStreamProgramCache(root, max_size_bytes=cap) as cache:
        assert cache._driver._ledger is not None and cache._driver._ledger.recovered
        remaining = [p for p in tmp_dir.iterdir() if p.stat().st_mtime < old + 1]
        assert remaining == []
        assert cache.size_bytes == disk_bytes(root)
        damaged = [e.id for e in cache.iter_entries() if cache.check_entry(e.id) is not None]
        intact, missing = check_after_crashes(cache, spec)
        stats = cache.stats()
        assert stats.hits == intact and stats.misses == missing
        # and the cache works: a write and a read back
        cache.set_entry(b"after", make(b"after", 1, 1000), make_meta(b"after", 1))
        assert problem(b"after", cache.get_entry(b"after").data) is None
    after = (
        f"next open: 0 stale temp files (of {len(leftovers)} left), ledger == disk, "
        f"{len(damaged)} damaged pairs never served"
    )
    numbers = {"temp_files_left": len(leftovers), "damaged_pairs": len(damaged)}
    steps = ("write", "ledger", "evict", "clear")
    report(harness, scale, "filestream", served, after, steps, intact_after=intact, **numbers)


def crash_run(
    spec: dict[str, Any], tmp_path: Path, kills: int, scale: str
) -> tuple[Harness, list, int]:
    harness = Harness(spec, tmp_path, seed=15)
    try:
        harness.run(kills, 0.002, 0.04, pick(scale, 0.0, 1 / 6))
    finally:
        readers = harness.stop()
    assert sum(harness.kills.values()) == kills + WRITERS
    served = sum(r["hits"] for r in readers)
    bad = sum(r["bad"] for r in readers)
    assert bad == 0, [r["bad_examples"] for r in readers]
    assert served > 0  # the readers did read entries while writers died
    return harness, readers, served


def report(harness: Harness, scale: str, backend: str, served: int, after: str,
           steps: tuple[str, ...], **numbers: Any) -> None:  # fmt: skip
    phases = dict(sorted(harness.kills.items()))
    if scale == "full":  # every step was hit at full scale (as an operation or inside one)
        for needed in steps:
            assert any(needed in kind.split("/") for kind in phases), (needed, phases)
    record(
        "crash", backend, f"SIGKILL of a writer ({WRITERS} live) while {READERS} readers read",
        sum(phases.values()), f"0 wrong or partial values in {served} reads; {after}",
        scale=scale, lost=0, kills_by_phase=phases, reader_hits=served, **numbers,
    )  # fmt: skip


def run_sqlite(tmp_path: Path, scale: str) -> None:
    import sqlite3
    import warnings

    from cuforge.storage import SQLiteProgramCache

    db = tmp_path / "cache.db"
    cap = 512 * 1024
    spec = {"backend": "sqlite", "path": str(db), "cap": cap, "keys": 64, "max_value": 8000}
    SQLiteProgramCache(db, max_size_bytes=cap).close()
    harness, _, served = crash_run(spec, tmp_path, pick(scale, 60, 400), scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recovery notice: nothing was damaged
        cache = SQLiteProgramCache(db, max_size_bytes=cap)
    with cache:
        damaged = [e.id for e in cache.iter_entries() if cache.check_entry(e.id) is not None]
        intact, _ = check_after_crashes(cache, spec)
        cache.set_entry(b"after", make(b"after", 1, 1000), make_meta(b"after", 1))
        assert problem(b"after", cache.get_entry(b"after").data) is None
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            tracked = conn.execute("SELECT entries, total_bytes FROM cuforge_state").fetchone()
            rows = conn.execute("SELECT count(*), coalesce(sum(size), 0) FROM cuforge_entries")
            assert tracked == rows.fetchone()  # the size tracker agrees with the table
        finally:
            conn.close()
    strays = {p.name for p in tmp_path.iterdir() if p.name.startswith("cache.db")}
    assert strays <= {"cache.db", "cache.db-shm", "cache.db-wal", "cache.db.lock"}, strays
    after = (
        "next open: integrity_check ok, no recovery needed, tracked entries/bytes == the "
        f"table's, no temp or stray files, {len(damaged)} damaged rows"
    )
    steps = ("txn", "evict", "clear")
    numbers = {"damaged_rows": len(damaged), "intact_after": intact}
    report(harness, scale, "sqlite", served, after, steps, **numbers)


@SCALES
def test_filestream_survives_writers_killed_at_random_points(tmp_path: Path, scale: str) -> None:
    run_filestream(tmp_path, scale)


@SCALES
def test_sqlite_survives_writers_killed_inside_transactions(tmp_path: Path, scale: str) -> None:
    run_sqlite(tmp_path, scale)


_WRAPPED = {
    "filestream": [
        ("cuforge.storage.filestream._atomicwrite", "PairWriter", "write_pair"),
        ("cuforge.storage.handle", "DriverCache", "set_entry"),
        ("cuforge.storage.filestream._sizeindex", "SizeLedger", "_update"),
        ("cuforge.storage.filestream._driver", "FileStreamDriver", "_evict"),
        ("cuforge.storage.handle", "DriverCache", "clear"),
        ("cuforge.storage.handle", "DriverCache", "__delitem__"),
        ("cuforge.storage.handle", "DriverCache", "get_entry"),
        ("cuforge.storage.filestream._statsfile", "StatsStore", "flush"),
    ],
    "sqlite": [
        ("cuforge.storage.handle", "DriverCache", name)
        for name in ("set_entry", "clear", "__delitem__", "get_entry")
    ] + [("cuforge.storage.sqlite._writes", "Writes", "make_room"),
         ("cuforge.storage.sqlite._writes", "Writes", "housekeep"),
         ("cuforge.storage.sqlite._driver", None, "immediate"),
         ("cuforge.storage.sqlite._space", "Space", "begin"),
         ("cuforge.storage.sqlite._driver", None, "checkpoint"),
         ("cuforge.storage.sqlite._space", None, "checkpoint")],
}  # fmt: skip
_EXPECTED = {
    "filestream": {"write", "ledger", "evict", "clear", "delete", "read", "stats"},
    "sqlite": {"write", "txn", "evict", "checkpoint", "clear", "delete", "read", "stats"},
}


@pytest.mark.parametrize("backend", ["filestream", "sqlite"])
def test_the_phase_wrappers_see_every_step(tmp_path: Path, backend: str) -> None:
    """The attribution is real: a writer with a tiny cap passes through each step."""
    import importlib

    from _crashworker import Phases, instrument, open_cache

    phase_file = tmp_path / "phases"
    phase_file.write_bytes(b"\0" * 16)
    seen = set()
    phases = Phases(str(phase_file), 0)
    real_set = phases.set

    def spy(phase: str, step: bool = False) -> int:
        seen.add(phase)
        return real_set(phase, step)

    phases.set = spy  # type: ignore[method-assign]
    originals = []
    for module, cls, name in _WRAPPED[backend]:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        originals.append((owner, name, owner.__dict__[name]))
    path = tmp_path / ("c" if backend == "filestream" else "c.db")
    spec = {
        "backend": backend,
        "path": str(path),
        "cap": 4000 if backend == "filestream" else 96 * 1024,
    }
    try:
        instrument(spec, phases)
        with open_cache(spec) as c:
            for i in range(300):
                c[str(i)] = b"x" * 900
            c["last"] = b"v"
            c.get("last")
            del c["last"]
            c._driver._w.housekeep(True) if backend == "sqlite" else None
            c.clear()
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    assert _EXPECTED[backend] <= seen, seen
