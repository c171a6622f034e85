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
import shutil
import sys
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, run
from cuforge.integrations import warmsets
from cuforge.storage.entry import entry_id
from cuforge.storage.urls import open_cache
from reliability._figures import record

PY = sys.executable
NOTHING_RECORDED = "the job read or stored nothing through the cache"


def _program_ids(home: Path, cache: str) -> list[str]:
    listed = run(home, "cache", "ls", "--json", "--kind", "program", "--cache", cache)
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


def _set_ids(cache: str, name: str) -> list[str] | None:
    with open_cache(cache) as opened:
        keys = warmsets.load(opened, name)
    return None if keys is None else sorted(entry_id(k) for k in keys)


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
