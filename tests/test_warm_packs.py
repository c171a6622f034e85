"""Warm-set packs (cuforge.integrations.warmpacks): built when a set is published with
``replace=True``, stored in the shared levels only, and prefetched in a few requests
from a real redis-server and a real SeaweedFS S3 into a real directory level --
landing exactly what the per-key prefetch lands; a damaged, missing or unsigned
chunk is a warning and a fallback to the per-key way, never a wrong entry."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cuforge.integrations import warmpacks, warmsets
from cuforge.storage.base import CacheReadWarning
from cuforge.storage.entry import entry_id
from cuforge.storage.record import encode_record
from cuforge.storage.urls import open_cache

PROGRAM = encode_record("program", {"name": "warm-pack-test"})
MANIFEST = encode_record("manifest", {"name": "warm-pack-test", "variants": []})
SECRET = "p" * 32


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 64 KiB: a test's few hundred KiB make several chunks."""
    monkeypatch.setattr(warmpacks, "CHUNK_BYTES", 64 << 10)
    warmpacks._incomplete.clear()


def _fill(url: str, n: int, tag: str = "e", size: int = 4096) -> dict[bytes, bytes]:
    data = {f"warm-pack-test\0{tag}{i}".encode(): os.urandom(size) for i in range(n)}
    with open_cache(url) as cache:
        cache.set_entries([(k, v, PROGRAM) for k, v in data.items()])
    return data


def _publish(url: str, keys: Any, *, replace: bool = True) -> warmsets.Listed:
    with open_cache(url) as cache:
        warmsets.publish(cache, "job", keys, replace=replace)
        found = warmsets.load_set(cache, "job")
    assert found is not None
    return found


def _prefetch(local: Any, shared: str, *, pack: bool) -> warmsets.Prefetched:
    with open_cache(f"file://{local},{shared}") as cache:
        found = warmsets.load_set(cache, "job")
        tier = warmsets.local_tier(cache)
        assert found is not None and tier is not None
        if not pack:
            return warmsets.prefetch(tier, found.keys, batch=16)
        return warmsets.prefetch(tier, found.keys, batch=16, name="job", pack=found.pack)


def _local(local: Any, keys: list[bytes]) -> list[tuple[bytes, bytes] | None]:
    with open_cache(str(local), read_only=True) as alone:
        return [None if e is None else (e.data, e.meta) for e in alone.get_entries(keys)]


def _kinds(url: str) -> list[str]:
    from cuforge.storage.record import decode_record

    with open_cache(url, read_only=True) as cache:
        return sorted(
            str((decode_record(i.meta) or {}).get("kind", "raw")) for i in cache.iter_entries()
        )


@contextmanager
def _requests(backend: str, server: Any) -> Iterator[list[int]]:
    """The entries the shared level was asked for inside the block: Redis's own
    counters (keys looked up, hit or missed: an MGET of 16 counts 16); S3: the GET
    requests the client sent (one per object)."""
    counted = [0]
    if backend == "redis":
        admin = server.client()
        admin.config_resetstat()
        yield counted
        stats = admin.info("stats")
        counted[0] = stats["keyspace_hits"] + stats["keyspace_misses"]
        return
    from cuforge.storage.s3._store import S3Store

    real = S3Store.get

    def get(self: S3Store, path: str) -> Any:
        counted[0] += 1
        return real(self, path)

    S3Store.get = get  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        S3Store.get = real  # type: ignore[method-assign]


@pytest.fixture(params=["redis", "s3"])
def shared(request: pytest.FixtureRequest) -> tuple[str, str, Any]:
    """(backend, a cache URL of a fresh shared level, its server)."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return "redis", server.url, server
    return "s3", request.getfixturevalue("s3_url"), request.getfixturevalue("s3_server")


# -- building ------------------------------------------------------------------------------


def test_publish_builds_a_pack_in_the_shared_level_once_and_replaces_it(
    tmp_path, redis_server, monkeypatch
) -> None:
    url = redis_server.url
    data = _fill(url, 40)
    tier = f"file://{tmp_path}/local,{url}"
    built: list[str] = []
    real = warmpacks.build
    monkeypatch.setattr(warmpacks, "build", lambda c, n, k: built.append(n) or real(c, n, k))
    first = _publish(tier, data)
    ref = first.pack
    assert ref is not None and ref.entries == 40 and ref.chunks >= 3
    assert ref.id == warmpacks.pack_id(data)
    # the chunks are in the shared level alone: no 160 KiB duplicate in the local one
    assert _kinds(url).count("warm-pack") == ref.chunks
    assert "warm-pack" not in _kinds(f"{tmp_path}/local")
    # the same keys again: the pack is not built again, the set still refers to it
    assert _publish(tier, data).pack == ref and built == ["job"]
    # keys added by a periodic publish: the set keeps its pack
    more = _fill(url, 3, tag="more")
    added = _publish(tier, more, replace=False)
    assert added.pack == ref and len(added.keys) == 43
    # a changed set: a new pack, the old one's chunks removed
    changed = list(data)[5:]
    new = _publish(tier, changed).pack
    assert new is not None and new.id != ref.id and new.entries == 35 and len(built) == 2
    with open_cache(url) as cache:
        for i in range(ref.chunks):
            assert cache.get_entry(warmpacks.chunk_key("job", ref.id, i)) is None
        for i in range(new.chunks):
            assert cache.get_entry(warmpacks.chunk_key("job", new.id, i)) is not None
    assert _kinds(url).count("warm-pack") == new.chunks


def test_cache_ls_shows_pack_chunks_as_their_kind(tmp_path, redis_server, capsys) -> None:
    from cuforge.cli import main

    data = _fill(redis_server.url, 20)
    ref = _publish(redis_server.url, data).pack
    assert ref is not None
    capsys.readouterr()
    assert main(["cache", "ls", "--kind", "warm-pack", "--cache", redis_server.url]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "warm-pack" in ln]
    assert len(lines) == ref.chunks


def test_only_content_addressed_kinds_are_packed(tmp_path, redis_server) -> None:
    """A header manifest is rewritten in place under its key: packed, an older version
    could reach a fresh host; it is fetched one by one as it is now."""
    url = redis_server.url
    data = _fill(url, 20)
    with open_cache(url) as cache:
        cache.set_entry(b"warm-pack-test\0manifest", b"v1", MANIFEST)
    ref = _publish(url, [*data, b"warm-pack-test\0manifest"]).pack
    assert ref is not None and ref.entries == 20
    with open_cache(url) as cache:  # the manifest changes after the pack was built
        cache.set_entry(b"warm-pack-test\0manifest", b"v2", MANIFEST)
    done = _prefetch(tmp_path / "l", url, pack=True)
    assert (done.listed, done.fetched) == (21, 21)
    assert _local(tmp_path / "l", [b"warm-pack-test\0manifest"]) == [(b"v2", MANIFEST)]


def test_a_pack_that_cannot_be_stored_leaves_the_set_without_one(tmp_path, redis_server) -> None:
    url = redis_server.url
    data = _fill(url, 20)
    with open_cache(f"file://{tmp_path}/l,{url}?ro") as cache:  # nowhere behind to write
        assert warmsets.publish(cache, "job", data, replace=True) == 20
        found = warmsets.load_set(cache, "job")
    assert found is not None and found.pack is None and len(found.keys) == 20


# -- prefetching ---------------------------------------------------------------------------


def test_prefetch_through_the_pack_lands_what_the_per_key_way_lands_in_few_requests(
    tmp_path, shared
) -> None:
    backend, url, server = shared
    data = _fill(url, 60)
    with open_cache(url) as cache:
        cache.set_entry(b"warm-pack-test\0manifest", b"m", MANIFEST)
    keys = [*data, b"warm-pack-test\0manifest", b"never-stored"]
    ref = _publish(url, keys).pack
    assert ref is not None and ref.entries == 60 and ref.chunks >= 3
    with _requests(backend, server) as packed:
        by_pack = _prefetch(tmp_path / "a", url, pack=True)
    with _requests(backend, server) as per_key:
        one_by_one = _prefetch(tmp_path / "b", url, pack=False)
    for done in (by_pack, one_by_one):
        assert (done.listed, done.fetched, done.missing) == (62, 61, 1)
    # every entry byte for byte the same both ways (data and metadata), and right
    a, b = _local(tmp_path / "a", keys), _local(tmp_path / "b", keys)
    assert a == b
    assert a[:60] == [(v, PROGRAM) for v in data.values()] and a[61] is None
    assert "warm-pack" not in _kinds(str(tmp_path / "a"))  # the pack stays behind
    # the set, the chunks, then the manifest and the absent key one by one; against
    # the set and every key one by one
    assert packed[0] == 1 + ref.chunks + 2
    assert per_key[0] == 1 + 62


@pytest.mark.parametrize("damage", ["flip", "delete", "unsigned"])
def test_a_damaged_pack_is_a_warning_and_its_entries_come_one_by_one(
    tmp_path, redis_server, monkeypatch, damage: str
) -> None:
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", SECRET)
    url = redis_server.url
    data = _fill(url, 40)
    ref = _publish(url, data).pack
    assert ref is not None and ref.chunks >= 3
    chunk = warmpacks.chunk_key("job", ref.id, 1)
    admin = redis_server.client()
    name = f"cuforge:{{{entry_id(chunk)}}}".encode()
    if damage == "flip":  # a byte of a record's payload in the middle of the chunk
        value = bytearray(admin.get(name))
        value[len(value) // 2] ^= 0x01
        admin.set(name, bytes(value))
    elif damage == "delete":
        assert admin.delete(name) == 1
    else:  # a chunk stored without the secret, its records' payloads replaced
        with open_cache(url, secret=SECRET) as signed:
            got = signed.get_entry(chunk)
        assert got is not None
        records = warmpacks.decode_chunk(got.data)
        assert records
        forged = [(k, m, b"evil" * 1024) for k, m, _ in records]
        payload = b"CFWPACK1" + b"".join(
            warmpacks._HEAD.pack(len(k), len(m), len(d)) + k + m + d for k, m, d in forged
        )
        monkeypatch.delenv("CUFORGE_CACHE_SECRET")
        with open_cache(url) as unsigned:
            unsigned.set_entry(chunk, payload, got.meta)
        monkeypatch.setenv("CUFORGE_CACHE_SECRET", SECRET)
    with pytest.warns(CacheReadWarning, match="pack chunks 1 missing, damaged"):
        done = _prefetch(tmp_path / "l", url, pack=True)
    assert (done.fetched, done.missing) == (40, 0)
    with open_cache(str(tmp_path / "l"), read_only=True) as alone:  # verified: signed
        got_all = alone.get_entries(list(data))
    assert [e.data if e else None for e in got_all] == list(data.values())
    # found incomplete here: the next publish of the same keys builds it again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = _publish(url, data).pack
    assert again == ref
    with open_cache(url) as cache:
        rebuilt = cache.get_entry(chunk)
    assert rebuilt is not None and warmpacks.decode_chunk(rebuilt.data) is not None


def test_a_pack_covering_part_of_the_set_leaves_the_rest_to_the_per_key_way(
    tmp_path, redis_server
) -> None:
    url = redis_server.url
    data = _fill(url, 40)
    ref = _publish(url, data).pack
    more = _fill(url, 20, tag="late")
    assert _publish(url, more, replace=False).pack == ref  # covers the first 40 only
    with _requests("redis", redis_server) as requests:
        done = _prefetch(tmp_path / "l", url, pack=True)
    assert (done.listed, done.fetched, done.missing) == (60, 60, 0)
    every = {**data, **more}
    assert _local(tmp_path / "l", list(every)) == [(v, PROGRAM) for v in every.values()]
    assert ref is not None
    # the set, the chunks, the 20 late keys one by one
    assert requests[0] == 1 + ref.chunks + 20


def test_a_few_missing_keys_do_not_fetch_the_pack(tmp_path, redis_server) -> None:
    url = redis_server.url
    data = _fill(url, 40)
    ref = _publish(url, data).pack
    assert ref is not None
    assert _prefetch(tmp_path / "l", url, pack=True).fetched == 40
    with open_cache(str(tmp_path / "l")) as alone:  # five entries gone from the local level
        for k in list(data)[:5]:
            del alone[k]
    with _requests("redis", redis_server) as requests:
        done = _prefetch(tmp_path / "l", url, pack=True)
    assert (done.fetched, done.missing) == (40, 0)
    # the five (the set is in the local level now), no chunk: the pack has 3
    assert requests[0] == 5 and ref.chunks == 3


def test_a_level_behind_that_cannot_open_never_fails_a_publish_or_a_prefetch(tmp_path):
    """A tier level opened on first use that cannot be opened -- here a SQLite database
    that is not cuforge's -- is a warning for the pack and a counted failure for the
    prefetch, never an exception out of publish(), local_tier() or prefetch() (cuforge
    run used to end in a traceback, the job's work done)."""
    import sqlite3

    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE someone_elses (x)")
    url = f"file://{tmp_path / 'local'},sqlite://{foreign}"
    keys = list(_fill(f"file://{tmp_path / 'local'}", 20))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with open_cache(url) as cache:
            assert warmsets.publish(cache, "job", keys, replace=True) == len(keys)
            found = warmsets.load_set(cache, "job")
            assert found is not None and sorted(found.keys) == sorted(keys)
            assert found.pack is None  # nowhere to store one
            tier = warmsets.local_tier(cache)
            assert tier is not None
            got = warmsets.prefetch(tier, found.keys, name="job", pack=None)
            assert (got.listed, got.fetched) == (20, 20)  # the local level had them all
            fake = warmpacks.PackRef(warmpacks.pack_id(keys), 1, 20)
            landed, rest = warmpacks.land(tier, "job", fake, found.keys)
            assert (landed, sorted(rest)) == (0, sorted(keys))
    said = " ".join(str(w.message) for w in caught)
    assert "no pack" in said and "foreign.db" in said
