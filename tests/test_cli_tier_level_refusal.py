"""A tier level behind the first that cannot be opened -- a world-writable directory,
one that is not a cuforge cache -- through the real ``cuforge`` console script: the
cache commands, compile and doctor say it as they say a single-level cache's refusal
(one line, exit 2, the origin and the level's URL first, the command line's ways out:
``?trust=shared``, not ``trust_shared=True``). A level that only fails when a compile
reaches it is warned about by its URL and the cause, not a Python repr."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

from _cli import EXAMPLES, isolated_env, one_line_error, run
from cuforge.storage import open_cache

CACHE_COMMANDS = [
    ["stats"], ["ls"], ["verify"], ["prune", "--older-than", "1d"], ["clear", "--yes"]
]  # fmt: skip
API_WORDS = ("trust_shared=True", "open_cache(", "LazyLevel(", "failed to lock")


def _caches(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A cuforge cache, a world-writable cuforge cache, and a directory of other files."""
    ok, shared, foreign = tmp_path / "ok", tmp_path / "ww", tmp_path / "notcache"
    for path in (ok, shared):
        open_cache(f"file://{path}").close()
    shared.chmod(0o777)
    foreign.mkdir()
    (foreign / "x").write_text("not the cache's\n")
    return ok, shared, foreign


def _said_as_one_level(line: str, prog: str, origin: str, level: Path) -> None:
    """``line`` is the single-level refusal with ``level 1 (URL)`` after the origin."""
    assert line.startswith(f"{prog}: error: {origin}: level 1 (file://{level}): "), line
    assert f"cache directory {level}: " in line, line
    for words in API_WORDS:
        assert words not in line, line


@pytest.mark.parametrize("command", CACHE_COMMANDS, ids=lambda c: c[0])
def test_cache_commands_refuse_an_unsafe_or_foreign_later_level_with_exit_2(
    tmp_path: Path, command: list[str]
) -> None:
    # Before: exit 1, no "--cache:", and the unsafe one's way out as trust_shared=True.
    ok, shared, foreign = _caches(tmp_path)
    prog = f"cuforge cache {command[0]}"
    for bad in (shared, foreign):
        result = run(tmp_path, "cache", *command, "--cache", f"file://{ok},file://{bad}")
        _said_as_one_level(one_line_error(result, prog), prog, "--cache", bad)
    result = run(tmp_path, "cache", *command, "--cache", f"file://{ok},file://{shared}")
    assert "add ?trust=shared to the cache URL" in result.stderr
    assert sorted(os.listdir(foreign)) == ["x"]  # nothing read or changed there


def test_the_variable_a_refused_level_came_from_is_named(tmp_path: Path) -> None:
    ok, shared, _ = _caches(tmp_path)
    env = isolated_env(tmp_path, CUFORGE_CACHE=f"file://{ok},file://{shared}")
    result = run(tmp_path, "cache", "ls", env=env)
    line = one_line_error(result, "cuforge cache ls")
    _said_as_one_level(line, "cuforge cache ls", "$CUFORGE_CACHE", shared)


def test_compile_refuses_an_unsafe_or_foreign_later_level_with_exit_2(tmp_path: Path) -> None:
    # Before: compiled, exit 0, "level 1 (LazyLevel('file://...', not opened)) failed to lock".
    ok, shared, foreign = _caches(tmp_path)
    shutil.copy(EXAMPLES / "saxpy.cu", tmp_path / "saxpy.cu")
    for bad in (shared, foreign):
        result = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "a.cubin",
                     "--cache", f"file://{ok},file://{bad}", cwd=tmp_path)  # fmt: skip
        line = one_line_error(result, "cuforge compile")
        _said_as_one_level(line, "cuforge compile", "--cache", bad)
        assert not (tmp_path / "a.cubin").exists()
    assert sorted(os.listdir(foreign)) == ["x"]


def test_doctor_names_a_refused_later_level_in_the_command_line_words(tmp_path: Path) -> None:
    ok, shared, foreign = _caches(tmp_path)
    for bad, alone in ((shared, shared), (foreign, foreign)):
        tier = run(tmp_path, "doctor", "--json", "--cache", f"file://{ok},file://{bad}")
        compile_line = run(tmp_path, "compile", str(EXAMPLES / "saxpy.cu"), "--arch", "sm_90",
                           "-o", str(tmp_path / "a.cubin"), "--cache",
                           f"file://{ok},file://{bad}")  # fmt: skip
        said = one_line_error(compile_line, "cuforge compile").removeprefix(
            "cuforge compile: error: "
        )
        assert said in tier.stdout, (said, tier.stdout)  # the line compile exits with
        for words in API_WORDS:
            assert words not in tier.stdout, tier.stdout
        single = run(tmp_path, "doctor", "--json", "--cache", str(alone))
        reason = said.split(f"level 1 (file://{bad}): ", 1)[1]
        assert reason in single.stdout  # the single-level problem, word for word


def test_compile_warns_a_level_that_cannot_be_opened_by_its_url(tmp_path: Path) -> None:
    # A level not there yet stays lazy; one that cannot then be created is a warning.
    ok, _, _ = _caches(tmp_path)
    shutil.copy(EXAMPLES / "saxpy.cu", tmp_path / "saxpy.cu")
    behind = tmp_path / "saxpy.cu" / "c"  # under a regular file: cannot be created
    result = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-o", "a.cubin",
                 "--cache", f"file://{ok},file://{behind}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    warned = [ln for ln in result.stderr.splitlines() if "tiered cache" in ln]
    assert len(warned) == 1, result.stderr
    assert warned[0].startswith(
        f"cuforge: warning: tiered cache: level 1 (file://{behind}) could not be opened "
        f"(cache directory {behind}: "
    ), warned[0]
    for words in API_WORDS:
        assert words not in result.stderr, result.stderr


def test_the_library_warning_names_a_lazy_level_by_its_url_and_cause(tmp_path: Path) -> None:
    ok, shared, _ = _caches(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with open_cache(f"file://{ok},file://{shared}") as cache, cache.lock(b"k" * 32):
            pass
    said = [str(w.message) for w in caught if "tiered cache" in str(w.message)]
    assert len(said) == 1, said
    assert said[0].startswith(
        f"cuforge tiered cache: level 1 (file://{shared}) could not be opened "
        f"(cache directory {shared}: is writable by every user"
    ), said[0]
    assert "LazyLevel(" not in said[0] and "failed to lock" not in said[0]
