"""The change watcher: repeat hits skip header stats, and every kind of change is seen.

Each test compiles in this (long-lived) process, so after the first validated hit
the watcher's fast path is what stands between an edit and a stale hit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cache_workers import ARCH
from cuforge.compile import Program, ProgramOptions
from cuforge.compile.cache import _manifest, _watch
from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache

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
    code = "from cuforge.compile.cache import _watch; print(_watch.watcher() is None)"
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


# -- the watches follow the inode now at the path (cuforge issue 32) -------------------
# Each scenario changes what a watched path names, then edits the new file in place: the
# watcher must watch the new inodes, and every directory a symbolic link leads through.
# Every compile is compared with an uncached one; the fast path is shown in charge first.
CONFIG_SRC = '#include "config.h"\n' + KERNEL


def _ptx_value(ptx: bytes) -> int:
    return int(re.findall(rb"mov\.u32\s+%r\d+,\s*(-?\d+);", ptx)[0])


class _Session:
    """One long-lived FileStream cache compiling CONFIG_SRC with ``include_path=inc``."""

    def __init__(self, tmp_path: Path, inc: Path, checks: list[int]) -> None:
        self.cache = FileStreamProgramCache(tmp_path / "cache")
        self.opts = ProgramOptions(arch=ARCH, include_path=[str(inc)])
        self.checks = checks

    def value(self) -> int:
        """The cached compile's VALUE, asserted equal to an uncached compile's."""
        cached = Program(CONFIG_SRC, "c++", self.opts).compile("ptx", cache=self.cache)
        uncached = Program(CONFIG_SRC, "c++", self.opts).compile("ptx")
        assert _ptx_value(cached.code) == _ptx_value(uncached.code)
        return _ptx_value(cached.code)

    def settle(self, expected: int) -> None:
        """Compile until the watcher serves hits without a stat validation."""
        for _ in range(2):
            assert self.value() == expected
        validated = len(self.checks)
        assert self.value() == expected
        assert len(self.checks) == validated  # served by the watcher's fast path

    def close(self) -> None:
        self.cache.close()


def test_directory_deleted_recreated_then_edited_in_place(tmp_path: Path, checks) -> None:
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "config.h").write_text("#define VALUE 111\n")
    s = _Session(tmp_path, gen, checks)
    s.settle(111)
    shutil.rmtree(gen)  # rm -rf gen; mkdir gen: the same path, a new directory inode
    gen.mkdir()
    (gen / "config.h").write_text("#define VALUE 222\n")
    s.settle(222)
    (gen / "config.h").write_text("#define VALUE 333\n")  # in place: the new inode
    assert s.value() == 333
    s.close()


def test_directory_swapped_by_rename_then_edited_in_place(tmp_path: Path, checks) -> None:
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "config.h").write_text("#define VALUE 111\n")
    s = _Session(tmp_path, gen, checks)
    s.settle(111)
    (tmp_path / "gen.new").mkdir()
    (tmp_path / "gen.new" / "config.h").write_text("#define VALUE 222\n")
    os.rename(gen, tmp_path / "gen.old")  # mv gen gen.old; mv gen.new gen
    os.rename(tmp_path / "gen.new", gen)
    s.settle(222)
    (gen / "config.h").write_text("#define VALUE 333\n")
    assert s.value() == 333
    (tmp_path / "gen.old" / "config.h").write_text("#define VALUE 444\n")  # not on the path
    assert s.value() == 333
    s.close()


def test_symlink_repointed_up_the_path_then_edited_in_place(tmp_path: Path, checks) -> None:
    shared = tmp_path / "shared"
    for version, v in (("v1", 111), ("v2", 222)):
        (shared / version).mkdir(parents=True)
        (shared / version / "config.h").write_text(f"#define VALUE {v}\n")
    (shared / "current").symlink_to("v1")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "config.h").symlink_to("../shared/current/config.h")  # inc/config.h -> ...
    s = _Session(tmp_path, inc, checks)
    s.settle(111)
    (shared / "next").symlink_to("v2")
    os.replace(shared / "next", shared / "current")  # current -> v2, as `ln -sfn` does
    s.settle(222)
    (shared / "v2" / "config.h").write_text("#define VALUE 333\n")  # in place
    assert s.value() == 333
    s.close()


def test_file_symlink_repointed_then_target_edited_in_place(tmp_path: Path, checks) -> None:
    for d, v in (("a", 111), ("b", 222)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.h").write_text(f"#define VALUE {v}\n")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "config.h").symlink_to(tmp_path / "a" / "config.h")  # absolute target
    s = _Session(tmp_path, inc, checks)
    s.settle(111)
    (inc / "next").symlink_to(tmp_path / "b" / "config.h")
    os.replace(inc / "next", inc / "config.h")  # the link itself re-pointed
    s.settle(222)
    (tmp_path / "b" / "config.h").write_text("#define VALUE 333\n")  # in place, elsewhere
    assert s.value() == 333
    s.close()


def test_file_replaced_by_rename_then_edited_in_place(tmp_path: Path, checks) -> None:
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "config.h").write_text("#define VALUE 111\n")
    s = _Session(tmp_path, gen, checks)
    s.settle(111)
    (gen / "config.h.tmp").write_text("#define VALUE 222\n")
    os.replace(gen / "config.h.tmp", gen / "config.h")  # as editors save
    s.settle(222)
    (tmp_path / "other").mkdir()
    os.link(gen / "config.h", tmp_path / "other" / "alias.h")
    s.settle(222)
    # In place through another directory: only a watch on the new inode sees it (an
    # edit through gen/config.h would also reach gen's watch, naming the entry).
    with open(tmp_path / "other" / "alias.h", "r+") as f:
        f.write("#define VALUE 333\n")
    assert s.value() == 333
    s.close()


def test_link_repointed_during_the_walk_is_not_remembered(tmp_path: Path, checks, monkeypatch):
    """The epoch is read before the watches are added: a link re-pointed just after
    the walk read it (to a tree of equal content, so the check passes) must leave the
    validation unremembered, and the next one watches the new tree."""
    shared = tmp_path / "shared"
    for version in ("v1", "v2"):
        (shared / version).mkdir(parents=True)
        (shared / version / "config.h").write_text("#define VALUE 111\n")
    (shared / "current").symlink_to("v1")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "config.h").symlink_to("../shared/current/config.h")

    class Racing(_watch.Watcher):
        armed = False

        def _resolve(self, path: str, walk: object) -> tuple[str, int | None]:
            found = super()._resolve(path, walk)  # type: ignore[arg-type]
            if self.armed and path.endswith("config.h"):  # it read current -> v1
                self.armed = False
                (shared / "next").symlink_to("v2")
                os.replace(shared / "next", shared / "current")  # a real re-point
            return found

    racing = Racing()
    monkeypatch.setattr(_watch, "_instance", racing)
    s = _Session(tmp_path, inc, checks)
    s.settle(111)
    racing.armed = True
    (shared / "v1" / "config.h").write_text("#define VALUE 111\n")  # an event: revalidate
    s.settle(111)
    assert not racing.armed  # the re-point happened inside a walk
    (shared / "v2" / "config.h").write_text("#define VALUE 333\n")  # in place
    assert s.value() == 333
    s.close()
    racing.close()


def test_dead_watches_are_retired(tmp_path: Path) -> None:
    """The kernel drops a watch whose inode is gone (IN_IGNORED): so does the count
    the bound is kept against, and that directory's event moves the epoch."""
    w = _watch.Watcher()
    for d in ("keep", "gone"):
        (tmp_path / d).mkdir()
        for i in range(5):
            (tmp_path / d / f"f{i}.h").write_text("x")
    files = [str(tmp_path / d / f"f{i}.h") for d in ("keep", "gone") for i in range(5)]
    before = w.epoch()
    assert w.watch(files, [])
    held = len(w._wds)
    shutil.rmtree(tmp_path / "gone")
    assert w.epoch() != before
    assert len(w._wds) == held - 6  # the directory and its five files
    w.close()


def test_at_the_bound_held_watches_still_serve(tmp_path: Path, monkeypatch) -> None:
    """Past MAX_WATCHES a new tree is declined (validated by stat), while the trees
    already watched are re-watched and still report; declining moves no epoch."""
    w = _watch.Watcher()
    for d in ("held", "new"):
        (tmp_path / d).mkdir()
        for i in range(5):
            (tmp_path / d / f"f{i}.h").write_text("x")
    held = [str(tmp_path / "held" / f"f{i}.h") for i in range(5)]
    assert w.watch(held, [])
    monkeypatch.setattr(_watch, "MAX_WATCHES", len(w._wds) + 2)
    assert not w.watch([str(tmp_path / "new" / f"f{i}.h") for i in range(5)], [])
    assert len(w._wds) <= _watch.MAX_WATCHES
    before = w.epoch()
    assert w.watch(held, [])  # every inode already watched: no new watch needed
    assert w.epoch() == before  # the watch removed at the bound raised nothing that counts
    (tmp_path / "held" / "f3.h").write_text("y")
    assert w.epoch() != before
    w.close()
