"""The hot paths a restructuring must not slow, beside their peers, in one run.

``make_program_cache_key`` (1 KB source), ``compile(cubin, cache=FileStream)`` hit
(1 KB), FileStream ``get`` (4 KiB) -- each beside cuda.core 1.2.2 when importable --
and SQLite ``get`` (4 KiB) beside diskcache when installed. Rounds interleave the
two sides so machine drift hits both; each row is the median over rounds of each
round's median, with the ratio cuforge / peer (below 1 is better). The rows are the
same functions ``make bench`` times (``bench_compile``, ``bench_storage``,
``bench_backends``), so numbers compare with its table.

To compare two trees (before and after a change), run it once with each tree's
``src`` first on ``PYTHONPATH``:
``PYTHONPATH=src .bench-venv/bin/python benchmarks/bench_hotpaths.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results
import bench_backends as bb
import bench_compile as bc
import bench_storage as bs


def _cuda_core_filestream() -> bs.Factory | None:
    try:
        from cuda.core.utils import FileStreamProgramCache
    except ImportError:
        return None
    return lambda path, cap: FileStreamProgramCache(path, max_size_bytes=cap)


def run(rounds: int, n: int) -> dict[str, dict[str, Any]]:
    """``{row: {"cuforge": [us per round], "peer": [...], "peer_name": str}}``."""
    ours, theirs = bc.cuforge_api(), bc.cuda_core_api()
    fs_ours, _ = bs.cuforge_factories()
    fs_theirs = _cuda_core_filestream()
    found = bb.factories()
    rows: dict[str, dict[str, Any]] = {
        "make_program_cache_key, 1 KB": {"peer_name": "cuda.core"},
        "compile(cubin, cache=FileStream) hit, 1 KB": {"peer_name": "cuda.core"},
        "FileStream get, 4 KiB": {"peer_name": "cuda.core"},
        "SQLite get, 4 KiB": {"peer_name": "diskcache"},
    }
    for row in rows.values():
        row["cuforge"], row["peer"] = [], []
    key, hit, fs, sql = rows.values()
    parent = tempfile.mkdtemp(prefix="cuforge-bench-hot-")
    try:
        for r in range(rounds):
            key["cuforge"].append(bc.bench_key(ours, n))
            if theirs:
                key["peer"].append(bc.bench_key(theirs, n))
            hit["cuforge"].append(bc.bench_hit(ours, n // 2))
            if theirs:
                hit["peer"].append(bc.bench_hit(theirs, n // 2))
            fs["cuforge"].append(bs.bench_get(fs_ours, f"{parent}/fs-{r}", n=n)["median_us"])
            if fs_theirs:
                fs["peer"].append(bs.bench_get(fs_theirs, f"{parent}/cc-{r}", n=n)["median_us"])
            for side, name in (("cuforge", "sqlite"), ("peer", "diskcache")):
                if name in found:
                    root = f"{parent}/{name}-{r}"
                    os.makedirs(root)
                    sql[side].append(bb.bench_get(found[name], root, n))
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and rounds (smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (5)")
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    n = 2000 if args.quick else 20000
    rows = run(rounds, n)
    print(f"{'':44} {'cuforge':>10} {'peer':>10} {'ratio':>7}  peer")
    raw: dict[str, Any] = {"rounds": rounds, "calls": n, "us": {}}
    for name, row in rows.items():
        ours = statistics.median(row["cuforge"])
        peer = statistics.median(row["peer"]) if row["peer"] else None
        ratio = f"{ours / peer:.2f}x" if peer else "-"
        shown = f"{peer:.2f} us" if peer else "-"
        print(f"{name:44} {ours:7.2f} us {shown:>10} {ratio:>7}  {row['peer_name']}")
        raw["us"][name] = {"cuforge": ours, "peer": peer, "peer_name": row["peer_name"]}
    _results.write(args.json, "bench_hotpaths", raw, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
