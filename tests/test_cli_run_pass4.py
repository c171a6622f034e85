"""``cuforge run`` as the fourth newcomer pass found it (issue 36, "every message
true"): each test runs the installed console script in a subprocess -- real NVRTC
compiles, a real redis-server, real child processes -- and fails on the main it was
written against.

1. The command line's own compiles in a ``cuforge run --warm-set`` job (``cuforge
   compile``, a fast hit of it, ``cuforge warm MANIFEST``) said ``cache miss (compiled
   and stored in ...)`` and then the run warned that the job read or stored nothing,
   recording no set: only a Python job's ``compile(cache=True)`` was recorded.
2. The job inherited ``CUFORGE_WATCH=0``, which the command line sets for its own
   process (also with caching off, where the job runs "unwired").
3. A settings file's secret reached the job as ``CUFORGE_CACHE_SECRET=<the secret>``
   though cache.md says it never goes through the environment.
4. ``cuforge run -- /tmp`` said ``/tmp: permission denied``.
5. cache.md's "Which cache" left out ``CUFORGE_JAX_CACHE`` and ``CUFORGE_MIRROR_CACHE``
   (and every other variable the run sets).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _cli import ROOT, SAXPY, SCRIPT, isolated_env, one_line_error, run
from cuforge.integrations import warmsets
from cuforge.storage.entry import entry_id
from cuforge.storage.urls import open_cache
from reliability._figures import record

PY = sys.executable
SECRET = "a-team-secret-read-from-a-file-0123456789"
NOTHING_RECORDED = "the job read or stored nothing through the cache"


def _program_ids(home: Path, cache: str) -> list[str]:
    listed = run(home, "cache", "ls", "--json", "--kind", "program", "--cache", cache)
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


def _set_ids(cache: str, name: str) -> list[str] | None:
    with open_cache(cache) as opened:
        keys = warmsets.load(opened, name)
    return None if keys is None else sorted(entry_id(k) for k in keys)


def _job_env(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The environment ``env -0`` printed."""
    assert result.returncode == 0, result.stderr
    pairs = (item.split("=", 1) for item in result.stdout.split("\0") if item)
    return dict(pairs)


def _which_cache() -> str:
    """docs/cache.md's "Which cache" section."""
    text = (ROOT / "docs" / "cache.md").read_text()
    start = text.index("\n## Which cache\n")
    return text[start : text.index("\n## ", start + 1)]


# -- 1. the command line's own compiles join the run's warm set ---------------------------
def test_cli_compiles_in_a_run_are_recorded_in_its_warm_set(tmp_path: Path, redis_server) -> None:
    """``cuforge run --cache file://...,redis://... --warm-set job2 -- cuforge compile``:
    the miss's store and, in the next run, the hit are the set; the run warns of
    nothing. The full path only (``CUFORGE_STATE_DIR=off``: no fast hit records)."""
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    url = f"file://{tmp_path / 'local'},{redis_server.url}"
    env = isolated_env(tmp_path, CUFORGE_STATE_DIR="off")
    compile_ = [str(SCRIPT), "compile", "saxpy.cu", "--arch", "sm_75", "-o", "x.cubin"]
    for attempt, said in (("job2", "cache miss (compiled and stored in"), ("job3", "cache hit")):
        result = run(tmp_path, "run", "--cache", url, "--warm-set", attempt, "--", *compile_,
                     cwd=tmp_path, env=env)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert said in result.stdout, result.stdout
        assert NOTHING_RECORDED not in result.stderr, result.stderr
        (program,) = _program_ids(tmp_path, url)
        assert _set_ids(redis_server.url, attempt) == [program], (attempt, result.stderr)
    record(
        "use", "cli", "cuforge run --warm-set -- cuforge compile through file://,redis:// "
        "(a miss, then a hit in a second run; the full path)", 2,
        "each run's set lists exactly the program's entry, no warning (before: 'cache miss "
        "(compiled and stored ...)', then 'the job read or stored nothing', no set)",
        scale="all",
    )  # fmt: skip


@pytest.mark.parametrize(
    "how", [["--jobs", "1"], ["--jobs", "2"], ["--jobs", "2", "--threads"]], ids=str
)
def test_a_warm_manifest_in_a_run_is_recorded_in_its_warm_set(tmp_path: Path, how) -> None:
    """``cuforge run --warm-set w -- cuforge warm MANIFEST``, the recipe cli.md implies
    (``warm --set`` is the command-line side of ``run --warm-set``): every compile of
    the manifest is in the set -- in this process, in worker processes, on threads."""
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    (tmp_path / "warm.toml").write_text(
        '[defaults]\narch = ["sm_75", "sm_80"]\n[[kernel]]\nsource = "saxpy.cu"\n'
    )
    cache = str(tmp_path / "cache")
    result = run(tmp_path, "run", "--cache", cache, "--warm-set", "w", "--", str(SCRIPT), "warm",
                 str(tmp_path / "warm.toml"), *how)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "2 compiled" in result.stdout, result.stdout
    assert NOTHING_RECORDED not in result.stderr, result.stderr
    programs = _program_ids(tmp_path, cache)
    assert len(programs) == 2
    assert _set_ids(cache, "w") == programs, result.stderr
    if how == ["--jobs", "2"]:
        record(
            "use", "cli", "cuforge run --warm-set w -- cuforge warm MANIFEST (2 compiles; "
            "--jobs 1, --jobs 2 in worker processes, --jobs 2 --threads)", 3,
            "the set lists exactly the 2 program entries each time (before: '2 compiled', "
            "then 'the job read or stored nothing', no set)", scale="all",
        )  # fmt: skip


def _imports(trace: Path) -> set[str]:
    """Modules a process imported (its PYTHONPROFILEIMPORTTIME lines)."""
    lines = trace.read_text().splitlines()
    return {ln.rsplit("|", 1)[-1].strip() for ln in lines if ln.startswith("import time:")}


def test_a_fast_hit_in_a_run_is_recorded_in_its_warm_set(tmp_path: Path) -> None:
    """A repeated ``cuforge compile`` in the next run's job is answered by the fast hit
    path (no compile layer imported), and its entry is that run's set; outside a run
    the fast path loads nothing of the recording."""
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    cache = str(tmp_path / "cache")
    args = ["compile", "saxpy.cu", "--arch", "sm_75", "-o", "x.cubin"]
    first = run(tmp_path, "run", "--cache", cache, "--warm-set", "a", "--", str(SCRIPT), *args,
                cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0 and "cache miss" in first.stdout, first.stderr
    if not (tmp_path / "state" / "cli-hits").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    (program,) = _program_ids(tmp_path, cache)
    trace = tmp_path / "imports.txt"
    traced = f"PYTHONPROFILEIMPORTTIME=1 exec {SCRIPT} {' '.join(args)} 2>{trace}"
    again = run(tmp_path, "run", "--cache", cache, "--warm-set", "b", "--", "sh", "-c", traced,
                cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0 and again.stdout.rstrip().endswith("cache hit"), again
    modules = _imports(trace)
    assert "cuforge.cli._direct" in modules
    assert "cuforge.compile.program" not in modules, "the full path answered"
    assert NOTHING_RECORDED not in again.stderr, again.stderr
    assert _set_ids(cache, "b") == [program], again.stderr
    # Outside a run, the fast path loads nothing of the recording.
    env = isolated_env(tmp_path, CUFORGE_CACHE=cache)
    outside = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert outside.returncode == 0, outside.stderr
    plain = run(tmp_path, "compile", *args[1:], cwd=tmp_path,
                env={**env, "PYTHONPROFILEIMPORTTIME": "1"})  # fmt: skip
    assert plain.stdout.rstrip().endswith("cache hit"), plain.stdout
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in plain.stderr.splitlines()}
    assert "cuforge.compile.program" not in loaded, "not the fast path"
    assert not {m for m in loaded if m.startswith("cuforge.integrations")}, loaded
    record(
        "use", "cli", "cuforge run --warm-set b -- cuforge compile answered by the fast hit "
        "path (a record from the run before)", 1,
        "the hit served without the compile layer is the set (before: the journal directory, "
        "new each run, was in the request digest, so no run was served fast, and a fast hit "
        "journaled nothing); outside a run the fast path imports nothing of cuforge.integrations",
        scale="all",
    )  # fmt: skip


# -- 2, 5. the job's environment: the user's, plus the documented wiring ---------------------
def test_the_job_gets_the_users_environment_plus_the_documented_wiring(tmp_path: Path) -> None:
    """``cuforge run -- env -0``: nothing of the user's environment is removed or
    changed except the wiring, ``CUFORGE_WATCH`` is not added (the command line's own
    setting) but kept when the user set it, caching off hands the environment on as it
    is, and every variable the run adds is named in cache.md's "Which cache"."""
    given = isolated_env(tmp_path, MY_OWN="kept")
    cache = str(tmp_path / "cache")
    wired = _job_env(run(tmp_path, "run", "--cache", cache, "--warm-set", "s", "--warm",
                         "--", "env", "-0", env=given))  # fmt: skip
    assert "CUFORGE_WATCH" not in wired, wired.get("CUFORGE_WATCH")
    assert not set(given) - set(wired), "removed from the job's environment"
    added = {name for name, value in wired.items() if given.get(name) != value}
    assert added == {
        "CUFORGE_RUN", "CUFORGE_CACHE", "CUFORGE_TRITON_CACHE", "CUFORGE_INDUCTOR_CACHE",
        "CUFORGE_CUPY_CACHE", "CUFORGE_JAX_CACHE", "CUFORGE_MIRROR_CACHE", "CUFORGE_RUN_JOURNAL",
        "CUFORGE_WARM", "TRITON_CACHE_MANAGER", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", "PYTHONPATH",
    }  # fmt: skip
    section = _which_cache()
    undocumented = sorted(name for name in added if f"`{name}" not in section)
    assert not undocumented, f"not in cache.md's 'Which cache': {undocumented}"
    # every integration's own variable is listed where the rules rank it
    for module in ("triton", "inductor", "cupy", "jax", "mirror/engine"):
        source = (ROOT / "src" / "cuforge" / "integrations" / f"{module}.py").read_text()
        (name,) = re.findall(r'^ENV_CACHE = "(\w+)"', source, re.M)
        assert f"`{name}`" in section, name
        assert wired[name] == cache, name
    mine = _job_env(run(tmp_path, "run", "--cache", cache, "--", "env", "-0",
                        env={**given, "CUFORGE_WATCH": "1"}))  # fmt: skip
    assert mine["CUFORGE_WATCH"] == "1"
    off = {**given, "CUFORGE_CACHE": "off"}
    assert _job_env(run(tmp_path, "run", "--", "env", "-0", env=off)) == off  # unwired
    record(
        "inputs", "cli", "cuforge run -- env -0: with a cache, --warm-set and --warm; with "
        "CUFORGE_WATCH=1 set by the user; with CUFORGE_CACHE=off", 3,
        "the user's environment plus the 13 wiring variables, each named in cache.md's 'Which "
        "cache'; the user's CUFORGE_WATCH kept; caching off: the environment exactly as given "
        "(before: CUFORGE_WATCH=0 added every time, losing the header watcher; "
        "CUFORGE_JAX_CACHE in no document)", scale="all",
    )  # fmt: skip


# -- 3. a secret read from a file never enters the job's environment -------------------------
def test_a_secret_from_a_file_never_enters_the_jobs_environment(tmp_path: Path) -> None:
    """``secret_file`` in cuforge.toml: the job's environment holds the file's path, not
    the secret, and the job -- from a directory no settings file covers -- still signs
    with it: its default cache, an integration's, and ``open_cache(url)``."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "sec").write_text(SECRET + "\n")
    (project / "cuforge.toml").write_text('secret_file = "sec"\n')
    cache = str(tmp_path / "cache")
    env = _job_env(run(tmp_path, "run", "--cache", cache, "--", "env", "-0", cwd=project))
    assert not [name for name, value in env.items() if SECRET in value], "the secret is there"
    assert "CUFORGE_CACHE_SECRET" not in env
    assert env["CUFORGE_CACHE_SECRET_FILE"] == str(project / "sec")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            f"""
            import os
            os.chdir({str(elsewhere)!r})  # no settings file here
            from cuforge.integrations._cache import select_cache
            from cuforge.storage.config import default_cache
            from cuforge.storage.urls import open_cache
            used = [default_cache(), select_cache(None, "CUFORGE_JAX_CACHE"),
                    open_cache(os.environ["CUFORGE_CACHE"])]
            print(" ".join(type(c).__name__ for c in used))
            used[0].set_entry(b"from-the-job", b"payload", b'{{"kind":"raw","v":1}}')
            """
        )
    )
    result = run(tmp_path, "run", "--cache", cache, "--", PY, str(job), cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["SignedProgramCache"] * 3
    with open_cache(cache, secret=SECRET) as signed:
        assert signed.get_entry(b"from-the-job") is not None  # signed with the file's secret
    with open_cache(cache, secret="another-secret-0123456789abcdef") as other:
        assert other.get_entry(b"from-the-job") is None
    # A secret the user put in $CUFORGE_CACHE_SECRET is theirs: left as it is, no file.
    own = isolated_env(tmp_path, CUFORGE_CACHE_SECRET=SECRET)
    theirs = _job_env(run(tmp_path, "run", "--cache", cache, "--", "env", "-0", env=own))
    assert theirs["CUFORGE_CACHE_SECRET"] == SECRET
    assert "CUFORGE_CACHE_SECRET_FILE" not in theirs
    record(
        "inputs", "cli", "cuforge run with secret_file in cuforge.toml: -- env -0, and a Python "
        "job in a directory no settings file covers; with the user's own CUFORGE_CACHE_SECRET",
        2,
        "no variable of the job holds the secret (CUFORGE_CACHE_SECRET_FILE names the file); "
        "its default cache, an integration's and open_cache(url) sign with it; the user's "
        "variable left as set (before: CUFORGE_CACHE_SECRET=<the secret> in the job)",
        scale="all",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "No such file or directory"),
        ("short", "must be at least 16 bytes (got 5)"),
    ],
)
def test_a_bad_secret_file_variable_is_one_line_naming_it(tmp_path: Path, content, says) -> None:
    """``$CUFORGE_CACHE_SECRET_FILE`` is read by the one secret-file reader: a file that
    is missing or too short is a usage error naming the variable and the file;
    ``$CUFORGE_CACHE_SECRET`` wins over it."""
    secret = tmp_path / "sec"
    if content is not None:
        secret.write_text(content)
    args = ["compile", str(SAXPY), "--arch", "sm_75", "-o", str(tmp_path / "x.cubin"),
            "--cache", str(tmp_path / "cache")]  # fmt: skip
    env = isolated_env(tmp_path, CUFORGE_CACHE_SECRET_FILE=str(secret))
    line = one_line_error(run(tmp_path, *args, env=env), "cuforge compile")
    assert f"$CUFORGE_CACHE_SECRET_FILE {secret}" in line and says in line, line
    env["CUFORGE_CACHE_SECRET"] = SECRET
    assert run(tmp_path, *args, env=env).returncode == 0


# -- 4. a directory is not a command ---------------------------------------------------------
def test_a_directory_is_said_to_be_no_command(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    line = one_line_error(run(tmp_path, "run", "--", str(folder)), "cuforge run")
    assert line.endswith(f"{folder}: is a directory, not a command"), line
    plain = tmp_path / "plain"
    plain.write_text("echo hi\n")  # not executable: still permission denied
    line = one_line_error(run(tmp_path, "run", "--", str(plain)), "cuforge run")
    assert line.endswith(f"{plain}: permission denied"), line
    record(
        "inputs", "cli", "cuforge run -- DIR; -- a file without the execute bit", 2,
        "exit 2, 'DIR: is a directory, not a command'; the file still 'permission denied' "
        "(before: 'DIR: permission denied')", scale="all",
    )  # fmt: skip
