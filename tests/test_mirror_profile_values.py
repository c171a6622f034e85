"""The values of a settings file's ``[mirror.<name>]`` profile, for real: ``cuforge
run`` (the real console script, real jobs) reads a ``version_from`` module on the
job's ``sys.path`` (the project's own module, beside the script), never on its own;
a profile that ends up off says why in one line; a ``default`` with a placeholder
cuforge does not fill is refused when the table is read (exit 2, the file and key
named, ``doctor`` lists it), and one profile's fault at run time leaves the others
on; a ``$VAR`` that is unset makes the profile's directory unknown (the profile off,
saying why), never the path without it (``$NOPE/x`` is not ``/x``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _cli import SCRIPT, isolated_env, one_line_error

#: The project's own "JIT": a module with a version, and, run as a script, a job that
#: writes (or finds) its kernel in $FAKEJIT_DIR.
FAKEJIT = """
import json, os
__version__ = "0.1"
if __name__ == "__main__":
    root = os.environ["FAKEJIT_DIR"]
    path = os.path.join(root, "k.bin")
    found = open(path, "rb").read().hex() if os.path.exists(path) else None
    if found is None:
        os.makedirs(root, exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(os.urandom(16))
        os.replace(path + ".tmp", path)
    print(json.dumps({"found": found, "now": open(path, "rb").read().hex()}))
"""

PROFILE = """
[mirror.fakejit]
env = ["FAKEJIT_DIR"]
version_from = "fakejit:__version__"
gpu_dependent = false
"""


def _project(tmp_path: Path, profile: str = PROFILE) -> Path:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "fakejit.py").write_text(textwrap.dedent(FAKEJIT))
    (project / "cuforge.toml").write_text(profile)
    return project


def _env(tmp_path: Path, host: str) -> dict[str, str]:
    """A fresh host, whose PYTHONPATH does NOT name the project (as a user's)."""
    home = tmp_path / host
    home.mkdir(parents=True, exist_ok=True)
    env = isolated_env(
        home, HOME=str(home), FAKEJIT_DIR=str(home / "fakejit"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )  # fmt: skip
    env.pop("PYTHONPATH", None)
    return env


def _cuforge(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240
    )


def _mirrored(tmp_path: Path, url: str, cwd: Path) -> list[str]:
    listed = _cuforge(_env(tmp_path, "lister"), cwd, "cache", "ls", "--cache", url,
                      "--kind", "mirror", "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    return [e["name"] for e in json.loads(listed.stdout)]


@pytest.mark.parametrize("how", [["fakejit.py"], ["-m", "fakejit"]])
def test_run_reads_version_from_on_the_jobs_sys_path(tmp_path: Path, how: list[str]) -> None:
    """``cuforge run -- python fakejit.py`` (or ``-m fakejit``) in the project: the
    module is found where the job's Python finds it (the script's directory, the
    working directory), so the kernel is published and a second host's empty
    directory holds it before its job starts. Before: imported in cuforge's own
    process, whose sys.path lacks both -- nothing mirrored, nothing said."""
    project = _project(tmp_path)
    url = f"file://{tmp_path / 'shared'}"
    first = _cuforge(_env(tmp_path, "host1"), project, "run", "--cache", url, "--",
                     sys.executable, *how)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "warning" not in first.stderr, first.stderr
    wrote = json.loads(first.stdout.strip().splitlines()[-1])
    assert wrote["found"] is None, wrote
    assert _mirrored(tmp_path, url, project) == ["fakejit:k.bin"]

    second = _cuforge(_env(tmp_path, "host2"), project, "run", "--cache", url, "--",
                      sys.executable, *how)  # fmt: skip
    assert second.returncode == 0, second.stderr
    got = json.loads(second.stdout.strip().splitlines()[-1])
    assert got["found"] == wrote["now"], (wrote, got)  # hydrated before the job


def test_a_settings_profile_that_is_off_says_why_once(tmp_path: Path) -> None:
    """``python -I`` puts no script directory on sys.path: the module is not there for
    the job either, so the profile is off -- said in one line naming it and why."""
    project = _project(tmp_path)
    url = f"file://{tmp_path / 'shared'}"
    done = _cuforge(_env(tmp_path, "host1"), project, "run", "--cache", url, "--",
                    sys.executable, "-I", "fakejit.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "mirror" in ln]
    assert said == [
        "cuforge: warning: mirror fakejit is off: fakejit is not installed (no version)"
    ], done.stderr
    assert _mirrored(tmp_path, url, project) == []


def test_first_entry_is_what_the_jobs_python_puts_first(tmp_path: Path) -> None:
    from cuforge.cli._jobpython import first_entry

    cwd = str(tmp_path)
    (tmp_path / "sub").mkdir()
    assert first_entry(["python", "sub/a.py", "-m", "x"], {}, cwd) == str(tmp_path / "sub")
    assert first_entry(["python3", "-W", "ignore", "-u", "a.py"], {}, cwd) == cwd
    assert first_entry(["python", "-m", "pkg"], {}, cwd) == cwd
    assert first_entry(["python", "-c", "pass"], {}, cwd) == cwd
    assert first_entry(["python", "-Bc", "pass"], {}, cwd) == cwd
    assert first_entry(["python"], {}, cwd) == cwd
    assert first_entry(["python", "-I", "a.py"], {}, cwd) is None
    assert first_entry(["python", "a.py"], {"PYTHONSAFEPATH": "1"}, cwd) is None
    assert first_entry(["bash", "a.py"], {}, cwd) is None


UNKNOWN = "[mirror.myjit]\nenv = ['X']\ndists = ['pip']\ngpu_dependent = false\n"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('default = "{nope}/x"\n',
         "mirror.myjit.default: unknown placeholder {nope} (known: {version}, {tmpdir}, {user})"),
        ('subdir = "{user}"\n',
         "mirror.myjit.subdir: unknown placeholder {user} (known: {version})"),
        ('default = "/x/{version"\n', "mirror.myjit.default: "),
    ],
)  # fmt: skip
def test_an_unknown_placeholder_is_refused_when_the_table_is_read(
    tmp_path: Path, extra: str, says: str
) -> None:
    """Before: it passed, then every run warned "directory mirrors are not used
    (KeyError: 'nope')" -- all profiles off, neither file nor key named, exit 0 --
    and doctor listed no problem."""
    project = _project(tmp_path, UNKNOWN + extra)
    env = _env(tmp_path, "host1")
    started = tmp_path / "started"
    done = _cuforge(env, project, "run", "--cache", str(tmp_path / "L9"), "--",
                    "touch", str(started))  # fmt: skip
    line = one_line_error(done, "cuforge run")
    assert line.startswith(f"cuforge run: error: {project / 'cuforge.toml'}: {says}"), line
    assert not started.exists()
    doctor = _cuforge(env, project, "doctor", "--json")
    assert doctor.returncode == 1, doctor.stderr
    assert line.removeprefix("cuforge run: error: ") in json.loads(doctor.stdout)["problems"]


def test_one_profiles_fault_leaves_the_others_on(tmp_path: Path) -> None:
    """A profile that fails at run time (here one built directly, past the table
    checks) is one warning naming it; the other profiles are still mirrored."""
    from cuforge.integrations.mirror import Profile
    from cuforge.integrations.sessions import open_mirrors
    from cuforge.storage.base import CacheWriteWarning
    from cuforge.storage.memory import InMemoryProgramCache

    bad = Profile(name="bad", env=("BAD",), dists=("pip",), default="{nope}/x",
                  gpu_dependent=False)  # fmt: skip
    good = Profile(name="good", env=("GOOD",), dists=("pip",), gpu_dependent=False)
    env = {"GOOD": str(tmp_path / "g")}
    with pytest.warns(CacheWriteWarning) as warned:
        mirrors = open_mirrors(InMemoryProgramCache(), env, profiles={"bad": bad, "good": good})
    assert [m.profile.name for m in mirrors] == ["good"]
    assert mirrors[0].directory == str(tmp_path / "g") and mirrors[0].active
    assert [str(w.message) for w in warned] == [
        "cuforge: mirror bad is not used (KeyError: 'nope')"
    ]


def test_an_unset_variable_makes_the_directory_unknown_never_shorter(tmp_path: Path) -> None:
    """``default = "$NOPE/np6x"`` with $NOPE unset: before, the directory was /np6x
    (the filesystem's root), mirrored without a word."""
    from cuforge.integrations.mirror import Mirror, Profile
    from cuforge.storage.memory import InMemoryProgramCache

    var = "CUFORGE_TEST_NOPE_UNSET"
    assert var not in os.environ
    p = Profile(name="myjit", env=("X",), dists=("pip",), default=f"${var}/np6x",
                gpu_dependent=False)  # fmt: skip
    assert p.directory({}) is None and p.unset_variable({}) == var
    assert p.directory({var: str(tmp_path)}) == str(tmp_path / "np6x")
    # a variable the profile's own variable names, the same
    assert p.directory({"X": f"${{{var}}}/d"}) is None
    m = Mirror(p, InMemoryProgramCache(), env={}, version="pip==1")
    assert not m.active and m.reason == f"no directory (${var} in its path is not set)"

    project = _project(tmp_path, UNKNOWN + f'default = "${var}/np6x"\n')
    done = _cuforge(_env(tmp_path, "host1"), project, "run", "--cache",
                    f"file://{tmp_path / 'shared'}", "--", "true")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "mirror" in ln]
    assert said == [
        f"cuforge: warning: mirror myjit is off: no directory (${var} in its path is not set)"
    ], done.stderr
