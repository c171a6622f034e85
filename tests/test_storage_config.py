"""CUFORGE_CACHE / CUFORGE_CACHE_SECRET: the default cache of compile(cache=True) and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from _cache_workers import ARCH, SRC
from cuforge.compile import Program, ProgramOptions, _nvrtc
from cuforge.storage import (
    CacheWriteWarning,
    FileStreamProgramCache,
    SignedProgramCache,
    TieredProgramCache,
    default_cache,
)

WORKERS = os.path.join(os.path.dirname(__file__), "_cache_workers.py")


@pytest.fixture
def compiles(monkeypatch):
    real = _nvrtc.compile_cpp
    count = [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_nvrtc, "compile_cpp", counted)
    return count


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A clean cache environment: no CUFORGE_* variables, user cache dir under tmp."""
    for name in ("CUFORGE_CACHE", "CUFORGE_CACHE_SECRET", "CUFORGE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return monkeypatch


def compile_twice() -> bytes:
    first = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=True)
    second = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=True)
    assert first.code == second.code
    return first.code


def test_cache_true_uses_the_url_in_cuforge_cache(env, tmp_path, compiles) -> None:
    env.setenv("CUFORGE_CACHE", f"file://{tmp_path / 'chosen'}")
    compile_twice()
    assert compiles[0] == 1
    cache = default_cache()
    assert cache is default_cache()  # opened once per process
    assert isinstance(cache, FileStreamProgramCache) and cache.path == str(tmp_path / "chosen")
    assert cache.stats().hits == 1 and any((tmp_path / "chosen" / "entries").iterdir())


def test_unset_means_a_filestream_in_the_user_cache_dir(env, tmp_path, compiles) -> None:
    compile_twice()
    assert compiles[0] == 1
    cache = default_cache()
    assert isinstance(cache, FileStreamProgramCache)
    assert cache.path == str(tmp_path / "xdg" / "cuforge" / "program-cache")


def test_off_disables_caching(env, compiles) -> None:
    env.setenv("CUFORGE_CACHE", "off")
    assert default_cache() is None
    compile_twice()
    assert compiles[0] == 2


def test_a_changed_environment_reopens_and_a_secret_signs(env, tmp_path) -> None:
    env.setenv("CUFORGE_CACHE", str(tmp_path / "a"))
    a = default_cache()
    env.setenv("CUFORGE_CACHE_SECRET", "x" * 32)
    signed = default_cache()
    assert signed is not a and isinstance(signed, SignedProgramCache)
    env.setenv("CUFORGE_CACHE", f"memory://,{tmp_path / 'b'}")
    tier = default_cache()
    assert isinstance(tier, TieredProgramCache)
    assert isinstance(tier.levels[1], SignedProgramCache)
    env.delenv("CUFORGE_CACHE")
    assert isinstance(default_cache(), SignedProgramCache)  # the default dir, signed


def test_a_bad_value_is_a_valueerror_naming_the_variable(env) -> None:
    env.setenv("CUFORGE_CACHE", "xyz://somewhere")
    with pytest.raises(ValueError, match=r"\$CUFORGE_CACHE: cache URL .*unknown scheme 'xyz'"):
        Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=True)


def test_a_cache_that_cannot_be_opened_warns_and_compiles(env, tmp_path, compiles) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env.setenv("CUFORGE_CACHE", str(blocker / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_twice()
    assert compiles[0] == 2
    assert [w.category for w in caught] == [CacheWriteWarning]  # once, not per compile


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_cuforge_cache_in_fresh_processes_and_the_cli(redis_server, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env["CUFORGE_CACHE"] = f"memory://,{redis_server.url}?prefix=ci:"
    counter = tmp_path / "compiles"
    for _ in range(2):  # two processes: the second hits what the first stored in Redis
        out = _run(WORKERS, "compile_url", json.dumps({"counter": str(counter)}), env=env)
        assert out.returncode == 0, out.stderr
    assert len(counter.read_text().splitlines()) == 1
    assert redis_server.client().keys("ci:{*}")

    source = tmp_path / "k.cu"
    source.write_text(SRC)
    for outcome in ("cache miss", "cache hit"):
        cli = ["-m", "cuforge", "compile", str(source), "--arch", ARCH, "--cache"]
        out = _run(
            *cli,
            "-o",
            str(tmp_path / "k.cubin"),
            env={**env, "CUFORGE_CACHE": f"{redis_server.url}?prefix=cli:"},
        )
        assert out.returncode == 0 and outcome in out.stdout, out.stderr
    out = _run("-m", "cuforge", "cache", "stats", "--json", env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["path"] == env["CUFORGE_CACHE"] and report["stores"] == 1
    assert report["entries"] == 1

    # $CUFORGE_CACHE_DIR (the CLI's older setting) still wins for the CLI. It must name
    # an existing cache: cache commands never create one.
    FileStreamProgramCache(tmp_path / "dir").close()
    out = _run("-m", "cuforge", "cache", "stats", "--json",
               env={**env, "CUFORGE_CACHE_DIR": str(tmp_path / "dir")})  # fmt: skip
    assert json.loads(out.stdout)["path"] == str(tmp_path / "dir")


def test_cli_errors_are_one_line_with_the_right_status(redis_server, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    out = _run("-m", "cuforge", "cache", "stats", env={**env, "CUFORGE_CACHE": "redis://h:port"})
    assert out.returncode == 2 and "$CUFORGE_CACHE" in out.stderr and "port" in out.stderr
    assert "Traceback" not in out.stderr
    url = f"redis://:sekrit@127.0.0.1:{redis_server.port}/0?timeout=200ms"
    redis_server.kill()
    out = _run("-m", "cuforge", "cache", "stats", "--cache", url, env=env)
    assert out.returncode == 1 and "could not" in out.stderr and "Traceback" not in out.stderr
    out = _run("-m", "cuforge", "cache", "clear", "--cache", "memory://?bogus=1", env=env)
    assert out.returncode == 2 and "unknown parameter 'bogus'" in out.stderr
    out = _run("-m", "cuforge", "cache", "stats", env={**env, "CUFORGE_CACHE": "off"})
    assert out.returncode == 2 and "off" in out.stderr


def test_the_cli_hides_passwords(tmp_path) -> None:
    from cuforge.cli._select import Choice

    def where(url: str) -> str:
        return Choice(url, "--cache").shown()

    assert (
        where("redis://user:sekrit@host:6379/0?prefix=x:")
        == "redis://user:***@host:6379/0?prefix=x:"
    )
    assert "sekrit" not in where("memory://,rediss://:sekrit@h/1")
