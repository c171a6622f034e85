"""The compile pipeline reports what its store step did (``compile_through_cache``).

Real NVRTC, real backends (files, SQLite with a real lock holder process, a Redis
port nobody listens on): the outcome must say "not stored" and why whenever the
entry is not in the cache afterwards, and "stored" only when a fresh handle hits.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from _cache_workers import ARCH, SRC
from _redis import free_port
from cuforge.compile import Program, ProgramOptions
from cuforge.compile.cache import Compiled, compile_through_cache
from cuforge.compile.cache import _steps as io
from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache, SQLiteProgramCache, events
from cuforge.storage.urls import open_cache


def _run(cache: Any, src: str = SRC) -> Compiled:
    program = Program(src, "c++", ProgramOptions(arch=ARCH))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the backends' own fail-open warnings
        return compile_through_cache(program, "cubin", (), None, cache)


def test_a_store_that_lands_is_stored_and_a_hit_has_no_store(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path / "c") as cache:
        miss = _run(cache)
        assert not miss.hit and miss.store is not None
        assert miss.store.stored and miss.store.reason == io.STORED, miss
        hit = _run(cache)
        assert hit.hit and hit.store is None and hit.obj.code == miss.obj.code
    with FileStreamProgramCache(tmp_path / "c") as fresh:  # it really is there
        assert _run(fresh).hit


def test_a_read_only_cache_says_read_only(tmp_path: Path) -> None:
    with open_cache(f"file://{tmp_path / 'ro'}?ro", secret=None) as cache:
        done = _run(cache)
        assert not done.hit and done.store is not None
        assert not done.store.stored and done.store.reason == io.READ_ONLY, done
        assert not _run(cache).hit  # nothing was written


def test_an_unreachable_redis_says_unreachable() -> None:
    port = free_port()  # nobody listens there
    with open_cache(f"redis://127.0.0.1:{port}/0?timeout=200ms", secret=None) as cache:
        first = _run(cache)
        assert first.store is not None and first.store.reason == io.UNREACHABLE, first
        assert str(port) in first.store.detail
        second = _run(cache)  # now backing off: still unreachable, still not stored
        assert second.store is not None and second.store.reason == io.UNREACHABLE, second


@pytest.mark.parametrize("backend", ["memory", "filestream"])
def test_an_entry_larger_than_the_cap_is_refused_and_says_so(tmp_path: Path, backend) -> None:
    """FileStream stored such an entry, evicted every other one and then it (memory
    the same); now it is refused before anything is evicted, and the outcome says so."""
    cap = 1024  # far smaller than any cubin
    if backend == "memory":
        cache: Any = InMemoryProgramCache(max_size_bytes=cap)
    else:
        cache = FileStreamProgramCache(tmp_path / "c", max_size_bytes=cap)
    cache[b"small"] = b"s" * 100
    done = _run(cache)
    assert done.store is not None and done.store.reason == io.TOO_LARGE, done
    assert not done.store.stored and f"cap {cap}" in done.store.detail
    assert events.dropped_words(done.store.reason) == "larger than the cache's size cap"
    assert cache.get(b"small") == b"s" * 100  # nothing evicted for it
    stats = cache.stats()
    assert (stats.evictions, stats.write_failures, stats.stores) == (0, 1, 1), stats
    assert not _run(cache).hit
    if backend == "filestream":
        cache.close()


def test_program_compile_logs_that_a_too_large_result_was_not_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FileStreamProgramCache(tmp_path / "c", max_size_bytes=1024) as cache:
        cache[b"small"] = b"s"
        program = Program(SRC, "c++", ProgramOptions(arch=ARCH))
        with caplog.at_level(logging.WARNING, logger="cuforge.cache"):
            obj = program.compile("cubin", cache=cache)
        assert obj.code == _run(InMemoryProgramCache()).obj.code
        assert "larger than the cache's size cap" in caplog.text
        assert cache.get(b"small") == b"s" and cache.stats().write_failures == 1


_LOCK_HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


def test_a_sqlite_write_lock_held_elsewhere_says_locked(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with SQLiteProgramCache(db, timeout=0.2) as cache:
        holder = subprocess.Popen(
            [sys.executable, "-c", _LOCK_HOLDER, str(db)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            done = _run(cache)
        finally:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.close()
            assert holder.wait(timeout=30) == 0
        assert done.store is not None and done.store.reason == io.LOCKED, done
        assert "kept in memory" in done.store.detail  # not in the file (yet)
        after = _run(cache, SRC + "\n// another program\n")  # the lock is gone
        assert after.store is not None and after.store.stored, after
    with SQLiteProgramCache(db) as fresh:  # the kept row was written with that store
        assert _run(fresh).hit


class _Refusing(dict):  # type: ignore[type-arg]
    """A duck-typed mapping cache whose writes raise (a broken backend)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        raise OSError(28, "No space left on device")


def test_a_backend_that_raises_says_failed_with_its_words() -> None:
    done = _run(_Refusing())
    assert done.store is not None and done.store.reason == io.FAILED, done
    assert "No space left on device" in done.store.detail
    assert done.obj.code  # the compile itself is returned


def test_a_tracked_compile_reports_the_entry_store(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "k.h").write_text("#define SCALE 3\n")
    src = '#include "k.h"\nextern "C" __global__ void k(float* x) { x[0] *= SCALE; }\n'
    options = ProgramOptions(arch=ARCH, include_path=[str(tmp_path / "inc")])
    with FileStreamProgramCache(tmp_path / "c") as cache:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            miss = compile_through_cache(Program(src, "c++", options), "cubin", (), None, cache)
            hit = compile_through_cache(Program(src, "c++", options), "cubin", (), None, cache)
        assert miss.store is not None and miss.store.stored and not miss.hit, miss
        assert hit.hit and hit.store is None
    with open_cache(f"file://{tmp_path / 'c'}?ro", secret=None) as ro:
        (tmp_path / "inc" / "k.h").write_text("#define SCALE 4\n")  # a new variant
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            edited = compile_through_cache(Program(src, "c++", options), "cubin", (), None, ro)
        assert edited.store is not None and edited.store.reason == io.READ_ONLY, edited


@pytest.mark.parametrize("reason", [io.STORED, io.READ_ONLY, io.TOO_LARGE])
def test_the_outcome_reads_as_one_line(reason: str) -> None:
    outcome = io.StoreOutcome(reason, "why")
    assert outcome.stored == (reason == io.STORED)
    assert reason in repr(outcome) and "why" in repr(outcome)
