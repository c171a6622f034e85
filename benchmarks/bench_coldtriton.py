"""Triton kernels compiled cold through cuforge beside stock Triton, in one run (CPU).

Each sample is a fresh process that compiles ``--kernels`` distinct kernels for
``GPUTarget("cuda", 90, 32)`` (no GPU needed: Triton's bundled ptxas makes the
cubins) into an empty ``TRITON_CACHE_DIR``: stock (``FileCacheManager``) or through
``CuforgeCacheManager`` on an empty ``file://`` cache with a secret set (every file
signed, stored and written back where Triton reads it). The clock starts after
``import triton`` and libtriton's hashing (the same in both, cached per process), so
cuforge's import and its cache's open, made at the first compile, are inside it.
Samples run in alternated pairs (stock first in even pairs, cuforge first in odd
ones); the figure is the median of cuforge's over the median of stock's.
``make bench-check`` runs it (``triton_cold`` in ``benchmarks/thresholds.toml``)
with the venv ``make test-integrations`` builds.

    .venv-int/bin/python benchmarks/bench_coldtriton.py [--kernels 12] [--pairs 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANAGER = "cuforge.integrations.triton:CuforgeCacheManager"
SECRET = "bench-coldtriton-secret-0123456789abcdef"


def child(kernels: int) -> None:
    """Compile ``kernels`` distinct kernels cold; print one JSON line."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def scaled_add(x, y, out, n, BLOCK: tl.constexpr, SCALE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(x + offs, mask=mask)
        tl.store(out + offs, a * SCALE + tl.load(y + offs, mask=mask), mask=mask)

    triton.runtime.cache.triton_key()  # libtriton's hash: once per process, both sides
    signature = {
        "x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32",
        "BLOCK": "constexpr", "SCALE": "constexpr",
    }  # fmt: skip
    target = GPUTarget("cuda", 90, 32)
    hits: list[bool] = []
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs.compilation, "listener"):
        knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
    t0 = time.perf_counter()
    for i in range(kernels):
        src = ASTSource(fn=scaled_add, signature=signature, constexprs={"BLOCK": 256, "SCALE": i + 2})
        triton.compile(src, target=target)
    seconds = time.perf_counter() - t0
    report: dict[str, Any] = {"seconds": seconds, "hits": sum(hits), "compiled": len(hits)}
    integration = sys.modules.get("cuforge.integrations.triton")
    if integration is not None:
        cache = integration.triton_cache()
        report["stores"] = None if cache is None else cache.stats().stores
    print(json.dumps(report), flush=True)


def _env(tmp: Path, side: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUFORGE_", "TRITON_"))}
    # An installed cuforge has its bytecode (pip compiles it); a source tree under
    # PYTHONDONTWRITEBYTECODE would compile every module again in each process.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(TRITON_CACHE_DIR=str(tmp / "triton"), TRITON_DEFAULT_FP_FUSION="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    if side == "cuforge":
        env.update(
            TRITON_CACHE_MANAGER=MANAGER,
            CUFORGE_TRITON_CACHE=f"file://{tmp / 'cuforge'}",
            CUFORGE_CACHE_SECRET=SECRET,
        )
    return env


def sample(tmp: Path, side: str, kernels: int) -> dict[str, Any]:
    """One cold process of ``side`` in empty directories under ``tmp``."""
    tmp.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(kernels)],
        env=_env(tmp, side),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench_coldtriton: a {side} process failed:\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["hits"] or report["compiled"] != kernels:  # not cold: the figure would lie
        raise SystemExit(f"bench_coldtriton: a {side} process was not cold: {report}")
    if side == "cuforge" and report.get("stores") != kernels * 8:
        raise SystemExit(f"bench_coldtriton: cuforge stored {report.get('stores')} entries")
    shutil.rmtree(tmp, ignore_errors=True)
    return report


def default_dir() -> str | None:
    """Where the samples' directories go: a RAM file system where there is one, so the
    figure is cuforge's own work, not one disk's quirks (this project's VM's ext4, mounted
    with ``discard``, makes stock Triton's ``rmdir`` of its temp directory ~1.6 ms)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def measure(kernels: int, pairs: int, where: str | None = None) -> dict[str, Any]:
    """``pairs`` alternated pairs of cold processes; their times and the ratio."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-coldtriton-", dir=where))
    times: dict[str, list[float]] = {"stock": [], "cuforge": []}
    try:
        sample(tmp / "warmup", "stock", 1)  # the page cache, for the first pair's sake
        for p in range(pairs):
            for side in ("stock", "cuforge") if p % 2 == 0 else ("cuforge", "stock"):
                times[side].append(sample(tmp / f"{p}-{side}", side, kernels)["seconds"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {side: statistics.median(t) for side, t in times.items()}
    return {
        "kernels": kernels,
        "pairs": pairs,
        "seconds": times,
        "median_s": med,
        "ratio": med["cuforge"] / med["stock"],
        "dir": str(tmp.parent),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=12, help="kernels per process (12)")
    ap.add_argument("--pairs", type=int, default=5, help="alternated pairs of processes (5)")
    ap.add_argument("--dir", default=default_dir(), help="where the directories go (/dev/shm)")
    ap.add_argument("--child", type=int, metavar="N", help=argparse.SUPPRESS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _results

    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return 0
    out = measure(args.kernels, args.pairs, args.dir)
    for side in ("stock", "cuforge"):
        shown = " ".join(f"{s:.2f}" for s in out["seconds"][side])
        print(f"{side:8s} median {out['median_s'][side]:6.2f} s   ({shown})")
    print(f"{args.kernels} Triton kernels cold: cuforge / stock = {out['ratio']:.3f}x")
    _results.write(args.json, "bench_coldtriton", out, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
