"""4 KiB get and set on every cache backend, and SQLite beside ``diskcache``.

One workload for all: ``get`` is the median of repeated hits on one warm entry;
``set`` stores distinct keys (a new row or file each time) and reports the mean
per call over the whole run -- WAL checkpoints and renames included -- and the
99th percentile of single calls. Every persistent cache runs with ``durable`` off
(diskcache's defaults: WAL, ``synchronous=NORMAL``), a 1 GiB cap that is never
reached (so each write pays its size check but no eviction), in a fresh temporary
directory. ``diskcache`` is installed only in the bench venv (``make bench``);
without it its column is ``-``. Run standalone::

    python benchmarks/bench_backends.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench_storage import _timed_calls

KIB = 1024
CAP = 1 << 30
#: Factory: a directory that exists and is empty -> an open cache with the mapping API.
Factory = Callable[[str], Any]


def factories() -> dict[str, Factory]:
    """The backends to compare, by the name printed in the table."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from cuforge.storage import (
        FileStreamProgramCache,
        InMemoryProgramCache,
        SQLiteProgramCache,
    )

    found: dict[str, Factory] = {
        "memory": lambda d: InMemoryProgramCache(max_size_bytes=CAP),
        "filestream": lambda d: FileStreamProgramCache(d, max_size_bytes=CAP),
        "sqlite": lambda d: SQLiteProgramCache(os.path.join(d, "c.db"), max_size_bytes=CAP),
    }
    try:
        import diskcache
    except ImportError:
        return found
    found["diskcache"] = lambda d: diskcache.Cache(d, size_limit=CAP)
    return found


def bench_get(factory: Factory, root: str, n: int, size: int = 4 * KIB) -> float:
    """Median microseconds of ``cache.get(key)`` on one warm ``size``-byte entry."""
    cache = factory(root)
    key, payload = b"k" * 32, os.urandom(size)
    cache[key] = payload
    assert cache.get(key) == payload
    get = cache.get
    _timed_calls(lambda: get(key), 2000)
    median = statistics.median(_timed_calls(lambda: get(key), n)) * 1e6
    cache.close()
    return median


def bench_set(factory: Factory, root: str, n: int, size: int = 4 * KIB) -> tuple[float, float]:
    """(mean, p99) microseconds of ``cache[key] = value`` over ``n`` distinct keys."""
    cache = factory(root)
    payload = os.urandom(size)
    keys = [i.to_bytes(8, "little") * 4 for i in range(n + 200)]
    for key in keys[n:]:  # warm up: connection, statements, first pages
        cache[key] = payload
    lat = []
    t_all = time.perf_counter()
    for key in keys[:n]:
        t0 = time.perf_counter()
        cache[key] = payload
        lat.append(time.perf_counter() - t0)
    mean = (time.perf_counter() - t_all) / n * 1e6
    cache.close()
    lat.sort()
    return mean, lat[int(len(lat) * 0.99)] * 1e6


def run(n_get: int, n_set: int, rounds: int = 5) -> dict[str, dict[str, float]]:
    """``{backend: {"get": us, "set": us, "set_p99": us}}``, each the median of
    ``rounds`` runs, backends interleaved per round so drift hits all alike."""
    found = factories()
    samples: dict[str, dict[str, list[float]]] = {
        name: {"get": [], "set": [], "set_p99": []} for name in found
    }
    parent = tempfile.mkdtemp(prefix="cuforge-bench-backends-")
    try:
        for r in range(rounds):
            for name, factory in found.items():
                root = os.path.join(parent, f"{name}-{r}")
                os.makedirs(root + "-get")
                os.makedirs(root + "-set")
                samples[name]["get"].append(bench_get(factory, root + "-get", n_get))
                mean, p99 = bench_set(factory, root + "-set", n_set)
                samples[name]["set"].append(mean)
                samples[name]["set_p99"].append(p99)
                shutil.rmtree(root + "-get")
                shutil.rmtree(root + "-set")
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    return {
        name: {what: statistics.median(v) for what, v in by.items()} for name, by in samples.items()
    }


TARGETS = {"sqlite": ("<= 20 us", "<= 200 us")}


def table(results: dict[str, dict[str, float]]) -> list[tuple[str, str, str, str, str]]:
    """Rows (backend, get, set mean, set p99, target) plus SQLite / diskcache ratios."""
    rows = []
    for name, r in results.items():
        get_t, set_t = TARGETS.get(name, ("", ""))
        target = f"get {get_t}, set {set_t}" if get_t else ""
        rows.append(
            (name, f"{r['get']:.2f} us", f"{r['set']:.1f} us", f"{r['set_p99']:.0f} us", target)
        )
    if "diskcache" in results:
        s, d = results["sqlite"], results["diskcache"]
        rows.append(
            (
                "sqlite / diskcache",
                f"{s['get'] / d['get']:.2f}x",
                f"{s['set'] / d['set']:.2f}x",
                f"{s['set_p99'] / d['set_p99']:.2f}x",
                "<= 1.00x",
            )
        )
    return rows


def print_table(rows: list[tuple[str, str, str, str, str]]) -> None:
    head = ("4 KiB entries", "get (median)", "set (mean)", "set p99", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, *rows]:
        print(
            "  ".join(
                f"{c:<{widths[i]}}" if i in (0, 4) else f"{c:>{widths[i]}}" for i, c in enumerate(r)
            )
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    args = ap.parse_args(argv)
    results = run(5000 if args.quick else 20000, 1000 if args.quick else 5000)
    print_table(table(results))
    if "diskcache" not in results:
        print("\ndiskcache is not importable here: run `make bench` for its column.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
