"""FileStreamProgramCache on real files: layout, integrity, failures, eviction, modes."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from cuforge.storage import CacheWriteWarning, FileStreamProgramCache
from cuforge.storage._integrity import SIDECAR_SIZE, SIDECAR_SUFFIX
from cuforge.storage.filestream._sizeindex import SizeLedger

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def entry_files(root: Path) -> tuple[list[Path], list[Path]]:
    files = [p for p in (root / "entries").rglob("*") if p.is_file()]
    return (
        [p for p in files if not p.name.endswith(SIDECAR_SUFFIX)],
        [p for p in files if p.name.endswith(SIDECAR_SUFFIX)],
    )


def payload_path(cache: FileStreamProgramCache, key: str) -> Path:
    return Path(cache._loc(key).payload)


def test_layout_raw_payload_sharded_and_sidecar(tmp_path: Path) -> None:
    data = b"\x7fELF" + os.urandom(1000)
    with FileStreamProgramCache(tmp_path) as c:
        c["k"] = data
        p = payload_path(c, "k")
    assert p.read_bytes() == data  # raw: cuobjdump can read it as is
    assert p.parent.parent == tmp_path / "entries" and len(p.parent.name) == 2
    assert len(p.name) == 62
    side = Path(str(p) + SIDECAR_SUFFIX)
    assert side.stat().st_size == SIDECAR_SIZE
    payloads, sidecars = entry_files(tmp_path)
    assert payloads == [p] and sidecars == [side]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_persists_across_handles_and_overwrite_leaves_one_pair(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        c["k"] = b"one"
        c["k"] = b"two"
    with FileStreamProgramCache(tmp_path) as c:
        assert c["k"] == b"two" and len(c) == 1
    payloads, sidecars = entry_files(tmp_path)
    assert len(payloads) == 1 and len(sidecars) == 1


def test_default_dir_uses_platformdirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    user_cache_path = pytest.importorskip("platformdirs").user_cache_path

    with FileStreamProgramCache() as c:
        want = user_cache_path("cuforge", appauthor=False) / "program-cache"
        assert Path(c.path) == want
        assert want.is_relative_to(tmp_path)


def _corrupt(p: Path, how: str) -> None:
    data = p.read_bytes()
    if how == "truncate":
        p.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        p.write_bytes(b"")
    elif how == "bitflip":
        b = bytearray(data)
        b[len(b) // 3] ^= 0x10
        p.write_bytes(bytes(b))


@pytest.mark.parametrize("how", ["truncate", "empty", "bitflip"])
@pytest.mark.parametrize("which", ["payload", "sidecar"])
def test_corruption_is_a_miss_removes_entry_and_counts(tmp_path: Path, how, which) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        c["k"] = os.urandom(4096)
        c["other"] = b"fine"
        p = payload_path(c, "k")
        _corrupt(p if which == "payload" else Path(str(p) + SIDECAR_SUFFIX), how)
        assert c.get("k") is None
        with pytest.raises(KeyError):
            c["k"]
        assert not p.exists() and not Path(str(p) + SIDECAR_SUFFIX).exists()
        assert c.stats().integrity_failures == 1
        assert c.get("other") == b"fine"
        c["k"] = b"again"  # recovers on the next store
        assert c.get("k") == b"again"


def test_entry_moved_to_another_keys_path_is_not_served(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        c["a"] = b"A" * 100
        c["b"] = b"B" * 100
        pa, pb = payload_path(c, "a"), payload_path(c, "b")
        # payload alone swapped in from another key
        os.replace(pa, pb)
        assert c.get("b") is None and c.get("a") is None
        c["a"] = b"A" * 100
        c["b"] = b"B" * 100
        # both files renamed onto the other key's paths
        os.replace(pa, pb)
        os.replace(str(pa) + SIDECAR_SUFFIX, str(pb) + SIDECAR_SUFFIX)
        assert c.get("b") is None
        assert c.stats().integrity_failures >= 2


def test_read_failure_is_a_miss(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        c["k"] = b"data"
        p = payload_path(c, "k")
        p.unlink()
        p.mkdir()  # EISDIR on read
        assert c.get("k") is None


def _assert_write_failure_tolerated(c: FileStreamProgramCache) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c["k1"] = b"x" * 100  # must not raise
        c["k2"] = b"y" * 100
    relevant = [w for w in caught if issubclass(w.category, CacheWriteWarning)]
    assert len(relevant) == 1  # once per handle
    assert c.stats().write_failures == 2 and c.stats().stores == 0
    assert c.get("k1") is None


def test_write_failure_tmp_is_a_file(tmp_path: Path) -> None:
    c = FileStreamProgramCache(tmp_path)
    (tmp_path / "tmp").rmdir()
    (tmp_path / "tmp").write_bytes(b"not a dir")
    _assert_write_failure_tolerated(c)
    c.close()


@pytest.mark.skipif(IS_ROOT or os.name == "nt", reason="root ignores directory permissions")
def test_write_failure_read_only_dir(tmp_path: Path) -> None:
    c = FileStreamProgramCache(tmp_path)
    c["seed"] = b"s"
    for d in (tmp_path / "tmp", tmp_path / "entries"):
        d.chmod(0o555)
    try:
        _assert_write_failure_tolerated(c)
        assert c.get("seed") == b"s"
    finally:
        for d in (tmp_path / "tmp", tmp_path / "entries"):
            d.chmod(0o755)
        c.close()


@pytest.mark.skipif(os.name == "nt", reason="RLIMIT_FSIZE is POSIX")
def test_write_failure_efbig_in_subprocess(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import resource, signal, warnings
        from cuforge.storage import FileStreamProgramCache, CacheWriteWarning
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        c = FileStreamProgramCache({str(tmp_path)!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c["big"] = b"x" * 5000
        assert any(issubclass(x.category, CacheWriteWarning) for x in w), w
        assert "File too large" in str(w[0].message) or "27" in str(w[0].message)
        assert c.stats().write_failures == 1 and c.get("big") is None
        c["small"] = b"y" * 100
        assert c.get("small") == b"y" * 100
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_tmp_dir_recreated_after_deletion(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        (tmp_path / "tmp").rmdir()
        c["k"] = b"v"
        assert c.get("k") == b"v" and (tmp_path / "tmp").is_dir()
        assert c.stats().write_failures == 0


def test_stale_temp_files_swept_on_open_and_eviction(tmp_path: Path) -> None:
    FileStreamProgramCache(tmp_path).close()
    tmp = tmp_path / "tmp"
    # Temps as writers name them (an older layout's <pid>-<tag>-<n>.tmp): a name no
    # writer makes is a user's and is never swept (test_storage_ownership_fs).
    old, fresh = tmp / "4242-0badcafe-0.tmp", tmp / "4242-0badcafe-1.tmp"
    old.write_bytes(b"x" * 10)
    fresh.write_bytes(b"y" * 10)
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    c = FileStreamProgramCache(tmp_path, max_size_bytes=3000)
    assert not old.exists() and fresh.exists()
    old.write_bytes(b"x")
    os.utime(old, (two_hours_ago, two_hours_ago))
    for i in range(10):
        c[str(i)] = b"z" * 500  # crosses the cap: eviction sweeps too
    assert not old.exists() and fresh.exists()
    c.close()


def test_atime_lru_promotes_recently_read(tmp_path: Path) -> None:
    entry = 1000 + SIDECAR_SIZE
    c = FileStreamProgramCache(tmp_path, max_size_bytes=4 * entry)
    for k in "abcd":
        c[k] = k.encode() * 1000
    past = time.time() - 1000
    for i, k in enumerate("abcd"):  # age them: a oldest
        os.utime(payload_path(c, k), (past + i, past + i))
    assert c.get("a")  # promotes a explicitly, whatever the mount options
    assert payload_path(c, "a").stat().st_atime > past + 100
    c["e"] = b"e" * 1000  # over the cap: evicts down to 90%, oldest read first
    assert c.get("b") is None and c.get("c") is None
    assert c.get("a") and c.get("d") and c.get("e")
    assert c.stats().evictions == 2
    c.close()


def test_an_entry_stored_just_after_reads_is_not_the_first_evicted(tmp_path: Path) -> None:
    # A hit stamps its entry's atime with the clock; a new file takes the kernel's
    # coarser time, up to a tick behind it. Stored right after hits, into a full cache,
    # the new entry looked least recently used and its own write evicted it.
    entry = 1000 + SIDECAR_SIZE
    for attempt in range(20):
        root = tmp_path / str(attempt)
        with FileStreamProgramCache(root, max_size_bytes=4 * entry) as c:
            for k in "abcd":
                c[k] = k.encode() * 1000
        with FileStreamProgramCache(root, max_size_bytes=4 * entry) as c:  # bumps each
            before = time.time_ns()
            assert all(c.get(k) for k in "abcd")  # read just now, a first
            c["e"] = b"e" * 1000  # over the cap: evicts down to 90%
            new = payload_path(c, "e")
            assert new.exists(), f"attempt {attempt}: the entry just stored was evicted first"
            assert new.stat().st_atime_ns >= before
            assert c.get("e") == b"e" * 1000
            assert c.get("a") is None and c.get("b") is None  # the least recently read
            assert c.stats().evictions == 2


def test_a_file_system_refusing_explicit_times_still_stores(tmp_path: Path, monkeypatch) -> None:
    # Some network and FUSE mounts refuse utime with explicit times; the write's stamp
    # is best effort and must not turn every store into a write failure.
    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "utime", refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWriteWarning)
        with FileStreamProgramCache(tmp_path) as c:
            c["k"] = b"v"
            assert c.get("k") == b"v"
            assert c.stats().write_failures == 0


def test_atime_bump_keeps_mtime(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        c["k"] = b"v"
        p = payload_path(c, "k")
        os.utime(p, ns=(1, 2_000_000_000))
        c.get("k")
        st = p.stat()
        assert st.st_mtime_ns == 2_000_000_000 and st.st_atime_ns > 1


def test_cap_holds_and_writes_do_not_scan(tmp_path: Path, monkeypatch) -> None:
    cap = 20_000
    c = FileStreamProgramCache(tmp_path, max_size_bytes=cap)
    scans = 0
    real = c._driver._scan

    def counting(now_ns: int):
        nonlocal scans
        scans += 1
        return real(now_ns)

    monkeypatch.setattr(c._driver, "_scan", counting)
    for i in range(400):
        c[str(i)] = os.urandom(500)
    payloads, sidecars = entry_files(tmp_path)
    on_disk = sum(p.stat().st_size for p in payloads + sidecars)
    assert on_disk <= cap
    assert abs(c.size_bytes - on_disk) <= 600
    # ~10% of the cap is freed per scan: a scan per ~3-4 writes here, never per write
    assert 0 < scans <= 400 // 3
    c.close()


def test_open_does_not_scan_entries(tmp_path: Path, monkeypatch) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        for i in range(50):
            c[str(i)] = b"x"
    import cuforge.storage.filestream._evict as fsevict  # every scan of a handle goes through it

    monkeypatch.setattr(fsevict, "scan_entries", lambda *a: pytest.fail("open scanned"))
    with FileStreamProgramCache(tmp_path, max_size_bytes=10**6) as c:
        assert c.get("3") == b"x"


def test_ledger_seeded_by_scan_when_missing(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        for i in range(10):
            c[str(i)] = b"x" * 100
        expected = c.size_bytes
    (tmp_path / "size.ledger").unlink()
    with FileStreamProgramCache(tmp_path) as c:
        assert c.size_bytes == expected == 10 * (100 + SIDECAR_SIZE)


def test_size_tracker_clamps_at_zero(tmp_path: Path) -> None:
    ledger = SizeLedger(str(tmp_path / "ledger"), None, lambda: 100)
    assert ledger.total() == 100
    assert ledger.add(-10_000) == 0  # e.g. a delete racing an eviction's reseed
    assert ledger.reconcile(total_at_scan=500, scanned=0) == 0
    assert ledger.add(50) == 50
    ledger.close()
    # and through the cache: a delete after a reseed that already excluded it
    with FileStreamProgramCache(tmp_path / "c", max_size_bytes=10_000) as c:
        c["k"] = b"x" * 100
        c._driver._ledger.reconcile(c._driver._ledger.total(), 0)
        del c["k"]
        assert c.size_bytes == 0
        for i in range(30):
            c[str(i)] = b"y" * 500
        assert c.size_bytes <= 10_000  # eviction still works


def test_clear_removes_everything_and_resets_size(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        for i in range(20):
            c[str(i)] = b"x" * 10
        c.clear()
        assert len(c) == 0 and c.size_bytes == 0
        assert entry_files(tmp_path) == ([], [])


def test_closed_handle_refuses_operations(tmp_path: Path) -> None:
    c = FileStreamProgramCache(tmp_path)
    c.close()
    c.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        c.get("k")
    with pytest.raises(ValueError, match="closed"):
        c["k"] = b"v"


@pytest.mark.parametrize("bad", [0o777 + 0o10000, 0o070, -1])
def test_mode_validation(tmp_path: Path, bad) -> None:
    with pytest.raises(ValueError, match="mode"):
        FileStreamProgramCache(tmp_path, mode=bad)


@pytest.mark.skipif(os.name == "nt", reason="POSIX permissions")
def test_mode_gives_group_shared_dirs_and_files_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        root = tmp_path / "shared"
        with FileStreamProgramCache(root, mode=0o2770, max_size_bytes=10**6) as c:
            c["k"] = b"v"
            with c.lock("k") as held:
                assert held
            c.total_stats()
            payload = payload_path(c, "k")
    finally:
        os.umask(old)
    for d in [root, root / "entries", root / "tmp", payload.parent]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o2770, d
    for f in [payload, Path(str(payload) + SIDECAR_SUFFIX), root / "size.ledger"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o660, f


def test_stats_persist_across_processes(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        from cuforge.storage import FileStreamProgramCache
        c = FileStreamProgramCache({str(tmp_path)!r})
        c["k"] = b"v" * 10
        c.get("k"); c.get("missing")
        c.close()
        """
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], check=True)
    with FileStreamProgramCache(tmp_path) as c:
        c.get("k")
        total = c.total_stats()
    assert (total.stores, total.hits, total.misses) == (2, 3, 2)
    assert total.bytes_written == 20 and total.bytes_read == 30
    # closed handles were folded into one record: the directory does not grow
    assert sorted(p.name for p in (tmp_path / "stats").iterdir()) == ["merge.lock", "merged"]


def test_stats_of_killed_process_are_kept_up_to_last_flush(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os, signal
        from cuforge.storage import FileStreamProgramCache
        c = FileStreamProgramCache({str(tmp_path)!r})
        c["k"] = b"v"
        c.total_stats()  # flushes
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=False)
    with FileStreamProgramCache(tmp_path) as c:
        assert c.total_stats().stores == 1
    with FileStreamProgramCache(tmp_path) as c:
        assert c.total_stats().stores == 1  # folded once, not double counted


def _scanned_total(c: FileStreamProgramCache) -> int:
    return c._driver._scan_total()


def test_a_held_size_ledger_lock_never_stalls_open_or_store(tmp_path: Path) -> None:
    """Another process holds flock on size.ledger for good: opening, storing and
    reading each return within a fraction of a second (they waited forever, and a
    store the whole time the lock was held); the deltas are applied once it lets go."""
    from _lockholder import holding_flock

    root = tmp_path / "c"
    with FileStreamProgramCache(root, max_size_bytes=1 << 20) as c:
        c["before"] = b"b" * 100
    slowest = 0.0
    with holding_flock(root / "size.ledger"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = time.monotonic()
        c = FileStreamProgramCache(root, max_size_bytes=1 << 20)
        slowest = time.monotonic() - t
        for i in range(5):
            t = time.monotonic()
            c[f"k{i}"] = b"x" * 1000
            assert c.get(f"k{i}") == b"x" * 1000 and c.get("before") == b"b" * 100
            slowest = max(slowest, time.monotonic() - t)
        held_stats = c.stats()
    assert slowest < 3.0, slowest  # bound 0.25 s; 3 s leaves room for a loaded machine
    assert held_stats.stores == 5 and held_stats.write_failures == 0, held_stats
    assert held_stats.lock_timeouts >= 1, held_stats
    lock_warnings = [w for w in caught if issubclass(w.category, CacheWriteWarning)]
    assert len(lock_warnings) == 1 and "size.ledger" in str(lock_warnings[0].message)
    c["after"] = b"y" * 10
    assert c.size_bytes == _scanned_total(c)  # nothing the holder delayed is lost
    c.close()


def test_a_held_evict_lock_defers_eviction_without_stalling_writes(tmp_path: Path) -> None:
    """evict.lock held by another process: writes over the cap return within the bound
    (each waited 30 s), eviction is deferred and counted, and runs once it lets go."""
    from _lockholder import holding_flock

    root = tmp_path / "c"
    cap = 20_000
    with FileStreamProgramCache(root, max_size_bytes=cap) as c:
        slowest = 0.0
        with holding_flock(root / "evict.lock"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(12):
                t = time.monotonic()
                c[f"k{i}"] = b"x" * 3000
                slowest = max(slowest, time.monotonic() - t)
            during = c.stats()
            over = c.size_bytes
        assert slowest < 3.0, slowest
        assert during.evictions == 0 and during.lock_timeouts >= 1, during
        assert over > cap
        assert len([w for w in caught if issubclass(w.category, CacheWriteWarning)]) == 1
        c["last"] = b"z" * 3000
        assert c.stats().evictions > 0 and c.size_bytes <= cap


def _within(seconds: float, fn, unblock=None):
    """``fn()`` run in a daemon thread; its result, or AssertionError if it is still
    running after ``seconds`` (then ``unblock()`` frees it)."""
    import threading

    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        if unblock is not None:
            unblock()
        t.join(5)
        raise AssertionError(f"still blocked after {seconds} s")
    return out[0]


def _plant(path: Path, what: str) -> None:
    if path.exists():
        path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
        (path / "inside").write_bytes(b"x")


def _unblock_fifo(path: Path):
    def go() -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    return go


@pytest.mark.parametrize("what", ["fifo", "directory"])
@pytest.mark.parametrize("where", ["payload", "sidecar"])
def test_a_foreign_object_in_place_of_an_entry_file(tmp_path: Path, where, what) -> None:
    """A FIFO made get() hang for good (it was opened for reading); a directory made the
    key unstorable for good (set ok, get None). Now: a miss at once, the object is
    removed, and the key is stored and served again."""
    with FileStreamProgramCache(tmp_path / "c") as c:
        c["k"] = b"v1"
        names = c._loc("k")
        planted = Path(names.payload if where == "payload" else names.sidecar)
        _plant(planted, what)
        assert _within(5, lambda: c.get("k"), _unblock_fifo(planted)) is None
        c["k"] = b"v2"
        assert c.get("k") == b"v2"
        assert planted.is_file()


def test_a_file_in_place_of_a_shard_directory(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path / "c") as c:
        names = c._loc("k")
        shard = tmp_path / "c" / "entries" / names.shard
        shard.write_bytes(b"not a directory")
        assert c.get("k") is None
        c["k"] = b"v"  # was a write failure for good: ENOTDIR
        assert c.get("k") == b"v" and c.stats().write_failures == 0


def test_a_shard_replaced_by_a_symlink_after_open_is_never_followed(tmp_path: Path) -> None:
    """The no-link rule held only at open: a shard re-pointed outside the root later
    served the outside bytes (and a delete followed it)."""
    import shutil

    outside = tmp_path / "outside"
    with FileStreamProgramCache(tmp_path / "c") as c:
        c["k"] = b"mine"
        names = c._loc("k")
        shard = Path(names.payload).parent
        shutil.copytree(shard, outside)  # a verified-looking pair, elsewhere
        planted = tmp_path / "planted"
        with FileStreamProgramCache(planted) as other:
            other["k"] = b"theirs"
        shutil.rmtree(outside)
        shutil.copytree(Path(other._loc("k").payload).parent, outside)
        shutil.rmtree(shard)
        shard.symlink_to(outside, target_is_directory=True)
        c._driver._memo.clear()
        assert c.get("k") is None  # not b"theirs"
        with pytest.raises(KeyError):
            del c["k"]
        assert sorted(p.name for p in outside.iterdir()) == sorted(
            [Path(names.payload).name, Path(names.sidecar).name]
        )  # nothing outside was deleted
        c["k"] = b"again"
        assert c.get("k") == b"again"
        assert sorted(p.name for p in outside.iterdir()) == sorted(
            [Path(names.payload).name, Path(names.sidecar).name]
        )


def test_temps_of_killed_writers_are_reclaimed_at_once_and_evict_nothing(tmp_path: Path) -> None:
    """Killed writers' temps counted as live for an hour: under a 20 MB cap they pushed
    live entries out (and reopening kept them). Now the next open removes them."""
    from _deadwriters import kill_writers_mid_write

    root, mb = tmp_path / "c", 1 << 20
    cap = 20 * mb
    with FileStreamProgramCache(root, max_size_bytes=cap) as c:
        for i in range(3):
            c[f"live{i}"] = bytes([i]) * 4 * mb
    kill_writers_mid_write(root, cap, 6, 4 * mb)  # up to 12 MB of dead writers' temps
    # (each writer's open already reclaims those of the writers killed before it)
    assert len([p for p in (root / "tmp").iterdir() if p.name.endswith(".tmp")]) >= 1
    with FileStreamProgramCache(root, max_size_bytes=cap) as c:
        assert [p.name for p in (root / "tmp").iterdir() if p.name.endswith(".tmp")] == []
        c["live3"] = b"\x03" * 4 * mb  # 16 MB of entries: under the cap, nothing evicted
        assert [c.get(f"live{i}") for i in range(4)] == [bytes([i]) * 4 * mb for i in range(4)]
        assert c.stats().evictions == 0 and c.size_bytes == c._driver._scan_total()
    assert sorted(p.name for p in (root / "tmp").iterdir()) == []  # nothing of ours left


def test_a_live_writers_temps_and_alive_file_are_never_swept(tmp_path: Path) -> None:
    from cuforge.storage.filestream._atomicwrite import sweep_temps

    root = tmp_path / "c"
    with FileStreamProgramCache(root) as c:
        c["k"] = b"v"  # this handle's writer now holds its .alive file
        tmp = root / "tmp"
        alive = [p for p in tmp.iterdir() if p.name.endswith(".alive")]
        assert len(alive) == 1
        temp = tmp / (alive[0].name[: -len(".alive")] + ".99.tmp")
        temp.write_bytes(b"in flight")
        swept = sweep_temps(str(tmp), time.time_ns(), 3600 * 10**9, owned=True)
        assert swept == len(b"in flight")
        assert temp.exists() and alive[0].exists()
        temp.unlink()


def test_a_fifo_among_the_stats_records_never_blocks_the_totals(tmp_path: Path) -> None:
    """A FIFO named like a counter record (or the merged record) was opened for
    reading by total_stats(), which `cuforge cache stats` calls: it hung for good."""
    root = tmp_path / "c"
    with FileStreamProgramCache(root) as c:
        c["k"] = b"v"
        assert c.get("k") == b"v"
    os.mkfifo(root / "stats" / "someone-4242-0badcafe.cnt")
    if not (root / "stats" / "merged").exists():
        os.mkfifo(root / "stats" / "merged")
    with FileStreamProgramCache(root) as c:
        totals = _within(
            5, c.total_stats, _unblock_fifo(root / "stats" / "someone-4242-0badcafe.cnt")
        )
    assert totals.stores == 1 and totals.hits == 1


@pytest.mark.parametrize("name", ["size.ledger", "size.ledger.users"])
def test_a_fifo_in_place_of_the_ledger_is_replaced_and_the_cap_holds(tmp_path: Path, name) -> None:
    """A FIFO at size.ledger made the ledger unusable (pread: ESPIPE): the handle ran
    with no size accounting at all, so the cap was never enforced."""
    root = tmp_path / "c"
    FileStreamProgramCache(root).close()
    (root / name).unlink()
    os.mkfifo(root / name)
    with FileStreamProgramCache(root, max_size_bytes=10_000) as c:
        for i in range(30):
            c[f"k{i}"] = b"x" * 1000
        assert c.stats().evictions > 0 and c._driver._scan_total() <= 10_000
    assert (root / name).is_file()


def test_a_cap_set_in_python_is_kept_by_the_cache_for_openers_that_pass_none(tmp_path):
    """``FileStreamProgramCache(max_size_bytes=2 << 30)`` (the README) and then
    ``cuforge cache stats`` said "(no cap set)": the cap is now the cache's."""

    from _cli import isolated_env, run

    with FileStreamProgramCache(tmp_path / "c", max_size_bytes=2 << 30) as first:
        assert first.max_size_bytes == 2 << 30
    with FileStreamProgramCache(tmp_path / "c") as later:  # passes none: uses the cache's
        assert later.max_size_bytes == 2 << 30
    stats = run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c"))
    assert "of 2.0 GiB cap" in stats.stdout, stats.stdout
    # a later explicit cap replaces it, for this handle and the next (another process)
    with FileStreamProgramCache(tmp_path / "c", max_size_bytes=1000) as smaller:
        assert smaller.max_size_bytes == 1000
        smaller[b"big"] = b"x" * 2000  # over the cap: not kept
    code = "from cuforge.storage import FileStreamProgramCache as F; import sys\n"
    code += "c = F(sys.argv[1]); c[b'k'] = b'y' * 2000; print(c.max_size_bytes, c.get(b'k'))"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True,
                         text=True, env=isolated_env(tmp_path), check=True)  # fmt: skip
    assert out.stdout.split() == ["1000", "None"]  # enforced by an opener that passed none
    # a cap file that is not ours (or damaged) reads as no cap, never as a failure
    (tmp_path / "c" / "cap").write_text("lots\n")
    with FileStreamProgramCache(tmp_path / "c") as damaged:
        assert damaged.max_size_bytes is None
