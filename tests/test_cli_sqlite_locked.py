"""A SQLite cache another connection holds locked: ``clear``, ``prune`` and
``verify --fix`` say so -- the database is locked, and for how long it was waited for
-- instead of guessing at a read-only file system or another user's files, and none
of them warns that it "could not store an entry" (it stores nothing). Nothing is lost:
the entry is there once the lock goes. Through the installed ``cuforge`` script."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from _cli import SAXPY, run

HOLD = (
    "import sqlite3, sys, time\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN EXCLUSIVE')\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


@contextlib.contextmanager
def _locked(db: Path) -> Iterator[None]:
    """Another process holds ``db``'s write lock until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate("")


def _damage(db: Path) -> None:
    con = sqlite3.connect(db)
    rid, data = con.execute("SELECT rid, data FROM cuforge_entries").fetchone()
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    con.execute("UPDATE cuforge_entries SET data = ? WHERE rid = ?", (bytes(flipped), rid))
    con.commit()
    con.close()


def test_maintenance_on_a_locked_database_names_the_lock_and_loses_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    url = f"sqlite://{db}?timeout=0.5"
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "x.cubin"), "--cache", url)  # fmt: skip
    assert built.returncode == 0, built.stderr
    locked = "(the database is locked: another connection held it for over 0.5 s)"
    where = f"sqlite://{db}?timeout=0.5"
    with _locked(db):
        clear = run(tmp_path, "cache", "clear", "--yes", "--cache", url)
        assert clear.returncode == 1
        assert clear.stderr.splitlines() == [
            f"cuforge cache clear: could not remove 1 of 1 entry of {where} {locked}"
        ]
        prune = run(tmp_path, "cache", "prune", "--max-size", "1B", "--cache", url)
        assert prune.returncode == 1
        assert prune.stderr.splitlines() == [
            f"cuforge cache prune: could not remove 1 of 1 entry of {where} {locked}"
        ]
    _damage(db)
    with _locked(db):
        fix = run(tmp_path, "cache", "verify", "--fix", "--cache", url)
        assert fix.returncode == 1 and "1 bad, 0 removed" in fix.stdout
        assert fix.stderr.splitlines() == [
            f"cuforge cache verify: could not remove 1 of the 1 bad entry of {where} {locked}"
        ]
    ls = run(tmp_path, "cache", "ls", "--cache", url)
    assert ls.returncode == 0 and len(ls.stdout.splitlines()) == 1  # still there
    fixed = run(tmp_path, "cache", "verify", "--fix", "--cache", url)
    assert "1 bad, 1 removed" in fixed.stdout and fixed.stderr == ""
