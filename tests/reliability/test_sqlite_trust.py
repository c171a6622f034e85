"""SQLite: whose file it is, at scale.

Openers racing at a user's file must never displace it (a lock file proves nothing;
only the header's application id does), openers racing at a new path must all get the
cache. The unit tests pinning each rule are in ``test_storage_sqlite.py`` and
``test_storage_sqlite_processes.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _figures import SCALES, pick, record
from _sqlite_workers import open_race
from cuforge.storage import SQLiteProgramCache, ownership

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
