"""The third newcomer pass over the README and docs (issue 36): each test runs the
installed ``cuforge`` console script in a subprocess, on real caches filled by real
NVRTC compiles, and fails on the main it was written against.

- ``cache verify`` said ``entries/cd: a file where a cache file belongs`` for a file
  standing where a shard directory belongs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from _cli import SAXPY, run
from reliability._figures import record


def _filled(tmp_path: Path, arch: str = "sm_90") -> Path:
    """A directory cache holding saxpy.cu's cubin for ``arch``."""
    cache = tmp_path / "cache"
    built = run(tmp_path, "compile", str(SAXPY), "--arch", arch, "-o",
                str(tmp_path / f"{arch}.cubin"), "--cache", str(cache))  # fmt: skip
    assert built.returncode == 0, built.stderr
    return cache


def _shard_of(cache: Path) -> Path:
    """The one shard directory of a cache holding one entry."""
    (shard,) = (p for p in (cache / "entries").iterdir() if p.is_dir() and not p.is_symlink())
    return shard


# -- 2. verify names what belongs where ----------------------------------------------------
def test_verify_says_a_shard_directory_belongs_where_a_file_stands(tmp_path: Path) -> None:
    """A file at a shard's name was ``a file where a cache file belongs``; a FIFO at an
    entry file's name is said to stand where an entry file belongs."""
    cache = _filled(tmp_path)
    (cache / "entries" / "cd").write_text("hi\n")
    shard = _shard_of(cache)
    fifo = shard / ("f" * 62)
    os.mkfifo(fifo)
    result = run(tmp_path, "cache", "verify", "--cache", str(cache))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "entries/cd: a file where a shard directory belongs" in lines, result.stdout
    assert f"entries/{shard.name}/{fifo.name}: a FIFO where an entry file belongs" in lines
    assert "cache file" not in result.stdout
    fixed = run(tmp_path, "cache", "verify", "--fix", "--json", "--cache", str(cache))
    report = json.loads(fixed.stdout)
    assert sorted(f["path"] for f in report["foreign"]) == sorted(
        ["entries/cd", f"entries/{shard.name}/{fifo.name}"]
    )
    assert report["removed"] == 2 and not (cache / "entries" / "cd").exists()
    record(
        "use", "cli", "cache verify with a file where a shard directory belongs and a FIFO "
        "where an entry file belongs", 2,
        "'entries/cd: a file where a shard directory belongs', '.../fff...: a FIFO where an "
        "entry file belongs'; --fix removed both (before: 'where a cache file belongs' for "
        "each)", scale="all",
    )  # fmt: skip
