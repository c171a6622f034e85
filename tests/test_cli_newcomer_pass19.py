"""Newcomer pass 19: a size line that promised an eviction a cap below every entry
never makes; a Redis or S3 size line that said what bounds the cache without knowing;
prune's guess at why an entry stayed, and verify --fix that said nothing at all.
Through the installed ``cuforge`` console script, real NVRTC compiles."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from _cli import SAXPY, run

_MAYBE = "(a read-only file system, an immutable directory, or another user's files?)"


def _compile(home: Path, cache: str, arch: str = "sm_90", *extra: str) -> str:
    got = run(home, "compile", str(SAXPY), "--arch", arch, "-o", str(home / f"{arch}.cubin"),
              "--cache", cache, *extra)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return got.stdout


def test_a_cap_below_every_entry_is_not_said_to_evict_at_the_next_store(tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    _compile(tmp_path, cache)
    said = _compile(tmp_path, cache, "sm_80", "--max-size", "1K")
    assert said.rstrip().endswith("not stored: larger than the cache's size cap)"), said
    stats = run(tmp_path, "cache", "stats", "--cache", cache)
    line = next(ln for ln in stats.stdout.splitlines() if ln.startswith("size"))
    assert line.endswith(
        " of 1.0 KiB cap (over it: lowered since; a store that fits under it evicts down to it)"
    ), line
    assert "the next store evicts" not in stats.stdout


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
def test_removals_a_directory_refuses_end_with_the_possible_causes(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    _compile(tmp_path, str(cache))
    entry = next(p for p in (cache / "entries").rglob("*") if p.is_file())
    shard = entry.parent
    time.sleep(0.05)
    if subprocess.run(["chattr", "+i", str(shard)], capture_output=True).returncode:
        pytest.skip("this file system keeps no immutable flag")
    try:
        pruned = run(tmp_path, "cache", "prune", "--older-than", "1ms", "--cache", str(cache))
        assert pruned.returncode == 1, (pruned.stdout, pruned.stderr)
        assert pruned.stderr.strip() == (
            f"cuforge cache prune: could not remove 1 of 1 entry of {cache} {_MAYBE}"
        ), pruned.stderr
        subprocess.run(["chattr", "-i", str(shard)], check=True)
        data = bytearray(entry.read_bytes())
        data[len(data) // 2] ^= 0xFF  # a bad entry
        entry.write_bytes(bytes(data))
        subprocess.run(["chattr", "+i", str(shard)], check=True)
        fixed = run(tmp_path, "cache", "verify", "--fix", "--cache", str(cache))
        assert fixed.returncode == 1, (fixed.stdout, fixed.stderr)
        assert "1 bad, 0 removed" in fixed.stdout, fixed.stdout
        assert fixed.stderr.strip() == (
            f"cuforge cache verify: could not remove 1 of the 1 bad entry of {cache} {_MAYBE}"
        ), fixed.stderr
    finally:
        subprocess.run(["chattr", "-i", str(shard)], check=False)


def test_a_number_as_max_size_in_a_settings_file_gets_toml_it_can_paste(tmp_path: Path) -> None:
    # 'max_size = 2048' got "write 2048B for bytes" -- and max_size = 2048B is no TOML.
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / "cuforge.toml").write_text("max_size = 2048\n")
    got = run(tmp_path, "cache", "dir", cwd=project / "sub")
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert 'max_size = 2048 has no unit: write max_size = "2048B" for bytes' in got.stderr
    (project / "cuforge.toml").write_text('max_size = "2048B"\n')  # as the line says
    assert run(tmp_path, "cache", "dir", cwd=project / "sub").returncode == 0
