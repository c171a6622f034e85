"""Warm sets (cuforge.integrations.warmsets): stored in the cache, recorded by what a
job reads or stores, prefetched in batches into a tier's local level from a real
redis-server and a real SeaweedFS S3; compiles after warm-up (cuforge._warm)."""

from __future__ import annotations

import os
import warnings

import pytest

from cuforge import _warm
from cuforge.integrations import warmsets
from cuforge.storage.base import CacheReadWarning
from cuforge.storage.urls import open_cache

META = b'{"kind":"raw","v":1}'


def _fill(url: str, n: int, size: int = 4096) -> dict[bytes, bytes]:
    data = {f"warm-test\0{i}".encode(): os.urandom(size) for i in range(n)}
    with open_cache(url) as cache:
        for k, v in data.items():
            cache.set_entry(k, v, META)
    return data


def test_a_set_round_trips_and_is_an_entry_of_its_own_kind(tmp_path) -> None:
    keys = [b"a", b"b\0c", bytes(range(256))]
    with open_cache(str(tmp_path / "c")) as cache:
        assert warmsets.load(cache, "job") is None
        assert warmsets.store(cache, "job", keys)
        assert sorted(warmsets.load(cache, "job") or []) == sorted(keys)
        (info,) = list(cache.iter_entries())
    assert b'"kind":"warm-set"' in info.meta and b'"entries":3' in info.meta


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "a\0b"])
def test_a_bad_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="warm set name"):
        warmsets.set_key(name)


def test_a_set_that_does_not_decode_is_absent_with_a_warning(tmp_path) -> None:
    with open_cache(str(tmp_path / "c")) as cache:
        meta = b'{"entries":1,"key":"job","kind":"warm-set","name":"job","v":1}'
        cache.set_entry(warmsets.set_key("job"), b"not zlib", meta)
        with pytest.warns(CacheReadWarning, match="not one; ignored"):
            assert warmsets.load(cache, "job") is None
        # a bomb: more than the bound once inflated
        import zlib

        cache.set_entry(warmsets.set_key("job"), zlib.compress(b"0" * (300 << 20)), meta)
        with pytest.warns(CacheReadWarning, match="not one; ignored"):
            assert warmsets.load(cache, "job") is None


def test_publish_replaces_or_adds(tmp_path) -> None:
    with open_cache(str(tmp_path / "c")) as cache:
        assert warmsets.publish(cache, "job", {b"a", b"b"}, replace=True) == 2
        assert warmsets.publish(cache, "job", {b"c"}, replace=False) == 3
        assert sorted(warmsets.load(cache, "job") or []) == [b"a", b"b", b"c"]
        assert warmsets.publish(cache, "job", {b"c"}, replace=True) == 1
        assert warmsets.load(cache, "job") == [b"c"]


def test_the_recorder_notes_hits_and_stores_and_journals_them_at_once(tmp_path) -> None:
    journal = tmp_path / "j"
    journal.mkdir()
    with open_cache(str(tmp_path / "c")) as cache:
        cache.set_entry(b"old", b"x", META)
        rec = warmsets.Recorder(cache, str(journal / "1.keys"))
        assert rec.get_entry(b"missing") is None
        assert rec.get_entry(b"old") is not None
        rec.set_entry(b"new", b"y", META)
        assert rec.get_entries([b"old", b"absent", b"new"])[1] is None
        assert rec.keys() == {b"old", b"new"}
        # written before close: a process killed now has told the journal already
        assert warmsets.read_journals(str(journal)) == {b"old", b"new"}
        assert (journal / "1.keys").read_bytes().count(b"\n") == 2  # each key once
        rec.close()
    # a line cut short by a kill is skipped, whole lines are kept
    (journal / "2.keys").write_bytes(b"6162\n61")
    assert warmsets.read_journals(str(journal)) == {b"old", b"new", b"ab"}


def test_local_tier_is_the_levels_from_the_first_persistent_one(tmp_path, redis_server) -> None:
    with open_cache(f"memory://,file://{tmp_path}/l,{redis_server.url}") as cache:
        tier = warmsets.local_tier(cache)
        assert tier is not None and len(tier.levels) == 2  # type: ignore[attr-defined]
    with open_cache(redis_server.url) as cache:
        assert warmsets.local_tier(cache) is None  # no local level to fetch into
    with open_cache(f"file://{tmp_path}/l,{redis_server.url}?ro") as cache:
        assert warmsets.local_tier(cache) is not None


def _prefetch_and_check(tmp_path, shared: str, n: int) -> None:
    data = _fill(shared, n)
    local = tmp_path / "local"
    with open_cache(shared) as cache:
        assert warmsets.store(cache, "job", [*data, b"never-stored"])
    with open_cache(f"file://{local},{shared}") as cache:
        keys = warmsets.load(cache, "job")
        assert keys is not None and len(keys) == n + 1
        tier = warmsets.local_tier(cache)
        assert tier is not None
        done = warmsets.prefetch(tier, keys, batch=16, workers=4)
    assert (done.listed, done.fetched, done.missing) == (n + 1, n, 1)
    # every entry is now in the local level alone, verified, with its metadata
    with open_cache(str(local), read_only=True) as alone:
        got = alone.get_entries(list(data))
    assert [e.data if e else None for e in got] == list(data.values())
    assert all(e is not None and e.meta == META for e in got)


def test_prefetch_from_redis_into_the_local_level(tmp_path, redis_server) -> None:
    _prefetch_and_check(tmp_path, redis_server.url, 100)


def test_prefetch_from_s3_into_the_local_level(tmp_path, s3_url) -> None:
    _prefetch_and_check(tmp_path, s3_url, 60)


def test_prefetch_with_the_server_down_is_a_miss_not_a_failure(tmp_path, redis_server) -> None:
    data = _fill(redis_server.url, 10)
    with open_cache(f"file://{tmp_path}/l,{redis_server.url}?timeout=0.5") as cache:
        tier = warmsets.local_tier(cache)
        assert tier is not None
        redis_server.kill()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            done = warmsets.prefetch(tier, list(data), batch=4, workers=2)
    assert (done.fetched, done.missing) == (0, 10)


def test_a_signed_cache_prefetches_only_what_verifies(tmp_path, redis_server, monkeypatch) -> None:
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", "s" * 32)
    data = _fill(redis_server.url, 5)
    with open_cache(redis_server.url, secret="t" * 32) as other:  # another secret
        other.set_entry(b"forged", b"evil", META)
    with open_cache(f"file://{tmp_path}/l,{redis_server.url}") as cache:
        tier = warmsets.local_tier(cache)
        assert tier is not None
        done = warmsets.prefetch(tier, [*data, b"forged"])
    assert (done.fetched, done.missing) == (5, 1)


_KILLED_PREFETCH = """
import itertools, sys
sys.path.insert(0, sys.argv[1])
from cuforge.integrations import warmsets
from cuforge.storage.urls import open_cache
base, shared, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
keys = [b"warm-test\\0%d" % i for i in range(n)]
for i in itertools.count():
    with open_cache(f"file://{base}/{i},{shared}") as cache:
        tier = warmsets.local_tier(cache)
        if i == 0:
            print("ready", flush=True)
        warmsets.prefetch(tier, keys, batch=8, workers=2)
"""


def test_a_prefetch_killed_at_any_moment_leaves_each_entry_whole_or_absent(
    tmp_path, redis_server
) -> None:
    """SIGKILL while a prefetch looks batches up on its threads and writes the ones
    before: every entry of the local level is one the shared level holds, byte for
    byte, or absent -- never torn -- and the size ledger agrees with the disk once the
    level is opened again (a handle that died uncounted makes the next opener scan)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    n = 300
    data = _fill(redis_server.url, n, 8192)
    src = str(Path(__file__).resolve().parents[1] / "src")
    for delay in (0.05, 0.17, 0.4):
        base = tmp_path / f"d{delay}"
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED_PREFETCH, src, str(base), redis_server.url, str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        for local in sorted(base.iterdir()):
            with open_cache(f"file://{local}") as cache:
                got = cache.get_entries(list(data))
                for entry, (key, value) in zip(got, data.items(), strict=True):
                    assert entry is None or (entry.data, entry.meta) == (value, META), key
                assert cache.stats().integrity_failures == 0
                on_disk = sum(
                    f.stat().st_size for f in (local / "entries").rglob("*") if f.is_file()
                )
                assert cache.size_bytes == on_disk  # type: ignore[attr-defined]


# -- compiles after warm-up --------------------------------------------------------------


@pytest.fixture
def warm_state():
    before = dict(_warm._state)
    _warm._warned.clear()
    yield
    _warm._state.update(before)
    _warm.mark_warm(before["warm"])  # and the compile path it switches
    _warm._warned.clear()


def test_a_compile_after_mark_warm_warns_once_and_is_counted(tmp_path, warm_state) -> None:
    import cuforge

    with open_cache(str(tmp_path / "c")) as cache:
        _warm.note_compile("triton", "before", cache)  # not warm yet: nothing
        assert cuforge.compiles_after_warm() == 0
        cuforge.mark_warm()
        with pytest.warns(_warm.CompileAfterWarmWarning, match="triton compiles add_kernel"):
            _warm.note_compile("triton", "add_kernel", cache)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same kernel again: counted, not warned
            _warm.note_compile("triton", "add_kernel", cache)
        assert cuforge.compiles_after_warm() == 2
        assert cache.stats().warm_compiles == 2


def test_a_cuforge_compile_after_mark_warm_is_warned_about(warm_state) -> None:
    import cuforge

    cuforge.mark_warm()
    program = cuforge.Program(
        'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }',
        "c++",
        cuforge.ProgramOptions(arch="sm_80", name="warm-k.cu"),
    )
    with pytest.warns(_warm.CompileAfterWarmWarning, match="cuforge compiles warm-k.cu"):
        program.compile("ptx")
    assert cuforge.compiles_after_warm() == 1


def test_warm_compiles_reach_cache_stats_and_openmetrics(tmp_path, warm_state) -> None:
    from _cli import isolated_env, run

    url = f"file://{tmp_path / 'tier-local'},{tmp_path / 'shared'}"
    with open_cache(url) as cache:
        _warm.mark_warm()
        with pytest.warns(_warm.CompileAfterWarmWarning):
            _warm.note_compile("jax", "jit_f", cache)
    env = isolated_env(tmp_path)
    shown = run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "shared"), env=env)
    assert shown.returncode == 0, shown.stderr
    assert "warm compiles" in shown.stdout and "1" in shown.stdout.split("warm compiles")[1]
    metrics = run(
        tmp_path, "cache", "stats", "--format", "openmetrics", "--cache", str(tmp_path / "shared")
    )
    assert "# TYPE cuforge_cache_warm_compiles counter" in metrics.stdout
    assert "cuforge_cache_warm_compiles_total{" in metrics.stdout
    line = next(ln for ln in metrics.stdout.splitlines() if ln.startswith("cuforge_cache_warm"))
    assert line.endswith(" 1"), line


def test_cuforge_warm_env_marks_the_process_warm_from_the_start(tmp_path) -> None:
    import subprocess
    import sys

    code = "from cuforge import _warm; print(_warm.is_warm())"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "CUFORGE_WARM": "1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "True"


def test_mark_warm_before_the_first_cached_compile_still_counts_it() -> None:
    """``Program`` loads the cache pipeline (and ``_warm``) with its first
    ``compile(cache=)``: a process marked warm before that compile still takes the
    warm path then, and a process marked not warm again leaves it."""
    import subprocess
    import sys

    code = (
        "import sys, warnings\n"
        "from cuforge import Program, ProgramOptions, mark_warm\n"
        "from cuforge.storage import InMemoryProgramCache\n"
        "assert 'cuforge.compile.cache._pipeline' not in sys.modules\n"
        "warnings.simplefilter('ignore')\n"
        "mark_warm()\n"
        "cache = InMemoryProgramCache()\n"
        "def k(n):\n"
        "    src = 'extern \"C\" __global__ void k(int* p) { *p = %d; }' % n\n"
        "    Program(src, 'c++', ProgramOptions(arch='sm_80')).compile('cubin', cache=cache)\n"
        "k(1)\n"
        "print(cache.stats().warm_compiles)\n"
        "mark_warm(False)\n"
        "k(2)\n"
        "print(cache.stats().warm_compiles, cache.stats().misses)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={k: v for k, v in os.environ.items()
                                           if not k.startswith("CUFORGE_")},
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "2"]


def _stats_json(tmp_path, url: str) -> dict[str, int]:
    import json

    from _cli import run

    shown = run(tmp_path, "cache", "stats", "--json", "--cache", url)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


@pytest.mark.parametrize("backend", ["file", "redis"])
def test_a_warm_cuforge_compile_counts_in_the_caches_stats(tmp_path, backend, request) -> None:
    """A ``Program.compile(cache=)`` miss and a ``cuforge compile`` miss in processes
    marked warm are counted in ``warm_compiles`` of the cache they went through, as
    every process sees it (``cuforge cache stats``); their hits are not."""
    import subprocess
    import sys

    from _cli import SAXPY, isolated_env, run

    if backend == "redis":
        url = f"{request.getfixturevalue('redis_server').url}?prefix=warmcount:"
    else:
        url = f"file://{tmp_path / 'c'}"
    code = (
        "import sys, warnings, cuforge\n"
        "from cuforge.storage.urls import open_cache\n"
        "warnings.simplefilter('ignore')\n"
        "src = open(sys.argv[2]).read()\n"
        "with open_cache(sys.argv[1]) as cache:\n"
        "    for _ in range(2):  # a miss, then a hit\n"
        "        p = cuforge.Program(src, 'c++', cuforge.ProgramOptions(arch='sm_80'))\n"
        "        p.compile('cubin', cache=cache)\n"
        "print(cuforge.compiles_after_warm())\n"
    )
    env = isolated_env(tmp_path, CUFORGE_WARM="1")
    out = subprocess.run([sys.executable, "-c", code, url, str(SAXPY)], env=env,
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
    assert _stats_json(tmp_path, url)["warm_compiles"] == 1
    for _ in range(2):  # the command line: a miss (sm_90), then a hit
        done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", url,
                   "-o", str(tmp_path / "k.cubin"), env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
    stats = _stats_json(tmp_path, url)
    assert (stats["warm_compiles"], stats["stores"], stats["hits"]) == (2, 2, 2)
