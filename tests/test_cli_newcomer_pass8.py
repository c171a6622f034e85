"""The eighth newcomer pass (issue 36: every message true): each test runs the
installed ``cuforge`` console script in a subprocess on real caches and fails on the
main it was written against.

- 1. a tier level behind the first that cannot be opened (another program's SQLite
  file): ``cuforge doctor`` said ``writable ... yes`` and named no problem, while
  every ``cuforge cache`` command fails on it.
"""

from __future__ import annotations

import sqlite3

from _cli import run


def test_doctor_names_the_problem_of_a_level_behind_the_first_that_cannot_open(tmp_path):
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE someone_elses (x)")
    (tmp_path / "local").mkdir()
    url = f"file://{tmp_path / 'local'},sqlite://{foreign}"
    stats = run(tmp_path, "cache", "stats", "--cache", url)
    assert stats.returncode == 2  # a usage error, as a single-level cache's refusal
    failed = stats.stderr.strip().splitlines()[-1].partition("error: ")[2]
    assert "is not a cuforge SQLite cache" in failed
    doctor = run(tmp_path, "doctor", "--cache", url)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr  # doctor found a problem
    lines = doctor.stdout.splitlines()
    problems = [ln.split(None, 1)[1] for ln in lines if ln.startswith("problem")]
    assert problems == [failed]  # exactly the line the command fails with
    level = next(ln for ln in lines if str(foreign) in ln and "sqlite://" in ln)
    assert "yes" not in level.split(str(foreign))[1]
    assert foreign.read_bytes()[:16] == b"SQLite format 3\x00"
    with sqlite3.connect(foreign) as db:  # nothing was changed in it
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["someone_elses"]
