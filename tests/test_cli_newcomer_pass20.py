"""Newcomer pass 20: ``cache clear`` stopped at the first entry it could not remove
and said that entry's cause for every one it never tried. Through the installed
``cuforge`` console script, real NVRTC compiles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from _cli import SAXPY, run


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
def test_clear_removes_every_entry_it_can_and_counts_only_those_that_stayed(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "c"
    for source in (SAXPY, *sorted(SAXPY.parent.glob("kernels/*.cu"))[:4]):
        got = run(tmp_path, "compile", str(source), "--arch", "sm_90", "-o",
                  str(tmp_path / f"{source.stem}.cubin"), "--cache", str(cache))  # fmt: skip
        assert got.returncode == 0, got.stderr
    listed = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", str(cache)).stdout)
    shards = sorted({e["id"][:2] for e in listed})
    if len(shards) < 2:
        pytest.skip("every entry landed in one shard")
    # the shard the clear meets first (the directory's own order): the others come after
    first = next(d for d in os.listdir(cache / "entries") if d in shards)
    stuck = cache / "entries" / first
    held = sum(1 for e in listed if e["id"][:2] == first)
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode:
        pytest.skip("this file system keeps no immutable flag")
    try:
        cleared = run(tmp_path, "cache", "clear", "--yes", "--cache", str(cache))
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=False)
    assert cleared.returncode == 1, (cleared.stdout, cleared.stderr)
    assert cleared.stdout.startswith(f"removed {len(listed) - held} entr"), cleared.stdout
    assert cleared.stderr.strip() == (
        f"cuforge cache clear: could not remove {held} of {len(listed)} entries of {cache} "
        "(Operation not permitted)"
    ), cleared.stderr
    left = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", str(cache)).stdout)
    assert {e["id"][:2] for e in left} == {first}
