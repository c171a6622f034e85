"""SQLiteProgramCache shared by real processes: caps, single-flight, locks, busy writers.

Every worker is a fresh interpreter (``tests/_sqlite_workers.py``) with real NVRTC
compiles where a compile is involved.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from _cache_workers import ARCH, SRC
from _sqlite_workers import open_race
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import CacheRecoveryWarning, CacheWriteWarning, SQLiteProgramCache, ownership
from cuforge.utils import make_program_cache_key

WORKERS = os.path.join(os.path.dirname(__file__), "_sqlite_workers.py")
pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX process tools")


def start(command: str, args: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKERS, command, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out)


def wait_ready(proc: subprocess.Popen, ready: Path) -> None:
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the worker never got ready"
        time.sleep(0.01)
    assert ready.read_text() == "held"


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def disk_bytes(db: Path) -> int:
    return sum(
        os.path.getsize(f"{db}{s}") for s in ("", "-wal", "-shm") if os.path.exists(f"{db}{s}")
    )


@pytest.fixture(scope="module")
def reference_cubin() -> bytes:
    return Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin").code


def src_key() -> bytes:
    return make_program_cache_key(
        code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin"
    )


def test_round_trip_in_a_fresh_process(tmp_path: Path, reference_cubin: bytes) -> None:
    db, counter = tmp_path / "cache.db", tmp_path / "compiles"
    first = finish(start("compile", {"db": str(db), "counter": str(counter)}))
    second = finish(start("compile", {"db": str(db), "counter": str(counter)}))
    digest = hashlib.sha256(reference_cubin).hexdigest()
    assert first["sha256"] == second["sha256"] == digest
    assert len(counter.read_text().split()) == 1  # the second process never compiled
    assert (second["stats"]["hits"], second["stats"]["misses"]) == (1, 0)


def test_four_processes_missing_one_key_compile_once(tmp_path: Path, reference_cubin) -> None:
    db, counter, barrier = tmp_path / "cache.db", tmp_path / "compiles", tmp_path / "barrier"
    barrier.mkdir()
    args = {"db": str(db), "counter": str(counter), "barrier": str(barrier), "parties": 4}
    outs = [finish(p) for p in [start("compile", args) for _ in range(4)]]
    assert len(counter.read_text().split()) == 1, counter.read_text()
    assert {o["sha256"] for o in outs} == {hashlib.sha256(reference_cubin).hexdigest()}
    assert sum(o["stats"]["stores"] for o in outs) == 1
    with SQLiteProgramCache(db) as c:
        assert c.total_stats().stores == 1 and len(c) == 1


def test_four_processes_writing_and_reading_under_a_cap(tmp_path: Path) -> None:
    db, barrier = tmp_path / "cache.db", tmp_path / "barrier"
    barrier.mkdir()
    cap = 2_000_000
    SQLiteProgramCache(db, max_size_bytes=cap).close()
    procs = [
        start(
            "stress",
            {
                "db": str(db),
                "idx": i,
                "n": 250,
                "size": 4096,
                "cap": cap,
                "barrier": str(barrier),
                "parties": 4,
            },
        )
        for i in range(4)
    ]
    results = []
    for p in procs:
        results.append(finish(p))
        on_disk = disk_bytes(db)  # after each exit, while the others may still write
        assert on_disk <= 1.1 * cap, (len(results), on_disk)
    for r in results:
        assert r["wrong"] == 0 and r["warnings"] == [], r
        assert r["stats"]["write_failures"] == 0 and r["stats"]["integrity_failures"] == 0
    with SQLiteProgramCache(db) as c:
        total = c.total_stats()
        assert total.stores == 1000 and total.evictions >= 400
        assert 0.4 * cap <= disk_bytes(db) <= cap
        for i in range(4):  # what survived is intact
            got = [c.get(f"{i}-{j}") for j in range(250)]
            assert all(g is None or g == bytes([i]) * 4096 for g in got)


def test_held_write_lock_makes_stores_fail_softly(tmp_path, reference_cubin) -> None:
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    with SQLiteProgramCache(db) as c:
        c[b"before"] = b"stored before the lock"
    holder = start("hold_write", {"db": str(db), "ready": str(ready)})
    try:
        wait_ready(holder, ready)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with SQLiteProgramCache(db, timeout=0.3) as c:
                # WAL: a held write lock does not block readers.
                assert c.get(b"before") == b"stored before the lock"
                t0 = time.monotonic()
                obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=c)
                assert obj.code == reference_cubin  # compiled; the store waited, then was kept
                assert 0.25 < time.monotonic() - t0 < 10
                s = c.stats()
                assert (s.write_failures, s.stores, s.lock_timeouts) == (0, 0, 1)
            # close() waits `timeout` to write what it kept; still locked: dropped, counted
            s = c.stats()
            assert (s.write_failures, s.stores) == (1, 0)
        writes = [str(w.message) for w in caught if w.category is CacheWriteWarning]
        assert len(writes) == 1 and "locked" in writes[0], writes
    finally:
        stop(holder)
    assert not list(tmp_path.glob("*.corrupt-*"))  # busy is never a reason to move the file
    with SQLiteProgramCache(db) as c:
        assert c.get(b"before") is not None
        Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=c)
        assert c.stats().stores == 1 and c.get(src_key()) == reference_cubin


def test_catching_up_on_kept_stores_keeps_the_wal_in_its_allowance(tmp_path) -> None:
    """Stores kept in memory while another process held the write lock are written in
    WAL-sized transactions when it lets go, not in one: 48 kept 4 KiB rows written at
    once grew the WAL to ~210 KB, past its 125 KB allowance under a 2 MB cap."""
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    cap = 2_000_000
    SQLiteProgramCache(db, max_size_bytes=cap).close()
    with SQLiteProgramCache(db, max_size_bytes=cap, timeout=0.3) as c:
        allowance = c._driver._w.space.budget.wal
        holder = start("hold_write", {"db": str(db), "ready": str(ready)})
        try:
            wait_ready(holder, ready)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheWriteWarning)
                for i in range(48):
                    c[f"kept-{i}".encode()] = bytes([i]) * 4096
            assert c.stats().stores == 0 and len(c._driver._w.deferred.rows) == 48
        finally:
            stop(holder)
        stores = 0
        for i in range(48):  # the lock is free: the next stores write the kept rows too,
            if not c._driver._w.deferred.rows:  # a few transactions of them each
                break
            c[f"after-{i}".encode()] = b"a" * 4096
            stores += 1
            wal = os.path.getsize(f"{db}-wal")
            assert wal <= allowance, (wal, allowance)
        assert c.stats().stores == 48 + stores and not c._driver._w.deferred.rows
        assert all(c.get(f"kept-{i}".encode()) == bytes([i]) * 4096 for i in range(48))


def test_a_reader_keeping_the_wal_from_being_folded_never_takes_it_past_its_allowance(
    tmp_path,
) -> None:
    """A process reading an older snapshot keeps the WAL from being folded in (one
    descheduled in the middle of a read on a loaded machine does, for a while). The
    stores meanwhile are kept in memory -- lock timeouts, not write failures -- and the
    WAL file stays within its allowance; once the reader is gone they are written.
    Before, each writer whose fold failed added another allowance to the WAL: 64
    stores of 8 KiB took it to ~5x its 128 KiB allowance (the 8-process soak's disk
    peak reached 1.17x the cap when the machine was loaded)."""
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    cap = 2 << 20
    values = {f"k{i}".encode(): bytes([i]) * 8192 for i in range(64)}
    with SQLiteProgramCache(db, max_size_bytes=cap, timeout=0.3) as c:
        allowance = c._driver._w.space.budget.wal
        c[b"first"] = b"f" * 8192  # the WAL holds frames: the reader's snapshot needs them
        reader = start("hold_read", {"db": str(db), "ready": str(ready)})
        try:
            wait_ready(reader, ready)
            peak = 0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheWriteWarning)
                for key, value in values.items():
                    c[key] = value
                    peak = max(peak, os.path.getsize(f"{db}-wal"))
            s = c.stats()
            assert peak <= allowance, (peak, allowance)
            assert s.write_failures == 0 and s.lock_timeouts >= 1, s
            assert c._driver._w.deferred.rows  # kept, not written past the allowance
            assert all(c.get(k) == v for k, v in values.items())  # kept rows are served
        finally:
            stop(reader)
        for i in range(len(values)):  # the reader gone: the next stores write them
            if not c._driver._w.deferred.rows:
                break
            c[f"after-{i}".encode()] = b"a" * 8192
            peak = max(peak, os.path.getsize(f"{db}-wal"))
        assert not c._driver._w.deferred.rows and peak <= allowance, peak
        assert c.stats().write_failures == 0
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:  # on disk, for every process
        assert all(c.get(k) == v for k, v in values.items())


def test_zero_stats_while_another_process_holds_the_write_lock(tmp_path) -> None:
    from _cli import run

    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    with SQLiteProgramCache(db) as c:
        c[b"k"] = b"x"
        c.get(b"k")
    holder = start("hold_write", {"db": str(db), "ready": str(ready)})
    try:
        wait_ready(holder, ready)
        with SQLiteProgramCache(db, timeout=0.3) as c:
            with pytest.raises(OSError, match="locked"):
                c.zero_stats()
            assert c.total_stats().hits == 1  # nothing was reset
        url = f"sqlite://{db}?timeout=0.3"
        refused = run(tmp_path, "cache", "zero-stats", "--cache", url)
        # exit 1: the command ran and the cache failed it (docs/cli.md), as clear does
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert refused.stderr.strip() == (
            f"cuforge cache zero-stats: error: cannot reset the statistics: {db}: "
            "database is locked"
        ), refused.stderr
    finally:
        stop(holder)
    with SQLiteProgramCache(db) as c:
        assert c.total_stats().hits == 1
        c.zero_stats()
        assert c.total_stats().hits == 0


def test_exclusive_lock_elsewhere_makes_reads_misses(tmp_path, reference_cubin) -> None:
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    with SQLiteProgramCache(db) as c:
        c[b"before"] = b"x"
    holder = start("hold_write", {"db": str(db), "ready": str(ready), "exclusive": True})
    try:
        wait_ready(holder, ready)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with SQLiteProgramCache(db, timeout=0.3) as c:
                assert c.get(b"before") is None  # locked out: a miss, not an exception
                obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=c)
                assert obj.code == reference_cubin
        assert any(w.category is CacheRecoveryWarning for w in caught)
    finally:
        stop(holder)
    assert not list(tmp_path.glob("*.corrupt-*"))
    with SQLiteProgramCache(db) as c:
        assert c.get(b"before") == b"x"


def test_write_failure_past_the_file_size_limit(tmp_path: Path) -> None:
    got = finish(start("efbig", {"db": str(tmp_path / "c.db"), "limit": 200_000, "size": 400_000}))
    assert got["small"] and not got["big"] and got["write_failures"] == 1
    assert len(got["warnings"]) == 1


def test_lock_admits_one_process_at_a_time(tmp_path: Path) -> None:
    db, barrier = tmp_path / "cache.db", tmp_path / "barrier"
    barrier.mkdir()
    counter, log = tmp_path / "counter", tmp_path / "log"
    SQLiteProgramCache(db).close()
    args = {"db": str(db), "counter": str(counter), "log": str(log), "barrier": str(barrier),
            "parties": 4}  # fmt: skip
    for p in [start("contend", args) for _ in range(4)]:
        finish(p)
    assert counter.read_text() == "4"
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events == ["enter", "exit"] * 4  # never two inside at once


def test_killed_lock_holder_frees_waiters_and_live_one_times_out(tmp_path: Path) -> None:
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    SQLiteProgramCache(db).close()
    holder = start("hold_key", {"db": str(db), "key": "hot", "ready": str(ready)})
    try:
        wait_ready(holder, ready)
        short = finish(start("wait_key", {"db": str(db), "key": "hot", "timeout": 0.3}))
        assert short["held"] is False and 0.25 < short["waited"] < 5
        waiter = start("wait_key", {"db": str(db), "key": "hot", "timeout": 30})
        time.sleep(1.0)
        assert waiter.poll() is None  # really blocked by the live holder
    finally:
        stop(holder)
    got = finish(waiter)
    assert got["held"] is True and got["waited"] < 20


def test_killed_holder_does_not_block_the_compile(tmp_path, reference_cubin) -> None:
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    SQLiteProgramCache(db).close()
    holder = start("hold_key", {"db": str(db), "key": src_key().hex(), "ready": str(ready)})
    result: list = []
    # The worker locks the key as a str: use the same str key here.
    with SQLiteProgramCache(db) as c:

        def compile_through_lock() -> None:
            with c.lock(src_key().hex(), timeout=60) as held:
                result.append(held)

        try:
            wait_ready(holder, ready)
            t = threading.Thread(target=compile_through_lock)
            t.start()
            t.join(0.5)
            assert t.is_alive()  # waiting for the live holder
        finally:
            stop(holder)
        t.join(30)
        assert result == [True]


def test_statistics_sum_over_processes(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    workers = [finish(p) for p in [start("count", {"db": str(db), "hits": 5, "misses": 3})
                                   for _ in range(2)]]  # fmt: skip
    with SQLiteProgramCache(db) as c:
        total = c.total_stats()
    assert (total.hits, total.misses, total.stores) == (10, 6, 2), workers
    assert total.bytes_read == 100 and total.bytes_written == 20


def test_an_opener_waits_for_a_peer_holding_a_new_file_before_its_wal_switch(
    tmp_path: Path,
) -> None:
    """Two processes opening a new cache together: the switch to WAL got SQLITE_BUSY at
    once (SQLite skips its busy handler there) while the peer held the write lock, and
    the handle served misses for good -- a worker's store and counters were lost under
    load (test_statistics_sum_over_processes). The opener must wait for the peer."""
    db, ready = tmp_path / "cache.db", tmp_path / "ready"
    holder = start("hold_new_file", {"db": str(db), "ready": str(ready), "seconds": 1.0})
    try:
        wait_ready(holder, ready)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with SQLiteProgramCache(db) as c:
                c["k"] = b"v" * 10
                assert c.get("k") == b"v" * 10
                assert c.get("absent") is None
        assert [str(w.message) for w in caught] == []
    finally:
        finish(holder)
    with SQLiteProgramCache(db) as c:
        total = c.total_stats()
        assert (total.hits, total.misses, total.stores) == (1, 1, 1)
        assert c.get("k") == b"v" * 10


def test_a_handle_open_at_exit_writes_kept_stores_and_counters_past_a_brief_holder(
    tmp_path: Path,
) -> None:
    """A peer held the write lock while a process exited with its handle open (0.6 s
    was enough): the exit flush waited 0.25 s for the kept store and 50 ms for the
    counters, and both were lost (nothing of the process reached the file). It waits
    as close() does. The peer holds 1.5 s so that the second store surely meets it."""
    db = tmp_path / "cache.db"
    SQLiteProgramCache(db).close()
    got = finish(start("exit_open", {"db": str(db), "seconds": 1.5}))
    assert got == {"kept": 1}  # the second store really was kept in memory
    with SQLiteProgramCache(db) as c:
        total = c.total_stats()
        assert (total.hits, total.misses, total.stores, total.write_failures) == (5, 1, 2, 0)
        assert c.get(b"first") == b"1" * 10 and c.get(b"kept") == b"2" * 10


def test_counts_of_a_killed_process_are_kept_up_to_its_last_write(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    code = (
        "import os, signal\nfrom cuforge.storage import SQLiteProgramCache\n"
        f"c = SQLiteProgramCache({str(db)!r})\n"
        "c['k'] = b'v'\nc.total_stats()\nc.get('k')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=False)
    with SQLiteProgramCache(db) as c:
        total = c.total_stats()
        assert (total.stores, total.hits) == (1, 0)  # the unwritten hit is lost, nothing more
        assert c.get("k") == b"v"


# -- openers racing at one path: a user's file is never displaced -------------------------------
RACE_ROUNDS = 30  # the bug showed in 10-24 of 30 rounds on this 2-core machine
RACE_PARTIES = 8


def test_processes_opening_a_users_file_at_once_never_displace_it(tmp_path: Path) -> None:
    """Eight processes opening a user's results.csv together: a peer's fresh
    ``.lock`` was taken as proof the file was cuforge's, and the file was renamed
    ``.corrupt-*`` with a database made in its place (4 of 11 runs in the report).
    Now every opener refuses it, the file stays byte for byte, and nothing is created
    beside it."""
    content = b"run,loss\n" + b"".join(f"{i},{1 / (i + 1):.6f}\n".encode() for i in range(2000))

    def users_file(path: str) -> None:
        Path(path).write_bytes(content)

    reports = open_race(str(tmp_path), "results.csv", users_file, RACE_ROUNDS, RACE_PARTIES)
    for r in range(RACE_ROUNDS):
        here = tmp_path / "data" / str(r)
        assert sorted(os.listdir(here)) == ["results.csv"], (r, sorted(os.listdir(here)))
        assert (here / "results.csv").read_bytes() == content, r
    for report in reports:
        assert report["warnings"] == [], report
        assert len(report["outcomes"]) == RACE_ROUNDS
        for outcome in report["outcomes"]:
            assert outcome.get("refused") == "ForeignDatabaseError", outcome
            assert "is not a cuforge SQLite cache" in outcome["message"], outcome


def test_processes_creating_a_new_cache_at_once_all_open_it(tmp_path: Path) -> None:
    """The other side of the race: where nothing exists, eight processes creating the
    database together all open it (none takes a peer's half-made file for someone
    else's), store, and leave one cache marked as cuforge's."""
    reports = open_race(str(tmp_path), "cache.db", lambda path: None, RACE_ROUNDS, RACE_PARTIES)
    for report in reports:
        assert report["warnings"] == [], report
        assert report["outcomes"] == [{"opened": True}] * RACE_ROUNDS, report
    for r in range(RACE_ROUNDS):
        db = tmp_path / "data" / str(r) / "cache.db"
        assert ownership.sqlite_application_id(str(db)) == ownership.SQLITE_APPLICATION_ID
        with SQLiteProgramCache(db) as c:
            assert len(c) == RACE_PARTIES, r
        assert sorted(os.listdir(db.parent)) == ["cache.db", "cache.db.lock"], r
