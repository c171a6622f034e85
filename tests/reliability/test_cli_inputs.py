"""Bad input at the command line: every cache a user can get wrong -- a path that
cannot be a cache, a directory others can write, a link below the root, a SQLite file
others can write -- is one line on stderr and exit status 2, never a traceback, for
the cache commands and for ``cuforge compile`` (its full and its fast hit path).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, run
from _figures import record
from cuforge.storage import FileStreamProgramCache, SQLiteProgramCache


def _unsafe_caches(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (cache argument, words the one-line error must contain)."""
    open_to_all = tmp / "open-to-all"
    FileStreamProgramCache(open_to_all).close()
    open_to_all.chmod(0o777)
    linked = tmp / "linked"
    FileStreamProgramCache(linked).close()
    shutil.rmtree(linked / "entries")
    (tmp / "elsewhere").mkdir()
    (linked / "entries").symlink_to(tmp / "elsewhere", target_is_directory=True)
    foreign = tmp / "foreign"
    FileStreamProgramCache(foreign).close()
    os.chown(foreign, 12345, -1)
    db = tmp / "db" / "cache.db"
    SQLiteProgramCache(db).close()
    db.chmod(0o666)
    a_file = tmp / "a-file"
    a_file.write_text("x")
    return {
        "writable by every user": (str(open_to_all), "trust=shared"),
        "entries/ is a link": (str(linked), "symbolic link"),
        "owned by another user": (str(foreign), "owned by uid 12345"),
        "sqlite file writable by every user": (f"sqlite://{db}", "chmod 600"),
        "a file": (str(a_file), "is not a directory"),
        "cannot be created": ("/proc/nope", "/proc/nope"),
    }


def test_unsafe_or_impossible_caches_are_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = _unsafe_caches(tmp_path)
    checked = 0
    for name, (where, words) in cases.items():
        for action in ("stats", "ls", "verify"):
            result = run(tmp_path, "cache", action, "--cache", where)
            line = one_line_error(result, f"cuforge cache {action}")
            assert words in line, (name, action, line)
            checked += 1
        out = str(tmp_path / "out")
        result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--outdir", out,
                     "--cache", where)  # fmt: skip
        assert words in one_line_error(result, "cuforge compile"), name
        checked += 1
    record(
        "inputs", "cli", "unsafe or impossible --cache (6 kinds) x stats/ls/verify/compile",
        checked, "every one: exit 2, one line naming the path and the fix, no traceback",
        scale="all", lost=0,
    )  # fmt: skip


def _made_unsafe(cache: Path, how: str) -> str:
    """Make a cache unsafe after it was used; the words its refusal must contain."""
    if how == "writable by every user":  # someone opens the cache to everybody
        cache.chmod(0o777)
        return "trust=shared"
    if how == "entries/ is a link":
        shutil.rmtree(cache / "entries")
        (cache.parent / "elsewhere").mkdir()
        (cache / "entries").symlink_to(cache.parent / "elsewhere", target_is_directory=True)
        return "symbolic link"
    os.chown(cache, 12345, -1)
    return "owned by uid 12345"


def _recorded(tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """Run ``args`` twice (stored, then a hit); skip when no hit record could be kept."""
    for _ in range(2):
        done = run(tmp, *args, env=env)
        assert done.returncode == 0, done.stderr
    if not (tmp / "state" / "cli-hits").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")


def _served_fast(result: subprocess.CompletedProcess[str]) -> bool:
    """Whether the fast hit path answered (no argparse: PYTHONPROFILEIMPORTTIME lines)."""
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in result.stderr.splitlines()
                if ln.startswith("import time:")}  # fmt: skip
    assert "cuforge.cli._direct" in imported
    return "argparse" not in imported


def _not_imports(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if not ln.startswith("import time:")]


@pytest.mark.parametrize(
    "how", ["writable by every user", "entries/ is a link", "owned by another user"]
)
def test_the_fast_hit_path_falls_back_when_the_cache_became_unsafe(
    tmp_path: Path, how: str
) -> None:
    cache = tmp_path / "cache"
    out = str(tmp_path / "out")
    build = ("compile", str(SAXPY), "--arch", "sm_90", "--outdir", out, "--cache", str(cache))
    _recorded(tmp_path, *build)  # a hit record names this cache now
    words = _made_unsafe(cache, how)
    result = run(tmp_path, *build)
    assert words in one_line_error(result, "cuforge compile"), how


def test_the_fast_hit_path_with_stdout_closed_exits_1_quietly(tmp_path: Path) -> None:
    out = tmp_path / "k.cubin"
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(out), "--cache",
             str(tmp_path / "c"))  # fmt: skip
    _recorded(tmp_path, *build)
    out.unlink()
    for path, extra in (("fast", {}), ("full", {"CUFORGE_STATE_DIR": "off"})):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before anything is written: EPIPE
        env = isolated_env(tmp_path, PYTHONPROFILEIMPORTTIME="1", **extra)
        try:
            done = subprocess.run([str(SCRIPT), *build], stdout=write, stderr=subprocess.PIPE,
                                  text=True, env=env, timeout=240)  # fmt: skip
        finally:
            os.close(write)
        assert done.returncode == 1, (path, done.stderr)
        assert _not_imports(done.stderr) == [], path  # no traceback, no "Exception ignored"
        assert _served_fast(done) == (path == "fast")
        assert out.read_bytes()[:4] == b"\x7fELF", path  # written before the report
        out.unlink()
    stats = run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c"), "--json")
    report = json.loads(stats.stdout)
    assert (report["hits"], report["misses"]) == (3, 1)  # each request counted once


def test_names_the_terminal_cannot_encode_are_printed_escaped(tmp_path: Path) -> None:
    source = tmp_path / "\u00fcber.cu"
    shutil.copy(SAXPY, source)
    build = ("compile", source.name, "--arch", "sm_90", "-o", "k.cubin", "--cache", "c")
    env = isolated_env(tmp_path, PYTHONIOENCODING="ascii", PYTHONPROFILEIMPORTTIME="1")
    answers = []
    for _ in range(3):  # a miss and a hit by the full path, then the fast path
        done = subprocess.run([str(SCRIPT), *build], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=240)  # fmt: skip
        assert done.returncode == 0 and _not_imports(done.stderr) == [], done.stderr
        assert done.stdout.startswith("\\xfcber.cu -> k.cubin (cubin, sm_90, "), done.stdout
        answers.append((done.stdout.split(", cache ")[-1].strip(), _served_fast(done)))
    if not (tmp_path / "state" / "cli-hits").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    assert answers[0] == (f"miss (compiled and stored in {tmp_path / 'c'})", False)
    assert answers[2] == ("hit", True)


def test_a_search_path_entry_that_became_a_link_loop_never_fails_a_hit(tmp_path: Path) -> None:
    on_path = tmp_path / "on-path"
    on_path.mkdir()
    time.sleep(2.2)  # older than the 2 s racy window: the identity can be recorded
    env = isolated_env(tmp_path, PYTHONPATH=str(on_path), PYTHONPROFILEIMPORTTIME="1")
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"),
             "--cache", str(tmp_path / "c"))  # fmt: skip
    _recorded(tmp_path, *build, env=env)
    assert _served_fast(run(tmp_path, *build, env=env))
    on_path.rmdir()  # Python skips such an entry; the compiler identity's witness is gone
    on_path.symlink_to(tmp_path / "loop")
    (tmp_path / "loop").symlink_to(on_path)
    for _ in range(2):  # the fast path steps aside; the full path probes again
        done = run(tmp_path, *build, env=env)
        assert done.returncode == 0 and _not_imports(done.stderr) == [], done.stderr
        assert done.stdout.rstrip().endswith("cache hit")
        assert not _served_fast(done)
