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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _coldprofile
import _results

ROOT = Path(__file__).resolve().parent.parent
#: The defaults ``make bench-check`` measures with: ~1.5 s of compiling per process.
KERNELS = 24
PAIRS = 5
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
        src = ASTSource(
            fn=scaled_add, signature=signature, constexprs={"BLOCK": 256, "SCALE": i + 2}
        )
        triton.compile(src, target=target)
    seconds = time.perf_counter() - t0
    report: dict[str, Any] = {"seconds": seconds, "hits": sum(hits), "compiled": len(hits)}
    integration = sys.modules.get("cuforge.integrations.triton")
    if integration is not None:
        import cuforge.integrations

        flush = getattr(cuforge.integrations, "flush", None)  # a baseline may lack it
        if flush is not None:
            flush()  # the stores written behind: landed, so the counters include them
        report["flushed_s"] = time.perf_counter() - t0
        cache = integration.triton_cache()
        report["stores"] = None if cache is None else cache.stats().stores
    print(json.dumps(report), flush=True)


def _env(tmp: Path, side: str, baseline: str | None = None) -> dict[str, str]:
    """A child's environment: ``side`` is stock, cuforge (this tree's), or baseline
    (cuforge from the source tree ``baseline``, e.g. an older commit's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUFORGE_", "TRITON_"))}
    # An installed cuforge has its bytecode (pip compiles it); a source tree under
    # PYTHONDONTWRITEBYTECODE would compile every module again in each process.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(TRITON_CACHE_DIR=str(tmp / "triton"), TRITON_DEFAULT_FP_FUSION="1")
    src = baseline if side == "baseline" and baseline else str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    if side != "stock":
        env.update(
            TRITON_CACHE_MANAGER=MANAGER,
            CUFORGE_TRITON_CACHE=f"file://{tmp / 'cuforge'}",
            CUFORGE_CACHE_SECRET=SECRET,
        )
    return env


def sample(
    tmp: Path, side: str, kernels: int, profile: Path | None = None, baseline: str | None = None
) -> dict[str, Any]:
    """One cold process of ``side`` in empty directories under ``tmp``; with
    ``profile`` (a directory), every process of it is profiled there (``_coldprofile``)
    and the report carries the breakdown."""
    tmp.mkdir(parents=True)
    env = _env(tmp, side, baseline)
    if profile is not None:
        profile.mkdir(parents=True)
        site = str(Path(__file__).with_name("_profilesite"))
        env["PYTHONPATH"] = os.pathsep.join((site, env["PYTHONPATH"]))
        env[_coldprofile.ENV] = str(profile)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(kernels)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"bench_coldtriton: a {side} process failed:\n{err[-3000:]}")
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if report["hits"] or report["compiled"] != kernels:  # not cold: the figure would lie
        raise SystemExit(f"bench_coldtriton: a {side} process was not cold: {report}")
    if side != "stock" and report.get("stores") != kernels * 8:
        raise SystemExit(f"bench_coldtriton: cuforge stored {report.get('stores')} entries")
    if profile is not None:
        report["profile"] = _coldprofile.summarize(str(profile), proc.pid)
    shutil.rmtree(tmp, ignore_errors=True)
    return report


def default_dir() -> str | None:
    """Where the samples' directories go: a RAM file system where there is one, so the
    figure is cuforge's own work, not one disk's quirks (this project's VM's ext4, mounted
    with ``discard``, makes stock Triton's ``rmdir`` of its temp directory ~1.6 ms)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def measure(
    kernels: int, pairs: int, where: str | None = None, baseline: str | None = None
) -> dict[str, Any]:
    """``pairs`` rounds of cold processes, one of each side per round, in an order
    that rotates from round to round (two sides: alternated pairs); their times and
    the ratios to stock: of the medians (the figure), and the median of each round's
    own ratio (shown beside it: a round's processes ran back to back, under the same
    load). ``baseline``: a third side, cuforge from that source tree."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-coldtriton-", dir=where))
    sides = ["stock", "cuforge"] + (["baseline"] if baseline else [])
    times: dict[str, list[float]] = {side: [] for side in sides}
    flushed: dict[str, list[float]] = {side: [] for side in sides[1:]}
    try:
        sample(tmp / "warmup", "stock", 1)  # the page cache, for the first pair's sake
        for p in range(pairs):
            for side in sides[p % len(sides) :] + sides[: p % len(sides)]:
                report = sample(tmp / f"{p}-{side}", side, kernels, baseline=baseline)
                times[side].append(report["seconds"])
                if side != "stock":
                    flushed[side].append(report["flushed_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {side: statistics.median(t) for side, t in times.items()}
    out: dict[str, Any] = {
        "kernels": kernels,
        "pairs": pairs,
        "seconds": times,
        "median_s": med,
        "dir": str(tmp.parent),
    }
    for side in sides[1:]:
        per_pair = [c / s for c, s in zip(times[side], times["stock"], strict=True)]
        prefix = "" if side == "cuforge" else f"{side}_"
        out[f"{prefix}ratio"] = med[side] / med["stock"]
        out[f"{prefix}pair_ratio_median"] = statistics.median(per_pair)
        out[f"{prefix}flushed_median_s"] = statistics.median(flushed[side])
    return out


def profile(kernels: int, where: str | None = None) -> dict[str, Any]:
    """One stock and one cuforge cold process, each profiled (``_coldprofile``)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-coldtriton-profile-", dir=where))
    try:
        sample(tmp / "warmup", "stock", 1)
        return {
            side: sample(tmp / side, side, kernels, profile=tmp / f"profile-{side}")
            for side in ("stock", "cuforge")
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=KERNELS, help=f"kernels per process ({KERNELS})")
    ap.add_argument("--pairs", type=int, default=PAIRS, help=f"alternated pairs ({PAIRS})")
    ap.add_argument("--dir", default=default_dir(), help="where the directories go (/dev/shm)")
    ap.add_argument(
        "--profile", action="store_true", help="one profiled process of each side instead"
    )
    ap.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also measure cuforge from this source tree (e.g. another commit's src/)",
    )
    ap.add_argument("--child", type=int, metavar="N", help=argparse.SUPPRESS)
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return 0
    if args.kernels < 1 or args.pairs < 1:
        ap.error("--kernels and --pairs must be at least 1")
    if args.profile:
        prof = profile(args.kernels, args.dir)
        for side, report in prof.items():
            extra = (
                f", stores landed at {report['flushed_s']:.3f} s" if "flushed_s" in report else ""
            )
            print(f"{side}: {args.kernels} kernels cold in {report['seconds']:.3f} s{extra}")
            print(_coldprofile.table(report["profile"]))
        _results.write(args.json, "bench_coldtriton_profile", prof, args.note)
        return 0
    out = measure(args.kernels, args.pairs, args.dir, args.baseline_src)
    for side, shown in out["seconds"].items():
        each = " ".join(f"{t:.2f}" for t in shown)
        print(f"{side:8s} median {out['median_s'][side]:6.3f} s   ({each})")
    for side in [s for s in out["seconds"] if s != "stock"]:
        prefix = "" if side == "cuforge" else f"{side}_"
        print(
            f"{args.kernels} Triton kernels cold: {side} / stock = {out[prefix + 'ratio']:.3f}x "
            f"(median of the rounds' ratios {out[prefix + 'pair_ratio_median']:.3f}x; "
            f"stores landed at {out[prefix + 'flushed_median_s']:.3f} s)"
        )
    _results.write(args.json, "bench_coldtriton", out, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
