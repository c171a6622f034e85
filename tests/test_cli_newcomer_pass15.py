"""Newcomer pass 15: doctor's ``exists`` on a tier, ``cache dir`` of a path no cache
opens, and the cache commands on a tier whose ``?ro`` level is not there yet."""

from __future__ import annotations

import json
from pathlib import Path

from _cli import SAXPY, one_line_error, run


def _compile(tmp_path: Path, cache: str) -> None:
    out = str(tmp_path / "k.cubin")
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", out, "--cache", cache)
    assert made.returncode == 0, made.stderr


def _lines(text: str, label: str) -> list[str]:
    return [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith(label + " ")]


def test_doctor_says_each_tier_levels_existence(tmp_path: Path) -> None:
    # One "exists" line described the first absent level as the whole cache: "no (?ro:
    # ...)" or "not yet (created by the first compile)" beside a level full of entries.
    a, b = f"file://{tmp_path / 'a'}", f"file://{tmp_path / 'b'}"
    _compile(tmp_path, f"memory://,{a},{b}?ro")
    got = run(tmp_path, "doctor", "--cache", f"memory://,{a},{b}?ro")
    assert _lines(got.stdout, "exists") == [
        f"{a}  yes",
        f"{b}  no (?ro: opened read-only, so no command creates it)",
    ], got.stdout
    got = run(tmp_path, "doctor", "--cache", f"memory://,{a},{b}")
    assert _lines(got.stdout, "exists") == [
        f"{a}  yes",
        f"{b}  not yet (created by the first compile)",
    ], got.stdout
    report = json.loads(run(tmp_path, "doctor", "--json", "--cache", f"{a},{b}").stdout)
    assert [lv.get("exists") for lv in report["levels"]] == [True, False], report


def test_cache_dir_refuses_a_path_no_cache_opens(tmp_path: Path) -> None:
    # It printed /etc/passwd (exit 0) while compile and stats refuse it (exit 2).
    afile = tmp_path / "afile"
    afile.write_text("not a cache\n")
    db = tmp_path / "k.db"
    _compile(tmp_path, f"sqlite://{db}")
    for value, says in (
        (str(afile), f"cache directory {afile}: exists and is not a directory"),
        (str(db), f"cache directory {db}: is an SQLite database file, not a directory"),
        (f"sqlite://{tmp_path}", f"sqlite:// path {tmp_path} is a directory"),
    ):
        got = run(tmp_path, "cache", "dir", "--cache", value)
        line = one_line_error(got, "cuforge cache dir")
        assert f"--cache: {says}" in line, line
        stats = run(tmp_path, "cache", "stats", "--cache", value)
        assert stats.returncode == 2 and says in stats.stderr, stats.stderr
    fresh = tmp_path / "not-yet"  # a cache not made yet: still its path, exit 0
    got = run(tmp_path, "cache", "dir", "--cache", str(fresh))
    assert (got.returncode, got.stdout.strip()) == (0, str(fresh)), got.stderr
    assert not fresh.exists()


def test_a_tiers_ro_level_not_there_yet_reads_as_empty(tmp_path: Path) -> None:
    # compile read it as an empty cache; ls, stats and verify said "there is no cache".
    a, b = f"file://{tmp_path / 'a'}", f"file://{tmp_path / 'b'}"
    tier = f"memory://,{a},{b}?ro"
    _compile(tmp_path, tier)
    listed = run(tmp_path, "cache", "ls", "--cache", tier, "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 1
    for command in (("stats",), ("verify",)):
        got = run(tmp_path, "cache", *command, "--cache", tier)
        assert got.returncode == 0, got.stderr
    assert not (tmp_path / "b").exists()  # read as empty, never created
    # alone, or a writable level not there: still no cache (nothing created)
    for value in (f"{b}?ro", f"{a},file://{tmp_path / 'c'}"):
        got = run(tmp_path, "cache", "stats", "--cache", value)
        assert got.returncode == 2 and "there is no cache at" in got.stderr, got.stderr
