"""Memory under load: 1,000,000 hits over 10,000 keys in one process per backend (CI:
50,000), and compile hits over many header-tracked programs; RSS after the warm-up
and at the end must stay within a bound, and every in-process memo is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _figures import SCALES, pick, record

WORKER = str(Path(__file__).with_name("_memworker.py"))
KEYS = 10_000
GROWTH_BOUND = 16 << 20  # bytes of RSS a steady hit loop may add, allocator noise included


def run_worker(spec: dict) -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, WORKER, json.dumps(spec)], capture_output=True, text=True, env=env,
        timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def url_for(backend: str, tmp: Path, request: pytest.FixtureRequest) -> dict:
    if backend == "memory":
        return {"url": "memory://"}
    if backend == "filestream":
        return {"url": f"file://{tmp / 'fs'}"}
    if backend == "sqlite":
        return {"url": f"sqlite://{tmp / 'cache.db'}"}
    if backend == "signed-filestream":
        return {"url": f"file://{tmp / 'fs'}", "secret": "memory-test-secret-0123456789abcd"}
    redis_url = request.getfixturevalue("redis_server").url
    if backend == "redis":
        return {"url": redis_url}
    if backend == "tiered":
        return {"url": f"memory://?max_size=2M,file://{tmp / 'fs'},{redis_url}"}
    raise ValueError(backend)


@pytest.mark.parametrize(
    "backend", ["memory", "filestream", "signed-filestream", "sqlite", "redis", "tiered"]
)
@SCALES
def test_hits_over_ten_thousand_keys_keep_memory_bounded(backend, scale, tmp_path, request):
    hits = pick(scale, 50_000, 1_000_000)
    spec = {**url_for(backend, tmp_path, request), "keys": KEYS, "hits": hits, "value": 1024}
    out = run_worker(spec)
    growth = max(out["peak"], out["final"]) - out["base"]
    assert out["hits"] >= hits
    assert growth < GROWTH_BOUND, out
    record(
        "memory", backend, f"{hits:,} hits over {KEYS:,} keys (1 KiB values), one process",
        hits,
        f"RSS {out['base'] / 2**20:.1f} MiB after warm-up, +{growth / 2**20:.2f} MiB at the "
        f"end (bound {GROWTH_BOUND >> 20} MiB); {out['hits_per_s']:,.0f} hits/s",
        scale=scale, lost=0, rss_base=out["base"], rss_growth=growth,
        hits_per_s=round(out["hits_per_s"]),
    )  # fmt: skip


@SCALES
def test_compile_hits_over_many_tracked_programs_keep_memory_bounded(tmp_path, scale) -> None:
    programs = pick(scale, 40, 300)
    hits = pick(scale, 20_000, 200_000)
    (tmp_path / "inc").mkdir()
    for i in range(programs):
        (tmp_path / "inc" / f"h{i}.h").write_text(f"#define VALUE {i}\n")
        (tmp_path / f"p{i}.cu").write_text(
            f'#include "h{i}.h"\nextern "C" __global__ void k(int* a) {{ *a = VALUE; }}\n'
        )
    out = run_worker({"compile": str(tmp_path), "programs": programs, "hits": hits})
    growth = max(out["peak"], out["final"]) - out["base"]
    assert growth < GROWTH_BOUND, out
    record(
        "memory", "memory (compile)",
        f"{hits:,} compile(cache=) hits over {programs} header-tracked programs", hits,
        f"RSS +{growth / 2**20:.2f} MiB after warm-up (bound {GROWTH_BOUND >> 20} MiB); "
        f"{out['hits_per_s']:,.0f} compile hits/s",
        scale=scale, lost=0, rss_growth=growth, hits_per_s=round(out["hits_per_s"]),
    )  # fmt: skip


def test_every_in_process_memo_has_a_bound(tmp_path: Path) -> None:
    """Each memo, driven past its bound, stays within it."""
    from cuforge.compile.cache import _includes, _manifest, _tracking

    saved = (
        dict(_tracking._scan_memo), dict(_tracking._validated), dict(_includes._analysis),
        *(dict(m._items) for m in (_manifest._digests, _manifest._decoded, _manifest._prepared)),
    )  # fmt: skip
    try:
        _drive_every_memo(tmp_path)
    finally:  # leave the process's real memos as they were
        for memo, items in zip(
            (_tracking._scan_memo, _tracking._validated, _includes._analysis,
             _manifest._digests._items, _manifest._decoded._items, _manifest._prepared._items),
            saved, strict=True,
        ):  # fmt: skip
            memo.clear()
            memo.update(items)
        _includes._analysis_bytes = sum(size for _, size in _includes._analysis.values())


def _drive_every_memo(tmp_path: Path) -> None:
    from cuforge.compile.cache import _includes, _manifest, _tracking, _watch
    from cuforge.storage import FileStreamProgramCache
    from cuforge.storage.base import KeyLocks
    from cuforge.storage.entry import CacheEntry
    from cuforge.storage.filestream._hitmemo import HitMemo

    sizes = {}
    for i in range(2 * _tracking._SCAN_MEMO_MAX + 10):
        _tracking._analysis(f'#include "h{i}.h"\n'.encode())
    sizes["_tracking._scan_memo"] = (len(_tracking._scan_memo), _tracking._SCAN_MEMO_MAX)
    for i in range(_includes._ANALYSIS_MAX + 100):
        text = f"#define H{i} {i}\n".encode()
        _includes._analysed(text, _includes.file_digest(text))
    sizes["_includes._analysis"] = (len(_includes._analysis), _includes._ANALYSIS_MAX)
    big = b"".join(b"#define M%d %s\n" % (i, b"x" * 1000) for i in range(2000))  # ~2 MB
    for i in range(20):
        text = big + b"// %d\n" % i
        _includes._analysed(text, _includes.file_digest(text))
    sizes["_includes._analysis bytes"] = (_includes._analysis_bytes, _includes._ANALYSIS_MAX_BYTES)
    roots = _tracking._roots(__import__("cuforge").compile.ProgramOptions(arch="sm_90"))
    for i in range(_tracking._VALIDATED_MAX + 100):
        _tracking._remember_valid(i.to_bytes(8, "little"), roots, b"k", 0)
    sizes["_tracking._validated"] = (len(_tracking._validated), _tracking._VALIDATED_MAX)
    for memo, name in ((_manifest._digests, "_digests"), (_manifest._decoded, "_decoded"),
                       (_manifest._prepared, "_prepared")):  # fmt: skip
        for i in range(memo._limit + 100):
            memo.put(("k", i), ("v", i))
        sizes[f"_manifest.{name}"] = (len(memo._items), memo._limit)
    hit = HitMemo(10**9, lambda names: None)
    for i in range(HitMemo.MAX_ENTRIES * 2):
        hit.remember(f"/p/{i}", (i, 1, 1), CacheEntry(b"x" * 10, b""))
    sizes["HitMemo entries"] = (len(hit), HitMemo.MAX_ENTRIES)
    for i in range(100):
        hit.remember(f"/big/{i}", (i, 1, 1), CacheEntry(b"x" * (HitMemo.MAX_BYTES // 9), b""))
    sizes["HitMemo bytes"] = (hit.nbytes, HitMemo.MAX_BYTES)
    with FileStreamProgramCache(tmp_path / "fs") as fs:
        for i in range(10_000):
            fs.get(f"k{i}".encode())
        sizes["FileStream names"] = (len(fs._locs), 4096)
        locks = fs._key_locks
    keylocks = KeyLocks()
    for i in range(1000):
        with keylocks.hold(str(i).encode(), 1.0):
            pass
    sizes["KeyLocks"] = (len(keylocks._locks), 0)
    watcher = _watch.Watcher() if _watch.watcher() is not None else None  # a private one
    if watcher is not None:
        files = []
        for i in range(60):
            d = tmp_path / "w" / str(i)
            d.mkdir(parents=True)
            for j in range(150):
                (d / f"f{j}").write_text("x")
                files.append(str(d / f"f{j}"))
        ok = [watcher.watch(files[k : k + 100], []) for k in range(0, len(files), 100)]
        sizes["watcher paths"] = (len(watcher._wds), _watch.MAX_WATCHES + 200)
        assert not all(ok)  # past the bound it declines (the caller stats instead)
        watcher.close()
    over = {name: v for name, v in sizes.items() if v[0] > v[1]}
    assert over == {}, sizes
    assert locks is not None
    record(
        "memory", "in-process memos", "each memo driven past its bound", len(sizes),
        "all within bounds: " + ", ".join(f"{k} <= {v[1]}" for k, v in sizes.items()),
        scale="all", lost=0,
    )  # fmt: skip
