"""The SQLite cache's schema across cuforge versions: a revision-2 file (ten counter
columns) is brought to revision 3 (lock_timeouts and warm_compiles columns) in place,
with no entry or counter lost; an older cuforge keeps working on the migrated file;
a file of a newer layout is refused and left as it was.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuforge.storage import SQLiteProgramCache
from cuforge.storage._integrity import key_seed
from cuforge.storage.entry import CacheEntry, key_digest
from cuforge.storage.sqlite._schema import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    STAT_COLUMNS,
    NewerSchemaError,
    rid_of,
    row_check,
)

REPO = Path(__file__).resolve().parents[1]
#: The last cuforge whose SQLite files are schema revision 2 (ten counter columns).
REVISION_2_COMMIT = "f9452b3"

# Revision 2's state table, as cuforge wrote it (version 2, ten counters).
_REVISION_2_DDL = (
    """CREATE TABLE cuforge_entries (
        rid INTEGER PRIMARY KEY, digest BLOB NOT NULL, crc INTEGER NOT NULL,
        size INTEGER NOT NULL, stored_ns INTEGER NOT NULL, used_ns INTEGER NOT NULL,
        meta BLOB NOT NULL, data BLOB NOT NULL)""",
    "CREATE INDEX cuforge_entries_used ON cuforge_entries(used_ns)",
    "CREATE TABLE cuforge_state (id INTEGER PRIMARY KEY CHECK (id = 0), "
    "entries INTEGER NOT NULL, total_bytes INTEGER NOT NULL, "
    "hits INTEGER NOT NULL DEFAULT 0, misses INTEGER NOT NULL DEFAULT 0, "
    "stores INTEGER NOT NULL DEFAULT 0, evictions INTEGER NOT NULL DEFAULT 0, "
    "integrity_failures INTEGER NOT NULL DEFAULT 0, write_failures INTEGER NOT NULL DEFAULT 0, "
    "bytes_read INTEGER NOT NULL DEFAULT 0, bytes_written INTEGER NOT NULL DEFAULT 0, "
    "signature_failures INTEGER NOT NULL DEFAULT 0, read_failures INTEGER NOT NULL DEFAULT 0)",
    "INSERT INTO cuforge_state (id, entries, total_bytes) VALUES (0, 0, 0)",
    """CREATE TRIGGER cuforge_entries_insert AFTER INSERT ON cuforge_entries BEGIN
        UPDATE cuforge_state SET entries = entries + 1, total_bytes = total_bytes + NEW.size;
    END""",
    """CREATE TRIGGER cuforge_entries_update AFTER UPDATE OF size ON cuforge_entries BEGIN
        UPDATE cuforge_state SET total_bytes = total_bytes - OLD.size + NEW.size;
    END""",
    """CREATE TRIGGER cuforge_entries_delete AFTER DELETE ON cuforge_entries BEGIN
        UPDATE cuforge_state SET entries = entries - 1, total_bytes = total_bytes - OLD.size;
    END""",
)

ENTRIES = {b"k%d" % i: (os.urandom(300 + i), b"meta%d" % i) for i in range(20)}


def _revision_2_file(db: Path) -> None:
    """A schema-2 cache file as cuforge made it: our application id, version 2, WAL,
    the ten counter columns, rows that verify, counters already counted."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in _REVISION_2_DDL:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        now = time.time_ns()
        for key, (data, meta) in ENTRIES.items():
            kd = key_digest(key)
            crc = row_check(key_seed(kd), data, meta)
            conn.execute(
                "INSERT INTO cuforge_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (rid_of(kd), kd, crc, len(data) + len(meta), now, now, meta, data),
            )
        conn.execute("UPDATE cuforge_state SET hits = 7, misses = 5, stores = 20, bytes_read = 99")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _columns(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(cuforge_state)")]


def test_a_revision_2_file_is_migrated_in_place(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    _revision_2_file(db)
    assert "warm_compiles" not in _columns(db)
    with SQLiteProgramCache(db) as c:
        assert {k: c.get_entry(k) for k in ENTRIES} == {
            k: CacheEntry(*v) for k, v in ENTRIES.items()
        }
        total = c.total_stats()
        assert (total.hits, total.misses, total.stores, total.bytes_read) == (
            7 + 20,
            5,
            20,
            99 + sum(len(d) for d, _ in ENTRIES.values()),
        )
        c._tally_failure("warm_compiles")
        c._tally_failure("lock_timeouts")
    assert _columns(db)[-2:] == ["lock_timeouts", "warm_compiles"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    with SQLiteProgramCache(db) as c:  # another handle: the new counters were kept
        total = c.total_stats()
        assert (total.warm_compiles, total.lock_timeouts) == (1, 1)
        assert total.hits == 27 and len(c) == len(ENTRIES)


def test_a_revision_2_file_held_locked_opens_and_migrates_later(tmp_path: Path) -> None:
    """A peer holds the write lock when the first cuforge of revision 3 opens the
    file: the handle still serves (with the columns there are), and a later open
    adds them -- an upgrade never makes a cache unusable."""
    db = tmp_path / "cache.db"
    _revision_2_file(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db), "20"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with SQLiteProgramCache(db, timeout=0.3) as c:
            assert c.get_entry(b"k3") == CacheEntry(*ENTRIES[b"k3"])
            assert c.total_stats().hits >= 7
        assert "warm_compiles" not in _columns(db)
    finally:
        holder.kill()
        holder.wait(30)
    with SQLiteProgramCache(db) as c:
        c._tally_failure("warm_compiles")
    assert _columns(db)[-1] == "warm_compiles"
    with SQLiteProgramCache(db) as c:
        assert c.total_stats().warm_compiles == 1


_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_newer_layout_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db) as c:
        c.set_entry(b"k", b"v" * 100, b"m")
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(NewerSchemaError) as caught:
        SQLiteProgramCache(db)
    text = str(caught.value)
    assert "\n" not in text and str(db) in text
    assert f"schema version {SCHEMA_VERSION + 1}" in text and "upgrade cuforge" in text
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM cuforge_entries").fetchone()[0] == 1


def _older_cuforge(tmp_path: Path) -> Path:
    """The source of the last revision-2 cuforge, from this repository's history."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("no git history to take the older cuforge from")
    out = tmp_path / "older"
    out.mkdir()
    archive = subprocess.run(
        [git, "-C", str(REPO), "archive", REVISION_2_COMMIT, "src"], capture_output=True
    )
    if archive.returncode != 0:
        pytest.skip(f"commit {REVISION_2_COMMIT} is not in this clone")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "src"


_OLDER = """
import sys
from cuforge.storage import SQLiteProgramCache
from cuforge.storage.sqlite._schema import STAT_COLUMNS
assert len(STAT_COLUMNS) == 10, STAT_COLUMNS  # the older cuforge: revision 2
with SQLiteProgramCache(sys.argv[1]) as c:
    for i in range(5):
        assert c.get_entry(b"k%d" % i) == (b"v%d" % i * 50, b"m"), i
    c.set_entry(sys.argv[2].encode(), b"from the older cuforge", b"m")
    t = c.total_stats()
    print(len(c), t.hits, t.stores)
"""


def test_an_older_cuforge_keeps_working_on_a_migrated_file(tmp_path: Path) -> None:
    """Revision 2 (the older cuforge, run from this repository's history) makes the
    file, revision 3 migrates it, the older one opens it again: nothing rebuilt, every
    entry and counter there for both."""
    older = _older_cuforge(tmp_path)
    db = tmp_path / "cache.db"
    env = {**os.environ, "PYTHONPATH": str(older)}
    made = subprocess.run(
        [sys.executable, "-c", _MAKE, str(db)], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    assert "warm_compiles" not in _columns(db)
    with SQLiteProgramCache(db) as c:  # revision 3: migrates
        assert c.get_entry(b"k0") == CacheEntry(b"v0" * 50, b"m")
        c._tally_failure("warm_compiles")
    assert "warm_compiles" in _columns(db)
    run = subprocess.run(
        [sys.executable, "-c", _OLDER, str(db), "older"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    count, hits, stores = map(int, run.stdout.split())
    assert count == 6 and stores == 6 and hits >= 6
    with SQLiteProgramCache(db) as c:
        assert len(c) == 6
        assert c.get_entry(b"older") == CacheEntry(b"from the older cuforge", b"m")
        total = c.total_stats()
        assert total.warm_compiles == 1 and total.stores == 6


_MAKE = """
import sys
from cuforge.storage import SQLiteProgramCache
with SQLiteProgramCache(sys.argv[1]) as c:
    for i in range(5):
        c.set_entry(b"k%d" % i, b"v%d" % i * 50, b"m")
"""


def test_every_counter_has_a_column(tmp_path: Path) -> None:
    from cuforge.storage.stats import CacheStats

    assert list(STAT_COLUMNS) == list(CacheStats().as_dict())
    with SQLiteProgramCache(tmp_path / "c.db"):
        pass
    assert _columns(tmp_path / "c.db")[3:] == list(STAT_COLUMNS)
