"""Newcomer pass 18: a Redis user that may not delete -- clear blamed a connection,
prune printed a bare error with no summary; warm summed two causes into one count;
the S3 endpoint message asked for a port the rule does not require. Through the
installed ``cuforge`` console script, a real redis-server with an ACL user."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from _cli import SAXPY, run

RELU = SAXPY.parent / "kernels" / "relu.cu"


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli")
def test_removals_a_server_refuses_are_said_as_refused_with_a_summary(
    redis_server, tmp_path: Path
) -> None:
    port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    made = subprocess.run(["redis-cli", "-p", port, "ACL", "SETUSER", "ro", "on", ">ropw",
                           "~*", "+@read", "-@write"], capture_output=True, text=True)  # fmt: skip
    assert made.stdout.strip() == "OK", made
    writer = redis_server.url + "?prefix=refused:"
    out = tmp_path / "k.cubin"
    stored = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out),
                 "--cache", writer)  # fmt: skip
    assert "compiled and stored" in stored.stdout, stored.stderr
    reader = writer.replace("redis://", "redis://ro:ropw@")
    time.sleep(0.05)
    for command in (("clear", "--yes"), ("prune", "--older-than", "1ms")):
        got = run(tmp_path, "cache", *command, "--cache", reader)
        assert got.returncode == 1, (got.stdout, got.stderr)
        assert got.stdout.startswith("removed 0 entries (0 B)"), got.stdout  # the summary
        (line,) = got.stderr.strip().splitlines()
        head = f"cuforge cache {command[0]}: could not remove 1 of 1 entry of "
        assert line.startswith(head), line
        assert "(NoPermissionError: " in line and "ConnectionError" not in line, line
    listed = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", writer).stdout)
    assert len(listed) == 1  # nothing went


def test_warm_says_how_many_each_cause_left_unstored(tmp_path: Path) -> None:
    # '14 compiled but not stored: evicted again ..., larger than the cache's size cap'
    # -- 12 of one and 2 of the other, said as one count.
    examples = tmp_path / "examples"
    shutil.copytree(SAXPY.parent, examples)
    manifest = examples / "warm.toml"
    got = run(tmp_path, "warm", str(manifest), "--jobs", "1", "--json",
              "--cache", f"file://{tmp_path / 'c'}?max_size=20K")  # fmt: skip
    causes: dict[str, int] = {}
    for r in json.loads(got.stdout)["results"]:
        if r.get("not_stored"):
            causes[r["not_stored"]] = causes.get(r["not_stored"], 0) + 1
    if len(causes) < 2:
        pytest.skip(f"these cubins gave one cause only here: {causes}")
    text = run(tmp_path, "warm", str(manifest), "--jobs", "1",
               "--cache", f"file://{tmp_path / 'd'}?max_size=20K")  # fmt: skip
    line = next(ln for ln in text.stdout.splitlines() if "compiled but not stored" in ln)
    total, _, each = line.partition(" compiled but not stored: ")
    counts = sorted(int(p.split(" ", 1)[0]) for p in each.split("; "))
    assert counts == sorted(causes.values()) and int(total) == sum(counts), (line, causes)


def test_an_s3_endpoint_without_a_port_is_not_said_to_need_one(tmp_path: Path) -> None:
    no_host = run(tmp_path, "cache", "dir", "--cache", "s3://bucket?endpoint=http://")
    assert no_host.returncode == 2 and "a port is optional" in no_host.stderr, no_host.stderr
    assert "host and port" not in no_host.stderr
    no_port = run(tmp_path, "cache", "dir", "--cache", "s3://bucket?endpoint=http://minio.internal")
    assert no_port.returncode == 0, no_port.stderr


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli")
def test_a_hit_whose_counts_the_server_refuses_says_they_are_not_kept(
    redis_server, tmp_path: Path
) -> None:
    # A command that only hit, through a user the server lets read but not count,
    # lost its hit from the fleet's counters without a word (only a failed store warned).
    port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    subprocess.run(["redis-cli", "-p", port, "ACL", "SETUSER", "reader", "on", ">rpw", "~*",
                    "+@read", "-@write"], check=True, capture_output=True)  # fmt: skip
    writer = redis_server.url + "?prefix=counted:"
    out = tmp_path / "k.cubin"
    assert run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out),
               "--cache", writer).returncode == 0  # fmt: skip
    reader = writer.replace("redis://", "redis://reader:rpw@")
    hit = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out), "--cache", reader)
    assert hit.stdout.rstrip().endswith("cache hit"), hit.stdout
    assert "process's counts (hits and misses included) could not be sent to the server" in (
        hit.stderr
    ), hit.stderr
    assert "NOPERM" in hit.stderr and "hincrby" in hit.stderr
