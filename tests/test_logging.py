"""Logging, the library way: ``cuforge.cache``, ``cuforge.compile``, ``cuforge.graph``.

The library adds only a NullHandler on ``cuforge`` and sets no level. Records are
checked with caplog on real compiles and a real file cache: a hit says nothing above
DEBUG, a miss says why, a compile says its backend, flags and time, and each
fail-open cause (unwritable cache, damaged entry, unreadable entry, failing backend)
is one WARNING per cache handle, then DEBUG. Graph records need the GPU machine.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from cuforge import Linker, LinkerOptions, Program, ProgramOptions
from cuforge.storage import (
    CacheReadWarning,
    CacheWriteWarning,
    FileStreamProgramCache,
    ProgramCacheResource,
)
from cuforge.storage.entry import entry_id

ARCH = "sm_90"


def _src(n: int) -> str:
    return f'extern "C" __global__ void k{n}(int* p) {{ *p = {n}; }}\n'


def _compile(n: int, cache, name: str = "", **options) -> bytes:
    opts = ProgramOptions(arch=ARCH, name=name or None, **options)
    return Program(_src(n), "c++", opts).compile("cubin", cache=cache).code


def _records(caplog, logger: str = "cuforge") -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(logger)]


def test_the_library_adds_only_a_null_handler_and_sets_no_level():
    code = textwrap.dedent(
        """
        import logging
        import cuforge, cuforge.utils, cuforge.compile, cuforge.storage, cuforge.graph
        from cuforge import Program, ProgramOptions
        from cuforge.storage import InMemoryProgramCache
        Program('extern "C" __global__ void k() {}', "c++", ProgramOptions(arch="sm_90")
                ).compile("cubin", cache=InMemoryProgramCache())
        top = logging.getLogger("cuforge")
        assert [type(h).__name__ for h in top.handlers] == ["NullHandler"], top.handlers
        for name in ("cuforge", "cuforge.cache", "cuforge.compile", "cuforge.graph"):
            lg = logging.getLogger(name)
            assert lg.level == logging.NOTSET and lg.propagate, name
            assert name == "cuforge" or not lg.handlers, name
        assert not logging.getLogger().handlers
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert done.stderr == ""  # nothing printed through logging's last resort either


def test_a_miss_says_why_and_a_hit_says_nothing_above_debug(caplog, tmp_path):
    caplog.set_level(logging.DEBUG, logger="cuforge")
    with FileStreamProgramCache(tmp_path) as cache:
        _compile(1, cache, name="one.cu")
        miss = _records(caplog)
        caplog.clear()
        _compile(1, cache, name="one.cu")
        hit = _records(caplog)
    texts = [(r.name, r.levelno, r.getMessage()) for r in miss]
    assert any(
        n == "cuforge.cache" and "miss" in m and "one.cu: no entry for this key" in m
        for n, _, m in texts
    ), texts
    assert any(n == "cuforge.cache" and m.startswith("store ") for n, _, m in texts)
    assert all(level == logging.DEBUG for _, level, _ in texts)
    assert [(r.name, r.levelno) for r in hit] == [("cuforge.cache", logging.DEBUG)]
    assert hit[0].getMessage().startswith("hit ") and "one.cu" in hit[0].getMessage()
    # The short id is the entry's public id (as `cuforge cache ls` shows it).
    short = hit[0].getMessage().split()[1]
    assert len(short) == 12 and all(c in "0123456789abcdef" for c in short)


def test_a_header_tracked_miss_names_the_changed_header(caplog, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "value.h").write_text("#define VALUE 1\n")
    src = '#include "value.h"\nextern "C" __global__ void k(int* p) { *p = VALUE; }\n'
    opts = ProgramOptions(arch=ARCH, name="tracked.cu")
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        Program(src, "c++", opts).compile("cubin", cache=cache)
        (tmp_path / "value.h").write_text("#define VALUE 22\n")  # another size: a real edit
        caplog.set_level(logging.DEBUG, logger="cuforge")
        Program(src, "c++", opts).compile("cubin", cache=cache)
    misses = [r.getMessage() for r in _records(caplog, "cuforge.cache") if " miss " in f" {r.msg}"]
    assert any("tracked.cu: header" in m and "value.h" in m for m in misses), misses


def test_a_compile_logs_its_backend_flags_and_time(caplog):
    caplog.set_level(logging.DEBUG, logger="cuforge.compile")
    opts = ProgramOptions(arch=ARCH, name="flags.cu", relocatable_device_code=True)
    obj = Program(_src(2), "c++", opts).compile("cubin")
    (record,) = _records(caplog, "cuforge.compile")
    message = record.getMessage()
    assert record.levelno == logging.DEBUG
    assert message.startswith("NVRTC compiled flags.cu to cubin in ")
    assert f"({len(obj.code)} bytes)" in message
    for flag in opts.as_nvrtc_options():
        assert flag.decode() in message
    caplog.clear()
    ltoir = Program(_src(3), "c++", ProgramOptions(arch=ARCH, link_time_optimization=True))
    linked = Linker(
        ltoir.compile("ltoir"), options=LinkerOptions(arch=ARCH, link_time_optimization=True)
    ).link("cubin")
    messages = [r.getMessage() for r in _records(caplog, "cuforge.compile")]
    assert messages[0].startswith(f"NVRTC compiled {ltoir.options.name} to ltoir in ")
    assert messages[1].startswith("nvJitLink compiled 1 inputs to cubin in ")
    assert f"({len(linked.code)} bytes): -arch=sm_90 -lto" in messages[1]


def test_nothing_is_logged_at_the_default_level(caplog, tmp_path):
    caplog.set_level(logging.WARNING)
    with FileStreamProgramCache(tmp_path) as cache:
        _compile(4, cache)
        _compile(4, cache)
    assert _records(caplog) == []


# -- fail-open events: one WARNING per cause and handle ----------------------------------


def _causes(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.cuforge_cause) for r in _records(caplog) if hasattr(r, "cuforge_cause")]


def test_write_failures_warn_once_then_debug_beside_the_cache_write_warning(caplog, tmp_path):
    caplog.set_level(logging.DEBUG, logger="cuforge")
    cache = FileStreamProgramCache(tmp_path)
    (tmp_path / "tmp").rmdir()
    (tmp_path / "tmp").write_bytes(b"not a directory")  # every write fails
    with pytest.warns(CacheWriteWarning):
        _compile(5, cache)
        _compile(6, cache)
    assert cache.stats().write_failures == 2
    assert _causes(caplog) == [(logging.WARNING, "write"), (logging.DEBUG, "write")]
    (warning,) = [r for r in _records(caplog) if r.levelno == logging.WARNING]
    assert str(tmp_path) in warning.getMessage() and "could not store" in warning.getMessage()
    # Another handle on the same directory warns again: "once" is per handle.
    caplog.clear()
    other = FileStreamProgramCache(tmp_path)
    with pytest.warns(CacheWriteWarning):
        _compile(7, other)
    assert _causes(caplog) == [(logging.WARNING, "write")]
    cache.close()
    other.close()


def test_each_cause_warns_once_per_handle(caplog, tmp_path):
    with FileStreamProgramCache(tmp_path) as cache:
        for n in range(8, 12):
            _compile(n, cache, name=f"k{n}.cu")
        # Two damaged entries, then two unreadable ones: a file where their shard
        # directory belongs. (A directory where a sidecar was is a foreign object now,
        # an integrity miss: test_storage_filestream.py.)
        shards = {Path(cache._loc(_key_of(n)).payload).parent for n in (10, 11)}
        assert len(shards) == 2 and not shards & {
            Path(cache._loc(_key_of(n)).payload).parent for n in (8, 9)
        }
        for n in (8, 9):
            payload = cache._loc(_key_of(n)).payload
            data = bytearray(Path(payload).read_bytes())
            data[len(data) // 2] ^= 0x40
            Path(payload).write_bytes(bytes(data))
        for shard in shards:
            shutil.rmtree(shard)
            shard.write_bytes(b"a file where a shard directory belongs")
        caplog.set_level(logging.DEBUG, logger="cuforge")
        with warnings.catch_warnings():
            # The file in the shard's place may also stop the recompiled entry's store.
            warnings.simplefilter("ignore", CacheWriteWarning)
            for n in range(8, 12):
                assert _compile(n, cache, name=f"k{n}.cu")[:4] == b"\x7fELF"  # never a failure
        assert cache.stats().integrity_failures == 2
    causes = _causes(caplog)
    assert causes.count((logging.WARNING, "integrity")) == 1
    assert causes.count((logging.DEBUG, "integrity")) == 1
    assert causes.count((logging.WARNING, "read")) == 1
    assert (logging.DEBUG, "read") in causes
    warned = [r.getMessage() for r in _records(caplog) if r.levelno == logging.WARNING]
    assert any("failed its integrity check" in m and entry_id(_key_of(8))[:12] in m for m in warned)
    assert any("could not read an entry" in m and "Not a directory" in m for m in warned)


def _key_of(n: int) -> bytes:
    from cuforge.utils import make_program_cache_key

    return make_program_cache_key(
        code=_src(n),
        code_type="c++",
        options=ProgramOptions(arch=ARCH, name=f"k{n}.cu"),
        target_type="cubin",
    )


class _DownBackend(ProgramCacheResource):
    """A backend whose server is gone: every call raises, as a client library would."""

    def get(self, key, default=None):
        raise ConnectionError("connection refused")

    def __getitem__(self, key):
        raise ConnectionError("connection refused")

    def __setitem__(self, key, value):
        raise ConnectionError("connection refused")

    def __delitem__(self, key):
        raise ConnectionError("connection refused")

    def __len__(self):
        return 0

    def clear(self):
        pass


def test_a_backend_that_is_down_warns_once_per_cause(caplog):
    caplog.set_level(logging.DEBUG, logger="cuforge")
    down = _DownBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (12, 13):
            assert _compile(n, down)[:4] == b"\x7fELF"
    # once per handle and kind: the failed lookup is a read warning, the store a write one
    kinds = [w.category for w in caught if issubclass(w.category, RuntimeWarning)]
    assert kinds == [CacheReadWarning, CacheWriteWarning], caught
    causes = _causes(caplog)
    # Each cause: a WARNING the first time, DEBUG every time after.
    for cause in ("unavailable", "write"):
        levels = [level for level, c in causes if c == cause]
        assert levels[0] == logging.WARNING and len(levels) >= 2, causes
        assert set(levels[1:]) == {logging.DEBUG}, causes


# -- graphs (GPU machine) ------------------------------------------------------------------


def test_graph_records_arrive_on_cuforge_graph_through_cuforge_log():
    # A fresh process that imports the graph layer before anything else logs: the
    # loggers come from cuforge._log, so the cuforge NullHandler is in place.
    code = textwrap.dedent(
        """
        import cuforge.graph
        import logging
        from cuforge import _log
        from cuforge.graph import _exec, _owners
        top = logging.getLogger("cuforge")
        assert [type(h).__name__ for h in top.handlers] == ["NullHandler"], top.handlers
        graph = logging.getLogger("cuforge.graph")
        assert _exec._log is _owners._log is _log.get_logger("cuforge.graph") is graph
        seen = []
        class Keep(logging.Handler):
            def emit(self, record):
                seen.append((record.name, record.levelno, record.getMessage()))
        logging.getLogger().addHandler(Keep())
        _owners._release([])  # what the native release callback calls: no GPU needed
        assert seen == [], seen  # DEBUG is off by default
        top.setLevel(logging.DEBUG)
        _owners._release([])
        assert seen == [("cuforge.graph", logging.DEBUG,
                         "released 0 owner bundles (0 still held by CUDA)")], seen
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.gpu
def test_graph_instantiate_launch_close_and_release_log_at_debug(caplog):
    from cuforge import Device
    from cuforge.graph import GraphDefinition, _owners

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    buf = dev.allocate(64)
    caplog.set_level(logging.DEBUG, logger="cuforge.graph")
    g = GraphDefinition()
    g.memset(buf, 7, 64)
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    g.close()
    exe.close()
    del buf

    def released() -> bool:
        return any(r.getMessage().startswith("released ") for r in caplog.records)

    assert _owners.wait_until(released)  # CUDA frees user objects asynchronously
    messages = [r.getMessage() for r in _records(caplog, "cuforge.graph")]
    assert all(r.levelno == logging.DEBUG for r in _records(caplog, "cuforge.graph"))
    assert any(m.startswith("instantiate graph 0x") and " exec 0x" in m for m in messages)
    assert any(m.startswith("launch exec 0x") and "on stream 0x" in m for m in messages)
    assert any(m.startswith("close exec 0x") for m in messages)
    assert any(m.startswith("released ") and "owner bundles" in m for m in messages), messages
    stream.close()
