"""Newcomer pass 14: what ``cuforge cache stats`` says of a tier's hits."""

from __future__ import annotations

import json
from pathlib import Path

from _cli import SAXPY, run


def test_a_tier_shows_each_level_hit_rate_not_only_the_last_levels(tmp_path: Path) -> None:
    # With memory://,file://,redis:// (docs/cache.md's fleet set-up) stats showed only the
    # last level's counters -- "hit rate 0.0 % (0 hits / 1 lookup)" after every repeat
    # compile hit -- because a tier asks a level only when the levels in front missed.
    near, far = f"file://{tmp_path / 'near'}", f"file://{tmp_path / 'far'}"
    tier = f"memory://,{near},{far}"
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"))
    for _ in range(3):
        assert run(tmp_path, *build, "--cache", tier).returncode == 0
    text = run(tmp_path, "cache", "stats", "--cache", tier)
    assert text.returncode == 0, text.stderr
    lines = dict(ln.split(None, 1) if not ln.startswith("level ") else
                 (" ".join(ln.split()[:2]), ln.split(None, 2)[2])
                 for ln in text.stdout.splitlines())  # fmt: skip
    assert lines["counters"].startswith(f"level 2's ({far}), summed over every process"), text
    assert "the lookups that reached it" in lines["counters"], text.stdout
    assert lines["level 1"].endswith("; hit rate 66.7 % (2 hits / 3 lookups that reached it)")
    assert lines["level 2"].endswith("; hit rate 0.0 % (0 hits / 1 lookup that reached it)")
    assert "hit rate" not in lines["level 0"]  # memory:// keeps no shared counters
    report = json.loads(run(tmp_path, "cache", "stats", "--cache", tier, "--json").stdout)
    assert [(lv["hits"], lv["lookups"]) for lv in report["levels"]] == [
        (None, None), (2, 3), (0, 1)
    ]  # fmt: skip


def test_doctor_without_a_device_names_the_arch_the_settings_give(tmp_path: Path) -> None:
    # It said "pass --arch" even where a settings file sets arch (compile needs no flag).
    work = tmp_path / "w"
    work.mkdir()
    (work / "cuforge.toml").write_text('arch = "sm_90"\n')
    got = run(tmp_path, "doctor", cwd=work)
    devices = [ln for ln in got.stdout.splitlines() if ln.startswith("devices ")]
    if not devices:  # a machine with a GPU lists its devices instead
        return
    assert devices[0].endswith(
        f"(compiling and caching work without; arch sm_90 from project config "
        f"{work / 'cuforge.toml'})"
    ), got.stdout
    (work / "cuforge.toml").write_text('arch = "sm90"\n')  # refused: not offered as given
    got = run(tmp_path, "doctor", cwd=work)
    assert "the arch setting is refused: see the problem below" in got.stdout, got.stdout
    (work / "cuforge.toml").unlink()
    got = run(tmp_path, "doctor", cwd=work)
    assert "(compiling and caching work without; pass --arch)" in got.stdout, got.stdout


def test_compile_help_says_which_caches_max_size_caps(tmp_path: Path) -> None:
    # "cap a directory cache", while --max-size caps sqlite:// and memory:// caches too.
    text = " ".join(run(tmp_path, "compile", "--help").stdout.split())
    assert "cap a directory, sqlite:// or memory:// cache (2G)" in text, text
