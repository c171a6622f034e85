"""A command's worker processes use an S3 cache as the command itself would.

``cuforge compile`` of several files and ``cuforge warm --jobs N`` compile in forked
worker processes. obstore's I/O runtime does not survive a fork, and the S3 level
took its parent's *opening* of the cache for a use: every worker warned "the S3
client does not work in a process forked after it was used" and looked up and
stored nothing. Each test runs the installed ``cuforge`` console script on a real
SeaweedFS server (and a real redis-server), with real NVRTC compiles, and fails on
the main it was written against.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from _cli import run

pytest.importorskip("obstore")  # the [s3] extra

#: compile runs os.cpu_count() workers: with one CPU it forks none.
several_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2+ CPUs")

FILES = ("k0.cu", "k1.cu", "k2.cu")


def _sources(folder: Path) -> None:
    for i, name in enumerate(FILES):
        (folder / name).write_text(f'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}; }}\n')


def _manifest(folder: Path) -> Path:
    _sources(folder)
    manifest = folder / "m.toml"
    manifest.write_text(
        '[defaults]\narch = "sm_80"\n[[kernel]]\nsources = ["k0.cu", "k1.cu", "k2.cu"]\n'
    )
    return manifest


def _listed(tmp_path: Path, url: str, kind: str = "program") -> list[str]:
    """The names of the entries of ``kind`` that ``cuforge cache ls`` lists in ``url``."""
    done = run(tmp_path, "cache", "ls", "--cache", url, "--kind", kind, "--json")
    assert done.returncode == 0, done.stderr
    return sorted(e["name"] for e in json.loads(done.stdout))


@several_cpus
def test_a_parallel_compile_stores_every_file_in_s3_and_the_next_hits_them(
    tmp_path: Path, s3_url: str
) -> None:
    _sources(tmp_path)
    args = ("compile", *FILES, "--arch", "sm_80", "--cache", s3_url, "--json")
    first = run(tmp_path, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "forked" not in first.stderr, first.stderr
    report = json.loads(first.stdout)
    assert [r["cache"] for r in report] == ["miss"] * 3
    assert all(r["stored"] for r in report), report
    assert _listed(tmp_path, s3_url) == list(FILES)
    again = run(tmp_path, *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert [r["cache"] for r in json.loads(again.stdout)] == ["hit"] * 3
    assert again.stderr == ""


def test_warm_jobs_fills_both_server_levels_of_a_tier(
    tmp_path: Path, s3_url: str, redis_server
) -> None:
    """Three workers on a tier of a Redis and an S3 level: each stores into both (a
    Redis connection is never shared across the fork either)."""
    manifest = _manifest(tmp_path)
    tier = f"{redis_server.url},{s3_url}"
    done = run(tmp_path, "warm", str(manifest), "--jobs", "3", "--cache", tier, "--json")
    assert done.returncode == 0, done.stderr
    assert "forked" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert (report["jobs"], report["compiled"]) == (3, 3)
    for result in report["results"]:
        assert [level["stored"] for level in result["levels"]] == [True, True], result
    assert _listed(tmp_path, s3_url) == list(FILES)
    assert _listed(tmp_path, redis_server.url) == list(FILES)
    again = run(tmp_path, "warm", str(manifest), "--jobs", "3", "--cache", s3_url,
                "--fail-on-miss")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "0 compiled, 3 already cached" in again.stdout


def test_warm_set_then_manifest_workers_store_in_s3_after_the_parent_read_it(
    tmp_path: Path, s3_url: str
) -> None:
    """``warm MANIFEST --set NAME`` reads the set from S3 before its workers start:
    forked then, they could not use S3, so they start from a fork server instead."""
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    with open_cache(s3_url) as server:
        server[b"planted"] = b"value"
        warmsets.store(server, "job", [b"planted"])
    manifest = _manifest(tmp_path)
    tier = f"file://{tmp_path / 'local'},{s3_url}"
    done = run(tmp_path, "warm", str(manifest), "--set", "job", "--jobs", "3", "--cache", tier,
               "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "forked" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert (report["compiled"], report["warm_set"]["present"]) == (3, 1)
    for result in report["results"]:
        assert [level["stored"] for level in result["levels"]] == [True, True], result
    assert _listed(tmp_path, s3_url) == list(FILES)
