"""TieredProgramCache: read-through with backfill, write-through, read-only levels,
isolated failures, the widest level's lock, and tier URLs."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from _cache_workers import ARCH, SRC
from cuforge.compile import Program, ProgramOptions, _nvrtc
from cuforge.storage import (
    CacheReadWarning,
    CacheWriteWarning,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    TieredProgramCache,
    entry_id,
)
from cuforge.storage.entry import CacheEntry
from cuforge.storage.redis import RedisProgramCache
from cuforge.storage.stats import CacheStats
from cuforge.utils import open_cache


class Broken(ProgramCacheResource):
    """A third-party backend whose every call fails (a real failure mode, not a mock:
    backends are allowed to raise, and the tier must isolate them)."""

    def _fail(self, *args, **kwargs):
        raise OSError("backend is broken")

    __getitem__ = __setitem__ = __delitem__ = get_entry = set_entry = _fail
    iter_entries = check_entry = read_entry = remove_entry = lock = _fail

    def __len__(self) -> int:
        return self._fail()

    def clear(self) -> None:
        self._fail()


def test_a_hit_in_a_slower_level_backfills_the_faster_ones(tmp_path: Path) -> None:
    mem, fs = InMemoryProgramCache(), FileStreamProgramCache(tmp_path)
    fs.set_entry(b"k", b"payload", b"meta")
    with TieredProgramCache(mem, fs) as tier:
        assert tier.get_entry(b"k") == CacheEntry(b"payload", b"meta")
        assert mem.get_entry(b"k") == CacheEntry(b"payload", b"meta")  # backfilled
        fs.clear()
        assert tier.get(b"k") == b"payload"  # now served by memory
        assert [s.hits for s in tier.level_stats()] == [2, 1]
        s = tier.stats()
        assert (s.hits, s.misses) == (2, 0)
        assert tier.get(b"absent") is None and tier.stats().misses == 1


def test_writes_go_to_every_writable_level_and_never_to_read_only_ones(tmp_path: Path) -> None:
    mem = InMemoryProgramCache()
    local = FileStreamProgramCache(tmp_path / "local")
    ci = FileStreamProgramCache(tmp_path / "ci")
    ci.set_entry(b"from-ci", b"built by CI", b"m")
    with TieredProgramCache(mem, local, ci, read_only=[ci]) as tier:
        assert tier.read_only == (2,)
        tier[b"new"] = b"compiled here"
        assert mem.get(b"new") == local.get(b"new") == b"compiled here"
        assert ci.get(b"new") is None
        assert tier.get(b"from-ci") == b"built by CI"
        assert local.get(b"from-ci") == b"built by CI"  # backfilled below the CI level
        del tier[b"from-ci"]
        tier.clear()
        assert tier.remove_entry(entry_id(b"from-ci")) is False
        assert ci.get_entry(b"from-ci") == CacheEntry(b"built by CI", b"m")  # untouched
        assert mem.get(b"new") is None and local.get(b"new") is None
        assert len(tier) == 1  # what is left: the CI level's entry


def test_only_read_only_levels_store_nothing_and_count_it(tmp_path: Path) -> None:
    fs = FileStreamProgramCache(tmp_path)
    with TieredProgramCache(fs, read_only=[0]) as tier:
        tier[b"k"] = b"v"
        assert fs.get(b"k") is None and tier.stats().write_failures == 1
        with tier.lock(b"k", timeout=1) as held:
            assert held  # this process's threads still single-flight


def test_a_failing_level_never_hides_the_others(tmp_path: Path) -> None:
    fs = FileStreamProgramCache(tmp_path)
    fs[b"k"] = b"on disk"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tier = TieredProgramCache(InMemoryProgramCache(), Broken(), fs)
        assert tier.get(b"k") == b"on disk"
        tier[b"k2"] = b"v2"
        assert fs.get(b"k2") == b"v2"
        assert tier.get(b"k2") == b"v2"  # the memory level was written too
    # once per handle; the first failure was a lookup: a read warning at this line
    (warned,) = [w for w in caught if w.category in (CacheReadWarning, CacheWriteWarning)]
    assert warned.category is CacheReadWarning and warned.filename == __file__
    s = tier.stats()
    assert s.read_failures == 1 and s.write_failures >= 2
    tier.close()


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_a_dead_redis_never_hides_the_local_disk(redis_server, tmp_path: Path) -> None:
    url = f"memory://,file://{tmp_path / 'fs'},{redis_server.url}?timeout=200ms"
    with open_cache(url) as tier:
        tier[b"k"] = b"everywhere"
    redis_server.kill()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWriteWarning)
        with open_cache(url) as tier:  # a new process would start with empty memory
            assert tier.get(b"k") == b"everywhere"  # from the disk
            tier[b"k2"] = b"stored locally"
            assert tier.get(b"k2") == b"stored locally"
        # The Redis level (lazy: behind the disk) got the store deferred, and close()
        # wrote it: the failure is counted by the Redis level.
        assert tier.stats().write_failures == 1


def test_single_flight_uses_the_widest_writable_levels_lock(redis_server, tmp_path) -> None:
    raw = redis_server.client()
    redis = RedisProgramCache(redis_server.url)
    ci = FileStreamProgramCache(tmp_path / "ci")
    with TieredProgramCache(InMemoryProgramCache(), redis, ci, read_only=[2]) as tier:
        with tier.lock(b"k") as held:
            assert held
            assert raw.exists(f"cuforge:{{{entry_id(b'k')}}}:lock".encode())
        assert not raw.keys("*:lock")


def test_a_compile_through_a_tier_counts_one_miss_per_level(redis_server, monkeypatch) -> None:
    real = _nvrtc.compile_cpp
    count = [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_nvrtc, "compile_cpp", counted)
    mem = InMemoryProgramCache()
    redis = RedisProgramCache(redis_server.url)
    with TieredProgramCache(mem, redis) as tier:
        for _ in range(3):
            Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=tier)
        assert count[0] == 1
        assert (tier.stats().misses, tier.stats().hits, tier.stats().stores) == (1, 2, 1)
        assert [(s.misses, s.hits, s.stores) for s in tier.level_stats()] == [
            (1, 2, 1),
            (1, 0, 1),
        ]
        assert tier.total_stats().stores == 1  # the fleet's view: the Redis level


def test_listing_checking_and_reading_across_levels(tmp_path: Path) -> None:
    mem, fs = InMemoryProgramCache(), FileStreamProgramCache(tmp_path)
    fs.set_entry(b"a", b"in fs", b"ma")
    mem.set_entry(b"b", b"in memory", b"mb")
    with TieredProgramCache(mem, fs) as tier:
        listed = {e.id: e.meta for e in tier.iter_entries()}
        assert listed == {entry_id(b"a"): b"ma", entry_id(b"b"): b"mb"}
        assert tier.read_entry(entry_id(b"a")) == CacheEntry(b"in fs", b"ma")
        assert tier.check_entry(entry_id(b"a")) is None
        sidecar = tmp_path / "entries" / entry_id(b"a")[:2] / (entry_id(b"a")[2:] + ".cfsum")
        raw = bytearray(sidecar.read_bytes())
        raw[-1] ^= 1
        sidecar.write_bytes(bytes(raw))
        assert tier.check_entry(entry_id(b"a")).startswith("level 1 (FileStreamProgramCache)")
        with pytest.raises(KeyError):
            tier.check_entry(entry_id(b"nothing"))


def test_constructor_errors_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one level"):
        TieredProgramCache()
    with pytest.raises(TypeError, match="level 1"):
        TieredProgramCache(InMemoryProgramCache(), {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="read_only index 2"):
        TieredProgramCache(InMemoryProgramCache(), InMemoryProgramCache(), read_only=[2])
    with pytest.raises(ValueError, match="not one of the levels"):
        TieredProgramCache(InMemoryProgramCache(), read_only=[InMemoryProgramCache()])


def test_tier_urls_open_levels_in_order_with_read_only_ones(redis_server, tmp_path) -> None:
    url = f"memory://?max_size=1M,file://{tmp_path / 'a'},{redis_server.url}&ro"
    # `&ro` after the Redis URL's path has no `?`: spell it properly. The Redis level
    # is lazy (behind the file level), but its URL is checked when the tier opens.
    with pytest.raises(ValueError, match="database"), open_cache(url) as tier:
        tier.levels  # noqa: B018 - opens every level
    url = f"memory://?max_size=1M,file://{tmp_path / 'a'},{redis_server.url}?ro&prefix=ci:"
    with open_cache(url) as tier:
        assert isinstance(tier, TieredProgramCache)
        kinds = [type(level).__name__ for level in tier.levels]
        assert kinds == ["InMemoryProgramCache", "FileStreamProgramCache", "RedisProgramCache"]
        assert tier.read_only == (2,) and tier.levels[2].prefix == "ci:"
    with open_cache(f"file://{tmp_path / 'b'}?ro") as single:  # one read-only level
        assert isinstance(single, TieredProgramCache) and single.read_only == (0,)


def test_zero_stats_restarts_the_tier_and_every_writable_level(redis_server, tmp_path) -> None:
    mem, fs = InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "fs")
    redis = RedisProgramCache(redis_server.url, stats_every=1000)
    with TieredProgramCache(mem, fs, redis) as tier:
        tier.set_entry(b"k", b"payload", b"meta")
        assert tier.get(b"k") == b"payload" and tier.get(b"absent") is None
        assert fs.total_stats().stores == 1 and tier.total_stats().misses == 1
        tier.zero_stats()
        assert tier.stats() == CacheStats()  # own counters; no level counted a failure
        assert mem.stats() == CacheStats()
        assert fs.total_stats() == CacheStats()  # every process's, as its zero_stats() does
        assert tier.total_stats() == CacheStats()  # the Redis fleet's
        assert tier.get(b"absent") is None  # counted once at every level afterwards
        assert (tier.stats().misses, mem.stats().misses) == (1, 1)
        assert (fs.total_stats().misses, tier.total_stats().misses) == (1, 1)
        assert tier.get(b"k") == b"payload" and tier.stats().hits == 1


def test_zero_stats_leaves_read_only_levels_alone(redis_server, tmp_path) -> None:
    shared = RedisProgramCache(redis_server.url)
    shared[b"k"] = b"v"
    shared.close()  # its counters are the fleet's now
    ro_redis = RedisProgramCache(redis_server.url, read_only=True)
    mem = InMemoryProgramCache()
    with TieredProgramCache(mem, ro_redis, read_only=[1]) as tier:
        assert tier.get(b"k") == b"v"
        with pytest.raises(PermissionError, match=r"level 1 \(RedisProgramCache\) is read-only"):
            tier.zero_stats()  # total_stats() reports the read-only level: nothing reset
        assert (tier.stats().hits, mem.stats().stores) == (1, 1)
        assert tier.total_stats().stores == 1
    ci = FileStreamProgramCache(tmp_path / "ci")
    ci[b"k"] = b"from ci"
    ci_totals = ci.total_stats()
    fs = FileStreamProgramCache(tmp_path / "local")
    with TieredProgramCache(ci, fs, read_only=[0]) as tier:
        assert tier.get(b"k") == b"from ci"
        tier.zero_stats()  # the widest level is writable: the read-only one is skipped
        assert fs.total_stats() == CacheStats() and tier.stats() == CacheStats()
        assert ci.total_stats().stores == ci_totals.stores == 1
        assert ci.total_stats().hits == 1


def test_zero_stats_resets_every_level_it_can_and_names_one_that_cannot(tmp_path) -> None:
    mem, fs = InMemoryProgramCache(), FileStreamProgramCache(tmp_path)
    with TieredProgramCache(mem, Broken(), fs) as tier:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWriteWarning)
            tier[b"k"] = b"v"
        with pytest.raises(NotImplementedError, match=r"level 1 \(Broken\): Broken cannot"):
            tier.zero_stats()
        assert mem.stats() == CacheStats() and fs.total_stats() == CacheStats()
        assert tier.stats() == CacheStats()


def test_a_value_larger_than_a_levels_cap_is_kept_by_the_levels_that_can(tmp_path: Path) -> None:
    """The memory level refuses a value larger than its cap (it used to evict every
    entry it held, then the value); the file level keeps it, so the tier stored it and
    notes the level's drop. A value larger than every cap is no store of the tier."""
    from cuforge.storage import events

    mem = InMemoryProgramCache(max_size_bytes=1000)
    with FileStreamProgramCache(tmp_path / "c", max_size_bytes=10_000) as fs:
        tier = TieredProgramCache(mem, fs)
        tier[b"small"] = b"s" * 100
        events.take_dropped()
        tier[b"mid"] = b"m" * 5000
        assert events.take_dropped() == (events.TOO_LARGE, "5000 bytes, cap 1000")
        assert mem.get(b"small") == b"s" * 100 and mem.stats().evictions == 0
        assert fs.get(b"mid") == b"m" * 5000 and tier.stats().stores == 2
        tier[b"huge"] = b"h" * 20_000
        assert events.take_dropped() is not None
        stats = tier.stats()
        assert (stats.stores, stats.write_failures, stats.evictions) == (2, 3, 0), stats
        assert tier.get(b"huge") is None and tier.get(b"small") == b"s" * 100


def test_a_stores_outcome_says_what_each_level_did(tmp_path: Path) -> None:
    """A tier said "stored" when one level took the entry, and no more: the CLI could
    not tell a file level that held it from a Redis level that was down (issue 36)."""
    from cuforge.storage.outcome import FAILED, READ_ONLY, STORED

    mem, fs = InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "fs")
    ci = FileStreamProgramCache(tmp_path / "ci")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWriteWarning)
        with TieredProgramCache(mem, Broken(), fs, ci, read_only=[ci]) as tier:
            outcome = tier.set_entry(b"k", b"v", b"m")
            assert outcome.stored and outcome.stored_levels() == (0, 2), outcome
            reasons = [level.reason for level in outcome.levels]
            assert reasons == [STORED, FAILED, STORED, READ_ONLY]
            assert outcome.levels[1].detail == "OSError: backend is broken"
            why = "not stored in level 1 (Broken) failed: OSError: backend is broken"
            assert outcome.detail == why
            assert fs.get(b"k") == b"v" and ci.get(b"k") is None
            none = TieredProgramCache(Broken(), ci, read_only=[1]).set_entry(b"k2", b"v")
            assert not none.stored and none.reason == FAILED and none.stored_levels() == ()
            assert [level.reason for level in none.levels] == [FAILED, READ_ONLY]
    alone = InMemoryProgramCache().set_entry(b"k", b"v")
    assert alone.stored and alone.levels == ()  # one level: the outcome is its own
