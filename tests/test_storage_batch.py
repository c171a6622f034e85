"""``get_entries``: many entries in one call, on every backend.

It answers what ``get_entry`` answers for each key (same verification, same
counters), and the backends that can batch do: Redis in one round trip, SQLite in
one query, a tier level by level with back-fill.
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from pathlib import Path

import pytest

from _backends import FACTORIES
from cuforge.storage import (
    InMemoryProgramCache,
    SignedProgramCache,
    SQLiteProgramCache,
    TieredProgramCache,
)
from cuforge.storage.entry import CacheEntry, key_digest


@pytest.fixture(params=sorted(FACTORIES))
def cache(request: pytest.FixtureRequest, tmp_path: Path):
    c = FACTORIES[request.param](tmp_path, request)
    yield c
    c.close()


def test_answers_what_get_entry_answers_in_order(cache) -> None:
    stored = {f"k{i}".encode(): (os.urandom(100 + i), f"meta{i}".encode()) for i in range(8)}
    for key, (data, meta) in stored.items():
        cache.set_entry(key, data, meta)
    keys = [b"k3", b"absent", "k0", b"k7", b"k3", b"other"]
    before = cache.stats()
    got = cache.get_entries(keys)
    after = cache.stats()
    assert got == [
        CacheEntry(*stored[b"k3"]),
        None,
        CacheEntry(*stored[b"k0"]),
        CacheEntry(*stored[b"k7"]),
        CacheEntry(*stored[b"k3"]),
        None,
    ]
    assert after.hits - before.hits == 4
    assert after.misses - before.misses == 2
    assert [cache.get_entry(k) for k in keys] == got
    assert cache.get_entries([]) == []
    assert cache.get_entries(iter([b"k1"])) == [CacheEntry(*stored[b"k1"])]


def test_a_bad_key_is_refused_before_any_lookup(cache) -> None:
    cache.set_entry(b"k", b"v")
    before = cache.stats()
    with pytest.raises(TypeError):
        cache.get_entries([b"k", 5])
    assert cache.stats().hits == before.hits


def test_redis_reads_every_key_in_one_round_trip(redis_server) -> None:
    from cuforge.storage.redis import RedisProgramCache

    cache = RedisProgramCache(redis_server.url, prefix="b:")
    for i in range(8):
        cache.set_entry(b"k%d" % i, b"v%d" % i, b"m")
    admin = redis_server.client()
    admin.config_resetstat()
    got = cache.get_entries([b"k%d" % i for i in range(8)] + [b"none"])
    stats = admin.info("commandstats")
    assert got == [CacheEntry(b"v%d" % i, b"m") for i in range(8)] + [None]
    assert stats["cmdstat_mget"]["calls"] == 1
    assert "cmdstat_get" not in stats and "cmdstat_getex" not in stats
    cache.close()


def test_redis_damaged_value_is_a_miss_and_dropped(redis_server) -> None:
    from cuforge.storage.redis import RedisProgramCache

    cache = RedisProgramCache(redis_server.url, prefix="d:")
    cache.set_entry(b"a", b"A" * 64, b"m")
    cache.set_entry(b"b", b"B" * 64, b"m")
    admin = redis_server.client()
    name = next(n for n in admin.keys("d:{*}") if admin.get(n).find(b"B" * 64) >= 0)
    value = bytearray(admin.get(name))
    value[-3] ^= 0x01
    admin.set(name, bytes(value))
    got = cache.get_entries([b"a", b"b"])
    assert got == [CacheEntry(b"A" * 64, b"m"), None]
    assert cache.stats().integrity_failures == 1
    assert admin.get(name) is None
    cache.close()


@pytest.mark.parametrize("ttl", [None, 3600])  # MGET; a pipeline of GETEX
def test_redis_batch_reads_values_cut_before_their_payload_as_get_entry_does(
    redis_server, ttl
) -> None:
    """The small client reads a batch's values cut before the payload (``Frame.cut``),
    so the payload is not copied again: every kind of value -- whole, empty payload,
    large metadata, damaged in its payload, digest or header, a length that does not
    add up, shorter than a header, not a frame at all -- answers what ``get_entry``
    answers it, and the damaged ones are counted and dropped."""
    from cuforge.storage.redis import RedisProgramCache

    kwargs = {} if ttl is None else {"ttl": ttl}
    cache = RedisProgramCache(redis_server.url, prefix="c:", **kwargs)
    good = {b"whole": (os.urandom(40_000), b"m"), b"empty": (b"", b"m"),
            b"bigmeta": (b"p" * 100, b"M" * 9000)}  # fmt: skip
    damages = {
        b"payload": lambda v: v[:-5] + bytes([v[-5] ^ 1]) + v[-4:],
        b"digest": lambda v: v[:30] + bytes([v[30] ^ 1]) + v[31:],
        b"metalen": lambda v: v[:16] + (len(v)).to_bytes(4, "little") + v[20:],
        b"short": lambda v: v[:40],
        b"foreign": lambda v: os.urandom(len(v)),
        b"truncated": lambda v: v[:-1],
    }
    for key, (data, meta) in good.items():
        cache.set_entry(key, data, meta)
    for key in damages:
        cache.set_entry(key, os.urandom(3000), b"m")
    admin = redis_server.client()
    names = {}
    for key in damages:
        name = cache._driver.locate(key_digest(key))[1]  # the key's server name
        names[key] = name
        admin.set(name, damages[key](admin.get(name)))
    keys = [*good, *damages, b"absent"]
    got = cache.get_entries(keys)
    assert got == [CacheEntry(*good[k]) for k in good] + [None] * (len(damages) + 1)
    assert cache.stats().integrity_failures == len(damages)
    assert all(admin.get(names[k]) is None for k in damages)  # dropped as read
    assert [cache.get_entry(k) for k in keys] == got  # one by one: the same answers
    cache.close()


def test_redis_down_is_all_misses_counted_never_an_error(redis_server) -> None:
    from cuforge.storage.redis import RedisProgramCache

    cache = RedisProgramCache(redis_server.url, prefix="x:")
    cache.set_entry(b"a", b"A", b"")
    redis_server.kill()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = cache.get_entries([b"a", b"b", b"c"])
    assert got == [None, None, None]
    assert cache.stats().read_failures == 3
    cache.close()


def test_sqlite_reads_rows_in_one_query_and_drops_a_damaged_one(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    cache = SQLiteProgramCache(db)
    for i in range(4):
        cache.set_entry(b"k%d" % i, b"v%d" % i * 50, b"m")
    cache.close()
    raw = sqlite3.connect(db)
    raw.execute(
        "UPDATE cuforge_entries SET data = ? "
        "WHERE rowid = (SELECT MIN(rowid) FROM cuforge_entries)",
        (b"x" * 100,),
    )
    raw.commit()
    raw.close()
    cache = SQLiteProgramCache(db)
    statements: list[str] = []
    cache._driver._conns.get().set_trace_callback(statements.append)
    got = cache.get_entries([b"k%d" % i for i in range(4)])
    assert sum(e is None for e in got) == 1
    assert [e for e in got if e is not None] == [
        CacheEntry(b"v%d" % i * 50, b"m") for i in range(4) if got[i] is not None
    ]
    assert cache.stats().integrity_failures == 1
    assert sum(s.lstrip().upper().startswith("SELECT") and " IN (" in s for s in statements) == 1
    cache.close()


def test_tier_asks_each_level_for_what_faster_ones_missed_and_back_fills(redis_server) -> None:
    from cuforge.storage.redis import RedisProgramCache

    fast = InMemoryProgramCache()
    slow = RedisProgramCache(redis_server.url, prefix="t:")
    tier = TieredProgramCache(fast, slow)
    fast.set_entry(b"near", b"N", b"m")
    slow.set_entry(b"far1", b"F1", b"m")
    slow.set_entry(b"far2", b"F2", b"m")
    admin = redis_server.client()
    admin.config_resetstat()
    got = tier.get_entries([b"near", b"far1", b"far2", b"none"])
    assert got == [CacheEntry(b"N", b"m"), CacheEntry(b"F1", b"m"), CacheEntry(b"F2", b"m"), None]
    assert admin.info("commandstats")["cmdstat_mget"]["calls"] == 1
    assert fast.get_entry(b"far1") == CacheEntry(b"F1", b"m")  # back-filled
    assert fast.get_entry(b"far2") == CacheEntry(b"F2", b"m")
    stats = tier.stats()
    assert (stats.hits, stats.misses) == (3, 1)
    tier.close()


def test_tier_lookup_entries_writes_the_back_fills_only_when_asked(redis_server) -> None:
    """``lookup_entries`` (what a prefetch pipeline looks up while it writes the batch
    before) answers and counts what ``get_entries`` does, writes nothing until its
    back-fill is called, then exactly what ``get_entries`` would have written."""
    from cuforge.storage.redis import RedisProgramCache

    fast = InMemoryProgramCache()
    slow = RedisProgramCache(redis_server.url, prefix="t:")
    tier = TieredProgramCache(fast, slow)
    fast.set_entry(b"near", b"N", b"m")
    slow.set_entry(b"far", b"F", b"m")
    got, backfill = tier.lookup_entries([b"near", b"far", b"none"])
    assert got == [CacheEntry(b"N", b"m"), CacheEntry(b"F", b"m"), None]
    assert (tier.stats().hits, tier.stats().misses) == (2, 1)
    assert fast.get_entry(b"far", count=False) is None  # nothing written yet
    backfill()
    assert fast.get_entry(b"far", count=False) == CacheEntry(b"F", b"m")
    assert len(fast) == 2  # "none" was stored nowhere
    tier.close()


def test_signed_batch_never_returns_an_entry_of_another_secret(tmp_path: Path) -> None:
    inner = InMemoryProgramCache()
    SignedProgramCache(inner, b"other-secret-0123456789abcdef").set_entry(b"a", b"A", b"m")
    ours = SignedProgramCache(inner, b"our-secret-0123456789abcdefgh")
    ours.set_entry(b"b", b"B", b"m")
    assert ours.get_entries([b"a", b"b"]) == [None, CacheEntry(b"B", b"m")]
    assert ours.stats().signature_failures == 1
