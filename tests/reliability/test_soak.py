"""Concurrency soak: 8 processes (8 threads for the in-process memory cache) mixing
get / set / delete / clear / listing / compile on one cache under a cap, on every
backend. 0 exceptions, 0 wrong bytes, 0 wrong code; a file-backed cache stays within
1.1x its cap on disk (sampled every 20 ms); throughput is reported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from _cache_workers import ARCH
from _figures import SCALES, pick, record

WORKER = str(Path(__file__).with_name("_soakworker.py"))
PROCESSES = 8
CAP = 2 << 20
SECRET = "soak-secret-0123456789abcdef-0123"
KERNELS = [
    f'extern "C" __global__ void soak{i}(float* a) {{ a[threadIdx.x] *= {i + 2}.0f; }}\n'
    for i in range(6)
]


#: Backends known to pass 1.1x their cap here, and why (reported; the figure shows it).
CAP_GAPS: dict[str, str] = {}


def references() -> list[list[str]]:
    from cuforge.compile import Program, ProgramOptions

    out = []
    for src in KERNELS:
        code = Program(src, "c++", ProgramOptions(arch=ARCH)).compile("cubin").code
        out.append([src, hashlib.sha256(code).hexdigest()])
    return out


def dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) in ("stats", "locks"):
            continue
        for name in files:
            with contextlib.suppress(OSError):  # evicted while we looked
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def cache_files(root: Path) -> int:
    """What the cap bounds: entries and in-flight temp files of a FileStream directory,
    or a SQLite database with its WAL and WAL index."""
    if root.suffix == ".db":
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(str(root) + suffix).st_size
        return total
    return dir_bytes(root / "entries") + dir_bytes(root / "tmp")


class Sampler(threading.Thread):
    def __init__(self, measure) -> None:
        super().__init__(daemon=True)
        self.measure = measure
        self.peak = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.measure())
            self.samples += 1
            self.done.wait(0.02)


def backend_spec(name: str, tmp: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    root = tmp / "cache"
    spec: dict[str, Any] = {"threads": 1, "processes": PROCESSES, "measure": None}
    if name == "memory":
        spec.update(url=f"memory://?max_size={CAP}", threads=PROCESSES, processes=1)
    elif name == "filestream":
        spec.update(url=f"file://{root}?max_size={CAP}", measure=root)
    elif name == "signed-filestream":
        spec.update(url=f"file://{root}?max_size={CAP}", measure=root, secret=SECRET)
    elif name == "sqlite":
        db = tmp / "cache.db"
        spec.update(url=f"sqlite://{db}?max_size={CAP}", measure=db)
    elif name == "redis":
        spec.update(url=request.getfixturevalue("redis_server").url)
    elif name == "s3":  # SeaweedFS on loopback; the AWS key is in os.environ
        spec.update(url=request.getfixturevalue("s3_url"))
    elif name == "tiered":
        redis_url = request.getfixturevalue("redis_server").url
        spec.update(
            url=f"memory://?max_size={CAP // 4},file://{root}?max_size={CAP},{redis_url}",
            measure=root,
        )
    return spec


@pytest.mark.parametrize(
    "backend", ["memory", "filestream", "signed-filestream", "sqlite", "redis", "s3", "tiered"]
)
@SCALES
def test_eight_processes_mixing_every_operation(backend, scale, tmp_path, request) -> None:
    if backend == "s3" and scale == "ci":
        pytest.skip("the S3 soak runs at full scale only (make test-all): make test stays short")
    spec = backend_spec(backend, tmp_path, request)
    seconds = pick(scale, 10, 60)
    spec.update(
        seconds=seconds, keys=pick(scale, 1500, 4000), max_value=8192, programs=references(),
        start=time.time() + 3.0,
    )  # fmt: skip
    measure = spec.pop("measure")
    sampler = Sampler(lambda: cache_files(measure)) if measure else None
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, json.dumps(spec), str(i), str(tmp_path / f"w{i}.json")],
            env=env,
        )
        for i in range(spec["processes"])
    ]
    if sampler:
        sampler.start()
    try:
        for p in procs:
            assert p.wait(timeout=seconds + 120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if sampler:
            sampler.done.set()
            sampler.join()
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(len(procs))]
    examples = [e for r in results for e in r["examples"]]
    exceptions = sum(r["exceptions"] for r in results)
    wrong = sum(r["wrong"] for r in results)
    wrong_code = sum(r["wrong_code"] for r in results)
    assert (exceptions, wrong, wrong_code) == (0, 0, 0), examples
    ops: dict[str, int] = {}
    for r in results:
        for op, n in r["ops"].items():
            ops[op] = ops.get(op, 0) + n
    total = sum(ops.values())
    hits = sum(r["hits"] for r in results)
    assert hits > 0 and ops.get("compile", 0) > 0 and ops.get("clear", 0) > 0, ops
    write_failures = sum(r["stats"]["write_failures"] for r in results)
    assert write_failures == 0, [r["warnings"] for r in results]
    figure: dict[str, Any] = {
        "ops_per_s": round(total / seconds),
        "ops": ops,
        "hits": hits,
        "processes": spec["processes"],
        "threads": spec["threads"],
        "evictions": sum(r["stats"]["evictions"] for r in results),
    }
    held = (
        f"0 exceptions, 0 wrong bytes in {hits} hits, 0 wrong cubins; {total / seconds:.0f} ops/s"
    )
    over = None
    if sampler:
        assert sampler.samples > 10
        ratio = sampler.peak / CAP
        figure.update(peak_bytes=sampler.peak, cap_bytes=CAP, peak_over_cap=round(ratio, 3))
        held += f"; disk peak {ratio:.2f}x the cap"
        if ratio > 1.1:
            over = f"disk peak {ratio:.2f}x the cap ({sampler.peak} of {CAP} bytes)"
            assert backend in CAP_GAPS, figure
    else:
        held += "; cap: " + ("entries' bytes (in-process)" if backend == "memory" else "server's")
    mode = (
        f"{spec['processes']} processes" if spec["processes"] > 1 else f"{spec['threads']} threads"
    )
    record(
        "soak", backend, f"{mode} x {seconds} s of get/set/delete/clear/len/compile",
        total, held, scale=scale, lost=0, **figure,
    )  # fmt: skip
    if over:  # everything else held (asserted above); the cap did not
        pytest.xfail(f"{CAP_GAPS[backend]}: {over}")
