"""Which cache, and is it off, through the real ``cuforge`` console script (issue 36,
items 1, 3 and 6): ``off`` means no cache wherever it is written; ``cuforge doctor``
reports exactly what ``cuforge compile`` would do, with the same line; errors name the
flag, variable or file a value came from; the secret reaches the cache as an
argument, never through the environment."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from _cli import SAXPY, isolated_env, one_line_error, run
from cuforge.storage import FileStreamProgramCache

SECRET = "a-team-secret-of-at-least-32-bytes!!"


def _project(tmp_path: Path, settings: str = "") -> tuple[Path, dict[str, str]]:
    """A project directory holding saxpy.cu and a cuforge.toml (``arch = "sm_90"``
    unless ``settings`` sets one), and the environment of a run (no user file)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    shutil.copy(SAXPY, project / "saxpy.cu")
    if "arch" not in settings:
        settings += '\narch = "sm_90"\n'
    (project / "cuforge.toml").write_text(settings)
    return project, isolated_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "config"))


def _compile(tmp_path: Path, project: Path, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    return run(tmp_path, "compile", "saxpy.cu", "-o", "k.cubin", *args, cwd=project, env=env)


def _doctor(tmp_path: Path, project: Path, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    result = run(tmp_path, "doctor", "--json", *args, cwd=project, env=env)
    return result.returncode, json.loads(result.stdout)


# -- off (item 3) ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "extra", "flag"),
    [
        ("", {}, ["--cache", "off"]),
        ("", {}, ["--cache", "OFF"]),
        ("", {"CUFORGE_CACHE_DIR": "off"}, []),
        ("", {"CUFORGE_CACHE": "off"}, []),
        ('cache = "off"', {}, []),
    ],
    ids=["--cache off", "--cache OFF", "CUFORGE_CACHE_DIR", "CUFORGE_CACHE", "cuforge.toml"],
)
def test_off_means_no_cache_wherever_it_is_written(
    tmp_path: Path, settings: str, extra: dict[str, str], flag: list[str]
) -> None:
    # `--cache off` and CUFORGE_CACHE_DIR=off created ./off and said "compiled and stored".
    project, env = _project(tmp_path, settings)
    env.update(extra)
    built = _compile(tmp_path, project, env, *flag)
    assert built.returncode == 0, built.stderr
    assert ", cache" not in built.stdout and "stored" not in built.stdout, built.stdout
    assert not (project / "off").exists() and not (project / "OFF").exists()
    assert not (tmp_path / "xdg" / "cuforge").exists()  # nor the default cache
    stats = run(tmp_path, "cache", "stats", *flag, cwd=project, env=env)
    assert "caching is off" in one_line_error(stats, "cuforge cache stats")
    code, report = _doctor(tmp_path, project, env, *flag)
    assert (code, report["cache"], report["problems"]) == (0, "off", [])


def test_a_directory_named_off_is_written_dot_slash_off(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    for flag in (["--cache", "./off"], ["--cache", str(project / "off")]):
        built = _compile(tmp_path, project, env, *flag)
        assert "cache" in built.stdout and built.returncode == 0, built.stderr
    assert (project / "off" / "entries").is_dir()
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", "./off",
                           cwd=project, env=env).stdout)  # fmt: skip
    assert (stats["path"], stats["entries"]) == (str(project / "off"), 1)


# -- doctor says what compile would do (item 1) --------------------------------------------
def _unusable(kind: str, tmp_path: Path) -> tuple[str, dict[str, str], str]:
    """(settings file, environment, what the error says) of a cache compile refuses."""
    plain = tmp_path / "plain-file"
    plain.write_text("not a cache")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return {
        "a regular file": ("", {"CUFORGE_CACHE": str(plain)}, "exists and is not a directory"),
        "below a regular file": ("", {"CUFORGE_CACHE": f"{plain}/c"}, "a parent of it is a file"),
        "/proc/nope": ("", {"CUFORGE_CACHE": "/proc/nope"}, "cannot be created"),
        "a 0777 directory": ("", {"CUFORGE_CACHE": str(shared)}, "writable by every user"),
        "arch sm90": ('arch = "sm90"', {}, "must look like 'sm_90'"),
        "max_size 2Q": ('max_size = "2Q"', {}, "max_size in project config"),
        "secret_file missing": ('secret_file = "nope"', {}, "secret_file"),
        "a bad cache URL": ('cache = "c?max_size=12 eggs"', {}, "not a size"),
    }[kind]


@pytest.mark.parametrize(
    "kind",
    [
        "a regular file",
        "below a regular file",
        "/proc/nope",
        "a 0777 directory",
        "arch sm90",
        "max_size 2Q",
        "secret_file missing",
        "a bad cache URL",
    ],
)
def test_doctor_lists_the_line_compile_refuses_with(tmp_path: Path, kind: str) -> None:
    # doctor said "exists: not yet", "writable yes" or nothing, and exited 0, where
    # compile exited 2.
    settings, extra, why = _unusable(kind, tmp_path)
    project, env = _project(tmp_path, settings)
    env.update(extra)
    refused = one_line_error(_compile(tmp_path, project, env), "cuforge compile")
    said = refused.removeprefix("cuforge compile: error: ")
    assert why in said
    code, report = _doctor(tmp_path, project, env)
    assert code == 1 and len(report["problems"]) == 1, report["problems"]
    assert report["problems"][0].endswith(said), (report["problems"], said)
    text = run(tmp_path, "doctor", cwd=project, env=env).stdout
    assert f"problem           {report['problems'][0]}" in text.splitlines()
    if "problem" in report:  # the cache itself cannot be used: no writable line
        assert not any(ln.startswith("writable") for ln in text.splitlines())


def test_doctor_names_the_settings_file_and_the_flag(tmp_path: Path) -> None:
    # An arch that does not look like one makes the file unusable, as a wrong type
    # does (newcomer pass 21b): its other keys are not read, so each bad value is
    # asked of a file of its own.
    project, env = _project(tmp_path, 'arch = "sm90"\n')
    _, report = _doctor(tmp_path, project, env)
    toml = project / "cuforge.toml"
    assert any(str(toml) in p and "must look like" in p for p in report["problems"])
    (project / "cuforge.toml").write_text('max_size = "2Q"\n')
    _, report = _doctor(tmp_path, project, env)
    assert any(f"max_size in project config {toml}" in p for p in report["problems"])


@pytest.mark.parametrize("with_cache", [False, True], ids=["empty", "a cache"])
def test_doctor_says_writable_exactly_when_compile_stores(tmp_path: Path, with_cache: bool) -> None:
    # As root, a 0500 directory showed "writable no" yet compile stored there.
    if not with_cache and os.geteuid() != 0:
        pytest.skip("an empty directory this user cannot write: compile refuses to mark it")
    project, env = _project(tmp_path)
    folder = tmp_path / "r-x"
    if with_cache:
        FileStreamProgramCache(folder).close()
    else:
        folder.mkdir()
    folder.chmod(0o500)
    env["CUFORGE_CACHE"] = str(folder)
    try:
        code, report = _doctor(tmp_path, project, env)
        built = _compile(tmp_path, project, env)
    finally:
        folder.chmod(0o700)
    assert built.returncode == 0 and code == 0, (built.stderr, report["problems"])
    stored = "compiled and stored" in built.stdout
    assert report["writable"] is stored, (report, built.stdout)
    assert stored is (os.geteuid() == 0 or os.access(folder, os.W_OK))


def test_doctor_creates_nothing_for_a_cache_not_made_yet(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    place = tmp_path / "place"
    place.mkdir()
    env["CUFORGE_CACHE"] = str(place / "new" / "cache")
    code, report = _doctor(tmp_path, project, env)
    assert code == 0 and report["problems"] == []
    assert (report["exists"], report["writable"]) == (False, True)
    assert list(place.iterdir()) == []  # the probe is gone too


def test_doctor_papercuts(tmp_path: Path) -> None:
    # "(from not set)", a relative cache shown as .../project/./sc, and no "exists"
    # line for a cache that exists.
    project, env = _project(tmp_path, 'cache = "./sc"')
    FileStreamProgramCache(project / "sc").close()
    text = run(tmp_path, "doctor", cwd=project, env=env).stdout
    lines = text.splitlines()
    assert (
        f"cache             {project / 'sc'}  (from project config {project / 'cuforge.toml'})"
        in lines
    )
    assert "exists            yes" in lines and "writable          yes" in lines
    assert "max size          -  (not set)" in lines
    assert "from not set" not in text and "/./" not in text


def test_cache_stats_on_a_fresh_machine_is_an_empty_cache(tmp_path: Path) -> None:
    # It exited 2, printing the default directory twice.
    result = run(tmp_path, "cache", "stats")
    default = str(tmp_path / "xdg" / "cuforge" / "program-cache")
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).count(default) == 1
    assert "not created yet" in result.stdout.splitlines()[0]
    assert json.loads(run(tmp_path, "cache", "stats", "--json").stdout)["entries"] == 0
    assert json.loads(run(tmp_path, "cache", "ls", "--json").stdout) == []
    assert not (tmp_path / "xdg").exists()  # looking created nothing
    named = run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "typo"))
    line = one_line_error(named, "cuforge cache stats")  # a cache the user named: a mistake
    assert line.count(str(tmp_path / "typo")) == 1 and "there is no cache at" in line


# -- errors name where the value came from (item 6) ----------------------------------------
def test_errors_name_the_flag_or_file_not_the_python_field(tmp_path: Path) -> None:
    project, env = _project(tmp_path, 'arch = "sm90"')
    line = one_line_error(_compile(tmp_path, project, env), "cuforge compile")
    assert f"arch in project config {project / 'cuforge.toml'} must look like" in line
    assert "ProgramOptions" not in line
    # The URL in a message is the one the user typed, never one with --max-size added.
    project, env = _project(tmp_path)
    capped = _compile(
        tmp_path, project, env, "--max-size", "1M", "--cache", "redis://127.0.0.1:1/0"
    )
    line = one_line_error(capped, "cuforge compile")
    assert line.startswith("cuforge compile: error: --max-size: redis:// caches take no size cap")
    assert "1048576" not in line
    twice = _compile(tmp_path, project, env, "--max-size", "1M", "--cache",
                     f"file://{tmp_path}/d?max_size=2M")  # fmt: skip
    line = one_line_error(twice, "cuforge compile")
    assert "--max-size: --cache sets max_size=2M already" in line and "1048576" not in line
    env["CUFORGE_CACHE"] = "nosuch://x"
    line = one_line_error(_compile(tmp_path, project, env), "cuforge compile")
    assert line.startswith("cuforge compile: error: $CUFORGE_CACHE: cache URL 'nosuch://x'")


# -- the secret --------------------------------------------------------------------------
def test_the_secret_reaches_the_cache_as_an_argument(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A settings file's secret_file was put in os.environ for the command (and its
    worker processes); it is now passed to the cache."""
    project, env = _project(tmp_path, 'cache = "c"\nsecret_file = "secret"')
    (project / "secret").write_text(SECRET + "\n")
    FileStreamProgramCache(project / "c").close()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)
    monkeypatch.chdir(project)
    from cuforge.cli import main
    from cuforge.storage import urls

    seen = []
    real = urls.open_cache

    def spy(url, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((os.environ.get("CUFORGE_CACHE_SECRET"), kwargs.get("secret")))
        return real(url, **kwargs)

    monkeypatch.setattr(urls, "open_cache", spy)
    assert main(["cache", "stats", "--json"]) == 0
    assert seen == [(None, SECRET.encode())]
    assert "CUFORGE_CACHE_SECRET" not in os.environ


def test_worker_processes_sign_with_the_settings_files_secret(tmp_path: Path) -> None:
    project, env = _project(tmp_path, 'cache = "c"\nsecret_file = "secret"')
    (project / "secret").write_text(SECRET)
    shutil.copy(SAXPY, project / "other.cu")
    built = run(tmp_path, "compile", "saxpy.cu", "other.cu", "--outdir", "out", "--json",
                cwd=project, env=env)  # fmt: skip
    assert [r["stored"] for r in json.loads(built.stdout)] == [True, True], built.stderr
    verified = run(tmp_path, "cache", "verify", cwd=project, env=env)
    assert verified.returncode == 0 and "2 entries: all verify" in verified.stdout
    other = {**env, "CUFORGE_CACHE_SECRET": SECRET[::-1]}  # the variable wins over the file
    wrong = run(tmp_path, "cache", "verify", cwd=project, env=other)
    assert wrong.returncode == 1 and "2 bad" in wrong.stdout, wrong.stdout


def test_a_broken_secret_file_does_not_stop_a_compile_without_a_cache(tmp_path: Path) -> None:
    # The secret was read for every command, cache or not.
    project, env = _project(tmp_path, 'secret_file = "missing"')
    built = _compile(tmp_path, project, env, "--no-cache")
    assert built.returncode == 0, built.stderr
    refused = one_line_error(_compile(tmp_path, project, env), "cuforge compile")
    assert f"secret_file {project / 'missing'}" in refused
