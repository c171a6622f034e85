"""Triton through cuforge beside stock Triton, in one run (needs triton; no GPU).

Two measurements, each side by side:

- Hit: one process compiles a kernel for ``GPUTarget("cuda", 90, 32)``, then times
  ``triton.compile`` of the same kernel again (a cache hit: Triton's key, the cache
  lookup, loading the kernel's metadata) -- after the first call, so libtriton's
  ~0.4 s hashing is out of both. Stock ``FileCacheManager`` on a local directory
  against ``CuforgeCacheManager`` on a local file cache (goal <= 1.2x stock), SQLite,
  Redis (goal <= 2x stock local) and a file->Redis tier. The cache is filled by an
  earlier process and the hit process starts with an empty ``TRITON_CACHE_DIR``
  (except stock, which has only its directory); 3 interleaved rounds, best median kept.
- Cold start: 8 processes start together on an empty cache and compile one kernel:
  how many compiled, and the wall time of the slowest (barrier to last exit).

Run::

    .venv-int/bin/python benchmarks/bench_integrations.py          # make test-integrations' venv
    .venv-int/bin/python benchmarks/bench_integrations.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results

ROOT = Path(__file__).resolve().parent.parent
CHILD = str(ROOT / "tests" / "_triton_child.py")
MANAGER = "cuforge.integrations.triton:CuforgeCacheManager"


def _env(triton_dir: Path, cache_url: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUFORGE_", "TRITON_"))}
    env.update(TRITON_CACHE_DIR=str(triton_dir), TRITON_DEFAULT_FP_FUSION="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if cache_url is not None:
        env.update(TRITON_CACHE_MANAGER=MANAGER, CUFORGE_TRITON_CACHE=cache_url)
    return env


def _child(mode: str, env: dict[str, str], barrier: Path | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, CHILD, mode] + ([str(barrier)] if barrier else [])
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


class Redis:
    """A throwaway redis-server on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        binary = shutil.which("redis-server")
        if binary is None:
            raise OSError("redis-server is not installed (make redis-server)")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def hit_rows(tmp: Path, hits: int, rounds: int, redis: Redis | None) -> dict[str, float]:
    caches: dict[str, str | None] = {
        "stock FileCacheManager": None,
        "cuforge file://": f"file://{tmp / 'fs'}",
        "cuforge sqlite://": f"sqlite://{tmp / 'c.db'}",
    }
    if redis is not None:
        caches["cuforge redis://"] = f"{redis.url}?prefix=bench:"
        caches["cuforge file://,redis://"] = f"file://{tmp / 'tier'},{redis.url}?prefix=tier:"
    slugs = {
        n: n.replace(" ", "_").replace(":", "").replace("/", "").replace(",", "+") for n in caches
    }
    for name, url in caches.items():  # fill, untimed
        _result(_child("kernel", _env(tmp / f"{slugs[name]}-fill", url)))
    best: dict[str, float] = {}
    for r in range(rounds):  # interleaved rounds, each config's best median kept
        for name, url in caches.items():
            hit_dir = tmp / (f"{slugs[name]}-fill" if url is None else f"{slugs[name]}-hit{r}")
            report = _result(_child("hits", _env(hit_dir, url, HITS=str(hits))))
            best[name] = min(best.get(name, float("inf")), report["hit_median_s"])
    return best


def cold_rows(tmp: Path, processes: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, url in (("stock FileCacheManager", None), ("cuforge file://", "file://")):
        base = tmp / f"cold-{'stock' if url is None else 'cuforge'}"
        barrier = base / "go"
        base.mkdir()
        cache_url = None if url is None else f"file://{base / 'fs'}"
        procs = [
            _child(
                "kernel", _env(base / ("shared" if url is None else f"t{i}"), cache_url), barrier
            )
            for i in range(processes)
        ]
        deadline = time.monotonic() + 300
        while len(list(base.glob("go.ready.*"))) < processes:  # all imported triton
            if time.monotonic() > deadline:
                raise SystemExit("cold-start children did not start")
            time.sleep(0.05)
        t0 = time.perf_counter()
        barrier.touch()
        reports = [_result(p) for p in procs]
        wall = time.perf_counter() - t0
        compiles = sum(r["hits"] == [False] for r in reports)
        out[name] = {"compiles": compiles, "slowest_s": wall}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer timed hits")
    ap.add_argument("--processes", type=int, default=8, help="cold-start processes (8)")
    _results.add_arguments(ap)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-int-"))
    redis = None
    try:
        try:
            redis = Redis(tmp)
        except (OSError, SystemExit) as exc:
            print(f"(no Redis rows: {exc})")
        hits = hit_rows(tmp, 50 if args.quick else 300, 1 if args.quick else 3, redis)
        stock = hits["stock FileCacheManager"]
        print("Triton hit, same process after hashing (best of the rounds' medians):")
        for name, seconds in hits.items():
            print(f"  {name:28s} {seconds * 1e6:8.0f} us   {seconds / stock:5.2f}x stock")
        cold = cold_rows(tmp, args.processes)
        print(f"Cold start, {args.processes} processes on one kernel:")
        for name, row in cold.items():
            print(f"  {name:28s} compiles {row['compiles']:2d}   slowest {row['slowest_s']:6.2f} s")
        _results.write(
            args.json,
            "bench_integrations",
            {
                "hit_median_s": hits,
                "hit_ratio_to_stock": {k: v / stock for k, v in hits.items()},
                "cold_start": cold,
                "processes": args.processes,
            },
            args.note,
        )
    finally:
        if redis is not None:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
