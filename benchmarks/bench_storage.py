"""Storage-layer benchmarks: file-stream hit latency, capped write throughput, open cost.

Every measurement is a function ``bench_*(factory, ...)`` where ``factory(path,
max_size_bytes)`` returns a cache object with the ``cuda.core.utils`` mapping API,
so the same functions can run against ``cuda.core.utils.FileStreamProgramCache``
for a side-by-side column. Run standalone::

    python benchmarks/bench_storage.py            # full sizes (about a minute)
    python benchmarks/bench_storage.py --quick    # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _results

Factory = Callable[[str, "int | None"], Any]

KIB = 1024


def _timed_calls(fn: Callable[[], object], n: int, batch: int = 100) -> list[float]:
    """Per-call seconds, measured in batches to keep timer overhead out."""
    out = []
    for _ in range(max(1, n // batch)):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        out.append((time.perf_counter() - t0) / batch)
    return out


def bench_get(factory: Factory, root: str, size: int = 4 * KIB, n: int = 20000) -> dict:
    """Median and p90 of ``cache.get(key)`` for one warm ``size``-byte entry (us)."""
    cache = factory(root, None)
    key = b"k" * 32
    payload = os.urandom(size)
    cache[key] = payload
    assert cache.get(key) == payload
    get = cache.get
    _timed_calls(lambda: get(key), 2000)  # warm up
    samples = sorted(_timed_calls(lambda: get(key), n))
    _close(cache)
    return {
        "median_us": statistics.median(samples) * 1e6,
        "p90_us": samples[int(len(samples) * 0.9)] * 1e6,
    }


def bench_capped_writes(
    factory: Factory, root: str, n: int = 20000, size: int = KIB, cap: int = 2_000_000
) -> dict:
    """``n`` distinct ``size``-byte writes under ``cap``: total seconds, p50/p99 ms."""
    cache = factory(root, cap)
    payload = os.urandom(size)
    lat = []
    t_all = time.perf_counter()
    for i in range(n):
        key = i.to_bytes(8, "little") * 4
        t0 = time.perf_counter()
        cache[key] = payload
        lat.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    _close(cache)
    # The last quarter is written with the cache full: what each further write costs.
    tail = sorted(lat[-max(1, n // 4) :])
    lat.sort()
    return {
        "tail_p50_ms": tail[len(tail) // 2] * 1e3,
        "total_s": total,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
        "disk_bytes": _disk_bytes(root),
    }


def bench_open_capped(
    factory: Factory, root: str, n: int = 20000, size: int = KIB, cap: int = 2_000_000
) -> dict:
    """Open (construct) a capped cache over an existing ``n``-entry directory (ms).

    The directory is filled uncapped first, so the open sees all ``n`` entries.
    """
    cache = factory(root, None)
    payload = os.urandom(size)
    for i in range(n):
        cache[i.to_bytes(8, "little") * 4] = payload
    _close(cache)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        c = factory(root, cap)
        times.append(time.perf_counter() - t0)
        _close(c)
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}


def bench_memory_get(factory: Callable[[], Any], size: int = 4 * KIB, n: int = 50000) -> dict:
    """Median ``get`` of an in-memory cache (us); ``factory()`` builds the cache."""
    cache = factory()
    key = b"k" * 32
    cache[key] = os.urandom(size)
    get = cache.get
    samples = sorted(_timed_calls(lambda: get(key), n))
    return {"median_us": statistics.median(samples) * 1e6}


def _close(cache: Any) -> None:
    close = getattr(cache, "close", None)
    if close is not None:
        close()


def _disk_bytes(root: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(os.path.join(root, "entries")):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_size
    return total


def cuforge_factories(durable: bool = False) -> tuple[Factory, Callable[[], Any]]:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache

    return (
        lambda path, cap: FileStreamProgramCache(path, max_size_bytes=cap, durable=durable),
        lambda: InMemoryProgramCache(),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    ap.add_argument("--dir", default=None, help="parent directory for the caches (default: tmp)")
    ap.add_argument("--writes", type=int, default=None, help="number of capped writes")
    ap.add_argument("--durable", action="store_true", help="fsync every payload (durable=True)")
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    n_writes = args.writes or (2000 if args.quick else 20000)
    n_gets = 5000 if args.quick else 50000
    fs_factory, mem_factory = cuforge_factories(args.durable)

    rows: list[tuple[str, str, str]] = []
    raw: dict[str, Any] = {"writes": n_writes, "gets": n_gets, "durable": args.durable}
    parent = tempfile.mkdtemp(prefix="cuforge-bench-", dir=args.dir)
    try:
        r = raw["filestream_get_4kib"] = bench_get(
            fs_factory, os.path.join(parent, "get"), n=n_gets
        )
        rows.append(("FileStream get 4 KiB", f"{r['median_us']:.2f} us", "<= 10 us"))
        r = bench_capped_writes(fs_factory, os.path.join(parent, "writes"), n=n_writes)
        raw["capped_writes_1kib_2mb_cap"] = r
        rows.append((f"{n_writes} x 1 KiB writes, 2 MB cap", f"{r['total_s']:.2f} s", "<= 15 s"))
        rows.append(
            ("  p50 / p99 write", f"{r['p50_ms']:.3f} / {r['p99_ms']:.3f} ms", "p99 <= 2 ms")
        )
        rows.append(("  entry bytes on disk after", f"{r['disk_bytes']:,}", "<= 2,200,000"))
        r = raw["open_capped"] = bench_open_capped(
            fs_factory, os.path.join(parent, "open"), n=n_writes
        )
        rows.append((f"open capped {n_writes}-entry cache", f"{r['median_ms']:.2f} ms", "<= 30 ms"))
        r = raw["memory_get_4kib"] = bench_memory_get(mem_factory, n=n_gets)
        rows.append(("InMemory get 4 KiB", f"{r['median_us']:.3f} us", ""))
    finally:
        shutil.rmtree(parent, ignore_errors=True)

    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'measurement':<{w0}}  {'cuforge':>{w1}}  target")
    for name, value, target in rows:
        print(f"{name:<{w0}}  {value:>{w1}}  {target}")
    _results.write(args.json, "bench_storage", raw, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
