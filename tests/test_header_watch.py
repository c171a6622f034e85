"""The change watcher: repeat hits skip header stats, and every kind of change is seen.

Each test compiles in this (long-lived) process, so after the first validated hit
the watcher's fast path is what stands between an edit and a stale hit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _cache_workers import ARCH
from cuforge.compile import Program, ProgramOptions, _manifest, _watch
from cuforge.storage import InMemoryProgramCache

pytestmark = pytest.mark.skipif(_watch.watcher() is None, reason="no inotify here")

KERNEL = 'extern "C" __global__ void k(int* a) { *a = VALUE; }\n'
SRC = '#include "params.h"\n' + KERNEL


def value(cache, inc: list[str]) -> int:
    opts = ProgramOptions(arch=ARCH, include_path=inc)
    ptx = Program(SRC, "c++", opts).compile("ptx", cache=cache).code
    return int(re.findall(rb"mov\.u32\s+%r\d+,\s*(-?\d+);", ptx)[0])


@pytest.fixture
def checks(monkeypatch) -> list[int]:
    """Counts full manifest validations (the slow path)."""
    calls: list[int] = []
    real = _manifest.check

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_manifest, "check", counting)
    return calls


def test_repeat_hits_take_the_fast_path(tmp_path: Path, checks) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "params.h").write_text("#define VALUE 1\n")
    inc = [str(tmp_path / "inc")]
    cache = InMemoryProgramCache()
    assert value(cache, inc) == 1  # miss
    assert value(cache, inc) == 1  # hit, validated by stat, now watched
    validated = len(checks)
    for _ in range(5):
        assert value(cache, inc) == 1
    assert len(checks) == validated  # no stat validation while nothing changed
    (tmp_path / "inc" / "params.h").write_text("#define VALUE 2\n")
    assert value(cache, inc) == 2
    assert len(checks) > validated


def _warm(tmp_path: Path) -> tuple[InMemoryProgramCache, list[str]]:
    (tmp_path / "inc").mkdir(exist_ok=True)
    (tmp_path / "inc" / "params.h").write_text("#define VALUE 1\n")
    inc = [str(tmp_path / "inc")]
    cache = InMemoryProgramCache()
    assert value(cache, inc) == 1
    assert value(cache, inc) == 1
    assert value(cache, inc) == 1  # served by the fast path
    return cache, inc


def test_write_through_a_hard_link_elsewhere(tmp_path: Path) -> None:
    cache, inc = _warm(tmp_path)
    (tmp_path / "other").mkdir()
    os.link(tmp_path / "inc" / "params.h", tmp_path / "other" / "alias.h")
    with open(tmp_path / "other" / "alias.h", "r+") as f:  # same inode, another path
        f.write("#define VALUE 7\n")
    assert value(cache, inc) == 7


def test_replace_by_rename(tmp_path: Path) -> None:
    cache, inc = _warm(tmp_path)
    (tmp_path / "new.h").write_text("#define VALUE 3\n")
    os.replace(tmp_path / "new.h", tmp_path / "inc" / "params.h")  # as editors save
    assert value(cache, inc) == 3


def test_ancestor_directory_swapped(tmp_path: Path) -> None:
    base = tmp_path / "project"
    base.mkdir()
    cache, inc = _warm(base)
    other = tmp_path / "project2"
    (other / "inc").mkdir(parents=True)
    (other / "inc" / "params.h").write_text("#define VALUE 4\n")
    os.rename(base, tmp_path / "project-old")
    os.rename(other, base)  # the same path now names another tree
    assert value(cache, inc) == 4


def test_new_file_in_an_earlier_directory_shadows(tmp_path: Path) -> None:
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "params.h").write_text("#define VALUE 1\n")
    inc = [str(tmp_path / "first"), str(tmp_path / "second")]
    cache = InMemoryProgramCache()
    for _ in range(3):
        assert value(cache, inc) == 1
    (tmp_path / "first" / "params.h").write_text("#define VALUE 5\n")
    assert value(cache, inc) == 5


def test_forked_child_does_not_steal_the_parents_events(tmp_path: Path) -> None:
    cache, inc = _warm(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child drains its own (new) queue and exits
        try:
            w = _watch.watcher()
            os._exit(0 if w is not None and w.epoch() >= 0 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    (tmp_path / "inc" / "params.h").write_text("#define VALUE 6\n")
    assert value(cache, inc) == 6


def test_watch_can_be_turned_off() -> None:
    code = "from cuforge.compile import _watch; print(_watch.watcher() is None)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={**os.environ, "CUFORGE_WATCH": "0"}, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "True"


def test_symlinked_ancestor_repointed(tmp_path: Path) -> None:
    for tree, v in (("tree1", 1), ("tree2", 8)):
        (tmp_path / tree / "inc").mkdir(parents=True)
        (tmp_path / tree / "inc" / "params.h").write_text(f"#define VALUE {v}\n")
    (tmp_path / "current").symlink_to(tmp_path / "tree1")
    inc = [str(tmp_path / "current" / "inc")]
    cache = InMemoryProgramCache()
    for _ in range(3):
        assert value(cache, inc) == 1
    (tmp_path / "next").symlink_to(tmp_path / "tree2")
    os.replace(tmp_path / "next", tmp_path / "current")  # as `ln -sfn` does
    assert value(cache, inc) == 8
