"""ProgramCacheResource contract, value/key coercion and the in-memory backend."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from _backends import FACTORIES
from cuforge.storage import (
    CacheStats,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
)


class FakeObjectCode:
    """Duck-typed ObjectCode: storage must not import the compile layer."""

    def __init__(self, code: object, code_type: str = "cubin") -> None:
        self.code = code
        self.code_type = code_type


@pytest.fixture(params=sorted(FACTORIES))
def cache(request: pytest.FixtureRequest, tmp_path: Path):
    c = FACTORIES[request.param](tmp_path, request)
    yield c
    c.close()


def test_abc_requires_the_mapping_methods() -> None:
    with pytest.raises(TypeError):
        ProgramCacheResource()  # type: ignore[abstract]

    class Minimal(ProgramCacheResource):
        def __init__(self) -> None:
            super().__init__()
            self.d: dict[bytes, bytes] = {}

        def __getitem__(self, key):
            return self.d[key]

        def __setitem__(self, key, value):
            self.d[key] = bytes(value)

        def __delitem__(self, key):
            del self.d[key]

        def __len__(self):
            return len(self.d)

        def clear(self):
            self.d.clear()

    m = Minimal()
    m.update({b"a": b"1"})
    m.update([(b"b", b"2")])
    assert m.get(b"a") == b"1" and m.get(b"zz") is None and m.get(b"zz", b"d") == b"d"
    assert isinstance(m.stats(), CacheStats)
    with m as same:
        assert same is m
    with m.lock(b"a", timeout=1) as held:
        assert held


def test_a_subclass_that_skips_super_init_still_counts_and_locks() -> None:
    """A backend written without ``super().__init__()`` gets its counters and its
    per-key locks on first use (they were AttributeErrors on ``_stats``/``_key_locks``)."""
    from cuforge.compile import Program, ProgramOptions

    class NoInit(ProgramCacheResource):
        def __init__(self) -> None:  # deliberately no super().__init__()
            self.d: dict[bytes, bytes] = {}

        def __getitem__(self, key):
            return self.d[key]

        def __setitem__(self, key, value):
            self.d[key] = bytes(value)

        def __delitem__(self, key):
            del self.d[key]

        def __len__(self):
            return len(self.d)

        def clear(self):
            self.d.clear()

    cache = NoInit()
    src = 'extern "C" __global__ void noinit(int* a) { a[0] = 1; }'
    prog = Program(src, "c++", ProgramOptions(arch="sm_80"))
    first = prog.compile("cubin", cache=cache).code
    assert prog.compile("cubin", cache=cache).code == first and len(cache) >= 1
    assert isinstance(cache.stats(), CacheStats)
    with cache.lock(b"k", timeout=1) as held:
        assert held
        with cache.lock(b"k", timeout=0.05) as again:  # the same lock object both times
            assert not again
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        cache.nothing  # noqa: B018 - other names still raise


def test_no_contains_and_no_iteration(cache) -> None:
    cache[b"k"] = b"v"
    with pytest.raises(TypeError, match="get"):
        _ = b"k" in cache
    with pytest.raises(TypeError):
        iter(cache)


def test_crud_and_str_keys(cache) -> None:
    cache["key"] = b"value"
    assert cache[b"key"] == b"value"  # str keys are their UTF-8 bytes
    assert cache.get("key") == b"value"
    assert len(cache) == 1
    cache["key"] = b"other"
    assert cache["key"] == b"other" and len(cache) == 1
    del cache["key"]
    assert cache.get("key") is None
    with pytest.raises(KeyError):
        cache["key"]
    with pytest.raises(KeyError):
        del cache["key"]
    cache.update({"a": b"1", "b": b"2"})
    cache.update([("c", b"3")])
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.get("a") is None


@pytest.mark.parametrize("bad", [1, 1.5, None, bytearray(b"k"), ("t",)])
def test_bad_key_types_raise_typeerror_naming_key(cache, bad) -> None:
    with pytest.raises(TypeError, match="key"):
        cache[bad] = b"v"
    with pytest.raises(TypeError, match="key"):
        cache.get(bad)


def test_value_forms_round_trip_identically(cache, tmp_path: Path) -> None:
    payload = os.urandom(3000)
    binfile = tmp_path / "k.cubin"
    binfile.write_bytes(payload)
    forms = {
        "bytes": payload,
        "bytearray": bytearray(payload),
        "memoryview": memoryview(payload),
        "strided memoryview": memoryview(payload + payload)[::2],
        "objectcode bytes": FakeObjectCode(payload),
        "objectcode path str": FakeObjectCode(str(binfile)),
        "objectcode pathlike": FakeObjectCode(binfile),
    }
    for name, value in forms.items():
        cache[name] = value
    expected = dict.fromkeys(forms, payload)
    expected["strided memoryview"] = (payload + payload)[::2]
    for name, want in expected.items():
        got = cache[name]
        assert type(got) is bytes and got == want, name


def test_path_backed_objectcode_missing_file_names_op_and_path(cache, tmp_path: Path) -> None:
    missing = tmp_path / "gone.cubin"
    with pytest.raises(FileNotFoundError) as info:
        cache["k"] = FakeObjectCode(str(missing))
    assert "__setitem__" in str(info.value) and str(missing) in str(info.value)


@pytest.mark.parametrize("bad", [123, "text", object(), FakeObjectCode(42)])
def test_bad_value_types_raise_typeerror(cache, bad) -> None:
    with pytest.raises(TypeError):
        cache["k"] = bad


def test_update_is_not_transactional(cache) -> None:
    with pytest.raises(TypeError):
        cache.update([("a", b"1"), ("b", 2), ("c", b"3")])
    assert cache.get("a") == b"1" and cache.get("c") is None


@pytest.mark.parametrize("bad", [0, -1])
def test_max_size_must_be_positive(bad, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_size_bytes"):
        InMemoryProgramCache(max_size_bytes=bad)
    with pytest.raises(ValueError, match="max_size_bytes"):
        FileStreamProgramCache(tmp_path, max_size_bytes=bad)


def test_stats_count_hits_misses_stores(cache) -> None:
    cache["a"] = b"12345"
    cache.get("a")
    cache.get("b")
    s = cache.stats()
    assert (s.hits, s.misses, s.stores, s.bytes_read, s.bytes_written) == (1, 1, 1, 5, 5)
    d = s.as_dict()
    assert list(d) == [
        "hits",
        "misses",
        "stores",
        "evictions",
        "integrity_failures",
        "write_failures",
        "bytes_read",
        "bytes_written",
        "signature_failures",
        "read_failures",
        "lock_timeouts",
        "warm_compiles",
    ]
    assert (s + s).hits == 2 and (s - s).hits == 0


def test_inmemory_lru_by_bytes() -> None:
    c = InMemoryProgramCache(max_size_bytes=300)
    c["a"] = b"a" * 100
    c["b"] = b"b" * 100
    c["c"] = b"c" * 100
    assert c.get("a")  # a is now most recent
    c["d"] = b"d" * 100  # evicts b, the least recently used
    assert c.get("b") is None and c.get("a") and c.get("c") and c.get("d")
    assert c.size_bytes == 300 and c.stats().evictions == 1
    c["big"] = b"x" * 1000  # larger than the cap: refused, nothing evicted for it
    assert c.get("big") is None and c.get("a") and c.get("c") and c.get("d")
    assert c.size_bytes == 300 and c.stats().evictions == 1
    assert (c.stats().stores, c.stats().write_failures) == (4, 1)
    c.clear()
    c["e"] = b"e" * 50
    c["e"] = b"e" * 150  # overwrite re-accounts
    assert c.size_bytes == 150
    del c["e"]
    assert c.size_bytes == 0


def test_inmemory_thread_stress() -> None:
    c = InMemoryProgramCache(max_size_bytes=20_000)
    errors: list[BaseException] = []
    payloads = {i: bytes([i]) * (100 + i) for i in range(64)}

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                k = rng.randrange(64)
                if rng.random() < 0.5:
                    c[str(k)] = payloads[k]
                else:
                    got = c.get(str(k))
                    assert got is None or got == payloads[k]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.size_bytes <= 20_000
    assert c.size_bytes == sum(len(c.get(str(k)) or b"") for k in range(64))


def test_inmemory_lock_serialises_threads_and_times_out() -> None:
    c = InMemoryProgramCache()
    inside = 0
    peak = 0
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, peak
        with c.lock("k") as held:
            assert held
            with guard:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.01)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 1
    with c.lock("k") as held:
        assert held
        result: list[bool] = []
        t = threading.Thread(target=lambda: result.append(c.lock("k", 0.05).__enter__()))
        t.start()
        t.join()
        assert result == [False]  # fell through after the timeout


def test_storage_imports_no_cuda_and_no_other_layer() -> None:
    import subprocess

    code = (
        # Only what the import adds: cuda-bindings 12.x's .pth imports the bare
        # ``cuda`` namespace into every process.
        "import sys\nbefore = set(sys.modules)\n"
        "import cuforge.storage, cuforge.storage.redis, cuforge.storage.tiered\n"
        "import cuforge.storage.signing, cuforge.storage.config\n"
        "bad = [m for m in set(sys.modules) - before if m.startswith(('cuda',"
        " 'cuforge.compile', 'cuforge.runtime', 'cuforge.graph', 'pickle'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_stats_records_of_older_and_newer_layouts_still_count(tmp_path: Path) -> None:
    """Counters are only appended: an older (8-counter) record reads with the new
    counters at zero, a newer (longer) one with its extra counters ignored."""
    import struct

    from cuforge.storage.stats import MAX_RECORD_SIZE, RECORD_SIZE

    old = struct.pack("<8Q", 1, 2, 3, 4, 5, 6, 7, 8)
    newer = CacheStats(hits=10, signature_failures=4, read_failures=5).to_record() + b"\x09" * 16
    assert CacheStats.from_record(old) == CacheStats(1, 2, 3, 4, 5, 6, 7, 8)
    assert CacheStats.from_record(newer) == CacheStats(
        hits=10, signature_failures=4, read_failures=5
    )
    for bad in (b"", old[:-1], old[:56], b"\0" * (MAX_RECORD_SIZE + 8)):
        assert CacheStats.from_record(bad) is None
    assert len(CacheStats().to_record()) == RECORD_SIZE
    with FileStreamProgramCache(tmp_path) as c:
        (tmp_path / "stats" / "old-host-1-abcd0123.cnt").write_bytes(old)  # as handles name them
        (tmp_path / "stats" / "merged").write_bytes(newer)
        total = c.total_stats()
    assert (total.hits, total.misses, total.signature_failures) == (11, 2, 4)
    with FileStreamProgramCache(tmp_path) as c:  # compaction folds both into `merged`
        assert c.total_stats().hits == 11
    assert len((tmp_path / "stats" / "merged").read_bytes()) == RECORD_SIZE


def test_in_memory_cache_repr_says_what_it_holds() -> None:
    """It printed the default ``<... object at 0x...>``."""
    from cuforge.storage import InMemoryProgramCache

    cache = InMemoryProgramCache(max_size_bytes=1 << 20)
    cache[b"k"] = b"12345"
    assert repr(cache) == "InMemoryProgramCache(max_size_bytes=1048576, entries=1, size_bytes=5)"
