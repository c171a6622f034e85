"""Program.compile(cache=...) on real NVRTC and real caches (in memory, files, processes).

The compiler is never mocked. To prove a hit does not compile, NVRTC's entry point
is wrapped so that it counts calls (or refuses to run); the wrapped function is
the real one.
"""

from __future__ import annotations

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

from _cache_workers import ARCH, SRC, TEMPLATE_SRC
from cuforge.compile import ObjectCode, Program, ProgramOptions, _nvrtc, _versions
from cuforge.storage._integrity import SIDECAR_SIZE, SIDECAR_SUFFIX
from cuforge.storage.record import decode_record, encode_record
from cuforge.utils import (
    CacheWriteWarning,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    SQLiteProgramCache,
    make_program_cache_key,
)

WORKERS = os.path.join(os.path.dirname(__file__), "_cache_workers.py")
posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX process and file tools")


def options(**fields) -> ProgramOptions:
    return ProgramOptions(**{"arch": ARCH, **fields})


def cubin_key(src: str = SRC, names=()) -> bytes:
    return make_program_cache_key(
        code=src, code_type="c++", options=options(), target_type="cubin", name_expressions=names
    )


class Compiles:
    """Counts real NVRTC compiles; ``forbid()`` makes the next one fail the test."""

    def __init__(self, monkeypatch):
        self.real = _nvrtc.compile_cpp
        self.count = 0
        self.forbidden = False
        self._lock = threading.Lock()
        monkeypatch.setattr(_nvrtc, "compile_cpp", self)

    def forbid(self) -> None:
        self.forbidden = True

    def __call__(self, *args, **kwargs):
        if self.forbidden:
            raise AssertionError("NVRTC was invoked on what should have been a cache hit")
        with self._lock:
            self.count += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def compiles(monkeypatch) -> Compiles:
    return Compiles(monkeypatch)


@pytest.fixture(params=["memory", "filestream", "sqlite"])
def cache(request, tmp_path):
    if request.param == "memory":
        c = InMemoryProgramCache()
    elif request.param == "sqlite":
        c = SQLiteProgramCache(tmp_path / "cache.db")
    else:
        c = FileStreamProgramCache(tmp_path / "cache")
    with c:
        yield c


@pytest.fixture
def fcache(tmp_path):
    with FileStreamProgramCache(tmp_path / "cache") as c:
        yield c


@pytest.fixture(scope="module")
def reference_cubin() -> bytes:
    """SRC compiled without any cache: what every cached path must return."""
    return Program(SRC, "c++", options()).compile("cubin").code


def payload_files(root) -> list[Path]:
    return sorted(
        p for p in Path(root, "entries").rglob("*") if p.is_file() and p.suffix != SIDECAR_SUFFIX
    )


def run_worker(command: str, args: dict, timeout: float = 120) -> dict:
    out = subprocess.run(
        [sys.executable, WORKERS, command, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def same(a: ObjectCode, b: ObjectCode) -> bool:
    return (a.code, a.code_type, a.name, a.symbol_mapping) == (
        b.code,
        b.code_type,
        b.name,
        b.symbol_mapping,
    )


# -- miss, hit, reopen, fresh process -------------------------------------------------------


def test_miss_compiles_and_stores_then_hit_skips_the_compiler(cache, compiles, reference_cubin):
    program = Program(SRC, "c++", options())
    first = program.compile("cubin", cache=cache)
    assert compiles.count == 1
    assert first.code == reference_cubin and first.code_type == "cubin"
    assert first.name == "<default program>"
    assert cache.get(cubin_key()) == reference_cubin
    assert cache.stats().stores == 1

    compiles.forbid()
    # A new Program with equal (not identical) options hits as well.
    second = Program(SRC, "c++", options()).compile("CUBIN", cache=cache)
    assert same(first, second)
    assert second is not first


WARNS = '#warning "hello from the kernel"\nextern "C" __global__ void w(int* a) { a[0] = 1; }\n'


@pytest.mark.parametrize("tracked", [False, True])
def test_compiler_warnings_are_replayed_on_every_hit(cache, compiles, tmp_path, tracked):
    """The compile log went to ``logs`` on the miss and was '' on every hit, same handle
    or new: it is stored with the entry and written again on a hit (like ccache's
    stderr). Also through header tracking (a source that includes a user header)."""
    import io

    src = WARNS
    opts = options()
    if tracked:
        (tmp_path / "inc").mkdir(exist_ok=True)
        (tmp_path / "inc" / "v.h").write_text("#define V 2\n")
        src = '#include "v.h"\n' + WARNS
        opts = options(include_path=[str(tmp_path / "inc")])
    miss = io.StringIO()
    Program(src, "c++", opts).compile("cubin", cache=cache, logs=miss)
    assert "hello from the kernel" in miss.getvalue()
    compiles.forbid()
    for _ in range(2):
        hit = io.StringIO()
        Program(src, "c++", opts).compile("cubin", cache=cache, logs=hit)
        assert hit.getvalue() == miss.getvalue()
    if isinstance(cache, FileStreamProgramCache):  # a new handle, too
        with FileStreamProgramCache(cache.path) as again:
            hit = io.StringIO()
            Program(src, "c++", opts).compile("cubin", cache=again, logs=hit)
            assert hit.getvalue() == miss.getvalue()
    quiet = io.StringIO()  # a warning-free source replays nothing
    compiles.forbidden = False
    Program(SRC, "c++", options()).compile("cubin", cache=cache, logs=quiet)
    Program(SRC, "c++", options()).compile("cubin", cache=cache, logs=quiet)
    assert quiet.getvalue() == ""


def test_different_targets_and_sources_are_different_entries(cache, compiles):
    program = Program(SRC, "c++", options())
    cubin = program.compile("cubin", cache=cache)
    ptx = program.compile("ptx", cache=cache)
    other = Program(SRC.replace("= 1", "= 2"), "c++", options()).compile("cubin", cache=cache)
    assert compiles.count == 3
    assert ptx.code_type == "ptx" and b".entry store_one" in ptx.code
    assert other.code != cubin.code
    compiles.forbid()
    assert same(program.compile("ptx", cache=cache), ptx)


def test_hit_across_a_reopened_filestream_cache(tmp_path, compiles, reference_cubin):
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as c:
        Program(SRC, "c++", options()).compile("cubin", cache=c)
    compiles.forbid()
    with FileStreamProgramCache(root) as c:
        obj = Program(SRC, "c++", options()).compile("cubin", cache=c)
        assert obj.code == reference_cubin
        assert c.stats().hits == 1 and c.stats().misses == 0


@posix_only
def test_hit_in_a_fresh_process(tmp_path, compiles, reference_cubin):
    import hashlib

    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as c:
        Program(SRC, "c++", options()).compile("cubin", cache=c)
    counter = tmp_path / "compiles.txt"
    got = run_worker("compile", {"cache": str(root), "counter": str(counter)})
    assert not counter.exists(), "the fresh process compiled instead of hitting"
    assert got["sha256"] == hashlib.sha256(reference_cubin).hexdigest()
    assert got["stats"]["hits"] == 1 and got["stats"]["stores"] == 0


@posix_only
def test_symbol_mapping_hit_in_a_fresh_process(tmp_path):
    root = tmp_path / "cache"
    names = ["fill<float>", "fill<int>"]
    with FileStreamProgramCache(root) as c:
        obj = Program(TEMPLATE_SRC, "c++", options()).compile(
            "cubin", name_expressions=names, cache=c
        )
    counter = tmp_path / "compiles.txt"
    got = run_worker(
        "compile",
        {"cache": str(root), "counter": str(counter), "src": TEMPLATE_SRC, "names": names},
    )
    assert not counter.exists(), "the fresh process compiled instead of hitting"
    assert got["symbols"] == obj.symbol_mapping


def test_options_name_is_kept_on_hit(cache, compiles):
    program = Program(SRC, "c++", options(name="store.cu"))
    first = program.compile("cubin", cache=cache)
    compiles.forbid()
    second = Program(SRC, "c++", options(name="store.cu")).compile("cubin", cache=cache)
    assert second.name == first.name == "store.cu"


# -- name expressions ------------------------------------------------------------------------


def test_name_expressions_symbol_mapping_survives_a_hit(cache, compiles):
    names = ["fill<float>", b"fill<int>"]
    first = Program(TEMPLATE_SRC, "c++", options()).compile(
        "cubin", name_expressions=names, cache=cache
    )
    assert set(first.symbol_mapping) == {"fill<float>", b"fill<int>"}
    assert first.symbol_mapping["fill<float>"].startswith("_Z")
    assert first.symbol_mapping["fill<float>"] != first.symbol_mapping[b"fill<int>"]
    compiles.forbid()
    second = Program(TEMPLATE_SRC, "c++", options()).compile(
        "cubin", name_expressions=list(reversed(names)), cache=cache
    )
    assert same(first, second)
    assert second.symbol_mapping["fill<float>"] == first.symbol_mapping["fill<float>"]


def test_name_expression_types_are_distinct_entries(cache, compiles):
    p = Program(TEMPLATE_SRC, "c++", options())
    as_str = p.compile("cubin", name_expressions=["fill<float>"], cache=cache)
    as_bytes = p.compile("cubin", name_expressions=[b"fill<float>"], cache=cache)
    assert compiles.count == 2
    assert list(as_str.symbol_mapping) == ["fill<float>"]
    assert list(as_bytes.symbol_mapping) == [b"fill<float>"]


@pytest.mark.parametrize(
    "damage",
    [
        b"",  # no metadata at all
        b"not json",
        encode_record("program", {"symbols": [["s", "fill<float>"]]}),  # wrong shape
        encode_record("program", {"symbols": [["s", "fill<double>", "_Z1x"]]}),  # other name
        encode_record("program", {"symbols": [["x", "fill<float>", "_Z1x"]]}),  # unknown tag
        encode_record("program", {"symbols": [["s", "fill<float>", 5]]}),  # not a mangled name
        encode_record("program", {"symbols": {"fill<float>": "_Z1x"}}),
        encode_record("manifest", {"symbols": [["s", "fill<float>", "_Z1x"]]}),  # wrong kind
        b'{"v":99,"kind":"program","symbols":[["s","fill<float>","_Z1x"]]}',  # future version
        b"null",
        b"{" + b"[" * 100_000,  # deep nesting
    ],
)
def test_damaged_symbol_record_is_a_miss_and_recompiles(cache, compiles, damage):
    names = ["fill<float>"]
    first = Program(TEMPLATE_SRC, "c++", options()).compile(
        "cubin", name_expressions=names, cache=cache
    )
    key = cubin_key(TEMPLATE_SRC, names)
    entry = cache.get_entry(key)
    assert entry is not None and entry.data == first.code
    record = decode_record(entry.meta, "program")
    assert record is not None and record["symbols"] == [
        ["s", "fill<float>", first.symbol_mapping["fill<float>"]]
    ]
    cache.set_entry(key, entry.data, damage)
    again = Program(TEMPLATE_SRC, "c++", options()).compile(
        "cubin", name_expressions=names, cache=cache
    )
    assert compiles.count == 2
    assert same(again, first)
    # The recompile repaired the pair: the next one hits.
    compiles.forbid()
    assert same(
        Program(TEMPLATE_SRC, "c++", options()).compile(
            "cubin", name_expressions=names, cache=cache
        ),
        first,
    )


def test_corrupted_metadata_on_disk_is_a_miss(fcache, compiles):
    names = ["fill<float>"]
    p = Program(TEMPLATE_SRC, "c++", options())
    first = p.compile("cubin", name_expressions=names, cache=fcache)
    sidecars = list(Path(fcache.path, "entries").rglob("*" + SIDECAR_SUFFIX))
    assert len(sidecars) == 1
    data = bytearray(sidecars[0].read_bytes())
    assert b"fill<float>" in data[SIDECAR_SIZE:]  # the mapping lives in the metadata
    data[SIDECAR_SIZE + (len(data) - SIDECAR_SIZE) // 2] ^= 0x20
    sidecars[0].write_bytes(bytes(data))
    again = p.compile("cubin", name_expressions=names, cache=fcache)
    assert compiles.count == 2 and same(again, first)
    assert fcache.stats().integrity_failures == 1


# -- raw entries and corruption ----------------------------------------------------------------


def test_entries_on_disk_are_raw_binaries(fcache, reference_cubin):
    Program(SRC, "c++", options()).compile("cubin", cache=fcache)
    files = payload_files(fcache.path)
    assert len(files) == 1
    assert files[0].read_bytes() == reference_cubin  # byte-for-byte, no framing
    assert files[0].read_bytes()[:4] == b"\x7fELF"
    sidecars = list(Path(fcache.path, "entries").rglob("*" + SIDECAR_SUFFIX))
    assert len(sidecars) == 1
    record = decode_record(sidecars[0].read_bytes()[SIDECAR_SIZE:], "program")
    assert record is not None
    assert (record["target"], record["arch"], record["code_type"]) == ("cubin", ARCH, "c++")
    assert record["compiler"].startswith("nvrtc:") and record["symbols"] == []


def test_name_expression_payload_is_still_raw_elf(fcache):
    obj = Program(TEMPLATE_SRC, "c++", options()).compile(
        "cubin", name_expressions=["fill<float>"], cache=fcache
    )
    contents = [f.read_bytes() for f in payload_files(fcache.path)]
    assert contents == [obj.code]  # one raw file: the mapping rides in the sidecar
    assert obj.code[:4] == b"\x7fELF"


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _empty(data: bytes) -> bytes:
    return b""


def _flip(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x04
    return bytes(damaged)


@pytest.mark.parametrize("damage", [_truncate, _empty, _flip], ids=["truncate", "empty", "flip"])
def test_corrupt_payload_is_a_miss_and_recompiles(fcache, compiles, reference_cubin, damage):
    program = Program(SRC, "c++", options())
    program.compile("cubin", cache=fcache)
    (payload,) = payload_files(fcache.path)
    payload.write_bytes(damage(payload.read_bytes()))
    assert payload.read_bytes() != reference_cubin

    obj = program.compile("cubin", cache=fcache)
    assert compiles.count == 2
    assert obj.code == reference_cubin
    assert fcache.stats().integrity_failures == 1
    # The entry was rewritten intact.
    assert payload.read_bytes() == reference_cubin
    compiles.forbid()
    assert program.compile("cubin", cache=fcache).code == reference_cubin


# -- write and read failures never break a compile ----------------------------------------------


@posix_only
def test_unwritable_filestream_cache_still_returns_the_compile(tmp_path, compiles, reference_cubin):
    with FileStreamProgramCache(tmp_path / "cache") as c:
        tmp_dir = Path(c.path, "tmp")
        for leftover in tmp_dir.iterdir():
            leftover.unlink()
        tmp_dir.rmdir()
        tmp_dir.write_bytes(b"not a directory")  # every staged write now fails
        program = Program(SRC, "c++", options())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = program.compile("cubin", cache=c)
            second = program.compile("cubin", cache=c)
        assert first.code == second.code == reference_cubin
        assert compiles.count == 2  # nothing was cached, so both compiled
        write_warnings = [w for w in caught if issubclass(w.category, CacheWriteWarning)]
        assert len(write_warnings) == 1, [str(w.message) for w in caught]
        assert c.stats().write_failures == 2
        assert c.stats().stores == 0
        assert payload_files(c.path) == []


@posix_only
def test_file_too_large_is_a_write_failure(tmp_path):
    got = run_worker(
        "efbig",
        {"cache": str(tmp_path / "cache"), "counter": str(tmp_path / "n"), "limit": 1024},
    )
    assert got["size"] > 1024 and got["elf"] and got["same_code"]
    assert len(got["write_warnings"]) == 1 and not got["other_warnings"]
    assert got["write_failures"] == 2 and got["stores"] == 0
    # Both cached calls compiled (nothing could be stored), plus the worker's reference.
    assert len((tmp_path / "n").read_text().split()) == 3


class BrokenCache(ProgramCacheResource):
    """A backend whose every operation fails the way a dead disk or server would."""

    def __init__(self, fail_get: bool = True):
        super().__init__()
        self.fail_get = fail_get
        self.gets = 0
        self.sets = 0

    def get(self, key, default=None):
        self.gets += 1
        if self.fail_get:
            raise OSError("backend unreachable")
        return default

    def __getitem__(self, key):
        raise OSError("backend unreachable")

    def __setitem__(self, key, value):
        self.sets += 1
        raise OSError(28, "No space left on device")

    def __delitem__(self, key):
        raise OSError("backend unreachable")

    def __len__(self):
        return 0

    def clear(self):
        pass


@pytest.mark.parametrize("fail_get", [True, False])
def test_failing_custom_backend_never_breaks_a_compile(compiles, reference_cubin, fail_get):
    broken = BrokenCache(fail_get=fail_get)
    program = Program(TEMPLATE_SRC, "c++", options())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = program.compile("cubin", cache=broken)
        b = program.compile("cubin", name_expressions=["fill<float>"], cache=broken)
        c = Program(SRC, "c++", options()).compile("cubin", cache=broken)
    assert c.code == reference_cubin
    assert a.code[:4] == b"\x7fELF" and b.symbol_mapping["fill<float>"].startswith("_Z")
    assert compiles.count == 3
    # One failed store per compile: the fallback writes the metadata first, which fails.
    assert broken.gets >= 3 and broken.sets == 3
    assert broken.stats().write_failures == 3
    write_warnings = [w for w in caught if issubclass(w.category, CacheWriteWarning)]
    assert len(write_warnings) == 1
    # The warning names the caller, not cuforge internals.
    assert write_warnings[0].filename == __file__


def test_cache_that_is_not_a_cache_is_a_type_error(compiles):
    program = Program(SRC, "c++", options())
    for bad in (object(), {"not": "a cache"}.keys(), 42):
        with pytest.raises(TypeError, match="cache"):
            program.compile("cubin", cache=bad)
    assert compiles.count == 0


# -- rejected options never reach the compiler --------------------------------------------------


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"pch": True}, "pch.*extra_digest"),
        ({"use_pch": "x.pch"}, "use_pch.*extra_digest"),
        ({"create_pch": "out.pch"}, "create_pch.*side effect"),
        ({"time": "t.csv"}, "time.*side effect"),
        ({"fdevice_time_trace": "t.json"}, "fdevice_time_trace.*side effect"),
    ],
)
def test_options_the_key_rejects_fail_before_compiling(cache, compiles, fields, match):
    program = Program(SRC, "c++", options(**fields))
    with pytest.raises(ValueError, match=match):
        program.compile("cubin", cache=cache)
    assert compiles.count == 0
    assert cache.stats().stores == 0


def test_refusals_of_content_the_key_cannot_see_say_what_compile_cache_can_do(cache, compiles):
    """They told a ``compile(cache=)`` caller to pass ``extra_digest=``, which compile
    does not take, and libdevice's to fingerprint it with ``fingerprint_headers`` as if
    it were a user header, without saying which file."""
    nvvm = (
        'target triple = "nvptx64-nvidia-cuda"\n'
        "define void @k() {\n  ret void\n}\n"
    )  # fmt: skip
    for program, content in (
        (Program(SRC, "c++", options(pch=True)), "the precompiled header's content"),
        (Program(SRC, "c++", options(use_pch="x.pch")), "the precompiled header's content"),
        (Program(nvvm, "nvvm", options(use_libdevice=True)), "libdevice.10.bc"),
    ):
        with pytest.raises(ValueError) as refused:
            program.compile("ptx", cache=cache)
        said = str(refused.value)
        assert f"depend on {content}" in said, said
        assert "compile(cache=) takes no digest of it: compile without cache=" in said, said
        assert "make_program_cache_key(..., extra_digest=" in said, said
        assert "docs/headers.md" in said, said
    assert 'fingerprint_headers([cuda.pathfinder.find_bitcode_lib("device")])' in said
    assert compiles.count == 0 and cache.stats().stores == 0


def test_closed_program_raises_even_on_a_hit(cache, compiles):
    Program(SRC, "c++", options()).compile("cubin", cache=cache)
    program = Program(SRC, "c++", options())
    program.close()
    with pytest.raises(RuntimeError, match="closed"):
        program.compile("cubin", cache=cache)


# -- PTX loadability warning -----------------------------------------------------------------


def _ptx_warnings(caught) -> list[warnings.WarningMessage]:
    return [w for w in caught if w.category is RuntimeWarning and "may not load" in str(w.message)]


def test_ptx_hit_warns_like_a_fresh_compile(cache, compiles, monkeypatch):
    monkeypatch.setattr(_versions, "driver_version", lambda: 12000)
    program = Program(SRC, "c++", options())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        uncached = program.compile("ptx")
    with warnings.catch_warnings(record=True) as miss:
        warnings.simplefilter("always")
        program.compile("ptx", cache=cache)
    compiles.forbid()
    with warnings.catch_warnings(record=True) as hit:
        warnings.simplefilter("always")
        got = program.compile("ptx", cache=cache)
    assert got.code == uncached.code
    (fresh_w,) = _ptx_warnings(caught)
    (miss_w,) = _ptx_warnings(miss)
    (hit_w,) = _ptx_warnings(hit)
    assert str(fresh_w.message) == str(miss_w.message) == str(hit_w.message)
    assert "CUDA 12.0" in str(hit_w.message)
    # All three point at the caller's line, not into cuforge.
    assert fresh_w.filename == miss_w.filename == hit_w.filename == __file__


@pytest.mark.parametrize("driver", [None, 99000])
def test_no_ptx_warning_without_an_old_driver(cache, monkeypatch, driver):
    monkeypatch.setattr(_versions, "driver_version", lambda: driver)
    program = Program(SRC, "c++", options())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program.compile("ptx")
        program.compile("ptx", cache=cache)  # miss
        program.compile("ptx", cache=cache)  # hit
    assert _ptx_warnings(caught) == []


# -- single-flight --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "filestream", "sqlite"])
def test_threads_missing_one_key_compile_once(tmp_path, compiles, reference_cubin, kind):
    cache = {
        "memory": InMemoryProgramCache,
        "filestream": lambda: FileStreamProgramCache(tmp_path / "c"),
        "sqlite": lambda: SQLiteProgramCache(tmp_path / "cache.db"),
    }[kind]()
    n = 8
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def work(i: int) -> None:
        try:
            program = Program(SRC, "c++", options())
            barrier.wait(timeout=30)
            results[i] = program.compile("cubin", cache=cache)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with cache:
        assert not errors, errors
        assert compiles.count == 1
        assert all(r is not None and r.code == reference_cubin for r in results)
        assert cache.stats().stores == 1


@posix_only
def test_processes_missing_one_key_compile_once(tmp_path, reference_cubin):
    import hashlib

    root, counter, barrier = tmp_path / "cache", tmp_path / "compiles.txt", tmp_path / "barrier"
    barrier.mkdir()
    n = 4
    args = {"cache": str(root), "counter": str(counter), "barrier": str(barrier), "parties": n}
    procs = [
        subprocess.Popen(
            [sys.executable, WORKERS, "compile", json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    compilers = counter.read_text().split()
    assert len(compilers) == 1, compilers
    assert {o["sha256"] for o in outs} == {hashlib.sha256(reference_cubin).hexdigest()}
    assert sum(o["stats"]["stores"] for o in outs) == 1


def _start_holder(tmp_path, root) -> subprocess.Popen:
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [sys.executable, WORKERS, "hold", json.dumps({"cache": str(root), "ready": str(ready)})],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        assert holder.poll() is None, holder.stderr.read()
        assert time.monotonic() < deadline, "holder never took the lock"
        time.sleep(0.01)
    assert ready.read_text() == "held"
    return holder


@posix_only
def test_killed_lock_holder_does_not_block_the_compile(tmp_path, compiles, reference_cubin):
    root = tmp_path / "cache"
    holder = _start_holder(tmp_path, root)
    result: list = []
    with FileStreamProgramCache(root) as cache:
        worker = threading.Thread(
            target=lambda: result.append(
                Program(SRC, "c++", options()).compile("cubin", cache=cache)
            )
        )
        try:
            worker.start()
            worker.join(0.5)
            # While the (live) holder has the key, the filler waits instead of compiling.
            assert worker.is_alive() and compiles.count == 0
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
        worker.join(60)
        assert not worker.is_alive(), "the compile stayed blocked after its lock holder died"
        assert compiles.count == 1 and result[0].code == reference_cubin


class ShortLockCache(FileStreamProgramCache):
    """A FileStream cache whose single-flight lock gives up after half a second."""

    def lock(self, key, timeout=0.5):
        return super().lock(key, timeout=timeout)


@posix_only
def test_hung_lock_holder_costs_a_compile_not_a_hang(tmp_path, compiles, reference_cubin):
    root = tmp_path / "cache"
    holder = _start_holder(tmp_path, root)
    try:
        with ShortLockCache(root) as cache:
            obj = Program(SRC, "c++", options()).compile("cubin", cache=cache)
            assert obj.code == reference_cubin and compiles.count == 1
            # It still stored its result for everyone else.
            assert cache.get(cubin_key()) == reference_cubin
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
