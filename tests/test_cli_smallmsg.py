"""Untrue messages a newcomer found (every message true, in the command line's words):
each test runs the installed ``cuforge`` console script in a subprocess, real NVRTC
compiles on real caches, and fails on the main it was written against.

1. A warm compile's warning said ``(counted in cuforge cache stats (warm compiles))``
   through a read-only cache, with ``--no-cache`` and through ``memory://``, where
   nothing is counted there.
2. ``doctor``'s ``settings files`` line left out the user's file when the project's
   set every key it sets, though it is read (a bad key in it fails every command).
3. An ``sqlite://`` directory or another program's database said ``give
   SQLiteProgramCache a path of its own``: the Python API's words.
4. ``--max-size`` with ``memory://,file:///d,redis://h/0`` said ``only directory,
   sqlite:// and memory:// caches do``, though the tier has a directory level.
5. ``cache ls --name ''`` listed every entry; other empty values are usage errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _cli import SAXPY, isolated_env, run
from reliability._figures import record

_WARNED = "cuforge: warning: cuforge compiles saxpy.cu after the process was marked warm "


# -- 1. the warm compile's warning says where it is counted, per cause -------------------
def test_a_warm_compile_says_whether_cache_stats_counts_it(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    env = isolated_env(tmp_path, CUFORGE_WARM="1")
    cases = (
        ("sm_90", ["--cache", str(cache)], "(counted in cuforge cache stats (warm compiles))"),
        ("sm_87", ["--cache", f"file://{cache}?ro"], "(not counted in cuforge cache stats: "
         "the cache is read-only, and a read-only cache records no counters)"),
        ("sm_86", ["--no-cache"], "(not counted in cuforge cache stats: no cache is in use)"),
        ("sm_75", ["--cache", "memory://"], "(not counted in cuforge cache stats: a memory:// "
         "cache's counters are gone when this command exits)"),
    )  # fmt: skip
    for arch, flags, said in cases:
        done = run(tmp_path, "compile", str(SAXPY), "--arch", arch, "-o",
                   str(tmp_path / "w.cubin"), *flags, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stderr == _WARNED + said + "\n", (flags, done.stderr)
    stats = run(tmp_path, "cache", "stats", "--cache", str(cache), "--json")
    assert json.loads(stats.stdout)["warm_compiles"] == 1, stats.stdout  # only the first
    # The library says it in its own words, per cause too.
    api = subprocess.run(
        [sys.executable, "-W", "always", "-c", "from cuforge import _warm; "
         "from cuforge.storage import InMemoryProgramCache as M; _warm.mark_warm(); "
         "_warm.note_compile('cuforge', 'a.cu'); _warm.note_compile('cuforge', 'b.cu', M())"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert (
        "cuforge: cuforge compiles a.cu after the process was marked warm (counted in "
        "compiles_after_warm() only: it went through no cache)"
    ) in api.stderr, api.stderr
    assert (
        "cuforge: cuforge compiles b.cu after the process was marked warm (counted in "
        "compiles_after_warm() and the in-memory cache's stats() only: gone with this process)"
    ) in api.stderr, api.stderr
    record(
        "use", "cli", "compile with CUFORGE_WARM=1 through a directory, the same ?ro, "
        "--no-cache and memory:// (test_cli_smallmsg.py)", 4,
        "the directory's warning says '(counted in cuforge cache stats (warm compiles))'; the "
        "others say '(not counted in cuforge cache stats: ...)' with the cause (read-only, no "
        "cache, memory:// gone at exit); warm compiles 1; the Python warning names the counters "
        "that count it (before: all four said 'counted')",
        scale="all",
    )  # fmt: skip


# -- 2. doctor lists every settings file it reads -----------------------------------------
def test_doctor_lists_every_settings_file_read(tmp_path: Path) -> None:
    project, xdg = tmp_path / "proj", tmp_path / "xdg"
    project.mkdir()
    (xdg / "cuforge").mkdir(parents=True)
    user = xdg / "cuforge" / "config.toml"
    user.write_text(f'cache = "{tmp_path / "u"}"\n')
    toml = project / "cuforge.toml"
    toml.write_text('cache = "p"\n')
    env = isolated_env(tmp_path, XDG_CONFIG_HOME=str(xdg))
    lines = run(tmp_path, "doctor", cwd=project, env=env).stdout.splitlines()
    (line,) = [ln for ln in lines if ln.startswith("settings files")]
    assert line == (f"settings files    {toml} (project: cache), {user} (user: cache "
                    "overridden by the project's)"), line  # fmt: skip
    user.write_text(f'cache = "{tmp_path / "u"}"\narch = "sm_90"\n')
    lines = run(tmp_path, "doctor", cwd=project, env=env).stdout.splitlines()
    assert (f"settings files    {toml} (project: cache), {user} (user: arch; cache "
            "overridden by the project's)") in lines, lines  # fmt: skip
    toml.write_text("")
    lines = run(tmp_path, "doctor", cwd=project, env=env).stdout.splitlines()
    assert (f"settings files    {toml} (project: sets nothing), {user} (user: cache, "
            "arch)") in lines, lines  # fmt: skip
    record(
        "inputs", "cli", "doctor with a project cuforge.toml setting cache and a user "
        "config.toml setting cache (then also arch; then the project file empty)", 3,
        "the settings files line names both files, the project's first, each with the keys "
        "it sets and which the project's overrides (before: the user's file, read by every "
        "command, was left out)",
        scale="all",
    )  # fmt: skip

