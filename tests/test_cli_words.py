"""The first hour with the command line: every message true, one meaning for every
word (issue 36). Each test runs the installed ``cuforge`` console script on real
caches filled by real NVRTC compiles.

- Durations and sizes need their unit: ``prune --older-than 30`` removed entries 30
  seconds old and ``--max-size 2`` meant 2 bytes.
- Counts and labels: one signed lookup of an unsigned entry counted two signature
  failures; a SQLite cache's size was shown against its cap as the entries' bytes,
  while the cap bounds the files on disk; a fatbin said ``"cache": "off"`` with the
  cache on; ``--json`` was refused by four commands.
- Papercuts: ``-o -`` made a file named ``-``; ``-o ''`` wrote beside the source; an
  arch typo in ``ls --arch`` listed nothing and exited 0; ``--compiler ""`` was
  "give at least one"; ``1 entries``; ``compile --help`` left out fatbins and
  ``.nvvm``; a ``.ltoir`` input was "not UTF-8 text"; ``cli-hits/`` was 0755.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from _cli import SAXPY, isolated_env, run
from reliability._figures import record

SECRET = "0123456789abcdef0123456789abcdef"
MINUTE = 60


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory cache holding saxpy for sm_80 and sm_90."""
    home = tmp_path_factory.mktemp("words")
    result = run(home, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "--outdir",
                 str(home / "out"), "--cache", str(home / "cache"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return home / "cache"


@pytest.fixture
def cache(filled: Path, tmp_path: Path) -> Path:
    shutil.copytree(filled, tmp_path / "cache")
    return tmp_path / "cache"


def _ids(tmp_path: Path, cache: Path) -> list[str]:
    listed = run(tmp_path, "cache", "ls", "--json", "--cache", str(cache))
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


def _age_all(cache: Path, seconds: float) -> None:
    then = time.time() - seconds
    for shard in (cache / "entries").iterdir():
        for f in shard.iterdir():
            os.utime(f, (then, then))


# -- counts and labels ---------------------------------------------------------------------
def test_one_signed_lookup_of_an_unsigned_entry_counts_one_signature_failure(tmp_path):
    cache = str(tmp_path / "c")
    args = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"))
    assert run(tmp_path, *args, "--cache", cache).returncode == 0  # stored unsigned
    signed = isolated_env(tmp_path, CUFORGE_CACHE_SECRET=SECRET)
    again = run(tmp_path, *args, "--cache", cache, env=signed)
    assert again.returncode == 0 and "cache miss" in again.stdout, again.stderr
    stats = run(tmp_path, "cache", "stats", "--json", "--cache", cache, env=signed)
    report = json.loads(stats.stdout)
    assert (report["signature_failures"], report["misses"], report["hits"]) == (1, 2, 0)
    hit = run(tmp_path, *args, "--cache", cache, env=signed)  # now signed: a plain hit
    assert "cache hit" in hit.stdout, hit.stderr
    report = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", cache,
                            env=signed).stdout)  # fmt: skip
    assert (report["signature_failures"], report["hits"]) == (1, 1)
    record(
        "security", "signed-filestream",
        "cuforge compile through a signed cache over an unsigned entry (a look-again under "
        "the fill's lock), then a hit", 2,
        "cache stats: 1 signature failure, 2 misses, then 1 hit (it counted 2 failures for "
        "the one lookup)", scale="all",
    )  # fmt: skip


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()
