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
import sqlite3
import subprocess
import sys
from pathlib import Path

from _cli import SAXPY, isolated_env, one_line_error, run
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


# -- 3. an sqlite:// path that is no cuforge database: in command-line words ---------------
def test_a_refused_sqlite_path_names_the_flag_not_the_class(tmp_path: Path) -> None:
    folder, other = tmp_path / "d", tmp_path / "other.db"
    folder.mkdir()
    with sqlite3.connect(other) as db:
        db.execute("create table t (x)")
    db.close()
    before = other.read_bytes()
    directory = (f"sqlite:// path {folder} is a directory, not a database file; {{}} the path "
                 f"of a database file (such as sqlite://{folder}/program-cache.db)")  # fmt: skip
    foreign = (f"cache file {other}: is not a cuforge SQLite cache (another program's SQLite "
               "database: application_id 0x0, tables: t); nothing was changed -- {} an "
               "sqlite:// path of its own, or move that file away")  # fmt: skip
    for args, env, prog, origin, change, said in (
        (["compile", str(SAXPY), "--arch", "sm_90", "--cache", f"sqlite://{folder}"], None,
         "cuforge compile", "--cache", "give --cache", directory),
        (["compile", str(SAXPY), "--arch", "sm_90", "--cache", f"sqlite://{other}"], None,
         "cuforge compile", "--cache", "give --cache", foreign),
        (["cache", "stats"], {"CUFORGE_CACHE": f"sqlite://{other}"}, "cuforge cache stats",
         "$CUFORGE_CACHE", "set $CUFORGE_CACHE to", foreign),
    ):  # fmt: skip
        done = run(tmp_path, *args, env=isolated_env(tmp_path, **(env or {})))
        line = one_line_error(done, prog)
        assert line == f"{prog}: error: {origin}: {said.format(change)}", line
        assert "SQLiteProgramCache" not in line
    project = tmp_path / "proj"
    project.mkdir()
    (project / "cuforge.toml").write_text(f'cache = "sqlite://{folder}"\n')
    line = one_line_error(run(tmp_path, "cache", "ls", cwd=project), "cuforge cache ls")
    where = f"cache in project config {project / 'cuforge.toml'}"
    assert line == f"cuforge cache ls: error: {where}: {directory.format(f'set {where} to')}"
    assert other.read_bytes() == before and sorted(folder.iterdir()) == []
    # The Python API keeps its own words.
    api = subprocess.run(
        [sys.executable, "-c", "from cuforge.storage import open_cache\n"
         f"for u in ('sqlite://{folder}', 'sqlite://{other}'):\n"
         "    try: open_cache(u)\n    except ValueError as e: print(e)"],
        capture_output=True, text=True, env=isolated_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert api.stdout.splitlines() == [
        f"SQLiteProgramCache path {folder} is a directory; give the path of a database file "
        "(e.g. .../program-cache.db)",
        f"cache file {other}: is not a cuforge SQLite cache (another program's SQLite database: "
        "application_id 0x0, tables: t); nothing was changed -- give SQLiteProgramCache a path "
        "of its own, or move that file away",
    ], api.stdout + api.stderr
    record(
        "inputs", "cli", "an sqlite:// directory and another program's SQLite database, from "
        "--cache, $CUFORGE_CACHE and a project cuforge.toml", 4,
        "each: exit 2, one line naming where the URL came from, the path, and what to change "
        "there ('give --cache the path of a database file (such as sqlite:///d/program-cache."
        "db)', 'set $CUFORGE_CACHE to an sqlite:// path of its own'); the file unchanged; the "
        "Python API keeps its words (before: 'give SQLiteProgramCache a path of its own')",
        scale="all",
    )  # fmt: skip


# -- 4. --max-size on a tier: what it caps, and why this tier is refused ------------------
def test_max_size_on_a_tier_says_it_caps_the_last_level(tmp_path: Path) -> None:
    level = tmp_path / "d"
    tier = f"memory://,file://{level},redis://127.0.0.1:1/0"
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--max-size", "2G",
               "--cache", tier, "-o", str(tmp_path / "k.cubin"))  # fmt: skip
    line = one_line_error(done, "cuforge compile")
    way = f"file://{level}?max_size={2 << 30}"
    assert line == (
        "cuforge compile: error: --max-size: a tier's size cap goes to its last level, here "
        "redis://127.0.0.1:1/0, and redis:// caches take no size cap (--cache); to cap "
        f"file://{level}, give it its own in the URL ({way})"
    ), line
    assert not level.exists() and not (tmp_path / "k.cubin").exists()
    # The way it names works: that level capped, the tier used.
    capped = f"memory://,{way},redis://127.0.0.1:1/0"
    out = str(tmp_path / "k.cubin")
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", capped, "-o", out)
    assert done.returncode == 0, done.stderr
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", str(level), "--json").stdout)
    assert stats["max_size_bytes"] == 2 << 30, stats
    # One level: the words it had.
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--max-size", "2G",
               "--cache", "redis://127.0.0.1:1/0")  # fmt: skip
    line = one_line_error(done, "cuforge compile")
    assert line.endswith("--max-size: redis:// caches take no size cap (--cache); only "
                         "directory, sqlite:// and memory:// caches do"), line  # fmt: skip
    record(
        "inputs", "cli", "compile --max-size 2G with memory://,file:///d,redis://h/0", 1,
        "exit 2 saying a tier's cap goes to its last level (here the redis:// one, which takes "
        "none) and how to cap the directory level instead (file:///d?max_size=2147483648), "
        "which works; nothing created (before: 'only directory, sqlite:// and memory:// caches "
        "do', though the tier has a directory level)",
        scale="all",
    )  # fmt: skip


# -- 5. cache ls --name '' ---------------------------------------------------------------
def test_an_empty_name_filter_is_a_usage_error(tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", cache, "-o",
               str(tmp_path / "k.cubin"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name, given in (("", "an empty"), ("  ", "a blank")):
        line = one_line_error(run(tmp_path, "cache", "ls", "--cache", cache, "--name", name),
                              "cuforge cache ls")  # fmt: skip
        assert line == (
            "cuforge cache ls: error: --name needs a source name or glob such as saxpy.cu or "
            f"'sax*' (it was given {given} one); leave --name out to list every entry"
        ), line
    listed = run(tmp_path, "cache", "ls", "--cache", cache, "--name", "sax*")
    assert listed.returncode == 0 and "saxpy.cu" in listed.stdout, listed
    # The other filters of ls and prune refuse an empty value too, naming the flag.
    for args, prog in (
        (["cache", "ls", "--arch", ""], "cuforge cache ls"),
        (["cache", "ls", "--kind", ""], "cuforge cache ls"),
        (["cache", "prune", "--compiler", "", "--dry-run"], "cuforge cache prune"),
        (["cache", "prune", "--older-than", "", "--dry-run"], "cuforge cache prune"),
        (["cache", "prune", "--unused-for", "", "--dry-run"], "cuforge cache prune"),
        (["cache", "prune", "--max-size", "", "--dry-run"], "cuforge cache prune"),
    ):
        line = one_line_error(run(tmp_path, *args, "--cache", cache), prog)
        assert args[2] in line, line
    record(
        "inputs", "cli", "cache ls --name '' and --name '  '", 2,
        "exit 2, one line naming --name (before: every entry listed, exit 0); the other "
        "filters of ls and prune already refused an empty value",
        scale="all",
    )  # fmt: skip
