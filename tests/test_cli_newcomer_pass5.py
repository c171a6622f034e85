"""The fifth newcomer pass (issue 36: every message true): each test runs the
installed ``cuforge`` console script in a subprocess, on real caches (real NVRTC
compiles, a real redis-server), and fails on the main it was written against.

- 1. ``doctor`` on a ``?ro`` directory not there yet said ``exists  not yet (created
  by the first compile)`` and ``writable  yes``; tiers had no ``writable`` line.
- 2. doctor on a non-empty foreign directory said the read-only refusal, compile
  another line.
- 3. ``CUFORGE_WARM=banana``: doctor saw no problem, ``cuforge run`` handed it on.
- 4. ``?mode=777`` on a directory not there yet: ``cannot be created``.
- 5. an unreadable ``$CUFORGE_CACHE_SECRET_FILE``: ``secret  read from ...``.
- 6. ``warm --set`` with its server down: ``no warm set ... is stored``; a ``?ro``
  local level: ``has no local level``.
- 7. ``cuforge run --cache off``: the job got Python's coerced ``LC_CTYPE``.
- 8. ``cache dir`` inside ``cuforge run`` with a settings cap: ``DIR?max_size=N``.
- 9. a ``pyproject.toml`` with ``[tool.cuforge`` (a typo): skipped silently.
- 10. ``arch = ["sm_80", "sm_999"]``: explain answered for sm_80, compile refused.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, run
from _redis import RedisServer, free_port
from reliability._figures import record


def _doctor(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    result = run(tmp_path, "doctor", "--json", *args, env=env)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _said(result: subprocess.CompletedProcess[str], prog: str) -> str:
    """The one line a command exited 2 with, without its ``PROG: error:``."""
    return one_line_error(result, prog).removeprefix(f"{prog}: error: ")


def _doctor_text(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    return run(tmp_path, "doctor", *args, env=env).stdout.splitlines()


# -- 1. a ?ro level is never created, and each level says whether it takes stores -------
def test_doctor_says_a_read_only_level_is_not_created_and_each_level_writable(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """``?ro`` not there yet: ``exists no (?ro ...)``, ``writable no``, as compile
    finds (stores nothing there, creates nothing); every level of a tier has a line."""
    redis = redis_server.url
    for url, stored in ((f"file://{tmp_path}/x/c?ro", "not stored: read-only"),
                        (f"memory://,file://{tmp_path}/x/y?ro", "stored in memory only"),
                        (f"file://{tmp_path}/x/l?ro,{redis}", f"stored in {redis}")):  # fmt: skip
        code, report = _doctor(tmp_path, "--cache", url)
        assert code == 0 and report["exists"] is False, report
        lines = _doctor_text(tmp_path, "--cache", url)
        said = "no (?ro: opened read-only, so no command creates it)"
        if "," in url:  # a tier: one exists line per directory level, naming it
            level = url.split(",")[0 if url.startswith("file:") else 1].removesuffix("?ro")
            said = f"{level}  {said}"
        assert f"exists            {said}" in lines, lines
        built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                    str(tmp_path / "o.cubin"), "--cache", url)  # fmt: skip
        assert built.returncode == 0 and stored in built.stdout, built.stdout
        assert not (tmp_path / "x").exists()
        (ro,) = [lv for lv in report["levels"] if lv["level"].startswith("file:")]
        assert (ro["writable"], ro["writable_reason"]) == (False, "?ro: opened read-only")
    code, report = _doctor(tmp_path, "--cache", f"file://{tmp_path}/x/c?ro")
    assert (report["writable"], report["writable_reason"]) == (False, "?ro: opened read-only")
    assert "writable          no (?ro: opened read-only)" in _doctor_text(
        tmp_path, "--cache", f"file://{tmp_path}/x/c?ro"
    )
    (tmp_path / "e").mkdir()
    for url, first, second in (
        (f"file://{tmp_path}/e,{redis}?ro", f"file://{tmp_path}/e  yes",
         f"{redis}  no (?ro: opened read-only)"),
        (f"memory://,{redis}?ro", "memory://  yes", f"{redis}  no (?ro: opened read-only)"),
    ):  # fmt: skip
        lines = _doctor_text(tmp_path, "--cache", url)
        at = lines.index(f"writable          {first}")
        assert lines[at + 1] == f"                  {second}", lines
        code, report = _doctor(tmp_path, "--cache", url)
        assert [lv["writable"] for lv in report["levels"]] == [True, False], report
    record(
        "use", "cli", "doctor on a ?ro directory not there yet (alone, behind memory://, "
        "before Redis) and on tiers with a ?ro Redis", 5,
        "exists 'no (?ro: opened read-only, so no command creates it)', writable no for "
        "that level and one writable line per level of a tier; compile created nothing "
        "(before: 'exists not yet (created by the first compile)', 'writable yes', and no "
        "writable line for a tier)", scale="all",
    )  # fmt: skip


# -- 2. a foreign directory: compile's line ---------------------------------------------
def test_doctor_says_compiles_line_for_a_directory_that_is_not_a_cache(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "f").write_text("x\n")
    env = isolated_env(tmp_path, CUFORGE_CACHE=str(folder))
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "o.cubin"), env=env)  # fmt: skip
    line = _said(built, "cuforge compile")
    code, report = _doctor(tmp_path, env=env)
    assert code == 1 and report["problems"] == [line], (
        report["problems"], line,
    )  # fmt: skip
    assert "fix: name an empty or new directory for the cache" in line
    assert sorted(p.name for p in folder.iterdir()) == ["f"]
    record(
        "use", "cli", "doctor and compile on a non-empty directory that is not a cuforge cache",
        2, "doctor's problem is compile's exit-2 line ('... cuforge creates and deletes files "
        "only in its own caches; fix: name an empty or new directory for the cache'); nothing "
        "written there (before: doctor said the read-only line, 'name the directory of a "
        "cuforge cache')", scale="all",
    )  # fmt: skip


# -- 3. $CUFORGE_WARM: doctor lists it, run refuses it ----------------------------------
def test_doctor_lists_and_run_refuses_a_warm_switch_compile_refuses(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, CUFORGE_WARM="banana")
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "o.cubin"), env=env)  # fmt: skip
    line = _said(built, "cuforge compile")
    assert line.startswith("$CUFORGE_WARM='banana' is not a switch"), line
    code, report = _doctor(tmp_path, env=env)
    assert code == 1 and report["problems"] == [line], report["problems"]
    marker = tmp_path / "ran"
    for extra in ((), ("--cache", "off")):
        job = run(tmp_path, "run", *extra, "--", "touch", str(marker), env=env)
        assert _said(job, "cuforge run") == line
        assert not marker.exists()
    headers = isolated_env(tmp_path, CUFORGE_TOOLKIT_HEADERS=str(tmp_path))
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "o.cubin"), env=headers)  # fmt: skip
    line = _said(built, "cuforge compile")
    job = run(tmp_path, "run", "--cache", "off", "--", "touch", str(marker), env=headers)
    assert _said(job, "cuforge run") == line and not marker.exists()
    record(
        "inputs", "cli", "CUFORGE_WARM=banana to compile, doctor, run (cached, off); "
        "CUFORGE_TOOLKIT_HEADERS without a toolkit to run", 5,
        "doctor lists compile's exit-2 line as its one problem; run exits 2 with that line "
        "before the job starts (before: doctor exit 0, run handed it to the job)",
        scale="all",
    )  # fmt: skip


# -- 4. cannot be created: only when creating fails -------------------------------------
def test_doctor_says_cannot_be_created_only_when_creating_fails(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/x/m777?mode=777"
    code, report = _doctor(tmp_path, "--cache", url)
    assert code == 1 and "creatable" not in report, report
    (problem,) = report["problems"]
    assert "?mode=777 lets every user write the cache" in problem
    lines = _doctor_text(tmp_path, "--cache", url)
    assert "exists            not yet (created by the first compile)" in lines, lines
    assert not (tmp_path / "x").exists()
    # a path under a regular file: creating is what fails
    (tmp_path / "plain").write_text("")
    code, report = _doctor(tmp_path, "--cache", str(tmp_path / "plain" / "c"))
    assert code == 1 and report["creatable"] is False, report
    record(
        "inputs", "cli", "doctor on a ?mode=777 directory not there yet, and on one under a "
        "regular file", 2,
        "the first 'exists not yet (created by the first compile)' with the unsafe mode as "
        "the problem; the second 'cannot be created' (before: 'cannot be created' for both)",
        scale="all",
    )  # fmt: skip


# -- 5. a secret that was not read -------------------------------------------------------
def test_doctor_says_a_secret_file_that_was_not_read(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("abc")
    for path in (tmp_path / "missing.key", short):
        env = isolated_env(tmp_path, CUFORGE_CACHE_SECRET_FILE=str(path))
        code, report = _doctor(tmp_path, env=env)
        assert code == 1, report
        assert report["settings"]["secret"]["value"] == (
            f"not read from {path} (see the problem below)"
        )
        assert str(path) in report["problems"][0]
    key = tmp_path / "good.key"
    key.write_text("k" * 32)
    code, report = _doctor(tmp_path, env=isolated_env(tmp_path, CUFORGE_CACHE_SECRET_FILE=str(key)))
    assert code == 0 and report["settings"]["secret"]["value"] == f"read from {key}", report
    code, report = _doctor(tmp_path, env=isolated_env(tmp_path, CUFORGE_CACHE_SECRET="abc"))
    assert code == 1
    assert report["settings"]["secret"]["value"] == "set, but refused (see the problem below)"
    record(
        "inputs", "cli", "doctor with $CUFORGE_CACHE_SECRET_FILE missing, 3 bytes, good; "
        "$CUFORGE_CACHE_SECRET of 3 bytes", 4,
        "'secret  not read from PATH (see the problem below)' / 'read from PATH' / 'set, but "
        "refused'; read by the function the commands read it with (before: 'read from PATH' "
        "above the problem saying it could not be)", scale="all",
    )  # fmt: skip


# -- 6. warm --set: a server that cannot be asked, a ?ro local level ---------------------
def test_warm_set_says_it_could_not_be_read_when_the_server_is_down(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    for local in (tmp_path / "l10", tmp_path / "l11"):
        if local.name == "l11":
            local.mkdir()
        done = run(tmp_path, "warm", "--set", "ws1", "--cache", f"file://{local},{down}")
        assert done.returncode == 1, done.stderr
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"cuforge warm: warm set 'ws1' could not be read: {down} is "
                               "unreachable (Redis cache "), last  # fmt: skip
        assert "no warm set" not in done.stderr
    assert not (tmp_path / "l10").exists()
    kept = tmp_path / "l9"
    kept.mkdir()
    assert run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
               str(tmp_path / "o.cubin"), "--cache", str(kept)).returncode == 0  # fmt: skip
    done = run(tmp_path, "warm", "--set", "ws1", "--cache", f"file://{kept}?ro,{redis_server.url}")
    line = _said(done, "cuforge warm")
    assert line == (
        f"--set: the local level file://{kept} of --cache file://{kept}?ro,{redis_server.url} "
        "is read-only (?ro): there is nothing to fetch the warm set into; drop its ?ro"
    ), line
    record(
        "use", "cli", "warm --set with the fleet's Redis down (local level absent, present); "
        "with a ?ro local level", 3,
        "exit 1 'warm set ... could not be read: redis://... is unreachable (...)', nothing "
        "created; exit 2 'the local level ... is read-only (?ro)' (before: 'no warm set ... is "
        "stored', and 'has no local level')", scale="all",
    )  # fmt: skip


# -- 7. the job's environment is exactly the user's --------------------------------------
def test_run_without_a_cache_hands_on_no_coerced_locale(tmp_path: Path) -> None:
    path = f"{SCRIPT.parent}:/usr/bin:/bin"
    base = {"PATH": path, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "CUFORGE_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    for given in ({"LANG": "xx_XX.UTF-8"}, {"LANG": "xx_XX.UTF-8", "LC_CTYPE": "C.UTF-8"}):
        env = {**base, **given}
        job = subprocess.run([str(SCRIPT), "run", "--cache", "off", "--", "env", "-0"],
                             env=env, capture_output=True, timeout=120, check=True)  # fmt: skip
        got = dict(i.decode().split("=", 1) for i in job.stdout.split(b"\0") if i)
        assert got == env, (got, env)
    assert os.name == "posix"
    record(
        "use", "cli", "cuforge run --cache off -- env with LANG of a locale the host lacks, "
        "with and without the user's own LC_CTYPE", 2,
        "the job's environment is exactly the user's (before: LC_CTYPE=C.UTF-8, Python's "
        "PEP 538 coercion, added)", scale="all",
    )  # fmt: skip


# -- 8. cache dir: the directory, not its options ----------------------------------------
def test_cache_dir_prints_the_directory_of_a_cache_with_a_cap(tmp_path: Path) -> None:
    """Inside ``cuforge run`` with a settings file's cap, ``$CUFORGE_CACHE`` is
    ``DIR?max_size=N``: ``cache dir`` printed that (no path, no URL)."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "cuforge.toml").write_text('cache = ".cc"\nmax_size = "20G"\n')
    job = run(tmp_path, "run", "--", str(SCRIPT), "cache", "dir", cwd=project)
    assert (job.returncode, job.stdout) == (0, f"{project / '.cc'}\n"), job.stderr
    env = isolated_env(tmp_path, CUFORGE_CACHE=f"{tmp_path}/d?max_size=1G")
    assert run(tmp_path, "cache", "dir", env=env).stdout == f"{tmp_path}/d\n"
    record(
        "use", "cli", "cache dir inside cuforge run with a settings file's max_size, and "
        "with $CUFORGE_CACHE=DIR?max_size=1G", 2,
        "the directory's path (before: 'DIR?max_size=21474836480', which du cannot take)",
        scale="all",
    )  # fmt: skip


# -- 9. a pyproject.toml that cannot be read ---------------------------------------------
def test_a_broken_pyproject_naming_tool_cuforge_is_an_error_naming_it(tmp_path: Path) -> None:
    """``[tool.cuforge`` (a typo): the file was skipped and a parent's cuforge.toml
    used; a broken cuforge.toml is exit 2 naming it."""
    (tmp_path / "cuforge.toml").write_text('cache = "off"\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "pyproject.toml").write_text('[tool.cuforge\narch = "sm_90"\n')
    said = _said(run(tmp_path, "cache", "dir", cwd=sub), "cuforge cache dir")
    assert said.startswith(f"{sub / 'pyproject.toml'} is not valid TOML: "), said
    # valid, naming tool.cuforge only in a comment: not a settings file (the parent's is)
    text = '# see tool.cuforge in the docs\n[project]\nname = "x"\n'
    (sub / "pyproject.toml").write_text(text)
    done = run(tmp_path, "cache", "dir", cwd=sub)
    parent = tmp_path / "cuforge.toml"
    assert done.stdout == f"caching is off (cache = 'off' in project config {parent})\n"
    record(
        "inputs", "cli", "a pyproject.toml with '[tool.cuforge' (a typo) below a cuforge.toml; "
        "one naming tool.cuforge in a comment only", 2,
        "exit 2 'PATH/pyproject.toml is not valid TOML: ...'; the comment-only one is not a "
        "settings file (before: the broken one skipped silently, the parent's file used)",
        scale="all",
    )  # fmt: skip


# -- 10. explain refuses the settings' arch list as compile does -------------------------
def test_explain_refuses_a_configured_arch_list_as_compile_does(tmp_path: Path) -> None:
    (tmp_path / "cuforge.toml").write_text('arch = ["sm_80", "sm_999"]\ncache = "c"\n')
    (tmp_path / "saxpy.cu").write_text(SAXPY.read_text())
    # the cache exists (an --arch beats the setting): explain answered, for sm_80
    made = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_80", "-o", "k.cubin", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    built = run(tmp_path, "compile", "saxpy.cu", "--outdir", "out", cwd=tmp_path)
    line = _said(built, "cuforge compile")
    assert "sm_999" in line
    explained = run(tmp_path, "cache", "explain", "saxpy.cu", cwd=tmp_path)
    assert _said(explained, "cuforge cache explain") == line
    record(
        "inputs", "cli", "arch = [sm_80, sm_999] in cuforge.toml: compile and cache explain", 2,
        "both exit 2 with the same line naming sm_999 and the file (before: explain answered "
        "for sm_80)", scale="all",
    )  # fmt: skip
