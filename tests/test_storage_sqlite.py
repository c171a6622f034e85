"""SQLiteProgramCache in one process: file, schema, damage, eviction, threads, URLs.

The contract tests every backend passes (mapping API, metadata, listing) run on it
through ``tests/_backends.py``; processes are in ``test_storage_sqlite_processes.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from _cache_workers import ARCH, SRC
from cuforge.compile import Program, ProgramOptions, _nvrtc
from cuforge.storage import (
    CachePathError,
    CacheRecoveryWarning,
    CacheWriteWarning,
    SQLiteProgramCache,
    default_db_path,
    ownership,
)
from cuforge.storage.entry import CacheEntry, entry_id
from cuforge.storage.sqlite._schema import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    STAT_COLUMNS,
    ForeignDatabaseError,
    file_problem,
)
from cuforge.storage.stats import CacheStats
from cuforge.storage.urls import open_cache


class Compiles:
    """Counts real NVRTC compiles (the wrapped function is the real one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = _nvrtc.compile_cpp
        self.count = 0
        self._lock = threading.Lock()
        monkeypatch.setattr(_nvrtc, "compile_cpp", self)

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.count += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Compiles:
    return Compiles(monkeypatch)


@pytest.fixture(scope="module")
def reference_cubin() -> bytes:
    return Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin").code


def compile_src(cache: SQLiteProgramCache):
    return Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=cache)


@contextlib.contextmanager
def raw(db: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection (autocommit), closed on exit."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def disk_bytes(db: Path) -> int:
    return sum(
        os.path.getsize(f"{db}{s}") for s in ("", "-wal", "-shm") if os.path.exists(f"{db}{s}")
    )


def flip_byte_in(db: Path, blob: bytes) -> None:
    """Flip one bit inside ``blob`` where it sits in the closed database file (in the
    middle of a 24-byte window of it that occurs exactly once in the file)."""
    data = bytearray(db.read_bytes())
    for start in range(len(blob) // 2, len(blob) - 24, 8):
        window = bytes(blob[start : start + 24])
        at = data.find(window)
        if at >= 0 and data.find(window, at + 1) < 0:
            data[at + 12] ^= 0x10
            db.write_bytes(bytes(data))
            return
    raise AssertionError("no unique window of the blob in the file")


def recovery_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, CacheRecoveryWarning)]


# -- layout, reopen, compile ------------------------------------------------------------------


def test_one_file_with_our_schema_and_wal(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c.set_entry(b"k", b"payload", b"meta")
        assert c.path == str(db)
        with raw(db) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
            digest, size = conn.execute("SELECT digest, size FROM cuforge_entries").fetchone()
            assert digest.hex() == entry_id(b"k") and size == len(b"payload") + len(b"meta")
    # Closed: the WAL is folded back; only the database and its lock file remain.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.db", "cache.db.lock"]


def test_default_path_is_next_to_the_filestream_default() -> None:
    from cuforge.storage import default_cache_dir

    path = Path(default_db_path())
    assert path.name == "program-cache.db" and path.parent == Path(default_cache_dir()).parent


def test_compile_round_trip_across_reopen(tmp_path, compiles, reference_cubin) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        assert compile_src(c).code == reference_cubin
    assert compiles.count == 1
    with SQLiteProgramCache(db) as c:
        obj = compile_src(c)
        assert obj.code == reference_cubin and obj.code_type == "cubin"
        assert (c.stats().hits, c.stats().misses) == (1, 0)
    assert compiles.count == 1  # the hit never reached the compiler


@pytest.mark.parametrize("bad", [0, -5])
def test_bad_arguments_are_named(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ValueError, match="max_size_bytes"):
        SQLiteProgramCache(tmp_path / "c.db", max_size_bytes=bad)
    with pytest.raises(ValueError, match="timeout"):
        SQLiteProgramCache(tmp_path / "c.db", timeout=bad - 1)
    with pytest.raises(ValueError, match="is a directory"):
        SQLiteProgramCache(tmp_path)


def test_closed_handle_refuses_operations(tmp_path: Path) -> None:
    c = SQLiteProgramCache(tmp_path / "c.db")
    c.close()
    c.close()  # idempotent
    for op in (lambda: c.get(b"k"), lambda: c.set_entry(b"k", b"v"), lambda: len(c), c.clear):
        with pytest.raises(ValueError, match="closed"):
            op()


# -- integrity ----------------------------------------------------------------------------------


def test_corrupted_blob_on_disk_is_a_miss_removed_and_counted(
    tmp_path, compiles, reference_cubin
) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        compile_src(c)
        c[b"other"] = b"o" * 3000
    flip_byte_in(db, reference_cubin)
    with SQLiteProgramCache(db) as c:
        assert c.check_entry(next(e.id for e in c.iter_entries() if e.size > 3100))
        obj = compile_src(c)  # the damaged entry is a miss: compiled again
        assert obj.code == reference_cubin and compiles.count == 2
        s = c.stats()
        assert (s.integrity_failures, s.hits, s.stores) == (1, 0, 1)
        assert c.get(b"other") == b"o" * 3000  # the rest of the cache is untouched
    with raw(db) as conn:  # the damaged row was replaced by the fresh compile
        assert conn.execute("SELECT count(*) FROM cuforge_entries").fetchone()[0] == 2


@pytest.mark.parametrize("column", ["data", "meta", "digest", "crc"])
def test_any_damaged_column_is_a_miss_and_the_row_goes(tmp_path: Path, column: str) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c.set_entry(b"k", b"payload-bytes", b"metadata")
        with raw(db) as conn:
            value = conn.execute(f"SELECT {column} FROM cuforge_entries").fetchone()[0]
            damaged = bytes([value[0] ^ 1]) + value[1:] if isinstance(value, bytes) else value ^ 1
            conn.execute(f"UPDATE cuforge_entries SET {column} = ?", (damaged,))
        assert c.get_entry(b"k") is None
        assert c.stats().integrity_failures == 1 and len(c) == 0


@pytest.mark.parametrize("column", ["data", "meta"])
@pytest.mark.parametrize("became", ["CAST({c} AS TEXT)", "length({c})", "0.5"])
def test_a_column_whose_type_changed_is_a_miss_not_an_error(
    tmp_path: Path, column: str, became: str
) -> None:
    # One flipped bit in a record header turns a blob into text, a number or NULL.
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c.set_entry(b"k", b"payload-bytes", b"metadata")
        with raw(db) as conn:
            conn.execute(f"UPDATE cuforge_entries SET {column} = {became.format(c=column)}")
        assert c.get_entry(b"k") is None and c.get(b"k") is None
        assert c.stats().integrity_failures == 1 and len(c) == 0


def test_payload_metadata_boundary_is_checked(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c.set_entry(b"k", b"abcdef", b"XYZ")
        with raw(db) as conn:  # same bytes overall, one moved from payload to metadata
            conn.execute("UPDATE cuforge_entries SET data = ?, meta = ?", (b"abcde", b"fXYZ"))
        assert c.get_entry(b"k") is None and c.stats().integrity_failures == 1


# -- damaged, foreign and stale files -----------------------------------------------------------


def _filled(db: Path) -> None:
    with SQLiteProgramCache(db) as c:
        for i in range(60):
            c[f"k{i}"] = os.urandom(3000)


def _keep_id(data: bytes, fill: bytes) -> bytes:
    """``fill`` over ``data``'s first 100 bytes except SQLite's magic (0-16) and the
    application id (68-72): a header damaged, still provably ours."""
    out = bytearray(data)
    out[16:68] = fill[16:68]
    out[72:100] = fill[72:100]
    return bytes(out)


@pytest.mark.parametrize("damage", ["truncated", "pages-zeroed", "header-fields-wiped"])
def test_damaged_file_is_moved_aside_and_the_cache_starts_empty(tmp_path: Path, damage) -> None:
    # Damage that leaves the header's application id: provably ours, so moved aside.
    db = tmp_path / "cache.db"
    _filled(db)
    good = db.read_bytes()
    size = len(good)
    bad = {
        "truncated": good[: size // 2],
        "pages-zeroed": good[:4096] + bytes(size - 4096),
        "header-fields-wiped": _keep_id(good, bytes(100)),
    }[damage]
    db.write_bytes(bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SQLiteProgramCache(db) as c:
            assert len(c) == 0 and c.get("k1") is None
            c["new"] = b"works"
            assert c.get("new") == b"works"
    messages = recovery_warnings(caught)
    assert len(messages) == 1 and "moved it to" in messages[0], messages
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("cache.db.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == bad  # kept as it was, for a look
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # healthy now: no warning on the next open
        with SQLiteProgramCache(db) as c:
            assert c.get("new") == b"works"


@pytest.mark.parametrize("damage", ["zero-filled", "not-sqlite", "short-header", "id-garbled"])
def test_a_damaged_file_without_our_id_is_refused_even_with_a_lock_file(
    tmp_path: Path, damage
) -> None:
    """A damaged file whose header no longer proves it is cuforge's is refused, left
    as it is: the ``<path>.lock`` an earlier use left proves nothing (anyone can make
    one), so it no longer licenses a move aside."""
    db = tmp_path / "cache.db"
    _filled(db)
    good = db.read_bytes()
    bad = {
        "zero-filled": bytes(len(good)),
        "not-sqlite": b"this is a text file, not a database\n" * 100,
        "short-header": good[:50],
        "id-garbled": _keep_id(good, bytes(100))[:68] + b"\xa5" * 4 + good[72:],
    }[damage]
    db.write_bytes(bad)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert before == ["cache.db", "cache.db.lock"]
    with pytest.raises(CachePathError) as info:
        SQLiteProgramCache(db)
    message = str(info.value)
    assert isinstance(info.value, ForeignDatabaseError) and "\n" not in message
    assert str(db) in message and "is not a cuforge SQLite cache" in message
    assert "path of its own" in message  # the fix
    assert db.read_bytes() == bad
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_foreign_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with raw(db) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    before = db.read_bytes()
    with pytest.raises(ForeignDatabaseError, match="is not a cuforge SQLite cache") as info:
        SQLiteProgramCache(db)
    assert str(db) in str(info.value) and "users" in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, CachePathError)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # nothing left beside it
    with pytest.raises(ValueError, match="not a cuforge"):
        open_cache(f"sqlite://{db}")
    # An empty database with another application's id is not ours either.
    other = tmp_path / "other.db"
    with raw(other) as conn:
        conn.execute("PRAGMA application_id = 1234")
    with pytest.raises(ForeignDatabaseError, match="0x4d2"):
        SQLiteProgramCache(other)


def test_schema_version_mismatch_rebuilds_our_tables_only(tmp_path: Path) -> None:
    """An older layout (version 1) is rebuilt; a newer one is refused instead
    (test_storage_sqlite_schema.py): rebuilding it would drop a newer cuforge's data."""
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c["k"] = b"v" * 1000
    with raw(db) as conn:
        conn.execute("PRAGMA user_version = 1")
        conn.execute("CREATE TABLE cuforge_legacy (x)")
        conn.execute("CREATE TABLE notes (x)")  # not ours: kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SQLiteProgramCache(db) as c:
            assert len(c) == 0 and c.get("k") is None
            c["k2"] = b"new"
            assert c.get("k2") == b"new"
    with raw(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "cuforge_legacy" not in names and {"notes", "cuforge_entries"} <= names


def test_damage_found_while_open_is_repaired_at_the_next_open(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    _filled(db)
    c = SQLiteProgramCache(db)
    page = 4096
    data = bytearray(db.read_bytes())
    data[2 * page : len(data) - page] = bytes(len(data) - 3 * page)  # zero the b-tree pages
    db.write_bytes(bytes(data))
    got: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A new thread has a new connection with a cold page cache: it reads the file.
        t = threading.Thread(target=lambda: got.extend(c.get(f"k{i}") for i in range(60)))
        t.start()
        t.join()
    assert got == [None] * 60  # damage is a miss, never an exception
    assert any("damage" in m for m in recovery_warnings(caught))
    assert Path(f"{db}.damaged").exists()
    c.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SQLiteProgramCache(db) as c2:
            c2["fresh"] = b"ok"
            assert c2.get("fresh") == b"ok"
    assert any("moved it to" in m for m in recovery_warnings(caught))
    assert not Path(f"{db}.damaged").exists()


def test_damaged_file_in_use_elsewhere_is_not_moved(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    _filled(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom cuforge.storage import SQLiteProgramCache\n"
         f"c = SQLiteProgramCache({str(db)!r}); print('open', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        good = db.read_bytes()  # every page but the first zeroed under the live user
        db.write_bytes(good[:4096] + bytes(len(good) - 4096))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with SQLiteProgramCache(db, timeout=0.2) as c:
                assert c.get("k1") is None
                c["k"] = b"v"  # a counted write failure, not an exception
                assert c.stats().write_failures == 1
        assert any("in use by another process" in m for m in recovery_warnings(caught))
        assert not list(tmp_path.glob("*.corrupt-*"))
    finally:
        holder.kill()
        holder.wait(30)


def test_a_file_that_only_looked_damaged_is_judged_again_not_waited_out(
    tmp_path: Path,
) -> None:
    # While another process holds the file, a header that looked wrong and then
    # reads right again (a state caught mid-write) must not leave this opener
    # broken: it looks again instead of waiting for the holder to let go.
    db = tmp_path / "cache.db"
    _filled(db)
    good = db.read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom cuforge.storage import SQLiteProgramCache\n"
         f"c = SQLiteProgramCache({str(db)!r}); print('open', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        with open(db, "r+b") as f:  # the same file, its header's fields wiped in place
            f.write(_keep_id(good, bytes(100))[:100])  # (its id kept: still provably ours)

        def put_back() -> None:  # the same 100 bytes, in one write: never a shorter file
            with open(db, "r+b") as f:
                f.write(good[:100])

        restore = threading.Timer(0.3, put_back)
        restore.start()
        started = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with SQLiteProgramCache(db, timeout=20) as c:
                assert c.get("k1") is not None  # the holder's data, served
                c["new"] = b"v"
                assert c.get("new") == b"v" and c.stats().write_failures == 0
        restore.join()
        assert time.monotonic() - started < 10  # not the 20 s timeout
        assert recovery_warnings(caught) == []
        assert not list(tmp_path.glob("*.corrupt-*"))
    finally:
        holder.kill()
        holder.wait(30)


def test_a_database_a_peer_is_creating_is_never_judged_damaged(tmp_path: Path) -> None:
    # Its first page can land between our read of the header and our look at the
    # size. That is a file being made, not damage: judged damaged, the second opener
    # would wait out its timeout for the first to let go, then serve misses for life.
    ref = tmp_path / "ref.db"
    conn = sqlite3.connect(ref)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    page = ref.read_bytes()
    seen: list[str] = []

    def poll(path: str, started: threading.Event, done: threading.Event) -> None:
        started.set()
        while not done.is_set():
            problem = file_problem(path)
            if problem is not None:
                seen.append(problem)

    for i in range(200):
        path = str(tmp_path / f"{i}.db")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)  # empty, as a new connection leaves it
        started, done = threading.Event(), threading.Event()
        t = threading.Thread(target=poll, args=(path, started, done))
        t.start()
        started.wait()
        os.write(fd, page)  # one write, as SQLite writes its first page
        done.set()
        t.join()
        os.close(fd)
    assert seen == []
    assert file_problem(str(ref)) is None
    (tmp_path / "short").write_bytes(b"x" * 50)  # still damage: short and foreign
    assert file_problem(str(tmp_path / "short")) is not None


# -- eviction and space ---------------------------------------------------------------------------


def test_cap_bounds_the_files_on_disk_and_they_shrink(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    cap = 400_000
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        budget = c._driver._w.space.budget
        # Free pages inside the file are at most what one eviction frees below the
        # share (the low-water gap) and the pages of the row it made room for: the
        # rest went back to the file system. (The count cycles between 0 and that as
        # evictions come: one look after the 300th store held only by its phase.)
        gap = (1 - SQLiteProgramCache.EVICT_LOW_WATER) * budget.entry_share() // 4096 + 2
        for i in range(300):
            c[f"k{i}"] = os.urandom(4096)
            assert disk_bytes(db) <= cap + 3 * 4096 + 8 * 4096, (i, disk_bytes(db))
            with raw(db) as conn:
                pages, free = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                               for p in ("page_count", "freelist_count"))  # fmt: skip
            assert free <= gap and pages * 4096 <= budget.share, (i, pages, free, gap)
        assert c.stats().evictions > 150 and 0 < len(c) < 100
        assert c.size_bytes == disk_bytes(db) <= cap + 11 * 4096
        newest = [c.get(f"k{i}") for i in range(290, 300)]
        assert all(v is not None for v in newest)  # the newest survive
    assert disk_bytes(db) <= cap


def test_eviction_follows_last_use(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db, max_size_bytes=300_000) as c:
        for i in range(20):
            c[f"k{i}"] = os.urandom(4096)
        assert c.get("k0") is not None  # k0 becomes the most recent
        for i in range(20, 60):
            c[f"k{i}"] = os.urandom(4096)
        assert c.stats().evictions > 0
        assert c.get("k0") is not None and c.get("k1") is None


def test_clear_gives_the_space_back(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        for i in range(300):
            c[f"k{i}"] = os.urandom(4096)
        assert c.size_bytes > 1_000_000
        c.clear()
        assert len(c) == 0 and c.size_bytes < 150_000


def test_writes_run_one_statement_and_eviction_walks_the_index(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db, max_size_bytes=100_000_000) as c:
        c["warm"] = b"w"
        statements: list[str] = []
        c._driver._conns.get().set_trace_callback(statements.append)
        for i in range(50):
            c[f"k{i}"] = b"x" * 1000
        # Only the upsert (traced again for each trigger it fires) in its write
        # transaction (BEGIN IMMEDIATE ... COMMIT): no scan, no count.
        inserts = [s for s in statements if s.startswith("INSERT")]
        assert len(inserts) >= 50
        assert statements.count("BEGIN IMMEDIATE") == statements.count("COMMIT") == 50
        assert all(s.startswith(("INSERT", "BEGIN IMMEDIATE", "COMMIT")) for s in statements)
        # Eviction's own queries (future last uses first, then the rest) walk the index.
        from cuforge.storage.sqlite._evict import _OLDEST_FIRST

        for query in _OLDEST_FIRST:
            conn = c._driver._conns.get()
            plan = " ".join(str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN {query}", (0,)))
            assert "cuforge_entries_used" in plan and "TEMP B-TREE" not in plan, plan


def test_running_totals_match_the_rows(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    rng = random.Random(7)
    with SQLiteProgramCache(db, max_size_bytes=200_000) as c:
        for _ in range(400):
            k = f"k{rng.randrange(40)}"
            op = rng.random()
            if op < 0.6:
                c.set_entry(k, os.urandom(rng.randrange(1, 9000)), b"m" * rng.randrange(50))
            elif op < 0.8:
                with pytest.raises(KeyError) if c.get(k) is None else _nothing():
                    del c[k]
            else:
                c.get(k)
        with raw(db) as conn:
            n, total = conn.execute("SELECT entries, total_bytes FROM cuforge_state").fetchone()
            assert (n, total) == conn.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM cuforge_entries"
            ).fetchone()
        assert len(c) == n


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- statistics ---------------------------------------------------------------------------------


def test_statistics_are_kept_in_the_database(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    for _ in range(2):
        with SQLiteProgramCache(db) as c:
            c["k"] = b"v" * 10
            c.get("k")
            c.get("absent")
    with SQLiteProgramCache(db) as c:
        c.get("k")
        total = c.total_stats()
    assert (total.stores, total.hits, total.misses, total.bytes_read) == (2, 3, 2, 30)
    # the schema's counters are CacheStats' fields, in order (revision 3: all twelve); a
    # counter added later is kept per handle until a schema revision adds its column
    assert list(STAT_COLUMNS) == list(CacheStats().as_dict())[:12] and len(STAT_COLUMNS) == 12


def test_zero_stats_restarts_the_shared_counters(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:  # counts written back at close
        c["k"] = b"v" * 10
        c.get("k")
    a, b = SQLiteProgramCache(db), SQLiteProgramCache(db)
    try:
        b.get("k")
        b.total_stats()  # b's hit is written back before the reset ...
        a.get("absent")  # ... a's miss is not
        assert a.total_stats().hits == 2
        a.zero_stats()
        assert a.total_stats() == CacheStats()
        assert a.stats().misses == 1  # a handle's own counters stay
        a.get("k")
        b.get("k")
        b.get("absent")
        b.close()  # b writes back only what it counted after its last write-back
        total = a.total_stats()
        assert (total.hits, total.misses, total.stores, total.bytes_read) == (2, 1, 0, 20)
    finally:
        a.close()
        b.close()
    with SQLiteProgramCache(db) as c:  # persisted: a fresh handle sees the same totals
        assert (c.total_stats().hits, c.total_stats().misses) == (2, 1)
        assert c["k"] == b"v" * 10  # the entries stay


# -- threads --------------------------------------------------------------------------------------


def test_threads_sharing_one_handle_under_a_cap(tmp_path: Path) -> None:
    cache = SQLiteProgramCache(tmp_path / "cache.db", max_size_bytes=300_000)
    payloads = {i: bytes([i]) * (2000 + 100 * i) for i in range(64)}  # 330 kB in all
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(400):
                k = rng.randrange(64)
                if rng.random() < 0.4:
                    cache.set_entry(str(k), payloads[k], str(k).encode())
                else:
                    got = cache.get_entry(str(k))
                    assert got is None or got == CacheEntry(payloads[k], str(k).encode())
        except BaseException as exc:  # reported below
            errors.append(exc)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    with cache:
        assert not errors, errors
        assert not caught, [str(w.message) for w in caught]
        s = cache.stats()
        assert s.write_failures == 0 and s.integrity_failures == 0 and s.evictions > 0
        # Soft while the threads' reads pin the WAL; within the cap once it is folded in.
        assert cache.size_bytes <= 1.25 * 300_000
    assert disk_bytes(tmp_path / "cache.db") <= 300_000


# -- URLs, the command line, the import ------------------------------------------------------------


def test_sqlite_urls(tmp_path: Path) -> None:
    with open_cache(f"sqlite://{tmp_path}/a.db?max_size=2G&durable=1&timeout=2s") as c:
        assert isinstance(c, SQLiteProgramCache) and c.max_size_bytes == 2 << 30
        assert c.path == str(tmp_path / "a.db") and c._driver._durable and c._driver._timeout == 2.0
    for url, names in [
        ("sqlite://", "needs a database file"),
        (f"sqlite://{tmp_path}/b.db?max_size=lots", "max_size"),
        (f"sqlite://{tmp_path}/b.db?mode=2770", "unknown parameter 'mode'"),
        (f"sqlite://{tmp_path}", "is a directory"),
    ]:
        with pytest.raises(ValueError, match=names):
            open_cache(url)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuforge", *args], capture_output=True, text=True)


def test_cli_compile_through_a_sqlite_url(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text(SRC)
    url = f"sqlite://{tmp_path}/cli.db"
    first = _cli("compile", str(src), "--arch", ARCH, "--cache", url + "?max_size=64M")
    assert first.returncode == 0, first.stderr
    assert f"cache miss (compiled and stored in {url})" in first.stdout
    second = _cli("compile", str(src), "--arch", ARCH, "--cache", url)
    assert second.returncode == 0 and "cache hit" in second.stdout, second
    with SQLiteProgramCache(tmp_path / "cli.db") as c:
        assert len(c) == 1 and c.total_stats().hits == 1
    (tmp_path / "app.db").write_bytes((tmp_path / "cli.db").read_bytes()[:0])
    with raw(tmp_path / "app.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    for bad, names in [
        (f"sqlite://{tmp_path}/app.db", "is not a cuforge SQLite cache"),
        (f"sqlite://{tmp_path}/x.db?max_size=huge", "max_size"),
        ("nosuch://x", "unknown scheme"),
    ]:
        out = _cli("compile", str(src), "--arch", ARCH, "--cache", bad)
        assert out.returncode == 2 and names in out.stderr, out
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_import_works_without_sqlite3() -> None:
    code = (
        "import sys\n"
        "import cuforge.storage, cuforge.utils\n"
        "assert 'sqlite3' not in sys.modules, 'imported eagerly'\n"
        "sys.modules['sqlite3'] = None  # as on an interpreter built without it\n"
        "from cuforge.utils import SQLiteProgramCache\n"
        "try:\n"
        "    SQLiteProgramCache('/tmp/never.db')\n"
        "except ImportError as exc:\n"
        "    assert 'sqlite3' in str(exc) and 'FileStreamProgramCache' in str(exc), exc\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


_SQLITE_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def test_a_database_locked_for_good_costs_a_miss_a_bound_not_the_timeout(
    tmp_path: Path,
) -> None:
    """Another process holds BEGIN EXCLUSIVE: with the default timeout (5 s) every miss
    waited it out before its store was dropped; now a store waits 0.25 s at most and is
    kept in memory (served by this handle), then written once the holder lets go."""
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c["old"] = b"o"
        holder = subprocess.Popen(
            [sys.executable, "-c", _SQLITE_HOLDER, str(db), "20"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            slowest = 0.0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for i in range(4):
                    t = time.monotonic()
                    assert c.get(f"k{i}") is None and c.get("old") == b"o"
                    c[f"k{i}"] = b"v%d" % i
                    assert c.get(f"k{i}") == b"v%d" % i  # kept, and served from memory
                    slowest = max(slowest, time.monotonic() - t)
            during = c.stats()
        finally:
            holder.kill()
            holder.wait(30)
        assert slowest < 3.0, slowest  # each waited the 5 s timeout before the fix
        assert during.write_failures == 0 and during.lock_timeouts >= 1, during
        assert [w for w in caught if issubclass(w.category, CacheWriteWarning)] == []
        c["after"] = b"a"  # the holder is gone: this store writes the kept ones too
        assert c.stats().stores == during.stores + 5
    with SQLiteProgramCache(db) as other:  # another handle sees every one of them
        assert [other.get(f"k{i}") for i in range(4)] == [b"v%d" % i for i in range(4)]


def test_rows_kept_during_a_lock_are_written_at_close_and_forgotten_when_deleted(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cache.db"
    c = SQLiteProgramCache(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", _SQLITE_HOLDER, str(db), "1.0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        c["keep"] = b"k"
        c["gone"] = b"g"
        del c["gone"]  # never written later
        assert c.stats().lock_timeouts >= 1 and c.get("gone") is None
    finally:
        holder.wait(30)  # it lets go after 1 s
    c.close()  # writes what it kept, waiting as long as a write may
    with SQLiteProgramCache(db) as other:
        assert other.get("keep") == b"k" and other.get("gone") is None


@pytest.mark.parametrize("kind", ["text", "other-sqlite-damaged"])
def test_a_users_file_at_the_path_is_refused_never_moved_aside(tmp_path: Path, kind) -> None:
    """A file cuforge never used (no ``<path>.lock``, no cuforge application_id) is not
    "damage" to recover from: it was renamed to ``.corrupt-*`` and replaced."""
    from cuforge.storage.sqlite import ForeignDatabaseError

    db = tmp_path / "notes.db"
    if kind == "text":
        content = b"my notes, not a cache\n" * 50
    else:  # a valid SQLite header (someone else's application id), garbage pages
        with raw(db) as conn:
            conn.execute("PRAGMA application_id = 7")
            conn.execute("CREATE TABLE t (x)")
            conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(500),)] * 40)
        data = bytearray(db.read_bytes())
        for page in range(1, len(data) // 4096):
            data[page * 4096 : page * 4096 + 4096] = b"\xa5" * 4096
        content = bytes(data)
    db.write_bytes(content)
    with pytest.raises(ForeignDatabaseError) as info:
        SQLiteProgramCache(db)
    message = str(info.value)
    assert str(db) in message and "\n" not in message and "not a cuforge" in message
    assert db.read_bytes() == content  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]  # nothing made beside it


# -- whose file: a lock file proves nothing; legacy caches are recognised and marked -----------


def test_a_lock_file_beside_a_users_file_proves_nothing(tmp_path: Path) -> None:
    """``touch data.csv.lock`` (or a killed opener's stale lock), then
    ``SQLiteProgramCache("data.csv")``: the lock was taken as proof that cuforge had
    used the path, and data.csv was renamed ``.corrupt-*`` with a database made in its
    place. It is refused now, and nothing is created, renamed or written."""
    data = tmp_path / "data.csv"
    content = b"id,value\n" + b"".join(f"{i},{i * i}\n".encode() for i in range(500))
    data.write_bytes(content)
    (tmp_path / "data.csv.lock").touch()
    with pytest.raises(CachePathError) as info:
        SQLiteProgramCache(data)
    message = str(info.value)
    assert isinstance(info.value, ForeignDatabaseError) and "\n" not in message
    assert str(data) in message and "is not a cuforge SQLite cache" in message
    assert data.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv", "data.csv.lock"]
    assert (tmp_path / "data.csv.lock").stat().st_size == 0


def test_someone_elses_wal_database_gets_no_files_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WAL-mode database of another program, closed: judged from its header and
    read ``immutable``. No ``.lock`` is created, not even for a moment (it was, and
    removed again), and no ``-wal`` or ``-shm`` is left (a read-only SQLite connection
    would create both and leave them)."""
    db = tmp_path / "app.db"
    with raw(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    before = db.read_bytes()
    created: list[str] = []
    real_open = os.open

    def watching_open(path, flags, *args, **kwargs):  # files cuforge itself creates
        if flags & os.O_CREAT and str(path).startswith(str(db)):
            created.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watching_open)
    with pytest.raises(ForeignDatabaseError, match="users"):
        SQLiteProgramCache(db)
    monkeypatch.undo()
    assert created == [] and db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_a_legacy_cache_keeps_working_and_is_marked(tmp_path: Path) -> None:
    """A cache without an application id (recognised by its tables) serves its entries
    and gets ``ownership.SQLITE_APPLICATION_ID``, the proof a later damaged-file
    recovery needs."""
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c["k"] = b"legacy value"
    with raw(db) as conn:
        conn.execute("PRAGMA application_id = 0")
    assert ownership.sqlite_application_id(str(db)) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SQLiteProgramCache(db) as c:
            assert c.get("k") == b"legacy value" and len(c) == 1
            # Marked at once (in the file's header, not only in the WAL).
            assert ownership.sqlite_application_id(str(db)) == ownership.SQLITE_APPLICATION_ID
            c["k2"] = b"new"
    with SQLiteProgramCache(db) as c:
        assert c.get("k") == b"legacy value" and c.get("k2") == b"new"
    # Marked, it is provable: damage is now recovered from, not refused.
    data = bytearray(db.read_bytes())
    db.write_bytes(bytes(data[: len(data) // 2]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SQLiteProgramCache(db) as c:
            assert c.get("k") is None
    assert any("moved it to" in m for m in recovery_warnings(caught))


def test_a_new_cache_carries_the_ownership_id(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        assert ownership.sqlite_application_id(str(db)) == ownership.SQLITE_APPLICATION_ID
        assert APPLICATION_ID == ownership.SQLITE_APPLICATION_ID
        c["k"] = b"v"
    assert ownership.sqlite_application_id(str(db)) == ownership.SQLITE_APPLICATION_ID


# -- clock skew and values larger than the cap ---------------------------------------------------


_DAY_NS = 86_400 * 10**9


def test_entries_used_in_the_future_are_evicted_before_new_stores(tmp_path: Path) -> None:
    """Last uses in the future (a host whose clock was ahead, a cache copied from one)
    outranked every new store: each new entry was the one evicted. They go first now."""
    db = tmp_path / "cache.db"
    cap = 300_000  # ~50 entries of 4 KiB
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        for i in range(30):
            c[f"old{i}"] = os.urandom(4096)
        assert c.stats().evictions == 0
    with raw(db) as conn:
        conn.execute("UPDATE cuforge_entries SET used_ns = ?", (time.time_ns() + _DAY_NS,))
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        for i in range(30):
            c[f"new{i}"] = os.urandom(4096)
        evicted = c.stats().evictions
        assert evicted > 0
        assert [i for i in range(30) if c.get(f"new{i}") is None] == []  # every new one kept
        old_left = sum(c.get(f"old{i}") is not None for i in range(30))
        assert old_left == 30 - evicted  # only future-stamped ones went
        assert len(c) == 30 + old_left


def test_a_hit_on_an_entry_stamped_in_the_future_restamps_it(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c["k"] = b"v"
    future = time.time_ns() + _DAY_NS
    with raw(db) as conn:
        conn.execute("UPDATE cuforge_entries SET used_ns = ?", (future,))
    with SQLiteProgramCache(db) as c:
        before = time.time_ns()
        assert c.get("k") == b"v"
    with raw(db) as conn:
        (used,) = conn.execute("SELECT used_ns FROM cuforge_entries").fetchone()
    assert before <= used < future  # the hit's real time, no longer in the future


def test_a_value_larger_than_the_cap_is_refused_and_evicts_nothing(tmp_path: Path) -> None:
    """A value larger than the cap was stored, evicting everything else, and the
    cache stayed many times over its cap while open. It is a refused store now:
    counted, reported as ``too-large``, and no other entry is evicted for it."""
    from cuforge.storage import events

    db = tmp_path / "cache.db"
    cap = 300_000
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        for i in range(5):
            c[f"small{i}"] = os.urandom(4096)
        events.take_dropped()
        c["big"] = os.urandom(25 * cap)
        dropped = events.take_dropped()
        assert dropped is not None and dropped[0] == events.TOO_LARGE == "too-large"
        assert "larger than the cache's size cap" in dropped[1] and str(cap) in dropped[1]
        assert c.get("big") is None
        assert all(c.get(f"small{i}") is not None for i in range(5))
        stats = c.stats()
        assert (stats.stores, stats.write_failures, stats.evictions) == (5, 1, 0), stats
        assert c.size_bytes <= cap
    assert disk_bytes(db) <= cap


def test_the_compile_pipeline_reports_a_value_larger_than_the_cap(tmp_path: Path) -> None:
    """Through a real compile: a cubin that cannot fit the cap's room for entries is
    reported not stored, why ``too-large`` (what ``cuforge compile`` prints)."""
    from cuforge.compile.cache import compile_through_cache
    from cuforge.storage import events

    # The smallest cap a SQLite cache takes (72 KiB) leaves one page for entries, less
    # than this cubin of 16 kernels (a smaller cap is refused at open:
    # test_storage_sqlite_cap.py).
    src = "".join(f'extern "C" __global__ void k{i}(int* p) {{ p[{i}] = {i}; }}\n'
                  for i in range(16))  # fmt: skip
    with SQLiteProgramCache(tmp_path / "cache.db", max_size_bytes=73_728) as c:
        program = Program(src, "c++", ProgramOptions(arch=ARCH))
        done = compile_through_cache(program, "cubin", (), None, c)
        assert done.store is not None and not done.store.stored, done
        assert done.store.reason == events.TOO_LARGE, done.store
        assert len(c) == 0 and c.stats().write_failures == 1
