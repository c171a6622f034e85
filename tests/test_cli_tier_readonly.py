"""``cuforge cache clear|prune|verify --fix`` on a tier with a read-only (``?ro``)
level, through the real console script: a file level and a real Redis level behind
``?ro``. A ``?ro`` level is never written, so these commands act on the writable
levels only, and their summary and ``--json`` counts are what left each level
(once ``clear`` said ``removed 0`` having emptied the writable level, and ``prune``
said ``0 remain`` while the ``?ro`` level still held every entry)."""

from __future__ import annotations

import json

import pytest

from _cli import SAXPY, one_line_error, run, shown_size


def _fill(tmp_path, tier):
    """Compile saxpy for two arches through ``tier`` (no ``?ro``): both levels hold both."""
    result = run(tmp_path, "-q", "compile", str(SAXPY), "--arch", "sm_90,sm_80",
                 "--outdir", str(tmp_path / "out"), "--cache", tier)  # fmt: skip
    assert result.returncode == 0, result.stderr


def _refill(tmp_path, url):
    """Empty both levels of the tier ``url`` names (``?ro`` left out), then fill both
    again (a compile that hits the first level would not store in the second)."""
    writable = url.replace("?ro", "").replace("&ro", "")
    emptied = run(tmp_path, "cache", "clear", "--yes", "--cache", writable)
    assert emptied.returncode == 0, emptied.stderr
    _fill(tmp_path, writable)


def _ids(tmp_path, url):
    result = run(tmp_path, "cache", "ls", "--json", "--cache", url)
    assert result.returncode == 0, result.stderr
    return {e["id"] for e in json.loads(result.stdout)}


@pytest.fixture(params=["file-ro", "redis-ro"])
def tier(request, tmp_path, redis_server):
    """(the tier's URL with one ``?ro`` level, the read-only level's URL and index, the
    writable level's URL and index), both levels filled with the same 2 entries: a
    read-only file level before a writable Redis level, or a writable file level
    before a read-only Redis level."""
    local, redis = f"file://{tmp_path / 'local'}", f"{redis_server.url}?prefix=ro:"
    if request.param == "file-ro":
        _fill(tmp_path, f"{local},{redis}")
        return f"{local}?ro,{redis}", local, 0, redis, 1
    _fill(tmp_path, f"{local},{redis}")
    return f"{local},{redis}&ro", redis, 1, local, 0


def test_clear_removes_from_the_writable_level_and_counts_what_left_it(tmp_path, tier):
    url, ro, ro_at, rw, rw_at = tier
    entries = _ids(tmp_path, ro)
    assert len(entries) == 2 and _ids(tmp_path, rw) == entries
    result = run(tmp_path, "cache", "clear", "--yes", "--json", "--cache", url)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["cleared"] is True
    assert (report["removed"], report["not_removed"]) == (2, 0)
    levels = report["levels"]
    assert levels[rw_at]["read_only"] is False and levels[ro_at]["read_only"] is True
    assert (levels[rw_at]["removed"], levels[rw_at]["remaining"]) == (2, 0)
    assert (levels[ro_at]["removed"], levels[ro_at]["remaining"]) == (0, 2)
    assert levels[rw_at]["removed_bytes"] == report["removed_bytes"] > 0
    assert _ids(tmp_path, rw) == set()  # what the counts say went, went
    assert _ids(tmp_path, ro) == entries  # and ?ro was not written

    _refill(tmp_path, url)
    text = run(tmp_path, "cache", "clear", "--yes", "--cache", url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert f"level {ro_at} ({ro.split('?')[0]}): read-only (?ro), not cleared: 2 entries" in (
        text.stdout
    )
    assert f"level {rw_at} ({rw.split('?')[0]}): removed 2 entries" in text.stdout
    assert lines[-1].startswith("removed 2 entries")
    kept = shown_size(tmp_path, ro)
    assert lines[-1].endswith(f"2 entries ({kept}) kept in read-only level {ro_at}")


def test_prune_counts_what_the_read_only_level_keeps(tmp_path, tier):
    url, ro, ro_at, rw, rw_at = tier
    entries = _ids(tmp_path, ro)
    result = run(tmp_path, "cache", "prune", "--older-than", "1ms", "--json", "--cache", url)
    assert result.returncode == 0, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert (report["remaining"], report["not_removed"]) == (2, 0)  # the ?ro level's
    assert {e["id"] for e in report["removed"]} == entries
    assert {e["level"] for e in report["removed"]} == {rw_at}
    levels = report["levels"]
    assert (levels[rw_at]["removed"], levels[rw_at]["remaining"]) == (2, 0)
    assert (levels[ro_at]["removed"], levels[ro_at]["remaining"]) == (0, 2)
    assert report["remaining_bytes"] == levels[ro_at]["remaining_bytes"] > 0
    assert _ids(tmp_path, rw) == set()
    assert _ids(tmp_path, url) == entries  # what the tier still serves: "2 remain"

    _refill(tmp_path, url)
    went, kept = shown_size(tmp_path, rw), shown_size(tmp_path, ro)
    text = run(tmp_path, "cache", "prune", "--older-than", "1ms", "--cache", url)
    assert text.returncode == 0, text.stderr
    assert f"level {ro_at} ({ro.split('?')[0]}): read-only (?ro), not pruned: 2 entries" in (
        text.stdout
    )
    assert text.stdout.splitlines()[-1] == (
        f"removed 2 entries ({went}); 2 entries ({kept}) remain, "
        f"2 of them ({kept}) in read-only level {ro_at}"
    )


@pytest.mark.parametrize("command", ["clear", "prune"])
def test_a_tier_with_no_writable_level_is_a_usage_error_for_both(tmp_path, tier, command):
    """Nothing could be removed: both commands say so the same way, touching nothing."""
    _, ro, _, rw, _ = tier
    entries = _ids(tmp_path, ro)
    every_ro = f"{ro}{'&' if '?' in ro else '?'}ro,{rw}{'&' if '?' in rw else '?'}ro"
    extra = ["--yes"] if command == "clear" else ["--older-than", "1ms"]
    result = run(tmp_path, "cache", command, *extra, "--cache", every_ro)
    line = one_line_error(result, f"cuforge cache {command}")
    assert f"will not {command} " in line and "every level of it is read-only (?ro)" in line
    assert _ids(tmp_path, ro) == _ids(tmp_path, rw) == entries


def test_verify_fix_never_removes_the_good_copy_behind_a_bad_read_only_one(tmp_path):
    """A damaged entry in the ``?ro`` level: it stays (and is said to), and the intact
    copy in the writable level is not removed in its place."""
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    _fill(tmp_path, f"file://{ro},file://{rw}")
    victim = sorted(_ids(tmp_path, str(ro)))[0]
    payload = ro / "entries" / victim[:2] / victim[2:]
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x40
    payload.write_bytes(bytes(data))
    url = f"file://{ro}?ro,file://{rw}"
    result = run(tmp_path, "cache", "verify", "--fix", "--cache", url)
    assert result.returncode == 1, result.stderr  # a bad entry was found
    assert victim in _ids(tmp_path, str(rw))  # the good copy is still there
    assert f"level 0: {victim[:12]}" in result.stdout
    assert "(read-only level: kept)" in result.stdout
    assert "checked 4 entries: 1 bad, 0 removed, 1 kept in read-only level 0" in result.stdout
    assert payload.read_bytes() == bytes(data)  # ?ro was not written
    report = json.loads(run(tmp_path, "cache", "verify", "--fix", "--json", "--cache", url).stdout)
    assert report["removed"] == 0
    assert report["bad"] == [
        {"id": victim, "kind": "program", "problem": report["bad"][0]["problem"], "level": 0,
         "removed": False}
    ]  # fmt: skip
