"""Mirror profiles from the settings files, for real: ``cuforge run`` (the real console
script, real child processes) mirrors a directory-cache "JIT" that only a
``[mirror.<name>]`` table in ``cuforge.toml`` or the user's ``config.toml`` describes
-- a fresh job's empty directory holds the first job's file before the job starts --
and a bad table is one line naming the file and the key, exit 2, before any job.
``doctor`` and the Python API (``active_profiles``, ``open_mirrors``: what
``integrations.session`` uses) read the same set. Issue 34: ``cuforge run`` used the
built-in profiles only (a ``[mirror.<name>]`` table was refused as an unknown key).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _cli import SCRIPT, isolated_env, one_line_error, run

#: The fake JIT: it keeps a compiled "kernel" in the directory $FAKEJIT_CACHE_DIR names,
#: reads it back when it is there at start, else "compiles" it (random bytes), writing
#: a temp file and renaming it into place as the JITs the mirror serves do.
JIT = """
import json, os, sys
root = os.environ["FAKEJIT_CACHE_DIR"]
path = os.path.join(root, "kernels", "k0.bin")
found = open(path, "rb").read().hex() if os.path.exists(path) else None
wrote = None
if found is None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = os.urandom(32)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    wrote = data.hex()
if len(sys.argv) > 1:
    open(sys.argv[1], "w").close()
print(json.dumps({"found": found, "wrote": wrote}))
"""

PROFILE = """
[mirror.fakejit]
env = ["FAKEJIT_CACHE_DIR"]
dists = ["fakejit"]
gpu_dependent = false
"""


def _world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The job script, a site directory where the fake JIT is "installed" (its
    dist-info, which keys the entries), and the project directory."""
    job = tmp_path / "jit.py"
    job.write_text(textwrap.dedent(JIT))
    site = tmp_path / "site"
    (site / "fakejit-1.2.dist-info").mkdir(parents=True)
    (site / "fakejit-1.2.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fakejit\nVersion: 1.2\n"
    )
    project = tmp_path / "project"
    project.mkdir()
    return job, site, project


def _settings(tmp_path: Path, project: Path, where: str, text: str) -> Path:
    """Write ``text`` as the project's ``cuforge.toml``, its ``pyproject.toml``'s
    ``[tool.cuforge]``, or the user's ``config.toml``; the file's path."""
    if where == "project":
        path = project / "cuforge.toml"
    elif where == "pyproject":
        path = project / "pyproject.toml"
        text = text.replace("[mirror.", "[tool.cuforge.mirror.")
        text = "[project]\nname = 'p'\n" + text.replace("mirror = ", "[tool.cuforge]\nmirror = ")
    else:
        path = tmp_path / "config" / "cuforge" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _env(tmp_path: Path, host: str, site: Path) -> dict[str, str]:
    """A fresh host: its own caches, an EMPTY fake-JIT directory, the test's user
    config directory (never the real user's)."""
    home = tmp_path / host
    (home / "fakejit").mkdir(parents=True)
    return isolated_env(
        home,
        HOME=str(home),
        FAKEJIT_CACHE_DIR=str(home / "fakejit"),
        PYTHONPATH=str(site),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )


def _run_job(
    url: str, job: Path, env: dict[str, str], cwd: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "run", "--cache", url, "--", sys.executable, str(job), *extra],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def _out(result: subprocess.CompletedProcess[str]) -> dict[str, str | None]:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    found: dict[str, str | None] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("where", ["project", "pyproject", "user"])
def test_run_mirrors_a_jit_only_a_settings_file_profiles(tmp_path: Path, where: str) -> None:
    job, site, project = _world(tmp_path)
    _settings(tmp_path, project, where, PROFILE)
    url = f"file://{tmp_path / 'shared'}"
    first = _out(_run_job(url, job, _env(tmp_path, "host1", site), project))
    assert first["found"] is None and first["wrote"], first  # it compiled

    listed = run(tmp_path, "cache", "ls", "--cache", url, "--kind", "mirror", "--json",
                 env=_env(tmp_path, "lister", site))  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    names = [e["name"] for e in json.loads(listed.stdout)]
    assert names == ["fakejit:kernels/k0.bin"], names  # published when the first job ended

    env = _env(tmp_path, "host2", site)
    second = _out(_run_job(url, job, env, project))
    # The second host's empty directory held the first job's bytes when the job started.
    assert second == {"found": first["wrote"], "wrote": None}, (first, second)
    kernel = Path(env["FAKEJIT_CACHE_DIR"]) / "kernels" / "k0.bin"
    assert kernel.read_bytes().hex() == first["wrote"]


BAD = [
    ("project", "[mirror.fakejit]\nenv = 5\n",
     "mirror.fakejit.env: expected a list of strings, got 5"),
    ("project", "[mirror.fakejit]\nenv = ['X']\ndists = ['x']\ncolour = 'red'\n",
     "mirror.fakejit.colour: unknown key (known: "),
    ("project", "[mirror.fakejit]\ndists = ['x']\n",
     "mirror.fakejit.env: a new profile needs the variable naming its directory"),
    ("project", "[mirror.fakejit]\nenv = ['1X']\ndists = ['x']\n",
     "mirror.fakejit.env: '1X' is not a variable name"),
    ("project", "mirror = 5\n", "mirror: expected [mirror.<name>] tables, got 5"),
    ("pyproject", "[mirror.warp]\ngpu_dependent = 'no'\n",
     "mirror.warp.gpu_dependent: expected bool, got 'no'"),
    ("user", "[mirror.warp]\nversion_from = 'warp'\n",
     "mirror.warp.version_from: expected 'module:attribute', got 'warp'"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "text", "says"), BAD)
def test_a_bad_profile_is_one_line_naming_the_file_and_key_and_exit_2(
    tmp_path: Path, where: str, text: str, says: str
) -> None:
    job, site, project = _world(tmp_path)
    path = _settings(tmp_path, project, where, text)
    started = tmp_path / "started"
    env = _env(tmp_path, "host1", site)
    result = _run_job(f"file://{tmp_path / 'shared'}", job, env, project, str(started))
    line = one_line_error(result, "cuforge run")
    named = f"{path} [tool.cuforge]" if where == "pyproject" else str(path)
    assert line.startswith(f"cuforge run: error: {named}: {says}"), line
    assert not started.exists()  # refused before the job started
    # doctor lists the same line as a problem (exit 1), read by the same function
    doctor = subprocess.run(
        [str(SCRIPT), "doctor", "--json"], env=env, cwd=project,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert doctor.returncode == 1, doctor.stderr
    problems = json.loads(doctor.stdout)["problems"]
    assert line.removeprefix("cuforge run: error: ") in problems, problems


def test_the_python_api_reads_the_same_profiles_user_then_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuforge.integrations.mirror import PROFILES, active_profiles, configured_profiles
    from cuforge.integrations.sessions import open_mirrors
    from cuforge.storage.urls import open_cache

    _, site, project = _world(tmp_path)
    _settings(tmp_path, project, "user", PROFILE + "skip = ['*.log']\n")
    # The project's table overrides the user's, which overrides the built-in: each
    # changes only the keys it sets.
    _settings(tmp_path, project, "project", "[mirror.fakejit]\nskip = ['*.bak']\n"
              "[mirror.warp]\ngpu_dependent = true\n")  # fmt: skip
    monkeypatch.chdir(project)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    found = configured_profiles()
    fake = found["fakejit"]
    assert (fake.env, fake.dists, fake.skip, fake.gpu_dependent) == (
        ("FAKEJIT_CACHE_DIR",), ("fakejit",), ("*.bak",), False,
    )  # fmt: skip
    assert found["warp"].gpu_dependent and not PROFILES["warp"].gpu_dependent
    assert found["warp"].env == PROFILES["warp"].env
    env = {"FAKEJIT_CACHE_DIR": str(tmp_path / "d")}
    assert fake in active_profiles(env)  # the default set is this one
    with open_cache(f"file://{tmp_path / 'shared'}") as cache:
        monkeypatch.setattr("sys.path", [str(site), *sys.path])
        mirrors = open_mirrors(cache, env)  # what integrations.session opens
        assert [m.profile for m in mirrors if m.profile.name == "fakejit"] == [fake]
        assert next(m for m in mirrors if m.profile.name == "fakejit").version == "fakejit==1.2"
    assert os.environ.get("FAKEJIT_CACHE_DIR") is None


def test_a_bad_profile_in_a_session_is_one_warning_and_no_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuforge.integrations.mirror import configured_profiles
    from cuforge.integrations.sessions import open_mirrors
    from cuforge.storage.base import CacheWriteWarning
    from cuforge.storage.urls import open_cache

    _, _, project = _world(tmp_path)
    path = _settings(tmp_path, project, "project", "[mirror.fakejit]\nenv = 5\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    says = f"{path}: mirror.fakejit.env: expected a list of strings, got 5"
    with pytest.raises(ValueError) as raised:
        configured_profiles()
    assert str(raised.value) == says
    url = f"file://{tmp_path / 'shared'}"
    with open_cache(url) as cache, pytest.warns(CacheWriteWarning) as warned:
        assert open_mirrors(cache, {"FAKEJIT_CACHE_DIR": str(tmp_path / "d")}) == []
    assert [says in str(w.message) for w in warned] == [True], [str(w.message) for w in warned]
