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
from cuforge.storage.units import format_size
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


def test_sqlite_stats_show_the_disk_use_the_cap_bounds(tmp_path):
    db = tmp_path / "cache.db"
    url = f"sqlite://{db}?max_size=1M"
    for arch in ("sm_80", "sm_90"):
        made = run(tmp_path, "compile", str(SAXPY), "--arch", arch, "-o",
                   str(tmp_path / f"{arch}.cubin"), "--cache", url)  # fmt: skip
        assert made.returncode == 0, made.stderr
    result = run(tmp_path, "cache", "stats", "--json", "--cache", url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    files = [Path(f"{db}{end}") for end in ("", "-wal", "-shm")]
    on_disk = sum(f.stat().st_size for f in files if f.exists())
    assert report["disk_bytes"] == on_disk > report["size_bytes"] > 0
    assert report["max_size_bytes"] == 1 << 20
    text = run(tmp_path, "cache", "stats", "--cache", url).stdout
    (size,) = [line for line in text.splitlines() if line.startswith("size ")]
    shown = f"{format_size(on_disk)} on disk (entries {format_size(report['size_bytes'])})"
    assert size.split(None, 1)[1] == f"{shown} of 1.0 MiB cap"
    metrics = run(tmp_path, "cache", "stats", "--format", "openmetrics", "--cache", url).stdout
    sample = f'cuforge_cache_disk_bytes{{cache="{url}",backend="SQLiteProgramCache"}} {on_disk}'
    assert sample in metrics.splitlines()
    record(
        "use", "sqlite",
        "cuforge cache stats (text, --json, openmetrics) on a SQLite cache capped at 1 MiB", 3,
        "the size against the cap is the database + WAL + WAL index on disk (what the cap "
        "bounds; disk_bytes), the entries' bytes beside it", scale="all",
    )  # fmt: skip


def test_every_command_that_reports_takes_json(tmp_path, cache):
    """The README promises ``--json`` everywhere; prune, clear, dir and zero-stats
    refused it."""
    from cuforge.cli import build_parser

    parser = build_parser()
    missing = []
    for command, sub in _subparsers(parser):
        actions = list(_subparsers(sub))
        for name, p in actions or [(command, sub)]:
            if "--json" not in p._option_string_actions:
                missing.append(name)
    assert missing == []

    c = ("--cache", str(cache))
    where = run(tmp_path, "cache", "dir", "--json", *c)
    assert json.loads(where.stdout) == {"cache": str(cache), "origin": "--cache"}
    zeroed = run(tmp_path, "cache", "zero-stats", "--json", *c)
    assert json.loads(zeroed.stdout) == {"cache": str(cache), "zeroed": True}
    _age_all(cache, 2 * 86400)
    pruned = json.loads(run(tmp_path, "cache", "prune", "--older-than", "1d", "--json", *c).stdout)
    assert pruned["dry_run"] is False and pruned["remaining"] == 0 and pruned["not_removed"] == 0
    assert sorted(e["reason"] for e in pruned["removed"]) == ["stored before --older-than"] * 2
    assert pruned["removed_bytes"] == sum(e["size"] for e in pruned["removed"]) > 0
    cleared = run(tmp_path, "cache", "clear", "--yes", "--json", *c)
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout) == {
        "cache": str(cache), "cleared": True, "removed": 0, "not_removed": 0
    }  # fmt: skip
    record(
        "inputs", "cli",
        "--json on every command and cache action (prune, clear, dir and zero-stats "
        "refused it)", 4,
        "every parser takes --json; the four print one JSON document each", scale="all",
    )  # fmt: skip


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()
