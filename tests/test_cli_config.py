"""Settings files (``cuforge.toml``, ``pyproject.toml [tool.cuforge]``, the user's
``config.toml``) through the real console script: which level sets each value (flag >
env > project > user), what doctor says, and that the fast hit path never answers
with a record made under other settings."""

from __future__ import annotations

import json
import shutil

from _cli import SAXPY, isolated_env, one_line_error, run


def _layout(tmp_path):
    """A user settings file, a project with cuforge.toml and a subdirectory to run in."""
    user = tmp_path / "config" / "cuforge"
    user.mkdir(parents=True)
    (user / "config.toml").write_text('cache = "user-cache"\narch = "sm_75"\nmax_size = "1M"\n')
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "cuforge.toml").write_text('arch = ["sm_80", "sm_90"]\n')
    shutil.copy(SAXPY, project / "src" / "saxpy.cu")
    env = isolated_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "config"))
    return user, project, env


def _doctor(tmp_path, cwd, env):
    result = run(tmp_path, "doctor", "--json", cwd=cwd, env=env)
    report = json.loads(result.stdout)
    return result.returncode, report


def test_each_setting_comes_from_the_highest_level_that_sets_it(tmp_path):
    user, project, env = _layout(tmp_path)
    here = project / "src"
    # project sets arch (over the user's); the user sets cache and max_size
    built = run(tmp_path, "compile", "saxpy.cu", "--outdir", "out", "--json", cwd=here, env=env)
    assert built.returncode == 0, built.stderr
    assert [r["arch"] for r in json.loads(built.stdout)] == ["sm_80", "sm_90"]
    where = str(user / "user-cache")  # relative to the file that names it
    assert run(tmp_path, "cache", "dir", cwd=here, env=env).stdout.strip() == where
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", cwd=here, env=env).stdout)
    assert (stats["entries"], stats["max_size_bytes"]) == (2, 1 << 20)
    code, report = _doctor(tmp_path, here, env)
    settings = report["settings"]
    assert code == 0 and report["problems"] == []
    assert settings["cache"] == {"value": where, "from": f"user config {user / 'config.toml'}"}
    assert settings["arch"]["from"] == f"project config {project / 'cuforge.toml'}"
    assert settings["max_size"]["from"].startswith("user config")
    # the environment beats both files, a flag beats the environment
    env_cache = {**env, "CUFORGE_CACHE": str(tmp_path / "env-cache")}
    assert run(tmp_path, "cache", "dir", cwd=here, env=env_cache).stdout.strip() == str(
        tmp_path / "env-cache"
    )
    flagged = run(tmp_path, "cache", "dir", "--cache", str(tmp_path / "flag"), cwd=here,
                  env=env_cache)  # fmt: skip
    assert flagged.stdout.strip() == str(tmp_path / "flag")
    one = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin", "--json",
              cwd=here, env=env)  # fmt: skip
    assert [r["arch"] for r in json.loads(one.stdout)] == ["sm_90"]


def test_pyproject_tool_table_and_cuforge_toml_in_one_directory(tmp_path):
    _, project, env = _layout(tmp_path)
    (project / "cuforge.toml").unlink()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.cuforge]\ncache = "cache"\narch = "sm_90"\n'
    )
    here = project / "src"
    assert run(tmp_path, "cache", "dir", cwd=here, env=env).stdout.strip() == str(project / "cache")
    (project / "cuforge.toml").write_text('cache = "from-cuforge-toml"\n')  # wins there
    assert run(tmp_path, "cache", "dir", cwd=here, env=env).stdout.strip() == str(
        project / "from-cuforge-toml"
    )


def test_secret_file_signs_the_cache(tmp_path):
    user, project, env = _layout(tmp_path)
    (user / "secret").write_text("a-team-secret-of-at-least-32-bytes!!\n")
    with (user / "config.toml").open("a") as f:
        f.write('secret_file = "secret"\n')
    here = project / "src"
    built = run(tmp_path, "compile", "saxpy.cu", "-o", "k.cubin", "--arch", "sm_90", cwd=here,
                env=env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    stats = run(tmp_path, "cache", "stats", cwd=here, env=env).stdout
    assert "SignedProgramCache" in stats.splitlines()[0]
    _, report = _doctor(tmp_path, here, env)
    assert report["settings"]["secret_file"] == {
        "value": str(user / "secret"), "from": f"user config {user / 'config.toml'}"
    }  # fmt: skip
    (user / "secret").unlink()
    missing = run(tmp_path, "cache", "stats", cwd=here, env=env)
    assert f"secret_file {user / 'secret'}" in one_line_error(missing, "cuforge cache stats")


def test_a_bad_settings_file_is_one_line_and_a_doctor_problem(tmp_path):
    _, project, env = _layout(tmp_path)
    (project / "cuforge.toml").write_text('arch = "sm_90"\ncolour = "blue"\n')
    here = project / "src"
    bad = run(tmp_path, "compile", "saxpy.cu", cwd=here, env=env)
    line = one_line_error(bad, "cuforge compile")
    assert str(project / "cuforge.toml") in line and "unknown key 'colour'" in line
    code, report = _doctor(tmp_path, here, env)
    assert code == 1 and any("unknown key 'colour'" in p for p in report["problems"])
    (project / "cuforge.toml").write_text("arch = [\n")
    broken = run(tmp_path, "cache", "dir", cwd=here, env=env)
    assert "is not valid TOML" in one_line_error(broken, "cuforge cache dir")


def test_the_fast_path_never_answers_with_a_record_made_under_other_settings(tmp_path):
    _, project, env = _layout(tmp_path)
    here = project / "src"
    (project / "cuforge.toml").write_text('arch = "sm_90"\n')
    args = ("compile", "saxpy.cu", "-o", "k.cubin", "--json")
    first = json.loads(run(tmp_path, *args, cwd=here, env=env).stdout)
    second = json.loads(run(tmp_path, *args, cwd=here, env=env).stdout)
    assert [r["cache"] for r in first + second] == ["miss", "hit"]
    (project / "cuforge.toml").write_text('arch = "sm_80"\n')  # same size: content differs
    third = run(tmp_path, *args, cwd=here, env=env)
    assert [(r["arch"], r["cache"]) for r in json.loads(third.stdout)] == [("sm_80", "miss")]


def test_a_configured_cap_never_breaks_a_cache_that_takes_none(tmp_path, redis_server):
    """max_size in a settings file applies to directory/SQLite caches; a Redis URL
    from the environment (no max_size parameter) is opened as it is."""
    _, project, env = _layout(tmp_path)  # the user's file sets max_size = "1M"
    here = project / "src"
    env = {**env, "CUFORGE_CACHE": redis_server.url}
    built = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin", cwd=here,
                env=env)  # fmt: skip
    assert built.returncode == 0 and "compiled and stored" in built.stdout, built.stderr
    capped = {**env, "CUFORGE_CACHE": f"file://{tmp_path}/d?max_size=2M"}  # the URL's wins
    again = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "k.cubin", cwd=here,
                env=capped)  # fmt: skip
    assert again.returncode == 0, again.stderr
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", cwd=here, env=capped).stdout)
    assert stats["max_size_bytes"] == 2 << 20
