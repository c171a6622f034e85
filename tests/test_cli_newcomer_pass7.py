"""The seventh newcomer pass (issue 36: every message true), part a: each test runs
the installed ``cuforge`` console script in a subprocess, on real caches (real NVRTC
compiles, a real redis-server), and fails on the main it was written against.

- 1. a Redis/S3 warning said later failures are "counted in cuforge cache stats";
  a command's counts are lost when the server is down as it exits.
- 3. an S3 cache with no credentials: "access denied ...; the server answered with
  an error" for an endpoint nothing listens on, and ``not stored: failed``.
- 4. ``cache stats`` on a tier mixed levels without saying which line is whose.
- 5. the cache warning was printed once per worker process, not once per cache.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from _cli import EXAMPLES, SAXPY, no_aws_env, run
from _redis import RedisServer, free_port
from reliability._figures import record


def _no_aws(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment with no AWS credentials anywhere cuforge or the client looks
    (variables, profile files under HOME), as on a laptop without an AWS set-up."""
    env = no_aws_env(tmp_path)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), **extra)
    return env


# -- 1. where a down server's failures are counted: only what holds ---------------------
def _fleet(tmp_path: Path, url: str) -> dict[str, int]:
    stats = run(tmp_path, "cache", "stats", "--cache", url, "--json")
    assert stats.returncode == 0, stats.stderr
    report = json.loads(stats.stdout)
    return {k: report[k] for k in ("misses", "read_failures", "write_failures")}


def test_a_down_server_warning_says_a_command_ending_first_keeps_no_counts(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The warning said later failures "are counted in cuforge cache stats (read
    failures, write failures)"; a command that ends while the server is down sends
    nothing, so after it comes back the fleet's counters have none of them (nor the
    miss). The warning now says the counts are kept only if the server answers again
    before the command ends -- and cache stats agrees."""
    url = redis_server.url
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "a.cubin"))
    assert run(tmp_path, *build, "--cache", url).returncode == 0
    before = _fleet(tmp_path, url)
    assert before == {"misses": 1, "read_failures": 0, "write_failures": 0}, before
    redis_server.pause()
    try:
        relu = str(EXAMPLES / "kernels" / "relu.cu")
        down = run(tmp_path, "compile", relu, "--arch", "sm_90", "-o", str(tmp_path / "b.cubin"),
                   "--cache", url)  # fmt: skip
    finally:
        redis_server.resume()
    assert down.returncode == 0 and "not stored: unreachable" in down.stdout, down.stderr
    (warning,) = [ln for ln in down.stderr.splitlines() if ln.startswith("cuforge: warning:")]
    assert "counted in cuforge cache stats (read failures, write failures)" in warning, warning
    assert "only if the server answers again before this command ends" in warning, warning
    assert "(misses included) are not kept" in warning, warning
    assert "stats()" not in warning and "_failures" not in warning, warning
    assert _fleet(tmp_path, url) == before  # as the warning says: none of them arrived


# -- 3. no credentials is not "the server answered"; a dead endpoint is unreachable ------
def test_s3_without_credentials_says_so_and_a_dead_endpoint_is_unreachable(
    tmp_path: Path,
) -> None:
    """With no credentials the request is never sent: the warning says there are no
    credentials, not that the server answered (nothing listens on the port), and the
    store is ``failed`` (the warning says why); with credentials the same endpoint is
    ``unreachable``, as cli.md documents for a server that is down."""
    url = f"s3://bucket/x?endpoint=http://127.0.0.1:{free_port()}"
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "x.cubin"),
             "--cache", url)  # fmt: skip
    bare = run(tmp_path, *build, env=_no_aws(tmp_path))
    assert bare.returncode == 0, bare.stderr
    assert "not stored: failed" in bare.stdout, bare.stdout
    (warning,) = [line for line in bare.stderr.splitlines() if "warning" in line]
    assert "no AWS credentials" in warning and "AWS_ACCESS_KEY_ID" in warning, warning
    assert "answered" not in warning and "access denied" not in warning, warning
    assert "nothing was sent to the server" in warning, warning
    stats = run(tmp_path, "cache", "stats", "--cache", url, env=_no_aws(tmp_path))
    assert stats.returncode == 1 and "no AWS credentials" in stats.stderr, stats.stderr
    assert "access denied" not in stats.stderr, stats.stderr

    keyed = _no_aws(tmp_path, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s")
    down = run(tmp_path, *build, env=keyed)
    assert down.returncode == 0 and "not stored: unreachable" in down.stdout, down.stdout
    assert "answered" not in down.stderr and "credentials" not in down.stderr, down.stderr


# -- 4. a tier's stats say which level each figure is from ------------------------------
def _lines(text: str) -> dict[str, str]:
    return {line[:20].strip(): line[20:] for line in text.splitlines()}


def test_tier_stats_say_which_level_each_line_describes(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """``entries 1`` and ``newest 0s ago`` came from the file level, ``0 lookups`` and
    ``stores 0`` from the empty ``?ro`` Redis level, and a capped file level read ``no
    cap set``, nothing saying whose figure was whose. Now the union's lines say ``all
    levels``, a ``counters`` line names the level they are from, and each level has
    its own line (entries, size, its cap); ``--json`` has the same (``levels``,
    ``counters_level``)."""
    redis = redis_server.url
    tier = f"memory://,file://{tmp_path}/rot,{redis}?prefix=release:&ro"
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "x.cubin"))
    assert run(tmp_path, *build, "--cache", tier).returncode == 0
    text = run(tmp_path, "cache", "stats", "--cache", tier)
    assert text.returncode == 0, text.stderr
    lines = _lines(text.stdout)
    assert lines["entries"] == "1 (1 program), all levels", text.stdout
    assert lines["newest entry"].endswith(", all levels"), text.stdout
    assert lines["counters"].startswith(f"level 2's ({redis}, read-only)"), text.stdout
    assert lines["hit rate"] == "- (0 hits / 0 lookups)", text.stdout  # the Redis level's
    assert lines["level 0"].startswith("memory:// (InMemoryProgramCache): 0 entries")
    assert lines["level 1"].startswith(f"file://{tmp_path}/rot (FileStreamProgramCache): 1 entry")
    assert lines["level 2"].startswith(f"{redis} (RedisProgramCache, read-only): 0 entries")

    capped = f"file://{tmp_path}/cap?max_size=10M,{redis}"
    assert run(tmp_path, *build, "--cache", capped).returncode == 0
    text = run(tmp_path, "cache", "stats", "--cache", capped)
    lines = _lines(text.stdout)
    assert "no cap set" not in lines["size"], text.stdout
    assert lines["level 0"].endswith(
        "of 10.0 MiB cap; hit rate 0.0 % (0 hits / 1 lookup that reached it)"
    ), text.stdout
    assert lines["counters"].startswith(f"level 1's ({redis})"), text.stdout
    report = json.loads(run(tmp_path, "cache", "stats", "--cache", capped, "--json").stdout)
    assert report["counters_level"] == 1
    assert [(lv["cache"], lv["entries"], lv["max_size_bytes"], lv["read_only"])
            for lv in report["levels"]] == [
        (f"file://{tmp_path}/cap", 1, 10 * 2**20, False), (redis, 1, None, False)
    ]  # fmt: skip


# -- 5. a cache's warning is said once per command, not once per worker process ------------
def _warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("cuforge: warning:")]


def test_a_cache_warning_is_said_once_per_command_across_worker_processes(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """cli.md: a server that cannot be reached is one warning line, once per cache.
    ``warm --jobs 3`` runs three worker processes (``compile`` of three files, one per
    CPU), each with its own handle that warns once: the command says it once."""
    kernels = [EXAMPLES / "kernels" / f"{n}.cu" for n in ("relu", "transpose", "histogram")]
    manifest = tmp_path / "warm.toml"
    listed = ", ".join(f'"{k}"' for k in kernels)
    manifest.write_text(f'[defaults]\narch = "sm_75"\n\n[[kernel]]\nsources = [{listed}]\n')
    redis_server.pause()
    try:
        warm = run(tmp_path, "warm", str(manifest), "--jobs", "3", "--cache", redis_server.url)
        assert warm.returncode == 0, warm.stderr
        said = _warnings(warm)
        assert len(said) == 1 and "Redis cache" in said[0] and "failed" in said[0], warm.stderr
        compiled = run(tmp_path, "compile", *map(str, kernels), "--arch", "sm_75",
                       "--outdir", str(tmp_path / "o"), "--cache", redis_server.url)  # fmt: skip
        assert compiled.returncode == 0, compiled.stderr
        assert len(_warnings(compiled)) == 1, compiled.stderr
    finally:
        redis_server.resume()
    record(
        "use", "cli", "warm --jobs 3 and compile of 3 files (worker processes) through a "
        "Redis server that is stopped", 2,
        "one warning line per command for the cache, whatever the number of workers "
        "(before: one per worker process, the same line 2-3 times)", scale="all",
    )  # fmt: skip
