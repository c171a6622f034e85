"""``set_entries``: many stores in one call, on every backend.

It answers what ``set_entry`` one after another answers (same entries, outcomes and
counters); the backends that can write together do: FileStream with its directories
opened once and one size-ledger update per batch, SQLite in one transaction, Redis
in one pipeline, a tier level by level -- and a tier's batched read back-fills the
levels that missed in one batch each (what a warm-set prefetch leans on).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from _backends import FACTORIES
from cuforge.storage import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    SQLiteProgramCache,
    TieredProgramCache,
)
from cuforge.storage.entry import CacheEntry
from cuforge.storage.outcome import STORED, TOO_LARGE

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(params=sorted(FACTORIES))
def cache(request: pytest.FixtureRequest, tmp_path: Path):
    c = FACTORIES[request.param](tmp_path, request)
    yield c
    c.close()


def test_answers_what_set_entry_answers_in_order(cache) -> None:
    items = [(f"k{i}".encode(), os.urandom(200 + i), f"meta{i}".encode()) for i in range(6)]
    items.append((b"k2", b"replaced", b"later wins"))  # the same key again: the later one
    items.append(("k6", memoryview(b"from a str key"), b""))
    before = cache.stats()
    outcomes = cache.set_entries(items)
    after = cache.stats()
    assert [o.reason for o in outcomes] == [STORED] * len(items)
    assert after.stores - before.stores == len(items)
    assert after.bytes_written - before.bytes_written == sum(len(v) for _, v, _ in items)
    expected = {k if isinstance(k, bytes) else k.encode(): (bytes(v), m) for k, v, m in items}
    got = cache.get_entries(list(expected))
    assert got == [CacheEntry(*expected[k]) for k in expected]
    assert cache.set_entries([]) == []


def test_bad_arguments_are_refused_before_anything_is_stored(cache) -> None:
    before = cache.stats()
    with pytest.raises(TypeError):
        cache.set_entries([(b"a", b"A", b""), (5, b"B", b"")])
    with pytest.raises(TypeError):
        cache.set_entries([(b"a", b"A", b""), (b"b", b"B", "not bytes")])
    assert cache.get_entry(b"a") is None
    assert cache.stats().stores == before.stores


def test_filestream_batch_keeps_the_ledger_and_the_cap(tmp_path: Path) -> None:
    entry = 4096
    cap = 6 * (entry + 200)
    c = FileStreamProgramCache(tmp_path / "fs", max_size_bytes=cap)
    c.set_entry(b"old", os.urandom(entry), b"m")
    items = [(b"k%d" % i, os.urandom(entry), b"m") for i in range(12)]
    outcomes = c.set_entries(items)
    assert [o.reason for o in outcomes] == [STORED] * 12
    on_disk = sum(f.stat().st_size for f in (tmp_path / "fs" / "entries").rglob("*") if f.is_file())
    assert on_disk <= cap
    assert c.size_bytes == on_disk  # one ledger update for the batch, exact
    assert c.get_entry(b"k11") == CacheEntry(items[-1][1], b"m")  # the last one is kept
    assert c.stats().evictions >= 6
    # A value larger than the cap is refused alone; the others of its batch are stored.
    done = c.set_entries([(b"big", b"x" * (cap + 1), b""), (b"small", b"s", b"")])
    assert [o.reason for o in done] == [TOO_LARGE, STORED]
    assert c.get_entry(b"big") is None and c.get_entry(b"small") == CacheEntry(b"s", b"")
    c.close()


def test_filestream_batch_replacing_entries_accounts_their_old_size(tmp_path: Path) -> None:
    c = FileStreamProgramCache(tmp_path / "fs")
    c.set_entries([(b"k%d" % i, b"x" * 5000, b"") for i in range(4)])
    c.set_entries([(b"k%d" % i, b"y" * 100, b"") for i in range(4)] + [(b"k0", b"z", b"")])
    on_disk = sum(f.stat().st_size for f in (tmp_path / "fs" / "entries").rglob("*") if f.is_file())
    assert c.size_bytes == on_disk
    assert c.get_entry(b"k0") == CacheEntry(b"z", b"")
    c.close()


def test_filestream_batch_survives_a_shard_removed_between_entries(tmp_path: Path) -> None:
    """The batch holds each shard's descriptor; a shard emptied and removed while it
    runs (as ``clear`` or eviction can leave it) is made again for the next entry --
    as one write after another would -- instead of failing the rest of the batch."""
    root = tmp_path / "fs"
    c = FileStreamProgramCache(root)
    keys = [b"k%d" % i for i in range(200)]
    shard_of = {k: c._loc(k).shard for k in keys}
    first = keys[0]
    second = next(k for k in keys[1:] if shard_of[k] == shard_of[first])
    shard = root / "entries" / shard_of[first]
    writer = c._driver._writer
    real = writer._stage_publish
    staged: list[str] = []

    def stage(*args: object) -> int:
        if len(staged) == 1:  # between the first entry and the second: the shard goes
            for f in shard.iterdir():
                f.unlink()
            shard.rmdir()
        staged.append(str(args[2]))
        return real(*args)  # type: ignore[arg-type]

    writer._stage_publish = stage
    try:
        outcomes = c.set_entries([(first, b"one", b""), (second, b"two", b"")])
    finally:
        del writer._stage_publish
    assert len(staged) == 3 and shard.is_dir()  # the second written once more, afresh
    assert [o.reason for o in outcomes] == [STORED, STORED]
    assert c.get_entry(second) == CacheEntry(b"two", b"")
    c.close()


_KILLED_WRITER = """
import os, sys
sys.path.insert(0, sys.argv[3])
from cuforge.storage import open_cache
cache = open_cache(sys.argv[1], secret=None)
n = int(sys.argv[2])
r = 0
while True:
    r += 1
    cache.set_entries(
        [(b"k%d" % i, (b"%d:%d|" % (i, r)) * (500 + i * 37), b"m%d" % i) for i in range(n)]
    )
    if r == 1:
        print("ready", flush=True)  # one whole batch is in
"""


@pytest.mark.parametrize("kind", ["filestream", "sqlite"])
def test_a_writer_killed_mid_batch_leaves_each_entry_whole_or_absent(
    tmp_path: Path, kind: str
) -> None:
    """SIGKILL at random moments of batched stores: every entry read afterwards is one
    of the values a batch wrote, never a mix of two. A FileStream pair caught between
    its two renames (new sidecar, old payload) does not verify: a miss, dropped -- at
    most the one entry being published, as with one store at a time. SQLite commits
    a batch whole or not at all: nothing is torn."""
    url = f"file://{tmp_path / 'fs'}" if kind == "filestream" else f"sqlite://{tmp_path / 'c.db'}"
    n = 48
    for delay in (0.05, 0.13, 0.31, 0.47):
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED_WRITER, url, str(n), SRC],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        from cuforge.storage import open_cache

        with open_cache(url, secret=None) as c, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = 0
            for i in range(n):
                got = c.get_entry(b"k%d" % i)
                if got is None:
                    continue
                found += 1
                unit = got.data[: got.data.index(b"|") + 1]
                assert unit.startswith(b"%d:" % i)
                assert got.data == unit * (500 + i * 37) and got.meta == b"m%d" % i
            torn = c.stats().integrity_failures
            assert torn <= (1 if kind == "filestream" else 0), torn
            assert found >= n - torn  # every key was in once before the kill
            for info in c.iter_entries():  # what is left verifies
                assert c.check_entry(info.id) is None, info


_SQLITE_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def test_sqlite_batch_meets_a_held_write_lock_once_and_keeps_every_row(tmp_path: Path) -> None:
    """Another process holds the write lock: the batch waits the bound once, keeps
    each row in memory (served by this handle, a lock timeout each, no write
    failure), and writes them all once the lock is free."""
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c.set_entry(b"first", b"f", b"")
        holder = subprocess.Popen(
            [sys.executable, "-c", _SQLITE_HOLDER, str(db), "20"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = time.monotonic()
                outcomes = c.set_entries([(b"k%d" % i, b"v%d" % i, b"m") for i in range(10)])
                took = time.monotonic() - t
            assert all(o.kept for o in outcomes), outcomes
            assert [c.get_entry(b"k%d" % i) for i in range(10)] == [
                CacheEntry(b"v%d" % i, b"m") for i in range(10)
            ]
            during = c.stats()
        finally:
            holder.kill()
            holder.wait(30)
        assert during.lock_timeouts == 10 and during.write_failures == 0, during
        assert took < 5.0  # one bound (0.25 s), not one per row
    with SQLiteProgramCache(db) as other:
        assert [other.get_entry(b"k%d" % i) for i in range(10)] == [
            CacheEntry(b"v%d" % i, b"m") for i in range(10)
        ]


class _CountingFileStream(FileStreamProgramCache):
    """A real FileStream cache that notes how its stores arrive."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.singles = 0
        self.batches: list[int] = []

    def set_entry(self, key, value, meta=b""):  # type: ignore[no-untyped-def]
        self.singles += 1
        return super().set_entry(key, value, meta)

    def set_entries(self, items):  # type: ignore[no-untyped-def]
        items = list(items)
        self.batches.append(len(items))
        return super().set_entries(items)


def test_tier_batched_read_back_fills_each_level_in_one_batch(tmp_path: Path, redis_server) -> None:
    from cuforge.storage.redis import RedisProgramCache

    local = _CountingFileStream(tmp_path / "local")
    shared = RedisProgramCache(redis_server.url, prefix="bf:")
    for i in range(20):
        shared.set_entry(b"k%d" % i, b"v%d" % i, b"m")
    local.set_entry(b"k0", b"v0", b"m")
    local.singles = 0
    tier = TieredProgramCache(InMemoryProgramCache(), local, shared)
    got = tier.get_entries([b"k%d" % i for i in range(20)] + [b"none"])
    assert got == [CacheEntry(b"v%d" % i, b"m") for i in range(20)] + [None]
    assert local.batches == [19] and local.singles == 0  # k0 was there already
    assert all(local.get_entry(b"k%d" % i) is not None for i in range(20))
    tier.close()


def test_read_only_handle_refuses_each_store_of_a_batch(tmp_path: Path) -> None:
    FileStreamProgramCache(tmp_path / "fs").close()
    ro = FileStreamProgramCache(tmp_path / "fs", read_only=True)
    outcomes = ro.set_entries([(b"a", b"A", b""), (b"b", b"B", b"")])
    assert [o.reason for o in outcomes] == ["read-only", "read-only"]
    assert ro.stats().write_failures == 2
    ro.close()


def test_a_durable_filestream_batch_stores_every_entry(tmp_path: Path) -> None:
    """``durable=True``: each payload fsync'd as one store does, and each shard the
    batch renamed into synced once at its end."""
    c = FileStreamProgramCache(tmp_path / "fs", durable=True)
    items = [(b"k%d" % i, os.urandom(1000), b"m") for i in range(20)]
    assert [o.reason for o in c.set_entries(items)] == [STORED] * 20
    assert c.get_entries([k for k, _, _ in items]) == [CacheEntry(v, m) for _, v, m in items]
    c.close()
