"""Newcomer pass 16: a missing warm set counted as a program-cache miss, ``cache
explain`` writing identity records, and "1 compiles" / "1 entry ... remain"."""

from __future__ import annotations

import os
import re
from pathlib import Path

from _cli import SAXPY, run


def _stats(tmp_path: Path, cache: Path) -> tuple[int, int]:
    """(hits, lookups) of ``cache`` as ``cuforge cache stats`` prints them."""
    got = run(tmp_path, "cache", "stats", "--cache", str(cache))
    assert got.returncode == 0, got.stderr
    found = re.search(r"\((\d+) hits? / (\d+) lookups?\)", got.stdout)
    assert found, got.stdout
    return int(found.group(1)), int(found.group(2))


def test_asking_for_a_missing_warm_set_counts_no_program_lookup(tmp_path: Path) -> None:
    # Each `warm --set NAME` of a set not stored added a miss and a lookup to the hit
    # rate of a cache whose programs were never looked up.
    cache = tmp_path / "c"
    out = str(tmp_path / "k.cubin")
    for _ in range(2):  # a miss, then a hit: 1 hit / 2 lookups
        made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", out,
                   "--cache", str(cache))  # fmt: skip
        assert made.returncode == 0, made.stderr
    assert _stats(tmp_path, cache) == (1, 2)
    asked = run(tmp_path, "warm", "--set", "nosuch", "--cache", str(cache))
    assert asked.returncode == 1 and "no warm set 'nosuch'" in asked.stderr, asked.stderr
    assert _stats(tmp_path, cache) == (1, 2)


def test_cache_explain_writes_no_identity_record(tmp_path: Path) -> None:
    # explain, documented to create nothing, wrote the compiler identity records into
    # the state directory (doctor, which also derives them, writes none).
    cache = tmp_path / "c"
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
               str(tmp_path / "k.cubin"), "--cache", str(cache))  # fmt: skip
    assert made.returncode == 0, made.stderr
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    got = run(fresh, "cache", "explain", str(SAXPY), "--arch", "sm_90", "--cache", str(cache))
    assert got.returncode == 0 and got.stdout.startswith("hit"), (got.stdout, got.stderr)
    made_there = [os.path.join(d, n) for d, dirs, files in os.walk(fresh) for n in dirs + files]
    assert made_there == [], made_there


def test_one_compile_and_one_remaining_entry_are_singular(tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(f'[[kernel]]\nsource = "{SAXPY}"\narch = "sm_90"\n')
    cache = tmp_path / "c"
    got = run(tmp_path, "warm", str(manifest), "--cache", str(cache))
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[-1].startswith("1 compile: 1 compiled, 0 already cached")
    pruned = run(tmp_path, "cache", "prune", "--max-size", "1G", "--cache", str(cache))
    assert pruned.returncode == 0, pruned.stderr
    assert re.search(r"1 entry \([^)]*\) remains$", pruned.stdout.strip()), pruned.stdout
