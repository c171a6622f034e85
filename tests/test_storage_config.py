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
    """A clean cache environment: no CUFORGE_* variables, user cache dir under tmp, no
    settings file (working directory and user config under tmp), nothing chosen yet."""
    from cuforge.storage import config

    for name in ("CUFORGE_CACHE", "CUFORGE_CACHE_SECRET", "CUFORGE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(config, "_current", None)
    monkeypatch.setattr(config, "_selections", {}, raising=False)
    yield monkeypatch
    if config._current is not None and config._current[1] is not None:
        config._current[1].close()  # the test's default cache: closed, not left to teardown


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

    # $CUFORGE_CACHE_DIR, the older spelling, ranks below $CUFORGE_CACHE -- for the CLI
    # as for the API (docs/cache.md, "Which cache") -- and names the cache alone. It
    # must name an existing cache: cache commands never create one.
    FileStreamProgramCache(tmp_path / "dir").close()
    both = {**env, "CUFORGE_CACHE_DIR": str(tmp_path / "dir")}
    out = _run("-m", "cuforge", "cache", "stats", "--json", env=both)
    assert json.loads(out.stdout)["path"] == env["CUFORGE_CACHE"]
    del both["CUFORGE_CACHE"]
    out = _run("-m", "cuforge", "cache", "stats", "--json", env=both)
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


# -- one selection for the API, the CLI and the integrations (issue 33; issue 36, items 3, 7)
SECRET = "a-team-secret-of-at-least-32-bytes!!"


def _path(cache) -> str:
    """The directory of a (signed) file cache."""
    return os.path.realpath(getattr(cache, "inner", cache).path)


def test_cuforge_cache_dir_chooses_the_api_cache_below_cuforge_cache(env, tmp_path) -> None:
    # cache=True ignored $CUFORGE_CACHE_DIR, which the README exported.
    env.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "dir"))
    assert _path(default_cache()) == str(tmp_path / "dir")
    env.setenv("CUFORGE_CACHE", str(tmp_path / "url"))  # the newer spelling wins
    assert _path(default_cache()) == str(tmp_path / "url")
    env.delenv("CUFORGE_CACHE")
    env.setenv("CUFORGE_CACHE_DIR", "rel")  # relative: to the working directory
    assert _path(default_cache()) == str(tmp_path / "work" / "rel")


def test_settings_files_choose_the_api_cache_its_cap_and_its_secret(env, tmp_path) -> None:
    # cache=True ignored cuforge.toml and the user's config.toml.
    user = tmp_path / "config" / "cuforge"
    user.mkdir(parents=True)
    (user / "config.toml").write_text('cache = "user-cache"\nmax_size = "1M"\n')
    assert _path(default_cache()) == str(user / "user-cache")
    assert default_cache().max_size_bytes == 1 << 20
    project = tmp_path / "work"
    (user / "secret").write_text(SECRET)
    (project / "cuforge.toml").write_text('cache = "c"\nsecret_file = "../config/cuforge/secret"\n')
    env.setattr("cuforge.storage.config._current", None)  # the API chooses once per process
    cache = default_cache()
    assert isinstance(cache, SignedProgramCache) and _path(cache) == str(project / "c")
    assert cache.max_size_bytes == 1 << 20  # the user's cap, where the project sets none
    compile_twice()
    assert cache.stats().hits == 1 and len(list(cache.iter_entries())) == 1


def test_the_api_reads_the_settings_files_when_it_chooses(env, tmp_path) -> None:
    """Once per process and state of the three variables: an edit is seen after one
    of them changes (or in a new process), never in the middle of a run."""
    settings = tmp_path / "work" / "cuforge.toml"
    settings.write_text('cache = "one"\n')
    first = default_cache()
    settings.write_text('cache = "two"\n')
    assert default_cache() is first  # the hit path reads no file
    env.setenv("CUFORGE_CACHE_DIR", "")  # a change, even to empty (= unset)
    assert _path(default_cache()) == str(tmp_path / "work" / "two")


@pytest.mark.parametrize(
    ("variable", "settings"),
    [
        ("CUFORGE_CACHE", ""),
        ("CUFORGE_CACHE_DIR", ""),
        (None, 'cache = "off"'),
        (None, 'cache = "OFF"'),
    ],
)
def test_off_is_no_cache_at_every_level(env, tmp_path, compiles, variable, settings) -> None:
    (tmp_path / "work" / "cuforge.toml").write_text(settings)
    if variable:
        env.setenv(variable, "off")
    assert default_cache() is None
    compile_twice()
    assert compiles[0] == 2
    assert not (tmp_path / "work" / "off").exists()
    assert not (tmp_path / "xdg").exists()


def test_a_directory_named_off_is_dot_slash_off(env, tmp_path) -> None:
    env.setenv("CUFORGE_CACHE_DIR", "./off")
    assert _path(default_cache()) == str(tmp_path / "work" / "off")


def test_a_bad_settings_file_is_a_valueerror_naming_it(env, tmp_path) -> None:
    toml = tmp_path / "work" / "cuforge.toml"
    for text, said in (
        ('max_size = "2Q"\n', f"max_size in project config {toml}: "),
        ('secret_file = "nope"\n', f"secret_file {tmp_path / 'work' / 'nope'} (project config"),
        ('colour = "blue"\n', f"{toml}: unknown key 'colour'"),
        ('cache = "xyz://a"\n', f"cache in project config {toml}: cache URL 'xyz://a'"),
    ):
        toml.write_text(text)
        env.setattr("cuforge.storage.config._selections", {})
        with pytest.raises(ValueError) as err:
            Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=True)
        assert said in str(err.value)


def test_the_api_and_the_cli_choose_the_same_cache(env, tmp_path) -> None:
    """For each level of the precedence, ``default_cache()`` and ``cuforge cache dir``
    name the same directory (the CLI chose differently from the API before)."""
    work = tmp_path / "work"
    user = tmp_path / "config" / "cuforge"
    user.mkdir(parents=True)
    cases = [
        ({}, "", ""),
        ({}, "", 'cache = "u"'),
        ({}, 'cache = "p"', 'cache = "u"'),
        ({"CUFORGE_CACHE_DIR": "d"}, 'cache = "p"', ""),
        ({"CUFORGE_CACHE_DIR": "d", "CUFORGE_CACHE": "c"}, 'cache = "p"', ""),
        ({"CUFORGE_CACHE": "~/home-relative"}, "", ""),
    ]
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    for variables, project, mine in cases:
        (work / "cuforge.toml").write_text(project)
        (user / "config.toml").write_text(mine)
        for name in ("CUFORGE_CACHE", "CUFORGE_CACHE_DIR"):
            env.delenv(name, raising=False)
        for name, value in variables.items():
            env.setenv(name, value)
        env.setattr("cuforge.storage.config._current", None)
        api = _path(default_cache())
        out = _run("-m", "cuforge", "cache", "dir", env={**base, **variables}).stdout.strip()
        assert os.path.realpath(out) == api, (variables, project, mine)


def test_the_environment_is_read_as_os_environ_get_reads_it(env, monkeypatch) -> None:
    """default_cache's fast look at the three variables answers as os.environ.get."""
    from cuforge.storage import config

    def slow() -> tuple:
        return tuple(os.environ.get(n) for n in ("CUFORGE_CACHE", "CUFORGE_CACHE_DIR",
                                                 "CUFORGE_CACHE_SECRET"))  # fmt: skip

    seen = {config._environment()}
    for name, value in (("CUFORGE_CACHE", "a"), ("CUFORGE_CACHE_DIR", "b"),
                        ("CUFORGE_CACHE_SECRET", "s" * 16), ("CUFORGE_CACHE", "")):  # fmt: skip
        env.setenv(name, value)
        now = config._environment()
        assert now not in seen and [v if v is None else os.fsdecode(v) for v in now] == list(slow())
        seen.add(now)
    os.environ.pop("CUFORGE_CACHE_DIR")
    assert os.fsdecode(config._environment()[0]) == "" and config._environment()[1] is None
    # A replaced os.environ (some test harnesses do) is read through get().
    monkeypatch.setattr(os, "environ", {"CUFORGE_CACHE": "z"})
    assert config._environment() == ("z", None, None)
