"""Newcomer pass 17: an SQLite cache on a full disk stopped every compile (hits
included), and ``cuforge doctor`` said ``writable yes`` for a directory cache whose
``entries/`` (or a shard of it) cannot take files, or an SQLite cache on a full
disk. Through the installed ``cuforge`` console script, real NVRTC compiles."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from _cli import SAXPY, run
from _disk import fill, tmpfs
from test_cli_full_disk import _NOT_COUNTED, _WARNING

RELU = SAXPY.parent / "kernels" / "relu.cu"


def _compile(home: Path, source: Path, cache: str, out: Path) -> subprocess.CompletedProcess[str]:
    return run(home, "compile", str(source), "--arch", "sm_90", "-o", str(out), "--cache", cache)


def test_an_sqlite_cache_on_a_full_disk_still_serves_hits_and_compiles(tmp_path: Path) -> None:
    # Its open failed ('disk I/O error' making the WAL index): every compile exited 2,
    # hits included, and stats, ls and doctor failed alike.
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        cache = f"sqlite://{mnt / 'k.db'}"
        first = _compile(tmp_path, SAXPY, cache, tmp_path / "a.cubin")
        assert first.returncode == 0 and "compiled and stored" in first.stdout, first.stderr
        fill(mnt)
        hit = _compile(tmp_path, SAXPY, cache, tmp_path / "b.cubin")
        assert hit.returncode == 0, hit.stderr
        assert hit.stdout.rstrip().endswith("cache hit"), hit.stdout
        assert (tmp_path / "b.cubin").read_bytes() == (tmp_path / "a.cubin").read_bytes()
        miss = _compile(tmp_path, RELU, cache, tmp_path / "c.cubin")
        assert miss.returncode == 0, miss.stderr
        assert miss.stdout.rstrip().endswith("cache miss (compiled; not stored: failed)")
        why = "no space left on its file system"
        said = _WARNING.format(cache=mnt / "k.db", why=why) + _NOT_COUNTED.format(why=why)
        assert said in miss.stderr.replace("\n", " "), miss.stderr
        stats = run(tmp_path, "cache", "stats", "--json", "--cache", cache)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["entries"] >= 1
        doctor = run(tmp_path, "doctor", "--cache", cache)
        line = next(ln for ln in doctor.stdout.splitlines() if ln.startswith("writable"))
        assert line.split(None, 1)[1] == f"no ({why})", doctor.stdout


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
def test_doctor_says_a_directory_cache_whose_entries_cannot_take_files_is_not_writable(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "c"
    assert _compile(tmp_path, SAXPY, str(cache), tmp_path / "a.cubin").returncode == 0
    shard = next(p for p in (cache / "entries").iterdir() if p.is_dir())
    for place, shown in ((cache / "entries", "entries/"), (shard, f"entries/{shard.name}/")):
        if subprocess.run(["chattr", "+i", str(place)], capture_output=True).returncode:
            pytest.skip("this file system keeps no immutable flag")
        try:
            doctor = run(tmp_path, "doctor", "--cache", str(cache))
            line = next(ln for ln in doctor.stdout.splitlines() if ln.startswith("writable"))
            assert line.split(None, 1)[1] == (
                f"no ({shown} cannot take new files (immutable or append-only))"
            ), doctor.stdout
            stored = _compile(tmp_path, RELU, str(cache), tmp_path / "b.cubin")
            if place == shard:  # a kernel in another shard is stored: the line is about one
                continue
            assert "not stored: failed" in stored.stdout, stored.stdout
        finally:
            subprocess.run(["chattr", "-i", str(place)], check=False)
    doctor = run(tmp_path, "doctor", "--cache", str(cache))
    assert "writable          yes" in doctor.stdout, doctor.stdout


def test_a_read_only_cache_says_its_lookups_are_not_counted(tmp_path: Path) -> None:
    # A single ?ro cache showed 'hit rate 0.0 % (0 hits / 1 lookup)' after hits through
    # it: the counters of its writable use, unqualified (a tier's ?ro level said so).
    cache = tmp_path / "ci"
    assert _compile(tmp_path, SAXPY, str(cache), tmp_path / "a.cubin").returncode == 0
    ro = f"file://{cache}?ro"
    for _ in range(2):
        hit = _compile(tmp_path, SAXPY, ro, tmp_path / "b.cubin")
        assert hit.stdout.rstrip().endswith("cache hit"), hit.stdout
    stats = run(tmp_path, "cache", "stats", "--cache", ro)
    line = next(ln for ln in stats.stdout.splitlines() if ln.startswith("hit rate"))
    assert line.split(None, 2)[2] == (
        "not recorded: opened read-only, lookups through it are not counted (its stored "
        "counters, from writable use: 0 hits / 1 lookup)"
    ), stats.stdout
    report = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", ro).stdout)
    assert report["recorded"] is False and (report["hits"], report["misses"]) == (0, 1)
    plain = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", str(cache)).stdout)
    assert "recorded" not in plain


def test_a_fatbin_of_one_part_says_part(tmp_path: Path) -> None:
    got = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
              str(tmp_path / "k.fatbin"), "--cache", str(tmp_path / "c"))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.rstrip().endswith(", packed from 1 part"), got.stdout


def test_stats_of_a_cache_over_a_lowered_cap_says_the_next_store_evicts(tmp_path: Path) -> None:
    # prune with a ?max_size= lower than the cache recorded the cap and evicted nothing
    # (only stores evict): stats showed '343.8 KiB of 100.0 KiB cap' and nothing more.
    cache = tmp_path / "c"
    for i, src in enumerate((SAXPY, RELU)):
        assert _compile(tmp_path, src, str(cache), tmp_path / f"{i}.cubin").returncode == 0
    pruned = run(tmp_path, "cache", "prune", "--older-than", "1000d", "--cache",
                 f"file://{cache}?max_size=5K")  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr
    stats = run(tmp_path, "cache", "stats", "--cache", str(cache))
    line = next(ln for ln in stats.stdout.splitlines() if ln.startswith("size"))
    assert line.endswith(
        " of 5.0 KiB cap (over it: lowered since; a store that fits under it evicts down to it)"
    ), line
    fits = run(tmp_path, "cache", "stats", "--cache", f"file://{cache}?max_size=1M")
    assert "over it" not in fits.stdout, fits.stdout


def test_a_refused_level_behind_memory_is_named(tmp_path: Path) -> None:
    # memory://,file:///unsafe said only 'cache directory ...: is writable by every
    # user', while file:///a,file:///unsafe named 'level 1 (file:///unsafe)'.
    unsafe = tmp_path / "open"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    prefix = tmp_path / "op"  # a cache whose path is a prefix of the refused one's
    assert _compile(tmp_path, SAXPY, str(prefix), tmp_path / "p.cubin").returncode == 0
    for url in (f"memory://,file://{unsafe}", f"file://{prefix},file://{unsafe}"):
        for args in (("cache", "stats"), ("compile", str(SAXPY), "--arch", "sm_90", "-o",
                                           str(tmp_path / "k.cubin"))):  # fmt: skip
            got = run(tmp_path, *args, "--cache", url)
            assert got.returncode == 2, (got.stdout, got.stderr)
            assert f"--cache: level 1 (file://{unsafe}): cache directory {unsafe}" in got.stderr
