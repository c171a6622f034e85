"""``make bench``: the program-cache targets, cuforge beside cuda.core 1.2.2, one run.

The Redis rows (bench_fleet.py) run against a private redis-server on a loopback
port; cuda.core has no remote cache, so their cuda.core column is empty. The
``cli:`` rows (bench_cli.py) time whole ``cuforge`` processes; their ratio column
is the ratio to ``python -c pass`` measured interleaved with them.

Prints one table: each measurement for cuforge, for cuda.core (when importable),
their ratio (cuforge / cuda.core; below 1 is better) and the target; then 4 KiB
get/set on every backend with SQLite beside diskcache (``bench_backends``). The
logging rows show what cuforge's log calls cost a hit (bench_logging.py). GPU
benchmarks (launch overhead, graphs) need the GPU machine: see bench_launch.py and
bench_graph.py.

cuda.core rewrites the whole directory scan on every capped write, so its 20,000
write run would take many minutes: it runs ``--cc-writes`` writes (default 3,000)
and its total for 20,000 is extrapolated from the median of its last quarter of
writes, all made with the cache full (marked ``~``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results
import bench_backends as bb
import bench_cli as bcli
import bench_compile as bc
import bench_fleet as bf
import bench_logging as bl
import bench_storage as bs


def _cuda_core_storage() -> tuple[bs.Factory, Callable[[], Any]] | None:
    try:
        from cuda.core.utils import FileStreamProgramCache, InMemoryProgramCache
    except ImportError:
        return None
    return (
        lambda path, cap: FileStreamProgramCache(path, max_size_bytes=cap),
        lambda: InMemoryProgramCache(),
    )


def _fmt(value: float | None, unit: str, approx: bool = False) -> str:
    if value is None:
        return "-"
    digits = 2 if value < 100 else 0
    return f"{'~' if approx else ''}{value:.{digits}f} {unit}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument("--writes", type=int, default=20000, help="capped writes for cuforge")
    ap.add_argument("--cc-writes", type=int, default=3000, help="capped writes for cuda.core")
    ap.add_argument("--processes", type=int, default=None, help="Redis stampede size (64)")
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    n_writes = 2000 if args.quick else args.writes
    n_cc = min(n_writes, 1000 if args.quick else args.cc_writes)
    n_calls = 2000 if args.quick else 20000

    ours = bc.cuforge_api()
    theirs = bc.cuda_core_api()
    fs_ours, mem_ours = bs.cuforge_factories()
    storage_theirs = _cuda_core_storage()
    parent = tempfile.mkdtemp(prefix="cuforge-bench-")
    rows: list[tuple[str, str, str, str, str]] = []
    # The same numbers unformatted, for --json: measurement -> cuforge, cuda.core, unit.
    raw: dict[str, Any] = {"measurements": {}}

    def add(name: str, a: float, b: float | None, unit: str, target: str, approx=False) -> None:
        ratio = f"{a / b:.2f}x" if b else "-"
        rows.append((name, _fmt(a, unit), _fmt(b, unit, approx), ratio, target))
        raw["measurements"][name.strip()] = {
            "cuforge": a,
            "cuda.core": b or None,
            "unit": unit,
            "target": target,
            **({"cuda.core_extrapolated": True} if approx and b else {}),
        }

    def sub(name: str) -> str:
        return os.path.join(parent, name)

    try:
        add(
            "make_program_cache_key, 1 KB",
            bc.bench_key(ours, n_calls),
            theirs and bc.bench_key(theirs, n_calls),
            "us",
            "<= 5 us",
        )
        add(
            "compile(cubin, cache=FileStream) hit, 1 KB",
            bc.bench_hit(ours, n_calls // 2),
            theirs and bc.bench_hit(theirs, n_calls // 2),
            "us",
            "<= 15 us",
        )
        logged = bl.bench_hit_logging(*((1000, 3) if args.quick else (5000, 7)))
        raw["logging_hit_us"] = logged
        cost = logged["off"] - logged["stripped"]
        for label, value in (
            ("  same hit, no logging code (level checks removed)", logged["stripped"]),
            ("  same hit, logging as shipped (DEBUG off)", logged["off"]),
            ("  same hit, DEBUG on (records dropped)", logged["debug"]),
        ):
            rows.append((label, _fmt(value, "us"), "-", "-", ""))
        rows.append(
            (
                "  logging cost of a hit, DEBUG off",
                f"{cost * 1e3:+.0f} ns ({cost / logged['off']:+.1%})",
                "-",
                "-",
                "not measurable",
            )
        )
        got = bs.bench_get(fs_ours, sub("get-ours"), n=n_calls)["median_us"]
        ref = storage_theirs and bs.bench_get(storage_theirs[0], sub("get-cc"), n=n_calls)
        add("FileStream get, 4 KiB", got, ref and ref["median_us"], "us", "<= 10 us")

        w = bs.bench_capped_writes(fs_ours, sub("w-ours"), n=n_writes)
        wr = None
        if storage_theirs:
            wr = bs.bench_capped_writes(storage_theirs[0], sub("w-cc"), n=n_cc)
            # Extrapolate: the writes past n_cc cost what its over-cap writes cost.
            wr["total_s"] += (n_writes - n_cc) * wr["tail_p50_ms"] / 1e3
        add(
            f"{n_writes} x 1 KiB writes, 2 MB cap: total",
            w["total_s"],
            wr and wr["total_s"],
            "s",
            "<= 15 s",
            approx=n_cc < n_writes,
        )
        add("  p99 write", w["p99_ms"], wr and wr["p99_ms"], "ms", "<= 2 ms")
        add(
            "  entry bytes on disk after (cap 2,000,000)",
            w["disk_bytes"] / 1e6,
            wr and wr["disk_bytes"] / 1e6,
            "MB",
            "<= 2.2 MB",
        )

        o = bs.bench_open_capped(fs_ours, sub("open-ours"), n=n_writes)["median_ms"]
        oc = storage_theirs and bs.bench_open_capped(storage_theirs[0], sub("open-cc"), n=n_writes)
        add(f"open capped {n_writes}-entry cache", o, oc and oc["median_ms"], "ms", "<= 30 ms")

        m = bs.bench_memory_get(mem_ours, n=n_calls)["median_us"]
        mc = storage_theirs and bs.bench_memory_get(storage_theirs[1], n=n_calls)["median_us"]
        add("InMemory get, 4 KiB", m, mc, "us", "")

        missing = bf.redis_available()
        if missing:
            rows.append((f"Redis rows skipped: {missing}", "-", "-", "-", ""))
        else:
            hits = raw["fleet_compile_hit_1kb_us"] = bf.bench_hits(1000 if args.quick else 5000)
            add("compile(cubin, cache=Redis) hit, 1 KB", hits["redis_hit_us"], None, "us",
                "<= 250 us")  # fmt: skip
            add("compile(cubin, cache=memory->Redis) repeat hit", hits["tiered_hit_us"], None,
                "us", "<= 15 us")  # fmt: skip
            st = raw["stampede"] = bf.bench_stampede(args.processes or (8 if args.quick else 64))
            rows.append((
                f"{st['processes']} processes x {st['kernels']} kernels, cold Redis: compiles",
                str(st["compiles"]), "-", "-", f"<= {st['kernels']}",
            ))  # fmt: skip

        plain, cached, pct = bc.bench_miss_overhead(ours, 6 if args.quick else 12)
        raw["miss_overhead"] = {"uncached_ms": plain, "cached_miss_ms": cached, "percent": pct}
        rows.append(("miss overhead over uncached compile", f"{pct:+.2f} %", "-", "-", "<= 2 %"))
        rows.append(("  (uncached / cached miss)", f"{plain:.1f}/{cached:.1f} ms", "", "", ""))

        from cuforge.compile.cache._toolkit import toolkit_include_dirs

        dirs = toolkit_include_dirs()
        pair = [(ours, ())] + ([(theirs, dirs)] if theirs else [])
        misses = bc.bench_cub_misses(pair, rounds=2 if args.quick else 4)
        add(
            "CUB kernel, compile(cache=) miss",
            misses[0],
            misses[1] if len(misses) > 1 else None,
            "ms",
            "",
        )
        n_hits = 500 if args.quick else 2000
        cub_hit = bc.bench_cub_hit(ours, hits=n_hits)
        ref_hit = theirs and bc.bench_cub_hit(theirs, dirs, hits=n_hits)
        add("CUB kernel, compile(cache=) hit", cub_hit or 0.0, ref_hit, "us", "<= 15 us")
        extra_ns, locate_ms = bc.bench_header_identity(200_000 if args.quick else 1_000_000)
        add("  header-set identity, added per hit", extra_ns, None, "ns", "<= 1000 ns")
        add("  locating the header sets, once per process", locate_ms, None, "ms", "")

        # The command line from cold processes (cuda.core has none): the x-pass
        # ratio goes in the ratio column.
        cli_args = (5, 1) if args.quick else (20, 3)
        raw["cli"] = bcli.measure(*cli_args)
        for name, value, ratio, target in bcli.rows(*cli_args, raw["cli"]):
            rows.append((f"cli: {name}", value, "-", ratio or "-", target))
    finally:
        shutil.rmtree(parent, ignore_errors=True)

    head = ("measurement", "cuforge", "cuda.core 1.2.2", "ratio", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, *rows]:
        print(
            "  ".join(
                f"{c:<{widths[i]}}" if i == 0 else f"{c:>{widths[i]}}" for i, c in enumerate(r)
            )
        )
    if theirs is None:
        print("\ncuda.core is not importable here: run `make bench` for the side-by-side column.")
    else:
        print(
            "\ncuda.core compiles CUB only when handed the include directories; a '-' hit means"
            " its cache refuses include paths (no extra_digest through compile(cache=))."
        )
    print()
    n_sets = 1000 if args.quick else 5000
    backends = bb.run(n_calls, n_sets)
    bb.print_table(bb.table(backends))
    if "diskcache" not in backends:
        print("\ndiskcache is not importable here: run `make bench` for its row.")
    raw["backends"] = {"gets": n_calls, "sets": n_sets, "entry_bytes": 4096}
    raw["backends"]["backends_us"] = backends
    raw["quick"] = args.quick
    _results.write(args.json, "run", raw, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
