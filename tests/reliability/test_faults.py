"""Disk and server faults: a full file system, a read-only one, the cache directory
deleted mid-run, and Redis killed, hung (SIGSTOP) and restarted empty.

During each fault every compile still returns the right code; the cache's errors are
one warning and counters; after the fault ends the cache serves hits again, and the
time from the end of the fault to the first hit is the figure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _cache_workers import ARCH
from _disk import fill, tmpfs
from _figures import SCALES, pick, record
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import CacheReadWarning, CacheWriteWarning, FileStreamProgramCache
from cuforge.storage._integrity import SIDECAR_SUFFIX


class Compiles:
    """Programs compiled through ``cache``, each checked against its uncached code."""

    def __init__(self, tag: str, n: int) -> None:
        self.sources = [
            f'extern "C" __global__ void {tag}{i}(int* a) {{ a[threadIdx.x] = {i}; }}\n'
            for i in range(n)
        ]
        self.options = ProgramOptions(arch=ARCH)
        self.reference = [self._compile(s, None) for s in self.sources]
        self.slowest = 0.0

    def _compile(self, src: str, cache: Any) -> bytes:
        return Program(src, "c++", self.options).compile("cubin", cache=cache).code

    def run(self, cache: Any, which: range | None = None) -> None:
        for i in which if which is not None else range(len(self.sources)):
            t = time.perf_counter()
            assert self._compile(self.sources[i], cache) == self.reference[i]
            self.slowest = max(self.slowest, time.perf_counter() - t)

    def first_hit(self, cache: Any, i: int, limit: float = 120.0) -> float:
        """Seconds until compiling program ``i`` through ``cache`` is a hit."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            before = cache.stats().hits
            self.run(cache, range(i, i + 1))
            if cache.stats().hits > before:
                return time.monotonic() - start
            time.sleep(0.01)
        raise AssertionError(f"no hit within {limit} s after the fault ended")


@contextlib.contextmanager
def cache_warnings() -> Iterator[list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    cache_categories = (CacheReadWarning, CacheWriteWarning)  # a lookup's, a store's
    messages += [str(w.message) for w in caught if issubclass(w.category, cache_categories)]


@SCALES
def test_a_full_file_system_fails_stores_not_compiles(tmp_path: Path, scale: str) -> None:
    n = pick(scale, 6, 40)
    progs = Compiles("enospc", n + 1)
    with (
        tmpfs(tmp_path / "small", "512k") as mount,
        FileStreamProgramCache(mount / "cache") as cache,
    ):
        progs.run(cache, range(0, 1))  # one entry stored while there is room
        filler = fill(mount)
        with cache_warnings() as messages:
            progs.run(cache)  # n new programs: every store hits ENOSPC
        stats = cache.stats()
        assert stats.write_failures >= n
        assert len(messages) == 1 and "No space left" in messages[0], messages
        left = [p.name for p in (mount / "cache" / "tmp").iterdir()]
        assert [n for n in left if not n.endswith(".alive")] == []  # no half-written temps
        filler.unlink()  # the fault ends
        took = progs.first_hit(cache, n)
        assert cache.size_bytes == sum(
            p.stat().st_size for p in (mount / "cache" / "entries").rglob("*") if p.is_file()
        )
    record(
        "faults", "filestream", "ENOSPC: tmpfs of 512 KiB filled up", n,
        f"{n} compiles right, {stats.write_failures} stores dropped with 1 warning; "
        f"first hit {took * 1000:.0f} ms after space came back; ledger == disk",
        scale=scale, lost=0, first_hit_ms=round(took * 1000), write_failures=stats.write_failures,
    )  # fmt: skip


READ_ONLY_WORKER = r"""
import json, os, sys, time, warnings
sys.path[:0] = [__TESTS__, __REL__]
from test_faults import Compiles, cache_warnings
from cuforge.storage import FileStreamProgramCache

n, root = __N__, __ROOT__
progs = Compiles("rodir", 2 * n)  # NVRTC loaded, references compiled: before losing
import encodings.latin_1  # noqa  - ... read access to root's Python installation
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # a user the permission bits bind
dirs = lambda: [root] + [os.path.join(d, x) for d, xs, _ in os.walk(root) for x in xs]
with FileStreamProgramCache(root) as cache:
    progs.run(cache, range(n))  # stored while writable
    for d in dirs():
        os.chmod(d, 0o500)  # the fault: every directory of the cache read-only
    before = cache.stats()
    with cache_warnings() as messages:
        progs.run(cache)  # n hits, n compiles whose stores are refused
    during = cache.stats()
    with FileStreamProgramCache(root) as other:  # a new handle opens and serves hits
        progs.run(other, range(n))
        other_hits = other.stats().hits
    for d in dirs():
        os.chmod(d, 0o700)  # the fault ends
    took = progs.first_hit(cache, 2 * n - 1)
print(json.dumps({
    "hits": during.hits - before.hits,
    "write_failures": during.write_failures - before.write_failures,
    "messages": messages, "other_hits": other_hits, "took": took,
}))
"""


@SCALES
def test_a_read_only_directory_serves_hits_and_drops_stores(tmp_path, scale) -> None:
    """Permission bits bind only other users than root: the compiles run as nobody."""
    import json
    import sys
    import tempfile

    n = pick(scale, 6, 40)
    base = Path(tempfile.mkdtemp(prefix="cuforge-rodir-"))  # outside root's private tmp
    request_cleanup = base
    base.chmod(0o755)
    root = base / "cache"
    root.mkdir()
    os.chown(root, 65534, 65534)
    here = Path(__file__).resolve().parent
    code = (
        READ_ONLY_WORKER.replace("__TESTS__", repr(str(here.parent)))
        .replace("__REL__", repr(str(here)))
        .replace("__N__", str(n))
        .replace("__ROOT__", repr(str(root)))
    )
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HOME=str(base))
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
        )
    finally:
        shutil.rmtree(request_cleanup, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["hits"] == n and out["write_failures"] == n and out["other_hits"] == n, out
    assert len(out["messages"]) == 1 and "Permission denied" in out["messages"][0], out
    took = out["took"]
    record(
        "faults", "filestream", "cache directories made read-only (chmod 500) under a live "
        "cache (as a non-root user)", n,
        f"{n} hits served, {n} compiles right with stores dropped (1 warning); a new handle "
        f"opens and serves hits; first hit {took * 1000:.0f} ms after chmod 700",
        scale=scale, lost=0, first_hit_ms=round(took * 1000),
    )  # fmt: skip


@SCALES
def test_a_read_only_mount_opens_and_serves_hits(tmp_path: Path, scale: str) -> None:
    n = pick(scale, 6, 40)
    progs = Compiles("romount", 2 * n)
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as cache:
        progs.run(cache, range(n))
    view = tmp_path / "read-only-view"
    view.mkdir()
    bound = subprocess.run(["mount", "--bind", str(root), str(view)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        with cache_warnings() as messages, FileStreamProgramCache(view) as cache:
            progs.run(cache)
            stats = cache.stats()
        assert stats.hits == n and stats.write_failures == n, stats
        assert len(messages) == 1 and "Read-only" in messages[0], messages
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
    record(
        "faults", "filestream", "a cache opened through a read-only mount (EROFS)", n,
        f"opens; {n} hits served; {n} compiles right with stores dropped (1 warning)",
        scale=scale, lost=0,
    )  # fmt: skip


@SCALES
def test_a_sqlite_cache_on_a_read_only_mount_serves_hits(tmp_path: Path, scale: str) -> None:
    """It raised "cannot open the SQLite program cache"; FileStream served hits."""
    from cuforge.storage import SQLiteProgramCache

    n = pick(scale, 6, 40)
    progs = Compiles("sqromount", 2 * n)
    root = tmp_path / "db"
    root.mkdir()
    with SQLiteProgramCache(root / "cache.db") as cache:
        progs.run(cache, range(n))
    view = tmp_path / "read-only-view"
    view.mkdir()
    bound = subprocess.run(["mount", "--bind", str(root), str(view)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        with cache_warnings() as messages, SQLiteProgramCache(view / "cache.db") as cache:
            progs.run(cache)
            stats = cache.stats()
            total = cache.total_stats()
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
    assert stats.hits == n and stats.write_failures == n, stats
    assert total.hits >= n, total
    assert len(messages) == 1 and "read-only" in messages[0], messages
    record(
        "faults", "sqlite", "a valid cache opened through a read-only mount (EROFS)", n,
        f"opens read-only; {n} hits served; {n} compiles right with stores dropped "
        "(1 warning)",
        scale=scale, lost=0,
    )  # fmt: skip


@SCALES
def test_the_cache_directory_deleted_mid_run(tmp_path: Path, scale: str) -> None:
    rounds = pick(scale, 20, 200)
    progs = Compiles("gone", 4)
    root = tmp_path / "cache"
    deletions = 0
    stop = threading.Event()

    def deleter() -> None:
        nonlocal deletions
        while not stop.is_set():
            shutil.rmtree(root, ignore_errors=True)
            deletions += 1
            stop.wait(0.01)

    with FileStreamProgramCache(root, max_size_bytes=1 << 20) as cache:
        thread = threading.Thread(target=deleter, daemon=True)
        with cache_warnings() as messages:
            thread.start()
            try:
                for _ in range(rounds):
                    progs.run(cache)
            finally:
                stop.set()
                thread.join()
        assert len(messages) <= 1, messages  # a store that lost its directory mid-way
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        took = progs.first_hit(cache, 0)
        assert root.is_dir() and (root / "entries").is_dir()
        assert time.monotonic() - started < 60
        assert cache.size_bytes == sum(
            p.stat().st_size for p in (root / "entries").rglob("*") if p.is_file()
        )
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    record(
        "faults", "filestream", "cache directory deleted (rm -rf) every 10 ms during compiles",
        deletions,
        f"{rounds * 4} compiles right; {len(messages)} warning; directories recreated "
        f"private; first hit {took * 1000:.0f} ms after the last deletion; ledger == disk",
        scale=scale, lost=0, first_hit_ms=round(took * 1000),
    )  # fmt: skip


# -- Redis ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["killed", "hung (SIGSTOP)", "restarted empty"])
@SCALES
def test_redis_faults_never_fail_a_compile(redis_server, fault: str, scale: str) -> None:
    from cuforge.storage.redis import RedisProgramCache

    seconds = pick(scale, 2.0, 10.0)
    progs = Compiles("redis", 6)
    cache = RedisProgramCache(redis_server.url, prefix="faults:")  # the default timeouts
    try:
        progs.run(cache)  # all stored
        assert cache.stats().stores == 6
        with cache_warnings() as messages:
            compiled = 0
            if fault == "restarted empty":  # an instant fault: down and back, empty
                redis_server.kill()
                redis_server.start()
                took = progs.first_hit(cache, 0)
            else:
                if fault == "hung (SIGSTOP)":
                    redis_server.pause()
                else:
                    redis_server.kill()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                progs.run(cache)
                compiled += 6
            if fault == "hung (SIGSTOP)":
                redis_server.resume()  # the fault ends; entries are still there
                took = progs.first_hit(cache, 0)
            elif fault == "killed":
                redis_server.start()  # the fault ends; the server is back, empty
                took = progs.first_hit(cache, 0)
        stats = cache.stats()
        if fault != "restarted empty":
            assert stats.read_failures + stats.write_failures > 0
            assert len(messages) == 1, messages
        else:  # redis-py reconnects: at most one failure, then misses, stores and hits
            assert len(messages) <= 1, messages
        assert progs.slowest < 5.0  # a hung server costs one timeout, not one per compile
    finally:
        cache.close()
    record(
        "faults", "redis", f"server {fault} for {seconds:.0f} s during compiles", compiled,
        f"{compiled} compiles right (slowest {progs.slowest * 1000:.0f} ms); "
        f"{len(messages)} warning; read/write failures {stats.read_failures}/"
        f"{stats.write_failures}; first hit {took * 1000:.0f} ms after the fault ended",
        scale=scale, lost=0, first_hit_ms=round(took * 1000),
        slowest_compile_ms=round(progs.slowest * 1000),
    )  # fmt: skip


@SCALES
@pytest.mark.parametrize("lock", ["size.ledger", "evict.lock"])
def test_a_lock_held_for_good_by_another_process(tmp_path: Path, lock: str, scale: str) -> None:
    """A process holding the ledger's or evict.lock's flock (stopped, hung on NFS, in a
    debugger) costs each compile at most the bounded wait; stores go on, accounting or
    eviction waits, and catches up at the first operation after the holder is gone."""
    from _lockholder import holding_flock

    n = pick(scale, 8, 60)
    progs = Compiles("held" + lock[:4], n + 1)
    root = tmp_path / "cache"
    cap = 12_000  # about three entries: passed early in the held phase
    with FileStreamProgramCache(root, max_size_bytes=cap) as cache:
        progs.run(cache, range(2))
        with holding_flock(root / lock, most=60.0), cache_warnings() as messages:
            progs.slowest = 0.0
            progs.run(cache, range(2, n))  # misses, stores: the cap is passed meanwhile
            during = cache.stats()
        t = time.monotonic()
        progs.run(cache, range(n, n + 1))  # the first store after the holder is gone
        recovered = time.monotonic() - t
        disk = cache._driver._scan_total()
        assert cache.size_bytes == disk <= cap
    assert progs.slowest < 5.0, progs.slowest  # a hang check; the bound is 0.25 s
    assert during.lock_timeouts >= 1 and during.write_failures == 0, during
    assert len(messages) == 1 and lock in messages[0], messages
    record(
        "faults", "filestream", f"{lock} flock held for good by another process "
        "(cap 12 KB passed meanwhile)", n - 2,
        f"{n - 2} compiles right and stored (slowest compile {progs.slowest * 1000:.0f} ms, "
        "the compile included; the wait for the lock is bounded at 250 ms); "
        f"{during.lock_timeouts} deferrals counted with 1 warning; after release "
        f"the next store ({recovered * 1000:.0f} ms) brought ledger == disk <= cap",
        scale=scale, lost=0, slowest_compile_ms=round(progs.slowest * 1000),
    )  # fmt: skip


@SCALES
def test_temps_of_writers_killed_mid_write_under_a_small_cap(tmp_path: Path, scale: str) -> None:
    """Writers SIGKILLed with a 2 MB half-written temp each, under a 40 MB cap: their
    temps counted as live for an hour and pushed live entries out."""
    from _deadwriters import kill_writers_mid_write

    kills = pick(scale, 6, 30)
    mb = 1 << 20
    cap = 40 * mb
    root = tmp_path / "cache"
    with FileStreamProgramCache(root, max_size_bytes=cap) as cache:
        for i in range(6):
            cache[f"live{i}"] = bytes([i]) * 4 * mb  # 24 MB of live entries
    kill_writers_mid_write(root, cap, kills, 4 * mb)
    t = time.monotonic()
    with FileStreamProgramCache(root, max_size_bytes=cap) as cache:
        opened = time.monotonic() - t
        left = [p for p in (root / "tmp").iterdir() if p.name.endswith(".tmp")]
        for i in range(6, 9):
            cache[f"live{i}"] = bytes([i]) * 4 * mb  # 36 MB: still under the cap
        kept = sum(cache.get(f"live{i}") == bytes([i]) * 4 * mb for i in range(9))
        stats = cache.stats()
        assert cache.size_bytes == cache._driver._scan_total()
    assert left == [] and kept == 9 and stats.evictions == 0, (left, kept, stats)
    record(
        "faults", "filestream", "writers SIGKILLed mid-write (2 MB temp each) under a "
        "40 MB cap", kills,
        f"every dead writer's temp reclaimed by the next open ({opened * 1000:.0f} ms); "
        "3 new 4 MB writes evicted nothing: 9 of 9 live entries (36 MB) served; "
        "ledger == disk",
        scale=scale, lost=0, open_ms=round(opened * 1000),
    )  # fmt: skip


_FOREIGN = [
    "FIFO for a payload",
    "FIFO for a sidecar",
    "directory for a payload",
    "directory for a sidecar",
    "file for a shard",
    "link for a shard (after open)",
]


@SCALES
@pytest.mark.parametrize("what", _FOREIGN)
def test_foreign_objects_and_late_links_in_the_entries(tmp_path: Path, what: str, scale) -> None:
    """A FIFO where an entry file belongs made get() hang for good; a directory or a
    file for a shard made a key unstorable; a shard re-pointed outside after open was
    followed. Each: a miss at once (never the outside bytes), then stored and served."""
    n = pick(scale, 4, 100)
    root = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    slowest = 0.0
    with FileStreamProgramCache(root) as cache:
        keys = [f"k{i}" for i in range(n)]
        for k in keys:
            cache[k] = b"mine " + k.encode()
        for k in keys:
            names = cache._loc(k)
            payload, sidecar = Path(names.payload), Path(names.sidecar)
            target = sidecar if "sidecar" in what else payload
            if what.startswith("FIFO"):
                target.unlink()
                os.mkfifo(target)
            elif what.startswith("directory"):
                target.unlink()
                target.mkdir()
            else:
                shard = payload.parent
                if not shard.is_symlink():
                    shutil.rmtree(shard, ignore_errors=True)
                if what.startswith("file"):
                    shard.write_bytes(b"x")
                else:  # the same names outside, holding someone else's valid pair
                    with FileStreamProgramCache(tmp_path / "other") as other:
                        other[k] = b"theirs"
                        theirs = Path(other._loc(k).payload)
                    away = outside / names.shard
                    away.mkdir(exist_ok=True)
                    for f in (theirs, Path(str(theirs) + SIDECAR_SUFFIX)):
                        shutil.copy(f, away / f.name)
                    if not shard.is_symlink():
                        shard.symlink_to(away, target_is_directory=True)
            cache._driver._memo.clear()
            t = time.monotonic()
            assert cache.get(k) is None
            slowest = max(slowest, time.monotonic() - t)
        for k in keys:
            cache[k] = b"again " + k.encode()
        served = sum(cache.get(k) == b"again " + k.encode() for k in keys)
        assert cache.foreign_objects() == []
    assert served == n
    assert not any(b"again" in p.read_bytes() for p in outside.rglob("*") if p.is_file())
    record(
        "faults", "filestream", f"foreign object: a {what}", n,
        f"every get a miss within {slowest * 1000:.1f} ms (never blocked, never the "
        f"outside bytes); {n} of {n} keys stored and served again; verify sees none left",
        scale=scale, lost=0, slowest_get_ms=round(slowest * 1000, 1),
    )  # fmt: skip


# -- SQLite ---------------------------------------------------------------------------------
LOCK_HOLDER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")  # every other writer waits; WAL readers go on
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@SCALES
def test_sqlite_locked_by_another_process_past_the_busy_timeout(tmp_path, scale) -> None:
    """With the default timeout (5 s): a store waits at most 0.25 s for the write lock,
    is kept in memory meanwhile (this handle serves it) and written after the release."""
    import sys

    from cuforge.storage import SQLiteProgramCache

    seconds = pick(scale, 2.0, 10.0)
    progs = Compiles("sqlock", 12)
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as cache:
        progs.run(cache, range(6))  # stored before the lock
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(db), str(seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = cache.stats()
        compiled = 0
        with cache_warnings() as messages:
            deadline = time.monotonic() + seconds * 0.6  # well inside the lock
            while time.monotonic() < deadline or compiled < 12:
                progs.run(cache, range(compiled % 12, compiled % 12 + 1))
                compiled += 1  # 0-5: hits (reads go on under WAL); 6-11: kept in memory
        during = cache.stats()
        assert holder.wait(timeout=seconds + 30) == 0  # the lock is released
        t = time.monotonic()
        progs.run(cache, range(0, 1))  # a hit: nothing to write
        cache["after-release"] = b"x"  # the first store writes what was kept
        took = time.monotonic() - t
    assert during.hits - before.hits == compiled - 6  # every compile after the first 12
    assert during.write_failures == before.write_failures and messages == [], messages
    assert during.lock_timeouts - before.lock_timeouts >= 1, during
    assert progs.slowest < 3.0, progs.slowest  # a hang check: the bound is 0.25 s
    with SQLiteProgramCache(db) as other:  # none of the six stores made meanwhile is lost
        progs.run(other, range(6, 12))
        assert other.stats().hits == 6
    record(
        "faults", "sqlite", f"database locked (BEGIN EXCLUSIVE) by another process for "
        f"{seconds:.0f} s (default timeout 5 s; a store waits at most 0.25 s)", compiled,
        f"{compiled} compiles right (slowest compile {progs.slowest * 1000:.0f} ms, the compile "
        "included); hits served "
        f"meanwhile; 6 stores kept in memory ({during.lock_timeouts - before.lock_timeouts} "
        f"lock timeouts counted), served by the handle and written {took * 1000:.0f} ms "
        "after the release; a new handle hits all 6",
        scale=scale, lost=0, slowest_compile_ms=round(progs.slowest * 1000),
    )  # fmt: skip


@SCALES
def test_sqlite_on_a_full_file_system_fails_stores_not_compiles(tmp_path, scale) -> None:
    from cuforge.storage import SQLiteProgramCache

    n = pick(scale, 6, 40)
    progs = Compiles("sqfull", n + 1)
    with (
        tmpfs(tmp_path / "small", "1m") as mount,
        SQLiteProgramCache(mount / "cache.db") as cache,
    ):
        progs.run(cache, range(0, 1))
        filler = fill(mount)
        with cache_warnings() as messages:
            progs.run(cache)
        stats = cache.stats()
        assert stats.write_failures >= n
        assert len(messages) == 1 and "full" in messages[0], messages
        filler.unlink()
        took = progs.first_hit(cache, n)
        assert cache.get(b"k") is None  # and it reads fine
    record(
        "faults", "sqlite", "ENOSPC: tmpfs of 1 MiB filled up", n,
        f"{n} compiles right, {stats.write_failures} stores dropped with 1 warning; "
        f"first hit {took * 1000:.0f} ms after space came back",
        scale=scale, lost=0, first_hit_ms=round(took * 1000), write_failures=stats.write_failures,
    )  # fmt: skip
