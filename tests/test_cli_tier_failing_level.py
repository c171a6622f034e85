"""``cuforge cache clear|prune|verify --fix`` on a tier with a level that fails (a
Redis level that cannot be reached: port 1 on loopback), and ``zero-stats`` on a tier
with a ``?ro`` level, through the real console script. Every level is listed before
anything is removed; a writable level that cannot be listed is reported on its own
line and nothing is removed from any level, with the summary and ``--json`` printed
and exit 1. (Once the local level was emptied and the command said only ``error:
Redis cache ...: could not list entries``, with no ``--json`` at all.)"""

from __future__ import annotations

import json

from _cli import SAXPY, run, shown_size

DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1: a level that cannot be reached


def _fill(tmp_path, tier):
    """Compile saxpy for two arches through ``tier``; its reachable levels hold both."""
    result = run(tmp_path, "-q", "compile", str(SAXPY), "--arch", "sm_90,sm_80",
                 "--outdir", str(tmp_path / "out"), "--cache", tier)  # fmt: skip
    assert result.returncode == 0, result.stderr


def _ids(tmp_path, url):
    result = run(tmp_path, "cache", "ls", "--json", "--cache", url)
    assert result.returncode == 0, result.stderr
    return {e["id"] for e in json.loads(result.stdout)}


def _failed_line(stdout, index):
    line = next(ln for ln in stdout.splitlines() if ln.startswith(f"level {index} ({DOWN}): "))
    assert line.startswith(f"level {index} ({DOWN}): could not list entries (ConnectionError")
    return line


def test_clear_removes_nothing_while_a_level_cannot_be_listed(tmp_path):
    local = f"file://{tmp_path / 'local'}"
    tier = f"{local},{DOWN}"
    _fill(tmp_path, tier)
    entries = _ids(tmp_path, local)
    assert len(entries) == 2

    result = run(tmp_path, "cache", "clear", "--yes", "--json", "--cache", tier)
    assert result.returncode == 1, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert (report["cleared"], report["removed"], report["stopped_by"]) == (False, 0, 1)
    kept, failed = report["levels"]
    assert (kept["removed"], kept["remaining"], kept["not_removed"]) == (0, 2, 0)
    assert "error" not in kept
    assert failed["error"].startswith("could not list entries (ConnectionError")
    assert failed["removed"] is None and failed["remaining"] is None
    assert "level 1 (redis://127.0.0.1:1/0) could not be listed" in result.stderr
    assert "Traceback" not in result.stderr
    assert _ids(tmp_path, local) == entries  # nothing was removed anywhere

    text = run(tmp_path, "cache", "clear", "--yes", "--cache", tier)
    assert text.returncode == 1, (text.stdout, text.stderr)
    assert _failed_line(text.stdout, 1).endswith(": nothing removed there")
    assert f"level 0 ({local}): not cleared, as level 1 could not be listed: 2 entries" in (
        text.stdout
    )
    assert text.stdout.splitlines()[-1] == f"removed 0 entries (0 B) from {tier}"
    assert _ids(tmp_path, local) == entries


def test_a_real_redis_level_is_not_cleared_either_while_another_cannot_be_listed(
    tmp_path, redis_server
):
    local, redis = f"file://{tmp_path / 'local'}", f"{redis_server.url}?prefix=fl:"
    _fill(tmp_path, f"{local},{redis},{DOWN}")
    entries = _ids(tmp_path, redis)
    assert len(entries) == 2 and _ids(tmp_path, local) == entries

    result = run(tmp_path, "cache", "clear", "--yes", "--json", "--cache",
                 f"{local},{redis},{DOWN}")  # fmt: skip
    assert result.returncode == 1, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert [lv.get("error") is not None for lv in report["levels"]] == [False, False, True]
    assert [lv["remaining"] for lv in report["levels"]] == [2, 2, None]
    assert _ids(tmp_path, local) == _ids(tmp_path, redis) == entries

    # A read-only level that cannot be listed stops nothing: nothing goes from it anyway.
    result = run(tmp_path, "cache", "clear", "--yes", "--cache", f"{local},{redis},{DOWN}?ro")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert _failed_line(result.stdout, 2).endswith(": read-only (?ro), not cleared")
    assert f"level 1 ({redis_server.url}): removed 2 entries" in result.stdout
    assert _ids(tmp_path, local) == _ids(tmp_path, redis) == set()


def test_prune_removes_nothing_while_a_level_cannot_be_listed(tmp_path):
    local = f"file://{tmp_path / 'local'}"
    tier = f"{local},{DOWN}"
    _fill(tmp_path, tier)
    entries = _ids(tmp_path, local)

    result = run(tmp_path, "cache", "prune", "--older-than", "1ms", "--json", "--cache", tier)
    assert result.returncode == 1, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert (report["removed"], report["remaining"], report["stopped_by"]) == ([], 2, 1)
    assert report["levels"][1]["error"].startswith("could not list entries (ConnectionError")
    assert report["levels"][0]["remaining"] == 2
    assert _ids(tmp_path, local) == entries

    held = shown_size(tmp_path, local)
    text = run(tmp_path, "cache", "prune", "--older-than", "1ms", "--cache", tier)
    assert text.returncode == 1, (text.stdout, text.stderr)
    assert _failed_line(text.stdout, 1).endswith(": nothing removed there")
    assert text.stdout.splitlines()[-1] == (
        f"removed 0 entries (0 B); 2 entries ({held}) remain; "
        "not counted: what level 1 holds (it could not be listed)"
    )
    assert "could not be listed, so nothing was removed from any level" in text.stderr
    assert _ids(tmp_path, local) == entries


def test_verify_fix_reports_the_failed_level_and_removes_nothing(tmp_path):
    root = tmp_path / "local"
    local = f"file://{root}"
    tier = f"{local},{DOWN}"
    _fill(tmp_path, tier)
    victim = sorted(_ids(tmp_path, local))[0]
    payload = root / "entries" / victim[:2] / victim[2:]
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x40
    payload.write_bytes(bytes(data))

    result = run(tmp_path, "cache", "verify", "--fix", "--cache", tier)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert _failed_line(result.stdout, 1).endswith(": nothing removed there")
    assert f"level 0: {victim[:12]}" in result.stdout
    assert "(not removed: level 1 could not be listed)" in result.stdout
    assert payload.read_bytes() == bytes(data)  # listed, not removed

    report = json.loads(run(tmp_path, "cache", "verify", "--fix", "--json", "--cache", tier).stdout)
    assert report["removed"] == 0 and report["checked"] == 2
    assert [b["id"] for b in report["bad"]] == [victim]
    assert report["levels"][0]["checked"] == 2 and "error" not in report["levels"][0]
    assert report["levels"][1]["error"].startswith("could not list entries (ConnectionError")

    plain = run(tmp_path, "cache", "verify", "--cache", tier)  # no --fix: the rest is checked
    assert plain.returncode == 1
    assert _failed_line(plain.stdout, 1).endswith(": not checked")
    assert plain.stdout.splitlines()[-1].endswith("; level 1 failed (see above)")


def test_zero_stats_names_the_levels_it_reset_and_the_read_only_ones_it_left(tmp_path):
    a, b = f"file://{tmp_path / 'zA'}", f"file://{tmp_path / 'zB'}"
    _fill(tmp_path, f"{a},{b}")
    result = run(tmp_path, "cache", "zero-stats", "--cache", f"{a}?ro,{b}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"statistics of level 1 ({b}) restart from zero; level 0 ({a}) is read-only "
        "(?ro): counters left as they are"
    )
    report = json.loads(
        run(tmp_path, "cache", "zero-stats", "--json", "--cache", f"{a}?ro,{b}").stdout
    )
    assert report["levels"] == [
        {"cache": a, "read_only": True, "zeroed": False},
        {"cache": b, "read_only": False, "zeroed": True},
    ]
    # the read-only level's counters were indeed left: its stores are still counted
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", a).stdout)
    assert stats["stores"] == 2


def test_zero_stats_on_a_writable_tier_names_every_level(tmp_path):
    # With no ?ro level it printed only "statistics of URL restart from zero", though
    # docs/cli.md says a tiered URL's reset says which levels restarted.
    a, b = f"file://{tmp_path / 'zA'}", f"file://{tmp_path / 'zB'}"
    _fill(tmp_path, f"{a},{b}")
    result = run(tmp_path, "cache", "zero-stats", "--cache", f"memory://,{a},{b}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"statistics of level 0 (memory://), level 1 ({a}), level 2 ({b}) restart from zero"
    )
