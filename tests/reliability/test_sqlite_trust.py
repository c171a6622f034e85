"""SQLite: whose file it is, skewed clocks and values larger than the cap, at scale.

Openers racing at a user's file must never displace it (a lock file proves nothing;
only the header's application id does), openers racing at a new path must all get the
cache; entries whose last use lies in the future must not outrank new stores; a value
that cannot fit the cap is refused without evicting anything. The unit tests pinning
each rule are in ``test_storage_sqlite.py`` and ``test_storage_sqlite_processes.py``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from _figures import SCALES, pick, record
from _sqlite_workers import open_race
from cuforge.storage import SQLiteProgramCache, events, ownership

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX process tools")

PARTIES = 8


@SCALES
def test_openers_racing_at_a_users_file_never_displace_it(tmp_path: Path, scale: str) -> None:
    rounds = pick(scale, 10, 200)
    content = b"run,loss\n" + b"".join(f"{i},{i * 7 % 13}\n".encode() for i in range(3000))

    def users_file(path: str) -> None:
        Path(path).write_bytes(content)

    reports = open_race(str(tmp_path), "results.csv", users_file, rounds, PARTIES)
    kept = sum(
        sorted(os.listdir(tmp_path / "data" / str(r))) == ["results.csv"]
        and (tmp_path / "data" / str(r) / "results.csv").read_bytes() == content
        for r in range(rounds)
    )
    refused = sum(
        o.get("refused") == "ForeignDatabaseError"
        and "is not a cuforge SQLite cache" in o["message"]
        for report in reports
        for o in report["outcomes"]
    )
    warned = sum(len(report["warnings"]) for report in reports)
    assert (kept, refused, warned) == (rounds, rounds * PARTIES, 0), reports
    record(
        "ownership", "sqlite",
        f"{PARTIES} processes opening a user's results.csv at once, {rounds} rounds",
        rounds * PARTIES,
        f"{refused} of {rounds * PARTIES} opens refused in one line naming the path and the "
        f"fix; the file byte for byte with nothing beside it in {kept} of {rounds} rounds",
        scale=scale, lost=0,
    )  # fmt: skip


@SCALES
def test_openers_racing_at_a_new_path_all_open_it(tmp_path: Path, scale: str) -> None:
    rounds = pick(scale, 10, 200)
    reports = open_race(str(tmp_path), "cache.db", lambda path: None, rounds, PARTIES)
    opened = sum(o == {"opened": True} for report in reports for o in report["outcomes"])
    warned = sum(len(report["warnings"]) for report in reports)
    marked = 0
    for r in range(rounds):
        db = tmp_path / "data" / str(r) / "cache.db"
        with SQLiteProgramCache(db) as c:
            assert len(c) == PARTIES, r
        marked += ownership.sqlite_application_id(str(db)) == ownership.SQLITE_APPLICATION_ID
        assert sorted(os.listdir(db.parent)) == ["cache.db", "cache.db.lock"], r
    assert (opened, warned, marked) == (rounds * PARTIES, 0, rounds), reports
    record(
        "ownership", "sqlite",
        f"{PARTIES} processes creating a new cache at one path at once, {rounds} rounds",
        rounds * PARTIES,
        f"{opened} of {rounds * PARTIES} opened, stored and read back, 0 warnings; each "
        f"path one cache of {PARTIES} entries carrying cuforge's application id",
        scale=scale, lost=0,
    )  # fmt: skip


@SCALES
def test_entries_stamped_in_the_future_never_outrank_new_stores(tmp_path: Path, scale: str) -> None:
    n = pick(scale, 30, 300)
    cap = n * 10_000  # about 1.7 n entries of 4 KiB: n old + n new must evict
    db = tmp_path / "cache.db"
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        for i in range(n):
            c[f"old{i}"] = os.urandom(4096)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE cuforge_entries SET used_ns = ?", (time.time_ns() + 86_400 * 10**9,))
    conn.close()
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        for i in range(n):
            c[f"new{i}"] = os.urandom(4096)
        evicted = c.stats().evictions
        new_kept = sum(c.get(f"new{i}") is not None for i in range(n))
        old_kept = sum(c.get(f"old{i}") is not None for i in range(n))
    assert evicted > 0 and new_kept == n and old_kept == n - evicted
    record(
        "clock skew", "sqlite",
        "every entry's last use a day in the future, then as many new stores past the cap",
        n,
        f"{new_kept} of {n} new entries kept; {evicted} evictions, every one a "
        "future-stamped entry",
        scale=scale, lost=0,
    )  # fmt: skip


@SCALES
def test_values_larger_than_the_cap_are_refused_and_evict_nothing(
    tmp_path: Path, scale: str
) -> None:
    n = pick(scale, 5, 100)
    cap = max(400_000, n * 16384)  # the small entries alone fit: none evicted by LRU
    db = tmp_path / "cache.db"
    reasons = set()
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        for i in range(n):
            c[f"small{i}"] = os.urandom(2048)
            events.take_dropped()
            c[f"big{i}"] = bytes(cap * (2 + i % 25))
            dropped = events.take_dropped()
            reasons.add(dropped[0] if dropped else None)
        big_served = sum(c.get(f"big{i}") is not None for i in range(n))
        small_kept = sum(c.get(f"small{i}") is not None for i in range(n))
        stats = c.stats()
        peak = c.size_bytes
    assert reasons == {events.TOO_LARGE} and big_served == 0 and small_kept == n
    assert (stats.write_failures, stats.evictions) == (n, 0) and peak <= cap
    record(
        "cap", "sqlite", "values 2-26x the cap stored between small entries", n,
        f"{n} of {n} refused (not stored, counted in write_failures, reported too-large); "
        f"0 evictions, {small_kept} of {n} small entries kept; files within the cap",
        scale=scale, lost=0,
    )  # fmt: skip
