"""The ninth newcomer pass, its first part (issue 36: every message true): each test
runs the installed ``cuforge`` console script in a subprocess, on real caches with real
NVRTC compiles (and a real redis-server and SeaweedFS), and fails on the main it was
written against.

- 1. a cache server failing under the fast hit path (a hit record left by the run
  before): the warning came as a raw Python warning in the API's words
  (``.../bin/cuforge:6: CacheReadWarning: cuforge Redis cache ...: ... stats()
  (read_failures, write_failures) ...`` and ``  sys.exit(main())``), not the
  ``cuforge: warning:`` line the full path gives.
- 6. ``cuforge --help`` (and a command's ``--help``, ``--version``) on a closed standard
  output exited 0; every command exits 1.
- 3. ``cuforge cache dir`` printed a ``file://`` cache as its URL (``file:///d``, a
  comma as ``%2C``), where ``du "$(cuforge cache dir)"`` needs the directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, run
from _redis import RedisServer


# -- 1. a server failing under the fast hit path: the command line's warning ---------------
@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_server_failing_under_the_fast_path_warns_in_the_command_lines_words(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url.rsplit("/", 1)[0] + "/5"
    else:
        url = request.getfixturevalue("s3_url")
    (tmp_path / "saxpy.cu").write_text(SAXPY.read_text())
    env = isolated_env(tmp_path)
    args = ("compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", url)
    quiet = (*args, "-q")
    first = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert first.returncode == 0 and "cache miss" in first.stdout, first.stderr
    time.sleep(2.1)  # the compiler's identity is recorded once its files are 2 s old
    for command in (args, quiet):  # hits: each leaves a hit record for its command line
        hit = run(tmp_path, *command, cwd=tmp_path, env=env)
        assert hit.returncode == 0 and "cache hit" in hit.stdout, hit.stderr
    records = [p for p in (tmp_path / "state" / "cli-hits").rglob("*") if p.is_file()]
    assert len(records) == 2, records  # so the commands below take the fast path first
    if kind == "redis":
        server.client().config_set("requirepass", "goodpw")
    else:
        env = {**env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    failed = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert failed.returncode == 0, failed.stderr  # a cache fault never fails a compile
    assert "cache miss (compiled" in failed.stdout, failed.stdout
    lines = failed.stderr.splitlines()
    assert len(lines) == 1, failed.stderr
    assert lines[0].startswith("cuforge: warning: "), failed.stderr
    assert "lookup failed" in lines[0], failed.stderr
    assert "counted in cuforge cache stats (read failures, write failures)" in lines[0]
    assert "Warning:" not in failed.stderr and "sys.exit" not in failed.stderr
    assert "stats()" not in failed.stderr and "cuforge: warning: cuforge" not in failed.stderr
    # exactly what the same command says with no hit record (the full path alone)
    alone = run(tmp_path, *args, cwd=tmp_path,
                env={**env, "CUFORGE_STATE_DIR": str(tmp_path / "other-state")})  # fmt: skip
    assert alone.returncode == 0 and alone.stderr == failed.stderr, alone.stderr
    # -q: no warning, on the fast path as on the full path
    hushed = run(tmp_path, *quiet, cwd=tmp_path, env=env)
    assert hushed.returncode == 0 and "cache miss (compiled" in hushed.stdout, hushed.stderr
    assert hushed.stderr == "", hushed.stderr


# -- 6. --help on a closed standard output ---------------------------------------------------
def _to_a_closed_pipe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuforge ARGS | head -c0``, with the reader gone before anything is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(SCRIPT), *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=isolated_env(tmp_path), timeout=240)  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [("--help",), ("-h",), ("compile", "--help"), ("cache", "--help"),
     ("cache", "dir", "--help"), ("run", "--help"), ("doctor", "-h"), ("--version",)],
    ids=" ".join,
)  # fmt: skip
def test_help_on_a_closed_stdout_is_exit_1_with_nothing_on_stderr(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    shown = run(tmp_path, *args)
    assert shown.returncode == 0 and shown.stdout and not shown.stderr, shown.stderr
    closed = _to_a_closed_pipe(tmp_path, *args)
    assert (closed.returncode, closed.stderr) == (1, ""), closed


# -- 3. cache dir: a file:// cache's directory, not its URL -----------------------------------
def test_cache_dir_prints_a_file_url_caches_directory(tmp_path: Path) -> None:
    comma = tmp_path / "new,comer"
    cases = {
        f"file://{tmp_path}/cache?max_size=1G": tmp_path / "cache",
        f"file://{tmp_path}/new%2Ccomer": comma,
        f"file://localhost{tmp_path}/./a/../b/?ro": tmp_path / "b",
        f"{tmp_path}/new%2Ccomer?max_size=1G": comma,  # a plain path decoded the same way
    }
    for value, directory in cases.items():
        env = isolated_env(tmp_path, CUFORGE_CACHE=value)
        shown = run(tmp_path, "cache", "dir", env=env)
        assert (shown.returncode, shown.stdout, shown.stderr) == (0, f"{directory}\n", ""), value
        as_json = json.loads(run(tmp_path, "cache", "dir", "--json", env=env).stdout)
        assert as_json == {"cache": str(directory), "origin": "$CUFORGE_CACHE"}, value
        given = run(tmp_path, "cache", "dir", "--cache", value)
        assert given.stdout == f"{directory}\n", (value, given.stderr)
    # the documented use: the path names the cache a command opens (its cap file)
    url = f"file://{tmp_path}/new%2Ccomer?max_size=1G"
    env = isolated_env(tmp_path, CUFORGE_CACHE=url)
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80", "-o",
                str(tmp_path / "k.cubin"), env=env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    where = Path(run(tmp_path, "cache", "dir", env=env).stdout.rstrip("\n"))
    assert (where / "cap").is_file() and (where / "entries").is_dir(), sorted(comma.iterdir())
    # a tier is still its URL
    tier = f"file://{tmp_path}/c,memory://"
    shown = run(tmp_path, "cache", "dir", "--cache", tier)
    assert shown.stdout == f"{tier}\n", shown.stderr
