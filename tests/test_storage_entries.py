"""Entries with metadata, listing and per-entry maintenance, on every backend.

This is the contract ``Program.compile(cache=)`` and the command line rely on:
``set_entry``/``get_entry`` keep metadata with the payload, ``iter_entries`` lists
entries by their public id, ``check_entry``/``read_entry``/``remove_entry`` act on
one id.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _backends import FACTORIES, PERSISTENT
from cuforge.storage import ProgramCacheResource
from cuforge.storage.entry import CacheEntry, entry_id
from cuforge.storage.record import decode_record, encode_record


@pytest.fixture(params=sorted(FACTORIES))
def cache(request: pytest.FixtureRequest, tmp_path: Path):
    c = FACTORIES[request.param](tmp_path, request)
    yield c
    c.close()


def test_entry_round_trip_with_and_without_metadata(cache) -> None:
    payload = os.urandom(5000)
    meta = encode_record("program", {"arch": "sm_90", "name": "k.cu"})
    cache.set_entry(b"k1", payload, meta)
    cache.set_entry("k2", memoryview(payload)[:100])
    assert cache.get_entry(b"k1") == CacheEntry(payload, meta)
    assert cache.get_entry(b"k2") == CacheEntry(payload[:100], b"")
    assert cache[b"k1"] == payload  # the mapping view sees the payload only
    assert cache.get_entry(b"absent") is None
    # Replacing an entry replaces its metadata too, also with none.
    cache.set_entry(b"k1", b"new", b"")
    assert cache.get_entry(b"k1") == CacheEntry(b"new", b"")
    cache[b"k2"] = b"plain"
    assert cache.get_entry(b"k2") == CacheEntry(b"plain", b"")


def test_large_metadata_round_trips(cache) -> None:
    meta = encode_record("manifest", {"deps": ["x" * 50] * 400})  # ~20 KiB
    cache.set_entry(b"k", b"payload", meta)
    assert cache.get_entry(b"k") == CacheEntry(b"payload", meta)
    assert decode_record(cache.read_entry(entry_id(b"k")).meta, "manifest")["deps"][0] == "x" * 50


@pytest.mark.parametrize("bad", ["text", bytearray(b"m"), None, 5])
def test_metadata_must_be_bytes(cache, bad) -> None:
    with pytest.raises(TypeError, match="meta"):
        cache.set_entry(b"k", b"v", bad)
    assert cache.get(b"k") is None


def test_listing_names_entries_by_id_with_sizes_times_and_metadata(cache) -> None:
    cache.set_entry(b"a", b"x" * 1000, b'{"v":1,"kind":"program"}')
    cache.set_entry(b"b", b"y" * 10)
    listed = {e.id: e for e in cache.iter_entries()}
    assert set(listed) == {entry_id(b"a"), entry_id(b"b")}
    a = listed[entry_id(b"a")]
    assert a.meta == b'{"v":1,"kind":"program"}' and listed[entry_id(b"b")].meta == b""
    assert a.size >= 1000 + len(a.meta)
    assert a.stored_ns > 0 and a.used_ns >= a.stored_ns - 10**9


def test_check_read_and_remove_by_id(cache) -> None:
    cache.set_entry(b"a", b"payload-a", b"meta-a")
    eid = entry_id(b"a")
    assert cache.check_entry(eid) is None
    assert cache.read_entry(eid) == CacheEntry(b"payload-a", b"meta-a")
    assert cache.remove_entry(eid) is True
    assert cache.get(b"a") is None and cache.read_entry(eid) is None
    assert cache.remove_entry(eid) is False
    with pytest.raises(KeyError):
        cache.check_entry(eid)
    for bad in ("zz", "0" * 63, "G" * 64):
        assert cache.read_entry(bad) is None and cache.remove_entry(bad) is False


@pytest.mark.parametrize("backend", sorted(PERSISTENT))
def test_metadata_survives_reopen(backend, tmp_path: Path, request) -> None:
    with PERSISTENT[backend](tmp_path, request) as c:
        c.set_entry(b"k", b"payload", b"meta")
    with PERSISTENT[backend](tmp_path, request) as c:
        assert c.get_entry(b"k") == CacheEntry(b"payload", b"meta")


def test_filestream_detects_damaged_metadata(tmp_path: Path) -> None:
    from cuforge.storage import FileStreamProgramCache
    from cuforge.storage._integrity import SIDECAR_SIZE, SIDECAR_SUFFIX

    with FileStreamProgramCache(tmp_path) as c:
        c.set_entry(b"k", b"payload", b"metadata-bytes")
        eid = entry_id(b"k")
        sidecar = tmp_path / "entries" / eid[:2] / (eid[2:] + SIDECAR_SUFFIX)
        raw = bytearray(sidecar.read_bytes())
        assert raw[SIDECAR_SIZE:] == b"metadata-bytes"
        raw[-3] ^= 0x01
        sidecar.write_bytes(bytes(raw))
        assert "checksum" in c.check_entry(eid)
        assert c.read_entry(eid) is None
        assert c.get_entry(b"k") is None  # a miss, removed and counted
        assert c.stats().integrity_failures == 1
        assert not sidecar.exists()


def test_filestream_reads_sidecars_written_before_metadata(tmp_path: Path) -> None:
    """A 56-byte sidecar (the layout before metadata) is an entry without metadata."""
    import struct
    import zlib

    from cuforge.storage import FileStreamProgramCache
    from cuforge.storage.entry import key_digest

    FileStreamProgramCache(tmp_path).close()  # a cuforge cache (tagged), then the files
    kd = key_digest(b"old")
    payload = b"old payload"
    old = struct.pack("<4sB3xQI4x", b"CFS1", 1, len(payload), zlib.crc32(payload, zlib.crc32(kd)))
    eid = kd.hex()
    shard = tmp_path / "entries" / eid[:2]
    shard.mkdir(parents=True, exist_ok=True)
    (shard / (eid[2:] + ".cfsum")).write_bytes(old + kd)
    (shard / eid[2:]).write_bytes(payload)
    with FileStreamProgramCache(tmp_path) as c:
        assert c.get_entry(b"old") == CacheEntry(payload, b"")


class _MappingOnly(ProgramCacheResource):
    """A third-party backend that implements only the mapping methods."""

    def __init__(self) -> None:
        super().__init__()
        self.d: dict[bytes, bytes] = {}

    def __getitem__(self, key):
        return self.d[key]

    def get(self, key, default=None):
        return self.d.get(key, default)

    def __setitem__(self, key, value):
        self.d[key] = bytes(value)

    def __delitem__(self, key):
        del self.d[key]

    def __len__(self):
        return len(self.d)

    def clear(self):
        self.d.clear()


def test_mapping_only_backend_gets_metadata_through_a_derived_key() -> None:
    m = _MappingOnly()
    m.set_entry(b"k", b"payload", b"meta")
    assert m.get_entry(b"k") == CacheEntry(b"payload", b"meta")
    assert len(m) == 2  # payload + metadata entry
    m.set_entry(b"k", b"payload2")
    assert m.get_entry(b"k") == CacheEntry(b"payload2", b"")
    assert len(m) == 1
    with pytest.raises(NotImplementedError, match="_MappingOnly cannot list"):
        list(m.iter_entries())


def test_records_are_deterministic_versioned_and_strict() -> None:
    a = encode_record("program", {"b": 1, "a": [1, "x"]})
    assert a == encode_record("program", {"a": [1, "x"], "b": 1})  # key order does not matter
    assert decode_record(a) == {"v": 1, "kind": "program", "a": [1, "x"], "b": 1}
    assert decode_record(a, "program") is not None and decode_record(a, "manifest") is None
    for bad in (b"", None, b"[]", b"not json", b'{"kind":"program"}', b'{"v":2,"kind":"x"}'):
        assert decode_record(bad) is None
    with pytest.raises(ValueError, match="reserved"):
        encode_record("program", {"v": 2})
    with pytest.raises(TypeError):
        encode_record("program", {"raw": b"bytes are not JSON"})
