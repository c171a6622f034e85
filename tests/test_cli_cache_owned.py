"""``cuforge cache ...`` and ``cuforge doctor`` on a folder that is not a cache, and
read-only commands on one that is (issue 32, item 5): nothing is created or deleted.

``cache stats --cache DIR`` on an existing folder deleted ``DIR/tmp/*`` older than an
hour and any ``*.*.tmp``, deleted ``DIR/stats/*.cnt`` and created ``entries/ locks/
stats/ size.ledger*`` there; ``cache clear --yes`` then deleted every regular file
under ``DIR/entries/``. Through the real console script.
"""

from __future__ import annotations

import json

import pytest

from _cli import SAXPY, one_line_error, run
from _userdirs import NOT_A_CACHE, old_file, snapshot, user_folder
from cuforge.storage import FileStreamProgramCache

ACTIONS = [
    ["stats"], ["stats", "--json"], ["ls"], ["show", "ab"], ["verify"], ["verify", "--fix"],
    ["clear", "--yes"], ["prune", "--older-than", "1s"], ["zero-stats"],
    ["explain", str(SAXPY), "--arch", "sm_90"],
]  # fmt: skip


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: " ".join(a[:2]))
def test_cache_commands_refuse_a_folder_that_is_not_a_cache_and_change_nothing(
    tmp_path, action
) -> None:
    folder = user_folder(tmp_path / "mine")
    before = snapshot(folder)
    for where in (str(folder), f"file://{folder}", f"memory://,{folder}"):
        result = run(tmp_path, "cache", *action, "--cache", where)
        line = one_line_error(result, f"cuforge cache {action[0]}")
        assert NOT_A_CACHE in line and str(folder) in line, line
        assert snapshot(folder) == before, (action, where)


def test_doctor_names_a_folder_that_is_not_a_cache_and_changes_nothing(tmp_path) -> None:
    folder = user_folder(tmp_path / "mine")
    before = snapshot(folder)
    for where in (str(folder), f"memory://,{folder}"):
        result = run(tmp_path, "doctor", "--json", "--cache", where)
        assert result.returncode == 1, result.stderr
        problems = json.loads(result.stdout)["problems"]
        assert any(NOT_A_CACHE in p for p in problems), problems
        assert snapshot(folder) == before, where


def test_inspecting_a_cache_creates_and_deletes_nothing(tmp_path) -> None:
    """stats/ls/show/verify/explain/doctor opened the cache writable: a counter record,
    merge.lock, the ledger's handle count, and a dead writer's temp swept."""
    cache = tmp_path / "cache"
    with FileStreamProgramCache(cache) as c:
        c["k"] = b"v"
        (entry,) = c.iter_entries()
    old_file(cache / "tmp" / "4242-0badcafe.0.tmp")  # goes when a writable handle opens
    before = snapshot(cache)
    where = ("--cache", str(cache))
    for action in (["stats"], ["stats", "--format", "openmetrics"], ["ls", "--json"],
                   ["show", entry.id[:8]], ["verify"],
                   ["explain", str(SAXPY), "--arch", "sm_90"]):  # fmt: skip
        result = run(tmp_path, "cache", *action, *where)
        assert result.returncode in (0, 1), (action, result.stderr)  # explain: a miss
        assert "Traceback" not in result.stderr
        assert snapshot(cache) == before, action
    assert run(tmp_path, "doctor", *where).returncode == 0
    assert json.loads(run(tmp_path, "cache", "ls", "--json", *where).stdout)[0]["id"] == entry.id
    assert snapshot(cache) == before


def test_an_empty_folder_reads_as_an_empty_cache_and_stays_empty(tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run(tmp_path, "cache", "stats", "--json", "--cache", str(empty))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == 0
    assert list(empty.iterdir()) == []


def test_clear_and_verify_fix_keep_a_users_files_inside_a_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    with FileStreamProgramCache(cache) as c:
        c["k"] = b"v"
    mine = [
        old_file(cache / "entries" / "data.txt"),
        old_file(cache / "entries" / "ab" / "notes.txt"),
        old_file(cache / "tmp" / "a.b.tmp"),
        old_file(cache / "stats" / "x.cnt", b"\0" * 80),
    ]
    kept = {p: p.read_bytes() for p in mine}
    where = ("--cache", str(cache))
    verified = run(tmp_path, "cache", "verify", "--fix", *where)
    assert verified.returncode == 0 and "all verify" in verified.stdout, verified.stdout
    cleared = run(tmp_path, "cache", "clear", "--yes", *where)
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(run(tmp_path, "cache", "ls", "--json", *where).stdout) == []
    assert {p: p.read_bytes() for p in mine} == kept


def test_compile_refuses_a_folder_that_is_not_a_cache_and_changes_nothing(tmp_path) -> None:
    """``cuforge compile --cache DIR`` swept DIR/tmp and wrote the cache's tree into it."""
    folder = user_folder(tmp_path / "mine")
    before = snapshot(folder)
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                 str(tmp_path / "s.cubin"), "--cache", str(folder))  # fmt: skip
    line = one_line_error(result, "cuforge compile")
    assert NOT_A_CACHE in line and "fix: name an empty or new directory" in line
    assert snapshot(folder) == before
