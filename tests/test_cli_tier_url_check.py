"""Every level of a tier URL is checked when the cache is opened, through the real
``cuforge`` console script and ``open_cache``: a typo in a level behind the first
persistent one (a Redis port that is no number, an S3 parameter that does not parse)
is bad input like a typo in the front level -- exit 2 with one line naming the level
URL and its bad part, a ValueError from the API -- not a runtime failure of a lazy
level. What only a connection finds (nothing listening) stays a fail-open warning."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import EXAMPLES, isolated_env, one_line_error, run
from cuforge.storage import open_cache

# (level behind the front one, what its error says about the bad part)
BAD_LEVELS = [
    ("redis://h:p/0/0", "port 'p' is not a number"),
    ("rediss://h:6379/x", "database 'x' is not a number"),
    ("s3://b?timeout=fast", "timeout: not a duration: 'fast'"),
    ("sqlite:///tmp/k.db?timeout=soon", "timeout: not a duration: 'soon'"),
    ("s3://b?region=", "region= has no value"),
]
IDS = ["redis port", "redis database", "s3 timeout", "sqlite timeout", "s3 empty region"]


def _workdir(tmp_path: Path) -> Path:
    """saxpy.cu and a one-kernel warm manifest for it."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLES / "saxpy.cu", work / "saxpy.cu")
    (work / "m.toml").write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsource = "saxpy.cu"\n')
    return work


@pytest.mark.parametrize(("level", "says"), BAD_LEVELS, ids=IDS)
@pytest.mark.parametrize("front", ["file", "memory,file"])
def test_compile_and_warm_refuse_a_bad_level_behind_the_front_one(
    tmp_path: Path, level: str, says: str, front: str
) -> None:
    # Compiled, exited 0 and warned "level 1 (LazyLevel(...)) failed to lock".
    work = _workdir(tmp_path)
    disk = tmp_path / "c"
    url = ("memory://," if front == "memory,file" else "") + f"file://{disk},{level}"
    commands = [
        ("cuforge compile", ["compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin"]),
        ("cuforge warm", ["warm", "m.toml"]),
    ]
    for prog, args in commands:
        result = run(tmp_path, *args, "--cache", url, cwd=work)
        line = one_line_error(result, prog)
        assert f"--cache: cache URL {level!r}: {says}" in line, line
    assert not (work / "k.cubin").exists()
    assert not disk.exists()  # refused before any level opened


def test_the_variable_a_bad_level_came_from_is_named(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    env = isolated_env(tmp_path, CUFORGE_CACHE=f"file://{tmp_path / 'c'},redis://h:p/0/0")
    result = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin",
                 cwd=work, env=env)  # fmt: skip
    line = one_line_error(result, "cuforge compile")
    assert "$CUFORGE_CACHE: cache URL 'redis://h:p/0/0': port 'p' is not a number" in line


@pytest.mark.parametrize(("level", "says"), BAD_LEVELS, ids=IDS)
def test_open_cache_raises_for_a_bad_level_behind_the_front_one(
    tmp_path: Path, level: str, says: str
) -> None:
    disk = tmp_path / "c"
    for url in (f"file://{disk},{level}", f"memory://,file://{disk},{level}"):
        with pytest.raises(ValueError, match=re.escape(f"cache URL {level!r}: {says}")):
            open_cache(url, secret=None).close()
    assert not disk.exists()  # checked before the front level opened


def test_checking_a_level_behind_loads_no_handle_driver_or_client(tmp_path: Path) -> None:
    # The check at open imports each backend's URL module only: a hit served by the
    # front level must not pay for the Redis, S3 and SQLite handles, drivers and clients.
    code = f"""
import sys
from cuforge.storage import open_cache
url = "file://{tmp_path / "ok"},redis://127.0.0.1:1/0,s3://b,sqlite://{tmp_path / "k.db"}"
with open_cache(url, secret=None):
    pass
for url in ("file://{tmp_path / "c"},redis://h:p/0", "file://{tmp_path / "c"},s3://b?timeout=fast"):
    try:
        open_cache(url, secret=None)
    except ValueError as exc:
        print("refused:", exc)
heavy = ("cuforge.storage.redis._cache", "cuforge.storage.s3._cache", "cuforge.storage.remote",
         "cuforge.storage.redis._store", "cuforge.storage.s3._store", "redis", "obstore",
         "cuforge.storage.sqlite._cache", "cuforge.storage.sqlite._driver", "sqlite3")
print("loaded:", sorted(m for m in heavy if m in sys.modules))
print("checked:", sorted(m for m in sys.modules if m.startswith("cuforge.storage.")
                         and m.endswith("._url") and "filestream" not in m))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=isolated_env(tmp_path), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        "refused: cache URL 'redis://h:p/0': port 'p' is not a number",
        "refused: cache URL 's3://b?timeout=fast': timeout: not a duration: 'fast' "
        "(expected e.g. 500ms, 90s, 30m, 12h, 7d)",
        "loaded: []",
        "checked: ['cuforge.storage.redis._url', 'cuforge.storage.s3._url', "
        "'cuforge.storage.sqlite._url']",
    ], done.stdout


def test_a_level_behind_that_cannot_be_reached_still_fails_open(tmp_path: Path) -> None:
    # Only what the URL says is checked: nothing listening on the port is found by
    # connecting, when the level is first reached, and the compile goes on.
    work = _workdir(tmp_path)
    url = f"file://{tmp_path / 'c'},redis://127.0.0.1:1/0"
    result = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin",
                 "--cache", url, cwd=work)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "redis://127.0.0.1:1/0 unreachable: not stored there" in result.stdout, result.stdout
    assert "Connection refused" in result.stderr and (work / "k.cubin").exists()
